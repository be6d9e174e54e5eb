// Frame: the unit on the wire between libtierkv and tierkvd (DESIGN.md §7).
//
// Every frame is a fixed 32-byte header followed by `payload_len` bytes:
//
//   offset size field
//        0    4 magic        "TKV1" (0x31564B54 little-endian)
//        4    2 version      kProtocolVersion
//        6    2 opcode       request opcode; responses set kResponseBit;
//                            kErrorOpcode answers a frame that could not be
//                            handled at all
//        8    8 request_id   echoed in the response
//       16    8 payload_len  bytes that follow; bounded by the receiver
//       24    4 checksum     low 32 bits of XXH3-64(header[0..24) ‖ payload)
//       28    4 reserved     must be 0
//
// All integers are little-endian. A receiver validates magic, reserved bits
// and length before reading the payload, and the checksum after.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tierkv/status.h"

namespace tierkv::transport {

inline constexpr uint32_t kFrameMagic = 0x31564B54;  // "TKV1"
// 2: a PutReserve placement carries an already_stored flag (dedup is OK,
// no longer the AlreadyExists code), so a v1 peer would misparse it.
inline constexpr uint16_t kProtocolVersion = 2;
inline constexpr size_t kFrameHeaderBytes = 32;
inline constexpr uint16_t kResponseBit = 0x8000;
inline constexpr uint16_t kErrorOpcode = 0xFFFF;
// Default bound on a frame's payload; servers and clients may lower it.
inline constexpr uint64_t kDefaultMaxPayloadBytes = uint64_t{16} << 20;

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint16_t version = kProtocolVersion;
  uint16_t opcode = 0;
  uint64_t request_id = 0;
  uint64_t payload_len = 0;
  uint32_t checksum = 0;
  uint32_t reserved = 0;
};

using HeaderBytes = std::array<std::byte, kFrameHeaderBytes>;

// Serializes a header for `payload`, filling in length and checksum.
HeaderBytes EncodeFrameHeader(uint16_t opcode, uint64_t request_id,
                              std::span<const std::byte> payload,
                              uint16_t version = kProtocolVersion);

// Parses a header. ProtocolError for a bad magic, nonzero reserved bits or a
// payload longer than `max_payload`; the version is returned as received so
// the caller can answer a version mismatch with an error frame.
Result<FrameHeader> DecodeFrameHeader(std::span<const std::byte> bytes,
                                      uint64_t max_payload);

// Corruption when the checksum does not cover `header_bytes` + `payload`.
Status VerifyFrameChecksum(std::span<const std::byte> header_bytes,
                           std::span<const std::byte> payload);

}  // namespace tierkv::transport
