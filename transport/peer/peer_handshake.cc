#include "transport/peer/peer_handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <initializer_list>
#include <string_view>

#include "transport/wire.h"

namespace tierkv::transport::peer {
namespace {

constexpr std::string_view kServerLabel = "tierkv-peer-server-v1";
constexpr std::string_view kClientLabel = "tierkv-peer-client-v1";
constexpr std::string_view kSessionLabel = "tierkv-peer-session-v1";

template <size_t N>
void PutArray(WireWriter& w, const std::array<std::byte, N>& a) {
  w.Bytes(std::span<const std::byte>(a.data(), a.size()));
}

template <size_t N>
void GetArray(WireReader& r, std::array<std::byte, N>& a) {
  r.Bytes(std::span<std::byte>(a.data(), a.size()));
}

}  // namespace

std::vector<std::byte> EncodeHello(const Hello& m) {
  WireWriter w;
  w.String(m.cluster);
  w.String(m.node_id);
  w.Int(m.epoch);
  PutArray(w, m.nonce);
  return w.Take();
}

std::vector<std::byte> EncodeHelloAck(const HelloAck& m) {
  WireWriter w;
  w.String(m.node_id);
  w.Int(m.epoch);
  PutArray(w, m.nonce);
  PutArray(w, m.proof);
  return w.Take();
}

std::vector<std::byte> EncodeAuth(const Auth& m) {
  WireWriter w;
  PutArray(w, m.proof);
  return w.Take();
}

Result<Hello> DecodeHello(std::span<const std::byte> payload) {
  WireReader r(payload);
  Hello m;
  m.cluster = r.String(kMaxClusterNameBytes);
  m.node_id = r.String(kMaxNodeIdBytes);
  m.epoch = r.Int<uint64_t>();
  GetArray(r, m.nonce);
  if (Status s = r.status(); !s.ok()) {
    return Status::ProtocolError("malformed HELLO: " + s.ToString());
  }
  return m;
}

Result<HelloAck> DecodeHelloAck(std::span<const std::byte> payload) {
  WireReader r(payload);
  HelloAck m;
  m.node_id = r.String(kMaxNodeIdBytes);
  m.epoch = r.Int<uint64_t>();
  GetArray(r, m.nonce);
  GetArray(r, m.proof);
  if (Status s = r.status(); !s.ok()) {
    return Status::ProtocolError("malformed HELLO_ACK: " + s.ToString());
  }
  return m;
}

Result<Auth> DecodeAuth(std::span<const std::byte> payload) {
  WireReader r(payload);
  Auth m;
  GetArray(r, m.proof);
  if (Status s = r.status(); !s.ok()) {
    return Status::ProtocolError("malformed AUTH: " + s.ToString());
  }
  return m;
}

Result<Nonce> RandomNonce() {
  Nonce n;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(n.data()),
                 static_cast<int>(n.size())) != 1) {
    return Status::Internal("RAND_bytes failed: no entropy for a nonce");
  }
  return n;
}

Result<uint64_t> RandomEpoch() {
  uint64_t epoch = 0;
  while (epoch == 0) {
    if (RAND_bytes(reinterpret_cast<unsigned char*>(&epoch), sizeof(epoch)) !=
        1) {
      return Status::Internal("RAND_bytes failed: no entropy for an epoch");
    }
  }
  return epoch;
}

namespace {

// HMAC-SHA256 of `parts` (concatenated) under `key`. Internal when the
// provider fails or returns anything but a full 32-byte tag: a failure
// must never leave a predictable (e.g. zero) tag behind.
Result<std::array<std::byte, 32>> HmacSha256(
    std::span<const std::byte> key,
    std::initializer_list<std::span<const std::byte>> parts) {
  std::array<std::byte, 32> out{};
  if (key.empty()) return Status::Internal("HMAC with an empty key");
  std::vector<std::byte> msg;
  size_t total = 0;
  for (const auto& part : parts) total += part.size();
  msg.reserve(total);
  for (const auto& part : parts)
    msg.insert(msg.end(), part.begin(), part.end());
  unsigned int len = 0;
  // One-shot HMAC(): deprecated only in OpenSSL 3's low-level HMAC_CTX
  // API, not this call. Its result is checked: on failure it returns null
  // and leaves `out` as it was (zeros), which must never pass as a tag.
  const unsigned char* r =
      HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(),
           reinterpret_cast<unsigned char*>(out.data()), &len);
  const bool ok = r != nullptr && len == out.size();
  if (!ok) return Status::Internal("HMAC-SHA256 failed");
  return out;
}

std::vector<std::byte> EncodeTranscript(std::string_view label,
                                        const Transcript& t) {
  WireWriter w;
  w.String(label);
  w.String(t.cluster);
  w.String(t.client_id);
  w.String(t.server_id);
  w.Int(t.client_epoch);
  w.Int(t.server_epoch);
  PutArray(w, t.client_nonce);
  PutArray(w, t.server_nonce);
  return w.Take();
}

}  // namespace

Result<Proof> ComputeProof(std::span<const std::byte> secret, ProofRole role,
                           const Transcript& t) {
  const std::vector<std::byte> msg = EncodeTranscript(
      role == ProofRole::kServer ? kServerLabel : kClientLabel, t);
  Result<std::array<std::byte, 32>> tag = HmacSha256(secret, {msg});
  if (!tag.ok()) return tag.status();
  static_assert(kProofBytes == 32);
  return *tag;
}

bool VerifyProof(std::span<const std::byte> secret, ProofRole role,
                 const Transcript& t, const Proof& proof) {
  const Result<Proof> expected = ComputeProof(secret, role, t);
  if (!expected.ok()) return false;  // fail closed
  return CRYPTO_memcmp(expected->data(), proof.data(), kProofBytes) == 0;
}

Result<SessionKey> ComputeSessionKey(std::span<const std::byte> secret,
                                     const Transcript& t) {
  const std::vector<std::byte> msg = EncodeTranscript(kSessionLabel, t);
  Result<std::array<std::byte, 32>> tag = HmacSha256(secret, {msg});
  if (!tag.ok()) return tag.status();
  return *tag;
}

Result<MessageMac> ComputeMessageMac(const SessionKey& key, MacDirection dir,
                                     unsigned am_id,
                                     std::span<const std::byte> header,
                                     std::span<const std::byte> body) {
  const std::byte prefix[2] = {static_cast<std::byte>(dir),
                               static_cast<std::byte>(am_id)};
  Result<std::array<std::byte, 32>> tag =
      HmacSha256(key, {std::span<const std::byte>(prefix), header, body});
  if (!tag.ok()) return tag.status();
  MessageMac mac;
  std::copy_n(tag->begin(), mac.size(), mac.begin());
  return mac;
}

bool VerifyMessageMac(const SessionKey& key, MacDirection dir, unsigned am_id,
                      std::span<const std::byte> header,
                      std::span<const std::byte> body,
                      std::span<const std::byte> mac) {
  if (mac.size() != kMacBytes) return false;
  const Result<MessageMac> expected =
      ComputeMessageMac(key, dir, am_id, header, body);
  if (!expected.ok()) return false;  // fail closed
  return CRYPTO_memcmp(expected->data(), mac.data(), kMacBytes) == 0;
}

}  // namespace tierkv::transport::peer
