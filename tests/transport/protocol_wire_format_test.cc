// Golden bytes for protocol.cc: the wire format of every message, byte for
// byte. The bytes were captured from the hand-written Encode() functions
// that the field visitors replaced (issue 26); a change here is a wire-format
// change and breaks deployed clients and daemons of other versions.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tests/testing/status_matchers.h"
#include "transport/protocol.h"

namespace tierkv::transport {
namespace {

std::string ToHex(std::span<const std::byte> bytes) {
  std::string hex;
  for (std::byte b : bytes) {
    char digits[3];
    std::snprintf(digits, sizeof(digits), "%02x", static_cast<unsigned>(b));
    hex += digits;
  }
  return hex;
}

std::vector<std::byte> FromHex(std::string_view hex) {
  std::vector<std::byte> bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    bytes.push_back(static_cast<std::byte>(
        std::stoul(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return bytes;
}

// `m` encodes to exactly `golden_hex`, and those bytes decode to a message
// that encodes to them again (the decoder reads every field the encoder
// writes). Hex strings make a failure show where the bytes differ.
template <typename M>
void ExpectWireBytes(const M& m, std::string_view golden_hex) {
  EXPECT_EQ(ToHex(Encode(m)), golden_hex);
  M decoded;
  ASSERT_OK(Decode(FromHex(golden_hex), decoded));
  EXPECT_EQ(ToHex(Encode(decoded)), golden_hex);
}

// Representative messages: every field set to a value whose bytes are
// easy to find, and every optional part both present and absent.
SegmentKey KeyA() {
  return {PageHash{0x1122334455667788, 0x99aabbccddeeff00}, 7, 1};
}

SegmentKey KeyB() { return {PageHash{5, 6}, 300, 0}; }

LayoutSpec SampleLayout() {
  LayoutSpec layout = LayoutSpec::Uniform(64, 3, {{"kv", 1152}});
  layout.layers[1].parts.push_back({"index_k", 132});
  return layout;
}

WaitReport SampleWaits() {
  WaitReport w;
  w.counts[0] = 5;
  w.counts[12] = 2;
  w.counts[kWaitReportBuckets - 1] = 1;
  w.total_nanos = 123456789;
  return w;
}

RegisterPoolRequest SamplePool(uint8_t kind) {
  RegisterPoolRequest p{.layer = 3,
                        .part = 1,
                        .kind = kind,
                        .offset = 4096,
                        .slot_bytes = 656,
                        .slot_count = 64};
  if (kind == RegisterPoolRequest::kDeviceIpc) {
    for (size_t i = 0; i < p.device_handle.size(); ++i)
      p.device_handle[i] = static_cast<std::byte>(i + 1);
  }
  if (kind != RegisterPoolRequest::kMemfd) {
    p.device_pool_bytes = uint64_t{1} << 30;
    for (size_t i = 0; i < p.device_uuid.size(); ++i)
      p.device_uuid[i] = static_cast<std::byte>(0xf0 + i);
  }
  return p;
}

TransferRequest SampleTransfer(bool with_waits) {
  TransferRequest t{.ticket = 3,
                    .first_layer = 1,
                    .num_layers = 4,
                    .pages = {PageHash{1, 2}, PageHash{3, 4}},
                    .slots = {7, 9}};
  if (with_waits) t.waits = SampleWaits();
  return t;
}

TEST(ProtocolWireFormatTest, RequestsKeepTheirBytes) {
  ExpectWireBytes(OpenNamespaceRequest{"ns", "secret"},
                  "020000006e7306000000736563726574");
  ExpectWireBytes(
      RegisterLayoutRequest{SampleLayout()},
      "400000000300000001020000006b768004000002020000006b76800400000700"
      "0000696e6465785f6b8400000001020000006b7680040000");
  ExpectWireBytes(
      MatchRequest{{PageHash{1, 2}, PageHash{3, 4}}, std::nullopt},
      "0200000001000000000000000200000000000000030000000000000004000000"
      "00000000");
  ExpectWireBytes(
      MatchRequest{{PageHash{1, 2}},
                   MatchPrefetch{.enabled = true, .first = 3, .count = 2}},
      "0100000001000000000000000200000000000000"
      "0103000200");
  ExpectWireBytes(
      PrefetchRequest{{PageHash{1, 2}}, SampleWaits()},
      "0100000001000000000000000200000000000000150500000000000000000000"
      "0000000000000000000000000000000000000000000000000000000000000000"
      "0000000000000000000000000000000000000000000000000000000000000000"
      "0000000000000000000000000000000000000000000200000000000000000000"
      "0000000000000000000000000000000000000000000000000000000000000000"
      "000000000000000000000000000000000000000000010000000000000015cd5b"
      "0700000000");
  ExpectWireBytes(
      PutReserveRequest{{{KeyA(), 73728}, {KeyB(), 8448}}},
      "02000000887766554433221100ffeeddccbbaa99070001002001000000000005"
      "0000000000000006000000000000002c01000021000000000000");
  ExpectWireBytes(
      KeysRequest{7, 250, {KeyA(), KeyB()}},
      "0700000000000000fa00000002000000887766554433221100ffeeddccbbaa99"
      "070001050000000000000006000000000000002c0100");
  ExpectWireBytes(ReleaseRequest{0x0102030405060708}, "0807060504030201");
  ExpectWireBytes(ListRequest{17}, "11000000");
  ExpectWireBytes(SamplePool(RegisterPoolRequest::kMemfd),
                  "030001000010000000000000900200000000000040000000");
  ExpectWireBytes(
      SamplePool(RegisterPoolRequest::kDeviceIpc),
      "0300010100100000000000009002000000000000400000000102030405060708"
      "090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728"
      "292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f400000004000000000"
      "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff");
  ExpectWireBytes(
      SamplePool(RegisterPoolRequest::kDeviceFd),
      "0300010200100000000000009002000000000000400000000000004000000000"
      "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff");
  ExpectWireBytes(RegisterTicketsRequest{33}, "21000000");
  ExpectWireBytes(
      SampleTransfer(/*with_waits=*/false),
      "0300000001000400020000000100000000000000020000000000000003000000"
      "000000000400000000000000020000000700000009000000");
  ExpectWireBytes(
      SampleTransfer(/*with_waits=*/true),
      "0300000001000400020000000100000000000000020000000000000003000000"
      "0000000004000000000000000200000007000000090000001505000000000000"
      "0000000000000000000000000000000000000000000000000000000000000000"
      "0000000000000000000000000000000000000000000000000000000000000000"
      "0000000000000000000000000000000000000000000000000002000000000000"
      "0000000000000000000000000000000000000000000000000000000000000000"
      "0000000000000000000000000000000000000000000000000001000000000000"
      "0015cd5b0700000000");
  ExpectWireBytes(
      TopkReportRequest{{{PageHash{1, 2}, 3, 9}, {PageHash{7, 8}, 0, 1}}},
      "0200000001000000000000000200000000000000030009000000070000000000"
      "00000800000000000000000001000000");
}

TEST(ProtocolWireFormatTest, ResponsesKeepTheirBytes) {
  ExpectWireBytes(JsonResponse{Status::OK(), R"({"version":1})"},
                  "00000000000d0000007b2276657273696f6e223a317d");
  ExpectWireBytes(
      OpenNamespaceResponse{Status::OK(), uint64_t{1} << 20,
                            /*has_layout=*/true, SampleLayout()},
      "0000000000000010000000000001400000000300000001020000006b76800400"
      "0002020000006b768004000007000000696e6465785f6b840000000102000000"
      "6b7680040000");
  ExpectWireBytes(
      OpenNamespaceResponse{
          Status::PermissionDenied("bad token"), 0, /*has_layout=*/false, {}},
      "040900000062616420746f6b656e000000000000000000");
  ExpectWireBytes(
      MatchResponse{Status::OK(), 1, {Tier::kHost, Tier::kNvme, Tier::kMiss}},
      "000000000001000000030000000102ff");
  ExpectWireBytes(
      PutReserveResponse{
          Status::OK(),
          3,
          {{Status::OK(), 8192, /*already_stored=*/false},
           {Status::OK(), 0, /*already_stored=*/true},
           {Status::Busy("being written"), 0, /*already_stored=*/false}}},
      "0000000000030000000000000003000000000000000000200000000000000000"
      "00000000000000000000000001060d0000006265696e67207772697474656e00"
      "0000000000000000");
  ExpectWireBytes(
      ItemStatusResponse{
          Status::OK(), 5, {Status::OK(), Status::NotFound("x")}},
      "00000000000500000000000000020000000000000000010100000078");
  ExpectWireBytes(
      GetResponse{Status::OK(),
                  9,
                  {{Status::OK(), Tier::kHost, 4096, 100},
                   {Status::NotFound("gone"), Tier::kMiss, 0, 0}}},
      "0000000000090000000000000002000000000000000001001000000000000064"
      "000000000000000104000000676f6e65ff000000000000000000000000000000"
      "00");
  ExpectWireBytes(StatusResponse{Status::Busy("later")},
                  "06050000006c61746572");
  ExpectWireBytes(
      ListResponse{
          Status::OK(),
          {{KeyA(), 4096, 2, Tier::kNvme}, {KeyB(), 1, 0, Tier::kHbm}}},
      "000000000002000000887766554433221100ffeeddccbbaa9907000100100000"
      "000000000200000002050000000000000006000000000000002c010001000000"
      "000000000000000000");
}

// The weights messages (issue 28), pinned from their first version.
TEST(ProtocolWireFormatTest, WeightsMessagesKeepTheirBytes) {
  ExpectWireBytes(WeightsSealRequest{{std::byte{0xab}, std::byte{0xcd}}},
                  "02000000abcd");
  ExpectWireBytes(WeightsSealResponse{Status::OK(), PageHash{1, 2},
                                      /*already_sealed=*/true},
                  "00000000000100000000000000020000000000000001");
  ExpectWireBytes(
      WeightsSelectRequest{"m", "a/b", PageHash{3, 4}, {5, 6}},
      "010000006d03000000612f620300000000000000040000000000000005000600");
  ExpectWireBytes(WeightsManifestResponse{Status::OK(), {std::byte{0xee}}},
                  "000000000001000000ee");
  WeightsInfo info;
  info.id = {"m", "l", PageHash{7, 8}};
  info.image_bytes = 9;
  info.tensors = 10;
  info.chunks = 11;
  info.num_layers = 12;
  info.sealed_unix_ms = 13;
  info.chunks_in_dram = 14;
  info.chunks_on_nvme = 15;
  info.chunks_missing = 16;
  info.unique_bytes = 17;
  ExpectWireBytes(
      WeightsListResponse{Status::OK(), {info}},
      "000000000001000000010000006d010000006c07000000000000000800000000"
      "00000009000000000000000a0000000b0000000c0000000d000000000000000e"
      "0000000f000000100000001100000000000000");
  ExpectWireBytes(WeightsDropResponse{Status::OK(), 2, 4096},
                  "0000000000020000000010000000000000");
  // Round 2: kWeightsHint and kWeightsPin.
  ExpectWireBytes(WeightsHintRequest{{{{"m", "l", PageHash{1, 2}}, -1}}},
                  "01000000010000006d010000006c010000000000000002000000000000"
                  "00ffffffffffffffff");
  ExpectWireBytes(WeightsPinRequest{{"m", "", {}}, 1000},
                  "010000006d0000000000000000000000000000000000000000e8030000"
                  "00000000");
  // Round 3: kWeightsLoad (no wait report: no trailer).
  ExpectWireBytes(WeightsLoadRequest{7, {"m", "l", PageHash{1, 2}}, 3, 4, {}},
                  "07000000010000006d010000006c0100000000000000020000000000"
                  "000003000400");
}

TEST(ProtocolWireFormatTest, ErrorPayloadIsAStatus) {
  const std::string_view golden_hex = "050400000066756c6c";
  EXPECT_EQ(ToHex(EncodeError(Status::ResourceExhausted("full"))), golden_hex);
  const Status decoded = DecodeError(FromHex(golden_hex));
  EXPECT_EQ(decoded.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(decoded.message(), "full");
}

// Decoders name what is wrong with a malformed payload; the daemon sends
// that text back to the client.
TEST(ProtocolWireFormatTest, MalformedPayloadsSayWhatIsWrong) {
  const std::vector<std::byte> keys = Encode(KeysRequest{7, 250, {KeyA()}});
  KeysRequest request;
  Status s = Decode(std::span(keys).first(keys.size() - 1), request);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError);
  EXPECT_EQ(s.message(), "payload truncated or malformed");
  std::vector<std::byte> longer = keys;
  longer.push_back(std::byte{0});
  s = Decode(longer, request);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError);
  EXPECT_EQ(s.message(), "trailing bytes after payload");

  // Cut inside the leading overall Status of a response.
  const std::vector<std::byte> get = Encode(GetResponse{Status::Busy("x")});
  GetResponse response;
  s = Decode(std::span(get).first(3), response);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError);
  EXPECT_EQ(s.message(), "payload truncated or malformed");
  s = DecodeError(std::span(get).first(3));
  EXPECT_EQ(s.code(), StatusCode::kProtocolError);
  EXPECT_EQ(s.message(), "payload truncated or malformed");
}

}  // namespace
}  // namespace tierkv::transport
