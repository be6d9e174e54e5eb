// CudaBackend on a real device: copies and events, the row-gather kernel
// (registered and unregistered host rows, vector and byte paths), an
// allocation the device cannot hold, IPC export to another process (a
// re-executed copy of this binary) and back, and an importer that dies
// holding the handle, stream memory operations on host words. Built whenever
// nvcc is (CI compiles and links it); every test skips on a machine without a
// device, and tests/gpu/run.sh fails on a skip (TIERKV_REQUIRE_GPU=1).
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "storage/device/device_backend.h"
#include "tests/gpu/spawn_self.h"
#include "tests/testing/status_matchers.h"

namespace tierkv::storage {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kTimeout{20000};
constexpr char kImportEnv[] = "TIERKV_GPU_TEST_IMPORT";

std::vector<std::byte> Pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

// The CUDA backend, or a skip (a failure under TIERKV_REQUIRE_GPU=1).
std::unique_ptr<DeviceBackend> Cuda(Status* why) {
  auto b = DeviceBackend::Open({.kind = DeviceBackendKind::kCuda});
  if (!b.ok()) {
    *why = b.status();
    return nullptr;
  }
  return std::move(b).value();
}

#define CUDA_OR_SKIP(b)                                                 \
  Status cuda_status_;                                                  \
  auto b = Cuda(&cuda_status_);                                         \
  if (b == nullptr) {                                                   \
    if (std::getenv("TIERKV_REQUIRE_GPU") != nullptr) {                 \
      FAIL() << "no CUDA backend: " << cuda_status_.ToString();         \
    }                                                                   \
    GTEST_SKIP() << "no CUDA device here: " << cuda_status_.ToString(); \
  }

void Sync(DeviceBackend& b, StreamId stream) {
  auto e = b.RecordEvent(stream);
  ASSERT_OK(e);
  ASSERT_OK(b.WaitEvent(*e, kTimeout));
  EXPECT_TRUE(b.EventDone(*e));
}

TEST(CudaBackendTest, AutoPicksTheDevice) {
  CUDA_OR_SKIP(b);
  EXPECT_TRUE(DeviceBackend::CudaBuiltIn());
  std::string why;
  auto autob = DeviceBackend::Open({.kind = DeviceBackendKind::kAuto}, &why);
  ASSERT_OK(autob);
  EXPECT_EQ((*autob)->name(), "cuda");
  EXPECT_TRUE(why.empty()) << why;
  EXPECT_EQ(
      DeviceBackend::Open({.kind = DeviceBackendKind::kCuda, .device = 4096})
          .status()
          .code(),
      StatusCode::kInvalidArgument);
}

TEST(CudaBackendTest, CopiesRoundTripInOrderFromPageableAndPinnedMemory) {
  CUDA_OR_SKIP(b);
  auto pool = b->AllocatePool(8 << 20);
  ASSERT_OK(pool);
  auto first = Pattern(1 << 20, 1), second = Pattern(1 << 20, 2);
  ASSERT_OK(b->RegisterHost(second));
  EXPECT_EQ(b->RegisterHost(std::span(second).subspan(4096, 4096)).code(),
            StatusCode::kAlreadyExists);
  std::vector<std::byte> back(1 << 20);
  const DeviceRegion r{pool->id, 3 << 20, 1 << 20};
  ASSERT_OK(b->CopyToDevice(0, r, first));   // pageable
  ASSERT_OK(b->CopyToDevice(0, r, second));  // pinned, overwrites
  ASSERT_OK(b->CopyToHost(0, back, r));
  Sync(*b, 0);
  EXPECT_EQ(back, second);
  ASSERT_OK(b->UnregisterHost(second.data()));
  EXPECT_EQ(b->UnregisterHost(second.data()).code(), StatusCode::kNotFound);
  ASSERT_OK(b->FreePool(pool->id));
}

// A layer's pages as one cudaMemcpyBatchAsync (or the per-copy fallback),
// from pinned and pageable memory, in scrambled slots.
TEST(CudaBackendTest, ABatchOfPageCopiesLandsInItsSlots) {
  CUDA_OR_SKIP(b);
  constexpr uint64_t kPage = 41984;
  constexpr uint32_t kPages = 256;
  auto pool = b->AllocatePool(kPage * kPages);
  ASSERT_OK(pool);
  for (bool pinned : {true, false}) {
    auto arena = Pattern(kPage * kPages, pinned ? 21 : 22);
    if (pinned) ASSERT_OK(b->RegisterHost(arena));
    std::vector<uint32_t> slot(kPages);
    std::iota(slot.begin(), slot.end(), 0u);
    std::shuffle(slot.begin(), slot.end(), std::mt19937(pinned));
    std::vector<DeviceRegion> dsts;
    std::vector<std::span<const std::byte>> srcs;
    for (uint32_t i = 0; i < kPages; ++i) {
      dsts.push_back({pool->id, slot[i] * kPage, kPage});
      srcs.push_back(std::span(arena).subspan(i * kPage, kPage));
    }
    ASSERT_OK(b->CopyToDeviceBatch(0, dsts, srcs));
    std::vector<std::byte> back(kPage * kPages);
    ASSERT_OK(b->CopyToHost(0, back, {pool->id, 0, back.size()}));
    Sync(*b, 0);
    for (uint32_t i = 0; i < kPages; ++i) {
      ASSERT_EQ(std::memcmp(back.data() + slot[i] * kPage,
                            arena.data() + i * kPage, kPage),
                0)
          << "page " << i << ", pinned " << pinned;
    }
    if (pinned) ASSERT_OK(b->UnregisterHost(arena.data()));
  }
  ASSERT_OK(b->FreePool(pool->id));
}

// Copies of every alignment the batch-copy kernel distinguishes (16, 8,
// 4, 1 bytes) and sizes around its chunks and its 64 KiB pieces, from a
// registered host arena (the kernel reads it mapped) and then device to
// device, each into a pool pre-filled with a pattern: every copied byte
// lands, and every byte between the copies is left as it was.
TEST(CudaBackendTest, BatchCopiesOfOddSizesAndAlignmentsLandExactly) {
  CUDA_OR_SKIP(b);
  constexpr uint64_t kBytes = 4 << 20;
  const std::vector<uint64_t> sizes = {1,     3,     15,     16,        17,
                                       4095,  4096,  41984,  65535,     65536,
                                       65537, 98304, 300001, 131072 + 9};
  const std::vector<uint64_t> skews = {0, 1, 2, 4, 8, 3, 5, 16, 12, 7};
  auto arena = Pattern(kBytes, 31);
  ASSERT_OK(b->RegisterHost(arena));
  const auto before = Pattern(kBytes, 32);
  auto pool = b->AllocatePool(2 * kBytes);
  ASSERT_OK(pool);
  ASSERT_OK(b->CopyToDevice(0, {pool->id, 0, kBytes}, before));
  ASSERT_OK(b->CopyToDevice(0, {pool->id, kBytes, kBytes}, before));
  // Item i: arena bytes [src, src + size) -> pool [dst, dst + size), with
  // independent skews, 64 bytes apart; then the same layout device to
  // device from the first half of the pool into the second.
  std::vector<std::span<const std::byte>> srcs;
  std::vector<DeviceRegion> dsts, device_srcs, device_dsts;
  std::vector<std::byte> want = before;
  uint64_t src = 0, dst = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    src += skews[i % skews.size()];
    dst += skews[(i + 3) % skews.size()];
    srcs.push_back(std::span<const std::byte>(arena).subspan(src, sizes[i]));
    dsts.push_back({pool->id, dst, sizes[i]});
    device_srcs.push_back({pool->id, dst, sizes[i]});
    device_dsts.push_back({pool->id, kBytes + dst, sizes[i]});
    std::memcpy(want.data() + dst, arena.data() + src, sizes[i]);
    src += sizes[i] + 64;
    dst += sizes[i] + 64;
  }
  ASSERT_LT(std::max(src, dst), kBytes);
  ASSERT_OK(b->CopyToDeviceBatch(0, dsts, srcs));
  ASSERT_OK(b->CopyOnDeviceBatch(0, device_dsts, device_srcs));
  std::vector<std::byte> back(2 * kBytes);
  ASSERT_OK(b->CopyToHost(0, back, {pool->id, 0, back.size()}));
  Sync(*b, 0);
  for (int half = 0; half < 2; ++half) {
    const std::byte* got = back.data() + half * kBytes;
    const auto first =
        std::mismatch(want.begin(), want.end(), got).first - want.begin();
    EXPECT_EQ(first, static_cast<ptrdiff_t>(kBytes))
        << (half == 0 ? "host -> device" : "device -> device")
        << ": first wrong byte at " << first;
  }
  ASSERT_OK(b->UnregisterHost(arena.data()));
  ASSERT_OK(b->FreePool(pool->id));
}

