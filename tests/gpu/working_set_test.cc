// The sparse working set with its slots in HBM (WorkingSetMemory::kDevice
// on the CUDA backend): misses gathered into their slots by the row-gather
// kernel from registered host rows, hits left in place, and every selected
// row as the source has it, also when the gathers go on the engine's own
// stream ahead of its consumer. Skips without a device; tests/gpu/run.sh fails
// on a skip (TIERKV_REQUIRE_GPU=1).
#include <cuda_runtime_api.h>
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

// A skip without a CUDA device (a failure under TIERKV_REQUIRE_GPU=1).
#define WORKING_SET_OR_SKIP(ws)                                          \
  if (!(ws).ok()) {                                                      \
    if (std::getenv("TIERKV_REQUIRE_GPU") != nullptr) {                  \
      FAIL() << "no CUDA working set: " << (ws).status().ToString();     \
    }                                                                    \
    GTEST_SKIP() << "no CUDA device here: " << (ws).status().ToString(); \
  }

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
  WORKING_SET_OR_SKIP(ws);
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

// The engine's consumer on its own stream: each step's gather goes on the
// engine's stream (Rows with an EngineStream), a copy of the whole slot
// buffer queued behind it stands in for the attention kernel, and eight
// steps are queued before the host looks: every snapshot holds its own
// step's rows, none a later gather's.
TEST(CudaWorkingSetTest, RowsOnTheEnginesStreamAreReadInStepOrder) {
  constexpr uint32_t kRow = 656, kTokens = 16384, kTopk = 2048, kSlots = 4096;
  constexpr int kSteps = 64, kQueued = 8;
  std::vector<std::byte> arena(size_t{kRow} * kTokens);
  std::mt19937 rng(5);
  for (auto& b : arena) b = static_cast<std::byte>(rng());
  const RowSource source = [&](uint16_t, int32_t token) {
    return std::span<const std::byte>(arena).subspan(
        static_cast<size_t>(token) * kRow, kRow);
  };
  auto ws = SparseWorkingSet::Create({{0}, {kRow}},
                                     {.slots = kSlots,
                                      .policy = WorkingSetPolicy::kLru,
                                      .memory = WorkingSetMemory::kDevice,
                                      .device_backend = "cuda"},
                                     source);
  WORKING_SET_OR_SKIP(ws);
  ASSERT_OK((*ws)->RegisterSourceMemory(arena));
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            cudaSuccess);
  const size_t buffer_bytes = size_t{kRow} * kSlots;
  void* host = nullptr;
  ASSERT_EQ(cudaMallocHost(&host, buffer_bytes * kQueued), cudaSuccess);
  auto* pinned = static_cast<std::byte*>(host);
  std::vector<int32_t> all(kTokens);
  std::iota(all.begin(), all.end(), 0);
  for (int batch = 0; batch < kSteps / kQueued; ++batch) {
    std::vector<std::vector<int32_t>> ids(kQueued);
    std::vector<std::vector<uint32_t>> slots(kQueued);
    for (int q = 0; q < kQueued; ++q) {
      std::shuffle(all.begin(), all.end(), rng);
      ids[q].assign(all.begin(), all.begin() + kTopk);
      ASSERT_OK((*ws)->Select(0, ids[q], kTokens));
      auto rows = (*ws)->Rows(0, EngineStream{.handle = stream});
      ASSERT_OK(rows);
      slots[q].assign(rows->slots.begin(), rows->slots.end());
      ASSERT_EQ(cudaMemcpyAsync(pinned + q * buffer_bytes, rows->base,
                                buffer_bytes, cudaMemcpyDeviceToHost, stream),
                cudaSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (int q = 0; q < kQueued; ++q) {
      for (size_t i = 0; i < ids[q].size(); ++i) {
        const auto want = source(0, ids[q][i]);
        const std::byte* got = pinned + q * buffer_bytes + slots[q][i] * kRow;
        ASSERT_TRUE(std::equal(want.begin(), want.end(), got))
            << "step " << batch * kQueued + q << " row " << i;
      }
    }
  }
  EXPECT_GT((*ws)->stats().hits, 0u);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

}  // namespace
}  // namespace tierkv
