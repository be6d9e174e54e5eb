// DaemonConfig: everything tierkvd can be told, from three layers applied in
// order: embedded defaults < TOML file (--config) < command-line overrides.
// LoadConfigFile() and Validate() turn every mistake into an InvalidArgument
// naming the key, so a bad config never starts a half-working daemon.
//
// TOML shape (every key optional; see README "Configuration"):
//   [server]    socket, socket_mode ("0660"), socket_group, io_threads,
//               poll_us, poll_followup_us, workers, load_workers, worker_queue,
//               max_frame_bytes, max_connections,
//               max_unauthenticated_connections, handshake_timeout_ms,
//               idle_timeout_ms, stall_timeout_ms, max_in_flight_bytes,
//               auth_failure_delay_ms
//   [metrics]   listen ("127.0.0.1:9400"; "" disables)
//   [leases]    ttl_ms, max_pin_ttl_ms, sweep_interval_ms,
//               max_per_connection, max_segments_per_connection,
//               max_segments_per_namespace, max_bytes_percent_per_connection,
//               max_bytes_percent_per_namespace, refusal_delay_ms
//   [log]       level ("trace".."off")
//   [nvme]      path ("" disables the tier), capacity_bytes, queue_depth,
//               direct_io, sync, recreate_damaged_catalog, readers,
//               mover_workers, prefetch_queue, sync_interval_ms,
//               shutdown_persist_ms
//   [hbm]       backend ("auto"|"cuda"|"emulated"), device, capacity_bytes
//               (0 disables), streams
//   [cluster]   name, node_id, secret_file, directory,
//               directory_password_file, peer_listen, liveness_ttl_ms,
//               lookup_budget_us, fetch_deadline_ms, transfer_spin_us
//               (absent: one node alone)
//   [[namespace]] name, token | token_file, host_bytes,
//               shards, hugepages, prefault, host_alignment, write_policy,
//               nvme_bytes,
//               max_connections, eviction_policy, shared, weights
// Every *_bytes key takes an integer or a string in ParseByteSize's grammar
// (common/byte_size.h: "16MiB", "1 GiB", "64k"; all units binary).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "storage/device/device_uuid.h"
#include "storage/engine/write_policy.h"
#include "storage/policy/eviction_policy_kind.h"
#include "tierkv/status.h"

