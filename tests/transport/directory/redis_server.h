// RedisServer: a real redis-server for one test, on a free loopback port
// (and optionally a Unix socket) in a temporary directory, with a password,
// no persistence, killed by PID on destruction. Header-only: the test
// folder builds only *_test.cc files.
//
//   RedisServer redis;
//   ASSERT_OK(redis.Start());            // waits until PING answers
//   redis.Pause(); redis.Resume();       // SIGSTOP / SIGCONT
//   redis.Kill(); ASSERT_OK(redis.Start());  // restart empty, same port
//
// The binary is $TIERKV_REDIS_SERVER or /usr/bin/redis-server; Available()
// says whether it exists (tests skip without it).
//
// Thread safety: not thread-safe; one owner (the test).
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/free_port.h"
#include "tests/testing/temp_dir.h"
#include "tierkv/status.h"
#include "transport/directory/redis_connection.h"
#include "transport/directory/redis_url.h"

namespace tierkv::testing {

class RedisServer {
 public:
  using Clock = std::chrono::steady_clock;

  struct Spec {
    std::string password = "directory-test-secret";  // "" runs without
    bool unix_socket = false;  // also listen on <dir>/redis.sock
    // Another address to listen on besides 127.0.0.1 (a test network's),
    // which url() then names. Default: none.
    std::string also_bind;
    // How long Start() waits for PING. Default: 20 s (a loaded 2-core VM).
    std::chrono::milliseconds ready_timeout{20000};
  };

  RedisServer() : RedisServer(Spec{}) {}
  explicit RedisServer(Spec spec) : spec_(std::move(spec)) {}
  ~RedisServer() { Kill(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  static std::string Binary() {
    const char* env = std::getenv("TIERKV_REDIS_SERVER");
    return env != nullptr && *env != '\0' ? env : "/usr/bin/redis-server";
  }
  static bool Available() { return ::access(Binary().c_str(), X_OK) == 0; }

  // Starts the server (on the port of the previous start, if any: a
  // restart comes back empty on the same address) and waits until it
  // answers PING. Returns Unavailable with the server's log otherwise.
  Status Start() {
    if (pid_ > 0) return Status::Internal("redis-server already running");
    if (dir_.path().empty()) return Status::IOError("no temp dir");
    const bool fixed_port = port_ != 0;
    for (int attempt = 0; attempt < 5; ++attempt) {
      if (!fixed_port) port_ = FreeLoopbackPort();
      if (port_ == 0) return Status::IOError("no free port");
      Status started = StartOnce();
      if (started.ok() || fixed_port) return started;
      if (Log().find("Address already in use") == std::string::npos) {
        return started;
      }
    }
    return Status::Unavailable("redis-server found no free port");
  }

  // SIGKILL and reap; the data is gone (no persistence).
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  // SIGSTOP, returning once the process is stopped: the socket stays open
  // and nothing answers (a hung server).
  void Pause() {
    ::kill(pid_, SIGSTOP);
    int status = 0;
    ::waitpid(pid_, &status, WUNTRACED);
  }
  void Resume() { ::kill(pid_, SIGCONT); }

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  const TempDir& dir() const { return dir_; }
  std::string url() const {
    const std::string& host =
        spec_.also_bind.empty() ? std::string("127.0.0.1") : spec_.also_bind;
    return "redis://" + host + ":" + std::to_string(port_);
  }
  std::string unix_path() const { return dir_.File("redis.sock"); }
  std::string unix_url() const { return "unix://" + unix_path(); }
  // A mode-0600 file holding the password (written on first use).
  std::string password_file() const {
    const std::string path = dir_.File("redis.pass");
    std::ofstream(path) << spec_.password << "\n";
    ::chmod(path.c_str(), 0600);
    return path;
  }
  const std::string& password() const { return spec_.password; }
  std::string Log() const {
    std::ifstream in(dir_.File("redis.log"));
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  // Runs one command as an administrator (the test's own connection).
  Result<transport::RedisReply> Command(
      const transport::RedisCommand& command) {
    Result<transport::RedisUrl> url = transport::RedisUrl::Parse(this->url());
    if (!url.ok()) return url.status();
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    auto connection =
        transport::RedisConnection::Connect(*url, spec_.password, deadline);
    if (!connection.ok()) return connection.status();
    return (*connection)->Command(command, deadline);
  }

 private:
  Status StartOnce() {
    std::vector<std::string> args = {
        Binary(), "--port", std::to_string(port_), "--bind",    "127.0.0.1",
        "--save", "",       "--appendonly",        "no",        "--daemonize",
        "no",     "--dir",  dir_.path().string(),  "--logfile", ""};
    if (!spec_.also_bind.empty()) {
      args.insert(args.begin() + 5, spec_.also_bind);  // after "127.0.0.1"
    }
    if (!spec_.password.empty()) {
      args.push_back("--requirepass");
      args.push_back(spec_.password);
    }
    if (spec_.unix_socket) {
      args.push_back("--unixsocket");
      args.push_back(unix_path());
      args.push_back("--unixsocketperm");
      args.push_back("700");
    }
    // Built before fork: the child may only make async-signal-safe calls.
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    const std::string log = dir_.File("redis.log");
    const int log_fd =
        ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (log_fd < 0) return Status::IOError("cannot create " + log);
    pid_ = ::fork();
    if (pid_ < 0) {
      ::close(log_fd);
      return Status::IOError("fork failed");
    }
    if (pid_ == 0) {
      ::dup2(log_fd, STDOUT_FILENO);
      ::dup2(log_fd, STDERR_FILENO);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(log_fd);

    Result<transport::RedisUrl> url = transport::RedisUrl::Parse(this->url());
    if (!url.ok()) return url.status();
    const auto deadline = Clock::now() + spec_.ready_timeout;
    Status last = Status::Unavailable("not tried");
    while (Clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return Status::Unavailable("redis-server exited during start-up: " +
                                   Log());
      }
      auto connection = transport::RedisConnection::Connect(
          *url, spec_.password, Clock::now() + std::chrono::milliseconds(500));
      if (connection.ok()) return Status::OK();
      last = connection.status();
      // Polling a condition only the server's start-up can make true.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    Kill();
    return Status::Unavailable("redis-server not ready: " + last.ToString() +
                               "\n" + Log());
  }

  const Spec spec_;
  TempDir dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace tierkv::testing
