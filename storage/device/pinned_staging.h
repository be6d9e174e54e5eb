// PinnedStaging: host memory pinned for the device once, lent out as bounce
// buffers for bytes that reach engines' device pools through the host (NVMe
// reads on their way into a device pool), so those copies are DMA at bus
// speed instead of going through the driver's pageable staging.
//
// Why an arena of its own: pinning (cudaHostRegister) costs about a
// millisecond per GiB and may not sit on a Load's path, so it is done once,
// at start, for a fixed size. Borrow never waits and never fails: when the
// arena has no room it lends ordinary heap memory (the copy is slower, not
// refused). A buffer goes back when its last owner drops it, which may be a
// quarantined release (device_quarantine.h) long after its transfer unit.
//
// Thread safety: thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "tierkv/status.h"

namespace tierkv::storage {

class DeviceBackend;

struct PinnedStagingStats {
  uint64_t capacity_bytes = 0;
  uint64_t in_use_bytes = 0;
  uint64_t pinned_borrows = 0;  // served from the pinned arena
  uint64_t heap_borrows = 0;    // the arena had no room: heap memory
};

class PinnedStaging {
 public:
  // A 4 KiB-aligned arena of `bytes` (rounded up to 4 KiB), registered with
  // `device`, which must outlive the staging: shared memory populated now
  // (O_DIRECT reads land in it faster than in heap memory), else the heap.
  // The device's refusal (e.g. a pinning limit) is returned: the owner goes
  // without.
  static Result<std::unique_ptr<PinnedStaging>> Create(DeviceBackend& device,
                                                       uint64_t bytes);
  // Unregisters and frees the arena once every buffer came back; a buffer
  // still out (a copy stuck on the device) keeps it, leaked on purpose.
  ~PinnedStaging();

  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  // `bytes` of host memory (4 KiB-aligned), pinned when the arena has room;
  // valid while `owner` (or a copy of it) lives.
  struct Buffer {
    std::span<std::byte> bytes;
    bool pinned = false;
    std::shared_ptr<void> owner;
  };
  Buffer Borrow(uint64_t bytes);

  PinnedStagingStats Stats() const;

 private:
  struct Arena;
  explicit PinnedStaging(std::shared_ptr<Arena> arena);
  const std::shared_ptr<Arena> arena_;
};

}  // namespace tierkv::storage
