// MappedRegion: seal and size checks, then a shared read-write mapping.
#include "storage/device/mapped_region.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tierkv::storage {

namespace {

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack it
#endif

// True when [offset, end) of `fd` has no hole: every page is allocated.
bool FullyAllocated(int fd, uint64_t offset, uint64_t end) {
  const off_t hole = ::lseek(fd, static_cast<off_t>(offset), SEEK_HOLE);
  return hole >= 0 && static_cast<uint64_t>(hole) >= end;
}

}  // namespace

Result<std::shared_ptr<MappedRegion>> MappedRegion::Map(int fd, uint64_t offset,
                                                        uint64_t bytes,
                                                        bool prefault) {
  if (bytes == 0) return Status::InvalidArgument("region of 0 bytes");
  if (offset > UINT64_MAX - bytes) {
    return Status::InvalidArgument("region offset + size overflows");
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return Status::InvalidArgument(
        "the region is not a sealable memfd (create it with "
        "memfd_create(..., MFD_ALLOW_SEALING))");
  }
  if ((seals & F_SEAL_SHRINK) == 0) {
    return Status::InvalidArgument(
        "the region's memfd must be sealed with F_SEAL_SHRINK");
  }
  if (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) {
    return Status::InvalidArgument(
        "the region's memfd is sealed read-only; the daemon must write it");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return Status::IOError(fmt::format("fstat: {}", std::strerror(errno)));
  }
  const uint64_t end = offset + bytes;
  if (static_cast<uint64_t>(st.st_size) < end) {
    return Status::InvalidArgument(fmt::format(
        "the region has {} B but its spec needs {} B", st.st_size, end));
  }
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t start = offset / page * page;
  const uint64_t size = end - start;
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                      static_cast<off_t>(start));
  if (base == MAP_FAILED) {
    return Status::IOError(
        fmt::format("mmap region: {}", std::strerror(errno)));
  }
  if (prefault && FullyAllocated(fd, start, end)) {
    // Best effort: a kernel without MADV_POPULATE_WRITE (EINVAL) faults
    // lazily, as without prefault.
    (void)::madvise(base, size, MADV_POPULATE_WRITE);
  }
  return std::shared_ptr<MappedRegion>(
      new MappedRegion(static_cast<std::byte*>(base), size, offset - start));
}

MappedRegion::~MappedRegion() { ::munmap(mapping_, size_); }

}  // namespace tierkv::storage
