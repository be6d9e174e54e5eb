// PinnedStaging: the pinned bounce-buffer arena (see pinned_staging.h).
#include "storage/device/pinned_staging.h"

#include <algorithm>
#include <cstdlib>

#include "common/mutex.h"
#include "storage/alloc/extent_allocator.h"
#include "storage/device/device_backend.h"

namespace tierkv::storage {

namespace {
constexpr uint64_t kAlignment = 4096;
}  // namespace

// Shared by the staging and every buffer it lent, so a buffer returned
// after the staging ended still finds its allocator.
struct PinnedStaging::Arena {
  Arena(DeviceBackend& d, std::byte* b, uint64_t n)
      : device(d), base(b), bytes(n), allocator(n, kAlignment) {}

  DeviceBackend& device;
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
  auto* base = static_cast<std::byte*>(std::aligned_alloc(kAlignment, bytes));
  if (base == nullptr) {
    return Status::ResourceExhausted("no memory for the staging arena");
  }
  if (Status s = device.RegisterHost({base, bytes}); !s.ok()) {
    std::free(base);
    return s;
  }
  return std::unique_ptr<PinnedStaging>(
      new PinnedStaging(std::make_shared<Arena>(device, base, bytes)));
}

PinnedStaging::PinnedStaging(std::shared_ptr<Arena> arena)
    : arena_(std::move(arena)) {}

PinnedStaging::~PinnedStaging() {
  MutexLock lock(&arena_->mu);
  if (arena_->in_use != 0) return;  // see the header: kept, not freed
  (void)arena_->device.UnregisterHost(arena_->base);
  std::free(arena_->base);
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
