// The peer tier's FETCH exchange over transport::peer::PeerTransport
// (scaleout.md §8(b)): a requester names segments of a shared namespace, the
// holder answers with a small head (per segment: its length, 0 when not held,
// whether it is served, and its XXH3-64) followed by the held segments' bytes,
// in request order, as the reply's bulk data (rendezvous: they land in the
// requester's memory).
//
// Both decoders are bounds-checked against hostile input (a peer is
// authenticated, not trusted to be bug-free): they allocate only what the
// message's own size allows.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv::daemon::cluster {

// The request's opcode on the peer transport.
inline constexpr uint16_t kFetchOpcode = 1;

// Segments per FETCH: the reply head (4 + 13 bytes per segment) must fit
// the transport's reply-head bound (PeerTransportOptions::
// max_reply_head_bytes, 4 KiB by default).
inline constexpr uint32_t kMaxFetchSegments = 256;

struct FetchRequest {
  std::string ns;                // the namespace's name on both nodes
  uint64_t fingerprint = 0;      // the requester's layout fingerprint
  std::vector<SegmentKey> keys;  // 1..kMaxFetchSegments
};

std::vector<std::byte> EncodeFetchRequest(const FetchRequest& request);
// ProtocolError for a truncated or malformed payload, no keys or more than
// kMaxFetchSegments, or trailing bytes.
Result<FetchRequest> DecodeFetchRequest(std::span<const std::byte> payload);

// One segment of a reply, in request order.
struct FetchedSegment {
  enum class State : uint8_t {
    kServed = 0,  // `bytes` of it follow in the reply's data
    kAbsent = 1,  // the holder does not have it (a stale directory hint)
    // The holder has it but cannot serve it now (its lease limits, no DRAM
    // to promote it into): ask another holder or later, the hint stands.
    kUnavailable = 2,
  };
  State state = State::kAbsent;
  uint32_t bytes = 0;     // > 0 when served
  uint64_t checksum = 0;  // SegmentChecksum of its bytes, when served
};

std::vector<std::byte> EncodeFetchReplyHead(
    std::span<const FetchedSegment> segments);
// ProtocolError unless the head holds exactly `count` segments, each in a
// known state, with bytes > 0 exactly when served.
Result<std::vector<FetchedSegment>> DecodeFetchReplyHead(
    std::span<const std::byte> head, size_t count);

// The checksum a holder sends and a requester verifies (XXH3-64).
uint64_t SegmentChecksum(std::span<const std::byte> bytes);

}  // namespace tierkv::daemon::cluster
