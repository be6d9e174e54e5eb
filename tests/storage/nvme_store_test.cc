// NvmeStore: restart, corruption, device faults, LRU eviction, batched
// reads, concurrent readers vs evicting writers, and damaged catalogs.
#include "storage/nvme/nvme_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "storage/nvme/io_buffer.h"
#include "storage/nvme/uring_device.h"
#include "tests/testing/fault_injection_device.h"
#include "tests/testing/memory_device.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace tierkv::storage {
namespace {

using testing::FaultInjectionDevice;
using testing::MemoryDevice;

constexpr uint64_t kLayout = 0xABCDEF;
constexpr std::string_view kNs = "glm-5@bf16";
constexpr size_t kOddSize = 72 * 1024 + 3;  // a typical segment, not aligned

SegmentKey Key(uint64_t n, uint16_t layer = 0, uint8_t part = 0) {
  return SegmentKey{PageHash{n * 0x9E3779B97F4A7C15ull, n}, layer, part};
}

// Deterministic content of segment n (so readers can verify any hit).
std::vector<std::byte> Content(uint64_t n, size_t size) {
  std::vector<std::byte> v(size);
  uint64_t x = n * 0x2545F4914F6CDD1Dull + 1;
  for (size_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = std::byte(x);
  }
  return v;
}

class NvmeStoreTest : public ::testing::Test {
 protected:
  NvmeStoreOptions FileOptions(uint64_t capacity = 16 << 20) {
    NvmeStoreOptions o;
    o.path = dir_.File("nvme.data");
    o.capacity_bytes = capacity;
    o.queue_depth = 16;
    return o;
  }
  NvmeStoreOptions DeviceOptions(std::shared_ptr<Device> device,
                                 uint64_t capacity) {
    NvmeStoreOptions o;
    o.device = std::move(device);
    o.catalog_path = dir_.File("catalog");
    o.capacity_bytes = capacity;
    return o;
  }
  std::unique_ptr<NvmeStore> OpenOrDie(const NvmeStoreOptions& o) {
    auto s = NvmeStore::Open(o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }
  static Status Put(NvmeStore& store, uint64_t n, size_t size = kOddSize) {
    std::vector<std::byte> data = Content(n, size);
    NvmeWriteItem item{Key(n), data};
    return store.Write(kNs, kLayout, {&item, 1})[0];
  }
  // OK when segment n reads back bit-exact.
  static Status Check(NvmeStore& store, uint64_t n, size_t size = kOddSize) {
    std::vector<std::byte> dst(size + 4096);
    auto got = store.Read(kNs, Key(n), kLayout, dst);
    if (!got.ok()) return got.status();
    if (*got != size) return Status::Internal("wrong length");
    std::vector<std::byte> want = Content(n, size);
    if (std::memcmp(dst.data(), want.data(), size) != 0) {
      return Status::Internal("wrong bytes");
    }
    return Status::OK();
  }
  testing::TempDir dir_;
};

TEST_F(NvmeStoreTest, RestartServesSegmentsBitExact) {
  constexpr int kSegments = 24;
  {
    auto store = OpenOrDie(FileOptions());
    ASSERT_NE(store, nullptr);
    std::vector<std::vector<std::byte>> data;
    std::vector<NvmeWriteItem> items;
    for (int i = 0; i < kSegments; ++i)
      data.push_back(Content(i, kOddSize + i));
    for (int i = 0; i < kSegments; ++i) items.push_back({Key(i), data[i]});
    for (const Status& s : store->Write(kNs, kLayout, items)) ASSERT_OK(s);
    EXPECT_EQ(store->Stats().segments, uint64_t(kSegments));
  }
  auto store = OpenOrDie(FileOptions());
  ASSERT_NE(store, nullptr);
  const NvmeRecoveryReport& r = store->recovery();
  EXPECT_EQ(r.recovered_segments, uint64_t(kSegments));
  uint64_t bytes = 0;
  for (int i = 0; i < kSegments; ++i) bytes += kOddSize + i;
  EXPECT_EQ(r.recovered_bytes, bytes);
  EXPECT_EQ(r.dropped_segments, 0u);
  for (int i = 0; i < kSegments; ++i) EXPECT_OK(Check(*store, i, kOddSize + i));
  // New writes after restart do not overwrite recovered extents.
  ASSERT_OK(Put(*store, 1000));
  for (int i = 0; i < kSegments; ++i) EXPECT_OK(Check(*store, i, kOddSize + i));
  EXPECT_OK(Check(*store, 1000));
}

TEST_F(NvmeStoreTest, UsesDirectIoOnTheDataFile) {
  auto store = OpenOrDie(FileOptions());
  ASSERT_NE(store, nullptr);
  NvmeStoreStats s = store->Stats();
  // The test temp dir is on a file system with O_DIRECT in CI and here;
  // if not, the uring device test reports why.
  EXPECT_TRUE(s.direct_io);
  ASSERT_OK(Put(*store, 1));
  EXPECT_OK(Check(*store, 1));
  EXPECT_GT(store->Stats().device.write_bytes, 0u);
}

TEST_F(NvmeStoreTest, FlippedBytesInDataFileAreAMissNotBadData) {
  auto store = OpenOrDie(FileOptions());
  ASSERT_NE(store, nullptr);
  ASSERT_OK(Put(*store, 1));
  ASSERT_OK(Put(*store, 2));
  auto entry = store->TEST_Entry(kNs, Key(1));
  ASSERT_TRUE(entry.has_value());
  {
    const int fd = ::open(dir_.File("nvme.data").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char byte = 0;
    const off_t at = off_t(entry->offset + 777);
    ASSERT_EQ(1, ::pread(fd, &byte, 1, at));
    byte ^= 0x01;
    ASSERT_EQ(1, ::pwrite(fd, &byte, 1, at));
    ::fsync(fd);
    ::close(fd);
  }
  std::vector<std::byte> dst(kOddSize);
  auto got = store->Read(kNs, Key(1), kLayout, dst);
  EXPECT_EQ(got.status().code(), StatusCode::kNotFound);
  NvmeStoreStats s = store->Stats();
  EXPECT_EQ(s.checksum_failures, 1u);
  EXPECT_FALSE(store->Contains(kNs, Key(1), kLayout));  // dropped
  EXPECT_OK(Check(*store, 2));                          // neighbours fine
  // And it stays gone after a restart; it can be stored again.
  store.reset();
  store = OpenOrDie(FileOptions());
  ASSERT_NE(store, nullptr);
  EXPECT_FALSE(store->Contains(kNs, Key(1), kLayout));
  ASSERT_OK(Put(*store, 1));
  EXPECT_OK(Check(*store, 1));
}

TEST_F(NvmeStoreTest, CorruptReadsFromDeviceAreCountedMisses) {
  auto memory = std::make_shared<MemoryDevice>(4 << 20);
  auto faulty = std::make_shared<FaultInjectionDevice>(memory);
  auto store = OpenOrDie(DeviceOptions(faulty, 4 << 20));
  ASSERT_NE(store, nullptr);
  ASSERT_OK(Put(*store, 7));
  faulty->CorruptReads(true);
  EXPECT_EQ(Check(*store, 7).code(), StatusCode::kNotFound);
  EXPECT_EQ(store->Stats().checksum_failures, 1u);
  // The diagnostic re-read is corrupted too: not counted as "device right".
  EXPECT_EQ(store->Stats().checksum_reread_ok, 0u);
}

// Flips a byte of the first `count` reads only: a read path that returned
// wrong bytes once while the device holds the right ones.
class CorruptFirstReadsDevice final : public Device {
 public:
  CorruptFirstReadsDevice(std::shared_ptr<Device> target, int count)
      : Device(target->size(), target->block_size(), target->max_io_bytes()),
        target_(std::move(target)),
        left_(count) {}

 protected:
  Result<size_t> ReadImpl(uint64_t offset, std::span<std::byte> dst) override {
    TIERKV_RETURN_IF_ERROR(target_->Read(offset, dst));
    if (left_.fetch_sub(1) > 0) dst[0] ^= std::byte{0x01};
    return dst.size();
  }
  Result<size_t> WriteImpl(uint64_t offset,
                           std::span<const std::byte> src) override {
    TIERKV_RETURN_IF_ERROR(target_->Write(offset, src));
    return src.size();
  }
  Status FlushImpl() override { return target_->Flush(); }

 private:
  const std::shared_ptr<Device> target_;
  std::atomic<int> left_;
};

TEST_F(NvmeStoreTest, ChecksumMismatchIsReReadToTellWrongReadFromLostData) {
  auto memory = std::make_shared<MemoryDevice>(4 << 20);
  auto store = OpenOrDie(DeviceOptions(memory, 4 << 20));
  ASSERT_NE(store, nullptr);
  ASSERT_OK(Put(*store, 7));
  ASSERT_OK(Put(*store, 8));
  store.reset();
  // Same bytes and catalog behind a device whose first read is wrong.
  auto flaky = std::make_shared<CorruptFirstReadsDevice>(memory, 1);
  store = OpenOrDie(DeviceOptions(flaky, 4 << 20));
  ASSERT_NE(store, nullptr);
  // Still a miss (the documented contract), but counted as a read problem.
  EXPECT_EQ(Check(*store, 7).code(), StatusCode::kNotFound);
  NvmeStoreStats s = store->Stats();
  EXPECT_EQ(s.checksum_failures, 1u);
  EXPECT_EQ(s.checksum_reread_ok, 1u);
  EXPECT_FALSE(store->Contains(kNs, Key(7), kLayout));
  EXPECT_OK(Check(*store, 8));
}

TEST_F(NvmeStoreTest, EnospcFailsTheWriteAndKeepsWhatWasStored) {
  auto memory = std::make_shared<MemoryDevice>(4 << 20);
  auto faulty = std::make_shared<FaultInjectionDevice>(memory);
  auto store = OpenOrDie(DeviceOptions(faulty, 4 << 20));
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 5; ++i) ASSERT_OK(Put(*store, i));
  faulty->FailWrites(ENOSPC);
  Status s = Put(*store, 99);
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_NE(s.message().find(std::strerror(ENOSPC)), std::string_view::npos)
      << s.ToString();
  EXPECT_FALSE(store->Contains(kNs, Key(99), kLayout));
  for (int i = 0; i < 5; ++i) EXPECT_OK(Check(*store, i));
  faulty->ClearFaults();
  ASSERT_OK(Put(*store, 99));
  EXPECT_OK(Check(*store, 99));
  // The failed write's space was returned: only live segments are allocated.
  NvmeStoreStats st = store->Stats();
  EXPECT_EQ(st.segments, 6u);
  EXPECT_EQ(st.bytes_allocated, 6 * memory->RoundUp(kOddSize));
  EXPECT_EQ(st.write_errors, 1u);
}

TEST_F(NvmeStoreTest, EioOnOneItemFailsOnlyThatItemOfTheBatch) {
  auto memory = std::make_shared<MemoryDevice>(4 << 20);
  auto faulty = std::make_shared<FaultInjectionDevice>(memory);
  auto store = OpenOrDie(DeviceOptions(faulty, 4 << 20));
  ASSERT_NE(store, nullptr);
  ASSERT_OK(Put(*store, 1));
  // Each item is split into one 72 KiB + 4 KiB IO chain; fail the 2nd IO.
  faulty->FailNthIo(2, EIO, IoOp::kWrite);
  std::vector<std::vector<std::byte>> data = {
      Content(10, 8192), Content(11, 8192), Content(12, 8192)};
  std::vector<NvmeWriteItem> items = {
      {Key(10), data[0]}, {Key(11), data[1]}, {Key(12), data[2]}};
  std::vector<Status> results = store->Write(kNs, kLayout, items);
  EXPECT_OK(results[0]);
  EXPECT_EQ(results[1].code(), StatusCode::kIOError);
  EXPECT_OK(results[2]);
  EXPECT_OK(Check(*store, 1));
  EXPECT_OK(Check(*store, 10, 8192));
  EXPECT_FALSE(store->Contains(kNs, Key(11), kLayout));
  EXPECT_OK(Check(*store, 12, 8192));
}

TEST_F(NvmeStoreTest, ReadIoErrorIsIOErrorAndKeepsTheSegment) {
  auto memory = std::make_shared<MemoryDevice>(4 << 20);
  auto faulty = std::make_shared<FaultInjectionDevice>(memory);
  auto store = OpenOrDie(DeviceOptions(faulty, 4 << 20));
  ASSERT_NE(store, nullptr);
  ASSERT_OK(Put(*store, 3));
  faulty->FailReads(EIO);
  EXPECT_EQ(Check(*store, 3).code(), StatusCode::kIOError);
  faulty->ClearFaults();
  EXPECT_OK(Check(*store, 3));
  EXPECT_EQ(store->Stats().read_errors, 1u);
}

TEST_F(NvmeStoreTest, EvictsLeastRecentlyUsedSegmentWhenFull) {
  // Room for exactly four 76 KiB extents.
  const uint64_t extent = 76 * 1024;
  auto memory = std::make_shared<MemoryDevice>(4 * extent);
  auto store = OpenOrDie(DeviceOptions(memory, 4 * extent));
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 4; ++i) ASSERT_OK(Put(*store, i));
  ASSERT_OK(Check(*store, 0));  // 0 becomes most recently used
  ASSERT_OK(Put(*store, 4));    // evicts 1, the least recently used
  EXPECT_FALSE(store->Contains(kNs, Key(1), kLayout));
  for (int i : {0, 2, 3, 4}) EXPECT_OK(Check(*store, i));
  // The reads above made 0 the least recently used again.
  ASSERT_OK(Put(*store, 5));  // evicts 0
  EXPECT_FALSE(store->Contains(kNs, Key(0), kLayout));
  NvmeStoreStats s = store->Stats();
  EXPECT_EQ(s.evictions, 2u);
  EXPECT_EQ(s.segments, 4u);
  EXPECT_LE(s.bytes_allocated, s.capacity_bytes);
  // Evictions are durable: after a restart exactly the survivors are back.
  store.reset();
  store = OpenOrDie(DeviceOptions(memory, 4 * extent));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->recovery().recovered_segments, 4u);
  for (int i : {2, 3, 4, 5}) EXPECT_OK(Check(*store, i));
  EXPECT_EQ(store->recovery().dropped_segments, 0u);
}

