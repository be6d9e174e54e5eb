// TierKvCache end to end across a cluster (shared/reference/scaleout.md
// §9.5): two tierkvd nodes with a real redis-server as their directory and
// UCX over tcp. Node A's executor prefills a prompt and stores its pages;
// node B's executor, on B's daemon, serves the same prompt from A's pages
// (fetched by B's daemon, layer by layer) and its logits are bit-identical
// to a run without tierkv. With A killed while it holds B's fetch
// (TIERKV_TEST_STALL_PEER_SERVE), B's load fails per segment, B recomputes
// the prefix, and the logits are identical again. Both through the
// TierKvCache API (Generate: the prompt and 70 decoded tokens) and with
// tierkv-run processes (logits files compared byte for byte).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>

#include "executor/generator.h"
#include "executor/model.h"
#include "executor/presets.h"
#include "executor/tier_kv_cache.h"
#include "executor/weights.h"
#include "storage/engine/engine_options.h"
#include "tests/client/client_test_util.h"
#include "tests/executor/test_tokens.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/peer_serve_stall_fifo.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/sync_points.h"
#include "tests/testing/temp_dir.h"
#include "tests/transport/directory/redis_server.h"

namespace tierkv::executor {
namespace {

using testing::DaemonProcess;
using testing::PeerServeStallFifo;

constexpr char kToken[] = "exec-cluster-token-0123456789abcdef";

// `inner`, except that `before` runs once, on the request's thread, just
// before the first wait for layer `layer`: when the layers below it are
// in place. Lets a test act at a chosen point of a running request.
class BeforeLayerWait final : public KvCache {
 public:
  BeforeLayerWait(KvCache* inner, int64_t layer, std::function<void()> before)
      : KvCache(inner->geometry()),
        inner_(inner),
        layer_(layer),
        before_(std::move(before)) {}

  void Prefetch(int64_t layer, int64_t num_tokens) override {
    inner_->Prefetch(layer, num_tokens);
  }
  Status WaitForLayer(int64_t layer, int64_t num_tokens) override {
    if (layer == layer_ && before_) std::exchange(before_, nullptr)();
    return inner_->WaitForLayer(layer, num_tokens);
  }
  Result<int64_t> AttachPrefix(std::span<const int32_t> prompt) override {
    return inner_->AttachPrefix(prompt);
  }
  Result<int64_t> RecoverPrefix(const Status& forward_error) override {
    return inner_->RecoverPrefix(forward_error);
  }
  Status CommitTokens(std::span<const int32_t> tokens) override {
    return inner_->CommitTokens(tokens);
  }
  Status ReportSelections(std::span<const SelectionCount> counts) override {
    return inner_->ReportSelections(counts);
  }
  Status Write(int64_t layer, KvPart part, int64_t first_token,
               std::span<const float> rows) override {
    return inner_->Write(layer, part, first_token, rows);
  }
  Status Gather(int64_t layer, KvPart part, std::span<const int32_t> token_ids,
                std::span<float> out) const override {
    return inner_->Gather(layer, part, token_ids, out);
  }
  Result<std::span<const float>> PageView(int64_t layer, KvPart part,
                                          int64_t page) const override {
    return inner_->PageView(layer, part, page);
  }
  int64_t num_tokens(int64_t layer, KvPart part) const override {
    return inner_->num_tokens(layer, part);
  }
  Status Truncate(int64_t num_tokens) override {
    return inner_->Truncate(num_tokens);
  }

