// Tier: the interface every level of storage below a namespace's host DRAM
// implements (NVMe, a peer node, a test tier), so a new tier is an addition
// (a class and a placement entry), not edits through the engine.
//
// Shape (after CacheLib navy's Engine, RocksDB's SecondaryCache and Mooncake
// store's StorageBackendInterface):
//   * every call is batched and answers one result per item, in order;
//   * one result convention for every tier (below), so callers never learn
//     a tier's private dialect of dedup and misses;
//   * reads and writes are completion based: `done` runs once, either on
//     the caller's thread before the call returns (a tier whose IO is
//     synchronous today, or an all-miss batch) or on a thread of the tier's
//     own; callers must not assume which, and `done` must not block;
//   * namespaces are resolved once, by the engine, to a TierNamespace whose
//     dense `id` every tier keys by (no per-call name lookups).
//
// Results:
//   Lookup  the stored segment's length, 0 when absent (segments are never
//           empty) or stored under another layout fingerprint. Not a use:
//           probing never changes a tier's eviction order.
//   Read    the segment's length, its bytes at the front of item.dst; or
//             NotFound          a miss: absent, another layout, or its bytes
//                               failed verification (never wrong bytes);
//             InvalidArgument   item.dst is smaller than the segment;
//             ResourceExhausted no memory to stage the read;
//             IOError           the tier failed (the segment stays stored).
//           A read is a use (the tier's eviction order sees it).
//   Write   OK: stored now; AlreadyExists: the same key, layout and size was
//           stored before (dedup: nothing copied, still a success); Busy:
//           another write of the key is in flight (retry); InvalidArgument:
//           empty or oversized; ResourceExhausted: no room even after
//           evicting; IOError: the tier failed (nothing stored earlier is
//           lost). A key stored under another layout or size is replaced.
//   Evict   OK, or NotFound when the segment was not stored.
//
// Thread safety: implementations are thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "storage/policy/schedule_standing.h"
#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv::storage {

// A namespace as every tier sees it.
struct TierNamespace {
  // Dense, assigned by the engine (0, 1, ...): tiers index per-namespace
  // state by it.
  uint32_t id = 0;
  // For tiers that persist names (NVMe's catalog maps it to its own id at
  // OpenNamespace) and for logs.
  std::string name;
};

// Whether a Write is durable (power-loss safe) when it completes, or only
// crash safe until the next Sync(). Tiers without such a distinction treat
// both alike.
enum class Durability { kDurable, kDeferred };

// A Read's `dst` aligned to this many bytes, with room for the segment
// rounded up to a multiple of it, lets a tier that moves whole blocks
// (O_DIRECT NVMe) read in place instead of through a buffer of its own;
// the same holds for a Write's source and TierWriteItem::readable_bytes.
inline constexpr uint64_t kTierBlockBytes = 4096;

// One segment to read: up to dst.size() bytes land at the front of `dst`,
// which is borrowed until `done` ran.
struct TierReadItem {
  SegmentKey key;
  std::span<std::byte> dst;
};

// One segment to write: `data` is borrowed until `done` ran.
struct TierWriteItem {
  SegmentKey key;
  std::span<const std::byte> data;
  // Bytes readable from data.data(), at least data.size() (the source's
  // whole extent, say): a tier that writes whole blocks may then write
  // them straight from the source, past the segment's end, instead of
  // copying the segment into a padded buffer. The padding is not part of
  // the segment and never read back as such. 0: data.size().
  uint64_t readable_bytes = 0;
};

using TierReadDone = std::function<void(std::vector<Result<uint64_t>>)>;
using TierWriteDone = std::function<void(std::vector<Status>)>;

// Receives a tier's counters (VisitCounters): names are snake_case without
// the tier's name (the reader adds it: stats JSON keys, metric labels).
// Readers map a few well-known names onto their own families (see
// tier_counters.h, "Vocabulary"); every name reaches the stats JSON and the
// generic metric families, so a new tier needs no reader edits.
class TierCounterVisitor {
 public:
  virtual ~TierCounterVisitor() = default;
  // A count that only grows while the tier lives (reads, evictions).
  virtual void Counter(std::string_view name, uint64_t value) = 0;
  // A level now (bytes used, segments held, a ratio).
  virtual void Gauge(std::string_view name, double value) = 0;
  // A yes/no state now (read_only, hugepages). Default: a 0/1 Gauge.
  virtual void Flag(std::string_view name, bool value) {
    Gauge(name, value ? 1.0 : 0.0);
  }
};

