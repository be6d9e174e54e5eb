// A prefix trace replayed through a cluster of real tierkvds (see
// cluster_replay.h).
#include "tools/cluster_replay.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <system_error>
#include <thread>

#include "tools/daemon_launcher.h"
#include "tools/prefix_hit_rules.h"
#include "tools/prefix_replayer.h"
#include "tools/redis_launcher.h"
#include "transport/directory/directory.h"
#include "transport/directory/redis_directory.h"

namespace tierkv::tools {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kClusterName[] = "replay";
constexpr uint32_t kMaxNodes = 64;
constexpr size_t kSecretBytes = 32;  // the daemon's minimum
// The [cluster] lookup_budget_us range tierkvd accepts.
constexpr uint32_t kMinLookupBudgetUs = 100;
constexpr uint32_t kMaxLookupBudgetUs = 1000000;
// The probe namespace of the start-up check: its own, so the replayed
// namespace's caches see only the trace. tierkvd's least host tier.
constexpr char kProbeNamespace[] = "probe";
constexpr char kProbeToken[] = "probe-token";
constexpr uint32_t kProbeBytesPerToken = 8;
constexpr char kProbeHostBytes[] = "1MiB";
// How long the nodes get to see each other as live peers at start-up.
constexpr std::chrono::seconds kPeersVisibleTimeout{30};
// The pause between two polls of the directory (a bounded poll of a real
// condition; the daemon announces a publish nowhere else).
constexpr std::chrono::microseconds kPollPause{500};

double Share(uint64_t part, uint64_t whole) {
  return whole == 0 ? 0.0
                    : static_cast<double>(part) / static_cast<double>(whole);
}

std::string Tail(const std::string& text, int lines) {
  size_t at = text.size();
  while (lines-- > 0 && at > 0) {
    at = text.rfind('\n', at - 1);
    if (at == std::string::npos) return text;
  }
  return text.substr(at);
}

std::string NodeId(uint32_t index) { return fmt::format("node-{}", index); }

// A private directory (the cluster secret), removed on destruction.
class PrivateDir {
 public:
  PrivateDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "tierkv-cluster-XXXXXX")
            .string();
    if (::mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~PrivateDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  PrivateDir(const PrivateDir&) = delete;
  PrivateDir& operator=(const PrivateDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Writes kSecretBytes random bytes to `path`, mode 0600.
Status WriteSecret(const std::string& path) {
  std::random_device rd;
  std::vector<unsigned char> bytes(kSecretBytes);
  for (unsigned char& b : bytes) b = static_cast<unsigned char>(rd());
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status::IOError("cannot create " + path);
  const bool written = ::write(fd, bytes.data(), bytes.size()) ==
                       static_cast<ssize_t>(bytes.size());
  ::close(fd);
  return written ? Status::OK() : Status::IOError("cannot write " + path);
}

// One node: its daemon, the replay's client and the replayer over it.
struct Node {
  std::string id;
  std::unique_ptr<DaemonLauncher> daemon;
  std::unique_ptr<Client> client;
  std::unique_ptr<PrefixReplayer> replayer;
  ClusterNodeResult result;
};

// The directory's record, read by the replay straight from Redis (the
// schema of transport/directory/redis_directory.h): whether a node is named
// a holder of pages of the replayed namespace.
class HolderCheck {
 public:
  HolderCheck(const RedisLauncher& redis, uint64_t fingerprint)
      : redis_(redis),
        key_prefix_(transport::RedisDirectory::PageKeyPrefix(
            kClusterName,
            transport::DirectoryNamespace{kReplayNamespace, fingerprint})) {}

  // Whether the directory names `node_id` a holder of every page.
  Result<bool> AllHeld(const std::string& node_id,
                       std::span<const PageHash> pages) {
    if (pages.empty()) return true;
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    if (connection_ == nullptr || connection_->broken()) {
      auto c = redis_.Connect(deadline);
      if (!c.ok()) return c.status();
      connection_ = std::move(c).value();
    }
    mget_.assign(1, "MGET");
    for (const PageHash& page : pages) {
      mget_.push_back(key_prefix_ + page.ToHex());
    }
    auto values = connection_->Command(mget_, deadline);
    if (!values.ok()) return values.status();
    if (values->is_error()) return Status::Internal("redis: " + values->str);
    if (values->elements.size() != pages.size()) {
      return Status::Internal("redis: MGET answered another count of keys");
    }
    for (const transport::RedisReply& value : values->elements) {
      // Nil (no entry) or not a holder list: no holder.
      auto holders = transport::RedisDirectory::ParseHolderList(value.str);
      if (!holders.ok() || std::find(holders->begin(), holders->end(),
                                     node_id) == holders->end()) {
        return false;
      }
    }
    return true;
  }

 private:
  const RedisLauncher& redis_;
  const std::string key_prefix_;
  std::unique_ptr<transport::RedisConnection> connection_;
  transport::RedisCommand mget_;
};

// The start-up check: every node stores a probe page, and every other node
// must Match it as a peer page (it is published, and the others' live sets
// hold its node). Bounded by kPeersVisibleTimeout.
Status CheckPeersVisible(std::vector<Node>& nodes) {
  const LayoutSpec layout = ReplayLayout(kProbeBytesPerToken);
  std::vector<std::unique_ptr<Client>> probes;
  for (Node& node : nodes) {
    auto c = node.daemon->Connect(kProbeNamespace, kProbeToken);
    if (!c.ok()) return c.status();
    TIERKV_RETURN_IF_ERROR((*c)->RegisterLayout(layout));
    probes.push_back(std::move(c).value());
  }
  const std::vector<std::byte> payload(layout.SegmentBytes(0, 0),
                                       std::byte{0x70});
  for (size_t k = 0; k < nodes.size(); ++k) {
    const PageHash page{.lo = k, .hi = ~kReplayPageSalt};
    const SegmentWrite write{.key = {page, 0, 0}, .data = payload};
    for (const PutResult& r : probes[k]->Put(std::span(&write, 1))) {
      if (!r.ok()) return r.status;
    }
  }
  const auto deadline = Clock::now() + kPeersVisibleTimeout;
  for (size_t k = 0; k < nodes.size(); ++k) {
    const PageHash page{.lo = k, .hi = ~kReplayPageSalt};
    for (size_t j = 0; j < nodes.size(); ++j) {
      if (j == k) continue;
      while (true) {
        auto m = probes[j]->Match(std::span(&page, 1), {.prefetch = false});
        if (!m.ok()) return m.status();
        if (m->leading_pages == 1 && m->tiers[0] == Tier::kPeer) break;
        if (Clock::now() >= deadline) {
          return Status::Unavailable(fmt::format(
              "{} does not see {}'s page as a peer page after {} s; {} log "
              "ends:{}",
              nodes[j].id, nodes[k].id, kPeersVisibleTimeout.count(),
              nodes[k].id, Tail(nodes[k].daemon->log(), 10)));
        }
        std::this_thread::sleep_for(kPollPause);
      }
    }
  }
  return Status::OK();
}

}  // namespace

Status ClusterReplayOptions::Validate() const {
  if (nodes == 0 || nodes > kMaxNodes) {
    return Status::InvalidArgument(
        fmt::format("nodes must be in [1, {}]", kMaxNodes));
  }
  TIERKV_RETURN_IF_ERROR(node.Validate());
  if (node.nvme_blocks != 0) {
    return Status::InvalidArgument(
        "the cluster replay runs without an NVMe tier (node.nvme_blocks 0)");
  }
  if (node.speed != 0) {
    return Status::InvalidArgument(
        "the cluster replay runs as fast as the directory allows (node.speed "
        "0)");
  }
  if (lookup_budget_us < kMinLookupBudgetUs ||
      lookup_budget_us > kMaxLookupBudgetUs) {
    return Status::InvalidArgument(
        fmt::format("lookup_budget_us must be in [{}, {}]", kMinLookupBudgetUs,
                    kMaxLookupBudgetUs));
  }
  return Status::OK();
}

double ClusterNodeResult::LocalHitRate() const {
  return Share(local_hit_tokens, input_tokens);
}
double ClusterNodeResult::PeerHitRate() const {
  return Share(peer_hit_tokens, input_tokens);
}
double ClusterNodeResult::ClusterHitRate() const {
  return Share(hit_tokens(), input_tokens);
}

uint64_t ClusterReplayResult::requests() const {
  uint64_t sum = 0;
  for (const auto& n : nodes) sum += n.requests;
  return sum;
}
uint64_t ClusterReplayResult::input_tokens() const {
  uint64_t sum = 0;
  for (const auto& n : nodes) sum += n.input_tokens;
  return sum;
}
uint64_t ClusterReplayResult::local_hit_tokens() const {
  uint64_t sum = 0;
  for (const auto& n : nodes) sum += n.local_hit_tokens;
  return sum;
}
uint64_t ClusterReplayResult::peer_hit_tokens() const {
  uint64_t sum = 0;
  for (const auto& n : nodes) sum += n.peer_hit_tokens;
  return sum;
}
double ClusterReplayResult::LocalHitRate() const {
  return Share(local_hit_tokens(), input_tokens());
}
double ClusterReplayResult::PeerHitRate() const {
  return Share(peer_hit_tokens(), input_tokens());
}
double ClusterReplayResult::ClusterHitRate() const {
  return Share(hit_tokens(), input_tokens());
}

std::string ClusterReplayDaemonConfig(const ClusterReplayOptions& options,
                                      uint32_t index,
                                      const std::string& directory_url,
                                      const std::string& password_file,
                                      const std::string& secret_file) {
  ReplayOptions node = options.node;
  node.shared = options.peers;
  return fmt::format(
             "[server]\n"
             // Several daemons and Redis share the machine's cores.
             "io_threads = 1\n"
             "workers = 1\n"
             "load_workers = 1\n\n"
             "[cluster]\n"
             "name = \"{}\"\n"
             "node_id = \"{}\"\n"
             "secret_file = \"{}\"\n"
             "directory = \"{}\"\n"
             "directory_password_file = \"{}\"\n"
             // UCX 1.13's tcp transport refuses 127/8 addresses other than
             // 127.0.0.1, so every node listens there, on a port of its own.
             "peer_listen = \"127.0.0.1:0\"\n"
             "lookup_budget_us = {}\n\n",
             kClusterName, NodeId(index), secret_file, directory_url,
             password_file, options.lookup_budget_us) +
         ReplayDaemonConfig(node) +
         fmt::format(
             "\n[[namespace]]\n"
             "name = \"{}\"\n"
             "token = \"{}\"\n"
             "host_bytes = \"{}\"\n"
             "shards = 1\n"
             "shared = true\n",
             kProbeNamespace, kProbeToken, kProbeHostBytes);
}

Result<ClusterReplayResult> ReplayPrefixTraceOnCluster(
    std::span<const TraceRequest> trace, const ClusterReplayOptions& options) {
  TIERKV_RETURN_IF_ERROR(options.Validate());
  ClusterReplayResult out;
  out.options = options;
  out.options.progress = nullptr;

  RedisLauncher redis;
  TIERKV_RETURN_IF_ERROR(redis.Start({.binary = options.redis_server}));
  PrivateDir dir;
  if (dir.path().empty()) {
    return Status::IOError("no directory for the cluster secret");
  }
  const std::string secret_file = (dir.path() / "cluster.key").string();
  TIERKV_RETURN_IF_ERROR(WriteSecret(secret_file));

  std::vector<Node> nodes(options.nodes);
  const LayoutSpec layout = ReplayLayout(options.node.bytes_per_token);
  for (uint32_t i = 0; i < options.nodes; ++i) {
    Node& node = nodes[i];
    node.id = NodeId(i);
    node.result.node_id = node.id;
    node.daemon = std::make_unique<DaemonLauncher>();
    const Status started = node.daemon->Start(
        {.config_toml = ClusterReplayDaemonConfig(
             options, i, redis.url(), redis.password_file(), secret_file),
         .env = {{"UCX_TLS", "tcp"}, {"UCX_WARN_UNUSED_ENV_VARS", "n"}},
         .bin_dir = options.node.bin_dir,
         .log_level = "warn"});
    if (!started.ok()) {
      return Status(started.code(),
                    fmt::format("{}: {}", node.id, started.message()));
    }
    auto client = node.daemon->Connect(kReplayNamespace, kReplayToken);
    if (!client.ok()) return client.status();
    node.client = std::move(client).value();
    TIERKV_RETURN_IF_ERROR(node.client->RegisterLayout(layout));
    node.replayer = std::make_unique<PrefixReplayer>(
        *node.client, options.node.bytes_per_token, /*prefetch=*/false);
  }
  if (options.peers && options.nodes > 1) {
    TIERKV_RETURN_IF_ERROR(CheckPeersVisible(nodes));
  }

  HolderCheck holders(redis, layout.Fingerprint());
  const auto start = Clock::now();
  Clock::duration waited{0};
  for (size_t r = 0; r < trace.size(); ++r) {
    const TraceRequest& request = trace[r];
    uint32_t target = static_cast<uint32_t>(r % options.nodes);
    if (options.routing == ClusterRouting::kKvAware) {
      uint32_t best_run = 0;
      const uint32_t first = target;
      for (uint32_t k = 0; k < options.nodes; ++k) {
        const uint32_t candidate = (first + k) % options.nodes;
        auto own = nodes[candidate].replayer->OwnLeadingPages(request);
        if (!own.ok()) return own.status();
        if (k == 0 || *own > best_run) {
          best_run = *own;
          target = candidate;
        }
      }
    }
    Node& node = nodes[target];
    auto outcome = node.replayer->Request(request);
    if (!outcome.ok()) {
      return Status(
          outcome.status().code(),
          fmt::format("request {} of {} on {}: {}; its log ends:{}", r + 1,
                      trace.size(), node.id, outcome.status().message(),
                      Tail(node.daemon->log(), 10)));
    }
    ClusterNodeResult& n = node.result;
    n.requests++;
    n.input_tokens += request.input_length;
    n.local_hit_tokens += HitTokens(outcome->host_pages + outcome->nvme_pages);
    n.peer_hit_tokens += HitTokens(outcome->peer_pages);
    n.get_missed += outcome->get_missed;
    n.put_failed += outcome->put_failed;

    // The next request may be routed anywhere: wait until this node is
    // named a holder of what it now holds (see the file comment).
    if (options.peers && options.nodes > 1) {
      const auto wait_start = Clock::now();
      const auto wait_deadline = wait_start + options.publish_timeout;
      while (true) {
        auto held = holders.AllHeld(node.id, node.replayer->pages());
        if (!held.ok()) {
          return Status(held.status().code(),
                        fmt::format("reading the directory: {}",
                                    held.status().message()));
        }
        if (*held) break;
        if (Clock::now() >= wait_deadline) {
          out.publish_timeouts++;
          break;
        }
        std::this_thread::sleep_for(kPollPause);
      }
      waited += Clock::now() - wait_start;
    }
    if (options.progress) options.progress(r + 1, trace.size());
  }
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  out.publish_wait_seconds = std::chrono::duration<double>(waited).count();

  for (Node& node : nodes) {
    if (auto stats = node.client->StatsJson(); stats.ok()) {
      const auto j = nlohmann::json::parse(*stats, nullptr,
                                           /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("peer")) {
        node.result.peer_stats_json = j["peer"].dump();
      }
    }
  }
  for (Node& node : nodes) {
    node.replayer.reset();
    node.client.reset();  // disconnect before the daemon stops
  }
  for (Node& node : nodes) {
    if (const int status = node.daemon->Stop(); status != 0) {
      return Status::Internal(fmt::format(
          "{} did not stop cleanly after the replay (wait status {}): {}",
          node.id, status, Tail(node.daemon->log(), 20)));
    }
    out.nodes.push_back(std::move(node.result));
  }
  return out;
}

}  // namespace tierkv::tools
