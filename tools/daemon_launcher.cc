// Starts and stops a tierkvd child process (see daemon_launcher.h).
#include "tools/daemon_launcher.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>
#include <thread>

namespace tierkv::tools {
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

// This process's environment with `overrides` replacing or adding entries.
std::vector<std::string> ChildEnvironment(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const bool overridden =
        std::any_of(overrides.begin(), overrides.end(), [&](const auto& kv) {
          return entry.substr(0, entry.find('=')) == kv.first;
        });
    if (!overridden) env.emplace_back(entry);
  }
  for (const auto& [name, value] : overrides) {
    env.push_back(name + "=" + value);
  }
  return env;
}

}  // namespace

std::string DaemonBinDir() {
  if (const char* dir = std::getenv("TIERKV_BIN_DIR")) return dir;
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return ".";
  self[n] = 0;
  return std::filesystem::path(self).parent_path().string();
}

DaemonLauncher::DaemonLauncher() : owns_dir_(true) {
  std::string pattern =
      (std::filesystem::temp_directory_path() / "tierkvd-XXXXXX").string();
  if (::mkdtemp(pattern.data()) != nullptr) dir_ = pattern;
}

DaemonLauncher::DaemonLauncher(std::filesystem::path dir)
    : dir_(std::move(dir)) {}

DaemonLauncher::~DaemonLauncher() {
  if (pid_ > 0) Stop(SIGTERM);
  if (owns_dir_ && !dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

Status DaemonLauncher::Start(const DaemonLaunchOptions& options) {
  if (dir_.empty()) {
    return Status::IOError("no directory for tierkvd (mkdtemp failed)");
  }
  const std::string bin_dir =
      options.bin_dir.empty() ? DaemonBinDir() : options.bin_dir;
  const std::string binary = bin_dir + "/tierkvd";
  if (::access(binary.c_str(), X_OK) != 0) {
    return Status::NotFound("no tierkvd executable at " + binary +
                            " (set $TIERKV_BIN_DIR to its directory)");
  }
  stop_timeout_ = options.stop_timeout;
  socket_ = File("tierkv.sock");
  const std::string ready = File("ready.json");
  // A restart: the previous daemon's ready file must not pass for this one.
  std::filesystem::remove(ready);
  std::vector<std::string> args = {binary,
                                   "--socket",
                                   socket_,
                                   "--metrics",
                                   options.metrics_listen,
                                   "--ready-file",
                                   ready,
                                   "--log-level",
                                   options.log_level};
  if (!options.config_toml.empty()) {
    const std::string config = File("tierkvd.toml");
    std::ofstream(config) << Replace(
        Replace(options.config_toml, "{SOCKET}", socket_), "{DIR}",
        dir_.string());
    args.push_back("--config");
    args.push_back(config);
  }
  args.insert(args.end(), options.args.begin(), options.args.end());
  args.insert(args.begin(), options.wrapper.begin(), options.wrapper.end());
  const std::string log_path = File("tierkvd.log");
  // Built before fork: the child may only make async-signal-safe calls.
  std::vector<std::string> env = ChildEnvironment(options.env);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) return Status::IOError("fork failed");
  if (pid_ == 0) {
    FILE* log = std::fopen(log_path.c_str(), "w");
    if (log) {
      ::dup2(fileno(log), 1);
      ::dup2(fileno(log), 2);
    }
    ::execve(argv[0], argv.data(), envp.data());
    std::perror("execve tierkvd");
    ::_exit(127);
  }
  // Polls: the ready file is the daemon's only signal that it serves.
  const auto deadline =
      std::chrono::steady_clock::now() + options.ready_timeout;
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

int DaemonLauncher::Stop(int signal) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, signal);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + stop_timeout_;
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

std::string DaemonLauncher::log() const {
  return ReadFile(File("tierkvd.log"));
}

Result<std::unique_ptr<Client>> DaemonLauncher::Connect(
    const std::string& ns, const std::string& token) const {
  auto client = Client::Connect({.socket_path = socket_});
  if (!client.ok()) return client;
  std::string t = token;
  if (t.empty()) {
    std::ifstream in(File(ns + ".token"));
    std::getline(in, t);
  }
  TIERKV_RETURN_IF_ERROR((*client)->OpenNamespace(ns, t));
  return client;
}

}  // namespace tierkv::tools