 private:
  KvCache* const inner_;  // borrowed; outlives this
  const int64_t layer_;
  std::function<void()> before_;  // empty once run
};

struct NodeSpec {
  std::string id;
  // Loads on one lane (server.load_workers = 1): a Load's FETCHes leave in
  // layer order.
  bool one_load_lane = false;
  std::vector<std::pair<std::string, std::string>> env;  // beyond UCX_TLS
};

// A tierkv-run process's exit code and output (stdout + stderr).
struct ToolRun {
  int exit_code = -1;
  std::string output;
};

ToolRun RunTierkvRun(const std::string& args) {
  ToolRun r;
  const std::string cmd = testing::BinDir() + "/tierkv-run " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) {
    r.output.append(buf.data(), n);
  }
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return r;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class TierKvCacheClusterTest : public ::testing::Test {
 protected:
  static constexpr int64_t kNewTokens = 70;  // decode crosses a page

  void SetUp() override {
    if (!testing::RedisServer::Available()) GTEST_SKIP() << "no redis-server";
    ModelConfig c = PresetConfig("tiny").value();
    // One attention form for every chunking, as tier_kv_cache_test.cc: a
    // prefix loaded from elsewhere is then bit-identical to one prefilled.
    auto m = Model::Create(c, RandomWeights(c, /*seed=*/3),
                           {.attention_mode = AttentionMode::kAbsorbedMqa});
    ASSERT_OK(m);
    model_ = std::move(m).value();
    ASSERT_OK(redis_.Start());
    std::vector<char> secret(32);
    std::random_device rd;
    for (char& b : secret) b = static_cast<char>(rd());
    secret_file_ = dir_.File("cluster.key");
    std::ofstream(secret_file_, std::ios::binary)
        .write(secret.data(), secret.size());
    ASSERT_EQ(::chmod(secret_file_.c_str(), 0600), 0);
  }

  std::unique_ptr<DaemonProcess> StartNode(const NodeSpec& n) {
    // B's fetch deadline is far beyond the test's steps, so that a failed
    // fetch is the holder's death, never a timeout; and a directory lookup
    // on a loaded test machine is never cut short (a miss, recomputed).
    const std::string config = fmt::format(
        R"({}[cluster]
name = "exec"
node_id = "{}"
secret_file = "{}"
directory = "{}"
directory_password_file = "{}"
peer_listen = "127.0.0.1:0"
liveness_ttl_ms = 2000
lookup_budget_us = 1000000
fetch_deadline_ms = 30000
[[namespace]]
name = "exec"
token = "{}"
host_bytes = "8MiB"
shards = 1
shared = true
)",
        n.one_load_lane ? "[server]\nload_workers = 1\n" : "", n.id,
        secret_file_, redis_.url(), redis_.password_file(), kToken);
    testing::DaemonSpec spec{
        .config_toml = config,
        .env = {{"UCX_TLS", "tcp"}, {"UCX_WARN_UNUSED_ENV_VARS", "n"}}};
    spec.env.insert(spec.env.end(), n.env.begin(), n.env.end());
    auto d = std::make_unique<DaemonProcess>();
    const Status s = d->Start(spec);
    EXPECT_OK(s);
    return s.ok() ? std::move(d) : nullptr;
  }

  KvCacheGeometry Geometry(const std::vector<int32_t>& prompt) const {
    return GeometryFor(model_->config(),
                       static_cast<int64_t>(prompt.size()) + kNewTokens,
                       KvDtype::kF32);
  }

  TierKvCacheOptions Options(const DaemonProcess& node) const {
    TierKvCacheOptions o;
    o.client.socket_path = node.socket_path();
    o.client.timeout = std::chrono::seconds(10);
    o.namespace_name = "exec";
    o.token = kToken;
    o.salt = ModelIdentity(*model_);
    o.required = true;
    return o;
  }

  std::unique_ptr<TierKvCache> TierCache(const DaemonProcess& node,
                                         const std::vector<int32_t>& prompt) {
    auto cache = TierKvCache::Create(Geometry(prompt), Options(node));
    EXPECT_OK(cache);
    return cache.ok() ? std::move(cache).value() : nullptr;
  }

  GenerateResult Run(KvCache* cache, const std::vector<int32_t>& prompt) {
    GenerateOptions o;
    o.max_new_tokens = kNewTokens;
    o.keep_logits = true;
    auto r = Generate(*model_, cache, prompt, o);
    EXPECT_OK(r);
    return r.ok() ? std::move(r).value() : GenerateResult{};
  }

  // The logits of `prompt` on the in-process cache: no tierkv at all.
  std::vector<float> Reference(const std::vector<int32_t>& prompt) {
    auto cache = model_->NewCache(
        static_cast<int64_t>(prompt.size()) + kNewTokens, KvDtype::kF32);
    EXPECT_OK(cache);
    if (!cache.ok()) return {};
    return Run(cache->get(), prompt).logits;
  }

