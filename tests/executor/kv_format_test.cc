// KV row formats: sizes of GLM-5's rows, exact fp8 / bf16 rounding.
#include "executor/kv_format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace tierkv::executor {
namespace {

TEST(KvFormatTest, Glm5RowSizesAreTheEngineFormats) {
  // Latent 512 + 64, indexer key 128 (glm5-dsa.md, appendix).
  EXPECT_EQ(KvRowFormat::Latent(KvDtype::kF32, 576, 512).RowBytes(), 2304u);
  EXPECT_EQ(KvRowFormat::Latent(KvDtype::kBF16, 576, 512).RowBytes(), 1152u);
  EXPECT_EQ(KvRowFormat::Latent(KvDtype::kFP8, 576, 512).RowBytes(), 656u);
  EXPECT_EQ(KvRowFormat::IndexKey(KvDtype::kBF16, 128).RowBytes(), 256u);
  EXPECT_EQ(KvRowFormat::IndexKey(KvDtype::kFP8, 128).RowBytes(), 132u);
  // A short last tile has its own scale (tiny preset: 32 + 8 latent).
  EXPECT_EQ(KvRowFormat::Latent(KvDtype::kFP8, 40, 32).RowBytes(), 52u);
  EXPECT_EQ(KvRowFormat::IndexKey(KvDtype::kFP8, 200).RowBytes(), 208u);
}

TEST(KvFormatTest, Fp8UsesPowerOfTwoTileScalesAndRoundsToE4m3) {
  const KvRowFormat f = KvRowFormat::Latent(KvDtype::kFP8, 256 + 2, 256);
  std::vector<float> row(258, 0.0f);
  // Tile 0: amax 448 -> scale 2^ceil(log2(1)) = 1: e4m3 values stay exact.
  row[0] = 448.0f;
  row[1] = -1.5f;
  row[2] = 0.0f;
  // Tile 1: amax 1000 -> scale 2^ceil(log2(1000 / 448)) = 4; 1000 / 4 = 250
  // rounds to e4m3 256 (neighbours 240 and 256), so it decodes as 1024.
  row[128] = 1000.0f;
  row[129] = 13.0f;  // 13 / 4 = 3.25 -> e4m3 3.25 (exact): 13
  // RoPE part, bf16: 1 + 2^-10 rounds to 1; 3.0 is exact.
  row[256] = 1.0009765625f;
  row[257] = 3.0f;
  std::vector<std::byte> bytes(f.RowBytes());
  f.Encode(row, bytes);
  float s0, s1;
  std::memcpy(&s0, bytes.data() + 256, 4);
  std::memcpy(&s1, bytes.data() + 260, 4);
  EXPECT_EQ(s0, 1.0f);
  EXPECT_EQ(s1, 4.0f);
  std::vector<float> back(258);
  f.Decode(bytes, back);
  EXPECT_EQ(back[0], 448.0f);
  EXPECT_EQ(back[1], -1.5f);
  EXPECT_EQ(back[2], 0.0f);
  EXPECT_EQ(back[128], 1024.0f);
  EXPECT_EQ(back[129], 13.0f);
  EXPECT_EQ(back[256], 1.0f);
  EXPECT_EQ(back[257], 3.0f);
  // RoundTrip is Decode(Encode()), and a second pass changes nothing.
  std::vector<float> again = row;
  f.RoundTrip(again);
  EXPECT_EQ(again, back);
  f.RoundTrip(again);
  EXPECT_EQ(again, back);
}

TEST(KvFormatTest, Fp8ScaleFloorKeepsAllZeroTilesFinite) {
  // amax is clamped to 1e-4, so a zero tile has a tiny finite scale.
  const KvRowFormat f = KvRowFormat::IndexKey(KvDtype::kFP8, 128);
  std::vector<float> row(128, 0.0f), back(128, 1.0f);
  std::vector<std::byte> bytes(f.RowBytes());
  f.Encode(row, bytes);
  f.Decode(bytes, back);
  EXPECT_EQ(back, row);
  float s;
  std::memcpy(&s, bytes.data() + 128, 4);
  EXPECT_EQ(s, std::exp2(std::ceil(std::log2(1e-4f / 448.0f))));
}

TEST(KvFormatTest, Bf16RoundsToNearestEvenAndFp32IsExact) {
  const KvRowFormat bf = KvRowFormat::IndexKey(KvDtype::kBF16, 2);
  std::vector<float> row = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256};
  bf.RoundTrip(row);  // halfway cases: to the even mantissa
  EXPECT_EQ(row[0], 1.0f);
  EXPECT_EQ(row[1], 1.0f + 4.0f / 256);
  const KvRowFormat f32 = KvRowFormat::IndexKey(KvDtype::kF32, 2);
  std::vector<float> exact = {0.1f, -3.3e-7f};
  const std::vector<float> before = exact;
  f32.RoundTrip(exact);
  EXPECT_EQ(exact, before);
}

TEST(KvFormatTest, ParseNamesTheFormats) {
  EXPECT_EQ(*ParseKvDtype("fp8"), KvDtype::kFP8);
  EXPECT_EQ(*ParseKvDtype("bf16"), KvDtype::kBF16);
  EXPECT_EQ(*ParseKvDtype("fp32"), KvDtype::kF32);
  EXPECT_EQ(ParseKvDtype("int4").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tierkv::executor
