// Decode through a sparse working set (Model::NewWorkingSet, Forward's
// working_set, Generate's options.working_set): logits bit-identical to
// reading the cache directly while the working set is too small for the
// context (it misses and evicts every step), for lru and topk, with the
// slots in host memory and in (emulated) device memory; IndexShare
// layers share their full layer's selection; selection counts reach
// tierkvd through TierKvCache.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "executor/generator.h"
#include "executor/model.h"
#include "executor/presets.h"
#include "executor/tier_kv_cache.h"
#include "executor/weights.h"
#include "tests/executor/test_tokens.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"

namespace tierkv::executor {
namespace {

constexpr int64_t kPrompt = 120;
constexpr int64_t kNewTokens = 72;  // 71 decode steps

std::unique_ptr<Model> TinyModel() {
  ModelConfig c = PresetConfig("tiny").value();  // index_topk 16
  auto m = Model::Create(c, RandomWeights(c, /*seed=*/5),
                         {.attention_mode = AttentionMode::kAbsorbedMqa});
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::move(m).value();
}

GenerateResult Decode(Model& m, KvCache* cache,
                      std::optional<WorkingSetOptions> ws) {
  GenerateOptions o;
  o.max_new_tokens = kNewTokens;
  o.keep_logits = true;
  o.working_set = ws;
  o.report_interval = 16;
  auto r = Generate(m, cache, TestTokens(kPrompt, 11), o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : GenerateResult{};
}

TEST(WorkingSetDecodeTest, LogitsAreBitIdenticalWithASmallWorkingSet) {
  auto m = TinyModel();
  auto direct_cache = m->NewCache(kPrompt + kNewTokens);
  ASSERT_OK(direct_cache);
  const GenerateResult direct = Decode(*m, direct_cache->get(), std::nullopt);
  ASSERT_EQ(direct.logits.size(), size_t{kNewTokens} * 128);
  const int64_t full_layers = std::count(m->config().indexer_full.begin(),
                                         m->config().indexer_full.end(), true);
  ASSERT_GE(full_layers, 1);
  ASSERT_LT(full_layers, m->config().num_hidden_layers) << "has IndexShare";
  // The slots in host memory, and in device memory (the emulated device:
  // misses go in by the device row gather, attention reads the slots).
  for (auto [policy, memory] :
       {std::pair{WorkingSetPolicy::kLru, WorkingSetMemory::kHost},
        std::pair{WorkingSetPolicy::kTopk, WorkingSetMemory::kHost},
        std::pair{WorkingSetPolicy::kLru, WorkingSetMemory::kDevice},
        std::pair{WorkingSetPolicy::kTopk, WorkingSetMemory::kDevice}}) {
    SCOPED_TRACE(
        fmt::format("{} in {} memory", WorkingSetPolicyName(policy),
                    memory == WorkingSetMemory::kHost ? "host" : "device"));
    auto cache = m->NewCache(kPrompt + kNewTokens);
    ASSERT_OK(cache);
    // 24 slots for 120-192 tokens of context, 16 selected per step.
    const GenerateResult r =
        Decode(*m, cache->get(),
               WorkingSetOptions{.slots = 24,
                                 .policy = policy,
                                 .sink_tokens = 2,
                                 .recent_tokens = 4,
                                 .memory = memory,
                                 .device_backend = "emulated"});
    EXPECT_EQ(r.tokens, direct.tokens);
    EXPECT_TRUE(r.logits == direct.logits) << "logits differ";
    const WorkingSetStats& s = r.working_set;
    // One selection per full layer per decode step: shared layers read
    // their full layer's selection, they do not select.
    EXPECT_EQ(s.steps, static_cast<uint64_t>(r.decode_steps * full_layers));
    EXPECT_EQ(s.selected, s.steps * 16);
    EXPECT_GT(s.misses, s.steps) << "a too-small working set misses";
    EXPECT_GT(s.evictions, 0u);
    EXPECT_GT(s.hits, 0u);
    // Every miss is copied once per layer of its group: the row bytes
    // moved equal misses x rows of the group's layers.
    const uint64_t row_bytes = m->config().latent_dim() * 4;
    EXPECT_EQ(s.bytes_in % row_bytes, 0u);
    EXPECT_GE(s.bytes_in / row_bytes, s.misses);
    EXPECT_LE(s.bytes_in / row_bytes,
              s.misses * static_cast<uint64_t>(m->config().num_hidden_layers));
    // On the device: at most one row gather per layer and step.
    if (memory == WorkingSetMemory::kDevice) {
      EXPECT_GT(s.gathers, 0u);
      EXPECT_LE(s.gathers, static_cast<uint64_t>(
                               r.decode_steps * m->config().num_hidden_layers));
    } else {
      EXPECT_EQ(s.gathers, 0u);
    }
  }
}

TEST(WorkingSetDecodeTest, TooFewSlotsForASelectionIsAClearError) {
  auto m = TinyModel();
  auto cache = m->NewCache(kPrompt + kNewTokens);
  ASSERT_OK(cache);
  auto ws = m->NewWorkingSet(cache->get(), {.slots = 8});
  EXPECT_EQ(ws.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ws.status().message().find("index_topk 16"), std::string::npos);
}

// With TierKvCache, the working set's selection counts go to tierkvd
// (Client::ReportTopk) for the pages it stored, and logits stay equal.
TEST(WorkingSetDecodeTest, SelectionCountsReachTheDaemonFromTierKvCache) {
  auto m = TinyModel();
  testing::DaemonProcess daemon;
  ASSERT_OK(daemon.Start(
      {.config_toml = "[[namespace]]\nname = \"exec\"\ntoken = "
                      "\"exec-token\"\nhost_bytes = \"8MiB\"\nshards = 1\n"
                      "eviction_policy = \"topk\"\n"}));
  TierKvCacheOptions o;
  o.client.socket_path = daemon.socket_path();
  o.namespace_name = "exec";
  o.token = "exec-token";
  o.salt = ModelIdentity(*m);
  o.required = true;
  auto cache =
      TierKvCache::Create(GeometryFor(m->config(), kPrompt + kNewTokens), o);
  ASSERT_OK(cache);
  const WorkingSetOptions ws{.slots = 24,
                             .policy = WorkingSetPolicy::kTopk,
                             .sink_tokens = 2,
                             .recent_tokens = 4};
  const GenerateResult r = Decode(*m, cache->get(), ws);
  auto reference = m->NewCache(kPrompt + kNewTokens);
  ASSERT_OK(reference);
  EXPECT_TRUE(Decode(*m, reference->get(), std::nullopt).logits == r.logits);
  EXPECT_GT((*cache)->stats().selections_reported, 0);
  auto c = daemon.Connect("exec", "exec-token");
  ASSERT_OK(c);
  auto stats = (*c)->StatsJson();
  ASSERT_OK(stats);
  EXPECT_EQ(
      nlohmann::json::parse(*stats)["transfers"]["topk_reports"].get<int64_t>(),
      (*cache)->stats().selections_reported);
}

}  // namespace
}  // namespace tierkv::executor
