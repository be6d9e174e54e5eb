// DaemonProcess: a real tierkvd started for one test, on a socket in a
// temporary directory, stopped (SIGTERM, then SIGKILL) on destruction.
//
// A thin wrapper over tools::DaemonLauncher (tools/daemon_launcher.h), which
// does the launching: this adds the test's TempDir and a small default host
// tier. The binary is found through $TIERKV_BIN_DIR (set by CTest) or next to
// the test binary. Start() waits for the daemon's --ready-file.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tests/testing/temp_dir.h"
#include "tierkv/client.h"
#include "tierkv/status.h"
#include "tools/daemon_launcher.h"

namespace tierkv::testing {

struct DaemonSpec {
  // TOML config text; empty runs on embedded defaults. "{SOCKET}" and
  // "{DIR}" are replaced with the socket path and the temp dir.
  std::string config_toml;
  std::vector<std::string> extra_args;  // e.g. {"--host-bytes", "8MiB"}
  // Without a config, the embedded default namespace gets this much DRAM
  // (tests need not commit the 1 GiB default), unless extra_args has its
  // own --host-bytes.
  std::string default_host_bytes = "64MiB";
  // Set in the daemon's environment on top of the test's own, e.g.
  // {"TIERKV_TEST_STALL_LAYER", "3:/tmp/x/stall.fifo"}.
  std::vector<std::pair<std::string, std::string>> env;
  // How long Start() waits for the daemon to be ready (a bench populating
  // GiBs of arenas on a slow VM takes longer than the default).
  std::chrono::milliseconds ready_timeout{20000};
  // tools::DaemonLaunchOptions::wrapper (e.g. `ip netns exec NS`).
  std::vector<std::string> wrapper;
};

class DaemonProcess {
 public:
  DaemonProcess() = default;
  ~DaemonProcess();  // Stop(SIGKILL) if running

  Status Start(const DaemonSpec& spec = {});
  // Sends `signal` and waits for exit; returns the exit status (waitpid).
  int Stop(int signal = 15);

  const std::string& socket_path() const { return launcher_.socket_path(); }
  int metrics_port() const { return launcher_.metrics_port(); }
  pid_t pid() const { return launcher_.pid(); }
  const TempDir& dir() const { return dir_; }
  // The daemon's stdout+stderr so far.
  std::string log() const { return launcher_.log(); }

  // A client connected and bound to `ns` with the token of `ns` (read
  // from the config or the embedded default token file).
  Result<std::unique_ptr<Client>> Connect(const std::string& ns = "default",
                                          const std::string& token = "") const;

  // Resident memory of the daemon, from /proc.
  uint64_t RssBytes() const;

 private:
  TempDir dir_;
  tools::DaemonLauncher launcher_{dir_.path()};  // borrows dir_
};

// The directory holding tierkvd, tierkv, ... ($TIERKV_BIN_DIR).
std::string BinDir();

// A shell command run to its end: its exit code (-1 when it did not exit
// normally or could not start) and what it wrote to stdout (add "2>&1" to
// the command for stderr too).
struct CommandRun {
  int exit_code = -1;
  std::string output;
};
CommandRun RunCommand(const std::string& command);

// HTTP GET http://127.0.0.1:<port><path>; returns the body.
Result<std::string> HttpGet(int port, const std::string& path);

// The value of the Prometheus sample whose line starts with `series`
// (e.g. `tierkv_dedup_hits_total{namespace="default"}`), or -1.
double MetricValue(const std::string& metrics_text, const std::string& series);

}  // namespace tierkv::testing
