// DeviceQuarantine (see device_quarantine.h).
#include "storage/device/device_quarantine.h"

#include <utility>

namespace tierkv::storage {

void DeviceQuarantine::Hold(DeviceBackend& device, DeviceEvent event,
                            std::function<void()> release) {
  MutexLock lock(&mu_);
  entries_.push_back({&device, event, std::move(release)});
  ++total_;
}

size_t DeviceQuarantine::Reap() {
  std::vector<std::function<void()>> due;
  {
    MutexLock lock(&mu_);
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->device->EventDone(it->event)) {
        due.push_back(std::move(it->release));
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& release : due) release();
  return due.size();
}

size_t DeviceQuarantine::Drain(std::chrono::milliseconds timeout) {
  std::vector<Entry> waiting;
  {
    MutexLock lock(&mu_);
    waiting.swap(entries_);
  }
  std::vector<Entry> stuck;
  for (Entry& e : waiting) {
    // The wait's own answer does not matter here: only whether the copies
    // are over, which EventDone then says.
    (void)e.device->WaitEvent(e.event, timeout);
    if (e.device->EventDone(e.event)) {
      e.release();
    } else {
      stuck.push_back(std::move(e));
    }
  }
  MutexLock lock(&mu_);
  const size_t left = stuck.size();
  for (Entry& e : stuck) entries_.push_back(std::move(e));
  return left;
}

size_t DeviceQuarantine::held() const {
  MutexLock lock(&mu_);
  return entries_.size();
}

uint64_t DeviceQuarantine::total() const {
  MutexLock lock(&mu_);
  return total_;
}

}  // namespace tierkv::storage