  // Waits until `node` Matches the first `pages` pages of `prompt` (as the
  // cache names them), each in `tier`: what A stored reaches the directory,
  // and what B fetched B's DRAM, in the background. Matches without
  // prefetch: nothing is fetched.
  bool MatchReaches(const DaemonProcess& node,
                    const std::vector<int32_t>& prompt, uint32_t pages,
                    Tier tier) {
    auto client = node.Connect("exec", kToken);
    EXPECT_OK(client);
    if (!client.ok()) return false;
    const KvCacheGeometry geometry = Geometry(prompt);
    EXPECT_OK((*client)->RegisterLayout(TierKvCache::LayoutFor(geometry)));
    const std::vector<PageHash> names = TierKvCache::PageNames(
        geometry, Options(node),
        std::span(prompt).first(pages * geometry.page_tokens));
    return testing::PollUntil([&] {
      auto m = (*client)->Match(names, {.prefetch = false});
      return m.ok() && m->leading_pages == pages &&
             std::all_of(m->tiers.begin(), m->tiers.end(),
                         [&](Tier t) { return t == tier; });
    });
  }

  static nlohmann::json PeerStats(const DaemonProcess& node) {
    auto c = node.Connect("exec", kToken);
    EXPECT_OK(c);
    if (!c.ok()) return nlohmann::json::object();
    auto s = (*c)->StatsJson();
    EXPECT_OK(s);
    const auto j = nlohmann::json::parse(s.ok() ? *s : "{}");
    return j.contains("peer") ? j["peer"] : nlohmann::json::object();
  }

  // Segments of one page in `layer` ("kv", and "index_k" on full layers).
  int64_t SegmentsOfLayer(int64_t layer) const {
    return model_->config().indexer_full[static_cast<size_t>(layer)] ? 2 : 1;
  }
  int64_t SegmentsOfPage() const {
    int64_t n = 0;
    for (int64_t l = 0; l < model_->config().num_hidden_layers; ++l) {
      n += SegmentsOfLayer(l);
    }
    return n;
  }

  // Writes a tiny random checkpoint with tierkv-run and makes it model_,
  // loaded as tierkv-run --tierkv loads it (what names its pages); and the
  // namespace's token file tierkv-run reads. False when tierkv-run fails.
  bool UseWrittenModel(uint32_t seed) {
    model_dir_ = dir_.File("model");
    const ToolRun written =
        RunTierkvRun(fmt::format("--write-random-model {} --preset tiny "
                                 "--seed {}",
                                 model_dir_, seed));
    EXPECT_EQ(written.exit_code, 0) << written.output;
    auto loaded = Model::Load(model_dir_,
                              {.attention_mode = AttentionMode::kAbsorbedMqa});
    EXPECT_OK(loaded);
    if (written.exit_code != 0 || !loaded.ok()) return false;
    model_ = std::move(loaded).value();
    std::ofstream(dir_.File("exec.token")) << kToken << "\n";
    return true;
  }

  // tierkv-run on `prompt` (3 new tokens, logits to `npy` in the test's
  // directory): with `node`'s tierkvd (required), or without tierkv.
  ToolRun RunOn(const DaemonProcess* node, const std::vector<int32_t>& prompt,
                const std::string& npy) {
    std::string ids;
    for (int32_t id : prompt) {
      ids += (ids.empty() ? "" : ",") + std::to_string(id);
    }
    std::string args = fmt::format(
        "--model {} --prompt-ids {} --max-new-tokens 3 --attention mqa "
        "--logits-out {}",
        model_dir_, ids, dir_.File(npy));
    if (node != nullptr) {
      args += fmt::format(
          " --tierkv {} --namespace exec --token-file {} --tierkv-required",
          node->socket_path(), dir_.File("exec.token"));
    }
    return RunTierkvRun(args);
  }

