// LeaseTable: who holds which segments, and until when.
//
// Every reference a client holds on a HostTier segment is recorded here as a
// lease with an owner (a connection id) and an expiry:
//   kRead  - a Get in progress: segments are referenced until Release;
//   kPin   - an explicit pin: same, with a caller-chosen TTL;
//   kWrite - a Put in progress: segments are reserved until Commit.
// A lease ends by Release (read/pin: drop references; write: abort what was
// not committed), by its owner disconnecting (ReleaseOwner) or by expiring
// (ExpireDue, called periodically). So a crashed or hung client can neither
// pin memory nor hold reserved space forever.
//
// Thread safety: thread-safe. Lock order: LeaseTable, then HostTier shards.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "storage/clock.h"
#include "storage/host_tier.h"

namespace tierkv::storage {

enum class LeaseKind : uint8_t { kRead = 0, kPin = 1, kWrite = 2 };

class LeaseTable {
 public:
  // `clock` is borrowed and must outlive the table.
  explicit LeaseTable(const Clock* clock) : clock_(clock) {}
  ~LeaseTable();  // releases every remaining lease

  LeaseTable(const LeaseTable&) = delete;
  LeaseTable& operator=(const LeaseTable&) = delete;

  // Records a lease over `keys`, whose references (read/pin) or reservations
  // (write) the caller has already taken on `tier` (borrowed; must outlive
  // the lease). Returns the new lease id (never 0).
  uint64_t Add(uint64_t owner, LeaseKind kind, HostTier* tier,
               std::vector<SegmentKey> keys, std::chrono::milliseconds ttl);

  // Ends a lease held by `owner`. NotFound when no such lease (expired
  // already, or someone else's).
  Status Release(uint64_t owner, uint64_t lease_id);

  // Commits `keys` of write lease `lease_id` (HostTier::Commit with
  // `dirty`), one Status per key: NotFound when a key is not (or no longer)
  // part of that lease of `owner`. The lease ends once every key is
  // committed.
  std::vector<Status> Commit(uint64_t owner, uint64_t lease_id,
                             std::span<const SegmentKey> keys,
                             bool dirty = false);

  // Ends every lease of `owner`; returns how many.
  size_t ReleaseOwner(uint64_t owner);

  // Ends every lease past its expiry; returns how many.
  size_t ExpireDue();

  size_t size() const;

 private:
  struct Lease {
    uint64_t owner;
    LeaseKind kind;
    HostTier* tier;  // borrowed
    std::vector<SegmentKey> keys;
    Clock::TimePoint expires;
  };
  static void EndLease(Lease& lease);

  const Clock* clock_;
  mutable Mutex mu_;
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  std::unordered_map<uint64_t, Lease> leases_ GUARDED_BY(mu_);
};

}  // namespace tierkv::storage
