// tierkv: command-line client for tierkvd (status, stats, put/get/ls for
// debugging a namespace, a synthetic demo workload, the soak test, trace
// replay, and model weights: tools/weights_command.h). See README "CLI".
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tierkv/client.h"
#include "tierkv/page_hash.h"
#include "tools/cluster_cache_sim.h"
#include "tools/cluster_replay.h"
#include "tools/demo_workload.h"
#include "tools/human_bytes.h"
#include "tools/prefix_cache_sim.h"
#include "tools/prefix_hit_rules.h"
#include "tools/prefix_trace.h"
#include "tools/replay_workload.h"
#include "tools/soak_workload.h"
#include "tools/stats_watch.h"
#include "tools/weights_command.h"

namespace {

using tierkv::Status;
using tierkv::tools::HumanBytes;

struct Connection {
  std::string socket = "/run/tierkv/tierkv.sock";
  std::string ns = "default";
  std::string token;
  std::string token_file;  // default: <socket dir>/<namespace>.token
};

int Fail(const Status& s) {
  std::fflush(stdout);  // what was printed before the error comes first
  fmt::print(stderr, "tierkv: {}\n", s.ToString());
  return 1;
}

// --token, else the first line of --token-file (default: the namespace's
// token file next to the socket).
tierkv::Result<std::string> ResolveToken(const Connection& c) {
  if (!c.token.empty()) return c.token;
  std::string file = c.token_file;
  if (file.empty()) {
    file = (std::filesystem::path(c.socket).parent_path() / (c.ns + ".token"))
               .string();
  }
  std::ifstream in(file);
  if (!in) {
    return Status::PermissionDenied(
        "no --token given and cannot read token file " + file);
  }
  std::string token;
  std::getline(in, token);
  return token;
}

tierkv::Result<std::unique_ptr<tierkv::Client>> Connect(const Connection& c,
                                                        bool open_namespace) {
  auto client = tierkv::Client::Connect({.socket_path = c.socket});
  if (!client.ok() || !open_namespace) return client;
  auto token = ResolveToken(c);
  if (!token.ok()) return token.status();
  TIERKV_RETURN_IF_ERROR((*client)->OpenNamespace(c.ns, *token));
  return client;
}

// `tierkv soak`: prints the report; exit 1 on any error.
int RunSoak(const Connection& conn, tierkv::tools::SoakOptions o,
            uint32_t seconds, const std::string& json_path) {
  auto token = ResolveToken(conn);
  if (!token.ok()) return Fail(token.status());
  o.socket = conn.socket;
  o.ns = conn.ns;
  o.token = *token;
  o.duration = std::chrono::seconds(seconds);
  auto report = tierkv::tools::RunSoak(o);
  if (!report.ok()) return Fail(report.status());
  const nlohmann::json j = {
      {"seconds", report->seconds}, {"clients", o.clients},
      {"ops", report->ops},         {"by_op", report->by_op},
      {"busy", report->busy},       {"misses", report->misses},
      {"errors", report->errors},   {"first_errors", report->first_errors}};
  if (!json_path.empty()) std::ofstream(json_path) << j.dump(2) << "\n";
  fmt::print(
      "soak: {} clients, {:.0f} s: {} ops ({:.0f}/s), {} busy, {} misses, {} "
      "errors\n",
      o.clients, report->seconds, report->ops,
      report->ops / std::max(report->seconds, 1e-9), report->busy,
      report->misses, report->errors);
  for (const auto& e : report->first_errors) fmt::print("  error: {}\n", e);
  return report->errors == 0 ? 0 : 1;
}

// `tierkv replay`'s settings beyond the per-run ReplayOptions.
struct ReplayCommand {
  std::string trace;
  std::vector<uint64_t> host_blocks = {2048, 4096, 8192};
  std::vector<std::string> policies = {"lru"};
  std::string json_path;
  std::string plot_path;
  bool no_progress = false;
  // --nodes N > 1: the cluster replay (cluster_replay.h).
  uint32_t nodes = 1;
  std::string routing = "round-robin";
  bool no_peers = false;        // every node an island
  bool local_baseline = false;  // also measure the cluster without peers
};

// A one-line progress bar on stderr, redrawn when the percentage changes.
class ProgressBar {
 public:
  explicit ProgressBar(std::string label) : label_(std::move(label)) {}
  ~ProgressBar() {
    if (drawn_) fmt::print(stderr, "\r\033[2K");
  }
  void Update(size_t done, size_t total) {
    const int percent =
        static_cast<int>(100 * done / std::max<size_t>(total, 1));
    if (percent == percent_) return;
    percent_ = percent;
    drawn_ = true;
    constexpr int kWidth = 30;
    const int filled = percent * kWidth / 100;
    fmt::print(stderr, "\r{} [{}{}] {:3}% {}/{}", label_,
               std::string(filled, '#'), std::string(kWidth - filled, '.'),
               percent, done, total);
  }

 private:
  const std::string label_;
  int percent_ = -1;
  bool drawn_ = false;
};

// Runs tools/plot_replay.py (Debian's python3-matplotlib) on the report.
Status PlotReplay(const std::string& report_path, const std::string& png) {
  const std::string script =
      std::string(TIERKV_SOURCE_DIR) + "/tools/plot_replay.py";
  std::vector<std::string> args = {"/usr/bin/python3", script, report_path,
                                   png};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) !=
      0) {
    return Status::NotFound("cannot run /usr/bin/python3");
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Status::Internal(
        fmt::format("{} failed; it needs Debian's python3-matplotlib "
                    "(scripts/install-deps.sh installs it)",
                    script));
  }
  return Status::OK();
}

