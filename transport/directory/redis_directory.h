// RedisDirectory: the cluster directory (directory.h) on Redis 7 or Valkey
// through hiredis 0.14 (shared/reference/scaleout.md §6, §8(c)-(f)).
//
// Schema, with {c} the cluster name and {ns} DirectoryNamespace::
// KeyComponent() (registration `version` 2):
//   tkv:{c}:node:{id}      HASH {addr, epoch, version}, PEXPIRE liveness_ttl,
//                          rewritten every heartbeat_period: liveness.
//   tkv:{c}:nodes          SET of node ids that registered (an index, so
//                          that listing nodes never SCANs the keyspace;
//                          members whose HASH expired are pruned).
//   tkv:{c}:{ns}:h:{page}  STRING: the ids of the nodes holding the whole
//                          page, each followed by ',' (a byte no node id
//                          holds), e.g. "node-a,node-b,". Written only by
//                          the write script (kWriteScript in the .cc, run
//                          by EVALSHA), atomically per key: a publish
//                          appends the id when absent and sets EXPIRE
//                          page_ttl; an unpublish or ForgetHolder removes
//                          it, and DELs the key when no id is left (the TTL
//                          is kept otherwise). No per-holder TTL, so
//                          orphans of dead nodes age out with the key.
//                          Lookup reads lookup_batch_pages of them with one
//                          MGET and filters the ids by the cached live set;
//                          a value that is not such a list (hand-written
//                          garbage) is no holder, and a publish rewrites it.
//   tkv:{c}:dir_epoch      a random value set once (SET NX). When it
//                          disappears or changes (the server restarted
//                          empty, or was flushed), Options::republish runs.
// Why one string per page and not a SET (schema version 1 kept SETs under
// :p:): a lookup is one command instead of one per page. Redis reads many
// strings in one command (MGET) but has no command that returns many
// sets, and a server's per-command dispatch, not the bytes, is what a
// 128-page lookup costs: on a 2-core VM with redis-server 7.0 on loopback,
// a pipeline of 128 SMEMBERS took p50 ~194 us, one MGET of 128 keys ~89 us
// (a PING ~55 us). Redis has no atomic "add/remove a token in a string"
// either, hence the script; it costs the writes 3-4 us of server time per
// page (SADD + EXPIRE: about 2), and write_script_pages bounds how long one
// call holds the server. The script is loaded once (SCRIPT LOAD at Open)
// and loaded again when the server answers NOSCRIPT (it restarted, or its
// cache was flushed). ACL: MGET, EVALSHA and SCRIPT LOAD besides the plain
// commands (deploy/k8s-cluster/redis.yaml); Redis checks the script's own
// calls (GET, SET, EXPIRE, DEL) against the same user's commands and keys.
// Mixed versions: the new letter (h:, not p:) means a version-1 node's SETs
// are never read as strings (no WRONGTYPE); nodes of the two versions do
// not see each other's pages (misses, not errors) and version-1 entries age
// out with their TTL.
// Writes per page lifetime: one script call share (one pipelined round
// trip per write_batch_pages) on publish, one on unpublish. A node that
// restarts under the same id finds its old entries still naming it; those
// it no longer holds cost a peer one stale miss (scaleout.md §8(d)) until
// unpublished or expired.
//
// Page hashes are PageHash::ToHex() (32 hex digits) in keys rather than 16
// raw bytes: keys stay printable for redis-cli, MONITOR and ACL key
// patterns, and the extra 16 bytes are small next to Redis's per-key
// overhead (dict entry, key object and the value's own allocation).
//
// Threads and connections: a background thread owns one connection for
// the writes (publish queue, heartbeats, re-publish, live-set refresh);
// lookups use a second connection, so a publish backlog never delays a
// Lookup. Lookups share that one connection: concurrent ones wait for it
// (within their own deadline). Only the background thread (or Open)
// connects, and it hands the lookup connection over ready; a Lookup never
// connects (no DNS, no handshake on the request path) and answers
// Unavailable while none is ready. A circuit breaker makes every Lookup
// answer "directory down" at once while it backs off; it is fed only by
// evidence about the server: an IO error on either connection, or a
// lookup round trip that timed out although it had (at least half of)
// the whole lookup_budget. A caller's short deadline, a server refusal
// (OOM, NOPERM) and the background thread's timeouts do not open it.
//
// Thread safety: thread-safe (see Directory). Destruction stops the
// background thread after a bounded goodbye (see ~RedisDirectory).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "tierkv/status.h"
#include "transport/directory/directory.h"
#include "transport/directory/redis_connection.h"
#include "transport/directory/redis_url.h"

