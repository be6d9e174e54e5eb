// StagingPool: a small pool of pre-faulted mmap regions (see staging_pool.h).
#include "storage/nvme/staging_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <vector>

#include "common/mutex.h"

namespace tierkv::storage {
namespace {

// Regions are sized in powers of two from 1 MiB, so that batches of
// slightly different sizes (27 and 28 MiB of a 32 MiB demotion batch) reuse
// the same region instead of replacing it.
constexpr uint64_t kMinRegionBytes = uint64_t{1} << 20;

struct Region {
  std::byte* base = nullptr;
  uint64_t size = 0;
};

void Unmap(const Region& r) { ::munmap(r.base, r.size); }

}  // namespace

struct StagingPool::State {
  explicit State(uint64_t max) : max_pooled_bytes(max) {}
  ~State() {
    for (const Region& r : free) Unmap(r);
  }

  const uint64_t max_pooled_bytes;
  mutable Mutex mu;
  std::vector<Region> free GUARDED_BY(mu);  // ascending by size
  uint64_t pooled_bytes GUARDED_BY(mu) = 0;

  // Keeps `r` if the cap allows, making room by dropping smaller regions
  // (batches that large are what is asked for now); else unmaps it.
  void Give(Region r) {
    std::vector<Region> dropped;
    {
      MutexLock lock(&mu);
      while (pooled_bytes + r.size > max_pooled_bytes && !free.empty() &&
             free.front().size < r.size) {
        pooled_bytes -= free.front().size;
        dropped.push_back(free.front());
        free.erase(free.begin());
      }
      if (pooled_bytes + r.size <= max_pooled_bytes) {
        free.insert(std::upper_bound(free.begin(), free.end(), r,
                                     [](const Region& a, const Region& b) {
                                       return a.size < b.size;
                                     }),
                    r);
        pooled_bytes += r.size;
      } else {
        dropped.push_back(r);
      }
    }
    for (const Region& d : dropped) Unmap(d);
  }
};

StagingPool::StagingPool(uint64_t max_pooled_bytes)
    : state_(std::make_shared<State>(max_pooled_bytes)) {}

StagingPool::~StagingPool() = default;

IoBuffer StagingPool::Take(uint64_t bytes) {
  if (bytes == 0) return {};
  const uint64_t size = std::bit_ceil(std::max(bytes, kMinRegionBytes));
  Region region;
  {
    MutexLock lock(&state_->mu);
    // Exactly this size class: a small read never takes (and so starves)
    // a demotion batch's region, nor the reverse.
    auto& free = state_->free;
    auto it = std::find_if(free.begin(), free.end(),
                           [&](const Region& r) { return r.size == size; });
    if (it != free.end()) {
      region = *it;
      free.erase(it);
      state_->pooled_bytes -= region.size;
    }
  }
  if (region.base == nullptr) {
    // Pre-faulted once here, then reused: no fault on the data path.
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) return {};
    region = {static_cast<std::byte*>(p), size};
  }
  std::shared_ptr<void> owner(
      region.base, [state = state_, region](void*) { state->Give(region); });
  return IoBuffer(region.base, region.size, std::move(owner));
}

uint64_t StagingPool::pooled_bytes() const {
  MutexLock lock(&state_->mu);
  return state_->pooled_bytes;
}

}  // namespace tierkv::storage
