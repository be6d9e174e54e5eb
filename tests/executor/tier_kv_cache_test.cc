// TierKvCache against real tierkvd processes: the executor's logits with a
// prefix loaded from the daemon are bit-identical (exact float equality) to
// those of the in-process cache, whichever tier the prefix comes from.
#include "executor/tier_kv_cache.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "executor/generator.h"
#include "executor/model.h"
#include "executor/presets.h"
#include "executor/weights.h"
#include "tests/executor/test_tokens.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/sync_points.h"

namespace tierkv::executor {
namespace {

constexpr char kDramOnly[] = R"(
[[namespace]]
name = "exec"
token = "exec-token"
host_bytes = "8MiB"
shards = 1
)";

// A host tier of 1 MiB (about 21 tiny pages) in front of NVMe.
std::string WithNvme(const std::string& policy) {
  return R"(
[nvme]
path = "{DIR}/nvme.data"
capacity_bytes = "64MiB"
[[namespace]]
name = "exec"
token = "exec-token"
host_bytes = "1MiB"
shards = 1
write_policy = ")" +
         policy + "\"\n";
}

std::vector<int32_t> Tokens(int64_t n, uint32_t seed) {
  return TestTokens(n, seed);
}

class TierKvCacheTest : public ::testing::Test {
 protected:
  static constexpr int64_t kNewTokens = 70;  // decode crosses a page

  void SetUp() override {
    ModelConfig c = PresetConfig("tiny").value();
    // One attention form for every chunking: a prefix served from the
    // daemon is then bit-identical to one prefilled here (model_test.cc,
    // ChunkingIsBitIdenticalInAbsorbedMqaForm).
    auto m = Model::Create(c, RandomWeights(c, /*seed=*/3),
                           {.attention_mode = AttentionMode::kAbsorbedMqa});
    ASSERT_OK(m);
    model_ = std::move(m).value();
  }

  void StartDaemon(const std::string& toml) {
    spec_.config_toml = toml;
    ASSERT_OK(daemon_.Start(spec_));
  }

  TierKvCacheOptions Options() const {
    TierKvCacheOptions o;
    o.client.socket_path = daemon_.socket_path();
    o.client.timeout = std::chrono::seconds(10);
    o.namespace_name = "exec";
    o.token = "exec-token";
    o.salt = ModelIdentity(*model_);
    o.required = true;
    return o;
  }

  std::unique_ptr<TierKvCache> TierCache(const std::vector<int32_t>& prompt) {
    auto cache = TierKvCache::Create(
        GeometryFor(model_->config(),
                    static_cast<int64_t>(prompt.size()) + kNewTokens, dtype_),
        Options());
    EXPECT_TRUE(cache.ok()) << cache.status().ToString();
    return cache.ok() ? std::move(cache).value() : nullptr;
  }