// The figures of one cluster replay as a JSON object.
nlohmann::json ClusterRunJson(const tierkv::tools::ClusterReplayResult& r) {
  nlohmann::json nodes = nlohmann::json::array();
  for (const auto& n : r.nodes) {
    nodes.push_back(
        {{"node", n.node_id},
         {"requests", n.requests},
         {"input_tokens", n.input_tokens},
         {"local_hit_tokens", n.local_hit_tokens},
         {"peer_hit_tokens", n.peer_hit_tokens},
         {"local_hit_rate", n.LocalHitRate()},
         {"cluster_hit_rate", n.ClusterHitRate()},
         {"get_missed", n.get_missed},
         {"put_failed", n.put_failed},
         {"peer_stats", nlohmann::json::parse(n.peer_stats_json, nullptr,
                                              /*allow_exceptions=*/false)}});
  }
  return {{"peers", r.options.peers},
          {"requests", r.requests()},
          {"input_tokens", r.input_tokens()},
          {"local_hit_tokens", r.local_hit_tokens()},
          {"peer_hit_tokens", r.peer_hit_tokens()},
          {"local_hit_rate", r.LocalHitRate()},
          {"peer_hit_rate", r.PeerHitRate()},
          {"cluster_hit_rate", r.ClusterHitRate()},
          {"publish_timeouts", r.publish_timeouts},
          {"publish_wait_seconds", r.publish_wait_seconds},
          {"seconds", r.seconds},
          {"nodes", nodes}};
}