// The order survives a restart as write order (the catalog's generations;
// uses are not persisted), and a quota set later moves its namespace's
// segments with their order intact.
TEST_F(NvmeStoreTest, TheEvictionOrderSurvivesRestartsAndQuotaMoves) {
  const uint64_t extent = 76 * 1024;
  auto memory = std::make_shared<MemoryDevice>(8 * extent);
  auto store = OpenOrDie(DeviceOptions(memory, 8 * extent));
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 8; ++i) ASSERT_OK(Put(*store, i));
  ASSERT_OK(Check(*store, 0));  // used: forgotten by the restart
  store.reset();
  store = OpenOrDie(DeviceOptions(memory, 8 * extent));
  ASSERT_NE(store, nullptr);
  ASSERT_OK(Put(*store, 8));  // evicts 0, the oldest written
  EXPECT_FALSE(store->Contains(kNs, Key(0), kLayout));
  ASSERT_OK(Put(*store, 9));  // then 1
  EXPECT_FALSE(store->Contains(kNs, Key(1), kLayout));
  // Now 2..9; 3 used, then a quota of four extents: the namespace's
  // segments move to it in their order, and it sheds its least recent.
  ASSERT_OK(Check(*store, 3));
  ASSERT_OK(store->SetNamespaceQuota(kNs, 4 * extent));
  for (int i : {3, 7, 8, 9}) EXPECT_TRUE(Check(*store, i).ok()) << i;
  for (int i : {2, 4, 5, 6}) {
    EXPECT_FALSE(store->Contains(kNs, Key(i), kLayout)) << i;
  }
  ASSERT_OK(Put(*store, 10));  // evicts 3: used before 7, 8 and 9 were read
  EXPECT_FALSE(store->Contains(kNs, Key(3), kLayout));
  EXPECT_EQ(store->Stats().evictions, 7u);
}

