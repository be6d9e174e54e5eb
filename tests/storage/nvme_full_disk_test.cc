// NvmeStore on a file system that fills up: a real tmpfs of a few MiB
// holding the data file and the RocksDB catalog, filled to the last byte.
// Nothing may abort (Debian's RocksDB asserts if its WAL writer is used
// after an error), every acknowledged segment must stay readable, and a
// restart on the full disk must succeed.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "storage/nvme/nvme_store.h"
#include "tests/testing/small_tmpfs.h"
#include "tests/testing/status_matchers.h"

namespace tierkv::storage {
namespace {

constexpr uint64_t kLayout = 0x5EED;
constexpr std::string_view kNs = "tenant";
constexpr size_t kSize = 64 * 1024 + 5;

SegmentKey Key(uint64_t n) { return SegmentKey{PageHash{n, ~n}, 0, 0}; }

std::vector<std::byte> Content(uint64_t n) {
  std::vector<std::byte> v(kSize);
  for (size_t i = 0; i < kSize; ++i) v[i] = std::byte((n * 131 + i) & 0xFF);
  return v;
}

Status Put(NvmeStore& store, uint64_t n) {
  const std::vector<std::byte> data = Content(n);
  const NvmeWriteItem item{Key(n), data};
  return store.Write(kNs, kLayout, {&item, 1})[0];
}

Status Check(NvmeStore& store, uint64_t n) {
  std::vector<std::byte> dst(kSize + 4096);
  auto got = store.Read(kNs, Key(n), kLayout, dst);
  if (!got.ok()) return got.status();
  const auto want = Content(n);
  if (*got != kSize || std::memcmp(dst.data(), want.data(), kSize) != 0) {
    return Status::Internal("wrong bytes");
  }
  return Status::OK();
}

class NvmeFullDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto fs = testing::SmallTmpfs::Mount(24 << 20);
    if (!fs.ok()) GTEST_SKIP() << fs.status().ToString();
    fs_ = std::move(fs).value();
  }
  // `retry`: how soon a read-only catalog tries to reopen for writing.
  NvmeStoreOptions Options(
      std::chrono::milliseconds retry = std::chrono::hours(1)) const {
    NvmeStoreOptions o;
    o.path = fs_->File("nvme.data");
    o.capacity_bytes = 8 << 20;  // preallocated: the catalog fills up first
    o.queue_depth = 8;
    o.catalog_resume_interval = retry;
    return o;
  }
  // Writes new segments from `*next` until one fails; returns that error.
  // The last WAL page may take a few more small records after the filler
  // has taken every free block.
  static Status WriteUntilRefused(NvmeStore& store, uint64_t* next,
                                  std::vector<uint64_t>* acknowledged) {
    for (int i = 0; i < 10000; ++i, ++*next) {
      Status s = Put(store, *next);
      if (!s.ok()) return s;
      acknowledged->push_back(*next);
    }
    return Status::OK();
  }
  std::unique_ptr<testing::SmallTmpfs> fs_;
};

TEST_F(NvmeFullDiskTest, FullCatalogGoesReadOnlyAndEverySegmentStaysReadable) {
  std::vector<uint64_t> acknowledged;
  uint64_t next = 0;
  {
    auto store = NvmeStore::Open(Options());
    ASSERT_OK(store);
    for (; next < 20; ++next) {
      ASSERT_OK(Put(**store, next));
      acknowledged.push_back(next);
    }
    ASSERT_GT(fs_->Fill(), 0u);
    ASSERT_EQ(fs_->FreeBytes(), 0u);
    const Status refused = WriteUntilRefused(**store, &next, &acknowledged);
    EXPECT_EQ(refused.code(), StatusCode::kIOError) << refused.ToString();
    NvmeStoreStats st = (*store)->Stats();
    EXPECT_TRUE(st.read_only);
    EXPECT_EQ(st.read_only_entries, 1u);
    // Refused at once from now on; syncs fail cleanly; reads still work.
    EXPECT_EQ(Put(**store, next).code(), StatusCode::kIOError);
    EXPECT_EQ((*store)->Sync().code(), StatusCode::kOk)
        << "nothing deferred is pending: no sync is attempted";
    for (uint64_t n : acknowledged) EXPECT_TRUE(Check(**store, n).ok()) << n;
    EXPECT_EQ(Check(**store, next).code(), StatusCode::kNotFound);
  }  // closes RocksDB on the full disk
  // Closing deleted files (the failed WAL): take that space too, so the
  // restart cannot create a MANIFEST or WAL.
  fs_->Fill();
  ASSERT_EQ(fs_->FreeBytes(), 0u);
  {
    // A restart on the still-full disk opens the catalog read-only. The
    // refused write may have reached the WAL before its append failed and
    // come back (see the end): at least every acknowledged one is there.
    auto store = NvmeStore::Open(Options());
    ASSERT_OK(store);
    EXPECT_TRUE((*store)->Stats().read_only);
    EXPECT_GE((*store)->recovery().recovered_segments, acknowledged.size());
    for (uint64_t n : acknowledged) EXPECT_TRUE(Check(**store, n).ok()) << n;
    EXPECT_EQ(Put(**store, next + 1).code(), StatusCode::kIOError);
  }
  fs_->Unfill();
  // With space back, a restart is writable and has lost nothing.
  auto store = NvmeStore::Open(Options());
  ASSERT_OK(store);
  EXPECT_FALSE((*store)->Stats().read_only);
  for (uint64_t n : acknowledged) EXPECT_TRUE(Check(**store, n).ok()) << n;
  // The refused write may have reached the WAL before its append failed
  // (RocksDB then replays it): its bytes were written first, so it reads
  // back exact or is a miss, never wrong.
  const Status refused = Check(**store, next);
  EXPECT_TRUE(refused.ok() || refused.code() == StatusCode::kNotFound)
      << refused.ToString();
  ASSERT_OK(Put(**store, next + 1));
  EXPECT_OK(Check(**store, next + 1));
}

TEST_F(NvmeFullDiskTest, ReadOnlyCatalogRecoversWhenSpaceIsFreed) {
  auto store = NvmeStore::Open(Options(std::chrono::milliseconds(0)));
  ASSERT_OK(store);
  std::vector<uint64_t> acknowledged;
  uint64_t next = 0;
  ASSERT_OK(Put(**store, next));
  acknowledged.push_back(next++);
  ASSERT_GT(fs_->Fill(), 0u);
  ASSERT_EQ(WriteUntilRefused(**store, &next, &acknowledged).code(),
            StatusCode::kIOError);
  ASSERT_TRUE((*store)->Stats().read_only);
  // Deferred writes would need a sync; it must fail, not abort.
  EXPECT_EQ((*store)->Sync().code(), StatusCode::kOk);
  fs_->Unfill();
  // The next write reopens the catalog (no retry interval here) and
  // succeeds.
  ++next;
  ASSERT_OK(Put(**store, next));
  acknowledged.push_back(next);
  const NvmeStoreStats st = (*store)->Stats();
  EXPECT_FALSE(st.read_only);
  EXPECT_EQ(st.read_only_entries, 1u);
  ASSERT_OK((*store)->Sync());
  for (uint64_t n : acknowledged) EXPECT_TRUE(Check(**store, n).ok()) << n;
}

}  // namespace
}  // namespace tierkv::storage
