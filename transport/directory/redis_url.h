// RedisUrl: where the directory's Redis (or Valkey) server is, parsed from
// the `directory` setting of [cluster] (shared/reference/scaleout.md §8(g)).
//
//   redis://[user@]host[:port][/db]    TCP; host is a name, an IPv4 address
//                                      or a bracketed IPv6 address
//   unix:///path/to/redis.sock         a Unix socket (database 0)
//
// The password never appears in the URL (it would end up in configs, logs
// and `ps`): it comes from a file (RedisDirectory::Options::password_file),
// so `redis://user:password@...` is refused.
//
// Thread safety: a value type.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tierkv/status.h"

namespace tierkv::transport {

struct RedisUrl {
  std::string host;       // empty for a Unix socket
  uint16_t port = 6379;   // TCP only; Default: 6379
  std::string unix_path;  // empty for TCP
  std::string user;       // ACL user (Redis 6+); empty: "default"
  uint32_t database = 0;  // SELECT index; Default: 0

  bool is_unix() const { return !unix_path.empty(); }
  // The URL again, in the canonical form above (for logs and errors).
  std::string ToString() const;

  // Returns InvalidArgument, naming what is wrong, for anything but the
  // two forms above: another scheme, an empty host, a port outside
  // [1, 65535], a database that is not a number below 2^31, a password in
  // the URL, a relative or empty socket path, query strings or fragments.
  static Result<RedisUrl> Parse(std::string_view url);
};

}  // namespace tierkv::transport
