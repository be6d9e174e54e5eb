// The peers' handshake: mutual HMAC-SHA256 challenge-response over a
// cluster secret (scaleout.md §8b, §8f).
//
//   client -> server  HELLO     {cluster, client_id, client_epoch, nonce_c}
//   server -> client  HELLO_ACK {server_id, server_epoch, nonce_s, proof_s}
//   client -> server  AUTH      {proof_c}
//   server -> client  AUTH_OK   {}
//
// A server that does not admit a client (another cluster, a wrong proof,
// traffic before AUTH) answers REFUSED {} and then closes the endpoint, so
// that the client can tell a refusal from a network failure without
// waiting for a timeout; it says no more than that.
//
// proof_s = HMAC(secret, "tierkv-peer-server-v1" ‖ transcript) and
// proof_c = HMAC(secret, "tierkv-peer-client-v1" ‖ transcript), where the
// transcript is the cluster name, both node ids, both epochs and both
// nonces, length-prefixed. Each side proves knowledge of the secret over a
// nonce the other chose, so neither a replayed nor a reflected proof (the
// two labels differ) is accepted. AUTH_OK exists so that the client sends
// no request before the server has admitted it (UCX does not promise to
// order AM messages of different protocols on one endpoint).
//
// This file holds the messages and the cryptography; the state machine is
// in peer_transport.cc. Thread-safe: free functions over values.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tierkv/status.h"

namespace tierkv::transport::peer {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;  // HMAC-SHA256
// Bounds on the names a HELLO carries (a node id is a host name).
inline constexpr size_t kMaxNodeIdBytes = 255;
inline constexpr size_t kMaxClusterNameBytes = 255;

using Nonce = std::array<std::byte, kNonceBytes>;
using Proof = std::array<std::byte, kProofBytes>;

// Handshake message kinds: the opcode of their frame (AM id kHandshakeAmId).
enum class HandshakeOp : uint16_t {
  kHello = 1,
  kHelloAck = 2,
  kAuth = 3,
  kAuthOk = 4,
  kRefused = 5,
};

struct Hello {
  std::string cluster;
  std::string node_id;
  uint64_t epoch = 0;
  Nonce nonce{};
};

struct HelloAck {
  std::string node_id;
  uint64_t epoch = 0;
  Nonce nonce{};
  Proof proof{};
};

struct Auth {
  Proof proof{};
};

// What both proofs cover.
struct Transcript {
  std::string cluster;
  std::string client_id;
  std::string server_id;
  uint64_t client_epoch = 0;
  uint64_t server_epoch = 0;
  Nonce client_nonce{};
  Nonce server_nonce{};
};

enum class ProofRole : uint8_t { kServer, kClient };

std::vector<std::byte> EncodeHello(const Hello& m);
std::vector<std::byte> EncodeHelloAck(const HelloAck& m);
std::vector<std::byte> EncodeAuth(const Auth& m);
// ProtocolError for a truncated, overlong or trailing-garbage payload, or a
// name over its bound.
Result<Hello> DecodeHello(std::span<const std::byte> payload);
Result<HelloAck> DecodeHelloAck(std::span<const std::byte> payload);
Result<Auth> DecodeAuth(std::span<const std::byte> payload);

// kNonceBytes from OpenSSL's CSPRNG. Internal when it fails (no entropy).
Result<Nonce> RandomNonce();
// A random nonzero 64-bit value: a process's epoch.
Result<uint64_t> RandomEpoch();

// HMAC-SHA256 of `role`'s label and `t` under `secret`. Internal when the
// HMAC provider fails (never a predictable proof).
Result<Proof> ComputeProof(std::span<const std::byte> secret, ProofRole role,
                           const Transcript& t);

// True when `proof` is `role`'s proof of `t` under `secret`, compared in
// constant time (CRYPTO_memcmp). False (fail closed) when HMAC fails.
bool VerifyProof(std::span<const std::byte> secret, ProofRole role,
                 const Transcript& t, const Proof& proof);

// The per-connection session key both sides derive once the proofs check:
// K = HMAC(secret, "tierkv-peer-session-v1" ‖ transcript), so it is bound
// to both nonces and node ids and differs on every connection.
using SessionKey = std::array<std::byte, 32>;
Result<SessionKey> ComputeSessionKey(std::span<const std::byte> secret,
                                     const Transcript& t);

// Every post-handshake request and reply carries a MAC in its AM header:
// HMAC-SHA256(K, direction ‖ am_id ‖ header ‖ body) truncated to
// kMacBytes, where header is the AM header without the MAC and body the
// request payload (requests) or nothing (replies: the head is in the
// header). The direction (who sends: the connection's client or server)
// stops a message being reflected back to its sender. Rendezvous bulk data
// is NOT covered (it is pulled below UCX's AM layer after the header was
// verified); the peer tier checks its per-segment checksums.
inline constexpr size_t kMacBytes = 16;
using MessageMac = std::array<std::byte, kMacBytes>;
enum class MacDirection : uint8_t { kFromClient = 1, kFromServer = 2 };
Result<MessageMac> ComputeMessageMac(const SessionKey& key, MacDirection dir,
                                     unsigned am_id,
                                     std::span<const std::byte> header,
                                     std::span<const std::byte> body);
// Constant-time check; false for a MAC of the wrong size or when HMAC
// fails.
bool VerifyMessageMac(const SessionKey& key, MacDirection dir, unsigned am_id,
                      std::span<const std::byte> header,
                      std::span<const std::byte> body,
                      std::span<const std::byte> mac);

}  // namespace tierkv::transport::peer