namespace tierkv::transport {

class RedisDirectory final : public Directory {
 public:
  // Read once by Open; no field changes at run time.
  struct Options {
    // Where Redis is: redis://[user@]host[:port][/db] or
    // unix:///path/to/socket (redis_url.h). Required.
    std::string url;
    // A file holding the password (one line; a trailing newline is
    // ignored), read once at Open. It must not be accessible to group or
    // others (mode & 0077 == 0, e.g. 0600). Default: "" (no AUTH).
    std::string password_file;
    // The key prefix tkv:{cluster}:; nodes of one cluster must agree.
    // 1-64 characters of [A-Za-z0-9_.-]. Required.
    std::string cluster;
    // This node's stable id, 1-64 characters of [A-Za-z0-9_.-]. Required.
    std::string node_id;
    // How peers reach this node (opaque here; the peer transport's
    // listener, e.g. "127.0.0.11:40123"). At most 1024 bytes. Default: "".
    std::string address;
    // This run's epoch; 0 picks a random non-zero one at Open. Default: 0.
    uint64_t epoch = 0;

    // How long the node's registration lives without a heartbeat. Default:
    // 10 s. At least 100 ms.
    std::chrono::milliseconds liveness_ttl{10000};
    // How often the registration is rewritten and dir_epoch checked.
    // Default: 2 s. REQUIRES: 2 * heartbeat_period <= liveness_ttl.
    std::chrono::milliseconds heartbeat_period{2000};
    // How often the background thread reloads the live-node set (Lookup
    // filters holders by it). Default: 1 s.
    std::chrono::milliseconds live_refresh_period{1000};
    // The EXPIRE of a page's holder list, refreshed by every publish of the
    // page. Default: 24 h.
    std::chrono::seconds page_ttl{24 * 3600};

    // The most a Lookup waits, whatever deadline the caller passes (and
    // what kDefaultDeadline means). A lookup of more pages than fit in the
    // budget returns the prefix found by the round trips that fit (see
    // Lookup). Default: 2 ms. At most 1 h (as are all durations here but
    // page_ttl).
    std::chrono::microseconds lookup_budget{2000};
    // Pages asked per Lookup round trip (one MGET); a lookup stops after
    // the round trip that found the first page without a holder.
    // Default: 128.
    uint32_t lookup_batch_pages = 128;

    // The most publish/unpublish pages queued for the background writer;
    // a Publish that does not fit is dropped whole and counted. Default:
    // 1 Mi pages (about 40 MiB at worst).
    uint64_t max_queued_pages = uint64_t{1} << 20;
    // Pages written per pipelined round trip in the background. Default:
    // 1024.
    uint32_t write_batch_pages = 1024;
    // Pages per write script call (EVALSHA) within that round trip. A call
    // runs atomically, holding the server (3-4 us per page on the VM of
    // the header comment) while other nodes' lookups wait: this bounds the
    // wait. Default: 64.
    uint32_t write_script_pages = 64;
    // Bounds each background round trip (and connect), and is the budget
    // of RefreshLiveNodes (twice this: it waits for the background thread,
    // which may be in a round trip). Default: 1 s.
    std::chrono::milliseconds io_timeout{1000};
    // Backoff after a failure, doubling from min to max, before the
    // circuit breaker lets the next call try the server again (and before
    // the background thread reconnects). A background success shortens
    // the breaker's wait to min_backoff, so lookups resume soon after an
    // outage. Default: 100 ms, 5 s.
    std::chrono::milliseconds min_backoff{100};
    std::chrono::milliseconds max_backoff{5000};

    // Called on the background thread when the directory lacks (some of)
    // this node's pages: when dir_epoch vanished or changed (the server
    // restarted empty or was flushed), and once the write queue has
    // drained after a Publish was dropped for a full queue. It should
    // publish the node's whole catalog through the sink; it runs again if
    // the sink reports a failure. Heartbeats go on between the sink's
    // batches. It must not call this directory's Flush (it would wait for
    // itself). Default: none (nothing is re-published).
    std::function<void(DirectoryRepublisher&)> republish;
    // Whether destruction removes the registration (peers then see the
    // node leave at once, not after liveness_ttl). Tests switch it off to
    // play a crash. Default: true.
    bool deregister_on_close = true;

    // InvalidArgument naming the first bad field.
    Status Validate() const;
  };