// `tierkv replay --nodes N`: the trace through a cluster of N tierkvds and a
// redis-server, next to the offline cluster bounds of cluster_cache_sim.h;
// exit 1 on any error.
int RunClusterReplay(const ReplayCommand& cmd,
                     const tierkv::tools::ReplayOptions& node) {
  namespace tools = tierkv::tools;
  tools::ClusterReplayOptions o;
  o.nodes = cmd.nodes;
  o.node = node;
  if (cmd.routing == "round-robin") {
    o.routing = tools::ClusterRouting::kRoundRobin;
  } else if (cmd.routing == "kv-aware") {
    o.routing = tools::ClusterRouting::kKvAware;
  } else {
    return Fail(
        Status::InvalidArgument("--routing must be round-robin or kv-aware"));
  }
  if (cmd.host_blocks.size() != 1 || cmd.policies.size() != 1) {
    return Fail(Status::InvalidArgument(
        "--nodes replays one --host-blocks size and one policy"));
  }
  o.node.host_blocks = cmd.host_blocks.front();
  o.node.policy = cmd.policies.front();
  if (Status s = o.Validate(); !s.ok()) return Fail(s);
  auto trace = tools::LoadPrefixTrace(cmd.trace);
  if (!trace.ok()) return Fail(trace.status());

  // Offline bounds (no daemon code) on the same accesses and routing.
  const tools::ClusterCacheSimulator sim(*trace);
  tools::ClusterCacheOptions bound{.nodes = o.nodes,
                                   .capacity_blocks = o.node.host_blocks,
                                   .peers = false,
                                   .routing = o.routing};
  const tools::ClusterCacheResult local_bound = sim.Run(bound);
  bound.peers = true;
  const tools::ClusterCacheResult peers_bound = sim.Run(bound);
  fmt::print(
      "trace {}: {} requests, {} input tokens; {} nodes x {} blocks of {} "
      "tokens ({} shard(s), {}), routing {}\n",
      cmd.trace, local_bound.requests, local_bound.input_tokens, o.nodes,
      o.node.host_blocks, tools::kTraceBlockTokens, o.node.shards,
      o.node.policy, tools::ClusterRoutingName(o.routing));
  fmt::print(
      "offline bound (tools/cluster_cache_sim.h): local-only {:.2f}%, with "
      "peers {:.2f}% (served by peers {:.2f}%)\n",
      100 * local_bound.TokenHitRate(), 100 * peers_bound.TokenHitRate(),
      100 * peers_bound.PeerTokenRate());

  std::vector<bool> modes;
  if (cmd.local_baseline && !cmd.no_peers) modes.push_back(false);
  modes.push_back(!cmd.no_peers);
  const bool progress = !cmd.no_progress && ::isatty(STDERR_FILENO);
  nlohmann::json runs = nlohmann::json::array();
  std::optional<double> measured_local;
  for (bool peers : modes) {
    o.peers = peers;
    std::optional<ProgressBar> bar;
    if (progress) {
      bar.emplace(fmt::format("replay {} nodes, peers {}", o.nodes,
                              peers ? "on" : "off"));
      o.progress = [&](size_t done, size_t total) { bar->Update(done, total); };
    }
    const auto wall_start = std::chrono::steady_clock::now();
    auto run = tools::ReplayPrefixTraceOnCluster(*trace, o);
    const double wall = std::chrono::duration<double>(
                            std::chrono::steady_clock::now() - wall_start)
                            .count();
    bar.reset();
    if (!run.ok()) {
      return Fail(
          Status(run.status().code(),
                 fmt::format("cluster replay (peers {}): {}",
                             peers ? "on" : "off", run.status().message())));
    }
    const tools::ClusterCacheResult& sim_run =
        peers ? peers_bound : local_bound;
    fmt::print(
        "\npeers {}:\n{:<8} {:>8} {:>13} {:>8} {:>8} {:>8} {:>9} "
        "{:>8} {:>7}\n",
        peers ? "on" : "off", "node", "requests", "input tokens", "local",
        "peer", "cluster", "offline", "missed", "fetched");
    for (size_t i = 0; i < run->nodes.size(); ++i) {
      const auto& n = run->nodes[i];
      const auto stats = nlohmann::json::parse(n.peer_stats_json, nullptr,
                                               /*allow_exceptions=*/false);
      const uint64_t fetched =
          stats.is_object() ? stats.value("fetch_segments", uint64_t{0}) : 0;
      const double offline =
          i < sim_run.node_input_tokens.size() &&
                  sim_run.node_input_tokens[i] > 0
              ? static_cast<double>(sim_run.node_hit_tokens[i]) /
                    static_cast<double>(sim_run.node_input_tokens[i])
              : 0.0;
      fmt::print(
          "{:<8} {:>8} {:>13} {:>7.2f}% {:>7.2f}% {:>7.2f}% {:>8.2f}% {:>8} "
          "{:>7}\n",
          n.node_id, n.requests, n.input_tokens, 100 * n.LocalHitRate(),
          100 * n.PeerHitRate(), 100 * n.ClusterHitRate(), 100 * offline,
          n.get_missed, fetched);
    }
    fmt::print("{:<8} {:>8} {:>13} {:>7.2f}% {:>7.2f}% {:>7.2f}% {:>8.2f}%\n",
               "cluster", run->requests(), run->input_tokens(),
               100 * run->LocalHitRate(), 100 * run->PeerHitRate(),
               100 * run->ClusterHitRate(), 100 * sim_run.TokenHitRate());
    fmt::print(
        "replay {:.1f} s (of which waiting for the directory {:.1f} s; {} "
        "publish timeouts), {:.1f} s with start-up and stop\n",
        run->seconds, run->publish_wait_seconds, run->publish_timeouts, wall);
    if (!peers) measured_local = run->ClusterHitRate();
    nlohmann::json j = ClusterRunJson(*run);
    j["wall_seconds"] = wall;
    j["offline"] = sim_run.TokenHitRate();
    runs.push_back(std::move(j));
    if (peers) {
      const double cluster = run->ClusterHitRate();
      fmt::print(
          "cluster hit rate {:.2f}%: {:.2f}x the offline local-only bound, "
          "{:.2f}% of the offline peers bound",
          100 * cluster,
          local_bound.TokenHitRate() > 0 ? cluster / local_bound.TokenHitRate()
                                         : 0.0,
          peers_bound.TokenHitRate() > 0
              ? 100 * cluster / peers_bound.TokenHitRate()
              : 0.0);
      if (measured_local && *measured_local > 0) {
        fmt::print(", {:.2f}x the measured local-only cluster",
                   cluster / *measured_local);
      }
      fmt::print("\n");
    }
  }
  if (!cmd.json_path.empty()) {
    const nlohmann::json report = {
        {"trace", cmd.trace},
        {"nodes", o.nodes},
        {"routing", tools::ClusterRoutingName(o.routing)},
        {"host_blocks", o.node.host_blocks},
        {"shards", o.node.shards},
        {"policy", o.node.policy},
        {"block_tokens", tools::kTraceBlockTokens},
        {"requests", local_bound.requests},
        {"input_tokens", local_bound.input_tokens},
        {"offline_local", local_bound.TokenHitRate()},
        {"offline_peers", peers_bound.TokenHitRate()},
        {"offline_peer_served", peers_bound.PeerTokenRate()},
        {"runs", runs}};
    std::ofstream out(cmd.json_path);
    out << report.dump(2) << "\n";
    if (!out) return Fail(Status::IOError("cannot write " + cmd.json_path));
  }
  return 0;
}

