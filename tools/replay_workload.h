// The replay behind `tierkv replay`: a prefix trace (prefix_trace.h) run
// through a real tierkvd, to measure the prefix-cache hit rate it delivers
// under the counting rules of prefix_hit_rules.h (the ones the offline
// simulators of prefix_cache_sim.h apply, so the two compare exactly).
//
// Each ReplayPrefixTrace() starts its own tierkvd (tools/daemon_launcher.h)
// in a private temporary directory with one namespace: `host_blocks`
// segments of host DRAM in `shards` shards, the given eviction policy and,
// with `nvme_blocks` > 0, an NVMe tier of that many segments on a file in
// that directory (write_back). The layout is one layer with one part and
// 512-token pages, so a trace block is one segment; trace block id X is page
// PageHash{.lo = X, .hi = kReplayPageSalt} (the ids are already
// chain-consistent: no hashing). Per request, in trace order, as an engine
// does (prefix_replayer.h): Match the cacheable blocks, Get the leading
// pages (the hit: those read, split into host and NVMe by their tier), Put
// the cacheable blocks from the first miss on in one call (stored ones
// deduplicate). One client, one request at a time. `tierkv replay --nodes
// N` runs the same steps over a cluster (cluster_replay.h).
//
// Thread safety: ReplayPrefixTrace() may run concurrently with itself (each
// call has its own daemon).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "tierkv/status.h"
#include "tools/prefix_replayer.h"
#include "tools/prefix_trace.h"

namespace tierkv::tools {

// The namespace the replay's daemons serve, and its token.
inline constexpr char kReplayNamespace[] = "replay";
inline constexpr char kReplayToken[] = "replay-token";

struct ReplayOptions {
  // The namespace's eviction policy (tierkvd's `eviction_policy`: "lru",
  // "2q", ...). "lru" is the daemon's default and is not written to the
  // config, so it works with daemons that predate the key. Default: "lru".
  std::string policy = "lru";
  // Host DRAM, in segments (host_bytes = host_blocks x segment bytes).
  // Default: 4096.
  uint64_t host_blocks = 4096;
  // NVMe tier, in segments (each rounded up to 4 KiB); 0: no NVMe tier.
  // tierkvd needs at least 16 MiB. Default: 0.
  uint64_t nvme_blocks = 0;
  // Host tier shards; with 1, an lru daemon hits exactly as the offline
  // LRU. Default: 8 (tierkvd's default).
  uint32_t shards = 8;
  // Bytes per token of the single layout part: a segment is 512 x this
  // (payload is irrelevant; smaller is faster). tierkvd needs 1 MiB of
  // host DRAM per shard. Default: 8 (4 KiB segments).
  uint32_t bytes_per_token = 8;
  // Honour the trace's timestamps, sped up by this factor (2: twice as
  // fast as recorded); 0 replays as fast as possible. Default: 0.
  double speed = 0;
  // The namespace's `shared` key: peers of the daemon's [cluster] may fetch
  // its pages and it theirs (cluster_replay.h sets it). Default: false.
  bool shared = false;
  // Where tierkvd is. Default: "" (DaemonBinDir()).
  std::string bin_dir;
  // Called on the replaying thread after each request with the number of
  // requests done and the total. Default: none.
  std::function<void(size_t done, size_t total)> progress;

  // InvalidArgument naming the field: a policy that is not a plain word,
  // host_blocks or shards 0, bytes_per_token 0 or over 2048, speed < 0.
  Status Validate() const;
};

struct ReplayResult {
  ReplayOptions options;  // as run (progress cleared)
  uint64_t requests = 0;
  uint64_t input_tokens = 0;  // sum of input_length
  // Leading pages read (Match found them, Get returned them), by the tier
  // Match reported: host DRAM, NVMe only.
  uint64_t host_hit_tokens = 0;
  uint64_t nvme_hit_tokens = 0;
  // Put items the daemon did not store (Busy: write-back backpressure;
  // ResourceExhausted: no evictable space). The replay goes on.
  uint64_t put_failed = 0;
  // Leading pages Match reported that the following Get did not return.
  uint64_t get_missed = 0;
  double seconds = 0;  // the replay itself, without daemon start and stop

  uint64_t hit_tokens() const { return host_hit_tokens + nvme_hit_tokens; }
  double TokenHitRate() const;  // hit_tokens / input_tokens
  double HostShare() const;     // host_hit_tokens / input_tokens
  double NvmeShare() const;     // nvme_hit_tokens / input_tokens
};

// The tierkvd config (TOML) ReplayPrefixTrace() starts the daemon with,
// with "{DIR}" for its directory: tables [leases], one [[namespace]] and,
// with NVMe, [nvme]. REQUIRES: options.Validate().ok().
std::string ReplayDaemonConfig(const ReplayOptions& options);

// Replays `trace` through a fresh tierkvd (see the file comment) and stops
// it. Errors: InvalidArgument (options), the daemon launcher's errors
// (tierkvd missing, rejecting the config, not ready: with its log), and
// the first failure of a Match, Get or Put other than the counted ones
// (e.g. Unavailable when the daemon dies; with the end of its log), and
// Internal when the daemon does not exit cleanly on SIGTERM afterwards.
Result<ReplayResult> ReplayPrefixTrace(std::span<const TraceRequest> trace,
                                       const ReplayOptions& options);

}  // namespace tierkv::tools
