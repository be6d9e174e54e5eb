// libFuzzer: the frame header decoder and checksum check, as the daemon
// runs them on every frame a client sends (transport/frame.h).
#include <cstddef>
#include <cstdint>
#include <span>

#include "transport/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tierkv::transport;
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  if (size < kFrameHeaderBytes) return 0;
  const std::span<const std::byte> header(bytes, kFrameHeaderBytes);
  const std::span<const std::byte> rest(bytes + kFrameHeaderBytes,
                                        size - kFrameHeaderBytes);
  auto decoded = DecodeFrameHeader(header, /*max_payload=*/uint64_t{16} << 20);
  if (!decoded.ok()) return 0;
  if (decoded->payload_len == rest.size()) {
    (void)VerifyFrameChecksum(header, rest);
  }
  return 0;
}
