// DeviceBackend on the emulated backend: ordered asynchronous copies and
// events, row gather, argument checks, allocation failure, injected copy
// errors, and a pool exported to another process.
#include "storage/device/device_backend.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace tierkv::storage {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kTimeout{10000};

std::vector<std::byte> Pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

std::unique_ptr<DeviceBackend> Emulated(DeviceBackendOptions o = {}) {
  o.kind = DeviceBackendKind::kEmulated;
  auto b = DeviceBackend::Open(o);
  EXPECT_OK(b);
  return b.ok() ? std::move(b).value() : nullptr;
}

TEST(DeviceBackendTest, AutoWithoutCudaFallsBackToEmulatedAndSaysSo) {
  std::string why;
  auto b = DeviceBackend::Open({.kind = DeviceBackendKind::kAuto}, &why);
  ASSERT_OK(b);
  if ((*b)->name() == "cuda") GTEST_SKIP() << "this machine has a device";
  EXPECT_EQ((*b)->name(), "emulated");
  EXPECT_NE(why.find("emulated"), std::string::npos) << why;
  EXPECT_EQ(
      DeviceBackend::Open({.kind = DeviceBackendKind::kCuda}).status().code(),
      StatusCode::kUnavailable);
  EXPECT_EQ(ParseDeviceBackendKind("gpu").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseDeviceBackendKind("auto"), DeviceBackendKind::kAuto);
}

TEST(DeviceBackendTest, CopiesOnAStreamRunInOrderAndAnEventCoversThem) {
  auto b = Emulated();
  auto pool = b->AllocatePool(1 << 20);
  ASSERT_OK(pool);
  const auto first = Pattern(4096, 1), second = Pattern(4096, 2);
  std::vector<std::byte> back(4096);
  const DeviceRegion r{pool->id, 8192, 4096};
  // Overwrite, then read back: the read must see the second write.
  ASSERT_OK(b->CopyToDevice(0, r, first));
  ASSERT_OK(b->CopyToDevice(0, r, second));
  ASSERT_OK(b->CopyToHost(0, back, r));
  auto done = b->RecordEvent(0);
  ASSERT_OK(done);
  ASSERT_OK(b->WaitEvent(*done, kTimeout));
  EXPECT_TRUE(b->EventDone(*done));
  EXPECT_EQ(back, second);
  // An event on an idle stream is done at once.
  auto idle = b->RecordEvent(1);
  ASSERT_OK(idle);
  EXPECT_TRUE(b->EventDone(*idle));
}

