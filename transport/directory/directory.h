// Directory: the cluster directory, a shared HINT of which live node holds
// which page (shared/reference/scaleout.md §8(c)-(e)).
//
// The directory maps (namespace, page hash) to the set of node ids that hold
// the *whole* page (every segment of the layout) in DRAM or NVMe, and keeps
// each node's liveness with a TTL. It is advisory: a stale entry costs a
// miss (the holder re-checks every page under a lease and answers "absent"),
// a lost entry costs a recomputation. So no call here waits for the
// directory past its budget, and a directory that is down makes the cluster
// local-only instead of slow.
//
// Implementations: RedisDirectory (redis_directory.h), the real one, and
// MemoryDirectory (memory_directory.h), in-process, for tests of code that
// uses a Directory.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv::transport {

// Which pages can be shared: two nodes share a page only when both the
// namespace name and the layout fingerprint agree (the fingerprint covers
// the layout, so equal page hashes under equal fingerprints are replicas).
struct DirectoryNamespace {
  std::string name;                 // non-empty, at most 255 bytes
  uint64_t layout_fingerprint = 0;  // LayoutSpec::Fingerprint()

  // "<name>@<16 lowercase hex digits>": the {ns} part of directory keys.
  std::string KeyComponent() const;
  // InvalidArgument when the name is empty, longer than 255 bytes, or holds
  // a control character.
  Status Validate() const;

  friend bool operator==(const DirectoryNamespace&,
                         const DirectoryNamespace&) = default;
};

// A live node as registered in the directory.
struct DirectoryNode {
  std::string node_id;  // stable across restarts (e.g. the hostname)
  // Opaque to the directory: how peers reach the node (the peer transport's
  // listener, e.g. "127.0.0.11:40123").
  std::string address;
  uint64_t epoch = 0;  // changes on every restart of the node

  friend bool operator==(const DirectoryNode&, const DirectoryNode&) = default;
};

// The live holders of one page, other than the asking node. Never empty in
// a Lookup result.
struct PageHolders {
  std::vector<std::string> node_ids;  // sorted, no duplicates
};

// A snapshot of a directory's counters (monotonic, since Open) and gauges
// (current values), for metrics export (tierkv_directory_*).
struct DirectoryStats {
  // Gauges.
  bool up = false;            // the last directory round trip succeeded
  uint64_t live_nodes = 0;    // in the cached live set, self included
  uint64_t queued_pages = 0;  // publish/unpublish pages not yet written
  std::chrono::microseconds last_lookup_latency{0};  // of the last Lookup
  // Counters.
  uint64_t lookups = 0;                  // Lookup calls that reached the server
  uint64_t lookup_pages = 0;             // pages asked for by those lookups
  uint64_t lookup_hit_pages = 0;         // pages returned with live holders
  uint64_t lookup_errors = 0;            // lookups that failed (timeout, IO)
  uint64_t lookups_short_circuited = 0;  // answered "down" without a trip
  // Answered "down" without a trip because no connection was ready (it is
  // being made in the background); not a breaker short circuit.
  uint64_t lookups_without_connection = 0;
  // Pages whose directory entry was unreadable (not a holder list): no
  // holder. Only written by hand or by another program, never by a node.
  uint64_t lookup_malformed_pages = 0;
  uint64_t published_pages = 0;    // page adds acknowledged by the server
  uint64_t unpublished_pages = 0;  // page removals acknowledged
  uint64_t forgotten_holders = 0;  // ForgetHolder removals acknowledged
  uint64_t dropped_pages = 0;      // Publish/Unpublish pages not queued
  uint64_t write_errors = 0;       // failed background write batches
  uint64_t heartbeats = 0;         // successful registrations/refreshes
  uint64_t heartbeat_errors = 0;
  uint64_t live_refreshes = 0;  // live-set reloads
  uint64_t reconnects = 0;      // connections (re)made after the first
  uint64_t republishes = 0;     // re-publish callbacks run
};

// Thread safety: every method may be called concurrently from any thread.
// Ownership: the caller owns the Directory; destroying it stops its
// background work (see the implementation for what it flushes).
class Directory {
 public:
  using Clock = std::chrono::steady_clock;
  // A Lookup deadline meaning "the implementation's default budget".
  static constexpr Clock::time_point kDefaultDeadline =
      Clock::time_point::max();

