#include "transport/peer/peer_message.h"

#include <string>

namespace tierkv::transport::peer {
namespace {

Status CheckVersion(const FrameHeader& h) {
  if (h.version != kProtocolVersion) {
    return Status::ProtocolError("peer speaks protocol version " +
                                 std::to_string(h.version) + ", this node " +
                                 std::to_string(kProtocolVersion));
  }
  return Status::OK();
}

}  // namespace

std::vector<std::byte> EncodeFramedHeader(uint16_t opcode, uint64_t request_id,
                                          std::span<const std::byte> head) {
  const HeaderBytes frame = EncodeFrameHeader(opcode, request_id, head);
  std::vector<std::byte> out(kFrameHeaderBytes + head.size());
  std::copy(frame.begin(), frame.end(), out.begin());
  std::copy(head.begin(), head.end(), out.begin() + kFrameHeaderBytes);
  return out;
}

Result<FramedHeader> DecodeFramedHeader(std::span<const std::byte> am_header,
                                        uint64_t max_head) {
  Result<FrameHeader> h = DecodeFrameHeader(am_header, max_head);
  if (!h.ok()) return h.status();
  TIERKV_RETURN_IF_ERROR(CheckVersion(*h));
  if (am_header.size() != kFrameHeaderBytes + h->payload_len) {
    return Status::ProtocolError("AM header of " +
                                 std::to_string(am_header.size()) +
                                 " B does not hold a frame announcing " +
                                 std::to_string(h->payload_len) + " B");
  }
  const std::span<const std::byte> head = am_header.subspan(kFrameHeaderBytes);
  TIERKV_RETURN_IF_ERROR(VerifyFrameChecksum(am_header, head));
  return FramedHeader{*h, head};
}

Result<FrameHeader> DecodeRequestHeader(std::span<const std::byte> am_header,
                                        std::span<const std::byte> payload,
                                        uint64_t max_payload) {
  if (am_header.size() != kFrameHeaderBytes) {
    return Status::ProtocolError("request AM header of " +
                                 std::to_string(am_header.size()) +
                                 " B is not one frame header");
  }
  Result<FrameHeader> h = DecodeFrameHeader(am_header, max_payload);
  if (!h.ok()) return h.status();
  TIERKV_RETURN_IF_ERROR(CheckVersion(*h));
  if (h->payload_len != payload.size()) {
    return Status::ProtocolError(
        "request frame announces " + std::to_string(h->payload_len) +
        " B but carries " + std::to_string(payload.size()) + " B");
  }
  TIERKV_RETURN_IF_ERROR(VerifyFrameChecksum(am_header, payload));
  return *h;
}

}  // namespace tierkv::transport::peer
