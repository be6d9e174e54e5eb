#include "transport/wire.h"

namespace tierkv::transport {
namespace {
constexpr size_t kMaxStatusMessage = 4096;
constexpr uint32_t kMaxLayers = 65535;
constexpr uint32_t kMaxPartsPerLayer = 255;
constexpr size_t kMaxPartName = 64;
}  // namespace

void WireWriter::StatusValue(const Status& s) {
  Int(static_cast<uint8_t>(s.code()));
  std::string_view m = s.message();
  String(m.substr(0, kMaxStatusMessage));
}

void WireWriter::Layout(const LayoutSpec& layout) {
  Int(layout.page_tokens);
  Int(static_cast<uint32_t>(layout.layers.size()));
  for (const auto& layer : layout.layers) {
    Int(static_cast<uint8_t>(layer.parts.size()));
    for (const auto& p : layer.parts) {
      String(p.name);
      Int(p.bytes_per_token);
    }
  }
}

std::string WireReader::String(size_t max_len) {
  const uint32_t n = Int<uint32_t>();
  if (n > max_len || !Need(n)) {
    failed_ = true;
    return {};
  }
  if (n == 0) return {};
  std::string s(reinterpret_cast<const char*>(data_.data() + pos_), n);
  pos_ += n;
  return s;
}

Status WireReader::StatusValue() {
  const uint8_t raw = Int<uint8_t>();
  std::string message = String(kMaxStatusMessage);
  if (failed_) return Status::ProtocolError("truncated status");
  if (!IsKnownStatusCode(raw)) {
    failed_ = true;
    return Status::ProtocolError("unknown status code");
  }
  return Status(static_cast<StatusCode>(raw), message);
}

LayoutSpec WireReader::Layout() {
  LayoutSpec layout;
  layout.page_tokens = Int<uint32_t>();
  // Each layer needs at least its part count (1 B) plus one part (4+1+4 B).
  const uint32_t layers = Count(1 + 9, kMaxLayers);
  layout.layers.resize(layers);
  for (auto& layer : layout.layers) {
    const uint8_t parts = Int<uint8_t>();
    if (failed_ || parts > kMaxPartsPerLayer || remaining() < parts * 8u) {
      failed_ = true;
      return {};
    }
    layer.parts.resize(parts);
    for (auto& p : layer.parts) {
      p.name = String(kMaxPartName);
      p.bytes_per_token = Int<uint32_t>();
    }
    if (failed_) return {};
  }
  return layout;
}

uint32_t WireReader::Count(size_t min_item_bytes, uint32_t max_count) {
  const uint32_t n = Int<uint32_t>();
  if (failed_ || n > max_count ||
      (min_item_bytes > 0 && remaining() / min_item_bytes < n)) {
    failed_ = true;
    return 0;
  }
  return n;
}

Status WireReader::status(bool expect_end) const {
  if (failed_) return Status::ProtocolError("payload truncated or malformed");
  if (expect_end && pos_ != data_.size()) {
    return Status::ProtocolError("trailing bytes after payload");
  }
  return Status::OK();
}

}  // namespace tierkv::transport
