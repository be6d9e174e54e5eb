// UdsChannel: the client side of the frame protocol over a Unix socket.
//
// Blocking request/response: Call() sends one frame and waits for its reply
// (a receive timeout bounds the wait). Not thread-safe: the owner (the
// Client) serializes calls.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tierkv/status.h"
#include "transport/frame.h"

namespace tierkv::transport {

struct ChannelReply {
  std::vector<std::byte> payload;
  int fd = -1;  // a descriptor that came with the reply; owned by the caller
};

class UdsChannel {
 public:
  // Unavailable when nothing listens at `path`.
  static Result<std::unique_ptr<UdsChannel>> Connect(
      const std::string& path, std::chrono::milliseconds timeout,
      uint64_t max_payload_bytes = kDefaultMaxPayloadBytes);
  ~UdsChannel();

  UdsChannel(const UdsChannel&) = delete;
  UdsChannel& operator=(const UdsChannel&) = delete;

  // Sends `payload` as a request with `opcode` and returns the response
  // payload. When the daemon answers with an error frame, its Status is
  // returned. IOError/Unavailable on socket failures, ProtocolError or
  // Corruption on malformed replies; after such a failure the channel is
  // broken and every later call fails.
  Result<ChannelReply> Call(uint16_t opcode,
                            std::span<const std::byte> payload);

  // The two halves of Call(), for pipelining: Send() returns the request id
  // that Receive() then waits for. Replies arrive in request order, so
  // requests must be received in the order they were sent.
  Result<uint64_t> Send(uint16_t opcode, std::span<const std::byte> payload);
  // With `spin`, polls for up to kSpinBeforeBlocking before sleeping: for
  // pipelined callers whose reply is due any moment (a sleep/wake-up cycle
  // costs tens of microseconds on a VM). Plain calls never spin.
  Result<ChannelReply> Receive(uint64_t request_id, uint16_t opcode,
                               bool spin = false);

  // Sends raw bytes, bypassing framing (for protocol robustness tests).
  Status TEST_SendRaw(std::span<const std::byte> bytes);
  // Reads one raw reply frame (for protocol robustness tests).
  Result<ChannelReply> TEST_ReadReply(uint16_t* opcode);

  int fd() const { return fd_; }

 private:
  UdsChannel(int fd, uint64_t max_payload)
      : fd_(fd), max_payload_(max_payload) {}
  Result<ChannelReply> ReadReply(uint64_t request_id, uint16_t expect_opcode,
                                 uint16_t* opcode_out, bool spin = false);
  void SpinUntilReadable() const;

  static constexpr std::chrono::microseconds kSpinBeforeBlocking{50};

  int fd_;
  const uint64_t max_payload_;
  uint64_t next_request_id_ = 1;
  Status broken_;
};

}  // namespace tierkv::transport
