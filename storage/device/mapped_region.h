// MappedRegion: a client's shared-memory region (a memfd passed with
// SCM_RIGHTS) mapped read-write into the daemon: an engine's KV pool, or its
// load tickets (DESIGN.md §5, registered-pool mode).
//
// A client owns the memfd and could otherwise shrink it under the daemon,
// whose next access would then fault (SIGBUS): Map() therefore demands the
// F_SEAL_SHRINK seal, and refuses regions sealed against writing or smaller
// than asked. The mapping lives as long as the last shared_ptr, so a worker
// still moving bytes keeps it valid after its client has gone.
//
// Thread safety: immutable after Map(); the bytes are the client's to
// synchronize (through LoadTicket).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "tierkv/status.h"

namespace tierkv::storage {

class MappedRegion {
 public:
  // Maps bytes [offset, offset + bytes) of memfd `fd` (the caller keeps its
  // descriptor). InvalidArgument naming the problem: not sealed against
  // shrinking, sealed against writes, smaller than offset + bytes, `bytes`
  // 0 or not a sealable file; IOError when mmap fails.
  //
  // With `prefault`, the mapping's page tables are filled now (one
  // madvise) when every page of the range is already allocated, so the
  // daemon's first copy into it takes no page faults: a registered pool
  // is mapped once and written by every Load after (318 MB of 4 KiB pages
  // fault ~78K times). A range with holes is left to fault lazily: filling
  // it would allocate the client's memory on the daemon's behalf.
  static Result<std::shared_ptr<MappedRegion>> Map(int fd, uint64_t offset,
                                                   uint64_t bytes,
                                                   bool prefault = false);
  static Result<std::shared_ptr<MappedRegion>> Map(int fd, uint64_t bytes) {
    return Map(fd, 0, bytes);
  }
  ~MappedRegion();

  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  // The range asked for (offset first).
  std::span<std::byte> bytes() const {
    return {mapping_ + lead_, size_ - lead_};
  }

 private:
  MappedRegion(std::byte* mapping, uint64_t size, uint64_t lead)
      : mapping_(mapping), size_(size), lead_(lead) {}
  std::byte* const mapping_;  // page-aligned
  const uint64_t size_;       // of the mapping
  const uint64_t lead_;       // offset - the page-aligned offset mapped
};

}  // namespace tierkv::storage
