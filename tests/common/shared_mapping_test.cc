// MapShared: a prefaulted mapping has every page mapped before any access;
// without prefault none is; either way it shares the file's bytes.
#include "common/shared_mapping.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace tierkv {
namespace {

constexpr size_t kBytes = size_t{8} << 20;

// Resident KiB of the mapping that starts at `base` (/proc/self/smaps).
int64_t RssKiB(const void* base) {
  std::ifstream smaps("/proc/self/smaps");
  const auto want = reinterpret_cast<uintptr_t>(base);
  std::string line;
  bool in = false;
  while (std::getline(smaps, line)) {
    uintptr_t start = 0, end = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> start >> dash >> end && dash == '-') {
      in = start == want;
      continue;
    }
    if (in && line.rfind("Rss:", 0) == 0) {
      return std::stoll(line.substr(4));
    }
  }
  return -1;
}

class MapSharedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fd_ = ::memfd_create("shared-mapping-test", MFD_CLOEXEC);
    ASSERT_GE(fd_, 0);
    ASSERT_EQ(::ftruncate(fd_, kBytes), 0);
  }
  void TearDown() override { ::close(fd_); }
  int fd_ = -1;
};

TEST_F(MapSharedTest, APrefaultedMappingHasEveryPageMapped) {
  void* base = MapShared(fd_, kBytes, /*prefault=*/true);
  ASSERT_NE(base, MAP_FAILED);
  EXPECT_EQ(RssKiB(base), static_cast<int64_t>(kBytes >> 10));
  ::munmap(base, kBytes);
}

TEST_F(MapSharedTest, WithoutPrefaultNothingIsMappedAndBytesAreShared) {
  void* lazy = MapShared(fd_, kBytes, /*prefault=*/false);
  ASSERT_NE(lazy, MAP_FAILED);
  EXPECT_EQ(RssKiB(lazy), 0);
  void* other = MapShared(fd_, kBytes, /*prefault=*/true);
  ASSERT_NE(other, MAP_FAILED);
  std::memcpy(static_cast<char*>(other) + 4096, "tierkv", 6);
  EXPECT_EQ(std::memcmp(static_cast<char*>(lazy) + 4096, "tierkv", 6), 0);
  ::munmap(lazy, kBytes);
  ::munmap(other, kBytes);
}

}  // namespace
}  // namespace tierkv