  GenerateResult Run(KvCache* cache, const std::vector<int32_t>& prompt) {
    GenerateOptions o;
    o.max_new_tokens = kNewTokens;
    o.keep_logits = true;
    auto r = Generate(*model_, cache, prompt, o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : GenerateResult{};
  }

  // Logits of the prompt run on the in-process cache.
  std::vector<float> Reference(const std::vector<int32_t>& prompt) {
    auto cache = model_->NewCache(
        static_cast<int64_t>(prompt.size()) + kNewTokens, dtype_);
    EXPECT_TRUE(cache.ok());
    return Run(cache->get(), prompt).logits;
  }

  // One request that prefills `prompt` and stores its pages.
  void StoreOnce(const std::vector<int32_t>& prompt) {
    auto cache = TierCache(prompt);
    ASSERT_NE(cache, nullptr);
    Run(cache.get(), prompt);
  }

  nlohmann::json DaemonStats() {
    auto c = daemon_.Connect("exec", "exec-token");
    EXPECT_TRUE(c.ok());
    auto stats = (*c)->StatsJson();
    EXPECT_TRUE(stats.ok());
    return nlohmann::json::parse(*stats);
  }

  std::unique_ptr<Model> model_;
  KvDtype dtype_ = KvDtype::kF32;  // of both caches
  testing::DaemonSpec spec_;
  testing::DaemonProcess daemon_;
};

TEST_F(TierKvCacheTest, PrefixFromDramGivesIdenticalLogitsAndStoresPagesOnce) {
  StartDaemon(kDramOnly);
  const auto prompt = Tokens(200, 1);  // 3 full pages, then 8 tokens
  const std::vector<float> reference = Reference(prompt);
  ASSERT_FALSE(reference.empty());

  // First request: nothing stored, everything prefilled, pages saved.
  auto first = TierCache(prompt);
  ASSERT_NE(first, nullptr);
  const GenerateResult cold = Run(first.get(), prompt);
  EXPECT_EQ(cold.prefix_tokens, 0);
  EXPECT_EQ(cold.logits, reference);
  // 200 prompt + 69 fed generated tokens = 4 full pages.
  EXPECT_EQ(first->stats().pages_stored, 4);
  first.reset();  // waits for its stores

  // Second request: the 3 full prompt pages come from the daemon.
  auto second = TierCache(prompt);
  ASSERT_NE(second, nullptr);
  const GenerateResult warm = Run(second.get(), prompt);
  EXPECT_EQ(warm.prefix_tokens, 192);
  EXPECT_EQ(warm.prefix_tokens_recomputed, 0);
  EXPECT_EQ(second->stats().pages_from_host, 3);
  EXPECT_EQ(warm.logits, reference);
  second.reset();

  // Every page once: a page is one "kv" segment per layer and one
  // "index_k" segment per full layer.
  const ModelConfig& config = model_->config();
  const int64_t full =
      std::count(config.indexer_full.begin(), config.indexer_full.end(), true);
  const nlohmann::json stats = DaemonStats();
  EXPECT_EQ(stats["host"]["segments"].get<int64_t>(),
            4 * (config.num_hidden_layers + full));
  EXPECT_EQ(stats["transfers"]["store_dedup"].get<int64_t>(),
            config.num_hidden_layers + full);  // page 3, stored again
}

TEST_F(TierKvCacheTest, TruncateDuringALoadWaitsForItAndKeepsWhatArrived) {
  StartDaemon(kDramOnly);
  const auto prompt = Tokens(200, 8);
  const std::vector<float> reference = Reference(prompt);
  StoreOnce(prompt);
  auto cache = TierCache(prompt);
  ASSERT_NE(cache, nullptr);
  auto start = cache->AttachPrefix(prompt);
  ASSERT_OK(start);
  ASSERT_EQ(*start, 192);
  // No layer waited for: Truncate must finish the Load first.
  ASSERT_OK(cache->Truncate(64));
  EXPECT_EQ(cache->num_tokens(0, KvPart::kLatent), 64);
  auto logits = model_->Forward(std::span(prompt).subspan(64), cache.get());
  ASSERT_OK(logits);
  const size_t vocab = static_cast<size_t>(model_->config().vocab_size);
  EXPECT_TRUE(std::equal(logits->begin(), logits->end(), reference.begin(),
                         reference.begin() + vocab));
}

TEST_F(TierKvCacheTest, SharedLayersStoreNoIndexKeys) {
  StartDaemon(kDramOnly);
  const auto prompt = Tokens(130, 2);  // 2 full pages
  auto cache = TierCache(prompt);
  ASSERT_NE(cache, nullptr);
  Run(cache.get(), prompt);
  cache.reset();
  auto c = daemon_.Connect("exec", "exec-token");
  ASSERT_OK(c);
  auto listed = (*c)->List(1000);
  ASSERT_OK(listed);
  const ModelConfig& config = model_->config();
  std::map<std::pair<uint16_t, uint8_t>, int> per_layer_part;
  for (const auto& s : *listed) per_layer_part[{s.key.layer, s.key.part}]++;
  const int pages = 3;  // 130 + 69 = 199 tokens: 3 full pages
  for (uint16_t l = 0; l < config.num_hidden_layers; ++l) {
    EXPECT_EQ((per_layer_part[{l, 0}]), pages) << "layer " << l;
    EXPECT_EQ((per_layer_part[{l, 1}]), config.indexer_full[l] ? pages : 0)
        << "layer " << l;
  }
}

// Pages evicted from a 1 MiB host tier to NVMe come back bit-exact.
class TierKvCacheNvmeTest : public TierKvCacheTest,
                            public ::testing::WithParamInterface<const char*> {
};

TEST_P(TierKvCacheNvmeTest, PrefixEvictedToNvmeGivesIdenticalLogits) {
  StartDaemon(WithNvme(GetParam()));
  const auto prompt = Tokens(1000, 3);  // 15 full pages
  const std::vector<float> reference = Reference(prompt);
  {
    auto cache = TierCache(prompt);
    ASSERT_NE(cache, nullptr);
    EXPECT_EQ(Run(cache.get(), prompt).logits, reference);
  }
  // Other sequences push the first one's pages out of DRAM.
  for (uint32_t seed = 10; seed < 14; ++seed) StoreOnce(Tokens(1000, seed));
  auto cache = TierCache(prompt);
  ASSERT_NE(cache, nullptr);
  const GenerateResult again = Run(cache.get(), prompt);
  EXPECT_EQ(again.prefix_tokens, 960);
  EXPECT_GT(cache->stats().pages_from_nvme, 0);
  EXPECT_EQ(again.logits, reference);
}

INSTANTIATE_TEST_SUITE_P(Policies, TierKvCacheNvmeTest,
                         ::testing::Values("write_back", "write_through"));

// Every KV format: what a prefix loaded from DRAM or from NVMe gives is
// bit-identical to the in-process cache of the same format, and the daemon
// holds the format's bytes (656 + 132 B per token for GLM-5 fp8; tiny:
// 52 + 20).
class TierKvCacheFormatTest : public TierKvCacheTest,
                              public ::testing::WithParamInterface<KvDtype> {};

TEST_P(TierKvCacheFormatTest, PrefixFromDramAndNvmeGivesIdenticalLogits) {
  dtype_ = GetParam();
  StartDaemon(WithNvme("write_back"));
  const auto prompt = Tokens(1000, 9);
  const std::vector<float> reference = Reference(prompt);
  if (dtype_ != KvDtype::kF32) {  // the format does change the rows
    const KvDtype format = std::exchange(dtype_, KvDtype::kF32);
    EXPECT_NE(Reference(prompt), reference);
    dtype_ = format;
  }
  StoreOnce(prompt);
  {
    auto cache = TierCache(prompt);
    ASSERT_NE(cache, nullptr);
    const GenerateResult warm = Run(cache.get(), prompt);
    EXPECT_EQ(warm.prefix_tokens, 960);
    EXPECT_EQ(warm.logits, reference);
  }
  for (uint32_t seed = 20; seed < 24; ++seed) StoreOnce(Tokens(1000, seed));
  auto cache = TierCache(prompt);
  ASSERT_NE(cache, nullptr);
  const GenerateResult cold = Run(cache.get(), prompt);
  EXPECT_EQ(cold.prefix_tokens, 960);
  EXPECT_GT(cache->stats().pages_from_nvme, 0);
  EXPECT_EQ(cold.logits, reference);

  const KvCacheGeometry g = GeometryFor(model_->config(), 1, dtype_);
  auto c = daemon_.Connect("exec", "exec-token");
  ASSERT_OK(c);
  const LayoutSpec layout = *(*c)->layout();
  EXPECT_EQ(layout, TierKvCache::LayoutFor(g));
  const uint32_t kv = layout.layers[0].parts[0].bytes_per_token;
  EXPECT_EQ(kv, dtype_ == KvDtype::kF32    ? 40u * 4
                : dtype_ == KvDtype::kBF16 ? 40u * 2
                                           : 32u + 4 + 8 * 2);
}

TEST_P(TierKvCacheFormatTest, PrefixSurvivesADaemonRestartOnNvme) {
  dtype_ = GetParam();
  StartDaemon(WithNvme("write_back"));
  const auto prompt = Tokens(1000, 5);
  const std::vector<float> reference = Reference(prompt);
  StoreOnce(prompt);
  // SIGTERM: the daemon writes its dirty DRAM segments to NVMe first.
  EXPECT_EQ(daemon_.Stop(), 0);
  EXPECT_NE(daemon_.log().find("shutdown: wrote"), std::string::npos);
  ASSERT_OK(daemon_.Start(spec_));
  auto cache = TierCache(prompt);
  ASSERT_NE(cache, nullptr);
  const GenerateResult again = Run(cache.get(), prompt);
  EXPECT_EQ(again.prefix_tokens, 960);
  EXPECT_EQ(cache->stats().pages_from_nvme, 15);
  EXPECT_EQ(again.logits, reference);
}

INSTANTIATE_TEST_SUITE_P(Formats, TierKvCacheFormatTest,
                         ::testing::Values(KvDtype::kF32, KvDtype::kBF16,
                                           KvDtype::kFP8),
                         [](const auto& info) {
                           return std::string(KvDtypeName(info.param));
                         });

TEST_F(TierKvCacheTest, AFlippedByteOnDiskIsRecomputedNotUsed) {
  StartDaemon(WithNvme("write_back"));
  const auto prompt = Tokens(1000, 6);
  const std::vector<float> reference = Reference(prompt);
  StoreOnce(prompt);
  ASSERT_EQ(daemon_.Stop(), 0);  // everything on NVMe, nothing in DRAM
  // Flip one byte inside the first segment written (the data file holds
  // only what was persisted, from the start).
  const std::string data = daemon_.dir().File("nvme.data");
  {
    std::fstream f(data, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    std::vector<char> block(4096);
    int64_t at = -1;
    for (int64_t off = 0; at < 0 && f.read(block.data(), block.size());
         off += 4096) {
      for (size_t i = 0; i < block.size(); ++i) {
        if (block[i] != 0) {
          at = off + static_cast<int64_t>(i);
          break;
        }
      }
    }
    ASSERT_GE(at, 0);
    f.clear();
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(at);
    f.write(&c, 1);
  }
  ASSERT_OK(daemon_.Start(spec_));
  auto cache = TierCache(prompt);
  ASSERT_NE(cache, nullptr);
  const GenerateResult again = Run(cache.get(), prompt);
  EXPECT_GT(again.prefix_tokens_recomputed, 0);
  EXPECT_LT(again.prefix_tokens, 960);
  EXPECT_EQ(cache->stats().pages_recomputed * 64,
            again.prefix_tokens_recomputed);
  EXPECT_EQ(again.logits, reference);
  EXPECT_GE(DaemonStats()["nvme"]["checksum_failures"].get<int64_t>(), 1);
}

// The daemon dies while a prefix Load is held before layer 2: the wait
// ends by the client timeout, the cache degrades and recomputes, and the
// logits are those of a run without tierkv.
TEST_F(TierKvCacheTest, DaemonKilledMidLoadFallsBackWithoutWrongLogits) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  StartDaemon(WithNvme("write_back"));
  const auto prompt = Tokens(1000, 7);
  const std::vector<float> reference = Reference(prompt);
  StoreOnce(prompt);
  ASSERT_EQ(daemon_.Stop(), 0);
  const std::string fifo = daemon_.dir().File("stall.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int hold = ::open(fifo.c_str(), O_RDWR | O_CLOEXEC);  // never blocks
  ASSERT_GE(hold, 0);
  spec_.env = {{"TIERKV_TEST_STALL_LAYER", "2:" + fifo}};

  for (bool required : {false, true}) {
    SCOPED_TRACE(required ? "required" : "fallback");
    ASSERT_OK(daemon_.Start(spec_));  // each start stalls its first Load
    TierKvCacheOptions o = Options();
    o.client.timeout = std::chrono::seconds(1);  // bounds each wait
    o.required = required;
    int told = 0;
    o.on_degraded = [&](const Status&) { told++; };
    auto cache = TierKvCache::Create(
        GeometryFor(model_->config(), static_cast<int64_t>(prompt.size())), o);
    ASSERT_OK(cache);
    // Generate's steps, by hand, to kill the daemon mid-Load.
    auto start = (*cache)->AttachPrefix(prompt);
    ASSERT_OK(start);
    ASSERT_EQ(*start, 960);
    ASSERT_OK((*cache)->WaitForLayer(0, 960));
    ASSERT_OK((*cache)->WaitForLayer(1, 960));
    daemon_.Stop(SIGKILL);  // while it holds the Load before layer 2
    auto logits = model_->Forward(std::span(prompt).subspan(960), cache->get());
    ASSERT_FALSE(logits.ok());
    start = (*cache)->RecoverPrefix(logits.status());
    if (required) {
      EXPECT_FALSE(start.ok());
      EXPECT_EQ(start.status().code(), StatusCode::kIOError)
          << start.status().ToString();
      continue;
    }
    ASSERT_OK(start);
    EXPECT_EQ(*start, 0);
    EXPECT_TRUE((*cache)->stats().degraded);
    EXPECT_EQ(told, 1);
    logits = model_->Forward(prompt, cache->get());
    ASSERT_OK(logits);
    const size_t vocab = static_cast<size_t>(model_->config().vocab_size);
    EXPECT_TRUE(std::equal(logits->begin(), logits->end(), reference.begin(),
                           reference.begin() + vocab));
  }
  ::close(hold);
}

TEST_F(TierKvCacheTest, UnreachableDaemonDegradesOrFailsAsAsked) {
  StartDaemon(kDramOnly);
  const auto prompt = Tokens(100, 4);
  const std::vector<float> reference = Reference(prompt);
  daemon_.Stop();
  TierKvCacheOptions o = Options();
  auto required = TierKvCache::Create(GeometryFor(model_->config(), 200), o);
  EXPECT_EQ(required.status().code(), StatusCode::kUnavailable);

  o.required = false;
  std::vector<Status> told;
  o.on_degraded = [&](const Status& s) { told.push_back(s); };
  auto fallback = TierKvCache::Create(GeometryFor(model_->config(), 200), o);
  ASSERT_OK(fallback);
  EXPECT_TRUE((*fallback)->stats().degraded);
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0].code(), StatusCode::kUnavailable);
  EXPECT_EQ(Run(fallback->get(), prompt).logits, reference);
  EXPECT_EQ(told.size(), 1u);  // said once
}

TEST_F(TierKvCacheTest, WrongTokenIsAnErrorEvenWhenNotRequired) {
  StartDaemon(kDramOnly);
  TierKvCacheOptions o = Options();
  o.required = false;
  o.token = "not-the-token";
  auto cache = TierKvCache::Create(GeometryFor(model_->config(), 200), o);
  EXPECT_EQ(cache.status().code(), StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace tierkv::executor
