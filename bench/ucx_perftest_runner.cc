// Running a ucx_perftest server/client pair on loopback (see
// ucx_perftest_runner.h).
#include "bench/ucx_perftest_runner.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string_view>

#include "common/free_port.h"

extern char** environ;

namespace tierkv::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Whether some socket listens on TCP `port` (any address), from
// /proc/net/tcp{,6}: "sl local_address rem_address st ...", the port in
// hex after the colon, st 0A = LISTEN. The server cannot be asked directly:
// it takes the first connection as its client.
bool Listening(int port) {
  const std::string want = fmt::format(":{:04X}", port);
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the column names
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      if (state == "0A" && local.ends_with(want)) return true;
    }
  }
  return false;
}

class Child {
 public:
  // Spawns argv with stdout and stderr on `out_fd`.
  Child(std::vector<std::string> args, int out_fd) : args_(std::move(args)) {
    std::vector<char*> argv;
    for (std::string& a : args_) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawn_file_actions_adddup2(&actions, out_fd, STDOUT_FILENO);
    ::posix_spawn_file_actions_adddup2(&actions, out_fd, STDERR_FILENO);
    if (::posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(),
                      environ) != 0) {
      pid_ = -1;
    }
    ::posix_spawn_file_actions_destroy(&actions);
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      Wait();
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool started() const { return pid_ > 0; }
  // The exit status once it ended (then reaped), or -1 while it runs.
  int Poll() {
    int status = 0;
    if (pid_ <= 0) return exit_;
    if (::waitpid(pid_, &status, WNOHANG) != pid_) return -1;
    pid_ = -1;
    exit_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return exit_;
  }
  int Wait() {
    int status = 0;
    if (pid_ <= 0) return exit_;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    exit_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return exit_;
  }
  std::string CommandLine() const {
    std::string s;
    for (const auto& a : args_) s += (s.empty() ? "" : " ") + a;
    return s;
  }

 private:
  std::vector<std::string> args_;
  pid_t pid_ = -1;
  int exit_ = -1;
};

// Reads `fd` to EOF or until `deadline`; false on the deadline.
bool ReadAll(int fd, Clock::time_point deadline, std::string* out) {
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n == 0 ? false : true;
    const ssize_t got = ::read(fd, buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return true;
    out->append(buf, static_cast<size_t>(got));
  }
}

}  // namespace

namespace {
Result<UcxPerftestResult> RunUcxPerftestOnce(const UcxPerftestSpec& spec);
}  // namespace

bool UcxPerftestAvailable(const std::string& binary) {
  return ::access(binary.c_str(), X_OK) == 0;
}

Result<UcxPerftestResult> RunUcxPerftest(const UcxPerftestSpec& spec) {
  Result<UcxPerftestResult> r = RunUcxPerftestOnce(spec);
  if (r.ok()) return r;
  // Once more on a new port: the free port may have been taken before the
  // server bound it, and a pair fails now and then on a loaded machine.
  fmt::print(stderr, "ucx_perftest failed, running it again: {}\n",
             r.status().ToString());
  return RunUcxPerftestOnce(spec);
}

namespace {

Result<UcxPerftestResult> RunUcxPerftestOnce(const UcxPerftestSpec& spec) {
  const auto deadline = Clock::now() + spec.timeout;
  const int port = FreeLoopbackPort();
  if (port == 0) return Status::IOError("ucx_perftest: no free port");
  // The server prints only when it fails; its pipe is read then.
  int server_pipe[2];
  if (::pipe2(server_pipe, O_CLOEXEC) != 0) {
    return Status::IOError("ucx_perftest: pipe failed");
  }
  Child server({spec.binary, "-p", std::to_string(port)}, server_pipe[1]);
  ::close(server_pipe[1]);
  auto server_log = [&] {
    std::string text;
    ::fcntl(server_pipe[0], F_SETFL, O_NONBLOCK);
    char buf[4096];
    ssize_t got = 0;
    while ((got = ::read(server_pipe[0], buf, sizeof(buf))) > 0) {
      text.append(buf, static_cast<size_t>(got));
    }
    return text;
  };
  struct CloseFd {
    int fd;
    ~CloseFd() { ::close(fd); }
  } close_server_pipe{server_pipe[0]};
  if (!server.started()) {
    return Status::IOError("cannot start " + server.CommandLine());
  }
  // Wait for the listener: a condition only the server's start-up makes
  // true, re-checked each millisecond (or as soon as the server prints,
  // which it does only to fail).
  while (!Listening(port)) {
    if (server.Poll() >= 0 || Clock::now() > deadline) {
      return Status::IOError(fmt::format("{} did not listen (exit {}): {}",
                                         server.CommandLine(), server.Poll(),
                                         server_log()));
    }
    pollfd p{server_pipe[0], POLLIN, 0};
    ::poll(&p, 1, 1);
  }

  std::string sizes;
  for (uint64_t s : spec.sizes)
    sizes += (sizes.empty() ? "" : ",") + fmt::format("{}", s);
  std::vector<std::string> args = {
      spec.binary, "127.0.0.1",
      "-p",        std::to_string(port),
      "-t",        spec.test,
      "-s",        sizes,
      "-n",        std::to_string(spec.iterations),
      "-w",        std::to_string(spec.warmup),
      "-R",        fmt::format("{:.1f}", spec.percentile),
      "-E",        spec.wait_mode,
      "-f",        "-v"};
  if (spec.iov) {
    args.push_back("-D");
    args.push_back("iov,iov");
  }
  int client_pipe[2];
  if (::pipe2(client_pipe, O_CLOEXEC) != 0) {
    return Status::IOError("ucx_perftest: pipe failed");
  }
  Child client(std::move(args), client_pipe[1]);
  ::close(client_pipe[1]);
  std::string out;
  const bool in_time = ReadAll(client_pipe[0], deadline, &out);
  ::close(client_pipe[0]);
  if (!in_time) {
    return Status::IOError(
        fmt::format("{} timed out: {}", client.CommandLine(), out));
  }
  const int client_exit = client.Wait();
  if (client_exit != 0) {  // the server is killed on return
    return Status::IOError(fmt::format("{} exited {}: {}\nserver: {}",
                                       client.CommandLine(), client_exit, out,
                                       server_log()));
  }
  // It ends with its one test, once the client has disconnected.
  if (const int server_exit = server.Wait(); server_exit != 0) {
    return Status::IOError(fmt::format("ucx_perftest server exited {}: {}",
                                       server_exit, server_log()));
  }
  Result<UcxPerftestResult> r = ParseUcxPerftestCsv(out);
  if (!r.ok()) {
    return Status::IOError(client.CommandLine() + ": " + r.status().ToString());
  }
  return r;
}

}  // namespace

}  // namespace tierkv::bench
