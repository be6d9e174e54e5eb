// How peer messages ride on UCP active messages: the project's 32-byte
// frame (transport/frame.h) is every AM's header, so the fuzzed frame
// decoder validates each header a peer sends before anything else reads it.
//
//   AM id            AM header                        AM data
//   kHandshakeAmId   frame ‖ handshake message        none
//   kRequestAmId     frame ‖ MAC                      request payload, eager
//                    (frame covers the AM data)
//   kReplyAmId       frame ‖ reply head ‖ MAC         bulk bytes (eager, or
//                    (frame covers the head only)     rendezvous when large)
//
// MAC: the 16-byte session MAC of peer_handshake.h (ComputeMessageMac) over
// the header before it (and, for requests, the payload). peer_transport.cc
// checks and strips it before the functions below see the header; the
// frame checksum (XXH3) only catches corruption, it authenticates nothing.
// Rendezvous bulk bytes are covered by neither.
//
// A request's payload travels as AM data, not in the header, because UCX
// bounds AM headers (ucp_worker_attr_t::max_am_header); a reply's head
// travels in the header so that the requester can read it, and choose where
// the bulk bytes land, before they are received. The bulk bytes are not
// covered by the frame checksum: the application checks them (FETCH_REPLY
// carries an XXH3 per segment, scaleout.md §8b), since checksumming here
// would mean reading every byte twice.
//
// Thread-safe: free functions over values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tierkv/status.h"
#include "transport/frame.h"

namespace tierkv::transport::peer {

inline constexpr unsigned kHandshakeAmId = 0;
inline constexpr unsigned kRequestAmId = 1;
inline constexpr unsigned kReplyAmId = 2;

// A frame header followed by its payload (`head`), the AM header of
// handshake messages and replies.
std::vector<std::byte> EncodeFramedHeader(uint16_t opcode, uint64_t request_id,
                                          std::span<const std::byte> head);

struct FramedHeader {
  FrameHeader frame;
  std::span<const std::byte> head;  // points into the decoded bytes
};

// Decodes an AM header made by EncodeFramedHeader. ProtocolError when the
// frame is invalid (frame.h's rules), announces more than `max_head` bytes,
// the header's length is not 32 + payload_len, or the version is not
// kProtocolVersion; Corruption when the checksum does not match.
Result<FramedHeader> DecodeFramedHeader(std::span<const std::byte> am_header,
                                        uint64_t max_head);

// Decodes a request's AM header, the frame over `payload` (the AM data).
// ProtocolError as above, or when payload_len is not payload.size();
// Corruption on a checksum mismatch.
Result<FrameHeader> DecodeRequestHeader(std::span<const std::byte> am_header,
                                        std::span<const std::byte> payload,
                                        uint64_t max_payload);

}  // namespace tierkv::transport::peer
