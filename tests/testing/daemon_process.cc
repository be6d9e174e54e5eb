#include "tests/testing/daemon_process.h"

#include <arpa/inet.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

namespace tierkv::testing {
namespace {

std::string Replace(std::string text, const std::string& from,
                    const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos;
       at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string BinDir() {
  if (const char* dir = std::getenv("TIERKV_BIN_DIR")) return dir;
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return ".";
  self[n] = 0;
  return std::filesystem::path(self).parent_path().string();
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) Stop(SIGKILL);
}

Status DaemonProcess::Start(const DaemonSpec& spec) {
  socket_ = dir_.File("tierkv.sock");
  const std::string ready = dir_.File("ready.json");
  // A restart: the previous daemon's ready file must not pass for this one.
  std::filesystem::remove(ready);
  std::vector<std::string> args = {BinDir() + "/tierkvd",
                                   "--socket",
                                   socket_,
                                   "--metrics",
                                   "127.0.0.1:0",
                                   "--ready-file",
                                   ready,
                                   "--log-level",
                                   "info"};
  const bool sized = std::find(spec.extra_args.begin(), spec.extra_args.end(),
                               "--host-bytes") != spec.extra_args.end();
  if (spec.config_toml.empty() && !sized && !spec.default_host_bytes.empty()) {
    args.push_back("--host-bytes");
    args.push_back(spec.default_host_bytes);
  }
  if (!spec.config_toml.empty()) {
    const std::string config = dir_.File("tierkvd.toml");
    std::ofstream(config) << Replace(
        Replace(spec.config_toml, "{SOCKET}", socket_), "{DIR}",
        dir_.path().string());
    args.push_back("--config");
    args.push_back(config);
  }
  args.insert(args.end(), spec.extra_args.begin(), spec.extra_args.end());
  const std::string log_path = dir_.File("tierkvd.log");
  // Built before fork: the child may only make async-signal-safe calls.
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const bool overridden =
        std::any_of(spec.env.begin(), spec.env.end(), [&](const auto& kv) {
          return entry.substr(0, entry.find('=')) == kv.first;
        });
    if (!overridden) env.emplace_back(entry);
  }
  for (const auto& [name, value] : spec.env) env.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) return Status::IOError("fork failed");
  if (pid_ == 0) {
    FILE* log = std::fopen(log_path.c_str(), "w");
    if (log) {
      ::dup2(fileno(log), 1);
      ::dup2(fileno(log), 2);
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execve(argv[0], argv.data(), envp.data());
    std::perror("execve tierkvd");
    ::_exit(127);
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return Status::Unavailable("tierkvd exited during start-up: " + log());
    }
    if (std::filesystem::exists(ready)) {
      auto j = nlohmann::json::parse(ReadFile(ready), nullptr, false);
      if (!j.is_discarded()) {
        metrics_port_ = j.value("metrics_port", 0);
        return Status::OK();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return Status::Unavailable("tierkvd did not become ready: " + log());
}

int DaemonProcess::Stop(int signal) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, signal);
  int status = 0;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  pid_ = -1;
  return status;
}

std::string DaemonProcess::log() const {
  return ReadFile(dir_.File("tierkvd.log"));
}

Result<std::unique_ptr<Client>> DaemonProcess::Connect(
    const std::string& ns, const std::string& token) const {
  auto client = Client::Connect({.socket_path = socket_});
  if (!client.ok()) return client;
  std::string t = token;
  if (t.empty()) {
    std::ifstream in(dir_.File(ns + ".token"));
    std::getline(in, t);
  }
  TIERKV_RETURN_IF_ERROR((*client)->OpenNamespace(ns, t));
  return client;
}

uint64_t DaemonProcess::RssBytes() const {
  std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
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
