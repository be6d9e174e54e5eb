// HostArena: a namespace's DRAM as one memfd clients map, hugepages when
// available (see host_arena.h).
#include "storage/host/host_arena.h"

#include <fcntl.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common/shared_mapping.h"

namespace tierkv::storage {
namespace {

constexpr uint64_t kHugePageBytes = uint64_t{2} << 20;

Status ErrnoStatus(const char* what) {
  return Status::IOError(std::string(what) + ": " + std::strerror(errno));
}

// Creates, sizes and maps a memfd; returns -1 (errno set) on failure.
int MakeMemfd(const std::string& name, uint64_t bytes, unsigned flags) {
  int fd =
      ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING | flags);
  if (fd < 0) return -1;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int saved = errno;
    ::close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

}  // namespace

Result<std::unique_ptr<HostArena>> HostArena::Create(
    const HostArenaOptions& o) {
  if (o.bytes == 0) return Status::InvalidArgument("arena size must be > 0");
  int fd = -1;
  bool huge = false;
  void* base = MAP_FAILED;
  if (o.try_hugepages && o.bytes % kHugePageBytes == 0) {
    fd = MakeMemfd(o.name, o.bytes, MFD_HUGETLB);
    if (fd >= 0) {
      // MAP_POPULATE surfaces a hugepage shortage now instead of as SIGBUS
      // on first touch.
      base = ::mmap(nullptr, o.bytes, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_POPULATE, fd, 0);
      if (base == MAP_FAILED) {
        ::close(fd);
        fd = -1;
      } else {
        huge = true;
      }
    }
  }
  if (fd < 0) {
    fd = MakeMemfd(o.name, o.bytes, 0);
    if (fd < 0) return ErrnoStatus("memfd_create/ftruncate");
    // Prefaulted as written (common/shared_mapping.h): the daemon writes
    // the arena too (Store, promotions).
    base = MapShared(fd, o.bytes, o.prefault);
    if (base == MAP_FAILED) {
      Status s = ErrnoStatus("mmap arena");
      ::close(fd);
      return s;
    }
  }
  // Clients map the arena but may neither shrink it (the daemon's mapping
  // would fault) nor grow it (a client holding the fd could make the daemon
  // own memory it never asked for).
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) !=
      0) {
    Status s = ErrnoStatus("sealing the arena memfd");
    ::munmap(base, o.bytes);
    ::close(fd);
    return s;
  }
  return std::unique_ptr<HostArena>(
      new HostArena(fd, static_cast<std::byte*>(base), o.bytes, huge));
}

HostArena::~HostArena() {
  ::munmap(base_, size_);
  ::close(fd_);
}

}  // namespace tierkv::storage