  // Validates `options`, reads the password file, connects, registers the
  // node, loads the live set and the write script (SCRIPT LOAD) and starts
  // the background thread.
  // Returns InvalidArgument for bad options or URL; PermissionDenied when
  // the password file is accessible to group or others, or the server
  // refuses the credentials, the registration or the script (ACL);
  // NotFound / IOError when the password file cannot be read; Internal
  // when the server refuses the registration or the script otherwise
  // (e.g. OOM). An unreachable or
  // unresponsive server is NOT an error: the directory opens "down" (Lookup
  // answers Unavailable) and connects in the background, so that a daemon
  // starts local-only while Redis is away.
  static Result<std::unique_ptr<RedisDirectory>> Open(const Options& options);

  // Stops the background thread. With deregister_on_close it then removes
  // the registration (queued writes are dropped: peers ignore this node's
  // entries from then on); without, it writes what is queued. Either is
  // best effort and bounded by about two io_timeouts when the server does
  // not answer (one for a round trip in flight, one for the goodbye); a
  // re-publish in progress stops at its next batch (the sink returns
  // Shutdown).
  ~RedisDirectory() override;

  Status Publish(const DirectoryNamespace& ns,
                 std::span<const PageHash> pages) override;
  Status Unpublish(const DirectoryNamespace& ns,
                   std::span<const PageHash> pages) override;
  Status ForgetHolder(const DirectoryNamespace& ns,
                      std::span<const PageHash> pages,
                      std::string_view node_id) override;
  // Sends one round trip (one MGET) per lookup_batch_pages. A page whose
  // entry is not a holder list has no holder (counted in
  // lookup_malformed_pages). Before each round trip
  // after the first it stops, returning OK with the prefix found so far,
  // when less than twice the previous round trip's time is left; likewise
  // when a later round trip times out (the earlier answers stand). The
  // first round trip's timeout, or any IO error, is Unavailable. Also
  // Unavailable, at once and without feeding the breaker, while no lookup
  // connection is ready (counted in lookups_without_connection).
  Result<std::vector<PageHolders>> Lookup(
      const DirectoryNamespace& ns, std::span<const PageHash> pages,
      Clock::time_point deadline = kDefaultDeadline) override;
  std::vector<DirectoryNode> LiveNodes() const override;
  // Asks the background thread to reload the live set and waits for it,
  // at most until `deadline` and 2 * io_timeout. Never feeds the circuit
  // breaker and never uses the lookup connection. Unavailable when the
  // reload failed or did not finish in time (e.g. while disconnected).
  Status RefreshLiveNodes(
      Clock::time_point deadline = kDefaultDeadline) override;
  const DirectoryNode& self() const override { return self_; }
  DirectoryStats GetStats() const override;

  // REQUIRES: not called from Options::republish (it would wait for
  // itself).
  Status Flush(Clock::time_point deadline) override;

  // The schema, for tools and tests that read the directory themselves.
  // The prefix of `ns`'s page keys: tkv:{cluster}:{ns}:h: (then the page's
  // PageHash::ToHex()).
  static std::string PageKeyPrefix(std::string_view cluster,
                                   const DirectoryNamespace& ns);
  // The node ids of a page entry's value, in stored order. Corruption when
  // `value` is not a holder list (Lookup: no holder).
  static Result<std::vector<std::string>> ParseHolderList(
      std::string_view value);

  // Sync point (common/sync_point.h) the background thread passes before
  // it writes each batch of queued publishes/unpublishes; no argument.
  // Tests: hold the writer with a backlog queued.
  static constexpr char kBeforeWriteBatch[] =
      "RedisDirectory::WriterLoop:BeforeWriteBatch";
  // Sync point a Lookup passes holding the lookup connection, before each
  // round trip; no argument.
  static constexpr char kBeforeLookupTrip[] =
      "RedisDirectory::Lookup:BeforeRoundTrip";
  // Sync point a Lookup passes, with the directory's lock held, just
  // before it waits for the lookup connection another Lookup holds; no
  // argument. The callback must not call into the directory.
  static constexpr char kWaitingForLookupConnection[] =
      "RedisDirectory::Lookup:WaitingForConnection";

 private:
  struct PendingOp {
    bool publish = true;  // add the id, refresh the TTL; else remove it
    std::shared_ptr<const std::string> key_prefix;  // tkv:{c}:{ns}:h:
    PageHash page;
    // The id to remove when not this node's (ForgetHolder); else null.
    std::shared_ptr<const std::string> other_node;
  };
  class Republisher;

  RedisDirectory(const Options& options, RedisUrl url, std::string password);

