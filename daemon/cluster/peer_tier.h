// PeerTier: the other nodes of the cluster as a tier below this node's DRAM
// and NVMe (storage::Tier; scaleout.md §8(a), (d), (e)).
//
//   Lookup  asks the directory which live peers hold the pages (one prefix
//           Lookup, within the directory's budget) and answers each segment
//           of a page some peer holds with the layout's segment length.
//           Local-only (all zeros) when the directory is down or slow, the
//           namespace is not shared, or the layout differs.
//   Read    sends FETCH requests (fetch_protocol.h) to the holders, at most
//           kMaxFetchSegments and max_fetch_bytes each, all in flight at
//           once; the bytes land straight in item.dst (rendezvous), and each
//           segment is verified against the holder's checksum before its
//           item succeeds. A segment the holder no longer has is read
//           at the page's next live holder within the deadline, else a
//           miss, and the holder is forgotten for that page in the
//           directory (a stale hint repaired); one failing its checksum is
//           a miss (never wrong bytes). A peer that is dead, hung or past the
//           fetch deadline fails its items with IOError, which the
//           engine reports per segment (engines recompute them), unless
//           another live peer holds the page: then the items are fetched
//           there (failover) within the same deadline.
//   Write   refused (InvalidArgument): the tier is read-only; pages reach
//           peers by their own fetches.
//
// Only namespaces named in Options::shared take part; the holder checks the
// same on its side (peer_server.h). Nothing here blocks past the directory
// budget (Lookup) or returns before the reads end (Read's `done` runs on the
// transport's progress thread, or on the caller's for an all-miss batch).
//
// Thread safety: thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/mutex.h"
#include "daemon/cluster/peer_server.h"
#include "storage/tier/tier.h"
#include "tierkv/types.h"
#include "transport/directory/directory.h"
#include "transport/peer/peer_transport.h"

namespace tierkv::daemon::cluster {

// Where the peer tier learns a namespace's registered layout (the engine's;
// bound once the engine exists). Null: no layout yet.
class LayoutSource {
 public:
  virtual ~LayoutSource() = default;
  virtual std::shared_ptr<const LayoutSpec> LayoutOf(uint32_t ns_id) const = 0;
};

struct PeerTierOptions {
  // Names of the namespaces shared with peers (config `shared = true`).
  std::vector<std::string> shared;
  // A FETCH not answered in full by then fails its segments. Default: 2 s.
  std::chrono::milliseconds fetch_deadline{2000};
  // Largest bulk data of one FETCH. Default: 64 MiB.
  uint64_t max_fetch_bytes = uint64_t{64} << 20;
  // Pages whose holders a directory lookup remembers: a Read takes them
  // from there (it follows the Lookup that planned it), and a Lookup whose
  // directory trip fails falls back on them (a Get right after its Match
  // still reads what the Match saw). At most holder_cache_ttl old; emptied
  // when full. Default: 65536 pages, 1 s (the directory's own live-set
  // refresh period).
  size_t holder_cache_pages = 65536;
  std::chrono::milliseconds holder_cache_ttl{1000};
  // How long a holder whose FETCH failed is passed over when another live
  // peer holds the page. Default: 1 s (the transport's first back-off).
  std::chrono::milliseconds failed_holder_pause{1000};
};

class PeerTier final : public storage::Tier {
 public:
  using Clock = std::chrono::steady_clock;
  // Told the pages of a Read that every segment asked for arrived intact
  // (their namespace id), on the thread that ran the Read's `done`, after
  // it. Must not block.
  using FetchedListener =
      std::function<void(uint32_t ns_id, std::vector<PageHash> pages)>;

  // All borrowed pointers must outlive the tier.
  PeerTier(PeerTierOptions options,
           std::shared_ptr<transport::Directory> directory,
           std::shared_ptr<transport::peer::PeerTransport> transport,
           const LayoutSource* layouts);
  ~PeerTier() override;

  // Set before the tier serves reads.
  void SetFetchedListener(FetchedListener listener) {
    fetched_ = std::move(listener);
  }
  // Where the node's serving side's counters come from (reported with the
  // tier's: served_segments, served_bytes, served_refused). Set before the
  // tier is read.
  void SetServedCounters(std::function<PeerServerCounters()> served) {
    served_ = std::move(served);
  }

  static constexpr std::string_view kName = "peer";
  std::string_view name() const override { return kName; }
  std::string_view policy() const override { return "remote"; }
  tierkv::Tier kind() const override { return tierkv::Tier::kPeer; }
  bool persistent() const override { return false; }
  bool remote() const override { return true; }

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

