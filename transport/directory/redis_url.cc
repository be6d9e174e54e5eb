// Parses the directory's Redis URL (redis_url.h). Hand-written because the
// grammar is two fixed forms and no URL library is a dependency of the
// project; a general parser would also accept forms hiredis cannot use.
#include "transport/directory/redis_url.h"

#include <sys/un.h>

#include <charconv>
#include <string>

namespace tierkv::transport {
namespace {

constexpr std::string_view kTcpScheme = "redis://";
constexpr std::string_view kUnixScheme = "unix://";

Status Invalid(std::string_view url, std::string_view why) {
  std::string message = "bad Redis URL \"";
  message += url;
  message += "\": ";
  message += why;
  message +=
      " (expected redis://[user@]host[:port][/db] or "
      "unix:///path/to/socket)";
  return Status::InvalidArgument(message);
}

// Parses a decimal in [min, max] made of digits only.
bool ParseNumber(std::string_view text, uint64_t min, uint64_t max,
                 uint64_t* out) {
  if (text.empty() || text.size() > 10) return false;
  uint64_t value = 0;
  const auto [end, ec] =
      std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return false;
  if (value < min || value > max) return false;
  *out = value;
  return true;
}

bool HasControlOrSpace(std::string_view text) {
  for (const char c : text) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) return true;
  }
  return false;
}

}  // namespace

std::string RedisUrl::ToString() const {
  if (is_unix()) return std::string(kUnixScheme) + unix_path;
  std::string out(kTcpScheme);
  if (!user.empty()) out += user + "@";
  if (host.find(':') != std::string::npos) {
    out += "[" + host + "]";
  } else {
    out += host;
  }
  out += ":" + std::to_string(port) + "/" + std::to_string(database);
  return out;
}

Result<RedisUrl> RedisUrl::Parse(std::string_view url) {
  if (HasControlOrSpace(url)) {
    return Invalid(url, "contains spaces or control characters");
  }
  if (url.find_first_of("?#") != std::string_view::npos) {
    return Invalid(url, "query strings and fragments are not supported");
  }
  RedisUrl parsed;
  if (url.starts_with(kUnixScheme)) {
    const std::string_view path = url.substr(kUnixScheme.size());
    if (path.size() < 2 || path.front() != '/' || path.back() == '/') {
      return Invalid(url, "the socket path must be absolute (unix:///...)");
    }
    // hiredis copies the path into sockaddr_un::sun_path, NUL included, and
    // would silently truncate a longer one.
    if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
      return Invalid(url, "the socket path is longer than 107 bytes");
    }
    parsed.unix_path = std::string(path);
    return parsed;
  }
  if (!url.starts_with(kTcpScheme)) {
    return Invalid(url, "unknown scheme");
  }
  std::string_view rest = url.substr(kTcpScheme.size());

  // [/db]
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    const std::string_view db = rest.substr(slash + 1);
    uint64_t value = 0;
    if (!ParseNumber(db, 0, (uint64_t{1} << 31) - 1, &value)) {
      return Invalid(url, "the database must be a number");
    }
    parsed.database = static_cast<uint32_t>(value);
    rest = rest.substr(0, slash);
  }
  // [user@]
  if (const size_t at = rest.rfind('@'); at != std::string_view::npos) {
    const std::string_view user = rest.substr(0, at);
    if (user.find(':') != std::string_view::npos) {
      // Not echoed: the URL holds a secret that must not reach logs.
      return Status::InvalidArgument(
          "bad Redis URL: a password in the URL is refused; put it in the "
          "directory password file");
    }
    if (user.empty() || user.find('@') != std::string_view::npos) {
      return Invalid(url, "empty or malformed user");
    }
    parsed.user = std::string(user);
    rest = rest.substr(at + 1);
  }
  // host[:port], host may be [v6]
  std::string_view host = rest;
  std::string_view port;
  if (rest.starts_with('[')) {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) {
      return Invalid(url, "unterminated [IPv6] host");
    }
    host = rest.substr(1, close - 1);
    const std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return Invalid(url, "junk after [IPv6] host");
      port = after.substr(1);
      if (port.empty()) return Invalid(url, "empty port");
    }
  } else if (const size_t colon = rest.find(':');
             colon != std::string_view::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
    if (port.empty()) return Invalid(url, "empty port");
  }
  if (host.empty()) return Invalid(url, "empty host");
  if (!port.empty()) {
    uint64_t value = 0;
    if (!ParseNumber(port, 1, 65535, &value)) {
      return Invalid(url, "the port must be a number in [1, 65535]");
    }
    parsed.port = static_cast<uint16_t>(value);
  }
  parsed.host = std::string(host);
  return parsed;
}

}  // namespace tierkv::transport