// A weights namespace's share (kWeights) evicts by its catalog's
// schedule: unhinted first, then the farthest next use; pinned never.
TEST_F(NvmeStoreTest, AWeightsShareEvictsByItsSchedule) {
  const uint64_t extent = 76 * 1024;
  auto memory = std::make_shared<MemoryDevice>(16 * extent);
  auto store = OpenOrDie(DeviceOptions(memory, 16 * extent));
  ASSERT_NE(store, nullptr);
  ASSERT_OK(
      store->SetNamespaceQuota(kNs, 6 * extent, EvictionPolicyKind::kWeights));
  for (int i = 0; i < 6; ++i) ASSERT_OK(Put(*store, i));
  ScheduleTable table;
  table[Key(0)] = {.pinned = true};
  table[Key(1)] = {.pinned = true};
  table[Key(2)] = {.next_use_ms = 100};
  table[Key(3)] = {.next_use_ms = 100};
  table[Key(4)] = {.next_use_ms = 1000};
  table[Key(5)] = {.next_use_ms = 1000};
  store->SetNamespaceSchedule(kNs, table);
  auto held = [&](std::initializer_list<int> keys) {
    int n = 0;
    for (int i : keys) n += store->Contains(kNs, Key(i), kLayout) ? 1 : 0;
    return n;
  };
  ASSERT_OK(Put(*store, 6));  // one of the farthest (4, 5) goes
  EXPECT_EQ(held({0, 1, 2, 3}), 4);
  EXPECT_EQ(held({4, 5}), 1);
  ASSERT_OK(Put(*store, 7));  // the unhinted 6 before any hinted one
  EXPECT_EQ(held({6}), 0);
  ASSERT_OK(Put(*store, 8));
  ASSERT_OK(Put(*store, 9));  // 7, then 8: unhinted; 4 or 5 stays
  EXPECT_EQ(held({0, 1, 2, 3, 9}), 5);
  EXPECT_EQ(held({4, 5, 6, 7, 8}), 1);
  // Without the schedule it is least recently written first: the pins end.
  store->SetNamespaceSchedule(kNs, {});
  ASSERT_OK(Put(*store, 10));
  EXPECT_EQ(held({0}), 0);
}

