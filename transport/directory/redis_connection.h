// RedisConnection: one synchronous hiredis connection whose every round
// trip is bounded by a deadline, with pipelining (send N commands in one
// write, then read N replies). The directory's building block; keeps
// hiredis out of every other header.
//
// Why not hiredis's own timeouts alone: redisSetTimeout bounds each
// read(2), not a whole reply, so a reply that trickles in could take many
// timeouts (and SO_SNDTIMEO is rounded to jiffies and restarts per
// write). Here the socket is non-blocking and every write and read waits
// in ppoll(2) for the time left until the deadline, so a round trip never
// outlives it by more than one syscall.
//
// Thread safety: not thread-safe; one user at a time (the directory hands
// a connection to one thread at a time). Owns its socket.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tierkv/status.h"
#include "transport/directory/redis_url.h"

struct redisContext;  // hiredis

namespace tierkv::transport {

// A reply, copied out of hiredis's tree into a value.
struct RedisReply {
  enum class Type { kString, kArray, kInteger, kNil, kStatus, kError };
  Type type = Type::kNil;
  std::string str;                   // kString, kStatus and kError
  int64_t integer = 0;               // kInteger
  std::vector<RedisReply> elements;  // kArray

  bool is_error() const { return type == Type::kError; }
};

// One command as its arguments, e.g. {"SADD", key, member}.
using RedisCommand = std::vector<std::string>;

class RedisConnection {
 public:
  using Clock = std::chrono::steady_clock;

  // Connects to `url`, authenticates with `password` (AUTH [user]
  // password; none when empty), selects the database and checks the link
  // with a PING, all before `deadline`.
  // Returns Unavailable when the server cannot be reached or does not
  // answer in time; PermissionDenied when the server refuses the
  // credentials, or asks for a password and none was given; InvalidArgument
  // when it refuses the database. Host names are resolved by getaddrinfo,
  // which the deadline does not bound (use addresses where that matters;
  // the directory calls this only from its background thread). When
  // `timed_out` is given it is set to whether an Unavailable was a timeout
  // (the server accepted but did not answer) rather than an IO error.
  // The socket is close-on-exec and non-blocking.
  static Result<std::unique_ptr<RedisConnection>> Connect(
      const RedisUrl& url, std::string_view password,
      Clock::time_point deadline, bool* timed_out = nullptr);

  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Sends `commands` in one pipeline and returns one reply per command, in
  // order. A Redis error (e.g. WRONGTYPE) is a reply of type kError, not a
  // failure. Returns Unavailable when the socket fails or not every reply
  // arrived before `deadline`; the connection is then broken() for good
  // (unread replies would be taken for the next call's) and must be
  // dropped, and timed_out() tells a timeout from an IO error. When
  // `deadline` has passed before anything was sent it returns Unavailable
  // at once and the connection stays usable (not broken()).
  // REQUIRES: !broken()
  Result<std::vector<RedisReply>> Pipeline(
      std::span<const RedisCommand> commands, Clock::time_point deadline);

  // Pipeline of one command.
  Result<RedisReply> Command(const RedisCommand& command,
                             Clock::time_point deadline);

  bool broken() const { return broken_; }
  // Whether the failure that broke the connection was the deadline (the
  // server answered too slowly) rather than an IO or protocol error.
  bool timed_out() const { return timed_out_; }

 private:
  explicit RedisConnection(redisContext* context, std::string peer);

  // Marks the connection broken and returns Unavailable("<what> <peer>:
  // <detail>").
  Status Fail(std::string_view what, std::string_view detail);
  // Fail() for a deadline that passed mid-trip: also sets timed_out_.
  Status FailTimedOut(std::string_view what);

  redisContext* const context_;  // owned; freed by the destructor
  const std::string peer_;       // the URL, for messages
  bool broken_ = false;
  bool timed_out_ = false;
};

}  // namespace tierkv::transport
