// The sparse working set with its slots in HBM (WorkingSetMemory::kDevice
// on the CUDA backend): misses gathered into their slots by the row-gather
// kernel from registered host rows, hits left in place, and every selected
// row as the source has it. Skips without a device; tests/gpu/run.sh fails
// on a skip (TIERKV_REQUIRE_GPU=1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "tests/testing/status_matchers.h"
#include "tierkv/sparse_working_set.h"

namespace tierkv {
namespace {

TEST(CudaWorkingSetTest, MissesGoIntoHbmSlotsAndEveryRowIsTheSources) {
  // Two layers sharing one selection, GLM-5's 656-byte fp8 latent rows, a
  // 16K-token context in one registered host arena, 2048 of 4096 slots
  // selected per step.
  constexpr uint32_t kRow = 656, kTokens = 16384, kTopk = 2048;
  std::vector<std::byte> arena(size_t{kRow} * kTokens * 2);
  std::mt19937 rng(3);
  for (auto& b : arena) b = static_cast<std::byte>(rng());
  const RowSource source = [&](uint16_t layer, int32_t token) {
    return std::span<const std::byte>(arena).subspan(
        (size_t{layer} * kTokens + static_cast<size_t>(token)) * kRow, kRow);
  };
  auto ws = SparseWorkingSet::Create({{0, 0}, {kRow, kRow}},
                                     {.slots = 4096,
                                      .policy = WorkingSetPolicy::kTopk,
                                      .memory = WorkingSetMemory::kDevice,
                                      .device_backend = "cuda"},
                                     source);
  if (!ws.ok()) {
    if (std::getenv("TIERKV_REQUIRE_GPU") != nullptr) {
      FAIL() << "no CUDA working set: " << ws.status().ToString();
    }
    GTEST_SKIP() << "no CUDA device here: " << ws.status().ToString();
  }
  ASSERT_EQ((*ws)->buffer_backend(), "cuda");
  ASSERT_OK((*ws)->RegisterSourceMemory(arena));
  std::vector<int32_t> all(kTokens);
  std::iota(all.begin(), all.end(), 0);
  std::vector<std::byte> out(size_t{kRow} * kTopk);
  for (int step = 0; step < 20; ++step) {
    // Half of each step's selection is a hot set of 3000 tokens.
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<int32_t> ids(all.begin(), all.begin() + kTopk / 2);
    for (int32_t t = 0; ids.size() < kTopk; ++t) {
      const int32_t hot = static_cast<int32_t>(rng() % 3000);
      if (std::find(ids.begin(), ids.end(), hot) == ids.end()) {
        ids.push_back(hot);
      }
    }
    ASSERT_OK((*ws)->Select(0, ids, kTokens));
    for (uint16_t layer : {uint16_t{0}, uint16_t{1}}) {
      auto rows = (*ws)->Rows(layer);
      ASSERT_OK(rows);
      EXPECT_FALSE(rows->host_addressable);
      ASSERT_OK((*ws)->Gather(layer, out));
      for (size_t i = 0; i < ids.size(); ++i) {
        const auto want = source(layer, ids[i]);
        ASSERT_TRUE(
            std::equal(want.begin(), want.end(), out.begin() + i * kRow))
            << "step " << step << " layer " << layer << " id " << ids[i];
      }
    }
  }
  const WorkingSetStats s = (*ws)->stats();
  EXPECT_GT(s.hits, 0u);
  EXPECT_GT(s.evictions, 0u);
  EXPECT_EQ(s.bytes_in, s.misses * 2 * kRow) << "every miss, once per layer";
  EXPECT_LE(s.gathers, 20u * 2);
}

}  // namespace
}  // namespace tierkv