  Directory() = default;
  virtual ~Directory() = default;
  Directory(const Directory&) = delete;
  Directory& operator=(const Directory&) = delete;

  // Announces that this node now holds `pages` of `ns` whole. Asynchronous:
  // queued and written in the background, batched and pipelined; never
  // blocks on the directory.
  // Returns OK when every page was queued; ResourceExhausted when the queue
  // is full, in which case NONE of `pages` is queued (counted in
  // DirectoryStats::dropped_pages: the directory is a hint, so a dropped
  // publish costs peers a miss); InvalidArgument for a bad `ns`; Shutdown
  // when the directory is closing.
  virtual Status Publish(const DirectoryNamespace& ns,
                         std::span<const PageHash> pages) = 0;

  // Announces that this node no longer holds `pages` (they left its last
  // tier). Same queue, order and failure semantics as Publish: a publish
  // and a later unpublish of one page reach the directory in that order.
  virtual Status Unpublish(const DirectoryNamespace& ns,
                           std::span<const PageHash> pages) = 0;

  // Removes `node_id` as a holder of `pages`: the repair of a stale entry
  // after that node answered "absent" for them (scaleout.md §8(d)). Same
  // queue, order and failure semantics as Unpublish; InvalidArgument also
  // for a malformed node id. A holder that re-acquired a page meanwhile
  // loses its entry until it publishes the page again (a miss, no harm).
  virtual Status ForgetHolder(const DirectoryNamespace& ns,
                              std::span<const PageHash> pages,
                              std::string_view node_id) = 0;

  // Prefix lookup: for pages[0], pages[1], ... the live nodes other than
  // this one that hold the page, stopping at the first page no such node
  // holds. Returns one PageHolders per page of that prefix (so result[i]
  // is for pages[i], and the result may be empty).
  // One call is one outcome, not one per page: the pages of a round trip
  // succeed or fail together, and a failure says nothing about any page.
  // The prefix may be SHORTER than the pages holders exist for: an
  // implementation may stop early (e.g. when its budget runs out midway
  // through a long lookup) and return what it found so far. That is a
  // false negative, which a hint store allows: the caller recomputes or
  // fetches the rest elsewhere.
  // Never waits past `deadline` (nor past the implementation's budget
  // cap). Returns Unavailable ("directory down") when the directory cannot
  // be reached, answers too late, or failed recently (a circuit breaker
  // answers at once while it backs off); InvalidArgument for a bad `ns`;
  // Shutdown when the directory is closing.
  virtual Result<std::vector<PageHolders>> Lookup(
      const DirectoryNamespace& ns, std::span<const PageHash> pages,
      Clock::time_point deadline = kDefaultDeadline) = 0;

  // The cached set of live nodes, this one included, sorted by node id.
  // Never touches the directory (the cache is refreshed in the background
  // and by RefreshLiveNodes); may be up to one refresh period stale.
  virtual std::vector<DirectoryNode> LiveNodes() const = 0;

  // Reloads the live set from the directory now (e.g. when a peer says
  // hello before the periodic refresh saw it). Returns Unavailable as
  // Lookup does; the cache is unchanged on failure.
  virtual Status RefreshLiveNodes(
      Clock::time_point deadline = kDefaultDeadline) = 0;

  // Waits until every Publish/Unpublish queued before this call has been
  // written (or refused by the directory). Returns Unavailable when that
  // did not happen by `deadline` (the writes stay queued); Shutdown when
  // the directory is closing.
  virtual Status Flush(Clock::time_point deadline) = 0;

  // This node's own registration.
  virtual const DirectoryNode& self() const = 0;

  virtual DirectoryStats GetStats() const = 0;
};

// A sink for re-publishing a node's catalog after the directory lost its
// contents (see RedisDirectory::Options::republish). Its writes are
// synchronous and pipelined on the directory's background connection.
class DirectoryRepublisher {
 public:
  virtual ~DirectoryRepublisher() = default;
  // Writes `pages` of `ns` as held by this node. Returns Unavailable when the
  // directory failed meanwhile (stop: the re-publish is retried when the
  // directory is back), InvalidArgument for a bad `ns`.
  virtual Status Publish(const DirectoryNamespace& ns,
                         std::span<const PageHash> pages) = 0;
};

}  // namespace tierkv::transport
