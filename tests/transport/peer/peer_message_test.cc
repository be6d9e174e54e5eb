// The AM header codec (peer_message.h): what a peer sends is checked by the
// project's frame decoder before anything else reads it.
#include "transport/peer/peer_message.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "tests/testing/status_matchers.h"
#include "transport/peer/peer_handshake.h"

namespace tierkv::transport::peer {
namespace {

std::vector<std::byte> Bytes(std::string_view s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return std::vector<std::byte>(p, p + s.size());
}

TEST(PeerMessage, FramedHeaderRoundTrips) {
  const std::vector<std::byte> head = Bytes("segment table");
  const std::vector<std::byte> am = EncodeFramedHeader(0x12, 99, head);
  ASSERT_EQ(am.size(), kFrameHeaderBytes + head.size());
  Result<FramedHeader> h = DecodeFramedHeader(am, 4096);
  ASSERT_OK(h);
  EXPECT_EQ(h->frame.opcode, 0x12);
  EXPECT_EQ(h->frame.request_id, 99u);
  EXPECT_TRUE(std::equal(head.begin(), head.end(), h->head.begin()));
}

TEST(PeerMessage, EveryBitFlipOfAFramedHeaderIsRefused) {
  const std::vector<std::byte> good = EncodeFramedHeader(7, 1, Bytes("head"));
  for (size_t bit = 0; bit < good.size() * 8; ++bit) {
    std::vector<std::byte> bad = good;
    bad[bit / 8] ^= std::byte(1u << (bit % 8));
    EXPECT_FALSE(DecodeFramedHeader(bad, 4096).ok()) << "bit " << bit;
  }
}

TEST(PeerMessage, EveryBitFlipOfARequestIsRefused) {
  const std::vector<std::byte> payload = Bytes("fetch pages");
  const HeaderBytes frame = EncodeFrameHeader(3, 5, payload);
  ASSERT_OK(DecodeRequestHeader(frame, payload, 1024));
  for (size_t bit = 0; bit < (frame.size() + payload.size()) * 8; ++bit) {
    HeaderBytes h = frame;
    std::vector<std::byte> p = payload;
    std::byte& b = bit / 8 < h.size() ? h[bit / 8] : p[bit / 8 - h.size()];
    b ^= std::byte(1u << (bit % 8));
    EXPECT_FALSE(DecodeRequestHeader(h, p, 1024).ok()) << "bit " << bit;
  }
}

TEST(PeerMessage, LengthsAreBounded) {
  const std::vector<std::byte> payload(100);
  const HeaderBytes frame = EncodeFrameHeader(3, 5, payload);
  EXPECT_EQ(DecodeRequestHeader(frame, payload, 99).status().code(),
            StatusCode::kProtocolError);
  // A header that announces more (or less) than the AM carries.
  EXPECT_EQ(DecodeRequestHeader(frame, std::span(payload).first(50), 1024)
                .status()
                .code(),
            StatusCode::kProtocolError);
  const std::vector<std::byte> am = EncodeFramedHeader(3, 5, payload);
  EXPECT_EQ(DecodeFramedHeader(am, 99).status().code(),
            StatusCode::kProtocolError);
  EXPECT_EQ(DecodeFramedHeader(std::span(am).first(am.size() - 1), 1024)
                .status()
                .code(),
            StatusCode::kProtocolError);
}

TEST(PeerMessage, RandomBytesAndTheFrameCorpusNeverDecodeOrCrash) {
  std::vector<std::vector<std::byte>> inputs;
  // fuzz/corpus/frame of the checkout this binary was built in, found by
  // walking up from the binary (build dirs live inside the checkout).
  std::filesystem::path corpus;
  std::error_code ec;
  for (std::filesystem::path dir =
           std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
       !ec && !dir.empty() && dir != dir.root_path(); dir = dir.parent_path()) {
    if (std::filesystem::is_directory(dir / "fuzz/corpus/frame")) {
      corpus = dir / "fuzz/corpus/frame";
      break;
    }
  }
  if (!corpus.empty()) {
    for (const auto& f : std::filesystem::directory_iterator(corpus)) {
      std::ifstream in(f.path(), std::ios::binary);
      std::vector<char> raw((std::istreambuf_iterator<char>(in)), {});
      inputs.emplace_back(
          reinterpret_cast<std::byte*>(raw.data()),
          reinterpret_cast<std::byte*>(raw.data()) + raw.size());
    }
  }
  std::mt19937_64 rng(27);
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::byte> b(rng() % 80);
    for (auto& x : b) x = static_cast<std::byte>(rng());
    if (b.size() >= 4 && i % 2 == 0) {  // past the magic check, sometimes
      const uint32_t magic = kFrameMagic;
      std::memcpy(b.data(), &magic, sizeof(magic));
    }
    inputs.push_back(std::move(b));
  }
  for (const auto& b : inputs) {
    EXPECT_FALSE(DecodeFramedHeader(b, 4096).ok());
    EXPECT_FALSE(DecodeRequestHeader(b, {}, 4096).ok());
    // The handshake decoders see only checked heads, but must hold anyway.
    DecodeHello(b).status().PermitUncheckedError();
    DecodeHelloAck(b).status().PermitUncheckedError();
    DecodeAuth(b).status().PermitUncheckedError();
  }
}

}  // namespace
}  // namespace tierkv::transport::peer