TEST_F(NvmeStoreTest, SegmentLargerThanTheTierIsRejected) {
  auto memory = std::make_shared<MemoryDevice>(64 * 1024);
  auto store = OpenOrDie(DeviceOptions(memory, 64 * 1024));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(Put(*store, 1, 65 * 1024).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Put(*store, 1, 0).code(), StatusCode::kInvalidArgument);
}

TEST_F(NvmeStoreTest, SameKeyIsStoredOnceAndLayoutsDoNotMix) {
  auto memory = std::make_shared<MemoryDevice>(4 << 20);
  auto store = OpenOrDie(DeviceOptions(memory, 4 << 20));
  ASSERT_NE(store, nullptr);
  ASSERT_OK(Put(*store, 1));
  EXPECT_TRUE(Put(*store, 1).IsAlreadyExists());
  EXPECT_EQ(store->Stats().write_dedup, 1u);
  std::vector<std::byte> dst(kOddSize);
  EXPECT_TRUE(store->Read(kNs, Key(1), kLayout + 1, dst).status().IsNotFound());
  EXPECT_TRUE(
      store->Read("other-ns", Key(1), kLayout, dst).status().IsNotFound());
  EXPECT_EQ(store->Read(kNs, Key(1), kLayout, std::span(dst).first(100))
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  ASSERT_OK(store->Remove(kNs, Key(1)));
  EXPECT_FALSE(store->Contains(kNs, Key(1), kLayout));
  EXPECT_TRUE(store->Remove(kNs, Key(1)).IsNotFound());
  EXPECT_EQ(store->Stats().bytes_allocated, 0u);
}

TEST_F(NvmeStoreTest, RemoveIsDurable) {
  auto memory = std::make_shared<MemoryDevice>(4 << 20);
  {
    auto store = OpenOrDie(DeviceOptions(memory, 4 << 20));
    ASSERT_NE(store, nullptr);
    ASSERT_OK(Put(*store, 1));
    ASSERT_OK(Put(*store, 2));
    ASSERT_OK(store->Remove(kNs, Key(1)));
  }
  auto store = OpenOrDie(DeviceOptions(memory, 4 << 20));
  ASSERT_NE(store, nullptr);
  EXPECT_FALSE(store->Contains(kNs, Key(1), kLayout));
  EXPECT_OK(Check(*store, 2));
}

TEST_F(NvmeStoreTest, RecoveryDropsOverlappingAndOutOfRangeEntries) {
  const uint64_t capacity = 1 << 20;
  auto memory = std::make_shared<MemoryDevice>(capacity);
  {
    auto store = OpenOrDie(DeviceOptions(memory, capacity));
    ASSERT_NE(store, nullptr);
    ASSERT_OK(Put(*store, 1));  // offset 0, generation 1
  }
  {
    NvmeCatalogOptions co;
    co.path = dir_.File("catalog");
    auto cat = NvmeCatalog::Open(co);
    ASSERT_OK(cat);
    uint32_t ns = *(*cat)->FindNamespace(kNs);
    NvmeCatalog::Batch batch;
    // Older entry overlapping segment 1, and one past the end of the file.
    batch.Put(ns, Key(50), CatalogEntry{4096, 8192, 0, kLayout, 0});
    batch.Put(ns, Key(51), CatalogEntry{capacity - 4096, 8192, 0, kLayout, 9});
    ASSERT_OK((*cat)->Write(batch));
  }
  auto store = OpenOrDie(DeviceOptions(memory, capacity));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->recovery().recovered_segments, 1u);
  EXPECT_EQ(store->recovery().dropped_segments, 2u);
  EXPECT_OK(Check(*store, 1));
  EXPECT_FALSE(store->Contains(kNs, Key(50), kLayout));
}

TEST_F(NvmeStoreTest, DamagedCatalogFailsOpenWithCorruptionUnlessRecreating) {
  {
    auto store = OpenOrDie(FileOptions());
    ASSERT_NE(store, nullptr);
    ASSERT_OK(Put(*store, 1));
  }
  std::ofstream(
      std::filesystem::path(dir_.File("nvme.data.catalog")) / "CURRENT",
      std::ios::trunc)
      << "not a manifest";
  auto failed = NvmeStore::Open(FileOptions());
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kCorruption)
      << failed.status().ToString();

  NvmeStoreOptions o = FileOptions();
  o.recreate_damaged_catalog = true;
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->recovery().catalog_recreated);
  EXPECT_EQ(store->recovery().recovered_segments, 0u);
  EXPECT_FALSE(store->Contains(kNs, Key(1), kLayout));
  ASSERT_OK(Put(*store, 1));
  EXPECT_OK(Check(*store, 1));
}

TEST_F(NvmeStoreTest, MissingCatalogIsNotFoundWhenNotCreating) {
  NvmeStoreOptions o = FileOptions();
  o.create_catalog_if_missing = false;
  EXPECT_EQ(NvmeStore::Open(o).status().code(), StatusCode::kNotFound);
}

TEST_F(NvmeStoreTest, OptionsAreValidated) {
  NvmeStoreOptions o = FileOptions();
  o.capacity_bytes = 5000;
  EXPECT_EQ(NvmeStore::Open(o).status().code(), StatusCode::kInvalidArgument);
  o = FileOptions();
  o.path.clear();
  EXPECT_EQ(NvmeStore::Open(o).status().code(), StatusCode::kInvalidArgument);
  auto small = std::make_shared<MemoryDevice>(1 << 20);
  EXPECT_EQ(NvmeStore::Open(DeviceOptions(small, 2 << 20)).status().code(),
            StatusCode::kInvalidArgument);
}

