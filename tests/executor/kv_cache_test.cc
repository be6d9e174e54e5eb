// Tests for executor/kv_cache: paging, gather, IndexShare parts, errors.
#include "executor/kv_cache.h"

#include <gtest/gtest.h>

#include "executor/presets.h"
#include "tests/testing/status_matchers.h"

namespace tierkv::executor {
namespace {

std::unique_ptr<InProcessKvCache> MakeCache(int64_t max_tokens = 200) {
  KvCacheGeometry g = GeometryFor(PresetConfig("tiny").value(), max_tokens);
  auto c = InProcessKvCache::Create(g);
  EXPECT_TRUE(c.ok());
  return std::move(c).value();
}

TEST(KvCacheGeometry, Glm5ShapeRowsAre576LatentAnd128IndexKeys) {
  const auto g = GeometryFor(PresetConfig("glm5-shape").value(), 1024);
  EXPECT_EQ(g.RowDim(KvPart::kLatent), 576);
  EXPECT_EQ(g.RowDim(KvPart::kIndexKey), 128);
  EXPECT_EQ(g.page_tokens, 64);
  EXPECT_FALSE(g.has_index_keys[3]);
  EXPECT_TRUE(g.has_index_keys[6]);
}

TEST(InProcessKvCache, GatherAcrossPagesReturnsWrittenRows) {
  auto cache = MakeCache();
  const int64_t dim = cache->geometry().latent_dim;  // 40
  std::vector<float> rows(static_cast<size_t>(150 * dim));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i);
  ASSERT_OK(
      cache->Write(1, KvPart::kLatent, 0, std::span(rows).first(100 * dim)));
  ASSERT_OK(cache->Write(1, KvPart::kLatent, 100,
                         std::span(rows).subspan(100 * dim)));
  const std::vector<int32_t> ids = {149, 0, 64, 63, 64};
  std::vector<float> out(ids.size() * dim);
  ASSERT_OK(cache->Gather(1, KvPart::kLatent, ids, out));
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(out[i * dim], static_cast<float>(ids[i] * dim));
    EXPECT_EQ(out[i * dim + dim - 1],
              static_cast<float>(ids[i] * dim + dim - 1));
  }
  EXPECT_EQ(cache->num_tokens(1, KvPart::kLatent), 150);
  auto page = cache->PageView(1, KvPart::kLatent, 2);
  ASSERT_OK(page);
  EXPECT_EQ((*page)[0], static_cast<float>(128 * dim));
}

TEST(InProcessKvCache, SharedLayerHasNoIndexKeyPart) {
  auto cache = MakeCache();
  std::vector<float> key(16, 1.0f);
  const Status s =
      cache->Write(2, KvPart::kIndexKey, 0, key);  // tiny: layer 2 shared
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("shared"), std::string::npos);
  EXPECT_OK(cache->Write(3, KvPart::kIndexKey, 0, key));
}

TEST(InProcessKvCache, RejectsHolesUnwrittenTokensAndOverflow) {
  auto cache = MakeCache(70);
  const int64_t dim = cache->geometry().latent_dim;
  std::vector<float> row(static_cast<size_t>(dim), 0.5f);
  EXPECT_EQ(cache->Write(0, KvPart::kLatent, 5, row).code(),
            StatusCode::kInvalidArgument);
  ASSERT_OK(cache->Write(0, KvPart::kLatent, 0, row));
  std::vector<float> out(static_cast<size_t>(dim));
  const std::vector<int32_t> unwritten = {1};
  EXPECT_FALSE(cache->Gather(0, KvPart::kLatent, unwritten, out).ok());
  std::vector<float> many(static_cast<size_t>(80 * dim));
  EXPECT_EQ(cache->Write(0, KvPart::kLatent, 1, many).code(),
            StatusCode::kResourceExhausted);
  ASSERT_OK(cache->Truncate(0));
  EXPECT_EQ(cache->num_tokens(0, KvPart::kLatent), 0);
}

}  // namespace
}  // namespace tierkv::executor