  // Queues one op per page; `other_node` only for removals (ForgetHolder).
  Status Enqueue(bool publish, const DirectoryNamespace& ns,
                 std::span<const PageHash> pages,
                 std::shared_ptr<const std::string> other_node)
      EXCLUDES(queue_mu_);
  std::string PageKeyPrefix(const DirectoryNamespace& ns) const {
    return PageKeyPrefix(options_.cluster, ns);
  }

  // Runs `body` on the lookup connection, then gives the connection back
  // (or, when broken, asks the background thread for a new one) and feeds
  // the circuit breaker: a success closes it; a failure opens it only when
  // `body` set its `server_failed` argument. Waits for a concurrent
  // lookup's connection until `deadline`. Returns Unavailable at once
  // while the breaker is open or no connection is ready, or when the
  // connection is busy until `deadline`; else what `body` returns.
  Status WithLookupConnection(
      Clock::time_point deadline,
      const std::function<Status(RedisConnection&, bool* server_failed)>& body)
      EXCLUDES(mu_, queue_mu_);
  // Asks the background thread for a (new) lookup connection.
  void RequestLookupConnection() EXCLUDES(queue_mu_);
  // On the background thread: connects the lookup connection when one was
  // requested and its backoff has passed, and hands it over.
  void EnsureLookupConnection(Clock::time_point deadline) EXCLUDES(mu_);
  bool Stopping() const EXCLUDES(queue_mu_);

  // The circuit breaker: open (calls answer Unavailable at once) until
  // retry_at_; each failure, on either connection, opens it for a backoff
  // doubling from min_backoff to max_backoff; a lookup's success closes it.
  void RecordSuccessLocked() REQUIRES(mu_);
  void RecordWriterSuccessLocked(Clock::time_point now) REQUIRES(mu_);
  void RecordFailureLocked(Clock::time_point now) REQUIRES(mu_);

  // Reads the live set through `connection`; with `prune`, also removes
  // expired members from the node index.
  Result<std::map<std::string, DirectoryNode>> FetchLiveNodes(
      RedisConnection& connection, Clock::time_point deadline, bool prune);
  // Only the background thread (and Open before it starts) installs, so a
  // newer snapshot is never overwritten by an older one.
  void InstallLiveNodes(std::map<std::string, DirectoryNode> live)
      EXCLUDES(mu_);
  // Records the outcome of a live-set reload for RefreshLiveNodes callers
  // that asked up to request number `served`.
  void FinishRefresh(uint64_t served, bool ok) EXCLUDES(queue_mu_);

  // Background thread and its helpers (they touch writer_ state only from
  // that thread, or from Open before the thread starts).
  // Each step takes one deadline for all its round trips (the callers
  // pass now + io_timeout), so that a step, and the destructor waiting for
  // it, is bounded by one io_timeout.
  void WriterLoop();
  // Connects, registers and loads the live set. A refusal of the
  // registration is returned with the connection kept.
  Status ConnectWriter(Clock::time_point deadline);
  // Returns Unavailable (connection dropped) on an IO failure or timeout;
  // a refusal (OOM, NOPERM) is counted in heartbeat_errors and returned,
  // with the connection kept and the breaker untouched (retried next
  // period).
  Status Heartbeat(Clock::time_point deadline);
  // Heartbeat() when next_heartbeat_ has passed; else OK.
  Status HeartbeatIfDue(Clock::time_point deadline);
  Status RunRepublish();
  // SCRIPT LOAD of the write script into script_sha_. Returns Unavailable
  // (and drops the connection) on an IO failure or timeout; a refusal
  // (NOPERM) as ReplyError, with the connection kept.
  Status LoadScript(Clock::time_point deadline);
  // Writes `ops` in one pipelined round trip on the writer connection (one
  // EVALSHA per write_script_pages), and once more, behind a SCRIPT LOAD,
  // from the first call the server answered NOSCRIPT (it restarted or its
  // script cache was flushed). Returns Unavailable (and drops the
  // connection) on an IO failure or timeout; refusals by the server are
  // counted, not returned.
  Status WriteOps(std::span<const PendingOp> ops, Clock::time_point deadline);
  // Drops the writer connection and backs off its reconnect; feeds the
  // lookup breaker only for an IO error (not `timed_out`).
  void WriterFailed(bool timed_out);
  void DrainAndDeregister(std::vector<PendingOp> batch);

  const Options options_;
  const RedisUrl url_;
  const std::string password_;
  const DirectoryNode self_;
  const std::string prefix_;     // tkv:{c}:
  const std::string node_key_;   // tkv:{c}:node:{id}
  const std::string nodes_key_;  // tkv:{c}:nodes
  const std::string epoch_key_;  // tkv:{c}:dir_epoch

