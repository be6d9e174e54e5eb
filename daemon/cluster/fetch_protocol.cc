#include "daemon/cluster/fetch_protocol.h"

#include <xxhash.h>

#include "transport/wire.h"

namespace tierkv::daemon::cluster {

using transport::WireReader;
using transport::WireWriter;

namespace {
constexpr size_t kSegmentHeadBytes =
    sizeof(uint8_t) + sizeof(uint32_t) + sizeof(uint64_t);
constexpr size_t kMaxNamespaceName = 255;
}  // namespace

std::vector<std::byte> EncodeFetchRequest(const FetchRequest& request) {
  WireWriter w;
  w.String(request.ns);
  w.Int(request.fingerprint);
  w.Int(static_cast<uint32_t>(request.keys.size()));
  for (const SegmentKey& key : request.keys) w.Key(key);
  return w.Take();
}

Result<FetchRequest> DecodeFetchRequest(std::span<const std::byte> payload) {
  WireReader r(payload);
  FetchRequest out;
  out.ns = r.String(kMaxNamespaceName);
  out.fingerprint = r.Int<uint64_t>();
  const uint32_t count = r.Count(transport::kWireKeyBytes, kMaxFetchSegments);
  if (!r.failed() && count == 0) r.Fail();
  out.keys.reserve(count);
  for (uint32_t i = 0; i < count && !r.failed(); ++i) {
    out.keys.push_back(r.Key());
  }
  TIERKV_RETURN_IF_ERROR(r.status());
  return out;
}

std::vector<std::byte> EncodeFetchReplyHead(
    std::span<const FetchedSegment> segments) {
  WireWriter w;
  w.Int(static_cast<uint32_t>(segments.size()));
  for (const FetchedSegment& s : segments) {
    w.Int(static_cast<uint8_t>(s.state));
    w.Int(s.bytes);
    w.Int(s.checksum);
  }
  return w.Take();
}

Result<std::vector<FetchedSegment>> DecodeFetchReplyHead(
    std::span<const std::byte> head, size_t count) {
  WireReader r(head);
  const uint32_t n = r.Count(kSegmentHeadBytes, kMaxFetchSegments);
  if (!r.failed() && n != count) {
    return Status::ProtocolError("FETCH reply names another segment count");
  }
  std::vector<FetchedSegment> out(n);
  for (FetchedSegment& s : out) {
    const uint8_t state = r.Int<uint8_t>();
    s.bytes = r.Int<uint32_t>();
    s.checksum = r.Int<uint64_t>();
    const bool served = state == 0;
    if (state > 2 || served != (s.bytes > 0)) r.Fail();
    s.state = static_cast<FetchedSegment::State>(state);
  }
  TIERKV_RETURN_IF_ERROR(r.status());
  return out;
}

uint64_t SegmentChecksum(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

}  // namespace tierkv::daemon::cluster
