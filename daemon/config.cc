#include "daemon/config.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <set>
#include <sstream>

#include "common/byte_size.h"
#include "common/private_dirs.h"
#include "storage/device/device_backend_kind.h"

namespace tierkv::daemon {
namespace {

Status Bad(std::string_view where, std::string_view what) {
  return Status::InvalidArgument(fmt::format("config {}: {}", where, what));
}

// The name of the [[namespace]] entry a key belongs to; none for the keys
// of other sections.
using Entry = std::optional<std::string_view>;

// "section.key", or "namespace.key (namespace 'name')" for a key of one
// [[namespace]] entry, as every config error begins.
std::string KeyName(std::string_view section, std::string_view key,
                    Entry entry = std::nullopt) {
  if (section.empty()) return std::string(key);
  if (!entry) return fmt::format("{}.{}", section, key);
  return fmt::format("{}.{} (namespace '{}')", section, key, *entry);
}

std::string NamespaceKey(const NamespaceConfig& ns, std::string_view key) {
  return KeyName("namespace", key, ns.name);
}

// Rejects keys we do not know: a typo must not silently become a default.
// `section` is "" for the top level.
Status CheckKeys(const toml::table& table, std::string_view section,
                 std::set<std::string_view> known, Entry entry = std::nullopt) {
  for (const auto& [key, value] : table) {
    if (!known.count(key.str())) {
      return Bad(KeyName(section, key.str(), entry),
                 fmt::format("unknown key (line {})", key.source().begin.line));
    }
  }
  return Status::OK();
}

// The readers below leave `out` alone when `key` is absent and name the key
// (KeyName) when its value is wrong.

template <typename T>
Status ReadInt(const toml::table& t, std::string_view section,
               std::string_view key, T& out, Entry entry = std::nullopt) {
  const toml::node* node = t.get(key);
  if (!node) return Status::OK();
  auto v = node->value_exact<int64_t>();
  if (!v || *v < 0 ||
      static_cast<uint64_t>(*v) > std::numeric_limits<T>::max()) {
    return Bad(KeyName(section, key, entry),
               fmt::format("must be a non-negative integer <= {}",
                           std::numeric_limits<T>::max()));
  }
  out = static_cast<T>(*v);
  return Status::OK();
}

Status ReadString(const toml::table& t, std::string_view section,
                  std::string_view key, std::string& out,
                  Entry entry = std::nullopt) {
  const toml::node* node = t.get(key);
  if (!node) return Status::OK();
  auto v = node->value<std::string>();
  if (!v) return Bad(KeyName(section, key, entry), "must be a string");
  out = *v;
  return Status::OK();
}

// A byte count: a TOML integer, or a string in ParseByteSize's grammar
// (common/byte_size.h). 0 is read as 0; Validate() says which keys may be.
Status ReadBytes(const toml::table& t, std::string_view section,
                 std::string_view key, uint64_t& out,
                 Entry entry = std::nullopt) {
  const toml::node* node = t.get(key);
  if (!node) return Status::OK();
  if (auto i = node->value_exact<int64_t>()) {
    if (*i < 0) return Bad(KeyName(section, key, entry), "must be >= 0");
    out = static_cast<uint64_t>(*i);
    return Status::OK();
  }
  if (auto s = node->value<std::string>()) {
    auto parsed = ParseByteSize(*s);
    if (!parsed.ok()) {
      return Bad(KeyName(section, key, entry), parsed.status().message());
    }
    out = *parsed;
    return Status::OK();
  }
  return Bad(KeyName(section, key, entry),
             "must be a byte count or a string like \"1GiB\"");
}

Status ReadBool(const toml::table& t, std::string_view section,
                std::string_view key, bool& out, Entry entry = std::nullopt) {
  const toml::node* node = t.get(key);
  if (!node) return Status::OK();
  auto v = node->value_exact<bool>();
  if (!v) return Bad(KeyName(section, key, entry), "must be true or false");
  out = *v;
  return Status::OK();
}

Status ReadMode(const toml::table& t, uint32_t& out) {
  const toml::node* node = t.get("socket_mode");
  if (!node) return Status::OK();
  auto s = node->value<std::string>();
  if (!s || s->empty() || s->size() > 4 ||
      s->find_first_not_of("01234567") != std::string::npos) {
    return Bad("server.socket_mode", "must be an octal string like \"0660\"");
  }
  out = static_cast<uint32_t>(std::stoul(*s, nullptr, 8));
  return Status::OK();
}

std::string RandomToken() {
  std::random_device rd;
  std::string token;
  for (int i = 0; i < 4; ++i) token += fmt::format("{:08x}", rd());
  return token;
}

// Sets ns.token from ns.token_file, creating the file (and its directories)
// with a random token when it does not exist. The errors name the file but
// not the key; ResolveTokens adds it.
Status ReadOrCreateTokenFile(NamespaceConfig& ns) {
  const std::string& path = ns.token_file;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    // The token is the namespace's only secret: refuse a file anyone may
    // read, as ssh refuses such a key (group read is how engines in the
    // socket's group get it).
    if (!S_ISREG(st.st_mode)) {
      return Status::InvalidArgument(path + " is not a regular file");
    }
    if (st.st_mode & 0007) {
      return Status::InvalidArgument(
          fmt::format("{} is accessible by others (mode {:04o}); run chmod "
                      "o-rwx {}",
                      path, st.st_mode & 07777, path));
    }
    std::ifstream in(path);
    if (!in) {
      return Status::IOError(
          fmt::format("cannot read {}: {}", path, std::strerror(errno)));
    }
    std::getline(in, ns.token);
    while (!ns.token.empty() &&
           std::isspace(static_cast<unsigned char>(ns.token.back()))) {
      ns.token.pop_back();
    }
    if (ns.token.size() < 8) {
      return Status::InvalidArgument(
          path + " holds fewer than 8 characters (a token is at least 8)");
    }
    return Status::OK();
  }
  if (Status s = CreatePrivateDirectories(
          std::filesystem::path(path).parent_path(), 0750);
      !s.ok()) {
    return Status(s.code(),
                  fmt::format("cannot create {}: {}", path, s.message()));
  }
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return Status::IOError(
        fmt::format("cannot create {}: {}", path, std::strerror(errno)));
  }
  ns.token = RandomToken();
  const std::string line = ns.token + "\n";
  const ssize_t written = ::write(fd, line.data(), line.size());
  const std::string why = written < 0 ? std::strerror(errno) : "short write";
  ::close(fd);
  if (written != static_cast<ssize_t>(line.size())) {
    ::unlink(path.c_str());  // a short token would be refused next start
    return Status::IOError(fmt::format("cannot write {}: {}", path, why));
  }
  return Status::OK();
}

}  // namespace