// Gathers 2048 random rows of `row_bytes` from a host arena, pinned or
// not, packed or (into_slots) into the reverse order of a 2048-slot buffer
// as the working set's misses go into their slots, and checks every byte.
void GatherAndCheck(DeviceBackend& b, uint32_t row_bytes, bool pinned,
                    uint32_t seed, bool into_slots = false) {
  constexpr uint32_t kRows = 2048, kArenaRows = 16384;
  auto arena = Pattern(size_t{row_bytes} * kArenaRows, seed);
  if (pinned) ASSERT_OK(b.RegisterHost(arena));
  std::vector<uint32_t> pick(kArenaRows);
  std::iota(pick.begin(), pick.end(), 0u);
  std::shuffle(pick.begin(), pick.end(), std::mt19937(seed));
  pick.resize(kRows);
  std::vector<const std::byte*> rows;
  for (uint32_t p : pick) rows.push_back(arena.data() + size_t{p} * row_bytes);
  auto pool = b.AllocatePool(size_t{row_bytes} * kRows);
  ASSERT_OK(pool);
  const DeviceRegion all{pool->id, 0, size_t{row_bytes} * kRows};
  std::vector<uint32_t> slots;
  for (uint32_t i = 0; into_slots && i < kRows; ++i) {
    slots.push_back(kRows - 1 - i);
  }
  ASSERT_OK(b.GatherRows(1, all, rows, row_bytes, slots));
  rows.clear();  // the backend keeps its own copy of the row lists
  slots.clear();
  std::vector<std::byte> back(all.bytes);
  ASSERT_OK(b.CopyToHost(1, back, all));
  Sync(b, 1);
  for (uint32_t i = 0; i < kRows; ++i) {
    const uint32_t at = into_slots ? kRows - 1 - i : i;
    ASSERT_EQ(
        std::memcmp(back.data() + size_t{at} * row_bytes,
                    arena.data() + size_t{pick[i]} * row_bytes, row_bytes),
        0)
        << "row " << i << " of " << row_bytes << " bytes, pinned " << pinned;
  }
  ASSERT_OK(b.FreePool(pool->id));
  if (pinned) ASSERT_OK(b.UnregisterHost(arena.data()));
}

