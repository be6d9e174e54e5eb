// MemoryTier: a heap-memory tier with injected read latency (see
// memory_tier.h).
#include "tests/testing/memory_tier.h"

#include <cstring>

namespace tierkv::testing {

using storage::LinkAt;

MemoryTier::MemoryTier(Options options)
    : options_(std::move(options)), completer_([this] { CompletionLoop(); }) {}

MemoryTier::~MemoryTier() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  reads_cv_.SignalAll();
  completer_.join();
}

Status MemoryTier::OpenNamespace(const storage::TierNamespace& ns) {
  MutexLock lock(&mu_);
  if (spaces_.size() <= ns.id) spaces_.resize(ns.id + 1);
  Space& space = spaces_[ns.id];
  space.open = true;
  if (!space.lru)
    space.lru = storage::NewEvictionPolicy(storage::EvictionPolicyKind::kLru);
  return Status::OK();
}

MemoryTier::Space* MemoryTier::SpaceLocked(uint32_t ns_id) {
  if (ns_id >= spaces_.size() || !spaces_[ns_id].open) return nullptr;
  return &spaces_[ns_id];
}

std::vector<uint64_t> MemoryTier::Lookup(const storage::TierNamespace& ns,
                                         uint64_t fingerprint,
                                         std::span<const SegmentKey> keys) {
  std::vector<uint64_t> out(keys.size(), 0);
  MutexLock lock(&mu_);
  ++lookups_;  // one lock per batch, as the interface asks
  Space* space = SpaceLocked(ns.id);
  if (space == nullptr) return out;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = space->entries.find(keys[i]);
    if (it != space->entries.end() && it->second.fingerprint == fingerprint) {
      out[i] = it->second.bytes.size();
    }
  }
  return out;
}

void MemoryTier::Read(const storage::TierNamespace& ns, uint64_t fingerprint,
                      std::span<const storage::TierReadItem> items,
                      storage::TierReadDone done) {
  std::vector<storage::TierReadItem> batch(items.begin(), items.end());
  const uint32_t ns_id = ns.id;
  auto complete = [this, ns_id, fingerprint, batch = std::move(batch),
                   done = std::move(done)] {
    std::vector<Result<uint64_t>> out;
    {
      MutexLock lock(&mu_);
      Space* space = SpaceLocked(ns_id);
      for (const storage::TierReadItem& item : batch) {
        auto it = space ? space->entries.find(item.key)
                        : std::map<SegmentKey, Entry>::iterator{};
        if (space == nullptr || it == space->entries.end() ||
            it->second.fingerprint != fingerprint) {
          ++read_misses_;
          out.push_back(Status::NotFound("not in the memory tier"));
          continue;
        }
        const std::vector<std::byte>& bytes = it->second.bytes;
        if (item.dst.size() < bytes.size()) {
          out.push_back(Status::InvalidArgument("dst smaller than segment"));
          continue;
        }
        std::memcpy(item.dst.data(), bytes.data(), bytes.size());
        space->lru->Use(it->second.policy, ++clock_);
        ++read_hits_;
        out.push_back(bytes.size());
      }
    }
    done(std::move(out));
  };
  {
    MutexLock lock(&mu_);
    reads_.push_back({std::chrono::steady_clock::now() + options_.read_latency,
                      std::move(complete)});
  }
  reads_cv_.Signal();
}

void MemoryTier::CompletionLoop() {
  MutexLock lock(&mu_);
  while (true) {
    while (!stopping_ && reads_.empty()) reads_cv_.Wait(&mu_);
    if (reads_.empty()) return;  // stopping, nothing left to complete
    const auto due = reads_.front().due;
    // The injected latency: a timed wait, woken early only to stop.
    if (!stopping_ && std::chrono::steady_clock::now() < due) {
      (void)reads_cv_.WaitUntil(&mu_, due);
      continue;
    }
    std::function<void()> complete = std::move(reads_.front().complete);
    reads_.pop_front();
    lock.Unlock();
    complete();
    lock.Lock();
  }
}

void MemoryTier::Erase(Space& space, std::map<SegmentKey, Entry>::iterator it) {
  if (it->second.policy.linked) space.lru->Unlink(it->second.policy);
  space.bytes -= it->second.bytes.size();
  space.entries.erase(it);
}

