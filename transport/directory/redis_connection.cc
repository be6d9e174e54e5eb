// Implements RedisConnection (redis_connection.h) on hiredis 0.14's
// synchronous context, driving its buffers ourselves so that every wait is
// a ppoll(2) bounded by the caller's deadline.
#include "transport/directory/redis_connection.h"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace tierkv::transport {
namespace {

using Clock = RedisConnection::Clock;

// Blocks SIGPIPE on this thread for its scope and swallows one raised
// meanwhile: hiredis writes with write(2), which raises SIGPIPE when the
// server has gone, and a library must not kill (or depend on the
// signal disposition of) the process that uses it. tierkvd ignores SIGPIPE
// anyway; tests and tools may not.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    ::sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    ::pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~ScopedSigpipeBlock() {
    if (!was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      ::sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        while (::sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
        }
      }
    }
    ::pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
};

// The time left until `deadline`, at least 1 µs when any is left.
std::chrono::microseconds Remaining(Clock::time_point deadline) {
  const auto now = Clock::now();
  if (now >= deadline) return std::chrono::microseconds(0);
  return std::max(
      std::chrono::microseconds(1),
      std::chrono::duration_cast<std::chrono::microseconds>(deadline - now));
}

timespec ToTimespec(std::chrono::microseconds us) {
  return timespec{static_cast<time_t>(us.count() / 1000000),
                  static_cast<long>(us.count() % 1000000) * 1000};
}

// Waits until `fd` is ready for `events` or `deadline` passes. Returns 1
// when ready, 0 on timeout, -1 (errno set) on a poll error.
int WaitReady(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = Remaining(deadline);
    if (left.count() == 0) return 0;
    pollfd poll_fd{fd, events, 0};
    const timespec wait = ToTimespec(left);
    const int ready = ::ppoll(&poll_fd, 1, &wait, nullptr);
    if (ready < 0 && errno == EINTR) continue;
    return ready;
  }
}

timeval ToTimeval(std::chrono::microseconds us) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(us.count() / 1000000);
  tv.tv_usec = static_cast<suseconds_t>(us.count() % 1000000);
  return tv;
}

RedisReply Copy(const redisReply& raw) {
  RedisReply reply;
  switch (raw.type) {
    case REDIS_REPLY_STRING:
      reply.type = RedisReply::Type::kString;
      reply.str.assign(raw.str, raw.len);
      break;
    case REDIS_REPLY_STATUS:
      reply.type = RedisReply::Type::kStatus;
      reply.str.assign(raw.str, raw.len);
      break;
    case REDIS_REPLY_ERROR:
      reply.type = RedisReply::Type::kError;
      reply.str.assign(raw.str, raw.len);
      break;
    case REDIS_REPLY_INTEGER:
      reply.type = RedisReply::Type::kInteger;
      reply.integer = raw.integer;
      break;
    case REDIS_REPLY_ARRAY:
      reply.type = RedisReply::Type::kArray;
      reply.elements.reserve(raw.elements);
      for (size_t i = 0; i < raw.elements; ++i) {
        reply.elements.push_back(Copy(*raw.element[i]));
      }
      break;
    default:
      reply.type = RedisReply::Type::kNil;
      break;
  }
  return reply;
}

bool StartsWith(const std::string& text, std::string_view prefix) {
  return std::string_view(text).starts_with(prefix);
}

}  // namespace

RedisConnection::RedisConnection(redisContext* context, std::string peer)
    : context_(context), peer_(std::move(peer)) {}

RedisConnection::~RedisConnection() { redisFree(context_); }

Status RedisConnection::FailTimedOut(std::string_view what) {
  timed_out_ = true;
  return Fail(what, "deadline");
}

Status RedisConnection::Fail(std::string_view what, std::string_view detail) {
  broken_ = true;
  std::string message(what);
  message += " ";
  message += peer_;
  message += ": ";
  message += detail;
  return Status::Unavailable(message);
}