TEST(CudaBackendTest, GatherRowsPacksScatteredRowsInSelectionOrder) {
  CUDA_OR_SKIP(b);
  // 656: GLM-5 fp8 latent rows; 1152: bf16 rows; 132: the index-key row
  // (4-byte chunks plus a tail); 100 and 7: 4-byte and byte chunks.
  for (uint32_t row_bytes : {656u, 1152u, 132u, 100u, 7u}) {
    GatherAndCheck(*b, row_bytes, /*pinned=*/true, row_bytes);
    GatherAndCheck(*b, row_bytes, /*pinned=*/false, row_bytes + 1);
    GatherAndCheck(*b, row_bytes, /*pinned=*/true, row_bytes + 2,
                   /*into_slots=*/true);
    GatherAndCheck(*b, row_bytes, /*pinned=*/false, row_bytes + 3,
                   /*into_slots=*/true);
  }
}

// The words tierkvd and an engine's stream synchronise through (a
// LoadTicket's device_layers and gate): a cudaStream_t waits for one word
// of registered host memory (cuStreamWaitValue32, cyclic GEQ) and then
// writes another (cuStreamWriteValue32), with no host thread waiting.
TEST(CudaBackendTest, AStreamWaitsForAndWritesWordsOfHostMemory) {
  CUDA_OR_SKIP(b);
  cudaStream_t engine = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&engine, cudaStreamNonBlocking),
            cudaSuccess);
  alignas(4096) static std::atomic<uint32_t> words[1024];
  for (auto& w : words) w.store(0);
  ASSERT_OK(b->RegisterHost({reinterpret_cast<std::byte*>(words), 4096}));
  const ForeignStream fs{.cuda = engine};
  words[2].store(0xfffffffe);
  ASSERT_OK(b->WaitValueOn(fs, &words[0], 3));
  ASSERT_OK(b->WaitValueOn(fs, &words[2], 1));  // past the wrap
  ASSERT_OK(b->WriteValueOn(fs, &words[1], 9));
  cudaEvent_t done = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&done, cudaEventDisableTiming),
            cudaSuccess);
  ASSERT_EQ(cudaEventRecord(done, engine), cudaSuccess);
  words[0].store(2);  // not yet
  EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady);
  words[0].store(3);
  EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady);  // words[2] holds it
  EXPECT_EQ(words[1].load(), 0u);
  words[2].store(1);
  ASSERT_EQ(cudaEventSynchronize(done), cudaSuccess);
  EXPECT_EQ(words[1].load(), 9u);
  EXPECT_EQ(cudaEventDestroy(done), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(engine), cudaSuccess);
  ASSERT_OK(b->UnregisterHost(reinterpret_cast<std::byte*>(words)));
}