namespace tierkv::daemon {

using storage::WritePolicy;
using storage::WritePolicyName;
Result<WritePolicy> ParseWritePolicy(std::string_view text);

// The NVMe tier (T2): one data file or block device shared by all
// namespaces, plus its RocksDB catalog.
struct NvmeConfig {
  std::string path;          // "" disables the NVMe tier. Default: disabled
  std::string catalog_path;  // Default: path + ".catalog"
  uint64_t capacity_bytes = uint64_t{16} << 30;  // Default: 16 GiB
  uint32_t queue_depth = 64;                     // Default: 64
  bool direct_io = true;                         // Default: true (O_DIRECT)
  // Sync data and catalog before acknowledging a write (crash safety).
  bool sync = true;  // Default: true
  // Start with an empty catalog when the existing one is damaged (else the
  // daemon refuses to start and says why). Default: false.
  bool recreate_damaged_catalog = false;
  // Threads that read the tier (each with its own io_uring ring), so that
  // Loads and promotions never wait for the device on an engine worker.
  // 1..64. Default: 4.
  uint32_t readers = 4;
  // Write-back, prefetch and Flush threads. Default: 2.
  uint32_t mover_workers = 2;
  // Prefetch batches (one per Match) waiting for a mover worker; more are
  // dropped (a hint: the Get promotes on demand). Default: 256.
  uint32_t prefetch_queue = 256;
  // Background demotions are synced as a group when the mover runs out of
  // work and at least this often (bounds what a power loss can take; a
  // process crash takes nothing). 1..3600000. Default: 5000 ms.
  uint32_t sync_interval_ms = 5000;
  // On a graceful stop (SIGTERM), every dirty DRAM segment of namespaces
  // with a write policy is written to NVMe first, for up to this long, so
  // a restarted daemon serves it; 0 skips that. 0..3600000. Default:
  // 30000 ms.
  uint32_t shutdown_persist_ms = 30000;
  bool enabled() const { return !path.empty(); }
};

// The HBM tier (T0): device memory behind a DeviceBackend
// (storage/device/device_backend.h). So far the daemon opens the backend and
// allocates the pool; caching pages in it is the rest of issue 10.
struct HbmConfig {
  // "auto" (CUDA when built in and a device is present, else emulated in
  // host memory), "cuda" or "emulated". Default: auto.
  std::string backend = "auto";
  // The GPU: a CUDA device ordinal (`device = 1`), or its UUID
  // (`device = "GPU-..."`, as `nvidia-smi -L` prints), which stays right
  // whatever CUDA_VISIBLE_DEVICES renumbers. Default: 0.
  int32_t device = 0;
  std::optional<storage::DeviceUuid> device_uuid;
  uint64_t capacity_bytes = 0;  // 0 disables the tier. Default: disabled
  uint32_t streams = 2;         // copy streams, 1..64. Default: 2
  // Host memory pinned for the device at start, lent as bounce buffers to
  // NVMe reads on their way into engines' device pools (KV segments,
  // weights chunks: a weights load's lanes share it, up to 4 reads each in
  // flight); past it, reads use unpinned heap memory.
  // A multiple of 4 KiB, at most 64 GiB; 0: none. Default: 256 MiB.
  uint64_t staging_bytes = uint64_t{256} << 20;
  // A fault drill, emulated backend only: the device fails, as a sticky
  // CUDA error fails it, at the copy after this many (0: never), so an
  // operator can rehearse TierkvDeviceFailed and its runbook, and tests
  // can run the daemon's degradation end to end. Default: 0.
  uint64_t emulated_fault_after_copies = 0;
  bool enabled() const { return capacity_bytes > 0; }
};

struct NamespaceConfig {
  std::string name;
  // Exactly one of token / token_file. A token_file that does not exist is
  // created with a random token, mode 0600.
  std::string token;
  std::string token_file;
  uint64_t host_bytes = uint64_t{1} << 30;  // Default: 1 GiB
  uint32_t shards = 8;                      // Default: 8
  bool hugepages = true;                    // Default: true (with fallback)
  // Commit the arena at start, and the host index's memory for a full
  // arena when a layout is registered (HostTier::ReserveIndex). Default: true
  bool prefault = true;
  // Where segments start in the arena, and what their extents round up to
  // (bytes, a power of two in [64, 4096]). 4096 (the NVMe block size) lets
  // write-back write segments straight from the arena and promotion read
  // them straight into it, with no bounce copy, for up to 4 KiB of padding
  // per segment; on the test VM's disk that copy did not bound demotion
  // (bench/RESULTS.md), so it is not the default. Default: 64.
  uint64_t host_alignment = 64;
  // Default: write_back when an NVMe tier is configured, else none.
  std::optional<WritePolicy> write_policy;
  // Connections that may have this namespace open at once; more get
  // ResourceExhausted. 0: server.max_connections. Default: 0.
  uint32_t max_connections = 0;
  // Which DRAM segment goes first when the namespace's arena is full
  // (storage/policy/eviction_policy.h): "lru", "2q" (segments used once go
  // before segments used again), "s3fifo", "topk", or "weights" (weights
  // namespaces only: by schedule hints and pins). Default: lru; weights
  // for a weights namespace.
  storage::EvictionPolicyKind eviction_policy =
      storage::EvictionPolicyKind::kLru;
  // NVMe bytes reserved for this namespace (a multiple of 4 KiB): only its
  // own writes evict its segments, and it holds no more. 0: it shares what
  // the reservations leave with the other namespaces without one.
  // Default: 0.
  uint64_t nvme_bytes = 0;
  // Most of the HBM tier ([hbm]) this namespace may hold; past it, its own
  // least recent segments there go first. 0: all of it. Default: 0.
  uint64_t hbm_bytes = 0;
  // Whether peers of the [cluster] may fetch this namespace's pages and
  // this node theirs (both sides must say so, with equal layouts). Needs
  // [cluster]. Default: false.
  bool shared = false;
  // A weights namespace (include/tierkv/weights.h, issue 28): it holds
  // content-addressed chunks of model weights (1 byte..64 MiB each, every
  // one checked against its key when committed) and the sealed manifests
  // that name them, and has no KV layout. Not `shared`; host_bytes >= 256
  // MiB (kMinWeightsHostBytes), so that 64 MiB chunks can be promoted
  // while others are read. Default: false.
  bool weights = false;
  // Weights namespaces only. A schedule hint (kWeightsHint) whose next use
  // is at most this far ahead queues the shard's chunks that are below
  // DRAM for promotion, in layer order, so the next model is in DRAM when
  // it is loaded (ms, at most kMaxPrefetchHorizonMs; 0: hints never
  // prefetch). Default: 60000.
  uint64_t prefetch_horizon_ms = 60000;
  // Weights namespaces only. Most bytes per second its weights promotions
  // (kWeightsPrefetch and hints) may read from NVMe; accepts sizes
  // ("2GiB"). 0: uncapped. Default: 0.
  uint64_t prefetch_bytes_per_second = 0;
};

// The least host_bytes of a weights namespace: four of the largest chunks.
inline constexpr uint64_t kMinWeightsHostBytes = uint64_t{256} << 20;
// The farthest prefetch_horizon_ms: a week (a distillation run's schedule
// is minutes to hours ahead).
inline constexpr uint64_t kMaxPrefetchHorizonMs =
    uint64_t{7} * 24 * 3600 * 1000;

// Scale-out (shared/reference/scaleout.md §8(g)): the daemons of a cluster
// share pages of their `shared` namespaces over UCX, finding each other's
// pages in a directory on Redis.
struct ClusterConfig {
  // The directory's key prefix and the peers' handshake; nodes of one
  // cluster must agree. 1-64 of [A-Za-z0-9_.-]. Default: "tierkv".
  std::string name = "tierkv";
  // This node's id, stable across restarts. 1-64 of [A-Za-z0-9_.-].
  // Default: the host name.
  std::string node_id;
  // The cluster secret (>= 32 bytes, mode 0600): peers prove they hold it
  // before anything is served. Required. Relative paths are relative to
  // the config file's directory.
  std::string secret_file;
  // The directory: redis://[user@]host[:port][/db] or unix:///path.
  // Required.
  std::string directory;
  // A file with the directory's password (mode 0600). Default: none.
  std::string directory_password_file;
  // The peer listener (UCX), "ip:port"; port 0 picks one. Peers are told
  // this address, so it must be the node's own (not 0.0.0.0). Loopback by
  // default, so that a node is not reachable until told where to listen.
  // Default: "127.0.0.1:0".
  std::string peer_listen = "127.0.0.1:0";
  // A node silent this long counts as gone. 1000..3600000. Default: 10000.
  uint32_t liveness_ttl_ms = 10000;
  // The most a Match waits for the directory before answering from local
  // tiers only. 100..1000000. Default: 2000 us.
  uint32_t lookup_budget_us = 2000;
  // A fetch from a peer not finished by then fails its segments (engines
  // recompute them). 10..600000. Default: 2000 ms.
  uint32_t fetch_deadline_ms = 2000;
  // While a transfer is in flight the peer transport's progress thread
  // polls this long after its last event before sleeping (0: never polls).
  // 0..10000. Default: 50 us.
  uint32_t transfer_spin_us = 50;
};

struct DaemonConfig {
  std::string socket_path = "/run/tierkv/tierkv.sock";
  uint32_t socket_mode = 0660;
  std::string socket_group;  // Default: the daemon's own group
  uint32_t io_threads = 2;   // socket IO threads. Default: 2
  // How long an IO thread polls for the next request before sleeping
  // (transport::UdsServerOptions::poll_after_work); 0 never polls.
  uint32_t poll_us = 50;  // Default: 50 us
  // How long an IO thread polls, at least, for the request that completes
  // an open transaction (a reserved Put's commit, a read lease's release;
  // transport::UdsServerOptions::poll_for_followup); 0 never.
  uint32_t poll_followup_us = 500;  // Default: 500 us
  // Engine threads for requests that may wait for write-back room (Put
  // under backpressure, Store lanes) and that start a Get's promotion (its
  // read completes on the NVMe tier's readers; Flush runs on the mover),
  // and how many requests may wait for a worker of each kind (more get
  // Busy).
  uint32_t workers = 4;  // Default: 4
  // Engine threads for the lanes of Load, apart from `workers`, so a Put
  // stalled on write-back never holds a Load back.
  uint32_t load_workers = 4;                      // Default: 4
  uint32_t worker_queue = 1024;                   // Default: 1024
  uint64_t max_frame_bytes = uint64_t{16} << 20;  // Default: 16 MiB
  // Connections that opened a namespace; more are refused. Default: 1024.
  uint32_t max_connections = 1024;
  // Connections that have not opened a namespace yet; a new one beyond
  // this closes the oldest of them (transport::UdsServerOptions).
  // Default: 64.
  uint32_t max_unauthenticated_connections = 64;
  // A connection must open a namespace within this. Default: 10000 ms.
  uint32_t handshake_timeout_ms = 10000;
  // An authenticated connection idle this long is closed; 0 never.
  // Default: 0.
  uint32_t idle_timeout_ms = 0;
  // A connection that holds in-flight bytes (a request partly received,
  // replies unread) and moves none for this long is closed; 0 never.
  // Default: 30000 ms.
  uint32_t stall_timeout_ms = 30000;
  // Request and reply bytes all connections together may hold
  // (transport::UdsServerOptions::max_in_flight_bytes); a large request
  // waits for room. REQUIRES: >= max_frame_bytes. Default: 256 MiB.
  uint64_t max_in_flight_bytes = uint64_t{256} << 20;
  // A refused OpenNamespace is answered this late, then hung up: token
  // guessing costs a connection and this much per try. Default: 200 ms.
  uint32_t auth_failure_delay_ms = 200;

