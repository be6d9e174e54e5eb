// The handshake's messages and proofs, without UCX.
#include "transport/peer/peer_handshake.h"

#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace tierkv::transport::peer {
namespace {

std::vector<std::byte> Secret(char fill) {
  return std::vector<std::byte>(32, static_cast<std::byte>(fill));
}

Transcript SomeTranscript() {
  Transcript t;
  t.cluster = "prod-a";
  t.client_id = "gpu-01";
  t.server_id = "gpu-02";
  t.client_epoch = 7;
  t.server_epoch = 9;
  t.client_nonce = *RandomNonce();
  t.server_nonce = *RandomNonce();
  return t;
}

TEST(PeerHandshake, MessagesRoundTrip) {
  Hello hello{"prod-a", "gpu-01", 42, *RandomNonce()};
  Result<Hello> h = DecodeHello(EncodeHello(hello));
  ASSERT_OK(h);
  EXPECT_EQ(h->cluster, "prod-a");
  EXPECT_EQ(h->node_id, "gpu-01");
  EXPECT_EQ(h->epoch, 42u);
  EXPECT_EQ(h->nonce, hello.nonce);

  HelloAck ack{"gpu-02", 43, *RandomNonce(), {}};
  ack.proof = *ComputeProof(Secret('a'), ProofRole::kServer, SomeTranscript());
  Result<HelloAck> a = DecodeHelloAck(EncodeHelloAck(ack));
  ASSERT_OK(a);
  EXPECT_EQ(a->node_id, "gpu-02");
  EXPECT_EQ(a->proof, ack.proof);

  Result<Auth> auth = DecodeAuth(EncodeAuth(Auth{ack.proof}));
  ASSERT_OK(auth);
  EXPECT_EQ(auth->proof, ack.proof);
}

TEST(PeerHandshake, TruncatedOrTrailingBytesAreProtocolErrors) {
  std::vector<std::byte> hello = EncodeHello(Hello{"c", "n", 1, {}});
  for (size_t n = 0; n < hello.size(); ++n) {
    EXPECT_EQ(DecodeHello(std::span(hello).first(n)).status().code(),
              StatusCode::kProtocolError)
        << n;
  }
  hello.push_back(std::byte{0});
  EXPECT_EQ(DecodeHello(hello).status().code(), StatusCode::kProtocolError);
}

TEST(PeerHandshake, OverlongNodeIdIsRefused) {
  const Hello hello{"c", std::string(kMaxNodeIdBytes + 1, 'n'), 1, {}};
  EXPECT_EQ(DecodeHello(EncodeHello(hello)).status().code(),
            StatusCode::kProtocolError);
}

TEST(PeerHandshake, ProofVerifiesOnlyWithTheSameSecretRoleAndTranscript) {
  const Transcript t = SomeTranscript();
  const Proof proof = *ComputeProof(Secret('a'), ProofRole::kServer, t);
  EXPECT_TRUE(VerifyProof(Secret('a'), ProofRole::kServer, t, proof));
  EXPECT_FALSE(VerifyProof(Secret('b'), ProofRole::kServer, t, proof));
  // A server's proof reflected back as a client's is not accepted.
  EXPECT_FALSE(VerifyProof(Secret('a'), ProofRole::kClient, t, proof));
  Transcript other = t;
  other.client_nonce[0] ^= std::byte{1};
  EXPECT_FALSE(VerifyProof(Secret('a'), ProofRole::kServer, other, proof));
  other = t;
  other.cluster = "prod-b";
  EXPECT_FALSE(VerifyProof(Secret('a'), ProofRole::kServer, other, proof));
}

TEST(PeerHandshake, ProofIsNeverAllZeros) {
  const Result<Proof> proof =
      ComputeProof(Secret('a'), ProofRole::kServer, SomeTranscript());
  ASSERT_OK(proof);
  EXPECT_NE(*proof, Proof{});
  // An empty key fails (closed) instead of yielding a predictable proof.
  EXPECT_FALSE(ComputeProof({}, ProofRole::kServer, SomeTranscript()).ok());
  EXPECT_FALSE(VerifyProof({}, ProofRole::kServer, SomeTranscript(), Proof{}));
}

TEST(PeerHandshake, SessionKeyAndMessageMacBindTranscriptDirectionAndBytes) {
  const Transcript t = SomeTranscript();
  const Result<SessionKey> k = ComputeSessionKey(Secret('a'), t);
  ASSERT_OK(k);
  Transcript other = t;
  other.server_nonce[3] ^= std::byte{1};
  EXPECT_NE(*k, *ComputeSessionKey(Secret('a'), other));
  EXPECT_NE(*k, *ComputeSessionKey(Secret('b'), t));
  const std::vector<std::byte> header(32, std::byte{1});
  const std::vector<std::byte> body(5, std::byte{2});
  const Result<MessageMac> mac =
      ComputeMessageMac(*k, MacDirection::kFromClient, 1, header, body);
  ASSERT_OK(mac);
  EXPECT_TRUE(
      VerifyMessageMac(*k, MacDirection::kFromClient, 1, header, body, *mac));
  EXPECT_FALSE(
      VerifyMessageMac(*k, MacDirection::kFromServer, 1, header, body, *mac));
  EXPECT_FALSE(
      VerifyMessageMac(*k, MacDirection::kFromClient, 2, header, body, *mac));
  std::vector<std::byte> changed = body;
  changed[4] ^= std::byte{1};
  EXPECT_FALSE(VerifyMessageMac(*k, MacDirection::kFromClient, 1, header,
                                changed, *mac));
  EXPECT_FALSE(VerifyMessageMac(*k, MacDirection::kFromClient, 1, header, body,
                                std::span(*mac).first(kMacBytes - 1)));
  EXPECT_FALSE(VerifyMessageMac(*k, MacDirection::kFromClient, 1, header, body,
                                MessageMac{}));
}

TEST(PeerHandshake, NoncesDiffer) { EXPECT_NE(*RandomNonce(), *RandomNonce()); }

}  // namespace
}  // namespace tierkv::transport::peer