TEST(DeviceBackendTest, TheDefaultDeviceCanBeTheCallersCurrentOne) {
  SetEmulatedCurrentDevice(3);
  auto current = Emulated({.device = DeviceBackendOptions::kCurrentDevice});
  EXPECT_EQ(current->device(), 3);
  EXPECT_EQ(Emulated({.device = 1})->device(), 1);
  SetEmulatedCurrentDevice(0);
  EXPECT_EQ(OpenEmulatedBackend({.device = -2}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(DeviceBackendTest, EveryCallRunsOnItsDeviceAndGivesTheCallersBack) {
  // An engine thread whose current device is 3 uses a backend of device 1:
  // every method must run with device 1 current (the emulated backend fails
  // a call that does not) and leave 3 current, as on CUDA.
  auto b = Emulated({.device = 1});
  SetEmulatedCurrentDevice(3);
  auto pool = b->AllocatePool(1 << 16);
  ASSERT_OK(pool);
  EXPECT_EQ(EmulatedCurrentDevice(), 3);
  const auto data = Pattern(4096, 9);
  std::vector<std::byte> back(4096), host(8192);
  const DeviceRegion r{pool->id, 0, 4096}, r2{pool->id, 4096, 4096};
  const std::byte* rows[] = {data.data(), data.data() + 2048};
  ASSERT_OK(b->RegisterHost(host));
  ASSERT_OK(b->CopyToDevice(0, r, data));
  ASSERT_OK(b->CopyOnDevice(0, r2, r));
  ASSERT_OK(b->GatherRows(0, r2, rows, 2048));
  ASSERT_OK(b->CopyToHost(0, back, r2));
  auto done = b->RecordEvent(0);
  ASSERT_OK(done);
  ASSERT_OK(b->WaitEvent(*done, kTimeout));
  EXPECT_TRUE(b->EventDone(*done));
  ASSERT_OK(b->PoolBase(pool->id));
  auto handle = b->ExportPool(pool->id);
  ASSERT_OK(handle);
  auto imported = b->ImportPool(*handle);
  ASSERT_OK(imported);
  ASSERT_OK(b->CloseImported(*imported));
  ASSERT_OK(b->UnregisterHost(host.data()));
  ASSERT_OK(b->FreePool(pool->id));
  EXPECT_EQ(back, data);
  EXPECT_EQ(EmulatedCurrentDevice(), 3);
  // The same thread on the backend's own device: nothing to give back.
  SetEmulatedCurrentDevice(1);
  ASSERT_OK(b->AllocatePool(4096));
  EXPECT_EQ(EmulatedCurrentDevice(), 1);
  SetEmulatedCurrentDevice(0);
}

TEST(DeviceBackendTest, GatherRowsPacksScatteredHostRowsInSelectionOrder) {
  // 2048 rows of 656 bytes (DeepSeek-V3.2 FP8 latent rows) picked in a
  // random order from a 16K-row host "arena".
  constexpr uint32_t kRow = 656, kRows = 2048, kArenaRows = 16384;
  const auto arena = Pattern(size_t{kRow} * kArenaRows, 3);
  std::vector<uint32_t> pick(kArenaRows);
  std::iota(pick.begin(), pick.end(), 0u);
  std::shuffle(pick.begin(), pick.end(), std::mt19937(4));
  pick.resize(kRows);
  std::vector<const std::byte*> rows;
  for (uint32_t p : pick) rows.push_back(arena.data() + size_t{p} * kRow);
  auto b = Emulated();
  auto pool = b->AllocatePool(size_t{kRow} * kRows);
  ASSERT_OK(pool);
  const DeviceRegion all{pool->id, 0, size_t{kRow} * kRows};
  ASSERT_OK(b->GatherRows(1, all, rows, kRow));
  rows.clear();  // the backend keeps its own copy of the row list
  std::vector<std::byte> back(all.bytes);
  ASSERT_OK(b->CopyToHost(1, back, all));
  auto done = b->RecordEvent(1);
  ASSERT_OK(done);
  ASSERT_OK(b->WaitEvent(*done, kTimeout));
  for (uint32_t i = 0; i < kRows; ++i) {
    ASSERT_EQ(std::memcmp(back.data() + size_t{i} * kRow,
                          arena.data() + size_t{pick[i]} * kRow, kRow),
              0)
        << "row " << i;
  }
}

TEST(DeviceBackendTest, GatherRowsIntoSlotsWritesOnlyThoseSlots) {
  // The working set's miss path: 300 rows into random slots of a 4096-slot
  // buffer; every other slot keeps what it held.
  constexpr uint32_t kRow = 656, kSlots = 4096, kMisses = 300;
  const auto arena = Pattern(size_t{kRow} * kMisses, 5);
  std::vector<uint32_t> slots(kSlots);
  std::iota(slots.begin(), slots.end(), 0u);
  std::shuffle(slots.begin(), slots.end(), std::mt19937(6));
  slots.resize(kMisses);
  std::vector<const std::byte*> rows;
  for (uint32_t i = 0; i < kMisses; ++i) {
    rows.push_back(arena.data() + size_t{i} * kRow);
  }
  auto b = Emulated();
  auto pool = b->AllocatePool(size_t{kRow} * kSlots + 4096);
  ASSERT_OK(pool);
  const DeviceRegion buffer{pool->id, 4096, size_t{kRow} * kSlots};
  const std::vector<std::byte> before(buffer.bytes, std::byte{0x77});
  ASSERT_OK(b->CopyToDevice(0, buffer, before));
  ASSERT_OK(b->GatherRows(0, buffer, rows, kRow, slots));
  auto done = b->RecordEvent(0);
  ASSERT_OK(done);
  ASSERT_OK(b->WaitEvent(*done, kTimeout));
  // The emulated pool is host memory: read it in place.
  ASSERT_TRUE(b->host_addressable());
  auto base = b->PoolBase(pool->id);
  ASSERT_OK(base);
  const std::byte* got = *base + buffer.offset;
  std::vector<int> row_of_slot(kSlots, -1);
  for (uint32_t i = 0; i < kMisses; ++i) row_of_slot[slots[i]] = int(i);
  for (uint32_t s = 0; s < kSlots; ++s) {
    const std::byte* want = row_of_slot[s] < 0
                                ? before.data()
                                : arena.data() + size_t(row_of_slot[s]) * kRow;
    ASSERT_EQ(std::memcmp(got + size_t{s} * kRow, want, kRow), 0)
        << "slot " << s;
  }
  // Slots outside the buffer, named twice, or a buffer of partial rows.
  const auto invalid = StatusCode::kInvalidArgument;
  const uint32_t outside[] = {kSlots};
  const uint32_t twice[] = {3, 3};
  EXPECT_EQ(
      b->GatherRows(0, buffer, std::span(rows).first(1), kRow, outside).code(),
      invalid);
  EXPECT_EQ(
      b->GatherRows(0, buffer, std::span(rows).first(2), kRow, twice).code(),
      invalid);
  EXPECT_EQ(b->GatherRows(0, {pool->id, 0, kRow * 3 + 1},
                          std::span(rows).first(1), kRow, twice)
                .code(),
            invalid);
  EXPECT_EQ(b->PoolBase(pool->id + 9).status().code(), StatusCode::kNotFound);
}

TEST(DeviceBackendTest, EveryArgumentIsCheckedBeforeAnythingRuns) {
  auto b = Emulated({.streams = 2});
  auto pool = b->AllocatePool(4096);
  ASSERT_OK(pool);
  std::vector<std::byte> host(4096);
  const auto invalid = StatusCode::kInvalidArgument;
  EXPECT_EQ(b->AllocatePool(0).status().code(), invalid);
  EXPECT_EQ(b->CopyToDevice(2, {pool->id, 0, 4096}, host).code(), invalid);
  EXPECT_EQ(b->CopyToDevice(0, {pool->id, 1, 4096}, host).code(), invalid);
  EXPECT_EQ(b->CopyToDevice(0, {pool->id, ~uint64_t{0}, 2}, host).code(),
            invalid);
  EXPECT_EQ(b->CopyToDevice(0, {pool->id + 7, 0, 4096}, host).code(), invalid);
  EXPECT_EQ(
      b->CopyToHost(0, std::span(host).first(100), {pool->id, 0, 4096}).code(),
      invalid);
  const std::byte* null_row[] = {host.data(), nullptr};
  EXPECT_EQ(b->GatherRows(0, {pool->id, 0, 64}, null_row, 32).code(), invalid);
  EXPECT_EQ(b->GatherRows(0, {pool->id, 0, 65}, null_row, 32).code(), invalid);
  EXPECT_EQ(b->RecordEvent(9).status().code(), invalid);
  EXPECT_EQ(b->FreePool(pool->id + 7).code(), invalid);
  EXPECT_EQ(b->ExportPool(pool->id + 7).status().code(), invalid);
  IpcHandle junk;
  EXPECT_EQ(b->ImportPool(junk).status().code(), invalid);
  EXPECT_EQ(DeviceBackend::Open({.streams = 0}).status().code(), invalid);
}

TEST(DeviceBackendTest, RegisteredHostRangesRefuseOverlapsAndUnknownOnes) {
  auto b = Emulated();
  std::vector<std::byte> arena(1 << 16);
  const std::span<std::byte> all(arena);
  ASSERT_OK(b->RegisterHost(all.subspan(4096, 8192)));
  EXPECT_EQ(b->RegisterHost(all.subspan(0, 4097)).code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(b->RegisterHost(all.subspan(12287, 10)).code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(b->RegisterHost(all.subspan(6000, 10)).code(),
            StatusCode::kAlreadyExists);
  ASSERT_OK(b->RegisterHost(all.subspan(0, 4096)));  // adjacent: fine
  ASSERT_OK(b->RegisterHost(all.subspan(12288, 4096)));
  EXPECT_EQ(b->RegisterHost({}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b->UnregisterHost(arena.data() + 1).code(), StatusCode::kNotFound);
  ASSERT_OK(b->UnregisterHost(arena.data() + 4096));
  ASSERT_OK(b->RegisterHost(all.subspan(6000, 10)));  // free again
}

TEST(DeviceBackendTest, AllocationPastCapacityFailsAndFreeingGivesItBack) {
  auto b = Emulated({.emulated_capacity_bytes = 1 << 20});
  auto a = b->AllocatePool(768 << 10);
  ASSERT_OK(a);
  EXPECT_EQ(b->AllocatePool(512 << 10).status().code(),
            StatusCode::kResourceExhausted);
  ASSERT_OK(b->FreePool(a->id));
  EXPECT_OK(b->AllocatePool(1 << 20));
}

// CUDA's model: a fault of device work poisons the whole context. The
// emulated backend's injected fault fails it the same way: the faulting
// work's wait, later work on every stream, and every later call answer
// Unavailable naming the fault, and events count as done.
TEST(DeviceBackendTest, AFaultFailsTheWholeBackendAsOnCuda) {
  auto b = Emulated({.streams = 2, .emulated_fault_after_copies = 1});
  auto pool = b->AllocatePool(4096);
  ASSERT_OK(pool);
  const auto data = Pattern(4096, 5);
  ASSERT_OK(b->CopyToDevice(0, {pool->id, 0, 4096}, data));  // copy 1: fine
  auto ok = b->RecordEvent(0);
  ASSERT_OK(ok);
  EXPECT_OK(b->WaitEvent(*ok, kTimeout));
  EXPECT_FALSE(b->failed());
  ASSERT_OK(b->CopyToDevice(0, {pool->id, 0, 4096}, data));  // copy 2: faults
  // The fault shows at the first call after it happened, which may be this
  // RecordEvent already (the copy runs at once) or the wait for it, as on
  // CUDA.
  auto faulted = b->RecordEvent(0);
  Status s = faulted.ok() ? b->WaitEvent(*faulted, kTimeout) : faulted.status();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("injected"), std::string::npos) << s.ToString();
  EXPECT_TRUE(b->failed());
  EXPECT_EQ(b->health().code(), StatusCode::kUnavailable);
  // Sticky: another stream, new events, new pools all refuse.
  EXPECT_EQ(b->CopyToDevice(1, {pool->id, 0, 4096}, data).code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(b->RecordEvent(1).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(b->AllocatePool(4096).status().code(), StatusCode::kUnavailable);
  if (faulted.ok()) {
    EXPECT_TRUE(b->EventDone(*faulted));  // nothing runs any more
  }
}

// A stalled copy outlives a wait's timeout; the event is not done until
// the copy is (what DeviceQuarantine relies on).
TEST(DeviceBackendTest, AWaitThatTimesOutLeavesTheEventNotDone) {
  std::mutex mu;
  std::condition_variable cv;
  bool released = false;
  auto b = Emulated({.emulated_before_op = [&] {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return released; });
  }});
  auto pool = b->AllocatePool(4096);
  ASSERT_OK(pool);
  const auto data = Pattern(4096, 6);
  ASSERT_OK(b->CopyToDevice(0, {pool->id, 0, 4096}, data));
  auto event = b->RecordEvent(0);
  ASSERT_OK(event);
  EXPECT_EQ(b->WaitEvent(*event, std::chrono::milliseconds(20)).code(),
            StatusCode::kIOError);
  EXPECT_FALSE(b->EventDone(*event));
  {
    std::lock_guard lock(mu);
    released = true;
  }
  cv.notify_all();
  EXPECT_OK(b->WaitEvent(*event, kTimeout));
  EXPECT_TRUE(b->EventDone(*event));
  EXPECT_FALSE(b->failed());
}

// Ordering with an engine's stream, on the device: our stream waits for
// the work queued on theirs (StreamWaitForeign), and a gather queued on
// theirs runs in their order (GatherRowsOn).
TEST(DeviceBackendTest, WorkIsOrderedWithAnotherOwnersStream) {
  auto ours = Emulated();
  auto theirs = Emulated({.streams = 1});
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  std::vector<std::string> order;
  ASSERT_OK(theirs->LaunchHostFunction(0, [&] {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return go; });
    order.push_back("engine kernel");
  }));
  const ForeignStream engine{.emulated = theirs.get(), .emulated_stream = 0};
  auto pool = ours->AllocatePool(4096);
  ASSERT_OK(pool);
  const auto data = Pattern(1024, 3);
  const std::byte* rows[] = {data.data(), data.data() + 512};
  ASSERT_OK(ours->GatherRowsOn(engine, {pool->id, 0, 1024}, rows, 512));
  ASSERT_OK(ours->StreamWaitForeign(0, engine));
  ASSERT_OK(ours->LaunchHostFunction(0, [&] {
    std::lock_guard lock(mu);
    order.push_back("after the engine's stream");
  }));
  auto after = ours->RecordEvent(0);
  ASSERT_OK(after);
  EXPECT_FALSE(ours->EventDone(*after));  // held behind the engine's kernel
  {
    std::lock_guard lock(mu);
    go = true;
  }
  cv.notify_all();
  ASSERT_OK(ours->WaitEvent(*after, kTimeout));
  EXPECT_EQ(order, (std::vector<std::string>{"engine kernel",
                                             "after the engine's stream"}));
  auto base = ours->PoolBase(pool->id);
  ASSERT_OK(base);
  EXPECT_EQ(std::memcmp(*base, data.data(), 1024), 0);
  // A CUDA stream means nothing to the emulated backend.
  EXPECT_EQ(ours->StreamWaitForeign(0, {.cuda = &go}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ours->GatherRowsOn({.cuda = &go}, {pool->id, 0, 1024}, rows, 512).code(),
      StatusCode::kInvalidArgument);
}

TEST(DeviceBackendTest, ABatchOfCopiesLandsInItsRegionsAndIsCheckedWhole) {
  auto b = Emulated();
  auto pool = b->AllocatePool(1 << 16);
  ASSERT_OK(pool);
  const auto data = Pattern(3 * 4096, 11);
  const std::span<const std::byte> all(data);
  // Page 2 lands at offset 0, page 0 at 8192, page 1 at 4096.
  const std::vector<DeviceRegion> dsts = {
      {pool->id, 0, 4096}, {pool->id, 8192, 4096}, {pool->id, 4096, 4096}};
  const std::vector<std::span<const std::byte>> srcs = {
      all.subspan(8192, 4096), all.first(4096), all.subspan(4096, 4096)};
  ASSERT_OK(b->CopyToDeviceBatch(0, dsts, srcs));
  std::vector<std::byte> back(3 * 4096);
  ASSERT_OK(b->CopyToHost(0, back, {pool->id, 0, back.size()}));
  auto done = b->RecordEvent(0);
  ASSERT_OK(done);
  ASSERT_OK(b->WaitEvent(*done, kTimeout));
  EXPECT_EQ(std::memcmp(back.data(), data.data() + 8192, 4096), 0);
  EXPECT_EQ(std::memcmp(back.data() + 4096, data.data() + 4096, 4096), 0);
  EXPECT_EQ(std::memcmp(back.data() + 8192, data.data(), 4096), 0);
  // One bad item refuses the whole batch before anything is queued.
  const std::vector<DeviceRegion> bad = {{pool->id, 0, 4096},
                                         {pool->id, 1 << 16, 4096}};
  EXPECT_EQ(b->CopyToDeviceBatch(0, bad, std::span(srcs).first(2)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(b->CopyToDeviceBatch(0, dsts, std::span(srcs).first(2)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_OK(b->CopyToDeviceBatch(0, {}, {}));
}

TEST(DeviceBackendTest, ABatchOfDeviceCopiesLandsAndIsCheckedWhole) {
  auto b = Emulated();
  auto pool = b->AllocatePool(1 << 16);
  ASSERT_OK(pool);
  const auto data = Pattern(1 << 16, 12);
  ASSERT_OK(b->CopyToDevice(0, {pool->id, 0, data.size()}, data));
  // Three regions of the first 32 KiB, of odd sizes and offsets, into the
  // second half in another order.
  const std::vector<DeviceRegion> srcs = {
      {pool->id, 1, 4095}, {pool->id, 5000, 7}, {pool->id, 9000, 20001}};
  const std::vector<DeviceRegion> dsts = {
      {pool->id, 40003, 4095}, {pool->id, 32768, 7}, {pool->id, 44100, 20001}};
  ASSERT_OK(b->CopyOnDeviceBatch(0, dsts, srcs));
  std::vector<std::byte> back(data.size());
  ASSERT_OK(b->CopyToHost(0, back, {pool->id, 0, back.size()}));
  auto done = b->RecordEvent(0);
  ASSERT_OK(done);
  ASSERT_OK(b->WaitEvent(*done, kTimeout));
  std::vector<std::byte> want = data;
  for (size_t i = 0; i < srcs.size(); ++i) {
    std::memcpy(want.data() + dsts[i].offset, data.data() + srcs[i].offset,
                srcs[i].bytes);
  }
  EXPECT_TRUE(back == want);
  // Sizes that differ, a region past the pool, or counts that differ
  // refuse the whole batch before anything is queued.
  const std::vector<DeviceRegion> uneven = {{pool->id, 0, 8}};
  const std::vector<DeviceRegion> past = {{pool->id, (1 << 16) - 4, 8}};
  const std::vector<DeviceRegion> eight = {{pool->id, 100, 8}};
  EXPECT_EQ(b->CopyOnDeviceBatch(0, uneven, std::span(srcs).first(1)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(b->CopyOnDeviceBatch(0, past, eight).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(b->CopyOnDeviceBatch(0, dsts, std::span(srcs).first(2)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_OK(b->CopyOnDeviceBatch(0, {}, {}));
}

TEST(DeviceBackendTest, PackRowsPacksDeviceRowsInSelectionOrder) {
  auto b = Emulated();
  constexpr uint32_t kRow = 132, kRows = 64;  // the index-key row
  auto slots = b->AllocatePool(kRow * kRows);
  auto packed = b->AllocatePool(kRow * 4);
  ASSERT_OK(slots);
  ASSERT_OK(packed);
  const auto data = Pattern(kRow * kRows, 12);
  ASSERT_OK(b->CopyToDevice(0, {slots->id, 0, data.size()}, data));
  const std::vector<uint32_t> pick = {63, 0, 17, 17};  // a row may repeat
  ASSERT_OK(b->PackRows(0, {packed->id, 0, kRow * 4},
                        {slots->id, 0, kRow * kRows}, kRow, pick));
  std::vector<std::byte> back(kRow * 4);
  ASSERT_OK(b->CopyToHost(0, back, {packed->id, 0, back.size()}));
  auto done = b->RecordEvent(0);
  ASSERT_OK(done);
  ASSERT_OK(b->WaitEvent(*done, kTimeout));
  for (size_t i = 0; i < pick.size(); ++i) {
    EXPECT_EQ(
        std::memcmp(back.data() + i * kRow, data.data() + pick[i] * kRow, kRow),
        0)
        << "row " << i;
  }
  const std::vector<uint32_t> outside = {64};
  EXPECT_EQ(b->PackRows(0, {packed->id, 0, kRow}, {slots->id, 0, kRow * kRows},
                        kRow, outside)
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(b->PackRows(0, {packed->id, 0, kRow * 3},
                        {slots->id, 0, kRow * kRows}, kRow, pick)
                .code(),
            StatusCode::kInvalidArgument);  // 4 rows into room for 3
  EXPECT_EQ(b->PackRows(0, {slots->id, 0, kRow}, {slots->id, 0, kRow * kRows},
                        kRow, std::span(pick).first(1))
                .code(),
            StatusCode::kInvalidArgument);  // overlapping
}

// The words a LoadTicket holds for an engine's stream and tierkvd:
// registered host memory, one process here (the words are plain shared
// memory either way).
TEST(DeviceBackendTest, StreamsWaitForAndWriteWordsOfHostMemory) {
  auto ours = Emulated();
  auto theirs = Emulated({.streams = 1});
  const ForeignStream engine{.emulated = theirs.get(), .emulated_stream = 0};
  std::vector<std::atomic<uint32_t>> words(1024);  // 4 KiB
  ASSERT_OK(
      ours->RegisterHost({reinterpret_cast<std::byte*>(words.data()), 4096}));

  // Work queued after a wait runs once the word reaches the value.
  std::atomic<int> ran{0};
  ASSERT_OK(ours->WaitValueOn(engine, &words[0], 3));
  ASSERT_OK(theirs->LaunchHostFunction(0, [&] { ran.store(1); }));
  auto after = theirs->RecordEvent(0);
  ASSERT_OK(after);
  words[0].store(2);  // not yet
  EXPECT_EQ(ran.load(), 0);
  words[0].store(3);
  ASSERT_OK(theirs->WaitEvent(*after, kTimeout));
  EXPECT_EQ(ran.load(), 1);

  // Cyclic, as CUDA compares: 1 is past 0xfffffffe, 5 is past 0xfffffff0.
  words[1].store(0xfffffffe);
  ASSERT_OK(ours->WaitValueOn(engine, &words[1], 1));
  ASSERT_OK(ours->WaitValueOn(engine, &words[0], 0xfffffff0u + 3));
  auto wrapped = theirs->RecordEvent(0);
  ASSERT_OK(wrapped);
  words[1].store(1);
  ASSERT_OK(theirs->WaitEvent(*wrapped, kTimeout));

  // A write lands after the work queued before it, not before.
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  ASSERT_OK(theirs->LaunchHostFunction(0, [&] {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return go; });
  }));
  ASSERT_OK(ours->WriteValueOn(engine, &words[2], 7));
  auto written = theirs->RecordEvent(0);
  ASSERT_OK(written);
  EXPECT_EQ(words[2].load(), 0u);  // held behind the engine's work
  {
    std::lock_guard lock(mu);
    go = true;
  }
  cv.notify_all();
  ASSERT_OK(theirs->WaitEvent(*written, kTimeout));
  EXPECT_EQ(words[2].load(), 7u);

  // The words must be registered and aligned; a CUDA stream is refused.
  std::atomic<uint32_t> elsewhere{0};
  EXPECT_EQ(ours->WaitValueOn(engine, &elsewhere, 1).code(),
            StatusCode::kInvalidArgument);
  auto* misaligned = reinterpret_cast<std::atomic<uint32_t>*>(
      reinterpret_cast<std::byte*>(words.data()) + 2);
  EXPECT_EQ(ours->WriteValueOn(engine, misaligned, 1).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ours->WaitValueOn({.cuda = &go}, &words[0], 1).code(),
            StatusCode::kInvalidArgument);
  ASSERT_OK(ours->UnregisterHost(reinterpret_cast<std::byte*>(words.data())));
}

TEST(DeviceBackendTest, AnotherProcessImportsThePoolAndSeesItsBytes) {
  auto b = Emulated();
  auto pool = b->AllocatePool(1 << 16);
  ASSERT_OK(pool);
  const auto data = Pattern(1 << 16, 6);
  ASSERT_OK(b->CopyToDevice(0, {pool->id, 0, data.size()}, data));
  auto done = b->RecordEvent(0);
  ASSERT_OK(done);
  ASSERT_OK(b->WaitEvent(*done, kTimeout));
  auto handle = b->ExportPool(pool->id);
  ASSERT_OK(handle);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The importer: its own backend, the handle's bytes only.
    auto importer = OpenEmulatedBackend({.streams = 1});
    if (!importer.ok()) ::_exit(2);
    auto imported = (*importer)->ImportPool(*handle);
    if (!imported.ok() || imported->bytes != data.size()) ::_exit(3);
    auto* bytes = static_cast<std::byte*>(imported->base);
    if (std::memcmp(bytes, data.data(), data.size()) != 0) ::_exit(4);
    bytes[0] = std::byte{0x5a};  // visible to the exporter: shared memory
    // The importer addresses the pool as one of its own (tierkvd copies
    // into engines' pools that way: tests/client/device_pool_test.cc; no
    // stream runs here, as a forked child of a threaded test must not
    // start threads under TSan), and cannot free it.
    if ((*importer)->FreePool(imported->pool).code() !=
        StatusCode::kInvalidArgument) {
      ::_exit(7);
    }
    if (!(*importer)->CloseImported(*imported).ok()) ::_exit(8);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::vector<std::byte> back(1);
  ASSERT_OK(b->CopyToHost(0, back, {pool->id, 0, 1}));
  auto read = b->RecordEvent(0);
  ASSERT_OK(read);
  ASSERT_OK(b->WaitEvent(*read, kTimeout));
  EXPECT_EQ(back[0], std::byte{0x5a});
  // An importer killed while it holds the pool disturbs nothing.
  const pid_t holder = ::fork();
  ASSERT_GE(holder, 0);
  if (holder == 0) {
    auto importer = OpenEmulatedBackend({.streams = 1});
    if (!importer.ok() || !(*importer)->ImportPool(*handle).ok()) ::_exit(2);
    ::raise(SIGKILL);
  }
  ASSERT_EQ(::waitpid(holder, &status, 0), holder);
  ASSERT_TRUE(WIFSIGNALED(status));
  ASSERT_OK(b->CopyToDevice(0, {pool->id, 0, data.size()}, data));
  ASSERT_OK(b->CopyToHost(0, back, {pool->id, 0, 1}));
  auto after = b->RecordEvent(0);
  ASSERT_OK(after);
  ASSERT_OK(b->WaitEvent(*after, kTimeout));
  EXPECT_EQ(back[0], data[0]);
  // A handle whose size was altered is refused.
  IpcHandle altered = *handle;
  altered.pool_bytes++;
  EXPECT_EQ(b->ImportPool(altered).status().code(),
            StatusCode::kInvalidArgument);
  // A freed pool cannot be imported any more.
  ASSERT_OK(b->FreePool(pool->id));
  EXPECT_EQ(b->ImportPool(*handle).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace tierkv::storage