// `tierkv replay`: the trace through a real tierkvd per (host blocks,
// policy), next to the offline LRU and Belady bounds; exit 1 on any error.
int RunReplay(const ReplayCommand& cmd, tierkv::tools::ReplayOptions o) {
  namespace tools = tierkv::tools;
  if (cmd.host_blocks.empty() || cmd.policies.empty()) {
    return Fail(Status::InvalidArgument(
        "give at least one --host-blocks size and one --policies name"));
  }
  for (uint64_t blocks : cmd.host_blocks) {
    if (blocks == 0) {
      return Fail(Status::InvalidArgument("--host-blocks must be positive"));
    }
  }
  for (const std::string& policy : cmd.policies) {
    o.policy = policy;
    if (Status s = o.Validate(); !s.ok()) return Fail(s);
  }
  auto trace = tools::LoadPrefixTrace(cmd.trace);
  if (!trace.ok()) return Fail(trace.status());

  // Offline bounds for the same total capacity as the daemon's tiers.
  const auto sim_start = std::chrono::steady_clock::now();
  const tools::PrefixCacheSimulator sim(*trace);
  std::map<uint64_t, std::pair<tools::PrefixCacheResult,
                               tools::PrefixCacheResult>>
      offline;  // host blocks -> (lru, belady)
  for (uint64_t blocks : cmd.host_blocks) {
    const uint64_t capacity = blocks + o.nvme_blocks;
    offline[blocks] = {sim.Run(tools::OfflinePolicy::kLru, capacity),
                       sim.Run(tools::OfflinePolicy::kBelady, capacity)};
  }
  const double sim_seconds = std::chrono::duration<double>(
                                 std::chrono::steady_clock::now() - sim_start)
                                 .count();
  const tools::PrefixCacheResult& any = offline.begin()->second.first;
  fmt::print(
      "trace {}: {} requests, {} input tokens, {} cacheable blocks ({} "
      "distinct) of {} tokens\n",
      cmd.trace, any.requests, any.input_tokens, any.accessed_blocks,
      sim.distinct_blocks(), tools::kTraceBlockTokens);
  fmt::print("offline LRU and Belady for {} capacities: {:.3f} s\n",
             cmd.host_blocks.size(), sim_seconds);

  const bool progress = !cmd.no_progress && ::isatty(STDERR_FILENO);
  std::vector<tools::ReplayResult> runs;
  for (uint64_t blocks : cmd.host_blocks) {
    for (const std::string& policy : cmd.policies) {
      o.policy = policy;
      o.host_blocks = blocks;
      std::optional<ProgressBar> bar;
      if (progress) {
        bar.emplace(fmt::format("replay {} {} blocks", policy, blocks));
        o.progress = [&](size_t done, size_t total) {
          bar->Update(done, total);
        };
      }
      auto run = tools::ReplayPrefixTrace(*trace, o);
      bar.reset();
      if (!run.ok()) {
        return Fail(
            Status(run.status().code(),
                   fmt::format("replay {} with {} host blocks: {}", policy,
                               blocks, run.status().message())));
      }
      runs.push_back(std::move(run).value());
    }
  }

  fmt::print("\n{:>11} {:<8} {:>8} {:>7} {:>7} {:>11} {:>7} {:>10} {:>8}\n",
             "host blocks", "policy", "daemon", "host", "nvme", "offline LRU",
             "Belady", "vs LRU", "replay");
  nlohmann::json rows = nlohmann::json::array();
  uint64_t put_failed = 0;
  uint64_t get_missed = 0;
  for (const tools::ReplayResult& r : runs) {
    const auto& [lru, belady] = offline.at(r.options.host_blocks);
    const double diff = 100 * (r.TokenHitRate() - lru.TokenHitRate());
    fmt::print(
        "{:>11} {:<8} {:>7.2f}% {:>6.2f}% {:>6.2f}% {:>10.2f}% {:>6.2f}% "
        "{:>+6.2f} pts {:>7.1f}s\n",
        r.options.host_blocks, r.options.policy, 100 * r.TokenHitRate(),
        100 * r.HostShare(), 100 * r.NvmeShare(), 100 * lru.TokenHitRate(),
        100 * belady.TokenHitRate(), diff, r.seconds);
    put_failed += r.put_failed;
    get_missed += r.get_missed;
    rows.push_back({{"policy", r.options.policy},
                    {"host_blocks", r.options.host_blocks},
                    {"nvme_blocks", r.options.nvme_blocks},
                    {"shards", r.options.shards},
                    {"token_hit_rate", r.TokenHitRate()},
                    {"host_share", r.HostShare()},
                    {"nvme_share", r.NvmeShare()},
                    {"host_hit_tokens", r.host_hit_tokens},
                    {"nvme_hit_tokens", r.nvme_hit_tokens},
                    {"put_failed", r.put_failed},
                    {"get_missed", r.get_missed},
                    {"seconds", r.seconds},
                    {"offline_lru", lru.TokenHitRate()},
                    {"belady", belady.TokenHitRate()},
                    {"vs_offline_lru_points", diff}});
  }
  if (o.nvme_blocks > 0) {
    fmt::print("offline LRU and Belady hold host + nvme = {} more blocks\n",
               o.nvme_blocks);
  }
  if (put_failed + get_missed > 0) {
    fmt::print(
        "note: {} Put items not stored (Busy: write-back behind), {} hit "
        "pages gone by their Get\n",
        put_failed, get_missed);
  }
  nlohmann::json offline_rows = nlohmann::json::array();
  for (const auto& [blocks, result] : offline) {
    offline_rows.push_back({{"host_blocks", blocks},
                            {"capacity_blocks", result.first.capacity_blocks},
                            {"lru", result.first.TokenHitRate()},
                            {"belady", result.second.TokenHitRate()}});
  }
  const nlohmann::json report = {{"trace", cmd.trace},
                                 {"requests", any.requests},
                                 {"input_tokens", any.input_tokens},
                                 {"cacheable_blocks", any.accessed_blocks},
                                 {"distinct_blocks", sim.distinct_blocks()},
                                 {"block_tokens", tools::kTraceBlockTokens},
                                 {"nvme_blocks", o.nvme_blocks},
                                 {"shards", o.shards},
                                 {"speed", o.speed},
                                 {"offline", offline_rows},
                                 {"runs", rows}};
  if (!cmd.json_path.empty()) {
    std::ofstream out(cmd.json_path);
    out << report.dump(2) << "\n";
    if (!out) return Fail(Status::IOError("cannot write " + cmd.json_path));
  }
  if (!cmd.plot_path.empty()) {
    const std::string data = cmd.plot_path + ".json";
    {
      std::ofstream out(data);
      out << report.dump() << "\n";
      if (!out) return Fail(Status::IOError("cannot write " + data));
    }
    Status s = PlotReplay(data, cmd.plot_path);
    std::filesystem::remove(data);
    if (!s.ok()) return Fail(s);
    fmt::print("plot: {}\n", cmd.plot_path);
  }
  return 0;
}