// Readers verify every hit against the deterministic content while writers
// keep the tier full, so every write evicts. A read must return the exact
// bytes or a miss — never another segment's (or half-written) bytes.
TEST_F(NvmeStoreTest, ConcurrentReadersNeverSeeTornDataWhileWritersEvict) {
  constexpr size_t kSize = 3 * 4096 + 5;
  constexpr uint64_t kKeys = 64;
  const uint64_t capacity = 16 * 16384;  // holds 16 of the 64 keys
  auto memory = std::make_shared<MemoryDevice>(capacity);
  NvmeStoreOptions o = DeviceOptions(memory, capacity);
  o.sync_catalog = false;  // speed; durability is not under test here
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);

  std::atomic<uint64_t> bad{0};
  std::atomic<uint64_t> hits{0};
  std::atomic<int> writers_left{2};
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      struct Done {
        std::atomic<int>& left;
        ~Done() { left.fetch_sub(1); }
      } done{writers_left};
      for (uint64_t i = 0; i < 300; ++i) {
        const uint64_t n = (i * 7 + w * 13) % kKeys;
        std::vector<std::byte> data = Content(n, kSize);
        NvmeWriteItem item{Key(n), data};
        Status s = store->Write(kNs, kLayout, {&item, 1})[0];
        if (!s.ok() && !s.IsAlreadyExists() && s.code() != StatusCode::kBusy) {
          bad.fetch_add(1);
        }
      }
    });
  }
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::vector<std::byte> dst(kSize);
      // Read for as long as writers run, and at least one full pass over
      // every key after they stop (16 keys stay stored: hits are certain
      // however the threads are scheduled).
      for (uint64_t i = 0; i < 600 || writers_left.load() > 0; ++i) {
        const uint64_t n = (i * 5 + r) % kKeys;
        auto got = store->Read(kNs, Key(n), kLayout, dst);
        if (got.ok()) {
          hits.fetch_add(1);
          if (*got != kSize || dst != Content(n, kSize)) bad.fetch_add(1);
        } else if (!got.status().IsNotFound()) {
          bad.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(hits.load(), 0u);
  NvmeStoreStats s = store->Stats();
  EXPECT_GT(s.evictions, 0u);
  EXPECT_EQ(s.checksum_failures, 0u);
  EXPECT_LE(s.bytes_allocated, capacity);
}

// A heap-backed device that records how many requests each SubmitBatch
// handed to the backend, to check that ReadBatch batches its IO.
class BatchRecordingDevice final : public Device {
 public:
  explicit BatchRecordingDevice(uint64_t size_bytes)
      : Device(size_bytes, 4096, 1 << 20), bytes_(size_bytes) {}
  size_t largest_batch() const { return largest_batch_.load(); }
  uint64_t batches() const { return batches_.load(); }

 protected:
  Result<size_t> ReadImpl(uint64_t offset, std::span<std::byte> dst) override {
    std::memcpy(dst.data(), bytes_.data() + offset, dst.size());
    return dst.size();
  }
  Result<size_t> WriteImpl(uint64_t offset,
                           std::span<const std::byte> src) override {
    std::memcpy(bytes_.data() + offset, src.data(), src.size());
    return src.size();
  }
  Status FlushImpl() override { return Status::OK(); }
  void SubmitBatchImpl(std::span<IoRequest> requests,
                       const IoCompletion& on_complete) override {
    batches_.fetch_add(1);
    size_t seen = largest_batch_.load();
    while (seen < requests.size() &&
           !largest_batch_.compare_exchange_weak(seen, requests.size())) {
    }
    Device::SubmitBatchImpl(requests, on_complete);
  }

 private:
  std::vector<std::byte> bytes_;
  std::atomic<size_t> largest_batch_{0};
  std::atomic<uint64_t> batches_{0};
};

TEST_F(NvmeStoreTest,
       ReadBatchReturnsOneResultPerItemForHitsMissesAndCorruption) {
  auto store = OpenOrDie(FileOptions());
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Stats().io_uring);
  for (uint64_t n : {1, 2, 3, 4}) ASSERT_OK(Put(*store, n));
  ASSERT_OK(Put(*store, 5, 8192));  // block-multiple size: written in place
  {
    std::vector<std::byte> data = Content(6, kOddSize);
    NvmeWriteItem item{Key(6), data};
    ASSERT_OK(store->Write(kNs, kLayout + 1, {&item, 1})[0]);  // other layout
  }
  // Flip a byte of segment 3 on disk.
  auto entry = store->TEST_Entry(kNs, Key(3));
  ASSERT_TRUE(entry.has_value());
  {
    const int fd = ::open(dir_.File("nvme.data").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char byte = 0;
    const off_t at = off_t(entry->offset + 4242);
    ASSERT_EQ(1, ::pread(fd, &byte, 1, at));
    byte ^= 0x40;
    ASSERT_EQ(1, ::pwrite(fd, &byte, 1, at));
    ::close(fd);
  }

  // Aligned, large enough destinations are read in place; the others bounce.
  const size_t rounded = store->device().RoundUp(kOddSize);
  IoBuffer aligned1 = IoBuffer::AllocateAligned(rounded, 4096);
  IoBuffer aligned3 = IoBuffer::AllocateAligned(rounded, 4096);
  IoBuffer aligned5 = IoBuffer::AllocateAligned(8192, 4096);
  std::vector<std::byte> unaligned2(kOddSize + 1), unaligned1(kOddSize);
  std::vector<std::byte> miss(kOddSize), other_layout(kOddSize), small(100);
  const std::vector<NvmeReadItem> items = {
      {Key(1), aligned1.span()},
      {Key(100), miss},                            // never stored
      {Key(3), aligned3.span()},                   // corrupted
      {Key(2), std::span(unaligned2).subspan(1)},  // bounce
      {Key(6), other_layout},                      // other layout
      {Key(4), small},                             // dst too small
      {Key(5), aligned5.span()},
      {Key(1), unaligned1},  // repeated key
  };
  std::vector<Result<uint64_t>> results = store->ReadBatch(kNs, kLayout, items);
  ASSERT_EQ(results.size(), items.size());

  ASSERT_OK(results[0]);
  EXPECT_EQ(*results[0], kOddSize);
  EXPECT_EQ(
      0, std::memcmp(aligned1.data(), Content(1, kOddSize).data(), kOddSize));
  EXPECT_EQ(results[1].status().code(), StatusCode::kNotFound);
  EXPECT_EQ(results[2].status().code(), StatusCode::kNotFound);
  // The bytes that failed verification are not left in dst.
  EXPECT_TRUE(std::all_of(aligned3.data(), aligned3.data() + kOddSize,
                          [](std::byte b) { return b == std::byte{0}; }));
  ASSERT_OK(results[3]);
  EXPECT_EQ(0, std::memcmp(unaligned2.data() + 1, Content(2, kOddSize).data(),
                           kOddSize));
  EXPECT_EQ(results[4].status().code(), StatusCode::kNotFound);
  EXPECT_EQ(results[5].status().code(), StatusCode::kInvalidArgument);
  ASSERT_OK(results[6]);
  EXPECT_EQ(*results[6], 8192u);
  EXPECT_EQ(0, std::memcmp(aligned5.data(), Content(5, 8192).data(), 8192));
  ASSERT_OK(results[7]);
  EXPECT_EQ(unaligned1, Content(1, kOddSize));

  NvmeStoreStats st = store->Stats();
  EXPECT_EQ(st.reads, items.size());
  EXPECT_EQ(st.read_hits, 4u);
  EXPECT_EQ(st.read_misses, 3u);  // absent, corrupt, other layout
  EXPECT_EQ(st.checksum_failures, 1u);
  EXPECT_EQ(st.read_errors, 0u);
  EXPECT_FALSE(store->Contains(kNs, Key(3), kLayout));  // dropped
  EXPECT_OK(Check(*store, 4));
  EXPECT_TRUE(store->ReadBatch(kNs, kLayout, {}).empty());
  // An unknown namespace is all misses, one per item.
  results = store->ReadBatch("no-such-ns", kLayout, items);
  for (const auto& r : results)
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

TEST_F(NvmeStoreTest, ReadBatchSubmitsTheBatchToTheDeviceAtOnce) {
  constexpr int kSegments = 40;
  auto device = std::make_shared<BatchRecordingDevice>(8 << 20);
  auto store = OpenOrDie(DeviceOptions(device, 8 << 20));
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < kSegments; ++i) ASSERT_OK(Put(*store, i));
  std::vector<std::vector<std::byte>> dst(kSegments,
                                          std::vector<std::byte>(kOddSize));
  std::vector<NvmeReadItem> items;
  for (int i = 0; i < kSegments; ++i) items.push_back({Key(i), dst[i]});
  const uint64_t batches_before = device->batches();
  std::vector<Result<uint64_t>> results = store->ReadBatch(kNs, kLayout, items);
  EXPECT_EQ(device->batches() - batches_before, 1u);
  EXPECT_EQ(device->largest_batch(), size_t{kSegments});
  for (int i = 0; i < kSegments; ++i) {
    ASSERT_OK(results[i]);
    EXPECT_EQ(dst[i], Content(i, kOddSize)) << i;
  }
}

TEST_F(NvmeStoreTest, DeferredWritesAreReadableAtOnceAndDurableAfterOneSync) {
  auto device = std::make_shared<MemoryDevice>(8 << 20);
  const NvmeStoreOptions o = DeviceOptions(device, 8 << 20);
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  auto write = [&](uint64_t first, uint64_t n, Durability d) {
    std::vector<std::vector<std::byte>> data;
    std::vector<NvmeWriteItem> items;
    for (uint64_t i = first; i < first + n; ++i)
      data.push_back(Content(i, kOddSize));
    for (uint64_t i = 0; i < n; ++i) items.push_back({Key(first + i), data[i]});
    for (const Status& s : store->Write(kNs, kLayout, items, d)) {
      EXPECT_OK(s);
    }
  };
  const uint64_t flushes = device->Stats().flush_ops;
  EXPECT_FALSE(store->HasUnsyncedWrites());
  for (uint64_t b = 0; b < 3; ++b) write(b * 10, 10, Durability::kDeferred);
  EXPECT_EQ(device->Stats().flush_ops, flushes);  // no sync per batch
  EXPECT_TRUE(store->HasUnsyncedWrites());
  for (uint64_t i = 0; i < 30; ++i) ASSERT_OK(Check(*store, i));

  // One group sync covers all three batches; a second has nothing to do.
  ASSERT_OK(store->Sync());
  EXPECT_EQ(device->Stats().flush_ops, flushes + 1);
  EXPECT_FALSE(store->HasUnsyncedWrites());
  ASSERT_OK(store->Sync());
  EXPECT_EQ(device->Stats().flush_ops, flushes + 1);

  // A durable write's own flush covers the deferred writes before it.
  write(30, 5, Durability::kDeferred);
  write(35, 5, Durability::kDurable);
  EXPECT_EQ(device->Stats().flush_ops, flushes + 2);
  EXPECT_FALSE(store->HasUnsyncedWrites());
  ASSERT_OK(store->Sync());
  EXPECT_EQ(device->Stats().flush_ops, flushes + 2);

  // Everything is in the catalog after a restart.
  store.reset();
  store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  for (uint64_t i = 0; i < 40; ++i) ASSERT_OK(Check(*store, i));
}

TEST_F(NvmeStoreTest, ReadBatchBoundsBounceMemoryByReadingInRounds) {
  constexpr int kSegments = 10;
  auto device = std::make_shared<BatchRecordingDevice>(8 << 20);
  NvmeStoreOptions o = DeviceOptions(device, 8 << 20);
  o.read_batch_bounce_bytes = 3 * device->RoundUp(kOddSize);
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < kSegments; ++i) ASSERT_OK(Put(*store, i));
  std::vector<std::vector<std::byte>> dst(kSegments,
                                          std::vector<std::byte>(kOddSize));
  std::vector<NvmeReadItem> items;
  for (int i = 0; i < kSegments; ++i) items.push_back({Key(i), dst[i]});
  const uint64_t batches_before = device->batches();
  std::vector<Result<uint64_t>> results = store->ReadBatch(kNs, kLayout, items);
  EXPECT_EQ(device->batches() - batches_before, 4u);  // 3 + 3 + 3 + 1
  EXPECT_EQ(device->largest_batch(), 3u);
  for (int i = 0; i < kSegments; ++i) {
    ASSERT_OK(results[i]);
    EXPECT_EQ(dst[i], Content(i, kOddSize)) << i;
  }
}

