#include "tests/testing/small_tmpfs.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace tierkv::testing {

Result<std::unique_ptr<SmallTmpfs>> SmallTmpfs::Mount(uint64_t bytes) {
  std::unique_ptr<SmallTmpfs> fs(new SmallTmpfs());
  if (fs->dir_.path().empty()) {
    return Status::IOError("small tmpfs: cannot create a directory");
  }
  const std::string options = "size=" + std::to_string(bytes) + ",mode=0700";
  if (::mount("tierkv-test", fs->dir_.path().c_str(), "tmpfs", 0,
              options.c_str()) != 0) {
    return Status::Unavailable(
        std::string("small tmpfs: mount needs root (CAP_SYS_ADMIN): ") +
        std::strerror(errno));
  }
  fs->mounted_ = true;
  return fs;
}

SmallTmpfs::~SmallTmpfs() {
  if (mounted_) ::umount2(dir_.path().c_str(), MNT_DETACH);
}

uint64_t SmallTmpfs::Fill() {
  const std::string filler = File("filler");
  const int fd = ::open(filler.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (fd < 0) return 0;
  // Large writes first, then single bytes, so not even a partial block is
  // left.
  uint64_t written = 0;
  std::vector<char> chunk(1 << 16, 'f');
  for (size_t size : {chunk.size(), size_t{4096}, size_t{1}}) {
    while (true) {
      const ssize_t n = ::write(fd, chunk.data(), size);
      if (n <= 0) break;
      written += static_cast<uint64_t>(n);
    }
  }
  ::close(fd);
  return written;
}

void SmallTmpfs::Unfill() { ::unlink(File("filler").c_str()); }

uint64_t SmallTmpfs::FreeBytes() const {
  struct statvfs st {};
  if (::statvfs(dir_.path().c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

}  // namespace tierkv::testing