tierkv::Result<tierkv::PageHash> ParsePage(const std::string& page,
                                           const std::string& tokens,
                                           const std::string& ns) {
  if (!page.empty()) return tierkv::PageHash::FromHex(page);
  if (tokens.empty())
    return Status::InvalidArgument("give --page HEX or --tokens 1,2,3");
  std::vector<uint32_t> ids;
  std::stringstream in(tokens);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      ids.push_back(static_cast<uint32_t>(std::stoul(item)));
    } catch (...) {
      return Status::InvalidArgument(
          "--tokens must be comma-separated integers");
    }
  }
  // The hash of the whole token list taken as one page.
  return tierkv::NextPageHash(tierkv::RootPageHash(ns), ids);
}

int PrintStats(const std::string& json_text, bool raw) {
  if (raw) {
    fmt::print("{}\n", json_text);
    return 0;
  }
  auto j = nlohmann::json::parse(json_text);
  const auto& h = j["host"];
  const double hit = j["lookup_tokens"]["host"].get<double>();
  const double miss = j["lookup_tokens"]["miss"].get<double>();
  const double ghit = j["get_segments"]["hit"].get<double>();
  const double gmiss = j["get_segments"]["miss"].get<double>();
  fmt::print("namespace {}\n", j["namespace"].get<std::string>());
  fmt::print(
      "  host tier   {} / {} used ({:.1f}%), {} reserved, {} segments{}\n",
      HumanBytes(h["used_bytes"].get<double>()),
      HumanBytes(h["capacity_bytes"].get<double>()),
      100.0 * h["used_bytes"].get<double>() / h["capacity_bytes"].get<double>(),
      HumanBytes(h["reserved_bytes"].get<double>()),
      h["segments"].get<uint64_t>(),
      h["hugepages"].get<bool>() ? ", hugepages" : "");
  const double hit_nvme = j["lookup_tokens"].value("nvme", 0.0);
  const double hit_peer = j["lookup_tokens"].value("peer", 0.0);
  fmt::print(
      "  lookups     {:.0f} requests; tokens hit {:.0f} in host, {:.0f} on "
      "nvme, {:.0f} on peers, missed {:.0f} (hit rate {:.1f}%)\n",
      j["lookups"].get<double>(), hit, hit_nvme, hit_peer, miss,
      100.0 * (hit + hit_nvme + hit_peer) /
          std::max(1.0, hit + hit_nvme + hit_peer + miss));
  fmt::print(
      "  gets        {:.0f} segments hit, {:.0f} missed (hit rate {:.1f}%)\n",
      ghit, gmiss, 100.0 * ghit / std::max(1.0, ghit + gmiss));
  fmt::print(
      "  puts        {:.0f} stored, {:.0f} deduplicated, {:.0f} failed\n",
      j["put_segments"]["stored"].get<double>(),
      j["put_segments"]["dedup"].get<double>(),
      j["put_segments"]["failed"].get<double>());
  fmt::print("  evictions   {} segments, {}\n", h["evictions"].get<uint64_t>(),
             HumanBytes(h["evicted_bytes"].get<double>()));
  if (j.contains("hbm")) {
    const auto& b = j["hbm"];
    const auto& mine = b["namespace"];
    const double hits = b["hits"].get<double>();
    const double misses = b["misses"].get<double>();
    fmt::print(
        "  hbm tier    {} / {} used, {} segments ({} / quota {} this "
        "namespace); device loads hit {:.0f}, missed {:.0f} (hit rate "
        "{:.1f}%); {} admitted, {} evicted\n",
        HumanBytes(b["used_bytes"].get<double>()),
        HumanBytes(b["capacity_bytes"].get<double>()),
        b["segments"].get<uint64_t>(),
        HumanBytes(mine["used_bytes"].get<double>()),
        HumanBytes(mine["quota_bytes"].get<double>()), hits, misses,
        100.0 * hits / std::max(1.0, hits + misses),
        b["admissions"].get<uint64_t>(), b["evictions"].get<uint64_t>());
  }
  if (j.contains("nvme")) {
    const auto& n = j["nvme"];
    fmt::print(
        "  nvme tier   {} / {} used, {} segments, {} evictions, {} checksum "
        "failures ({}, {})\n",
        HumanBytes(n["used_bytes"].get<double>()),
        HumanBytes(n["capacity_bytes"].get<double>()),
        n["segments"].get<uint64_t>(), n["evictions"].get<uint64_t>(),
        n["checksum_failures"].get<uint64_t>(),
        n["direct_io"].get<bool>() ? "O_DIRECT" : "buffered",
        n["io_uring"].get<bool>() ? "io_uring" : "pread/pwrite");
    fmt::print("  recovered   {} segments, {} at start-up{}\n",
               n["recovered_segments"].get<uint64_t>(),
               HumanBytes(n["recovered_bytes"].get<double>()),
               n["catalog_recreated"].get<bool>()
                   ? " (damaged catalog recreated)"
                   : "");
    fmt::print(
        "  mover       {} demoted in {} batches ({} failed), {} dirty "
        "waiting, {} reservations held back; {} promoted; policy {}\n",
        n["demotions_done"].get<uint64_t>(),
        n["demotion_batches"].get<uint64_t>(),
        n["demotions_failed"].get<uint64_t>(),
        h["dirty_segments"].get<uint64_t>(),
        h["backpressure_rejections"].get<uint64_t>(),
        n["promotions_done"].get<uint64_t>(),
        j["write_policy"].get<std::string>());
  }
  if (j.contains("peer")) {
    // The peer tier ([cluster]): what this node fetched and served.
    const auto& p = j["peer"];
    auto n = [&](const char* key) { return p.value(key, 0.0); };
    fmt::print(
        "  peer tier   {} live peers, directory {}; fetched {:.0f} segments "
        "/ {} in {:.0f} fetches ({:.0f} failed over), served {:.0f} / {}\n",
        static_cast<uint64_t>(n("live_peers")),
        p.value("directory_up", false) ? "up" : "DOWN", n("fetch_segments"),
        HumanBytes(n("fetch_bytes")), n("fetches"), n("failovers"),
        n("served_segments"), HumanBytes(n("served_bytes")));
    fmt::print(
        "    errors    {:.0f} timeout, {:.0f} unavailable, {:.0f} stale, "
        "{:.0f} "
        "checksum, {:.0f} refused; directory lookups {:.0f} failed of "
        "{:.0f}\n",
        n("errors_timeout"), n("errors_unavailable"), n("errors_stale"),
        n("errors_checksum"), n("errors_refused"), n("lookup_errors"),
        n("lookups"));
  }
  if (j.contains("transfers")) {
    // Registered-pool transfers (daemon-wide) and this namespace's waits.
    const auto& t = j["transfers"];
    auto u = [&](const char* a, const char* b) {
      return t.contains(a) && t[a].contains(b) ? t[a][b].get<double>() : 0.0;
    };
    auto mean_ms = [](const nlohmann::json& h) {
      const double n = h.value("count", 0.0);
      return n > 0 ? 1e3 * h.value("sum", 0.0) / n : 0.0;
    };
    fmt::print(
        "  transfers   {} loads, {} stores, {} prefetches, {} pools "
        "registered\n",
        t.value("loads", uint64_t{0}), t.value("stores", uint64_t{0}),
        t.value("prefetches", uint64_t{0}),
        t.value("registered_pools", uint64_t{0}));
    fmt::print(
        "    loaded    {:.0f} segments / {} from hbm, {:.0f} / {} from host, "
        "{:.0f} / {} from nvme, {:.0f} missed; mean {:.3f} ms per Load\n",
        u("load_segments", "hbm"), HumanBytes(u("load_bytes", "hbm")),
        u("load_segments", "host"), HumanBytes(u("load_bytes", "host")),
        u("load_segments", "nvme"), HumanBytes(u("load_bytes", "nvme")),
        u("load_segments", "miss"),
        mean_ms(t.value("load_seconds", nlohmann::json::object())));
    fmt::print(
        "    stored    {} segments / {}, {} deduplicated; mean {:.3f} ms per "
        "Store\n",
        t.value("store_segments", uint64_t{0}),
        HumanBytes(t.value("store_bytes", 0.0)),
        t.value("store_dedup", uint64_t{0}),
        mean_ms(t.value("store_seconds", nlohmann::json::object())));
    if (const uint64_t w = t.value("weights_loads", uint64_t{0}); w > 0) {
      fmt::print(
          "    weights   {} shard loads; mean {:.3f} ms per load\n", w,
          mean_ms(t.value("weights_load_seconds", nlohmann::json::object())));
    }
    if (t.contains("promoted")) {
      fmt::print(
          "    tiers     {:.0f} segments / {} nvme -> host, {:.0f} / {} host "
          "-> nvme\n",
          u("promoted", "segments"), HumanBytes(u("promoted", "bytes")),
          u("written_to_nvme", "segments"),
          HumanBytes(u("written_to_nvme", "bytes")));
    }
    const auto w = t.value("layer_waits", nlohmann::json::object());
    const double waits = w.value("count", 0.0);
    fmt::print(
        "    waits     {:.0f} WaitLayer/Wait calls, {:.0f} blocked >= 1 us, "
        "{:.3f} s blocked in all\n",
        waits, w.value("blocked", 0.0), w.value("seconds", 0.0));
  }
  if (j.contains("workers")) {
    fmt::print(
        "  workers     {} queued, {} rejected (Busy); {} Reserves "
        "waited for write-back, {} still Busy\n",
        j["workers"].value("queue_depth", uint64_t{0}),
        j["workers"].value("rejections", uint64_t{0}),
        h.value("backpressure_waits", uint64_t{0}),
        h.value("backpressure_busy", uint64_t{0}));
  }
  fmt::print("  leases      {} active, {} segments referenced\n",
             j["active_leases"].get<uint64_t>(),
             h["referenced_segments"].get<uint64_t>());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tierkv: command-line client for tierkvd"};
  app.require_subcommand(1);
  Connection conn;
  app.add_option("--socket", conn.socket, "daemon socket")
      ->capture_default_str();
  app.add_option("-n,--namespace", conn.ns, "namespace")->capture_default_str();
  app.add_option("--token", conn.token, "namespace token");
  app.add_option(
      "--token-file", conn.token_file,
      "file holding the token (default: <socket dir>/<namespace>.token)");

  auto* status = app.add_subcommand(
      "status", "Is the daemon up? Version, uptime, namespaces");
  bool json_out = false;
  auto* stats = app.add_subcommand(
      "stats", "Hit rates, occupancy, evictions of a namespace");
  stats->add_flag("--json", json_out, "print the raw JSON");
  bool watch = false;
  tierkv::tools::WatchOptions watch_options;
  stats->add_flag("--watch", watch,
                  "a live full-screen view: rates over each refresh, hit "
                  "share and occupancy per tier as bars (q quits)");
  stats
      ->add_option("--interval", watch_options.interval_s,
                   "--watch: seconds between refreshes (>= 0.1)")
      ->capture_default_str();
  stats
      ->add_option("--count", watch_options.count,
                   "--watch: stop after this many refreshes (0: until q)")
      ->capture_default_str();

  std::string page, tokens, file, out;
  uint16_t layer = 0;
  uint16_t part = 0;
  auto add_key = [&](CLI::App* sub) {
    sub->add_option("--page", page, "page hash (32 hex digits)");
    sub->add_option("--tokens", tokens, "token ids forming one page: 1,2,3");
    sub->add_option("--layer", layer, "layer")->capture_default_str();
    sub->add_option("--part", part, "part index within the layer")
        ->capture_default_str();
  };
  auto* put = app.add_subcommand("put", "Store a file as one segment");
  add_key(put);
  put->add_option("--file", file, "bytes to store")->required();
  auto* get = app.add_subcommand("get", "Fetch one segment");
  add_key(get);
  get->add_option("--out", out,
                  "write the bytes here (default: print size and hash)");
  uint32_t limit = 100;
  auto* ls = app.add_subcommand("ls", "List stored segments");
  ls->add_option("--limit", limit, "at most this many")->capture_default_str();

  tierkv::tools::DemoOptions demo_options;
  auto* demo = app.add_subcommand(
      "demo", "Run a synthetic byte workload (chat sessions sharing a prefix)");
  demo->add_option("--sessions", demo_options.sessions)->capture_default_str();
  demo->add_option("--prefix-tokens", demo_options.shared_prefix_tokens)
      ->capture_default_str();
  demo->add_option("--session-tokens", demo_options.session_tokens)
      ->capture_default_str();
  demo->add_option("--layers", demo_options.layers)->capture_default_str();

  tierkv::tools::SoakOptions soak_options;
  uint32_t soak_seconds = 600;
  std::string soak_json;
  auto* soak = app.add_subcommand(
      "soak",
      "Many clients running mixed Put/Get/lease/Match/Flush/reconnect load "
      "(scripts/soak.sh)");
  soak->add_option("--clients", soak_options.clients)->capture_default_str();
  soak->add_option("--seconds", soak_seconds)->capture_default_str();
  soak->add_option("--pages", soak_options.pages, "shared working set")
      ->capture_default_str();
  soak->add_option("--segment-bytes", soak_options.segment_bytes)
      ->capture_default_str();
  bool soak_no_flush = false;
  soak->add_flag("--no-flush", soak_no_flush, "skip Flush (no NVMe tier)");
  soak->add_option("--json", soak_json, "write the report as JSON");

  ReplayCommand replay_cmd;
  tierkv::tools::ReplayOptions replay_options;
  auto* replay = app.add_subcommand(
      "replay",
      "Replay a Mooncake prefix trace through fresh tierkvds and compare the "
      "token hit rate with offline LRU and Belady (starts its own daemons)");
  replay->add_option("trace", replay_cmd.trace, "trace (.jsonl)")
      ->required()
      ->check(CLI::ExistingFile);
  replay
      ->add_option("--host-blocks", replay_cmd.host_blocks,
                   "host tier sizes to replay, in 512-token blocks")
      ->delimiter(',')
      ->capture_default_str();
  replay
      ->add_option(
          "--nvme-blocks", replay_options.nvme_blocks,
          "NVMe tier in blocks, write_back (0: none; tierkvd needs at least "
          "16 MiB, 4096 blocks)")
      ->capture_default_str();
  replay
      ->add_option("--policies", replay_cmd.policies,
                   "host eviction policies (tierkvd's eviction_policy)")
      ->delimiter(',')
      ->capture_default_str();
  replay->add_option("--shards", replay_options.shards, "host tier shards")
      ->capture_default_str();
  replay->add_option("--json", replay_cmd.json_path, "write the report here");
  replay->add_option("--plot", replay_cmd.plot_path,
                     "draw hit rate vs capacity into this PNG");
  replay
      ->add_option("--speed", replay_options.speed,
                   "honour the trace's timestamps, this many times faster "
                   "(0: as fast as possible)")
      ->capture_default_str();
  replay->add_flag("--no-progress", replay_cmd.no_progress,
                   "no progress bar (shown only when stderr is a terminal)");
  auto* nodes_option =
      replay
          ->add_option("--nodes", replay_cmd.nodes,
                       "replay over a cluster of this many tierkvds sharing "
                       "pages through a redis-server the replay starts (one "
                       "--host-blocks size per node, default 6000; shards "
                       "default 1)")
          ->check(CLI::Range(1, 64))
          ->capture_default_str();
  replay
      ->add_option("--routing", replay_cmd.routing,
                   "with --nodes: round-robin, or kv-aware (the node whose "
                   "Match reports the longest prefix of its own)")
      ->check(CLI::IsMember({"round-robin", "kv-aware"}))
      ->capture_default_str();
  replay->add_flag("--no-peers", replay_cmd.no_peers,
                   "with --nodes: no page sharing (every node an island)");
  replay->add_flag("--local-baseline", replay_cmd.local_baseline,
                   "with --nodes: also replay the cluster without peers "
                   "first, and compare");

  tierkv::tools::WeightsCommand weights_cmd;
  auto* weights = tierkv::tools::AddWeightsCommand(app, weights_cmd);

  CLI11_PARSE(app, argc, argv);

  if (replay->parsed() && nodes_option->count() > 0) {
    if (replay->count("--host-blocks") == 0) replay_cmd.host_blocks = {6000};
    if (replay->count("--shards") == 0) replay_options.shards = 1;
    return RunClusterReplay(replay_cmd, replay_options);
  }
  if (replay->parsed()) return RunReplay(replay_cmd, replay_options);
  if (soak->parsed()) {
    soak_options.flush = !soak_no_flush;
    return RunSoak(conn, soak_options, soak_seconds, soak_json);
  }
  auto client = Connect(conn, /*open_namespace=*/!status->parsed());
  if (!client.ok()) return Fail(client.status());
  tierkv::Client& c = **client;

  if (status->parsed()) {
    auto info = c.Ping();
    if (!info.ok()) return Fail(info.status());
    auto j = nlohmann::json::parse(*info);
    fmt::print("tierkvd up: {} (pid {}), uptime {:.0f} s, namespaces: {}\n",
               j["version"].get<std::string>(), j["pid"].get<int>(),
               j["uptime_s"].get<double>(), j["namespaces"].dump());
    return 0;
  }
  if (stats->parsed()) {
    if (watch) {
      // A connection that failed (the daemon restarted, say) is dropped
      // and opened again at the next refresh.
      std::unique_ptr<tierkv::Client> watched = std::move(*client);
      auto fetch = [&]() -> tierkv::Result<std::string> {
        if (!watched) {
          auto again = Connect(conn, /*open_namespace=*/true);
          if (!again.ok()) return again.status();
          watched = std::move(*again);
        }
        auto stats_json = watched->StatsJson();
        if (!stats_json.ok()) watched.reset();
        return stats_json;
      };
      Status s = tierkv::tools::RunStatsWatch(fetch, watch_options);
      return s.ok() ? 0 : Fail(s);
    }
    auto s = c.StatsJson();
    if (!s.ok()) return Fail(s.status());
    return PrintStats(*s, json_out);
  }
  if (ls->parsed()) {
    auto segments = c.List(limit);
    if (!segments.ok()) return Fail(segments.status());
    fmt::print("{:<32} {:>5} {:>4} {:>10} {:>4} {}\n", "page", "layer", "part",
               "bytes", "refs", "tier");
    for (const auto& s : *segments) {
      fmt::print("{:<32} {:>5} {:>4} {:>10} {:>4} {}\n", s.key.page.ToHex(),
                 s.key.layer, s.key.part, s.size, s.refs,
                 tierkv::TierName(s.tier));
    }
    return 0;
  }
  if (demo->parsed()) {
    Status s = tierkv::tools::RunDemo(c, demo_options);
    return s.ok() ? 0 : Fail(s);
  }
  if (weights->parsed()) {
    Status s = tierkv::tools::RunWeightsCommand(c, weights_cmd);
    return s.ok() ? 0 : Fail(s);
  }
  auto hash = ParsePage(page, tokens, conn.ns);
  if (!hash.ok()) return Fail(hash.status());
  if (part > 255) return Fail(Status::InvalidArgument("--part must be < 256"));
  tierkv::SegmentKey key{*hash, layer, static_cast<uint8_t>(part)};
  if (put->parsed()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return Fail(Status::NotFound("cannot read " + file));
    std::string data((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
    tierkv::SegmentWrite w{key, std::as_bytes(std::span(data))};
    const tierkv::PutResult r = c.Put(std::span(&w, 1))[0];
    if (!r.ok()) return Fail(r.status);
    if (r.already_stored) {
      fmt::print("{} already stored (deduplicated, nothing copied)\n",
                 key.ToString());
      return 0;
    }
    fmt::print("stored {} ({} bytes)\n", key.ToString(), data.size());
    return 0;
  }
  if (get->parsed()) {
    auto lease = c.Acquire(std::span(&key, 1));
    if (!lease.ok()) return Fail(lease.status());
    if (!lease->statuses()[0].ok()) return Fail(lease->statuses()[0]);
    auto bytes = lease->data(0);
    if (out.empty()) {
      fmt::print("{}: {} bytes\n", key.ToString(), bytes.size());
    } else {
      std::ofstream o(out, std::ios::binary);
      o.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
      if (!o) return Fail(Status::IOError("cannot write " + out));
      fmt::print("wrote {} bytes to {}\n", bytes.size(), out);
    }
    return 0;
  }
  return 0;
}