Status ConfigKeyError(std::string_view key, const Status& cause) {
  if (cause.ok()) return cause;
  return Status(cause.code(),
                fmt::format("config {}: {}", key, cause.message()));
}

Result<WritePolicy> ParseWritePolicy(std::string_view text) {
  if (text == "write_back") return WritePolicy::kWriteBack;
  if (text == "write_through") return WritePolicy::kWriteThrough;
  if (text == "none") return WritePolicy::kNone;
  return Status::InvalidArgument(fmt::format(
      "unknown write_policy '{}' (write_back, write_through or none)", text));
}

DaemonConfig EmbeddedDefaults() {
  DaemonConfig c;
  NamespaceConfig ns;
  ns.name = "default";
  ns.token_file =
      (std::filesystem::path(c.socket_path).parent_path() / "default.token")
          .string();
  c.namespaces.push_back(ns);
  return c;
}

namespace {

// Ids and names that become Redis key parts and handshake fields.
bool IsClusterIdentifier(std::string_view s) {
  return !s.empty() && s.size() <= 64 &&
         std::all_of(s.begin(), s.end(), [](char ch) {
           return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' ||
                  ch == '.' || ch == '-';
         });
}

Status ValidateCluster(const ClusterConfig& k) {
  if (!IsClusterIdentifier(k.name)) {
    return Bad("cluster.name", "must be 1-64 characters of [A-Za-z0-9_.-]");
  }
  if (!k.node_id.empty() && !IsClusterIdentifier(k.node_id)) {
    return Bad("cluster.node_id", "must be 1-64 characters of [A-Za-z0-9_.-]");
  }
  if (k.secret_file.empty()) {
    return Bad("cluster.secret_file",
               "is required: a file of >= 32 random bytes, mode 0600, the "
               "same on every node (e.g. head -c 32 /dev/urandom > "
               "cluster.key; chmod 600 cluster.key)");
  }
  if (k.directory.empty()) {
    return Bad("cluster.directory",
               "is required: the Redis URL, e.g. redis://10.0.0.2:6379/0");
  }
  if (k.peer_listen.empty()) {
    return Bad("cluster.peer_listen", "must be ip:port (port 0: any)");
  }
  // The listener's address is what peers are told to dial: "any address"
  // would send them to themselves.
  const std::string host = k.peer_listen.substr(0, k.peer_listen.rfind(':'));
  if (host == "0.0.0.0" || host == "[::]" || host == "::" || host.empty()) {
    return Bad("cluster.peer_listen",
               "must name this node's own address (peers dial what it says), "
               "not " +
                   (host.empty() ? std::string("none") : host));
  }
  // A heartbeat every TTL/5: below a second, one slow Redis round trip
  // would make a live node look gone.
  if (k.liveness_ttl_ms < 1000 || k.liveness_ttl_ms > 3600000) {
    return Bad("cluster.liveness_ttl_ms", "must be in [1000, 3600000]");
  }
  if (k.lookup_budget_us < 100 || k.lookup_budget_us > 1000000) {
    return Bad("cluster.lookup_budget_us", "must be in [100, 1000000]");
  }
  if (k.fetch_deadline_ms < 10 || k.fetch_deadline_ms > 600000) {
    return Bad("cluster.fetch_deadline_ms", "must be in [10, 600000]");
  }
  if (k.transfer_spin_us > 10000) {
    return Bad("cluster.transfer_spin_us", "must be in [0, 10000]");
  }
  return Status::OK();
}

}  // namespace

