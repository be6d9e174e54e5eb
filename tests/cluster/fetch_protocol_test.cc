// The FETCH messages: round trips, and decoders that refuse what a buggy or
// hostile peer sends without allocating for it.
#include "daemon/cluster/fetch_protocol.h"

#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace tierkv::daemon::cluster {
namespace {

FetchRequest Request(size_t keys) {
  FetchRequest r{.ns = "default", .fingerprint = 0x1234'5678'9abc'def0};
  for (size_t i = 0; i < keys; ++i) {
    r.keys.push_back({PageHash{i, ~i}, static_cast<uint16_t>(i % 78),
                      static_cast<uint8_t>(i % 2)});
  }
  return r;
}

TEST(FetchProtocolTest, RequestRoundTrips) {
  const FetchRequest sent = Request(kMaxFetchSegments);
  auto got = DecodeFetchRequest(EncodeFetchRequest(sent));
  ASSERT_OK(got);
  EXPECT_EQ(got->ns, sent.ns);
  EXPECT_EQ(got->fingerprint, sent.fingerprint);
  EXPECT_EQ(got->keys, sent.keys);
}

TEST(FetchProtocolTest, RequestDecoderRefusesEveryMalformedShape) {
  // No keys, too many keys, and every truncation of a valid request.
  EXPECT_EQ(DecodeFetchRequest(EncodeFetchRequest(Request(0))).status().code(),
            StatusCode::kProtocolError);
  EXPECT_EQ(
      DecodeFetchRequest(EncodeFetchRequest(Request(kMaxFetchSegments + 1)))
          .status()
          .code(),
      StatusCode::kProtocolError);
  const std::vector<std::byte> bytes = EncodeFetchRequest(Request(3));
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_EQ(DecodeFetchRequest(std::span(bytes).first(n)).status().code(),
              StatusCode::kProtocolError)
        << n << " bytes";
  }
  std::vector<std::byte> trailing = bytes;
  trailing.push_back(std::byte{0});
  EXPECT_EQ(DecodeFetchRequest(trailing).status().code(),
            StatusCode::kProtocolError);
  // A count claiming more keys than the payload holds allocates nothing.
  std::vector<std::byte> lying = EncodeFetchRequest(Request(1));
  const size_t count_at = 4 + 7 + 8;  // name length, "default", fingerprint
  lying[count_at] = std::byte{0xff};
  EXPECT_EQ(DecodeFetchRequest(lying).status().code(),
            StatusCode::kProtocolError);
}

TEST(FetchProtocolTest, ReplyHeadRoundTripsAndMustNameEverySegment) {
  using State = FetchedSegment::State;
  const std::vector<FetchedSegment> sent = {
      {.state = State::kServed, .bytes = 73728, .checksum = 1},
      {.state = State::kAbsent},
      {.state = State::kUnavailable},
      {.state = State::kServed, .bytes = 8448, .checksum = ~uint64_t{0}}};
  const std::vector<std::byte> head = EncodeFetchReplyHead(sent);
  // Fits the transport's default reply-head bound at the largest request.
  EXPECT_LE(EncodeFetchReplyHead(std::vector<FetchedSegment>(kMaxFetchSegments))
                .size(),
            4096u);
  auto got = DecodeFetchReplyHead(head, sent.size());
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) {
    EXPECT_EQ((*got)[i].state, sent[i].state);
    EXPECT_EQ((*got)[i].bytes, sent[i].bytes);
    EXPECT_EQ((*got)[i].checksum, sent[i].checksum);
  }
  EXPECT_EQ(DecodeFetchReplyHead(head, sent.size() + 1).status().code(),
            StatusCode::kProtocolError);
  EXPECT_EQ(
      DecodeFetchReplyHead(std::span(head).first(head.size() - 1), sent.size())
          .status()
          .code(),
      StatusCode::kProtocolError);
}

TEST(FetchProtocolTest, ReplyHeadDecoderRefusesInconsistentSegments) {
  using State = FetchedSegment::State;
  for (const FetchedSegment& bad :
       {FetchedSegment{.state = State::kServed, .bytes = 0},
        FetchedSegment{.state = State::kAbsent, .bytes = 64},
        FetchedSegment{.state = static_cast<State>(3), .bytes = 0}}) {
    EXPECT_EQ(DecodeFetchReplyHead(EncodeFetchReplyHead({&bad, 1}), 1)
                  .status()
                  .code(),
              StatusCode::kProtocolError)
        << static_cast<int>(bad.state) << " " << bad.bytes;
  }
}

TEST(FetchProtocolTest, ChecksumSeesEveryByte) {
  std::vector<std::byte> a(4096, std::byte{7});
  const uint64_t before = SegmentChecksum(a);
  a[4095] = std::byte{8};
  EXPECT_NE(SegmentChecksum(a), before);
}

}  // namespace
}  // namespace tierkv::daemon::cluster
