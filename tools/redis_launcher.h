// RedisLauncher: runs a real redis-server as a child process for tools
// (`tierkv replay --nodes N`: the cluster directory of the daemons it
// starts): on a free loopback port, in a private directory, with a random
// password in a mode-0600 file and no persistence (--save '' --appendonly
// no), stopped by PID. The server is Debian's /usr/bin/redis-server or
// $TIERKV_REDIS_SERVER.
//
// (tests/transport/directory/redis_server.h is the tests' own, with pause,
// restart and kill for fault tests; this one only starts and stops.)
//
// Thread safety: not thread-safe; one owner.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include "tierkv/status.h"
#include "transport/directory/redis_connection.h"

namespace tierkv::tools {

struct RedisLaunchOptions {
  // The binary. Default: "" ($TIERKV_REDIS_SERVER, else
  // /usr/bin/redis-server).
  std::string binary;
  // How long Start() waits for the server to answer PING. Default: 20 s (a
  // loaded 2-core machine).
  std::chrono::milliseconds ready_timeout{20000};
};

class RedisLauncher {
 public:
  // The binary Start() runs for `options`.
  static std::string Binary(const RedisLaunchOptions& options = {});

  // In a fresh private directory under $TMPDIR, removed on destruction.
  RedisLauncher();
  ~RedisLauncher();  // Stop()
  RedisLauncher(const RedisLauncher&) = delete;
  RedisLauncher& operator=(const RedisLauncher&) = delete;

  // Starts the server and waits until it answers PING with the password.
  // Returns NotFound when the binary is missing, IOError when the
  // directory, the password file or the process cannot be made,
  // Unavailable (with the server's log) when it exits or is not ready in
  // time. REQUIRES: not running.
  Status Start(const RedisLaunchOptions& options = {});
  // SIGKILL (there is nothing to persist) and reap. Idempotent.
  void Stop();

  bool running() const { return pid_ > 0; }
  // "redis://127.0.0.1:<port>" (the [cluster] directory key).
  std::string url() const;
  // The mode-0600 file holding the password (directory_password_file).
  std::string password_file() const;
  // A new connection, authenticated, for the tool's own reads.
  Result<std::unique_ptr<transport::RedisConnection>> Connect(
      std::chrono::steady_clock::time_point deadline) const;
  std::string Log() const;

 private:
  Status StartOnce(const std::string& binary,
                   std::chrono::milliseconds ready_timeout);

  std::filesystem::path dir_;
  std::string password_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace tierkv::tools