  std::unique_ptr<Model> model_;
  std::string model_dir_;  // UseWrittenModel's
  testing::TempDir dir_;
  testing::RedisServer redis_;
  std::string secret_file_;
};

TEST_F(TierKvCacheClusterTest,
       PromptPrefilledOnOneNodeServesAnotherWithIdenticalLogits) {
  auto a = StartNode({.id = "node-a"});
  auto b = StartNode({.id = "node-b"});
  ASSERT_TRUE(a && b);
  const auto prompt = TestTokens(200, 11);  // 3 full pages, then 8 tokens
  const std::vector<float> reference = Reference(prompt);
  ASSERT_FALSE(reference.empty());

  // A prefills the prompt and stores its pages (and the fourth, decoded).
  {
    auto on_a = TierCache(*a, prompt);
    ASSERT_NE(on_a, nullptr);
    const GenerateResult cold = Run(on_a.get(), prompt);
    EXPECT_EQ(cold.prefix_tokens, 0);
    EXPECT_EQ(cold.logits, reference);
    EXPECT_EQ(on_a->stats().pages_stored, 4);
  }  // waits for its stores
  ASSERT_TRUE(MatchReaches(*b, prompt, 3, Tier::kPeer)) << a->log();

  // B serves the same prompt from A's pages: nothing of it prefilled.
  auto on_b = TierCache(*b, prompt);
  ASSERT_NE(on_b, nullptr);
  const GenerateResult warm = Run(on_b.get(), prompt);
  EXPECT_EQ(warm.prefix_tokens, 192);
  EXPECT_EQ(warm.prefix_tokens_recomputed, 0);
  EXPECT_EQ(on_b->stats().pages_from_peer, 3);
  EXPECT_EQ(warm.logits, reference);
  on_b.reset();
  // At least once: B's engine then promotes what the Load read from below
  // DRAM by reading it again, in the background (PromoteLoaded).
  const auto fetched = PeerStats(*b);
  EXPECT_GE(fetched["fetch_segments"].get<int64_t>(), 3 * SegmentsOfPage())
      << fetched.dump();
  EXPECT_EQ(fetched["errors_checksum"], 0);

  // And again: from B's DRAM where B's engine promoted the fetched pages
  // (in the background, best effort), else from A once more.
  auto again = TierCache(*b, prompt);
  ASSERT_NE(again, nullptr);
  const GenerateResult local = Run(again.get(), prompt);
  EXPECT_EQ(local.prefix_tokens, 192);
  EXPECT_EQ(again->stats().pages_from_host + again->stats().pages_from_peer, 3);
  EXPECT_EQ(local.logits, reference);
}

// B's load of A's pages, with A killed (SIGKILL) while it holds the FETCHes
// of every layer after the first, once layer 0 is in B's slots: B's daemon
// fails the other layers' segments at once (a reset, not a timeout),
// the cache keeps no page (none arrived in every layer) and recomputes the
// prefix, and the logits are those of a run without tierkv.
TEST_F(TierKvCacheClusterTest, HolderKilledMidLoadIsRecomputedIdentically) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  const auto prompt = TestTokens(200, 12);
  const std::vector<float> reference = Reference(prompt);
  ASSERT_FALSE(reference.empty());
  // Layer 0 is sent: a one-lane Load of 3 pages cuts each layer into
  // min(transfer_lanes, 3) units, one FETCH each.
  const uint32_t fetches_per_layer = std::clamp<uint32_t>(
      storage::CacheEngineOptions{}.transfer_lanes, 1, /*pages=*/3);
  PeerServeStallFifo fifo(dir_.File("serve.fifo"));
  auto a =
      StartNode({.id = "node-a", .env = {fifo.Env(fetches_per_layer + 1)}});
  auto b = StartNode({.id = "node-b", .one_load_lane = true});
  ASSERT_TRUE(a && b);
  {
    auto on_a = TierCache(*a, prompt);
    ASSERT_NE(on_a, nullptr);
    EXPECT_EQ(Run(on_a.get(), prompt).logits, reference);
  }
  ASSERT_TRUE(MatchReaches(*b, prompt, 3, Tier::kPeer)) << a->log();

  auto on_b = TierCache(*b, prompt);
  ASSERT_NE(on_b, nullptr);
  // Layer 0 is in B's slots when the model first waits for layer 1: then
  // A holds B's FETCHes of layers 1.. and dies.
  bool held = false;
  BeforeLayerWait request(on_b.get(), /*layer=*/1, [&] {
    held = fifo.AwaitHeld();
    if (held) a->Stop(SIGKILL);
  });
  const GenerateResult result = Run(&request, prompt);
  ASSERT_TRUE(held) << a->log();

  EXPECT_EQ(result.prefix_tokens, 0);
  EXPECT_EQ(result.prefix_tokens_recomputed, 192);
  EXPECT_EQ(on_b->stats().pages_recomputed, 3);
  EXPECT_FALSE(on_b->stats().degraded);  // B's daemon is fine
  EXPECT_EQ(result.logits, reference);
  on_b.reset();
  const auto stats = PeerStats(*b);
  EXPECT_EQ(stats["fetch_segments"].get<int64_t>(), 3 * SegmentsOfLayer(0))
      << stats.dump();
  EXPECT_GE(stats["errors_unavailable"].get<int64_t>(), 1) << stats.dump();
  EXPECT_EQ(stats["errors_timeout"], 0);
  EXPECT_EQ(stats["errors_checksum"], 0);
}

