// DeviceQuarantine: memory that device copies may still touch after their
// wait gave up.
//
// A WaitEvent that times out does not stop the copies it waited for: until
// the event is done they may still read host segments (which eviction
// would hand to another page), write reserved segments (which an Abort
// would free for reuse), and read or write HBM extents and bounce buffers.
// Releasing any of them at the timeout could put one page's bytes under
// another page's key. So the caller answers its request with the error at
// once, and hands what the copies name to the quarantine with the event;
// the release runs once the event is done, or the backend failed (then no
// copy runs any more: device_backend.h, Errors).
//
// Reap runs the releases that are due, outside the quarantine's lock (they
// take tier locks); tierkvd calls it before each device transfer unit and
// from Stats, so quarantined memory comes back without a thread of its own.
//
// Thread safety: thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/mutex.h"
#include "storage/device/device_backend.h"

namespace tierkv::storage {

class DeviceQuarantine {
 public:
  DeviceQuarantine() = default;
  DeviceQuarantine(const DeviceQuarantine&) = delete;
  DeviceQuarantine& operator=(const DeviceQuarantine&) = delete;
  // Runs nothing: the owner calls Drain first (see there).
  ~DeviceQuarantine() = default;

  // Keeps `release` until `event` of `device` is done. REQUIRES: `device`
  // outlives the entry (the owner drains before closing the backend).
  void Hold(DeviceBackend& device, DeviceEvent event,
            std::function<void()> release) EXCLUDES(mu_);

  // Runs every release whose event is done; returns how many ran.
  size_t Reap() EXCLUDES(mu_);

  // Reap, waiting up to `timeout` for each event still in flight (at
  // shutdown). Returns how many entries are still held: their memory must
  // stay mapped, as a copy may still touch it.
  size_t Drain(std::chrono::milliseconds timeout) EXCLUDES(mu_);

  size_t held() const EXCLUDES(mu_);
  // Entries ever held (a counter for tierkv_device_quarantined_total).
  uint64_t total() const EXCLUDES(mu_);

 private:
  struct Entry {
    DeviceBackend* device = nullptr;
    DeviceEvent event;
    std::function<void()> release;
  };

  mutable Mutex mu_;
  std::vector<Entry> entries_ GUARDED_BY(mu_);
  uint64_t total_ GUARDED_BY(mu_) = 0;
};

}  // namespace tierkv::storage