Status DaemonConfig::Validate() const {
  if (socket_path.empty()) return Bad("server.socket", "must not be empty");
  if (socket_path.size() > 107)
    return Bad("server.socket", "longer than 107 bytes");
  if (socket_mode > 0777) return Bad("server.socket_mode", "must be <= 0777");
  if (socket_mode & 0007) {
    return Bad("server.socket_mode",
               "must not grant access to others (use a group instead)");
  }
  if (io_threads == 0 || io_threads > 64)
    return Bad("server.io_threads", "must be in [1, 64]");
  if (poll_us > 10000) return Bad("server.poll_us", "must be <= 10000");
  if (poll_followup_us > 10000) {
    return Bad("server.poll_followup_us", "must be <= 10000");
  }
  if (workers == 0 || workers > 256)
    return Bad("server.workers", "must be in [1, 256]");
  if (load_workers == 0 || load_workers > 256)
    return Bad("server.load_workers", "must be in [1, 256]");
  if (worker_queue == 0) return Bad("server.worker_queue", "must be > 0");
  if (max_frame_bytes < 4096 || max_frame_bytes > (uint64_t{1} << 30)) {
    return Bad("server.max_frame_bytes", "must be in [4 KiB, 1 GiB]");
  }
  if (max_connections == 0 || max_connections > 1000000) {
    return Bad("server.max_connections", "must be in [1, 1000000]");
  }
  if (max_unauthenticated_connections == 0 ||
      max_unauthenticated_connections > 100000) {
    return Bad("server.max_unauthenticated_connections",
               "must be in [1, 100000]");
  }
  if (handshake_timeout_ms == 0 || handshake_timeout_ms > 3600000) {
    return Bad("server.handshake_timeout_ms", "must be in [1, 3600000]");
  }
  if (!storage::ParseDeviceBackendKind(hbm.backend).ok()) {
    return Bad("hbm.backend", "must be auto, cuda or emulated");
  }
  if (hbm.streams == 0 || hbm.streams > 64) {
    return Bad("hbm.streams", "must be in [1, 64]");
  }
  if (hbm.device < 0) return Bad("hbm.device", "must be >= 0");
  if (hbm.emulated_fault_after_copies != 0 && hbm.backend != "emulated") {
    return Bad("hbm.emulated_fault_after_copies",
               "is a fault drill of the emulated backend: set hbm.backend = "
               "\"emulated\"");
  }
  if (hbm.staging_bytes % 4096 != 0 ||
      hbm.staging_bytes > (uint64_t{64} << 30)) {
    return Bad("hbm.staging_bytes",
               "must be a multiple of 4 KiB, at most 64 GiB");
  }
  if (hbm.capacity_bytes % 4096 != 0) {
    return Bad("hbm.capacity_bytes", "must be a multiple of 4 KiB");
  }
  if (lease_refusal_delay_ms > 10000) {
    return Bad("leases.refusal_delay_ms", "must be <= 10000");
  }
  if (auth_failure_delay_ms > 10000) {
    return Bad("server.auth_failure_delay_ms", "must be <= 10000");
  }
  if (idle_timeout_ms > 86400000) {
    return Bad("server.idle_timeout_ms", "must be <= 86400000 (0: never)");
  }
  if (stall_timeout_ms > 86400000) {
    return Bad("server.stall_timeout_ms", "must be <= 86400000 (0: never)");
  }
  if (max_in_flight_bytes < max_frame_bytes) {
    return Bad("server.max_in_flight_bytes",
               "must be >= server.max_frame_bytes (one request of the "
               "largest size must fit)");
  }
  if (lease_ttl_ms == 0) return Bad("leases.ttl_ms", "must be > 0");
  if (max_leases_per_connection == 0) {
    return Bad("leases.max_per_connection", "must be > 0");
  }
  if (max_leased_segments_per_connection == 0) {
    return Bad("leases.max_segments_per_connection", "must be > 0");
  }
  if (max_leased_segments_per_namespace == 0) {
    return Bad("leases.max_segments_per_namespace", "must be > 0");
  }
  if (max_leased_bytes_percent_per_connection == 0 ||
      max_leased_bytes_percent_per_connection > 100) {
    return Bad("leases.max_bytes_percent_per_connection",
               "must be in [1, 100]");
  }
  if (max_leased_bytes_percent_per_namespace == 0 ||
      max_leased_bytes_percent_per_namespace > 100) {
    return Bad("leases.max_bytes_percent_per_namespace", "must be in [1, 100]");
  }
  if (max_pin_ttl_ms == 0) return Bad("leases.max_pin_ttl_ms", "must be > 0");
  if (sweep_interval_ms == 0 || sweep_interval_ms > 60000) {
    return Bad("leases.sweep_interval_ms", "must be in [1, 60000]");
  }
  static const std::set<std::string_view> kLevels = {
      "trace", "debug", "info", "warn", "error", "critical", "off"};
  if (!kLevels.count(log_level))
    return Bad("log.level", "unknown level '" + log_level + "'");
  if (nvme.enabled()) {
    if (nvme.capacity_bytes < (uint64_t{16} << 20) ||
        nvme.capacity_bytes % 4096) {
      return Bad("nvme.capacity_bytes",
                 "must be a multiple of 4 KiB and >= 16 MiB");
    }
    if (nvme.queue_depth == 0 || nvme.queue_depth > 4096) {
      return Bad("nvme.queue_depth", "must be in [1, 4096]");
    }
    if (nvme.readers == 0 || nvme.readers > 64) {
      return Bad("nvme.readers", "must be in [1, 64]");
    }
    if (nvme.mover_workers == 0 || nvme.mover_workers > 64) {
      return Bad("nvme.mover_workers", "must be in [1, 64]");
    }
    if (nvme.sync_interval_ms == 0 || nvme.sync_interval_ms > 3600000) {
      return Bad("nvme.sync_interval_ms", "must be in [1, 3600000]");
    }
    if (nvme.shutdown_persist_ms > 3600000) {
      return Bad("nvme.shutdown_persist_ms", "must be in [0, 3600000]");
    }
    if (nvme.prefetch_queue == 0) {
      return Bad("nvme.prefetch_queue", "must be > 0");
    }
  }
  if (namespaces.empty())
    return Bad("namespace", "at least one [[namespace]] is required");
  std::set<std::string_view> names;
  uint64_t nvme_reserved = 0;
  for (const auto& ns : namespaces) {
    auto key = [&ns](std::string_view k) { return NamespaceKey(ns, k); };
    if (ns.name.empty() || ns.name.size() > 128)
      return Bad(key("name"), "must have 1..128 characters");
    for (char ch : ns.name) {
      if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' &&
          ch != '_' && ch != '.' && ch != '@') {
        return Bad(key("name"), "may use letters, digits and - _ . @");
      }
    }
    if (!names.insert(ns.name).second) {
      return Bad(key("name"), "duplicate namespace name");
    }
    if (ns.token.empty() && ns.token_file.empty()) {
      return Bad(key("token"), "missing: give a token or a token_file");
    }
    if (!ns.token.empty() && ns.token.size() < 8) {
      return Bad(key("token"), "must have at least 8 characters");
    }
    if (ns.shards == 0 || ns.shards > 256)
      return Bad(key("shards"), "must be in [1, 256]");
    if (ns.host_bytes < (uint64_t{ns.shards} << 20)) {
      return Bad(key("host_bytes"),
                 fmt::format("must be at least 1 MiB per shard ({} shards)",
                             ns.shards));
    }
    if (!std::has_single_bit(ns.host_alignment) || ns.host_alignment < 64 ||
        ns.host_alignment > 4096) {
      return Bad(key("host_alignment"), "must be a power of two in [64, 4096]");
    }
    if (ns.hbm_bytes > 0 && !hbm.enabled()) {
      return Bad(key("hbm_bytes"),
                 "needs an [hbm] tier (set hbm.capacity_bytes)");
    }
    if (ns.hbm_bytes > hbm.capacity_bytes) {
      return Bad(key("hbm_bytes"), "exceeds hbm.capacity_bytes");
    }
    if (ns.nvme_bytes > 0 && !nvme.enabled()) {
      return Bad(key("nvme_bytes"), "needs an [nvme] tier (set nvme.path)");
    }
    if (ns.nvme_bytes % 4096 != 0) {
      return Bad(key("nvme_bytes"), "must be a multiple of 4 KiB");
    }
    nvme_reserved += ns.nvme_bytes;
    if (nvme.enabled() && nvme_reserved > nvme.capacity_bytes) {
      return Bad(key("nvme_bytes"),
                 fmt::format("the namespaces reserve {} bytes, more than "
                             "nvme.capacity_bytes {}",
                             nvme_reserved, nvme.capacity_bytes));
    }
    if (ns.write_policy && *ns.write_policy != WritePolicy::kNone &&
        !nvme.enabled()) {
      return Bad(key("write_policy"),
                 fmt::format("{} needs an [nvme] tier (set nvme.path)",
                             WritePolicyName(*ns.write_policy)));
    }
    if (ns.shared && !cluster) {
      return Bad(key("shared"), "needs a [cluster] section");
    }
    if (ns.weights && ns.shared) {
      return Bad(key("weights"),
                 "a weights namespace cannot be shared (peers fetch KV "
                 "pages only)");
    }
    if (ns.weights && ns.host_bytes < kMinWeightsHostBytes) {
      return Bad(key("host_bytes"),
                 fmt::format("a weights namespace needs at least {} bytes "
                             "(256 MiB) to promote 64 MiB chunks",
                             kMinWeightsHostBytes));
    }
  }
  if (cluster) TIERKV_RETURN_IF_ERROR(ValidateCluster(*cluster));
  return Status::OK();
}

