// WireWriter / WireReader: little-endian encoding of protocol payloads.
//
// The reader is the daemon's first line of defence: every read is bounds
// checked, every count is checked against the bytes that remain before
// anything is allocated, and the first failure makes the reader "failed"
// (later reads return zero values), so decoders check status() once at the
// end. Hand-written rather than protobuf/flatbuffers: the messages are a
// handful of fixed-width fields and the hot path must not allocate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv::transport {

class WireWriter {
 public:
  template <typename T>
  requires std::is_integral_v<T>
  void Int(T v) {
    const size_t at = buf_.size();
    buf_.resize(at + sizeof(T));
    std::memcpy(buf_.data() + at, &v, sizeof(T));
  }
  void String(std::string_view s) {
    Int<uint32_t>(static_cast<uint32_t>(s.size()));
    if (s.empty()) return;  // an empty view may hold a null data()
    const size_t at = buf_.size();
    buf_.resize(at + s.size());
    std::memcpy(buf_.data() + at, s.data(), s.size());
  }
  void Hash(const PageHash& h) {
    Int(h.lo);
    Int(h.hi);
  }
  void Key(const SegmentKey& k) {
    Hash(k.page);
    Int(k.layer);
    Int(k.part);
  }
  // The bytes as they are, with no length prefix.
  void Bytes(std::span<const std::byte> b) {
    if (b.empty()) return;
    const size_t at = buf_.size();
    buf_.resize(at + b.size());
    std::memcpy(buf_.data() + at, b.data(), b.size());
  }
  void StatusValue(const Status& s);
  void Layout(const LayoutSpec& layout);

  std::vector<std::byte>& bytes() { return buf_; }
  std::vector<std::byte> Take() { return std::move(buf_); }

 private:
  std::vector<std::byte> buf_;
};

class WireReader {
 public:
  explicit WireReader(std::span<const std::byte> data) : data_(data) {}

  template <typename T>
  requires std::is_integral_v<T> T Int() {
    T v{};
    if (!Need(sizeof(T))) return v;
    std::memcpy(&v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  // Strings longer than `max_len` fail the reader.
  std::string String(size_t max_len = 4096);
  PageHash Hash() { return PageHash{Int<uint64_t>(), Int<uint64_t>()}; }
  SegmentKey Key() {
    SegmentKey k;
    k.page = Hash();
    k.layer = Int<uint16_t>();
    k.part = Int<uint8_t>();
    return k;
  }
  // Fills `out` with the next out.size() bytes (no length prefix); fails
  // the reader, leaving `out` as it was, when fewer remain.
  void Bytes(std::span<std::byte> out) {
    if (!Need(out.size()) || out.empty()) return;
    std::memcpy(out.data(), data_.data() + pos_, out.size());
    pos_ += out.size();
  }
  Status StatusValue();
  LayoutSpec Layout();

  // Reads an item count and checks that `count * min_item_bytes` bytes
  // remain and count <= max_count, so a hostile count cannot make the
  // caller allocate. Returns 0 and fails the reader otherwise.
  uint32_t Count(size_t min_item_bytes, uint32_t max_count = 1u << 20);

  // OK when every read so far was in bounds and, if `expect_end`, the
  // payload was consumed exactly.
  Status status(bool expect_end = true) const;
  bool failed() const { return failed_; }
  // Marks the payload invalid (for semantic checks made by decoders).
  void Fail() { failed_ = true; }
  size_t remaining() const { return failed_ ? 0 : data_.size() - pos_; }

 private:
  bool Need(size_t n) {
    if (failed_ || data_.size() - pos_ < n) {
      failed_ = true;
      return false;
    }
    return true;
  }

  std::span<const std::byte> data_;
  size_t pos_ = 0;
  bool failed_ = false;
};

inline constexpr size_t kWireKeyBytes = 16 + 2 + 1;
inline constexpr size_t kWireHashBytes = 16;

}  // namespace tierkv::transport
