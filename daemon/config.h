// DaemonConfig: everything tierkvd can be told, from three layers applied in
// order: embedded defaults < TOML file (--config) < command-line overrides.
// LoadConfigFile() and Validate() turn every mistake into an InvalidArgument
// naming the key, so a bad config never starts a half-working daemon.
//
// TOML shape (every key optional; see README "Configuration"):
//   [server]    socket, socket_mode ("0660"), socket_group, io_threads,
//               max_frame_bytes
//   [metrics]   listen ("127.0.0.1:9400"; "" disables)
//   [leases]    ttl_ms, max_pin_ttl_ms, sweep_interval_ms
//   [log]       level ("trace".."off")
//   [[namespace]] name, token | token_file, host_bytes ("1GiB" or bytes),
//               shards, hugepages, prefault
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tierkv/status.h"

namespace tierkv::daemon {

struct NamespaceConfig {
  std::string name;
  // Exactly one of token / token_file. A token_file that does not exist is
  // created with a random token, mode 0600.
  std::string token;
  std::string token_file;
  uint64_t host_bytes = uint64_t{1} << 30;  // Default: 1 GiB
  uint32_t shards = 8;                      // Default: 8
  bool hugepages = true;                    // Default: true (with fallback)
  bool prefault = true;  // commit the arena at start. Default: true
};

struct DaemonConfig {
  std::string socket_path = "/run/tierkv/tierkv.sock";
  uint32_t socket_mode = 0660;
  std::string socket_group;  // Default: the daemon's own group
  uint32_t io_threads = 2;
  uint64_t max_frame_bytes = uint64_t{16} << 20;  // Default: 16 MiB

  std::string metrics_listen = "127.0.0.1:9400";  // "" disables

  uint32_t lease_ttl_ms = 30000;        // read and write leases. Default: 30 s
  uint32_t max_pin_ttl_ms = 3600000;    // longest pin. Default: 1 h
  uint32_t sweep_interval_ms = 100;     // lease expiry scan period

  std::string log_level = "info";
  // Written (JSON: pid, socket, metrics_port) once the daemon serves.
  std::string ready_file;

  std::vector<NamespaceConfig> namespaces;

  // InvalidArgument naming the first bad field.
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

// Parses "1GiB", "512 MiB", "64k", "1048576" into bytes.
Result<uint64_t> ParseByteSize(std::string_view text);

// Fills in token from token_file (creating the file with a random token
// when missing). IOError when the file cannot be read or created.
Status ResolveTokens(DaemonConfig& config);

}  // namespace tierkv::daemon