TEST_F(NvmeStoreTest, ReadBatchDeviceErrorFailsItsItemsAndKeepsTheSegments) {
  auto memory = std::make_shared<MemoryDevice>(4 << 20);
  auto faulty = std::make_shared<FaultInjectionDevice>(memory);
  auto store = OpenOrDie(DeviceOptions(faulty, 4 << 20));
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 3; ++i) ASSERT_OK(Put(*store, i, 8192));
  faulty->FailNthIo(2, EIO, IoOp::kRead);
  std::vector<std::vector<std::byte>> dst(3, std::vector<std::byte>(8192));
  std::vector<NvmeReadItem> items;
  for (int i = 0; i < 3; ++i) items.push_back({Key(i), dst[i]});
  std::vector<Result<uint64_t>> results = store->ReadBatch(kNs, kLayout, items);
  EXPECT_OK(results[0]);
  EXPECT_EQ(results[1].status().code(), StatusCode::kIOError);
  EXPECT_OK(results[2]);
  EXPECT_EQ(store->Stats().read_errors, 1u);
  faulty->ClearFaults();
  for (int i = 0; i < 3; ++i) EXPECT_OK(Check(*store, i, 8192));
}

TEST_F(NvmeStoreTest, AlignedWriteIsStoredInPlaceAndSurvivesRestart) {
  IoBuffer data = IoBuffer::AllocateAligned(3 * 4096, 4096);
  {
    auto store = OpenOrDie(FileOptions());
    ASSERT_NE(store, nullptr);
    const std::vector<std::byte> content = Content(9, data.size());
    std::memcpy(data.data(), content.data(), data.size());
    NvmeWriteItem item{Key(9), data.span()};
    ASSERT_OK(store->Write(kNs, kLayout, {&item, 1})[0]);
    std::memset(data.data(), 0xEE, data.size());  // no longer borrowed
    EXPECT_OK(Check(*store, 9, data.size()));
  }
  auto store = OpenOrDie(FileOptions());
  ASSERT_NE(store, nullptr);
  EXPECT_OK(Check(*store, 9, data.size()));
}