Result<std::unique_ptr<RedisConnection>> RedisConnection::Connect(
    const RedisUrl& url, std::string_view password, Clock::time_point deadline,
    bool* timed_out) {
  if (timed_out != nullptr) *timed_out = false;
  const std::string peer = url.ToString();
  const auto left = Remaining(deadline);
  if (left.count() == 0) {
    if (timed_out != nullptr) *timed_out = true;
    return Status::Unavailable("no time left to connect to " + peer);
  }
  redisContext* context =
      url.is_unix()
          ? redisConnectUnixWithTimeout(url.unix_path.c_str(), ToTimeval(left))
          : redisConnectWithTimeout(url.host.c_str(), url.port,
                                    ToTimeval(left));
  if (context == nullptr) {
    return Status::Unavailable("cannot allocate a connection to " + peer);
  }
  if (context->err != 0) {
    std::string message = "cannot connect to " + peer + ": " + context->errstr;
    if (timed_out != nullptr) {
      *timed_out = std::strstr(context->errstr, "timed out") != nullptr;
    }
    redisFree(context);
    return Status::Unavailable(message);
  }
  // hiredis 0.14 opens its sockets without SOCK_CLOEXEC: a child the daemon
  // spawns must not inherit (and keep open) the directory's connection.
  // Non-blocking: Pipeline bounds every write and read with ppoll, and
  // hiredis treats EAGAIN as "try again later" once REDIS_BLOCK is clear.
  const int fd_flags = ::fcntl(context->fd, F_GETFD);
  const int fl_flags = ::fcntl(context->fd, F_GETFL);
  if (fd_flags < 0 || fl_flags < 0 ||
      ::fcntl(context->fd, F_SETFD, fd_flags | FD_CLOEXEC) != 0 ||
      ::fcntl(context->fd, F_SETFL, fl_flags | O_NONBLOCK) != 0) {
    std::string message =
        "cannot set socket flags for " + peer + ": " + std::strerror(errno);
    redisFree(context);
    return Status::Unavailable(message);
  }
  context->flags &= ~REDIS_BLOCK;
  std::unique_ptr<RedisConnection> connection(
      new RedisConnection(context, peer));

  std::vector<RedisCommand> handshake;
  if (!password.empty()) {
    if (url.user.empty()) {
      handshake.push_back({"AUTH", std::string(password)});
    } else {
      handshake.push_back({"AUTH", url.user, std::string(password)});
    }
  }
  if (url.database != 0) {
    handshake.push_back({"SELECT", std::to_string(url.database)});
  }
  handshake.push_back({"PING"});
  Result<std::vector<RedisReply>> replies =
      connection->Pipeline(handshake, deadline);
  if (!replies.ok()) {
    if (timed_out != nullptr) {
      *timed_out = connection->timed_out() || !connection->broken();
    }
    return replies.status();
  }
  size_t next = 0;
  if (!password.empty()) {
    const RedisReply& auth = (*replies)[next++];
    if (auth.is_error()) {
      return Status::PermissionDenied(
          "Redis at " + peer + " refused the password" +
          (url.user.empty() ? "" : " of user \"" + url.user + "\"") +
          " from the password file: " + auth.str);
    }
  }
  if (url.database != 0) {
    const RedisReply& select = (*replies)[next++];
    if (select.is_error()) {
      if (StartsWith(select.str, "NOAUTH")) {
        return Status::PermissionDenied(
            "Redis at " + peer +
            " requires a password; set the directory's password file");
      }
      return Status::InvalidArgument("Redis at " + peer +
                                     " refused the database: " + select.str);
    }
  }
  const RedisReply& ping = (*replies)[next];
  if (ping.is_error()) {
    if (StartsWith(ping.str, "NOAUTH")) {
      return Status::PermissionDenied(
          "Redis at " + peer +
          " requires a password; set the directory's password file");
    }
    return Status::Unavailable("Redis at " + peer +
                               " refused PING: " + ping.str);
  }
  return connection;
}

Result<RedisReply> RedisConnection::Command(const RedisCommand& command,
                                            Clock::time_point deadline) {
  Result<std::vector<RedisReply>> replies =
      Pipeline(std::span<const RedisCommand>(&command, 1), deadline);
  if (!replies.ok()) return replies.status();
  return std::move(replies->front());
}

Result<std::vector<RedisReply>> RedisConnection::Pipeline(
    std::span<const RedisCommand> commands, Clock::time_point deadline) {
  if (broken_) return Status::Unavailable("connection to " + peer_ + " broken");
  std::vector<RedisReply> replies;
  if (commands.empty()) return replies;
  // Before anything reaches hiredis's output buffer: a call whose deadline
  // has passed leaves the connection as it found it.
  if (Remaining(deadline).count() == 0) {
    return Status::Unavailable("timed out before writing to " + peer_);
  }
  replies.reserve(commands.size());

  std::vector<const char*> argv;
  std::vector<size_t> argv_len;
  for (const RedisCommand& command : commands) {
    argv.clear();
    argv_len.clear();
    for (const std::string& arg : command) {
      argv.push_back(arg.data());
      argv_len.push_back(arg.size());
    }
    if (redisAppendCommandArgv(context_, static_cast<int>(argv.size()),
                               argv.data(), argv_len.data()) != REDIS_OK) {
      return Fail("cannot encode a command for", context_->errstr);
    }
  }

  ScopedSigpipeBlock no_sigpipe;
  // The socket is non-blocking: redisBufferWrite writes what fits, and
  // ppoll waits for room for the time left.
  int done = 0;
  for (;;) {
    if (redisBufferWrite(context_, &done) != REDIS_OK) {
      return Fail("cannot write to", context_->errstr);
    }
    if (done != 0) break;
    const int ready = WaitReady(context_->fd, POLLOUT, deadline);
    if (ready < 0) return Fail("cannot poll", std::strerror(errno));
    if (ready == 0) return FailTimedOut("timed out writing to");
  }

  while (replies.size() < commands.size()) {
    void* raw = nullptr;
    if (redisGetReplyFromReader(context_, &raw) != REDIS_OK) {
      return Fail("bad reply from", context_->errstr);
    }
    if (raw != nullptr) {
      replies.push_back(Copy(*static_cast<redisReply*>(raw)));
      freeReplyObject(raw);
      continue;
    }
    const int ready = WaitReady(context_->fd, POLLIN, deadline);
    if (ready < 0) return Fail("cannot poll", std::strerror(errno));
    if (ready == 0) return FailTimedOut("timed out waiting for");
    if (redisBufferRead(context_) != REDIS_OK) {
      return Fail("cannot read from", context_->errstr);
    }
  }
  return replies;
}

}  // namespace tierkv::transport