Result<DaemonConfig> LoadConfigFile(const std::string& path,
                                    const DaemonConfig& base) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return Status::InvalidArgument(
        fmt::format("config {}: is a directory, not a TOML file", path));
  }
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    return Status::InvalidArgument(fmt::format("config {}:{}:{}: {}", path,
                                               where.line, where.column,
                                               e.description()));
  }
  DaemonConfig c = base;
  TIERKV_RETURN_IF_ERROR(CheckKeys(root, "",
                                   {"server", "metrics", "leases", "log",
                                    "nvme", "hbm", "cluster", "namespace"}));
  // A section written as a value (`server = 1`) or an array of tables
  // (`[[server]]`) would be skipped below without a word.
  for (std::string_view name :
       {"server", "metrics", "leases", "log", "nvme", "hbm", "cluster"}) {
    const toml::node* node = root.get(name);
    if (node != nullptr && !node->is_table()) {
      return Bad(name, fmt::format("must be a table ([{}])", name));
    }
  }
  if (auto* hbm = root["hbm"].as_table()) {
    TIERKV_RETURN_IF_ERROR(
        CheckKeys(*hbm, "hbm",
                  {"backend", "device", "capacity_bytes", "streams",
                   "staging_bytes", "emulated_fault_after_copies"}));
    TIERKV_RETURN_IF_ERROR(ReadString(*hbm, "hbm", "backend", c.hbm.backend));
    if (const toml::node* device = hbm->get("device");
        device != nullptr && device->is_string()) {
      auto uuid = storage::ParseDeviceUuid(*device->value<std::string>());
      if (!uuid.ok()) return Bad("hbm.device", uuid.status().message());
      c.hbm.device_uuid = *uuid;
    } else {
      TIERKV_RETURN_IF_ERROR(ReadInt(*hbm, "hbm", "device", c.hbm.device));
    }
    TIERKV_RETURN_IF_ERROR(
        ReadBytes(*hbm, "hbm", "capacity_bytes", c.hbm.capacity_bytes));
    TIERKV_RETURN_IF_ERROR(ReadInt(*hbm, "hbm", "streams", c.hbm.streams));
    TIERKV_RETURN_IF_ERROR(
        ReadBytes(*hbm, "hbm", "staging_bytes", c.hbm.staging_bytes));
    TIERKV_RETURN_IF_ERROR(ReadInt(*hbm, "hbm", "emulated_fault_after_copies",
                                   c.hbm.emulated_fault_after_copies));
  }
  if (auto* cluster = root["cluster"].as_table()) {
    TIERKV_RETURN_IF_ERROR(CheckKeys(
        *cluster, "cluster",
        {"name", "node_id", "secret_file", "directory",
         "directory_password_file", "peer_listen", "liveness_ttl_ms",
         "lookup_budget_us", "fetch_deadline_ms", "transfer_spin_us"}));
    ClusterConfig& k = c.cluster.emplace();
    TIERKV_RETURN_IF_ERROR(ReadString(*cluster, "cluster", "name", k.name));
    TIERKV_RETURN_IF_ERROR(
        ReadString(*cluster, "cluster", "node_id", k.node_id));
    TIERKV_RETURN_IF_ERROR(
        ReadString(*cluster, "cluster", "secret_file", k.secret_file));
    TIERKV_RETURN_IF_ERROR(
        ReadString(*cluster, "cluster", "directory", k.directory));
    TIERKV_RETURN_IF_ERROR(ReadString(*cluster, "cluster",
                                      "directory_password_file",
                                      k.directory_password_file));
    TIERKV_RETURN_IF_ERROR(
        ReadString(*cluster, "cluster", "peer_listen", k.peer_listen));
    TIERKV_RETURN_IF_ERROR(
        ReadInt(*cluster, "cluster", "liveness_ttl_ms", k.liveness_ttl_ms));
    TIERKV_RETURN_IF_ERROR(
        ReadInt(*cluster, "cluster", "lookup_budget_us", k.lookup_budget_us));
    TIERKV_RETURN_IF_ERROR(
        ReadInt(*cluster, "cluster", "fetch_deadline_ms", k.fetch_deadline_ms));
    TIERKV_RETURN_IF_ERROR(
        ReadInt(*cluster, "cluster", "transfer_spin_us", k.transfer_spin_us));
    // Files named relative to the config file, as a service's working
    // directory is rarely the config's.
    const std::filesystem::path dir = std::filesystem::path(path).parent_path();
    for (std::string* file : {&k.secret_file, &k.directory_password_file}) {
      if (!file->empty() && std::filesystem::path(*file).is_relative()) {
        *file = (dir / *file).string();
      }
    }
  }
  if (auto* nvme = root["nvme"].as_table()) {
    TIERKV_RETURN_IF_ERROR(CheckKeys(
        *nvme, "nvme",
        {"path", "catalog_path", "capacity_bytes", "queue_depth", "direct_io",
         "sync", "recreate_damaged_catalog", "readers", "mover_workers",
         "prefetch_queue", "sync_interval_ms", "shutdown_persist_ms"}));
    TIERKV_RETURN_IF_ERROR(ReadString(*nvme, "nvme", "path", c.nvme.path));
    TIERKV_RETURN_IF_ERROR(
        ReadString(*nvme, "nvme", "catalog_path", c.nvme.catalog_path));
    TIERKV_RETURN_IF_ERROR(
        ReadBytes(*nvme, "nvme", "capacity_bytes", c.nvme.capacity_bytes));
    TIERKV_RETURN_IF_ERROR(
        ReadInt(*nvme, "nvme", "queue_depth", c.nvme.queue_depth));
    TIERKV_RETURN_IF_ERROR(ReadInt(*nvme, "nvme", "readers", c.nvme.readers));
    TIERKV_RETURN_IF_ERROR(
        ReadInt(*nvme, "nvme", "mover_workers", c.nvme.mover_workers));
    TIERKV_RETURN_IF_ERROR(
        ReadInt(*nvme, "nvme", "prefetch_queue", c.nvme.prefetch_queue));
    TIERKV_RETURN_IF_ERROR(
        ReadInt(*nvme, "nvme", "sync_interval_ms", c.nvme.sync_interval_ms));
    TIERKV_RETURN_IF_ERROR(ReadInt(*nvme, "nvme", "shutdown_persist_ms",
                                   c.nvme.shutdown_persist_ms));
    TIERKV_RETURN_IF_ERROR(
        ReadBool(*nvme, "nvme", "direct_io", c.nvme.direct_io));
    TIERKV_RETURN_IF_ERROR(ReadBool(*nvme, "nvme", "sync", c.nvme.sync));
    TIERKV_RETURN_IF_ERROR(ReadBool(*nvme, "nvme", "recreate_damaged_catalog",
                                    c.nvme.recreate_damaged_catalog));
  }
  if (auto* server = root["server"].as_table()) {
    TIERKV_RETURN_IF_ERROR(
        CheckKeys(*server, "server",
                  {"socket", "socket_mode", "socket_group", "io_threads",
                   "poll_us", "poll_followup_us", "workers", "load_workers",
                   "worker_queue", "max_frame_bytes", "max_connections",
                   "max_unauthenticated_connections", "handshake_timeout_ms",
                   "idle_timeout_ms", "stall_timeout_ms", "max_in_flight_bytes",
                   "auth_failure_delay_ms"}));
    TIERKV_RETURN_IF_ERROR(
        ReadString(*server, "server", "socket", c.socket_path));
    TIERKV_RETURN_IF_ERROR(ReadMode(*server, c.socket_mode));
    TIERKV_RETURN_IF_ERROR(
        ReadString(*server, "server", "socket_group", c.socket_group));
    TIERKV_RETURN_IF_ERROR(
        ReadInt(*server, "server", "io_threads", c.io_threads));
    TIERKV_RETURN_IF_ERROR(ReadInt(*server, "server", "poll_us", c.poll_us));
    TIERKV_RETURN_IF_ERROR(
        ReadInt(*server, "server", "poll_followup_us", c.poll_followup_us));
    TIERKV_RETURN_IF_ERROR(ReadInt(*server, "server", "workers", c.workers));
    TIERKV_RETURN_IF_ERROR(
        ReadInt(*server, "server", "load_workers", c.load_workers));
    TIERKV_RETURN_IF_ERROR(
        ReadInt(*server, "server", "worker_queue", c.worker_queue));
    TIERKV_RETURN_IF_ERROR(
        ReadBytes(*server, "server", "max_frame_bytes", c.max_frame_bytes));
    TIERKV_RETURN_IF_ERROR(
        ReadInt(*server, "server", "max_connections", c.max_connections));
    TIERKV_RETURN_IF_ERROR(ReadInt(*server, "server",
                                   "max_unauthenticated_connections",
                                   c.max_unauthenticated_connections));
    TIERKV_RETURN_IF_ERROR(ReadInt(*server, "server", "handshake_timeout_ms",
                                   c.handshake_timeout_ms));
    TIERKV_RETURN_IF_ERROR(
        ReadInt(*server, "server", "idle_timeout_ms", c.idle_timeout_ms));
    TIERKV_RETURN_IF_ERROR(
        ReadInt(*server, "server", "stall_timeout_ms", c.stall_timeout_ms));
    TIERKV_RETURN_IF_ERROR(ReadBytes(*server, "server", "max_in_flight_bytes",
                                     c.max_in_flight_bytes));
    TIERKV_RETURN_IF_ERROR(ReadInt(*server, "server", "auth_failure_delay_ms",
                                   c.auth_failure_delay_ms));
  }
  if (auto* metrics = root["metrics"].as_table()) {
    TIERKV_RETURN_IF_ERROR(CheckKeys(*metrics, "metrics", {"listen"}));
    TIERKV_RETURN_IF_ERROR(
        ReadString(*metrics, "metrics", "listen", c.metrics_listen));
  }
  if (auto* leases = root["leases"].as_table()) {
    TIERKV_RETURN_IF_ERROR(CheckKeys(
        *leases, "leases",
        {"ttl_ms", "max_pin_ttl_ms", "sweep_interval_ms", "max_per_connection",
         "max_segments_per_connection", "max_segments_per_namespace",
         "max_bytes_percent_per_connection", "max_bytes_percent_per_namespace",
         "refusal_delay_ms"}));
    TIERKV_RETURN_IF_ERROR(ReadInt(*leases, "leases", "refusal_delay_ms",
                                   c.lease_refusal_delay_ms));
    TIERKV_RETURN_IF_ERROR(ReadInt(*leases, "leases", "max_per_connection",
                                   c.max_leases_per_connection));
    TIERKV_RETURN_IF_ERROR(ReadInt(*leases, "leases",
                                   "max_segments_per_connection",
                                   c.max_leased_segments_per_connection));
    TIERKV_RETURN_IF_ERROR(ReadInt(*leases, "leases",
                                   "max_segments_per_namespace",
                                   c.max_leased_segments_per_namespace));
    TIERKV_RETURN_IF_ERROR(ReadInt(*leases, "leases",
                                   "max_bytes_percent_per_connection",
                                   c.max_leased_bytes_percent_per_connection));
    TIERKV_RETURN_IF_ERROR(ReadInt(*leases, "leases",
                                   "max_bytes_percent_per_namespace",
                                   c.max_leased_bytes_percent_per_namespace));
    TIERKV_RETURN_IF_ERROR(
        ReadInt(*leases, "leases", "ttl_ms", c.lease_ttl_ms));
    TIERKV_RETURN_IF_ERROR(
        ReadInt(*leases, "leases", "max_pin_ttl_ms", c.max_pin_ttl_ms));
    TIERKV_RETURN_IF_ERROR(
        ReadInt(*leases, "leases", "sweep_interval_ms", c.sweep_interval_ms));
  }
  if (auto* log = root["log"].as_table()) {
    TIERKV_RETURN_IF_ERROR(CheckKeys(*log, "log", {"level"}));
    TIERKV_RETURN_IF_ERROR(ReadString(*log, "log", "level", c.log_level));
  }
  if (const toml::node* node = root.get("namespace")) {
    const toml::array* list = node->as_array();
    if (!list)
      return Bad("namespace", "must be an array of tables ([[namespace]])");
    c.namespaces.clear();
    for (const auto& item : *list) {
      const toml::table* t = item.as_table();
      if (!t) return Bad("namespace", "entries must be tables");
      NamespaceConfig ns;
      TIERKV_RETURN_IF_ERROR(ReadString(*t, "namespace", "name", ns.name));
      const std::string entry = ns.name;  // names the entry in errors
      TIERKV_RETURN_IF_ERROR(CheckKeys(
          *t, "namespace",
          {"name", "token", "token_file", "host_bytes", "shards", "hugepages",
           "prefault", "host_alignment", "write_policy", "nvme_bytes",
           "hbm_bytes", "max_connections", "eviction_policy", "shared",
           "weights", "prefetch_horizon_ms", "prefetch_bytes_per_second"},
          entry));
      TIERKV_RETURN_IF_ERROR(
          ReadString(*t, "namespace", "token", ns.token, entry));
      TIERKV_RETURN_IF_ERROR(
          ReadString(*t, "namespace", "token_file", ns.token_file, entry));
      if (!ns.token.empty() && !ns.token_file.empty()) {
        return Bad(KeyName("namespace", "token_file", entry),
                   "give either token or token_file, not both");
      }
      TIERKV_RETURN_IF_ERROR(
          ReadBytes(*t, "namespace", "host_bytes", ns.host_bytes, entry));
      TIERKV_RETURN_IF_ERROR(
          ReadInt(*t, "namespace", "shards", ns.shards, entry));
      TIERKV_RETURN_IF_ERROR(ReadBytes(*t, "namespace", "host_alignment",
                                       ns.host_alignment, entry));
      TIERKV_RETURN_IF_ERROR(
          ReadBytes(*t, "namespace", "nvme_bytes", ns.nvme_bytes, entry));
      TIERKV_RETURN_IF_ERROR(
          ReadBytes(*t, "namespace", "hbm_bytes", ns.hbm_bytes, entry));
      TIERKV_RETURN_IF_ERROR(ReadInt(*t, "namespace", "max_connections",
                                     ns.max_connections, entry));
      TIERKV_RETURN_IF_ERROR(
          ReadBool(*t, "namespace", "hugepages", ns.hugepages, entry));
      TIERKV_RETURN_IF_ERROR(
          ReadBool(*t, "namespace", "prefault", ns.prefault, entry));
      TIERKV_RETURN_IF_ERROR(
          ReadBool(*t, "namespace", "shared", ns.shared, entry));
      TIERKV_RETURN_IF_ERROR(
          ReadBool(*t, "namespace", "weights", ns.weights, entry));
      std::string policy;
      TIERKV_RETURN_IF_ERROR(
          ReadString(*t, "namespace", "write_policy", policy, entry));
      if (!policy.empty()) {
        auto parsed = ParseWritePolicy(policy);
        if (!parsed.ok()) {
          return Bad(KeyName("namespace", "write_policy", entry),
                     parsed.status().message());
        }
        ns.write_policy = *parsed;
      }
      std::string eviction;
      TIERKV_RETURN_IF_ERROR(
          ReadString(*t, "namespace", "eviction_policy", eviction, entry));
      if (!eviction.empty()) {
        auto parsed = storage::ParseEvictionPolicy(eviction);
        if (!parsed.ok()) {
          return Bad(KeyName("namespace", "eviction_policy", entry),
                     parsed.status().message());
        }
        ns.eviction_policy = *parsed;
      }
      if (ns.weights && eviction.empty()) {
        ns.eviction_policy = storage::EvictionPolicyKind::kWeights;
      }
      if (!ns.weights &&
          ns.eviction_policy == storage::EvictionPolicyKind::kWeights) {
        return Bad(KeyName("namespace", "eviction_policy", entry),
                   "'weights' orders a weights namespace (weights = true)");
      }
      const bool has_horizon = t->contains("prefetch_horizon_ms");
      const bool has_cap = t->contains("prefetch_bytes_per_second");
      if (!ns.weights && (has_horizon || has_cap)) {
        return Bad(KeyName("namespace",
                           has_horizon ? "prefetch_horizon_ms"
                                       : "prefetch_bytes_per_second",
                           entry),
                   "only a weights namespace (weights = true) prefetches "
                   "weights");
      }
      TIERKV_RETURN_IF_ERROR(ReadInt(*t, "namespace", "prefetch_horizon_ms",
                                     ns.prefetch_horizon_ms, entry));
      if (ns.prefetch_horizon_ms > kMaxPrefetchHorizonMs) {
        return Bad(
            KeyName("namespace", "prefetch_horizon_ms", entry),
            fmt::format("must be in [0, {}] (7 days)", kMaxPrefetchHorizonMs));
      }
      TIERKV_RETURN_IF_ERROR(ReadBytes(*t, "namespace",
                                       "prefetch_bytes_per_second",
                                       ns.prefetch_bytes_per_second, entry));
      c.namespaces.push_back(std::move(ns));
    }
  }
  return c;
}

Status ResolveTokens(DaemonConfig& config) {
  for (auto& ns : config.namespaces) {
    if (ns.token_file.empty()) continue;
    if (Status s = ReadOrCreateTokenFile(ns); !s.ok()) {
      return ConfigKeyError(NamespaceKey(ns, "token_file"), s);
    }
  }
  return Status::OK();
}

}  // namespace tierkv::daemon