  std::string metrics_listen = "127.0.0.1:9400";  // "" disables

  uint32_t lease_ttl_ms = 30000;      // read and write leases. Default: 30 s
  uint32_t max_pin_ttl_ms = 3600000;  // longest pin. Default: 1 h
  uint32_t sweep_interval_ms = 100;   // lease expiry scan period
  // What one connection may hold leased at once, and one namespace's
  // connections together (storage::LeaseLimits); beyond, items get
  // ResourceExhausted. Defaults: 4096 leases, 1,048,576 segments per
  // connection; 4,194,304 segments per namespace.
  uint32_t max_leases_per_connection = 4096;
  uint64_t max_leased_segments_per_connection = uint64_t{1} << 20;
  uint64_t max_leased_segments_per_namespace = uint64_t{4} << 20;
  // Bytes of those segments, in percent of the namespace's host_bytes: one
  // connection (Default: 50) and all of the namespace's (Default: 90).
  uint32_t max_leased_bytes_percent_per_connection = 50;
  uint32_t max_leased_bytes_percent_per_namespace = 90;
  // A Get whose every segment a lease limit refused is answered this late
  // (CacheServiceOptions::lease_refusal_delay); 0 answers at once.
  // 0..10000. Default: 10 ms.
  uint32_t lease_refusal_delay_ms = 10;

