// DaemonProcess over tools::DaemonLauncher, and the tests' HTTP helpers.
#include "tests/testing/daemon_process.h"

#include <arpa/inet.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace tierkv::testing {

std::string BinDir() { return tools::DaemonBinDir(); }

CommandRun RunCommand(const std::string& command) {
  CommandRun run;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), pipe)) > 0;) {
    run.output.append(buf, n);
  }
  const int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

DaemonProcess::~DaemonProcess() {
  if (launcher_.running()) launcher_.Stop(SIGKILL);
}

Status DaemonProcess::Start(const DaemonSpec& spec) {
  tools::DaemonLaunchOptions options{.config_toml = spec.config_toml,
                                     .env = spec.env,
                                     .wrapper = spec.wrapper,
                                     .ready_timeout = spec.ready_timeout};
  const bool sized = std::find(spec.extra_args.begin(), spec.extra_args.end(),
                               "--host-bytes") != spec.extra_args.end();
  if (spec.config_toml.empty() && !sized && !spec.default_host_bytes.empty()) {
    options.args = {"--host-bytes", spec.default_host_bytes};
  }
  options.args.insert(options.args.end(), spec.extra_args.begin(),
                      spec.extra_args.end());
  return launcher_.Start(options);
}

int DaemonProcess::Stop(int signal) { return launcher_.Stop(signal); }

Result<std::unique_ptr<Client>> DaemonProcess::Connect(
    const std::string& ns, const std::string& token) const {
  return launcher_.Connect(ns, token);
}

uint64_t DaemonProcess::RssBytes() const {
  std::ifstream in("/proc/" + std::to_string(pid()) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      return std::stoull(line.substr(6)) * 1024;
    }
  }
  return 0;
}

Result<std::string> HttpGet(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return Status::Unavailable("cannot connect to metrics port");
  }
  std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  (void)::write(fd, req.data(), req.size());
  std::string resp;
  char buf[8192];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0)
    resp.append(buf, static_cast<size_t>(n));
  ::close(fd);
  auto body = resp.find("\r\n\r\n");
  if (body == std::string::npos)
    return Status::ProtocolError("bad HTTP response");
  return resp.substr(body + 4);
}

double MetricValue(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0)
      return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

}  // namespace tierkv::testing
