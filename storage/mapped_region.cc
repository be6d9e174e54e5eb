// MappedRegion: seal and size checks, then a shared read-write mapping.
#include "storage/mapped_region.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tierkv::storage {

Result<std::shared_ptr<MappedRegion>> MappedRegion::Map(int fd,
                                                        uint64_t bytes) {
  if (bytes == 0) return Status::InvalidArgument("region of 0 bytes");
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
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    return Status::InvalidArgument(fmt::format(
        "the region has {} B but its spec needs {} B", st.st_size, bytes));
  }
  void* base =
      ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    return Status::IOError(
        fmt::format("mmap region: {}", std::strerror(errno)));
  }
  return std::shared_ptr<MappedRegion>(
      new MappedRegion(static_cast<std::byte*>(base), bytes));
}

MappedRegion::~MappedRegion() { ::munmap(base_, size_); }

}  // namespace tierkv::storage
