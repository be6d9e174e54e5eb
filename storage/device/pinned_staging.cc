// PinnedStaging: the pinned bounce-buffer arena (see pinned_staging.h).
#include "storage/device/pinned_staging.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "common/mutex.h"
#include "common/shared_mapping.h"
#include "storage/alloc/extent_allocator.h"
#include "storage/device/device_backend.h"

namespace tierkv::storage {

namespace {

constexpr uint64_t kAlignment = 4096;

// The arena's memory: a shared memory file's pages, mapped and populated
// as if written (MapShared), or else heap memory. Why not the heap first:
// a cold weights load (2 GiB from NVMe through this arena into an emulated
// device pool, `tierkv-bench weights --cases cold`) ran at 1.44-1.69 GB/s
// with O_DIRECT reads into aligned_alloc'd memory, 2.06-2.29 GB/s with that
// memory written once ahead, and 2.58-2.65 GB/s into this mapping, the
// kind of memory the host arena and engines' memfd pools are (2-core VM).
struct ArenaMemory {
  std::byte* base = nullptr;
  bool mapped = false;  // munmap, else free
};

ArenaMemory MapArena(uint64_t bytes) {
  const int fd = ::memfd_create("tierkv-staging", MFD_CLOEXEC);
  if (fd >= 0) {
    void* base = ::ftruncate(fd, static_cast<off_t>(bytes)) == 0
                     ? MapShared(fd, bytes, /*prefault=*/true)
                     : MAP_FAILED;
    ::close(fd);  // the mapping keeps the file
    if (base != MAP_FAILED) return {static_cast<std::byte*>(base), true};
  }
  return {};
}

ArenaMemory HeapArena(uint64_t bytes) {
  return {static_cast<std::byte*>(std::aligned_alloc(kAlignment, bytes)),
          false};
}

void FreeArena(const ArenaMemory& memory, uint64_t bytes) {
  if (memory.mapped) {
    ::munmap(memory.base, bytes);
  } else {
    std::free(memory.base);
  }
}

}  // namespace

// Shared by the staging and every buffer it lent, so a buffer returned
// after the staging ended still finds its allocator.
struct PinnedStaging::Arena {
  Arena(DeviceBackend& d, ArenaMemory m, uint64_t n)
      : device(d),
        memory(m),
        base(m.base),
        bytes(n),
        allocator(n, kAlignment) {}

  DeviceBackend& device;
  const ArenaMemory memory;
  std::byte* const base;
  const uint64_t bytes;
  mutable Mutex mu;
  ExtentAllocator allocator GUARDED_BY(mu);
  uint64_t in_use GUARDED_BY(mu) = 0;
  uint64_t pinned_borrows GUARDED_BY(mu) = 0;
  uint64_t heap_borrows GUARDED_BY(mu) = 0;
};

Result<std::unique_ptr<PinnedStaging>> PinnedStaging::Create(
    DeviceBackend& device, uint64_t bytes) {
  bytes = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (bytes == 0) return Status::InvalidArgument("an empty staging arena");
  // The mapping first; heap memory where it cannot be had or the device
  // will not pin it (a driver may refuse to register a shared mapping).
  Status refused;
  for (ArenaMemory (*make)(uint64_t) : {&MapArena, &HeapArena}) {
    const ArenaMemory memory = make(bytes);
    if (memory.base == nullptr) continue;
    refused = device.RegisterHost({memory.base, bytes});
    if (refused.ok()) {
      return std::unique_ptr<PinnedStaging>(
          new PinnedStaging(std::make_shared<Arena>(device, memory, bytes)));
    }
    FreeArena(memory, bytes);
  }
  if (!refused.ok()) return refused;
  return Status::ResourceExhausted("no memory for the staging arena");
}

PinnedStaging::PinnedStaging(std::shared_ptr<Arena> arena)
    : arena_(std::move(arena)) {}

PinnedStaging::~PinnedStaging() {
  MutexLock lock(&arena_->mu);
  if (arena_->in_use != 0) return;  // see the header: kept, not freed
  (void)arena_->device.UnregisterHost(arena_->base);
  FreeArena(arena_->memory, arena_->bytes);
}

PinnedStaging::Buffer PinnedStaging::Borrow(uint64_t bytes) {
  const uint64_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  {
    MutexLock lock(&arena_->mu);
    if (auto extent = arena_->allocator.Allocate(rounded)) {
      arena_->in_use += extent->length;
      ++arena_->pinned_borrows;
      std::shared_ptr<void> owner(arena_->base + extent->offset,
                                  [arena = arena_, extent = *extent](void*) {
                                    MutexLock lock(&arena->mu);
                                    arena->allocator.Free(extent);
                                    arena->in_use -= extent.length;
                                  });
      return {{arena_->base + extent->offset, bytes}, true, std::move(owner)};
    }
    ++arena_->heap_borrows;
  }
  auto* heap = static_cast<std::byte*>(
      std::aligned_alloc(kAlignment, std::max(rounded, kAlignment)));
  if (heap == nullptr) return {};
  return {{heap, bytes}, false, std::shared_ptr<void>(heap, std::free)};
}

PinnedStagingStats PinnedStaging::Stats() const {
  MutexLock lock(&arena_->mu);
  return {arena_->bytes, arena_->in_use, arena_->pinned_borrows,
          arena_->heap_borrows};
}

}  // namespace tierkv::storage
