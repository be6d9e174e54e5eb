#include "transport/frame.h"

#define XXH_INLINE_ALL  // header-only: lets the compiler inline XXH3
#include <xxhash.h>

#include <cstring>
#include <string>

namespace tierkv::transport {
namespace {

constexpr size_t kChecksumOffset = 24;

template <typename T>
void Put(std::byte* at, T v) {
  std::memcpy(at, &v, sizeof(v));  // little-endian host (static_assert'ed)
}
template <typename T>
T Get(const std::byte* at) {
  T v;
  std::memcpy(&v, at, sizeof(v));
  return v;
}

uint32_t Checksum(std::span<const std::byte> header_bytes,
                  std::span<const std::byte> payload) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, header_bytes.data(), kChecksumOffset);
  if (!payload.empty()) {
    XXH3_64bits_update(&state, payload.data(), payload.size());
  }
  return static_cast<uint32_t>(XXH3_64bits_digest(&state));
}

}  // namespace

HeaderBytes EncodeFrameHeader(uint16_t opcode, uint64_t request_id,
                              std::span<const std::byte> payload,
                              uint16_t version) {
  HeaderBytes h{};
  Put<uint32_t>(&h[0], kFrameMagic);
  Put<uint16_t>(&h[4], version);
  Put<uint16_t>(&h[6], opcode);
  Put<uint64_t>(&h[8], request_id);
  Put<uint64_t>(&h[16], payload.size());
  Put<uint32_t>(&h[24], Checksum(h, payload));
  Put<uint32_t>(&h[28], 0);
  return h;
}

Result<FrameHeader> DecodeFrameHeader(std::span<const std::byte> bytes,
                                      uint64_t max_payload) {
  if (bytes.size() < kFrameHeaderBytes) {
    return Status::ProtocolError("truncated frame header");
  }
  FrameHeader h;
  h.magic = Get<uint32_t>(&bytes[0]);
  h.version = Get<uint16_t>(&bytes[4]);
  h.opcode = Get<uint16_t>(&bytes[6]);
  h.request_id = Get<uint64_t>(&bytes[8]);
  h.payload_len = Get<uint64_t>(&bytes[16]);
  h.checksum = Get<uint32_t>(&bytes[24]);
  h.reserved = Get<uint32_t>(&bytes[28]);
  if (h.magic != kFrameMagic) {
    return Status::ProtocolError("bad frame magic (not a tierkv peer?)");
  }
  if (h.reserved != 0) {
    return Status::ProtocolError("reserved header bits are set");
  }
  if (h.payload_len > max_payload) {
    return Status::ProtocolError(
        "frame payload of " + std::to_string(h.payload_len) +
        " B exceeds the limit of " + std::to_string(max_payload) + " B");
  }
  return h;
}

Status VerifyFrameChecksum(std::span<const std::byte> header_bytes,
                           std::span<const std::byte> payload) {
  if (header_bytes.size() < kFrameHeaderBytes) {
    return Status::ProtocolError("truncated frame header");
  }
  if (Get<uint32_t>(&header_bytes[kChecksumOffset]) !=
      Checksum(header_bytes, payload)) {
    return Status::Corruption("frame checksum mismatch");
  }
  return Status::OK();
}

}  // namespace tierkv::transport
