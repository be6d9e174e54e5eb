// Tests for client/weights_chunks: which chunks of a planned image are the
// caller's own bytes and how packs are assembled (no daemon needed).
#include "client/weights_chunks.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace tierkv::client_internal {
namespace {

std::vector<std::byte> Filled(size_t n, uint8_t seed) {
  std::vector<std::byte> out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] = static_cast<std::byte>(seed + i * 7);
  }
  return out;
}

WeightsTensor Tensor(std::string name, uint32_t layer, uint64_t bytes) {
  return {.name = std::move(name),
          .dtype = "U8",
          .shape = {static_cast<int64_t>(bytes)},
          .layer = layer,
          .bytes = bytes};
}

TEST(WeightsChunkSource, PackIsItsTensorsAtTheirOffsetsWithZerosBetween) {
  const auto a = Filled(100, 1), b = Filled(300, 2), c = Filled(5, 3);
  auto m = PlanWeightsImage(
      "m", "l", {Tensor("a", 0, 100), Tensor("b", 0, 300), Tensor("c", 0, 5)});
  ASSERT_OK(m);
  ASSERT_EQ(m->chunks.size(), 1u);
  const std::vector<std::span<const std::byte>> data = {a, b, c};
  WeightsChunkSource source(*m, data);
  EXPECT_FALSE(source.Direct(0).has_value());

  std::vector<std::byte> got(m->chunks[0].bytes, std::byte{0xEE});
  source.Assemble(0, got);
  std::vector<std::byte> want(m->chunks[0].bytes, std::byte{0});
  for (size_t i = 0; i < 3; ++i) {
    const auto& t = m->tensors[i];
    std::memcpy(want.data() + (t.offset - m->chunks[0].offset), data[i].data(),
                t.bytes);
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(m->tensors[1].offset, 256u);  // packed 256-byte aligned
}

TEST(WeightsChunkSource, LargeTensorPiecesAreBorrowedFromTheCaller) {
  const uint64_t big = kWeightsSmallTensorBytes + 4097;
  const auto small = Filled(10, 4), large = Filled(big, 5);
  auto m =
      PlanWeightsImage("m", "l", {Tensor("norm", 0, 10), Tensor("w", 1, big)});
  ASSERT_OK(m);
  ASSERT_EQ(m->chunks.size(), 2u);
  const std::vector<std::span<const std::byte>> data = {small, large};
  WeightsChunkSource source(*m, data);
  // A pack of one tensor is that tensor's bytes too.
  auto first = source.Direct(0);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->data(), small.data());
  auto second = source.Direct(1);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->data(), large.data());
  EXPECT_EQ(second->size(), big);
  EXPECT_EQ(m->tensors[1].offset % kWeightsChunkAlignment, 0u);
}

TEST(WeightsChunkSource, DescribeNamesTheChunksTensorsAndLayer) {
  const auto x = Filled(1, 0), a = Filled(1, 1), b = Filled(1, 2),
             c = Filled(1, 3), d = Filled(1, 4);
  auto m = PlanWeightsImage(
      "m", "l",
      {Tensor("x", 0, 1), Tensor("w.a", 1, 1), Tensor("w.b", 1, 1),
       Tensor("w.c", 1, 1), Tensor("w.d", 1, 1)});
  ASSERT_OK(m);
  const std::vector<std::span<const std::byte>> data = {x, a, b, c, d};
  WeightsChunkSource source(*m, data);
  const std::string text = source.Describe(1);
  EXPECT_NE(text.find("chunk 1 (layer 1"), std::string::npos) << text;
  EXPECT_NE(text.find("w.a, w.b, w.c and 1 more"), std::string::npos) << text;
}

}  // namespace
}  // namespace tierkv::client_internal
