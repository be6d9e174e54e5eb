// Starts and stops a redis-server child process (see redis_launcher.h).
#include "tools/redis_launcher.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <sstream>
#include <system_error>
#include <thread>
#include <vector>

#include "common/free_port.h"
#include "transport/directory/redis_url.h"

namespace tierkv::tools {
namespace {

using Clock = std::chrono::steady_clock;

std::string RandomPassword() {
  std::random_device rd;
  std::string out;
  for (int i = 0; i < 4; ++i) out += fmt::format("{:08x}", rd());
  return out;
}

}  // namespace

std::string RedisLauncher::Binary(const RedisLaunchOptions& options) {
  if (!options.binary.empty()) return options.binary;
  const char* env = std::getenv("TIERKV_REDIS_SERVER");
  return env != nullptr && *env != '\0' ? env : "/usr/bin/redis-server";
}

RedisLauncher::RedisLauncher() : password_(RandomPassword()) {
  std::string pattern =
      (std::filesystem::temp_directory_path() / "tierkv-redis-XXXXXX").string();
  if (::mkdtemp(pattern.data()) != nullptr) dir_ = pattern;
}

RedisLauncher::~RedisLauncher() {
  Stop();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::string RedisLauncher::url() const {
  return fmt::format("redis://127.0.0.1:{}", port_);
}

std::string RedisLauncher::password_file() const {
  return (dir_ / "redis.pass").string();
}

std::string RedisLauncher::Log() const {
  std::ifstream in(dir_ / "redis.log");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Result<std::unique_ptr<transport::RedisConnection>> RedisLauncher::Connect(
    Clock::time_point deadline) const {
  auto url = transport::RedisUrl::Parse(this->url());
  if (!url.ok()) return url.status();
  return transport::RedisConnection::Connect(*url, password_, deadline);
}

Status RedisLauncher::Start(const RedisLaunchOptions& options) {
  if (pid_ > 0) return Status::Internal("redis-server already running");
  if (dir_.empty()) {
    return Status::IOError("no directory for redis-server (mkdtemp failed)");
  }
  const std::string binary = Binary(options);
  if (::access(binary.c_str(), X_OK) != 0) {
    return Status::NotFound(fmt::format(
        "no redis-server at {} (apt-get install redis-server, or set "
        "TIERKV_REDIS_SERVER)",
        binary));
  }
  {
    const int fd = ::open(password_file().c_str(),
                          O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return Status::IOError("cannot create " + password_file());
    const std::string line = password_ + "\n";
    const bool written = ::write(fd, line.data(), line.size()) ==
                         static_cast<ssize_t>(line.size());
    ::close(fd);
    if (!written) return Status::IOError("cannot write " + password_file());
  }
  // The free port may be taken between the probe and redis's bind.
  constexpr int kPortAttempts = 5;
  Status last = Status::Unavailable("not started");
  for (int attempt = 0; attempt < kPortAttempts; ++attempt) {
    port_ = tierkv::FreeLoopbackPort();
    if (port_ == 0) return Status::IOError("no free loopback port");
    last = StartOnce(binary, options.ready_timeout);
    if (last.ok() ||
        Log().find("Address already in use") == std::string::npos) {
      return last;
    }
  }
  return last;
}

Status RedisLauncher::StartOnce(const std::string& binary,
                                std::chrono::milliseconds ready_timeout) {
  std::vector<std::string> args = {binary,
                                   "--port",
                                   std::to_string(port_),
                                   "--bind",
                                   "127.0.0.1",
                                   "--save",
                                   "",
                                   "--appendonly",
                                   "no",
                                   "--daemonize",
                                   "no",
                                   "--dir",
                                   dir_.string(),
                                   "--logfile",
                                   "",
                                   "--requirepass",
                                   password_};
  // Built before fork: the child may only make async-signal-safe calls.
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const std::string log = (dir_ / "redis.log").string();
  const int log_fd =
      ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (log_fd < 0) return Status::IOError("cannot create " + log);
  pid_ = ::fork();
  if (pid_ < 0) {
    ::close(log_fd);
    pid_ = -1;
    return Status::IOError("fork failed");
  }
  if (pid_ == 0) {
    ::dup2(log_fd, STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(log_fd);

  const auto deadline = Clock::now() + ready_timeout;
  Status last = Status::Unavailable("not tried");
  while (Clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return Status::Unavailable("redis-server exited during start-up: " +
                                 Log());
    }
    auto connection =
        Connect(std::min(deadline, Clock::now() + std::chrono::seconds(1)));
    if (connection.ok()) return Status::OK();
    last = connection.status();
    // Polling a condition only the server's start-up makes true (it
    // announces readiness nowhere else).
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Stop();
  return Status::Unavailable("redis-server not ready: " + last.ToString() +
                             "\n" + Log());
}

void RedisLauncher::Stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

}  // namespace tierkv::tools
