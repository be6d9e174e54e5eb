// HostArena: one namespace's region of host DRAM, backed by a memfd so that
// clients can map the same pages (shared memory; DESIGN.md §4 tier T1).
//
// The arena is created sealed against shrinking (F_SEAL_SHRINK) so a client
// cannot truncate it under the daemon. Hugepages (MFD_HUGETLB) are tried
// first when asked for and the size is a multiple of 2 MiB; without them the
// arena falls back to normal pages, which hugepages_used() reports.
//
// Thread safety: immutable after Create(); the bytes themselves are
// synchronized by the tier that hands out extents.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tierkv/status.h"

namespace tierkv::storage {

struct HostArenaOptions {
  std::string name = "tierkv";  // memfd name, for /proc/<pid>/fd readers
  uint64_t bytes = 0;           // REQUIRES: > 0
  bool try_hugepages = true;    // Default: true; falls back silently
  // Fault every page in at creation, as written (common/shared_mapping.h),
  // so the memory is committed up front and the data path never takes a
  // page fault.
  bool prefault = true;  // Default: true
};

class HostArena {
 public:
  // Returns IOError (with errno text) when memfd/ftruncate/mmap fail.
  static Result<std::unique_ptr<HostArena>> Create(const HostArenaOptions& o);
  ~HostArena();

  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  int fd() const { return fd_; }  // owned; valid until destruction
  std::byte* base() const { return base_; }
  uint64_t size() const { return size_; }
  bool hugepages_used() const { return hugepages_; }

 private:
  HostArena(int fd, std::byte* base, uint64_t size, bool hugepages)
      : fd_(fd), base_(base), size_(size), hugepages_(hugepages) {}

  int fd_;
  std::byte* base_;
  uint64_t size_;
  bool hugepages_;
};

}  // namespace tierkv::storage
