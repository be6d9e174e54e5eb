#include "transport/frame.h"

#include <gtest/gtest.h>

#include <cstring>

#include "tests/testing/status_matchers.h"

namespace tierkv::transport {
namespace {

std::vector<std::byte> Bytes(std::string_view s) {
  auto b = std::as_bytes(std::span(s.data(), s.size()));
  return {b.begin(), b.end()};
}

TEST(FrameTest, HeaderRoundTripsAndChecksumCoversPayload) {
  auto payload = Bytes("hello");
  HeaderBytes h = EncodeFrameHeader(7, 42, payload);
  auto decoded = DecodeFrameHeader(h, 1024);
  ASSERT_OK(decoded);
  EXPECT_EQ(decoded->opcode, 7);
  EXPECT_EQ(decoded->request_id, 42u);
  EXPECT_EQ(decoded->payload_len, 5u);
  EXPECT_EQ(decoded->version, kProtocolVersion);
  EXPECT_OK(VerifyFrameChecksum(h, payload));
  payload[0] = std::byte{'j'};
  EXPECT_EQ(VerifyFrameChecksum(h, payload).code(), StatusCode::kCorruption);
}

TEST(FrameTest, ChecksumCoversTheHeaderToo) {
  auto payload = Bytes("x");
  HeaderBytes h = EncodeFrameHeader(7, 42, payload);
  h[8] ^= std::byte{1};  // request id bit flip
  EXPECT_EQ(VerifyFrameChecksum(h, payload).code(), StatusCode::kCorruption);
}

TEST(FrameTest, RejectsBadMagicReservedBitsAndLongPayloads) {
  HeaderBytes h = EncodeFrameHeader(1, 1, {});
  HeaderBytes bad = h;
  bad[0] = std::byte{0};
  EXPECT_EQ(DecodeFrameHeader(bad, 1024).status().code(),
            StatusCode::kProtocolError);
  bad = h;
  bad[30] = std::byte{1};
  EXPECT_EQ(DecodeFrameHeader(bad, 1024).status().code(),
            StatusCode::kProtocolError);
  bad = h;
  const uint64_t huge = uint64_t{1} << 40;
  std::memcpy(&bad[16], &huge, 8);
  EXPECT_EQ(DecodeFrameHeader(bad, 1024).status().code(),
            StatusCode::kProtocolError);
  EXPECT_EQ(DecodeFrameHeader(std::span(h).first(31), 1024).status().code(),
            StatusCode::kProtocolError);
}

}  // namespace
}  // namespace tierkv::transport
