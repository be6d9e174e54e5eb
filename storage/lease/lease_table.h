// LeaseTable: who holds which segments, and until when.
//
// Every reference a client holds on a leased tier's segment (host DRAM, HBM:
// storage/tier/leased_tier.h) is recorded here as a lease with an owner (a
// connection id) and an expiry:
//   kRead  - a Get in progress: segments are referenced until Release;
//   kPin   - an explicit pin: same, with a caller-chosen TTL;
//   kWrite - a Put in progress: segments are reserved until Commit.
// A lease ends by Release (read/pin: drop references; write: abort what was
// not committed), by its owner disconnecting (ReleaseOwner) or by expiring
// (ExpireDue, called periodically). So a crashed or hung client can neither
// pin memory nor hold reserved space forever.
//
// Limits (LeaseLimits) bound what one owner, and all owners of one tier
// (namespace) together, may hold at once, in leases, segments and bytes:
// Room() says how many more segments a request may lease, FitBytes() how
// many of them fit the byte limits, and callers answer the rest
// ResourceExhausted. So no client can make the daemon hold an unbounded
// lease table by leasing without releasing (leases otherwise live until
// their TTL), nor pin so much of a namespace's DRAM that its other clients
// cannot store. Requests of one owner admitted at the same moment may
// overshoot by their own sizes; nothing grows beyond that.
//
// Thread safety: thread-safe. Lock order: LeaseTable, then the tier's locks.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "storage/clock.h"
#include "storage/tier/leased_tier.h"

namespace tierkv::storage {

enum class LeaseKind : uint8_t { kRead = 0, kPin = 1, kWrite = 2 };

struct LeaseLimits {
  // Leases one owner (a connection) holds at once. Default: 4096.
  size_t max_leases_per_owner = 4096;
  // Segments those leases cover. Default: 1,048,576 (~24 MiB of keys).
  size_t max_segments_per_owner = size_t{1} << 20;
  // Segments all owners of one tier (a namespace) cover together.
  // Default: 4,194,304.
  size_t max_segments_per_tier = size_t{4} << 20;
  // Bytes of those segments (referenced for reading or pinning, reserved
  // for writing), in percent of the tier's capacity: what one owner may
  // hold (Default: 50), and all owners of the tier together (Default: 90,
  // so a tenth of the tier stays evictable for new writes). 1..100.
  uint32_t max_bytes_percent_per_owner = 50;
  uint32_t max_bytes_percent_per_tier = 90;
};

// A segment a lease covers, with its size (for the byte limits).
struct LeasedSegment {
  SegmentKey key;
  uint64_t bytes = 0;
};

class LeaseTable {
 public:
  // `clock` is borrowed and must outlive the table.
  explicit LeaseTable(const Clock* clock, LeaseLimits limits = {})
      : clock_(clock), limits_(limits) {}
  ~LeaseTable();  // releases every remaining lease

  LeaseTable(const LeaseTable&) = delete;
  LeaseTable& operator=(const LeaseTable&) = delete;

  // Records a lease over `segments`, whose references (read/pin) or
  // reservations (write) the caller has already taken on `tier` (borrowed;
  // must outlive the lease). Returns the new lease id (never 0).
  uint64_t Add(uint64_t owner, LeaseKind kind, LeasedTier* tier,
               std::vector<LeasedSegment> segments,
               std::chrono::milliseconds ttl);

  // Ends a lease held by `owner`. NotFound when no such lease (expired
  // already, or someone else's).
  Status Release(uint64_t owner, uint64_t lease_id);

  // Commits `keys` of write lease `lease_id` (LeasedTier::Commit with
  // `dirty`), in the order they were reserved, or the reverse with
  // `last_first`; one Status per key: NotFound when a key is not (or no
  // longer) part of that lease of `owner`. The lease ends once every key
  // is committed.
  std::vector<Status> Commit(uint64_t owner, uint64_t lease_id,
                             std::span<const SegmentKey> keys,
                             bool dirty = false, bool last_first = false);

  // Drops `keys` from write lease `lease_id` of `owner`, aborting their
  // reservations (LeasedTier::Abort), so they are never committed: keys
  // whose bytes failed a check. Keys not in that lease are skipped. The
  // lease ends once no key is left.
  void Abort(uint64_t owner, uint64_t lease_id,
             std::span<const SegmentKey> keys) EXCLUDES(mu_);

  // Ends every lease of `owner`; returns how many.
  size_t ReleaseOwner(uint64_t owner);

  // Ends every lease past its expiry; returns how many.
  size_t ExpireDue();

  size_t size() const;

  // How many of `want` more segments `owner` may lease on `tier` now,
  // within every limit (0 when it holds max_leases_per_owner leases).
  // Sets *limit_name to the limit that bites (for messages) when < want.
  size_t Room(uint64_t owner, const LeasedTier* tier, size_t want,
              const char** limit_name = nullptr) const EXCLUDES(mu_);
  // How many of `sizes` (a request's segments, in order) fit in the bytes
  // the limits leave `owner` on `tier` now; *limit_name as for Room.
  size_t FitBytes(uint64_t owner, const LeasedTier* tier,
                  std::span<const uint64_t> sizes,
                  const char** limit_name = nullptr) const EXCLUDES(mu_);
  // Leases, segments and bytes `owner` holds now.
  size_t leases_of(uint64_t owner) const EXCLUDES(mu_);
  size_t segments_of(uint64_t owner) const EXCLUDES(mu_);
  uint64_t bytes_of(uint64_t owner) const EXCLUDES(mu_);
  // Leases held on `tier` (one namespace's), by every owner.
  size_t leases_on(const LeasedTier* tier) const EXCLUDES(mu_);

  const LeaseLimits& limits() const { return limits_; }

 private:
  struct Lease {
    uint64_t owner;
    LeaseKind kind;
    LeasedTier* tier;  // borrowed
    std::vector<LeasedSegment> segments;
    Clock::TimePoint expires;
  };
  struct Usage {
    size_t leases = 0;
    size_t segments = 0;
    uint64_t bytes = 0;
    Usage& operator+=(const Usage& d) {
      leases += d.leases;  // unsigned wrap-around: a negated delta subtracts
      segments += d.segments;
      bytes += d.bytes;
      return *this;
    }
    Usage operator-() const { return {0 - leases, 0 - segments, 0 - bytes}; }
    bool empty() const { return leases == 0 && segments == 0 && bytes == 0; }
  };
  // A usage delta of `segments` (and `leases` leases).
  static Usage UsageOf(std::span<const LeasedSegment> segments, size_t leases);
  // Drops the lease's references (read/pin) or reservations (write) and
  // its segments from the usage counts; the caller erases it.
  void EndLease(Lease& lease) REQUIRES(mu_);
  // Ends and erases every lease `ends` selects; how many.
  size_t EndLeasesLocked(const std::function<bool(const Lease&)>& ends)
      REQUIRES(mu_);
  void Account(uint64_t owner, const LeasedTier* tier, const Usage& delta)
      REQUIRES(mu_);

  const Clock* clock_;
  const LeaseLimits limits_;
  mutable Mutex mu_;
  std::unordered_map<uint64_t, Usage> owners_ GUARDED_BY(mu_);
  std::unordered_map<const LeasedTier*, Usage> tiers_ GUARDED_BY(mu_);
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  std::unordered_map<uint64_t, Lease> leases_ GUARDED_BY(mu_);
};

}  // namespace tierkv::storage
