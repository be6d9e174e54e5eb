// Status and Result<T>: how every tierkv call reports success or failure.
//
// tierkv never throws across its API. A call returns a Status (or a Result<T>
// holding either a value or a non-OK Status). The code tells the caller what
// to do next; the message is for humans and logs.
//
// Thread safety: Status and Result are values; distinct objects may be used
// from different threads without synchronization.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace tierkv {

// A closed set of outcomes. The numeric values travel on the wire: append
// new codes at the end and never renumber.
enum class StatusCode : uint8_t {
  kOk = 0,
  kNotFound = 1,  // The key (or namespace) does not exist. Retry: no.
  // Stored already (storage-internal, e.g. the NVMe store's dedup). No
  // public call returns it: Client::Put reports dedup as OK with
  // PutResult::already_stored.
  kAlreadyExists = 2,
  kInvalidArgument = 3,    // The request is malformed. Fix the caller.
  kPermissionDenied = 4,   // Wrong namespace token, or not opened.
  kResourceExhausted = 5,  // No space even after eviction (e.g. all pinned).
  kBusy = 6,               // Transiently unavailable; retry later.
  kIOError = 7,            // A device or socket failed.
  kCorruption = 8,         // Checksum or format check failed.
  kShutdown = 9,           // The daemon is stopping.
  kProtocolError = 10,     // The peer sent a frame we cannot parse.
  kInternal = 11,          // A bug. Please report it.
  kUnavailable = 12,       // Cannot reach the daemon.
};

// Returns a stable lowercase name such as "not_found".
constexpr std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kNotFound:
      return "not_found";
    case StatusCode::kAlreadyExists:
      return "already_exists";
    case StatusCode::kInvalidArgument:
      return "invalid_argument";
    case StatusCode::kPermissionDenied:
      return "permission_denied";
    case StatusCode::kResourceExhausted:
      return "resource_exhausted";
    case StatusCode::kBusy:
      return "busy";
    case StatusCode::kIOError:
      return "io_error";
    case StatusCode::kCorruption:
      return "corruption";
    case StatusCode::kShutdown:
      return "shutdown";
    case StatusCode::kProtocolError:
      return "protocol_error";
    case StatusCode::kInternal:
      return "internal";
    case StatusCode::kUnavailable:
      return "unavailable";
  }
  return "unknown";
}

// True for codes a peer may legitimately send (used by the wire decoder).
constexpr bool IsKnownStatusCode(uint8_t raw) {
  return raw <= static_cast<uint8_t>(StatusCode::kUnavailable);
}

// An OK Status holds no allocation; an error holds its code and message.
class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string_view message)
      : code_(code),
        message_(code == StatusCode::kOk
                     ? nullptr
                     : std::make_shared<const std::string>(message)) {}

  static Status OK() { return Status(); }
  static Status NotFound(std::string_view m) {
    return {StatusCode::kNotFound, m};
  }
  static Status AlreadyExists(std::string_view m) {
    return {StatusCode::kAlreadyExists, m};
  }
  static Status InvalidArgument(std::string_view m) {
    return {StatusCode::kInvalidArgument, m};
  }
  static Status PermissionDenied(std::string_view m) {
    return {StatusCode::kPermissionDenied, m};
  }
  static Status ResourceExhausted(std::string_view m) {
    return {StatusCode::kResourceExhausted, m};
  }
  static Status Busy(std::string_view m) { return {StatusCode::kBusy, m}; }
  static Status IOError(std::string_view m) {
    return {StatusCode::kIOError, m};
  }
  static Status Corruption(std::string_view m) {
    return {StatusCode::kCorruption, m};
  }
  static Status Shutdown(std::string_view m) {
    return {StatusCode::kShutdown, m};
  }
  static Status ProtocolError(std::string_view m) {
    return {StatusCode::kProtocolError, m};
  }
  static Status Internal(std::string_view m) {
    return {StatusCode::kInternal, m};
  }
  static Status Unavailable(std::string_view m) {
    return {StatusCode::kUnavailable, m};
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  bool IsNotFound() const { return code_ == StatusCode::kNotFound; }
  bool IsAlreadyExists() const { return code_ == StatusCode::kAlreadyExists; }

  // The human-readable detail; empty for OK.
  std::string_view message() const {
    return message_ ? std::string_view(*message_) : std::string_view();
  }

  // "ok", or "<code>: <message>".
  std::string ToString() const {
    if (ok()) return "ok";
    std::string s(StatusCodeName(code_));
    s += ": ";
    s += message();
    return s;
  }

  // Explicitly drops an error the caller has decided not to handle.
  void PermitUncheckedError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::shared_ptr<const std::string> message_;  // null when OK
};

// Either a T or a non-OK Status (std::expected is C++23).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).ok()) {
      v_ = Status::Internal("Result constructed from an OK Status");
    }
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  // REQUIRES: ok()
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  // OK when a value is held.
  Status status() const { return ok() ? Status::OK() : std::get<Status>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace tierkv

// Returns early from the enclosing function when `expr` is not OK.
#define TIERKV_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::tierkv::Status tierkv_status_ = (expr);        \
    if (!tierkv_status_.ok()) return tierkv_status_; \
  } while (0)