// A block-aligned source whose padding may be read (TierWriteItem::
// readable_bytes: the rest of its arena extent) is written in place, and an
// aligned destination with room for the whole blocks is read in place; the
// padding never becomes part of the segment.
TEST_F(NvmeStoreTest, PaddedAlignedBuffersMoveInPlaceAndThePaddingStaysOut) {
  constexpr size_t kSize = 2 * 4096 + 5;  // three blocks on the device
  IoBuffer src = IoBuffer::AllocateAligned(3 * 4096, 4096);
  const std::vector<std::byte> content = Content(21, kSize);
  std::memcpy(src.data(), content.data(), kSize);
  std::memset(src.data() + kSize, 0xAB, src.size() - kSize);  // padding
  auto store = OpenOrDie(FileOptions());
  ASSERT_NE(store, nullptr);
  NvmeWriteItem padded{Key(21), src.span().first(kSize), src.size()};
  ASSERT_OK(store->Write(kNs, kLayout, {&padded, 1})[0]);
  EXPECT_EQ(store->Stats().bounced_writes, 0u);
  NvmeWriteItem unpadded{Key(22), src.span().first(kSize)};  // 0: kSize
  ASSERT_OK(store->Write(kNs, kLayout, {&unpadded, 1})[0]);
  EXPECT_EQ(store->Stats().bounced_writes, 1u) << "may not read past kSize";

  IoBuffer dst = IoBuffer::AllocateAligned(3 * 4096, 4096);
  auto got = store->Read(kNs, Key(21), kLayout, dst.span());
  ASSERT_OK(got);
  EXPECT_EQ(*got, kSize);
  EXPECT_EQ(std::memcmp(dst.data(), content.data(), kSize), 0);
  EXPECT_EQ(store->Stats().bounced_reads, 0u);
  // Not block-aligned (whatever the allocator hands out): bounced, same
  // bytes.
  IoBuffer off = IoBuffer::AllocateAligned(4 * 4096, 4096);
  got = store->Read(kNs, Key(21), kLayout, off.span().subspan(64));
  ASSERT_OK(got);
  EXPECT_EQ(std::memcmp(off.data() + 64, content.data(), kSize), 0);
  EXPECT_EQ(store->Stats().bounced_reads, 1u);
  store.reset();
  store = OpenOrDie(FileOptions());
  ASSERT_NE(store, nullptr);
  for (uint64_t n : {21, 22}) {
    std::vector<std::byte> back(kSize + 4096);
    auto again = store->Read(kNs, Key(n), kLayout, back);
    ASSERT_OK(again);
    EXPECT_EQ(*again, kSize) << "the padding is not part of the segment";
    EXPECT_EQ(std::memcmp(back.data(), content.data(), kSize), 0) << n;
  }
}

