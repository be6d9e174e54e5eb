// DaemonLauncher: runs a real tierkvd as a child process, on a socket in a
// directory of its own, for tools (`tierkv replay`) and tests
// (tests/testing/daemon_process.h wraps it).
//
// Start() writes the config (if any) into the directory, starts
// <bin dir>/tierkvd with its output in <dir>/tierkvd.log, and returns once
// the daemon has written its --ready-file. The destructor stops a running
// daemon gracefully (SIGTERM, SIGKILL after the stop timeout).
//
// Thread safety: not thread-safe; one owner. Start() may be called again
// after Stop() (a restart in the same directory).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tierkv/client.h"
#include "tierkv/status.h"

namespace tierkv::tools {

// The directory holding tierkvd, tierkv, ...: $TIERKV_BIN_DIR when set,
// else the directory of the running executable.
std::string DaemonBinDir();

struct DaemonLaunchOptions {
  // TOML config text; empty runs on the daemon's embedded defaults.
  // "{SOCKET}" and "{DIR}" are replaced with the socket path and the
  // launcher's directory. Default: empty.
  std::string config_toml;
  // More tierkvd flags, after the launcher's own (--socket, --metrics,
  // --ready-file, --log-level, --config). Default: none.
  std::vector<std::string> args;
  // Set in the daemon's environment on top of this process's own, e.g.
  // {"TIERKV_TEST_STALL_LAYER", "3:/tmp/x/stall.fifo"}. Default: none.
  std::vector<std::pair<std::string, std::string>> env;
  // Where tierkvd is. Default: "" (DaemonBinDir()).
  std::string bin_dir;
  // A command tierkvd is started through, its arguments before tierkvd's
  // path, e.g. {"/usr/sbin/ip", "netns", "exec", "ns1"}: an absolute path
  // first, and a command that execs tierkvd in place (its PID is the one
  // signalled). Default: none.
  std::vector<std::string> wrapper;
  // The daemon's --metrics address; port 0 picks a free one (see
  // metrics_port()). Default: "127.0.0.1:0".
  std::string metrics_listen = "127.0.0.1:0";
  std::string log_level = "info";  // Default: "info"
  // How long Start() waits for the ready file. Default: 20 s.
  std::chrono::milliseconds ready_timeout{20000};
  // How long Stop() waits before SIGKILL. Default: 10 s.
  std::chrono::milliseconds stop_timeout{10000};
};

class DaemonLauncher {
 public:
  // In a fresh private directory under $TMPDIR, removed with its contents
  // on destruction (Start() returns IOError if it could not be made).
  DaemonLauncher();
  // In `dir`, which the caller owns and keeps; an empty path makes Start()
  // return IOError. REQUIRES: `dir` exists.
  explicit DaemonLauncher(std::filesystem::path dir);
  // Stop(SIGTERM) if the daemon runs; then removes a private directory.
  ~DaemonLauncher();

  DaemonLauncher(const DaemonLauncher&) = delete;
  DaemonLauncher& operator=(const DaemonLauncher&) = delete;

  // Starts tierkvd and waits for its ready file. Returns NotFound when
  // there is no tierkvd in the bin dir, IOError when the directory or the
  // process cannot be made, Unavailable (with the daemon's log) when it
  // exits during start-up or is not ready within the ready timeout.
  // REQUIRES: no daemon of this launcher is running.
  Status Start(const DaemonLaunchOptions& options = {});

  // Sends `signal`, waits for the exit (SIGKILL after the stop timeout)
  // and returns the waitpid status; -1 when no daemon runs.
  int Stop(int signal = SIGTERM);

  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  const std::filesystem::path& dir() const { return dir_; }
  const std::string& socket_path() const { return socket_; }
  int metrics_port() const { return metrics_port_; }
  // <dir>/<name>.
  std::string File(const std::string& name) const {
    return (dir_ / name).string();
  }
  // The daemon's stdout and stderr so far.
  std::string log() const;

  // A client connected and bound to `ns` with `token`, or, when `token` is
  // empty, the token in <dir>/<ns>.token (where the embedded defaults keep
  // it). Errors as Client::Connect and Client::OpenNamespace.
  Result<std::unique_ptr<Client>> Connect(const std::string& ns = "default",
                                          const std::string& token = "") const;

 private:
  std::filesystem::path dir_;
  bool owns_dir_ = false;
  std::string socket_;
  pid_t pid_ = -1;
  int metrics_port_ = 0;
  std::chrono::milliseconds stop_timeout_{10000};
};

}  // namespace tierkv::tools