TEST(CudaBackendTest, AnAllocationTooLargeIsExhaustedAndNotSticky) {
  CUDA_OR_SKIP(b);
  EXPECT_EQ(b->AllocatePool(uint64_t{1} << 52).status().code(),
            StatusCode::kResourceExhausted);
  auto pool = b->AllocatePool(1 << 20);
  ASSERT_OK(pool);
  const auto data = Pattern(1 << 20, 7);
  ASSERT_OK(b->CopyToDevice(0, {pool->id, 0, data.size()}, data));
  Sync(*b, 0);
}

// Runs this binary again as the importer: `mode` "check" (verify the
// pattern, write 0x5a at byte 0, close) or "die" (import, then exit
// without closing). Returns its exit status.
int RunImporter(const IpcHandle& h, std::string_view mode) {
  std::string hex;
  for (std::byte b : h.bytes) hex += fmt::format("{:02x}", int(b));
  return testing::RunThisBinaryAs(
      "CudaImporterChild.Imports",
      fmt::format("{}={}:{}:{}", kImportEnv, mode, h.pool_bytes, hex));
}

// Only in the re-executed child (RunImporter); skipped otherwise.
TEST(CudaImporterChild, Imports) {
  const char* arg = std::getenv(kImportEnv);
  if (arg == nullptr) GTEST_SKIP() << "runs only as an importer child";
  const std::string_view a(arg);
  const size_t c1 = a.find(':'), c2 = a.find(':', c1 + 1);
  const std::string mode(a.substr(0, c1));
  IpcHandle h;
  h.pool_bytes = std::stoull(std::string(a.substr(c1 + 1, c2 - c1 - 1)));
  const std::string hex(a.substr(c2 + 1));
  ASSERT_EQ(hex.size(), 128u);
  for (size_t i = 0; i < 64; ++i) {
    h.bytes[i] = std::byte(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  auto b = DeviceBackend::Open({.kind = DeviceBackendKind::kCuda});
  ASSERT_OK(b);
  auto imported = (*b)->ImportPool(h);
  ASSERT_OK(imported);
  if (mode == "die") ::_exit(0);  // holding the handle
  const auto want = Pattern(h.pool_bytes, 9);
  std::vector<std::byte> got(h.pool_bytes);
  ASSERT_EQ(cudaMemcpy(got.data(), imported->base, got.size(),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(got, want);
  // Through the backend too: the imported pool is one of its pools here.
  const std::byte mark[] = {std::byte{0x5a}};
  ASSERT_OK((*b)->CopyToDevice(0, {imported->pool, 0, 1}, mark));
  Sync(**b, 0);
  EXPECT_EQ((*b)->FreePool(imported->pool).code(),
            StatusCode::kInvalidArgument);
  ASSERT_OK((*b)->CloseImported(*imported));
}

TEST(CudaBackendTest, AnotherProcessImportsThePoolAndSeesItsBytes) {
  if (std::getenv(kImportEnv) != nullptr) GTEST_SKIP();
  CUDA_OR_SKIP(b);
  auto pool = b->AllocatePool(1 << 16);
  ASSERT_OK(pool);
  const auto data = Pattern(1 << 16, 9);
  ASSERT_OK(b->CopyToDevice(0, {pool->id, 0, data.size()}, data));
  Sync(*b, 0);
  auto handle = b->ExportPool(pool->id);
  ASSERT_OK(handle);
  EXPECT_EQ(handle->pool_bytes, data.size());
  ASSERT_EQ(RunImporter(*handle, "check"), 0);
  std::vector<std::byte> back(1);
  ASSERT_OK(b->CopyToHost(0, back, {pool->id, 0, 1}));
  Sync(*b, 0);
  EXPECT_EQ(back[0], std::byte{0x5a});
  // This process may import its own pool too: the same memory.
  auto here = b->ImportPool(*handle);
  ASSERT_OK(here);
  EXPECT_EQ(here->bytes, data.size());
  ASSERT_OK(b->CloseImported(*here));
  // An importer that dies holding the handle disturbs nothing.
  ASSERT_EQ(RunImporter(*handle, "die"), 0);
  ASSERT_OK(b->CopyToDevice(0, {pool->id, 0, data.size()}, data));
  Sync(*b, 0);
  ASSERT_OK(b->FreePool(pool->id));
  auto again = b->AllocatePool(1 << 16);
  EXPECT_OK(again);
}

}  // namespace
}  // namespace tierkv::storage