void MemoryTier::Write(const storage::TierNamespace& ns, uint64_t fingerprint,
                       std::span<const storage::TierWriteItem> items,
                       storage::Durability, storage::TierWriteDone done) {
  std::vector<Status> out;
  {
    MutexLock lock(&mu_);
    Space* space = SpaceLocked(ns.id);
    for (const storage::TierWriteItem& item : items) {
      if (space == nullptr) {
        out.push_back(Status::InvalidArgument("namespace not opened"));
        continue;
      }
      const uint64_t size = item.data.size();
      if (size == 0 || size > options_.capacity_bytes) {
        out.push_back(Status::InvalidArgument("empty or oversized segment"));
        continue;
      }
      auto it = space->entries.find(item.key);
      if (it != space->entries.end()) {
        if (it->second.fingerprint == fingerprint &&
            it->second.bytes.size() == size) {
          ++write_dedup_;
          space->lru->Use(it->second.policy, ++clock_);
          out.push_back(Status::AlreadyExists("stored before"));
          continue;
        }
        Erase(*space, it);  // another layout or size: replaced
      }
      while (space->bytes + size > options_.capacity_bytes) {
        storage::PolicyState* victim = space->lru->Victim();
        space->lru->Unlink(*victim);
        space->lru->Evicted(*victim);
        ++evictions_;
        Erase(*space, space->entries.find(victim->key));
      }
      Entry& e = space->entries[item.key];
      e.bytes.assign(item.data.begin(), item.data.end());
      e.fingerprint = fingerprint;
      e.policy.key = item.key;
      e.policy.bytes = size;
      space->bytes += size;
      const uint64_t now = ++clock_;
      space->lru->Admit(e.policy, now);
      space->lru->Link(e.policy, now, LinkAt::kNow);
      ++writes_;
      out.push_back(Status::OK());
    }
  }
  done(std::move(out));
}

std::vector<Status> MemoryTier::Evict(const storage::TierNamespace& ns,
                                      std::span<const SegmentKey> keys) {
  std::vector<Status> out;
  MutexLock lock(&mu_);
  Space* space = SpaceLocked(ns.id);
  for (const SegmentKey& key : keys) {
    auto it = space ? space->entries.find(key)
                    : std::map<SegmentKey, Entry>::iterator{};
    if (space == nullptr || it == space->entries.end()) {
      out.push_back(Status::NotFound("not in the memory tier"));
      continue;
    }
    Erase(*space, it);
    ++evictions_;
    out.push_back(Status::OK());
  }
  return out;
}

bool MemoryTier::Holds(uint32_t ns_id, const SegmentKey& key) const {
  MutexLock lock(&mu_);
  return ns_id < spaces_.size() && spaces_[ns_id].entries.count(key) > 0;
}

void MemoryTier::VisitCounters(storage::TierCounterVisitor& v) const {
  MutexLock lock(&mu_);
  uint64_t segments = 0, bytes = 0;
  for (const Space& space : spaces_) {
    segments += space.entries.size();
    bytes += space.bytes;
  }
  v.Gauge("segments", static_cast<double>(segments));
  v.Gauge("used_bytes", static_cast<double>(bytes));
  v.Gauge("capacity_bytes",
          static_cast<double>(options_.capacity_bytes * OpenSpacesLocked()));
  v.Counter("lookups", lookups_);
  v.Counter("read_hits", read_hits_);
  v.Counter("read_misses", read_misses_);
  v.Counter("writes", writes_);
  v.Counter("write_dedup", write_dedup_);
  v.Counter("evictions", evictions_);
}

void MemoryTier::VisitNamespaceCounters(const storage::TierNamespace& ns,
                                        storage::TierCounterVisitor& v) const {
  MutexLock lock(&mu_);
  if (ns.id >= spaces_.size() || !spaces_[ns.id].open) return;
  const Space& space = spaces_[ns.id];
  v.Gauge("capacity_bytes", static_cast<double>(options_.capacity_bytes));
  v.Gauge("used_bytes", static_cast<double>(space.bytes));
  v.Gauge("segments", static_cast<double>(space.entries.size()));
}

uint64_t MemoryTier::OpenSpacesLocked() const {
  uint64_t open = 0;
  for (const Space& space : spaces_) open += space.open;
  return open;
}

}  // namespace tierkv::testing