class Tier {
 public:
  virtual ~Tier() = default;

  // The tier's name in placement, stats, metrics and logs: lower case, one
  // word, unique in a chain ("nvme", "peer").
  virtual std::string_view name() const = 0;
  // The eviction policy ordering the tier ("lru"): the `policy` label of
  // its metrics.
  virtual std::string_view policy() const = 0;
  // How the public API reports a page served from here (EngineMatch).
  virtual tierkv::Tier kind() const = 0;
  // Whether what it stores survives a restart of the daemon (a Flush
  // target must).
  virtual bool persistent() const = 0;
  // Whether it holds other nodes' copies rather than this node's own (the
  // peer tier). A read on a peer's behalf skips such tiers (TierScope), so
  // a node serves only what it holds and a fetch never hops onwards.
  // Default: false.
  virtual bool remote() const { return false; }

  // Called once per namespace before any other call names it. An error
  // keeps the namespace out of this tier (its calls then miss) and is
  // reported by the caller.
  virtual Status OpenNamespace(const TierNamespace& ns) = 0;

  // Batched probe, one lock acquisition (or the tier's equivalent) per
  // call: the stored length of each key under `fingerprint`, 0 if absent.
  virtual std::vector<uint64_t> Lookup(const TierNamespace& ns,
                                       uint64_t fingerprint,
                                       std::span<const SegmentKey> keys) = 0;

  // Reads `items` stored under `fingerprint`; `done` gets one result per
  // item (see Results above).
  // REQUIRES: the items' dst ranges do not overlap.
  virtual void Read(const TierNamespace& ns, uint64_t fingerprint,
                    std::span<const TierReadItem> items, TierReadDone done) = 0;

  // Stores `items` under `fingerprint`; `done` gets one Status per item.
  virtual void Write(const TierNamespace& ns, uint64_t fingerprint,
                     std::span<const TierWriteItem> items,
                     Durability durability, TierWriteDone done) = 0;

  // Drops segments (any layout); one Status per key.
  virtual std::vector<Status> Evict(const TierNamespace& ns,
                                    std::span<const SegmentKey> keys) = 0;

  // Makes every write acknowledged so far durable. OK when there was
  // nothing to do.
  virtual Status Sync() = 0;
  // Deferred writes acknowledged and not yet covered by a Sync.
  virtual bool HasUnsyncedWrites() const = 0;

  // Reports every counter of the tier (over all its namespaces) to
  // `visitor`.
  virtual void VisitCounters(TierCounterVisitor& visitor) const = 0;
  // Reports namespace `ns`'s own share of the tier (its segments, bytes,
  // quota, evictions), in the same vocabulary, for a tier that keeps
  // namespaces apart. Default: nothing (the tier keeps no such share).
  virtual void VisitNamespaceCounters(const TierNamespace& ns,
                                      TierCounterVisitor& visitor) const {
    (void)ns;
    (void)visitor;
  }

  // A weights catalog's chunk standings for namespace `ns`
  // (EvictionPolicy::SetSchedule), for a tier whose eviction can follow
  // them. Default: ignored.
  virtual void SetSchedule(const TierNamespace& ns,
                           const ScheduleTable& table) {
    (void)ns;
    (void)table;
  }

  // Called once on each long-lived thread that will call Read or Write
  // (e.g. to set up its io_uring ring before the first call needs it).
  // Default: nothing.
  virtual void PrepareThisThread() {}
};

// Read / Write that wait for `done`: for callers allowed to block (the
// mover's workers, Flush). Same results as the calls they wrap.
std::vector<Result<uint64_t>> ReadAndWait(Tier& tier, const TierNamespace& ns,
                                          uint64_t fingerprint,
                                          std::span<const TierReadItem> items);
std::vector<Status> WriteAndWait(Tier& tier, const TierNamespace& ns,
                                 uint64_t fingerprint,
                                 std::span<const TierWriteItem> items,
                                 Durability durability);

}  // namespace tierkv::storage
