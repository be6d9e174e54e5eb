// Tests for storage/host_arena: the memfd clients map.
#include "storage/host/host_arena.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "tests/testing/status_matchers.h"

namespace tierkv::storage {
namespace {

// Every client of a namespace holds the arena's fd: none may resize it,
// whether to fault the daemon's mapping (shrink) or to make the daemon own
// memory nobody configured (grow).
TEST(HostArenaTest, ClientsCanNeitherShrinkNorGrowTheArena) {
  auto arena = HostArena::Create(
      {.name = "t", .bytes = 4 << 20, .try_hugepages = false});
  ASSERT_OK(arena);
  const int fd = (*arena)->fd();
  const int seals = ::fcntl(fd, F_GET_SEALS);
  EXPECT_NE(seals & F_SEAL_SHRINK, 0);
  EXPECT_NE(seals & F_SEAL_GROW, 0);
  EXPECT_NE(seals & F_SEAL_SEAL, 0);  // and the seals cannot be lifted
  EXPECT_NE(::ftruncate(fd, 8 << 20), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(::ftruncate(fd, 1 << 20), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(::fallocate(fd, 0, 0, 16 << 20), 0);  // growing by fallocate
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  EXPECT_EQ(st.st_size, 4 << 20);
}

}  // namespace
}  // namespace tierkv::storage
