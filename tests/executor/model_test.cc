// Tests for executor/model: DSA sparse vs dense, indexer top-k, MQA vs MHA,
// IndexShare, KV-cache correctness, determinism.
#include "executor/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include "executor/generator.h"
#include "executor/presets.h"
#include "tests/executor/test_tokens.h"
#include "tests/testing/status_matchers.h"

namespace tierkv::executor {
namespace {

ModelConfig Tiny(int64_t index_topk) {
  ModelConfig c = PresetConfig("tiny").value();
  c.index_topk = index_topk;
  return c;
}

std::unique_ptr<Model> MakeModel(const ModelConfig& c, ModelOptions o = {},
                                 uint64_t seed = 1) {
  auto m = Model::Create(c, RandomWeights(c, seed), o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::move(m).value();
}

std::vector<int32_t> Tokens(int64_t n, uint32_t seed = 7) {
  return TestTokens(n, seed);
}

// Logits of every position of `tokens` run as one chunk.
std::vector<float> AllLogits(Model& m, const std::vector<int32_t>& tokens) {
  auto cache = m.NewCache(static_cast<int64_t>(tokens.size()) + 8);
  EXPECT_TRUE(cache.ok());
  auto r = m.Forward(tokens, cache->get(), /*all_logits=*/true);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

float MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  float scale = 0;
  for (float v : b) scale = std::max(scale, std::fabs(v));
  return MaxAbsDiff(a, b) / scale;
}

// (a) With index_topk >= length, the sparse path (indexer scores + top-k,
// absorbed MQA over the selected rows) equals dense causal MHA attention.
TEST(ModelTest, SparseEqualsDenseWhenTopKCoversTheSequence) {
  const auto tokens = Tokens(24);
  ModelOptions sparse;
  sparse.attention_mode = AttentionMode::kAbsorbedMqa;
  sparse.always_score_indexer = true;
  int observed = 0;
  sparse.observer = [&](int64_t, int64_t pos, std::span<const float>,
                        std::span<const int32_t> sel) {
    ++observed;
    EXPECT_EQ(static_cast<int64_t>(sel.size()), pos + 1);
  };
  ModelOptions dense;
  dense.attention_mode = AttentionMode::kMha;
  auto a = MakeModel(Tiny(32), sparse);
  auto b = MakeModel(Tiny(32), dense);
  const auto la = AllLogits(*a, tokens);
  const auto lb = AllLogits(*b, tokens);
  EXPECT_GT(observed, 0);  // the sparse path really ran
  EXPECT_LE(MaxAbsDiff(la, lb), 1e-5f);
}

// (b) A small index_topk selects exactly the brute-force top-k of the
// indexer scores, and changes the output.
TEST(ModelTest, SmallTopKSelectsBruteForceTopKAndDiffersFromDense) {
  const auto tokens = Tokens(64);
  ModelOptions o;
  int checked = 0;
  o.observer = [&](int64_t, int64_t pos, std::span<const float> scores,
                   std::span<const int32_t> sel) {
    ASSERT_EQ(static_cast<int64_t>(scores.size()), pos + 1);
    std::vector<int32_t> order(scores.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) {
      return scores[x] > scores[y];
    });
    order.resize(8);
    std::sort(order.begin(), order.end());
    ASSERT_EQ(std::vector<int32_t>(sel.begin(), sel.end()), order)
        << "position " << pos;
    ++checked;
  };
  auto sparse = MakeModel(Tiny(8), o);
  auto dense = MakeModel(Tiny(64));
  const auto ls = AllLogits(*sparse, tokens);
  const auto ld = AllLogits(*dense, tokens);
  // 3 full layers x 56 positions past the top-k.
  EXPECT_EQ(checked, 3 * (64 - 8));
  // Positions < 8 see every token either way; later ones differ.
  const size_t vocab = 128;
  std::vector<float> early_s(ls.begin(), ls.begin() + 8 * vocab);
  std::vector<float> early_d(ld.begin(), ld.begin() + 8 * vocab);
  EXPECT_LE(MaxAbsDiff(early_s, early_d), 1e-4f);
  std::vector<float> last_s(ls.end() - vocab, ls.end());
  std::vector<float> last_d(ld.end() - vocab, ld.end());
  EXPECT_GT(MaxAbsDiff(last_s, last_d), 1e-3f);
}

// (c) Absorbed MQA == MHA on the same (sparse) selection.
TEST(ModelTest, AbsorbedMqaMatchesMhaOnTheSameSelection) {
  const auto tokens = Tokens(40);
  ModelOptions mqa;
  mqa.attention_mode = AttentionMode::kAbsorbedMqa;
  ModelOptions mha;
  mha.attention_mode = AttentionMode::kMha;
  std::map<std::pair<int64_t, int64_t>, std::vector<int32_t>> sel_a, sel_b;
  mqa.observer = [&](int64_t l, int64_t p, std::span<const float>,
                     std::span<const int32_t> s) {
    sel_a[{l, p}].assign(s.begin(), s.end());
  };
  mha.observer = [&](int64_t l, int64_t p, std::span<const float>,
                     std::span<const int32_t> s) {
    sel_b[{l, p}].assign(s.begin(), s.end());
  };
  auto a = MakeModel(Tiny(8), mqa);
  auto b = MakeModel(Tiny(8), mha);
  const auto la = AllLogits(*a, tokens);
  const auto lb = AllLogits(*b, tokens);
  EXPECT_FALSE(sel_a.empty());
  EXPECT_LE(MaxRelDiff(la, lb), 1e-4f);
  // Same selection in layer 0 (identical inputs there).
  for (int64_t p = 8; p < 40; ++p) {
    EXPECT_EQ((sel_a[{0, p}]), (sel_b[{0, p}]));
  }
}

// (f) KV cache correctness: prefill n + decode 1 == prefill n + 1.
TEST(ModelTest, PrefillThenDecodeMatchesLongerPrefill) {
  for (int64_t topk : {8, 64}) {
    auto m = MakeModel(Tiny(topk));
    const auto tokens = Tokens(33);
    const std::vector<int32_t> head(tokens.begin(), tokens.end() - 1);
    auto cache = m->NewCache(64);
    ASSERT_OK(cache);
    ASSERT_OK(m->Forward(head, cache->get()));
    auto step =
        m->Forward(std::span<const int32_t>(&tokens.back(), 1), cache->get());
    ASSERT_OK(step);
    auto cache2 = m->NewCache(64);
    ASSERT_OK(cache2);
    auto full = m->Forward(tokens, cache2->get());
    ASSERT_OK(full);
    EXPECT_LE(MaxAbsDiff(*step, *full), 1e-4f) << "index_topk " << topk;
    EXPECT_EQ((*cache)->num_tokens(3, KvPart::kLatent), 33);
  }
}

// A cache served prefix is only as good as this: with one attention form,
// a token's logits do not depend on how the tokens before it were chunked
// (prefill all at once, prefix then suffix, or token by token).
TEST(ModelTest, ChunkingIsBitIdenticalInAbsorbedMqaForm) {
  for (int64_t topk : {8, 64}) {
    auto m =
        MakeModel(Tiny(topk), {.attention_mode = AttentionMode::kAbsorbedMqa});
    const auto tokens = Tokens(150);
    auto run = [&](std::vector<int64_t> cuts) {
      auto cache = m->NewCache(160);
      EXPECT_TRUE(cache.ok());
      std::vector<float> last;
      int64_t at = 0;
      cuts.push_back(static_cast<int64_t>(tokens.size()));
      for (int64_t cut : cuts) {
        auto r =
            m->Forward(std::span<const int32_t>(tokens.data() + at, cut - at),
                       cache->get());
        EXPECT_TRUE(r.ok());
        last = std::move(r).value();
        at = cut;
      }
      return last;
    };
    const std::vector<float> whole = run({});
    EXPECT_EQ(run({128}), whole) << "index_topk " << topk;
    EXPECT_EQ(run({64, 128, 149}), whole) << "index_topk " << topk;
  }
}

TEST(ModelTest, TokenByTokenDecodeMatchesOneChunk) {
  auto m = MakeModel(Tiny(8));
  const auto tokens = Tokens(20);
  auto cache = m->NewCache(32);
  ASSERT_OK(cache);
  std::vector<float> last;
  for (int32_t t : tokens) {
    auto r = m->Forward(std::span<const int32_t>(&t, 1), cache->get());
    ASSERT_OK(r);
    last = *r;
  }
  auto cache2 = m->NewCache(32);
  ASSERT_OK(cache2);
  auto full = m->Forward(tokens, cache2->get());
  ASSERT_OK(full);
  EXPECT_LE(MaxAbsDiff(last, *full), 1e-4f);
}

// (g) Results do not depend on the run or on the thread count.
TEST(ModelTest, ResultsIdenticalAcrossRunsAndThreadCounts) {
  const auto tokens = Tokens(40);
  std::vector<float> reference;
  for (int threads : {1, 2, 3, 1}) {
    ModelOptions o;
    o.num_threads = threads;
    auto m = MakeModel(Tiny(8), o);
    const auto logits = AllLogits(*m, tokens);
    if (reference.empty()) {
      reference = logits;
    } else {
      EXPECT_LE(MaxAbsDiff(logits, reference), 1e-5f) << threads;
    }
  }
}

// IndexShare: shared layers store no indexer keys and reuse the selection
// of the last full layer (the observer sees only full layers).
TEST(ModelTest, SharedLayersHaveNoIndexerKeysAndRunNoIndexer) {
  std::set<int64_t> layers_scored;
  ModelOptions o;
  o.observer = [&](int64_t l, int64_t, std::span<const float>,
                   std::span<const int32_t>) { layers_scored.insert(l); };
  auto m = MakeModel(Tiny(8), o);
  auto cache = m->NewCache(32);
  ASSERT_OK(cache);
  ASSERT_OK(m->Forward(Tokens(20), cache->get()));
  EXPECT_EQ(layers_scored, (std::set<int64_t>{0, 1, 3}));
  EXPECT_EQ((*cache)->num_tokens(0, KvPart::kIndexKey), 20);
  EXPECT_EQ((*cache)->num_tokens(2, KvPart::kIndexKey), 0);
  EXPECT_FALSE((*cache)->PageView(2, KvPart::kIndexKey, 0).ok());
}

// (h) The indexer's RoPE layout flag changes which tokens are selected
// (the two layouts pair different dims), and both layouts run.
TEST(ModelTest, IndexerRopeLayoutFlagIsHonoured) {
  std::map<bool, std::vector<int32_t>> last_sel;
  std::map<bool, std::vector<float>> logits;
  for (bool interleave : {true, false}) {
    ModelConfig c = Tiny(8);
    c.indexer_rope_interleave = interleave;
    ModelOptions o;
    o.observer = [&, interleave](int64_t l, int64_t p, std::span<const float>,
                                 std::span<const int32_t> s) {
      if (l == 0 && p == 47) last_sel[interleave].assign(s.begin(), s.end());
    };
    auto m = MakeModel(c, o);
    logits[interleave] = AllLogits(*m, Tokens(48));
  }
  ASSERT_EQ(last_sel[true].size(), 8u);
  ASSERT_EQ(last_sel[false].size(), 8u);
  EXPECT_GT(MaxAbsDiff(logits[true], logits[false]), 1e-4f);
}

TEST(ModelTest, OutOfVocabularyTokenIsRejected) {
  auto m = MakeModel(Tiny(8));
  auto cache = m->NewCache(8);
  ASSERT_OK(cache);
  const std::vector<int32_t> bad = {1, 128};
  auto r = m->Forward(bad, cache->get());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("128"), std::string::npos);
}

TEST(ModelTest, CacheCapacityExceededIsAnErrorNotACrash) {
  auto m = MakeModel(Tiny(8));
  auto cache = m->NewCache(4);
  ASSERT_OK(cache);
  auto r = m->Forward(Tokens(6), cache->get());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
}

TEST(Generate, GreedyIsReproducibleAndSampledDependsOnSeed) {
  auto m = MakeModel(Tiny(8));
  auto run = [&](GenerateOptions g) {
    auto cache = m->NewCache(64);
    EXPECT_TRUE(cache.ok());
    auto r = Generate(*m, cache->get(), Tokens(5), g);
    EXPECT_TRUE(r.ok());
    return std::move(r).value();
  };
  GenerateOptions greedy;
  greedy.max_new_tokens = 12;
  greedy.keep_logits = true;
  const auto g1 = run(greedy);
  const auto g2 = run(greedy);
  EXPECT_EQ(g1.tokens, g2.tokens);
  ASSERT_EQ(g1.logits.size(), 12u * 128u);
  // Each generated token is the argmax of its logits row.
  for (size_t i = 0; i < g1.tokens.size(); ++i) {
    auto row = g1.logits.begin() + static_cast<int64_t>(i * 128);
    EXPECT_EQ(std::max_element(row, row + 128) - row, g1.tokens[i]);
  }
  GenerateOptions s;
  s.max_new_tokens = 12;
  s.sampler.greedy = false;
  s.sampler.temperature = 2.0;
  s.sampler.seed = 1;
  const auto s1 = run(s);
  const auto s1b = run(s);
  s.sampler.seed = 2;
  const auto s2 = run(s);
  EXPECT_EQ(s1.tokens, s1b.tokens);
  EXPECT_NE(s1.tokens, s2.tokens);
}

}  // namespace
}  // namespace tierkv::executor
