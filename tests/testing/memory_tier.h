// MemoryTier: a test-only tier below DRAM, in heap memory, with injected
// read latency. It is built from the Tier interface alone (plus the shared
// EvictionPolicy), which is the point: the extension test hands it to the
// engine through the placement and nothing in storage/, daemon/ or tools/
// knows it exists. A test double: it lives in tests/testing/.
//
// Reads complete on the tier's own thread, `read_latency` after they were
// issued (a remote tier's completion), so callers exercise the
// asynchronous path; writes, probes and evictions complete inline. Each
// namespace holds at most capacity_bytes; a write past that evicts the
// namespace's least recently used segments (an `lru` EvictionPolicy).
//
// Thread safety: thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "storage/policy/eviction_policy.h"
#include "storage/tier/tier.h"

namespace tierkv::testing {

class MemoryTier final : public storage::Tier {
 public:
  struct Options {
    std::string name = "slowmem";
    tierkv::Tier kind = tierkv::Tier::kPeer;
    bool persistent = false;
    std::chrono::microseconds read_latency{200};
    uint64_t capacity_bytes = uint64_t{64} << 20;  // per namespace
    // What policy() answers (readers' `policy` label); it evicts by LRU
    // whatever it says.
    std::string policy = "lru";
  };
  explicit MemoryTier(Options options);
  ~MemoryTier() override;  // completes queued reads first

  std::string_view name() const override { return options_.name; }
  std::string_view policy() const override { return options_.policy; }
  tierkv::Tier kind() const override { return options_.kind; }
  bool persistent() const override { return options_.persistent; }

  Status OpenNamespace(const storage::TierNamespace& ns) override;
  std::vector<uint64_t> Lookup(const storage::TierNamespace& ns,
                               uint64_t fingerprint,
                               std::span<const SegmentKey> keys) override;
  void Read(const storage::TierNamespace& ns, uint64_t fingerprint,
            std::span<const storage::TierReadItem> items,
            storage::TierReadDone done) override;
  void Write(const storage::TierNamespace& ns, uint64_t fingerprint,
             std::span<const storage::TierWriteItem> items,
             storage::Durability durability,
             storage::TierWriteDone done) override;
  std::vector<Status> Evict(const storage::TierNamespace& ns,
                            std::span<const SegmentKey> keys) override;
  Status Sync() override { return Status::OK(); }
  bool HasUnsyncedWrites() const override { return false; }
  void VisitCounters(storage::TierCounterVisitor& visitor) const override;
  void VisitNamespaceCounters(
      const storage::TierNamespace& ns,
      storage::TierCounterVisitor& visitor) const override;

  // Whether `key` of namespace `ns_id` is stored (any layout).
  bool Holds(uint32_t ns_id, const SegmentKey& key) const;

 private:
  struct Entry {
    std::vector<std::byte> bytes;
    uint64_t fingerprint = 0;
    storage::PolicyState policy;
  };
  struct Space {
    bool open = false;
    std::map<SegmentKey, Entry> entries;
    std::unique_ptr<storage::EvictionPolicy> lru;
    uint64_t bytes = 0;
  };
  struct PendingRead {
    std::chrono::steady_clock::time_point due;
    std::function<void()> complete;
  };
  Space* SpaceLocked(uint32_t ns_id) REQUIRES(mu_);
  uint64_t OpenSpacesLocked() const REQUIRES(mu_);
  void Erase(Space& space, std::map<SegmentKey, Entry>::iterator it)
      REQUIRES(mu_);
  void CompletionLoop() EXCLUDES(mu_);

  const Options options_;
  mutable Mutex mu_;
  CondVar reads_cv_;
  std::vector<Space> spaces_ GUARDED_BY(mu_);
  uint64_t clock_ GUARDED_BY(mu_) = 0;
  std::deque<PendingRead> reads_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  uint64_t lookups_
      GUARDED_BY(mu_) = 0,
      read_hits_ GUARDED_BY(mu_) = 0,
      read_misses_ GUARDED_BY(mu_) = 0, writes_ GUARDED_BY(mu_) = 0,
      write_dedup_ GUARDED_BY(mu_) = 0, evictions_ GUARDED_BY(mu_) = 0;
  std::thread completer_;  // last: starts once everything above exists
};

}  // namespace tierkv::testing
