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
  // Maps the first `bytes` of memfd `fd` (duplicated; the caller keeps its
  // own). InvalidArgument naming the problem: not sealed against shrinking,
  // sealed against writes, smaller than `bytes`, `bytes` 0 or not a
  // sealable file; IOError when mmap fails.
  static Result<std::shared_ptr<MappedRegion>> Map(int fd, uint64_t bytes);
  ~MappedRegion();

  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  std::span<std::byte> bytes() const { return {base_, size_}; }

 private:
  MappedRegion(std::byte* base, uint64_t size) : base_(base), size_(size) {}
  std::byte* const base_;
  const uint64_t size_;
};

}  // namespace tierkv::storage
