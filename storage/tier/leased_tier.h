// LeasedTier: one namespace's share of a tier whose segments clients address
// directly (host DRAM through the shared arena, HBM through the device
// pool), so the lease table, the engine's leased paths and the mover's
// write-back use one interface for both, and a third such tier (CXL memory,
// a peer's registered memory) is an addition.
//
// Why not a Tier: a Tier moves bytes itself (Read/Write copy into and out of
// the caller's buffers, on the tier's threads). Here the bytes never pass
// through the tier: it hands out places (Reserve, Acquire), someone else
// copies (a client's memcpy into the arena, a device stream), and the tier
// only learns the outcome (Commit, Abort, Release). What it must track is
// therefore a segment's state, not IO:
//
//   Reserve --> reserved --Commit--> committed (evictable unless referenced)
//                  |                     ^  |
//                Abort                   |  Acquire ... Release
//                  v                     +--+
//               (gone)
//
// and, for a tier that may hold a segment's only copy, which committed
// segments are dirty (must reach a lower tier before eviction: TakeDirty,
// FinishPersist). Every call names one segment: callers loop over their
// batches.
//
// One object per namespace: tiers that keep one structure for every
// namespace (HBM) hand out per-namespace views.
//
// Thread safety: implementations are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "storage/clock.h"
#include "storage/tier/tier.h"
#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv::storage {

// Where a segment's bytes are in the tier's address space (an arena offset,
// a pool offset) and how many there are.
struct SegmentLocation {
  uint64_t offset = 0;
  uint64_t size = 0;
  // Bytes the segment owns from `offset`, at least `size` (its extent,
  // rounded to the tier's alignment); 0 when unknown (take `size`).
  uint64_t extent = 0;

  // The bytes at `offset` that belong to the segment: its extent, or
  // `size` when that is unknown.
  uint64_t owned_bytes() const { return extent > size ? extent : size; }
};

struct Reservation {
  // Where to write the bytes before Commit; meaningless if already_stored.
  SegmentLocation location;
  // Dedup: the key was committed before. Nothing was reserved; do not
  // Commit or Abort.
  bool already_stored = false;
};

// A committed dirty segment handed to write-back (TakeDirty).
struct DirtySegment {
  SegmentKey key;
  SegmentLocation location;
};

class LeasedTier {
 public:
  virtual ~LeasedTier() = default;

  // The tier's name in stats and metrics ("host", "hbm").
  virtual std::string_view name() const = 0;
  // The eviction policy ordering this namespace's share ("lru").
  virtual std::string_view policy() const = 0;
  // Bytes this namespace may hold here: the lease table's byte limits are
  // fractions of it.
  virtual uint64_t capacity_bytes() const = 0;

  // Claims `key` and `size` bytes of room for it, evicting clean segments
  // as needed. Returns where to put the bytes, or already_stored (a
  // success: nothing reserved). Busy: another writer holds `key`, or only
  // dirty segments are left to evict (retry after write-back);
  // InvalidArgument: size 0 or larger than the tier; ResourceExhausted: no
  // room can be made.
  virtual Result<Reservation> Reserve(const SegmentKey& key, uint64_t size) = 0;
  // The reserved bytes are in place: the segment can be hit. `dirty`: it
  // must be persisted below before eviction (a tier that only ever holds
  // copies answers InvalidArgument and drops the reservation). `acquire`:
  // referenced at once, as by Acquire (Release it), so it is never evictable
  // between its commit and its first read. NotFound when `key` is not reserved.
  virtual Status Commit(const SegmentKey& key, bool dirty = false,
                        bool acquire = false) = 0;
  // Drops a reservation and frees its room; no-op unless `key` is reserved.
  virtual void Abort(const SegmentKey& key) = 0;

  // References a committed segment (not evictable until Release); a use of
  // it. NotFound when absent or not committed.
  virtual Result<SegmentLocation> Acquire(const SegmentKey& key) = 0;
  // Drops a reference taken by Acquire or Commit(acquire); the last one
  // makes the segment evictable again, as just used.
  // REQUIRES: a matching Acquire.
  virtual void Release(const SegmentKey& key) = 0;

  // Up to `max_items` / `max_bytes` (at least one when any qualifies) of
  // the least recently used unreferenced dirty segments, which stay
  // unevictable and are not taken again until FinishPersist. With
  // `only_needed`, only while the tier is short of clean room. A tier
  // without dirty segments returns none.
  virtual std::vector<DirtySegment> TakeDirty(size_t max_items,
                                              uint64_t max_bytes,
                                              bool only_needed) = 0;
  // Ends a TakeDirty of `key`: `persisted` makes it clean; otherwise it
  // stays dirty when `retry`, else it is made clean unpersisted.
  virtual void FinishPersist(const SegmentKey& key, bool persisted,
                             bool retry) = 0;

  // The bytes at `at` when the tier's address space is this process's
  // memory (host DRAM): what the mover writes below and promotes into.
  // Empty for memory the CPU cannot address (a device pool): such a tier
  // is served by device copies only.
  virtual std::span<std::byte> HostBytes(const SegmentLocation& at) const {
    (void)at;
    return {};
  }

  // A reason to retry a Busy answer: Generation() advances when a segment
  // is committed, aborted or finishes a write-back; read it before the
  // call that answered Busy, then WaitChange() until it differs from
  // `seen` or `clock` reaches `deadline` (false then). Default: a tier
  // without such notifications, whose waits end at once (false).
  virtual uint64_t Generation() const { return 0; }
  virtual bool WaitChange(uint64_t seen, const Clock& clock,
                          Clock::TimePoint deadline) const {
    (void)seen;
    (void)clock;
    (void)deadline;
    return false;
  }

  // This namespace's share of the tier, in the tier counter vocabulary
  // (tier_counters.h).
  virtual void VisitCounters(TierCounterVisitor& visitor) const = 0;
};

}  // namespace tierkv::storage
