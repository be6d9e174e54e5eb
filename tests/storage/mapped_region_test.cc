// Tests for storage/mapped_region: a client's memfd mapped into the daemon.
#include "storage/device/mapped_region.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "tests/testing/status_matchers.h"

namespace tierkv::storage {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

// A sealable memfd of `bytes`, sealed against shrinking as clients do.
int ClientMemfd(uint64_t bytes) {
  const int fd = ::memfd_create("mapped-region-test", MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
  EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  return fd;
}

// Allocates [0, bytes) of `fd` as a client that prefaults its pool does
// (fallocate'd pages stay holes to SEEK_HOLE until written).
void Populate(int fd, uint64_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_POPULATE, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_EQ(::munmap(p, bytes), 0);
}

// Shared-memory pages this process has mapped and resident (RssShmem).
uint64_t RssShmemBytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  uint64_t kib = 0;
  while (status >> key) {
    if (key == "RssShmem:") {
      status >> kib;
      return kib * 1024;
    }
    status.ignore(1 << 12, '\n');
  }
  ADD_FAILURE() << "no RssShmem in /proc/self/status";
  return 0;
}

// The daemon maps one pool of a client's memfd: the bytes it asked for,
// starting at the pool's offset, even when that offset is not
// page-aligned; what the client wrote there is what the daemon sees.
TEST(MappedRegionTest, MapsTheRangeAtItsOffset) {
  const int fd = ClientMemfd(4 * kMiB);
  const uint64_t offset = 3 * kMiB + 100;  // not page-aligned
  const char marker[] = "pool bytes";
  ASSERT_EQ(::pwrite(fd, marker, sizeof(marker), static_cast<off_t>(offset)),
            static_cast<ssize_t>(sizeof(marker)));
  auto region = MappedRegion::Map(fd, offset, 4096);
  ASSERT_OK(region);
  ASSERT_EQ((*region)->bytes().size(), 4096u);
  EXPECT_EQ(std::memcmp((*region)->bytes().data(), marker, sizeof(marker)), 0);
  // Writes through the mapping reach the client's file.
  std::memcpy((*region)->bytes().data() + 10, "XY", 2);
  char back[2];
  ASSERT_EQ(::pread(fd, back, 2, static_cast<off_t>(offset + 10)), 2);
  EXPECT_EQ(std::memcmp(back, "XY", 2), 0);
  ::close(fd);
}

TEST(MappedRegionTest, RefusesARangePastTheEndOfTheMemfd) {
  const int fd = ClientMemfd(kMiB);
  auto region = MappedRegion::Map(fd, kMiB - 4096, 8192);
  EXPECT_EQ(region.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MappedRegion::Map(fd, UINT64_MAX - 10, 4096).status().code(),
            StatusCode::kInvalidArgument);
  ::close(fd);
}

// Prefaulting fills the daemon's page tables for a fully allocated pool (a
// Load then writes it without faults), and never allocates a client's
// holes on the client's behalf.
TEST(MappedRegionTest, PrefaultMapsAllocatedPagesAndAllocatesNothing) {
  const uint64_t bytes = 16 * kMiB;
  const int allocated = ClientMemfd(bytes);
  Populate(allocated, bytes);
  const uint64_t before = RssShmemBytes();
  auto mapped = MappedRegion::Map(allocated, 0, bytes, /*prefault=*/true);
  ASSERT_OK(mapped);
  EXPECT_GE(RssShmemBytes(), before + bytes - kMiB);

  const int sparse = ClientMemfd(bytes);  // its second half is a hole
  Populate(sparse, bytes / 2);
  const uint64_t before_sparse = RssShmemBytes();
  auto lazy = MappedRegion::Map(sparse, 0, bytes, /*prefault=*/true);
  ASSERT_OK(lazy);
  EXPECT_LT(RssShmemBytes(), before_sparse + kMiB);
  struct stat st {};
  ASSERT_EQ(::fstat(sparse, &st), 0);
  EXPECT_LE(static_cast<uint64_t>(st.st_blocks) * 512, bytes / 2 + kMiB);
  ::close(allocated);
  ::close(sparse);
}

}  // namespace
}  // namespace tierkv::storage