 private:
  struct ReadState;
  class FetchCall;

  // A page's holders as a Lookup found them, keyed by namespace and page.
  struct CachedPage {
    uint32_t ns_id = 0;
    PageHash page;
    friend bool operator==(const CachedPage&, const CachedPage&) = default;
  };
  struct CachedPageHash {
    size_t operator()(const CachedPage& p) const {
      return std::hash<PageHash>()(p.page) ^ p.ns_id;
    }
  };

  bool Shared(uint32_t ns_id) const EXCLUDES(mu_);
  // The live holders of pages[0], pages[1], ... up to the first page no
  // peer is known to hold (the directory's prefix semantics), for Lookup:
  // from the directory, which is fresher than the cache; when it is down or
  // slow, the holders a lookup found within holder_cache_ttl, else none
  // (local-only). On the transport's progress thread (a promotion planning
  // its next round in a fetch's completion) the cache only: a directory
  // round trip there would stall every transfer of this node.
  std::vector<std::vector<std::string>> PrefixHolders(
      const storage::TierNamespace& ns, uint64_t fingerprint,
      std::span<const PageHash> pages) EXCLUDES(mu_);
  // The holders of each of `pages` (empty: none known), for Read: the
  // cached ones (the Lookup that planned the read found them), then one
  // directory lookup of the others (not on the progress thread).
  std::vector<std::vector<std::string>> HoldersOfEach(
      const storage::TierNamespace& ns, uint64_t fingerprint,
      std::span<const PageHash> pages) EXCLUDES(mu_);
  // The fresh cached holders of the leading pages of `pages`.
  std::vector<std::vector<std::string>> CachedPrefix(
      uint32_t ns_id, std::span<const PageHash> pages) const EXCLUDES(mu_);
  void Remember(uint32_t ns_id, std::span<const PageHash> pages,
                std::span<const transport::PageHolders> holders) EXCLUDES(mu_);
  // Sends FETCHes for items `todo` of `state`, each to its current
  // candidate holder.
  void Issue(const std::shared_ptr<ReadState>& state,
             std::span<const size_t> todo);
  // Drops the cached holders of `pages` (one answered "absent").
  void Forget(uint32_t ns_id, std::span<const PageHash> pages) EXCLUDES(mu_);
  // Ends a Read: the directory repairs and the listener, then `done`.
  void Finish(const std::shared_ptr<ReadState>& state);
  // A holder whose FETCH failed (dead, hung, unreachable) is not chosen
  // again for failed_holder_pause: its directory entries outlive it by up
  // to the liveness TTL, and a page another live peer holds is read there.
  void HolderFailed(const std::string& node_id) EXCLUDES(mu_);
  bool HolderPaused(const std::string& node_id, Clock::time_point now) const
      REQUIRES(mu_);

  const PeerTierOptions options_;
  const std::shared_ptr<transport::Directory> directory_;
  const std::shared_ptr<transport::peer::PeerTransport> transport_;
  const LayoutSource* const layouts_;
  FetchedListener fetched_;
  std::function<PeerServerCounters()> served_;

  mutable Mutex mu_;
  std::unordered_set<uint32_t> shared_ids_ GUARDED_BY(mu_);
  struct CachedHolders {
    std::vector<std::string> node_ids;
    Clock::time_point at;
  };
  std::unordered_map<CachedPage, CachedHolders, CachedPageHash> holders_
      GUARDED_BY(mu_);
  // Holders passed over until the time given (HolderFailed).
  std::unordered_map<std::string, Clock::time_point> paused_ GUARDED_BY(mu_);

  // Counters (tier_counters.h vocabulary where one applies).
  std::atomic<uint64_t> lookups_{0};
  std::atomic<uint64_t> lookup_errors_{0};
  std::atomic<uint64_t> lookup_hit_pages_{0};
  std::atomic<uint64_t> fetches_{0};
  std::atomic<uint64_t> fetch_segments_{0};
  std::atomic<uint64_t> fetch_bytes_{0};
  std::atomic<uint64_t> fetch_micros_{0};
  std::atomic<uint64_t> errors_timeout_{0};
  std::atomic<uint64_t> errors_unavailable_{0};
  std::atomic<uint64_t> errors_stale_{0};
  std::atomic<uint64_t> errors_checksum_{0};
  std::atomic<uint64_t> errors_refused_{0};
  std::atomic<uint64_t> errors_protocol_{0};
  std::atomic<uint64_t> failovers_{0};  // items sent to another replica
};

}  // namespace tierkv::daemon::cluster