  std::string log_level = "info";
  // Written (JSON: pid, socket, metrics_port) once the daemon serves.
  std::string ready_file;

  NvmeConfig nvme;
  HbmConfig hbm;
  std::optional<ClusterConfig> cluster;  // absent: this node alone
  std::vector<NamespaceConfig> namespaces;

  // InvalidArgument naming the first bad field by its TOML key
  // ("config server.io_threads: must be in [1, 64]").
  Status Validate() const;
};

// The configuration used when no file is given: one namespace "default"
// whose token is kept in <socket dir>/default.token.
DaemonConfig EmbeddedDefaults();

// Reads a TOML file over `base`. A file with [[namespace]] tables replaces
// base's namespaces. InvalidArgument with file:line for parse errors,
// unknown keys and wrong types.
Result<DaemonConfig> LoadConfigFile(const std::string& path,
                                    const DaemonConfig& base);

// Fills in token from token_file (creating the file with a random token
// when missing). IOError when the file cannot be read or created,
// InvalidArgument when others may read it or it holds no token; either
// names the key ("config namespace.token_file (namespace 'x'): ...").
Status ResolveTokens(DaemonConfig& config);

// `cause`, its code kept, as an error of config key `key`: "config <key>:
// <cause's message>", the form of every config error. For what a valid
// config meets at start-up (a path that cannot be created, an address in
// use), so that those name their key too. OK stays OK.
Status ConfigKeyError(std::string_view key, const Status& cause);

}  // namespace tierkv::daemon