// Batched readers (aligned and bounced destinations, repeated keys) verify
// every hit while writers keep the tier full, so every write evicts. Runs on
// the memory device (ThreadSanitizer sees overlapping IO as a race) and on a
// real file through io_uring.
void RunReadBatchesAgainstEvictingWriters(NvmeStore& store, uint64_t capacity) {
  constexpr size_t kSize = 3 * 4096 + 5;
  constexpr uint64_t kKeys = 64;
  constexpr size_t kBatch = 8;
  // Fill the tier first so the readers find hits from the start.
  for (uint64_t n = 0; n < kKeys; ++n) {
    std::vector<std::byte> data = Content(n, kSize);
    NvmeWriteItem item{Key(n), data};
    ASSERT_OK(store.Write(kNs, kLayout, {&item, 1})[0]);
  }
  std::atomic<uint64_t> bad{0};
  std::atomic<uint64_t> hits{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      for (uint64_t i = 0; i < 200; ++i) {
        std::vector<std::vector<std::byte>> data;
        std::vector<NvmeWriteItem> items;
        for (uint64_t j = 0; j < 2; ++j) {
          data.push_back(Content((i * 7 + j * 31 + w * 13) % kKeys, kSize));
        }
        for (uint64_t j = 0; j < 2; ++j) {
          items.push_back({Key((i * 7 + j * 31 + w * 13) % kKeys), data[j]});
        }
        for (const Status& s : store.Write(kNs, kLayout, items)) {
          if (!s.ok() && !s.IsAlreadyExists() &&
              s.code() != StatusCode::kBusy) {
            bad.fetch_add(1);
          }
        }
      }
    });
  }
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      const size_t rounded = 4 * 4096;
      std::vector<IoBuffer> aligned;
      std::vector<std::vector<std::byte>> plain;
      for (size_t j = 0; j < kBatch; ++j) {
        aligned.push_back(IoBuffer::AllocateAligned(rounded, 4096));
        plain.emplace_back(kSize);
      }
      for (uint64_t i = 0; i < 150; ++i) {
        std::vector<NvmeReadItem> items;
        std::vector<uint64_t> keys;
        for (size_t j = 0; j < kBatch; ++j) {
          const uint64_t n = (i * 5 + j * 3 + r) % kKeys;  // repeats keys
          keys.push_back(n);
          items.push_back({Key(n), j % 2 == 0
                                       ? aligned[j].span()
                                       : std::span<std::byte>(plain[j])});
        }
        std::vector<Result<uint64_t>> got =
            store.ReadBatch(kNs, kLayout, items);
        if (got.size() != kBatch) bad.fetch_add(1);
        for (size_t j = 0; j < got.size(); ++j) {
          if (got[j].ok()) {
            hits.fetch_add(1);
            if (*got[j] != kSize ||
                std::memcmp(items[j].dst.data(), Content(keys[j], kSize).data(),
                            kSize) != 0) {
              bad.fetch_add(1);
            }
          } else if (!got[j].status().IsNotFound()) {
            bad.fetch_add(1);
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(hits.load(), 0u);
  NvmeStoreStats s = store.Stats();
  EXPECT_GT(s.evictions, 0u);
  EXPECT_EQ(s.checksum_failures, 0u);
  EXPECT_LE(s.bytes_allocated, capacity);
}

TEST_F(NvmeStoreTest, ConcurrentReadBatchesNeverSeeTornDataWhileWritersEvict) {
  const uint64_t capacity = 16 * 16384;  // holds 16 of the 64 keys
  auto memory = std::make_shared<MemoryDevice>(capacity);
  NvmeStoreOptions o = DeviceOptions(memory, capacity);
  o.sync_catalog = false;  // speed; durability is not under test here
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  RunReadBatchesAgainstEvictingWriters(*store, capacity);
}

TEST_F(NvmeStoreTest, ConcurrentReadBatchesOnIoUringNeverSeeTornData) {
  const uint64_t capacity = 16 * 16384;
  NvmeStoreOptions o = FileOptions(capacity);
  o.sync_catalog = false;
  o.sync_data = false;
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  RunReadBatchesAgainstEvictingWriters(*store, capacity);
}

TEST_F(NvmeStoreTest, AQuotaKeepsOtherNamespacesFromEvictingItsSegments) {
  // 16 MiB tier; "reserved" gets 4 MiB of it, everyone else shares 12 MiB.
  auto store = OpenOrDie(FileOptions(16 << 20));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->SetNamespaceQuota("reserved", 17 << 20).code(),
            StatusCode::kInvalidArgument)
      << "more than the tier";
  EXPECT_EQ(store->SetNamespaceQuota("reserved", 4097).code(),
            StatusCode::kInvalidArgument)
      << "not block-aligned";
  ASSERT_OK(store->SetNamespaceQuota("reserved", 4 << 20));
  EXPECT_EQ(store->SetNamespaceQuota("other", 13 << 20).code(),
            StatusCode::kInvalidArgument)
      << "4 + 13 MiB of quotas in a 16 MiB tier";
  auto put = [&](std::string_view ns, uint64_t n) {
    std::vector<std::byte> data = Content(n, kOddSize);
    NvmeWriteItem item{Key(n), data};
    return store->Write(ns, kLayout, {&item, 1})[0];
  };
  auto readable = [&](std::string_view ns, uint64_t n) {
    std::vector<std::byte> dst(kOddSize + 4096);
    auto got = store->Read(ns, Key(n), kLayout, dst);
    return got.ok() &&
           std::memcmp(dst.data(), Content(n, kOddSize).data(), kOddSize) == 0;
  };
  // 40 segments of 76 KiB (3 MiB) fit the reservation.
  for (uint64_t n = 0; n < 40; ++n) ASSERT_OK(put("reserved", n));
  // 400 segments (30 MiB) of a tenant without one: it evicts its own.
  for (uint64_t n = 1000; n < 1400; ++n) ASSERT_OK(put("flood", n));
  auto stats = store->NamespaceStats();
  EXPECT_EQ(stats["reserved"].segments, 40u);
  EXPECT_EQ(stats["reserved"].evictions, 0u);
  EXPECT_EQ(stats["reserved"].quota_bytes, uint64_t{4} << 20);
  EXPECT_GT(stats["flood"].evictions, 200u);
  EXPECT_LE(stats["flood"].bytes_allocated, uint64_t{12} << 20);
  for (uint64_t n = 0; n < 40; ++n) EXPECT_TRUE(readable("reserved", n)) << n;
  // Past its reservation, "reserved" evicts its own oldest, not the flood's.
  const uint64_t flood_segments = stats["flood"].segments;
  for (uint64_t n = 40; n < 100; ++n) ASSERT_OK(put("reserved", n));
  stats = store->NamespaceStats();
  EXPECT_LE(stats["reserved"].bytes_allocated, uint64_t{4} << 20);
  EXPECT_GT(stats["reserved"].evictions, 0u);
  EXPECT_EQ(stats["flood"].segments, flood_segments);
  EXPECT_FALSE(readable("reserved", 0)) << "its least recently used went";
  EXPECT_TRUE(readable("reserved", 99));
  // A smaller reservation takes effect at once.
  ASSERT_OK(store->SetNamespaceQuota("reserved", 1 << 20));
  stats = store->NamespaceStats();
  EXPECT_LE(stats["reserved"].bytes_allocated, uint64_t{1} << 20);
  EXPECT_TRUE(readable("reserved", 99));
}

}  // namespace
}  // namespace tierkv::storage
