// A prefix trace replayed through a real tierkvd (see replay_workload.h).
#include "tools/replay_workload.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "tierkv/client.h"
#include "tools/daemon_launcher.h"
#include "tools/prefix_hit_rules.h"
#include "tools/prefix_replayer.h"

namespace tierkv::tools {
namespace {

constexpr uint32_t kMaxBytesPerToken = 2048;  // 1 MiB segments
constexpr uint64_t kNvmeExtentBytes = 4096;   // NVMe tier allocation unit

uint64_t SegmentBytes(const ReplayOptions& o) {
  return kTraceBlockTokens * o.bytes_per_token;
}

// The last `lines` lines of `text`.
std::string Tail(const std::string& text, int lines) {
  size_t at = text.size();
  while (lines-- > 0 && at > 0) {
    at = text.rfind('\n', at - 1);
    if (at == std::string::npos) return text;
  }
  return text.substr(at);
}

double Share(uint64_t part, uint64_t whole) {
  return whole == 0 ? 0.0
                    : static_cast<double>(part) / static_cast<double>(whole);
}

}  // namespace

Status ReplayOptions::Validate() const {
  if (policy.empty() || !std::all_of(policy.begin(), policy.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
      })) {
    return Status::InvalidArgument(fmt::format(
        "policy '{}' must be a word of [a-z0-9_] (lru, 2q, ...)", policy));
  }
  if (host_blocks == 0) {
    return Status::InvalidArgument("host_blocks must be at least 1");
  }
  if (shards == 0) return Status::InvalidArgument("shards must be at least 1");
  if (bytes_per_token == 0 || bytes_per_token > kMaxBytesPerToken) {
    return Status::InvalidArgument(
        fmt::format("bytes_per_token must be in [1, {}]", kMaxBytesPerToken));
  }
  if (!(speed >= 0)) {
    return Status::InvalidArgument(
        "speed must be 0 (as fast as possible) or positive");
  }
  return Status::OK();
}

double ReplayResult::TokenHitRate() const {
  return Share(hit_tokens(), input_tokens);
}
double ReplayResult::HostShare() const {
  return Share(host_hit_tokens, input_tokens);
}
double ReplayResult::NvmeShare() const {
  return Share(nvme_hit_tokens, input_tokens);
}

std::string ReplayDaemonConfig(const ReplayOptions& o) {
  // The replay is the namespace's only client: it may lease all of it.
  std::string toml = fmt::format(
      "[leases]\n"
      "max_bytes_percent_per_connection = 100\n"
      "max_bytes_percent_per_namespace = 100\n\n"
      "[[namespace]]\n"
      "name = \"{}\"\n"
      "token = \"{}\"\n"
      "host_bytes = {}\n"
      "shards = {}\n",
      kReplayNamespace, kReplayToken, o.host_blocks * SegmentBytes(o),
      o.shards);
  // Written only when set, for daemons without the key.
  if (o.shared) toml += "shared = true\n";
  // Written only when it is not the default, for daemons without the key.
  if (o.policy != "lru") {
    toml += fmt::format("eviction_policy = \"{}\"\n", o.policy);
  }
  if (o.nvme_blocks > 0) {
    const uint64_t nvme_segment_bytes =
        (SegmentBytes(o) + kNvmeExtentBytes - 1) / kNvmeExtentBytes *
        kNvmeExtentBytes;
    toml += fmt::format(
        "write_policy = \"write_back\"\n\n"
        "[nvme]\n"
        "path = \"{{DIR}}/nvme.data\"\n"
        "capacity_bytes = {}\n"
        // What is left in DRAM at the end need not reach NVMe.
        "shutdown_persist_ms = 0\n",
        o.nvme_blocks * nvme_segment_bytes);
  }
  return toml;
}

Result<ReplayResult> ReplayPrefixTrace(std::span<const TraceRequest> trace,
                                       const ReplayOptions& options) {
  TIERKV_RETURN_IF_ERROR(options.Validate());
  ReplayResult out;
  out.options = options;
  out.options.progress = nullptr;

  DaemonLauncher daemon;
  TIERKV_RETURN_IF_ERROR(
      daemon.Start({.config_toml = ReplayDaemonConfig(options),
                    .bin_dir = options.bin_dir,
                    .log_level = "warn"}));
  auto client = daemon.Connect(kReplayNamespace, kReplayToken);
  if (!client.ok()) return client.status();
  TIERKV_RETURN_IF_ERROR(
      (*client)->RegisterLayout(ReplayLayout(options.bytes_per_token)));

  PrefixReplayer replayer(**client, options.bytes_per_token,
                          /*prefetch=*/true);
  const auto start = std::chrono::steady_clock::now();
  const uint64_t first_ms = trace.empty() ? 0 : trace.front().timestamp_ms;
  for (size_t i = 0; i < trace.size(); ++i) {
    if (options.speed > 0 && trace[i].timestamp_ms > first_ms) {
      // Pacing to the trace's clock, not synchronisation.
      std::this_thread::sleep_until(
          start +
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
              std::chrono::duration<double, std::milli>(
                  static_cast<double>(trace[i].timestamp_ms - first_ms) /
                  options.speed)));
    }
    out.requests++;
    out.input_tokens += trace[i].input_length;
    auto request = replayer.Request(trace[i]);
    Status s = request.status();
    if (request.ok()) {
      out.host_hit_tokens += HitTokens(request->host_pages);
      out.nvme_hit_tokens += HitTokens(request->nvme_pages);
      out.get_missed += request->get_missed;
      out.put_failed += request->put_failed;
    }
    if (!s.ok()) {
      return Status(
          s.code(),
          fmt::format("request {} of {}: {}; tierkvd log ends:{}", i + 1,
                      trace.size(), s.message(), Tail(daemon.log(), 10)));
    }
    if (options.progress) options.progress(i + 1, trace.size());
  }
  out.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  client->reset();  // disconnect before the daemon stops
  if (const int status = daemon.Stop(); status != 0) {
    return Status::Internal(fmt::format(
        "tierkvd did not stop cleanly after the replay (wait status {}): {}",
        status, daemon.log()));
  }
  return out;
}

}  // namespace tierkv::tools
