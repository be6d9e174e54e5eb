// UdsChannel: the client side of the frame protocol over a Unix socket.
//
// Multiplexed: any number of threads may Send() requests and Receive()
// their replies concurrently; the daemon answers in completion order and
// replies are matched by request id. Receiving is leader/follower: one
// waiting thread reads the socket at a time and hands each reply to the
// thread waiting for it (no reader thread, and the common case of one
// waiter reads its own reply without a hand-off). A receive timeout bounds
// every wait.
//
// Thread safety: thread-safe. The TEST_ methods must not overlap others.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
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
  // that Receive() then waits for, in any order. `fd_to_send` (borrowed;
  // -1 for none) travels with the request (SCM_RIGHTS). Every sent request
  // must be received once (its reply is kept until then).
  Result<uint64_t> Send(uint16_t opcode, std::span<const std::byte> payload,
                        int fd_to_send = -1) EXCLUDES(send_mu_);
  // With `spin`, polls for up to kSpinBeforeBlocking before sleeping: for
  // callers whose reply is due any moment (pipelined sub-batches, Match),
  // since a sleep/wake-up cycle costs ~10 us on a VM. Call() never spins.
  Result<ChannelReply> Receive(uint64_t request_id, uint16_t opcode,
                               bool spin = false) EXCLUDES(mu_);

  // Sends raw bytes, bypassing framing (for protocol robustness tests).
  Status TEST_SendRaw(std::span<const std::byte> bytes);
  // Reads one raw reply frame (for protocol robustness tests).
  Result<ChannelReply> TEST_ReadReply(uint16_t* opcode);

  int fd() const { return fd_; }

 private:
  // One reply as read off the socket.
  struct Arrived {
    uint16_t opcode = 0;
    uint64_t request_id = 0;
    Result<ChannelReply> reply = Status::Internal("unset");
  };

  UdsChannel(int fd, uint64_t max_payload)
      : fd_(fd), max_payload_(max_payload) {}
  // Reads one frame. An error frame is an Arrived whose reply is its
  // Status; a failure to read or parse is returned as a Status.
  Result<Arrived> ReadFrame();
  Status SendAll(std::span<const std::byte> header,
                 std::span<const std::byte> payload) REQUIRES(send_mu_);
  void SpinUntilReadable() const;

  static constexpr std::chrono::microseconds kSpinBeforeBlocking{50};

  const int fd_;
  const uint64_t max_payload_;
  std::atomic<uint64_t> next_request_id_{1};

  Mutex send_mu_;  // one request's bytes at a time on the socket

  Mutex mu_;
  CondVar arrived_cv_;
  // Replies read by the leader for other waiters, by request id.
  std::unordered_map<uint64_t, Arrived> arrived_ GUARDED_BY(mu_);
  bool reading_ GUARDED_BY(mu_) = false;  // a leader is reading the socket
  Status broken_ GUARDED_BY(mu_);         // every later call fails with it
};

}  // namespace tierkv::transport