  // Lookup side, circuit breaker and the live set.
  mutable Mutex mu_;
  CondVar lookup_cv_;  // signalled when the lookup connection comes back
  bool lookup_busy_ GUARDED_BY(mu_) = false;
  std::unique_ptr<RedisConnection> lookup_connection_ GUARDED_BY(mu_);
  bool up_ GUARDED_BY(mu_) = false;
  Clock::time_point retry_at_ GUARDED_BY(mu_){};  // breaker open until then
  Clock::duration backoff_ GUARDED_BY(mu_){0};
  // Replaced whole, never modified: Lookup filters by a snapshot of it
  // without holding mu_.
  std::shared_ptr<const std::map<std::string, DirectoryNode>> live_
      GUARDED_BY(mu_);
  std::chrono::microseconds last_lookup_latency_ GUARDED_BY(mu_){0};

  // The publish queue.
  mutable Mutex queue_mu_;
  CondVar queue_cv_;    // wakes the writer: work, or stop
  CondVar flushed_cv_;  // wakes Flush: done_ops_ advanced
  std::deque<PendingOp> queue_ GUARDED_BY(queue_mu_);
  uint64_t queued_ops_total_ GUARDED_BY(queue_mu_) = 0;  // ever enqueued
  uint64_t done_ops_ GUARDED_BY(queue_mu_) = 0;          // written or refused
  uint64_t in_flight_ops_ GUARDED_BY(queue_mu_) = 0;     // taken, not done
  bool stopping_ GUARDED_BY(queue_mu_) = false;
  // RefreshLiveNodes requests (numbered from 1) and the last one a reload
  // served, with that reload's outcome.
  CondVar refreshed_cv_;  // wakes RefreshLiveNodes: refresh_served_ moved
  uint64_t refresh_requests_ GUARDED_BY(queue_mu_) = 0;
  uint64_t refresh_served_ GUARDED_BY(queue_mu_) = 0;
  bool last_refresh_ok_ GUARDED_BY(queue_mu_) = false;
  // Set by a Lookup that dropped a broken lookup connection (and
  // initially); the background thread connects a new one. Release/acquire
  // publish nothing else (the connection itself passes under mu_).
  std::atomic<bool> lookup_connection_wanted_{true};

  // Writer-thread state: touched by Open before the thread starts, then by
  // the thread alone.
  std::unique_ptr<RedisConnection> writer_connection_;
  std::string dir_epoch_;  // the value last seen; empty: none yet
  // The write script's SHA1 (from SCRIPT LOAD); empty until loaded once.
  // The server's cache may lose it (NOSCRIPT): WriteOps loads it again.
  std::string script_sha_;
  bool republish_pending_ = false;
  Clock::time_point next_heartbeat_{};
  Clock::duration writer_backoff_{0};
  Clock::time_point writer_retry_at_{};  // reconnect not before
  bool writer_connected_once_ = false;
  Clock::duration lookup_connect_backoff_{0};
  Clock::time_point lookup_connect_at_{};  // next lookup connect not before
  std::thread writer_;

  // Counters (relaxed: they publish nothing but themselves).
  std::atomic<uint64_t> lookups_{0};
  std::atomic<uint64_t> lookup_pages_{0};
  std::atomic<uint64_t> lookup_hit_pages_{0};
  std::atomic<uint64_t> lookup_malformed_pages_{0};
  std::atomic<uint64_t> lookup_errors_{0};
  std::atomic<uint64_t> lookups_short_circuited_{0};
  std::atomic<uint64_t> lookups_without_connection_{0};
  std::atomic<uint64_t> published_pages_{0};
  std::atomic<uint64_t> unpublished_pages_{0};
  std::atomic<uint64_t> forgotten_holders_{0};
  std::atomic<uint64_t> dropped_pages_{0};
  std::atomic<uint64_t> write_errors_{0};
  std::atomic<uint64_t> heartbeats_{0};
  std::atomic<uint64_t> heartbeat_errors_{0};
  std::atomic<uint64_t> live_refreshes_{0};
  std::atomic<uint64_t> reconnects_{0};
  std::atomic<uint64_t> republishes_{0};
  // A Publish was dropped since the last re-publish was scheduled (only a
  // flag: the writer reads it and acts; nothing else is published by it).
  std::atomic<bool> publishes_dropped_{false};
  bool lookup_connected_once_ GUARDED_BY(mu_) = false;
};

}  // namespace tierkv::transport