// The same with tierkv-run itself, one process per node: the run on B
// loads the 3 pages the run on A prefilled from A, and both write logits
// byte-identical to a run without tierkv.
TEST_F(TierKvCacheClusterTest, TierkvRunOnANodeServesAPromptAnotherPrefilled) {
  if (!std::filesystem::exists(testing::BinDir() + "/tierkv-run")) {
    GTEST_SKIP() << "tierkv-run not built";
  }
  ASSERT_TRUE(UseWrittenModel(/*seed=*/3));
  auto a = StartNode({.id = "node-a"});
  auto b = StartNode({.id = "node-b"});
  ASSERT_TRUE(a && b);

  const auto prompt = TestTokens(200, 13);
  const ToolRun alone = RunOn(nullptr, prompt, "alone.npy");
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  const ToolRun on_a = RunOn(a.get(), prompt, "a.npy");
  ASSERT_EQ(on_a.exit_code, 0) << on_a.output;
  EXPECT_NE(on_a.output.find("tierkv: 0 of 200 prompt tokens loaded"),
            std::string::npos)
      << on_a.output;
  ASSERT_TRUE(MatchReaches(*b, prompt, 3, Tier::kPeer)) << a->log();
  const ToolRun on_b = RunOn(b.get(), prompt, "b.npy");
  ASSERT_EQ(on_b.exit_code, 0) << on_b.output;
  EXPECT_NE(on_b.output.find("tierkv: 192 of 200 prompt tokens loaded (pages: "
                             "hbm 0, host 0, nvme 0, peer 3), 0 recomputed"),
            std::string::npos)
      << on_b.output;
  const std::string reference = ReadAll(dir_.File("alone.npy"));
  ASSERT_FALSE(reference.empty());
  EXPECT_EQ(ReadAll(dir_.File("a.npy")), reference);
  EXPECT_EQ(ReadAll(dir_.File("b.npy")), reference);
}

// tierkv-run on B while A, holding every FETCH of B's load, is SIGKILLed:
// no page arrives, B recomputes the 192 tokens it had matched, and the
// logits are byte-identical to a run without tierkv.
TEST_F(TierKvCacheClusterTest, TierkvRunRecomputesWhatAKilledHolderHeld) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  if (!std::filesystem::exists(testing::BinDir() + "/tierkv-run")) {
    GTEST_SKIP() << "tierkv-run not built";
  }
  ASSERT_TRUE(UseWrittenModel(/*seed=*/4));
  // Every FETCH of B's load is held: no page arrives.
  PeerServeStallFifo fifo(dir_.File("serve.fifo"));
  auto a = StartNode({.id = "node-a", .env = {fifo.Env(1)}});
  auto b = StartNode({.id = "node-b"});
  ASSERT_TRUE(a && b);

  const auto prompt = TestTokens(200, 14);
  const ToolRun alone = RunOn(nullptr, prompt, "alone.npy");
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  const ToolRun on_a = RunOn(a.get(), prompt, "a.npy");
  ASSERT_EQ(on_a.exit_code, 0) << on_a.output;
  ASSERT_TRUE(MatchReaches(*b, prompt, 3, Tier::kPeer)) << a->log();

  auto on_b = std::async(std::launch::async,
                         [&] { return RunOn(b.get(), prompt, "b.npy"); });
  const bool held = fifo.AwaitHeld();
  if (held) a->Stop(SIGKILL);
  const ToolRun result = on_b.get();
  ASSERT_TRUE(held) << a->log();
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("tierkv: 0 of 200 prompt tokens loaded (pages: "
                               "hbm 0, host 0, nvme 0, peer 3), 192 "
                               "recomputed after a failed load"),
            std::string::npos)
      << result.output;
  const std::string reference = ReadAll(dir_.File("alone.npy"));
  ASSERT_FALSE(reference.empty());
  EXPECT_EQ(ReadAll(dir_.File("b.npy")), reference);
}

}  // namespace
}  // namespace tierkv::executor
