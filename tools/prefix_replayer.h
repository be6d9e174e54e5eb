// PrefixReplayer: one trace request run through one tierkvd client as an
// engine runs it, the step that `tierkv replay` (replay_workload.h, one
// daemon) and `tierkv replay --nodes N` (cluster_replay.h) share, under the
// counting rules of prefix_hit_rules.h:
//
//   Match  the request's cacheable blocks as pages PageHash{.lo = id,
//          .hi = kReplayPageSalt}: the leading pages and each one's tier
//          (host DRAM, NVMe, or a peer of the cluster);
//   Get    the leading pages into a buffer (the daemon leases them, or
//          fetches a peer's over the peer tier into its DRAM, the client
//          copies, the lease is released);
//   Put    every cacheable page from the first page not read on, in one
//          call (stored ones deduplicate).
//
// A request's hit is the leading pages whose Get returned the bytes, up to
// the first one that did not (a page Match reported but the Get missed:
// evicted meanwhile, a stale peer entry, a failed fetch); the engine
// recomputes from there, so the Put starts there.
//
// Thread safety: not thread-safe; one owner. The client is borrowed.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tierkv/client.h"
#include "tierkv/status.h"
#include "tools/prefix_trace.h"

namespace tierkv::tools {

// PageHash::hi of every replayed page.
inline constexpr uint64_t kReplayPageSalt = 0x7469'6572'6b76'7270;

// The replay's layout: one layer, one part of `bytes_per_token` bytes per
// token, 512-token pages (a trace block is one segment).
LayoutSpec ReplayLayout(uint32_t bytes_per_token);

// What one request got, in pages.
struct RequestOutcome {
  // Leading pages read, by the tier Match reported for them.
  uint32_t host_pages = 0;
  uint32_t nvme_pages = 0;
  uint32_t peer_pages = 0;
  // Leading pages Match reported that the Get did not return (NotFound or
  // IOError: the hit run ends at the first of them).
  uint32_t get_missed = 0;
  // Put items the daemon did not store (Busy: write-back backpressure;
  // ResourceExhausted: no evictable space).
  uint32_t put_failed = 0;

  uint32_t hit_pages() const { return host_pages + nvme_pages + peer_pages; }
};

class PrefixReplayer {
 public:
  // `client` (owned by the caller, outliving this) is bound to the
  // namespace with ReplayLayout(bytes_per_token) registered. `prefetch` is
  // MatchOptions::prefetch (the cluster replay says false: its Get reads
  // every leading page at once, and a prefetch of peer pages would race
  // it).
  PrefixReplayer(Client& client, uint32_t bytes_per_token, bool prefetch);

  // Match, Get and Put of `request` (see the file comment). Errors: the
  // first failure of a Match, or a Get or Put item failing otherwise than
  // as counted (e.g. Unavailable when the daemon died).
  Result<RequestOutcome> Request(const TraceRequest& request);

  // Match only (no prefetch, nothing read or stored): the leading pages
  // this node holds itself (host DRAM or NVMe), for KV-aware routing. As
  // every Match, it counts as a use of the DRAM pages it finds (their LRU
  // order moves), which the offline KV-aware bound does not model.
  Result<uint32_t> OwnLeadingPages(const TraceRequest& request);

  // The cacheable pages of the last request given to Request() or
  // OwnLeadingPages().
  std::span<const PageHash> pages() const { return pages_; }

 private:
  void SetPages(const TraceRequest& request);
  // Reads pages [0, leading); returns the pages read before the first
  // miss, and counts them by `tiers`.
  Result<uint32_t> ReadLeading(uint32_t leading, std::span<const Tier> tiers,
                               RequestOutcome& out);
  // Put of every page from `first` on, in order, in one call.
  Status StoreFrom(uint32_t first, RequestOutcome& out);

  Client& client_;
  const bool prefetch_;
  const std::vector<std::byte> payload_;
  std::vector<PageHash> pages_;  // reused across requests
  std::vector<SegmentRead> reads_;
  std::vector<std::byte> read_buffer_;
  std::vector<SegmentWrite> writes_;
};

}  // namespace tierkv::tools
