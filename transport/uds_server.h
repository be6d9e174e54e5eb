// UdsServer: the daemon's Unix-domain-socket front end (Boost.Asio).
//
// Reads frames (frame.h), hands each valid one to a FrameHandler and writes
// the handler's reply, optionally with a file descriptor (SCM_RIGHTS); a
// descriptor a client attaches to a request reaches the handler too. The
// handler answers through a Responder, at once or later from another thread
// (the daemon replies from its workers after NVMe IO), so an IO thread never
// waits for slow work.
//
// Multiplexed: a connection keeps reading while earlier requests are being
// handled, up to Options::max_requests_in_flight per connection, and
// replies go out in completion order, each carrying its request id (the
// client matches them). OnFrame calls of one connection never overlap (they
// run on the connection's strand), but their replies may come later and in
// any order. OnDisconnect runs once, after the peer is gone and every
// request of that connection has been answered, so a handler may keep
// per-request state until then.
// Different connections run in parallel on `io_threads` threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tierkv/status.h"

namespace tierkv::transport {

struct HandlerReply {
  std::vector<std::byte> payload;
  int fd = -1;  // sent with the reply when >= 0; borrowed, not closed
  // Send `payload` (an EncodeError() Status) as a kErrorOpcode frame, e.g.
  // for an unknown opcode or an undecodable request.
  bool is_error = false;
  // Send nothing back (one-way requests such as an asynchronous release).
  bool no_reply = false;
  // The connection has authenticated (e.g. opened a namespace with its
  // token): from now on it counts against max_connections only, not
  // against the unauthenticated cap, and the handshake timeout no longer
  // applies.
  bool admit = false;
  // Hang up once this reply is written (e.g. a refused handshake).
  bool close_after = false;
  // The client will shortly send a request that completes this one (the
  // commit of a reserved Put, the release of a read lease): the connection's
  // IO thread keeps polling for up to UdsServerOptions::poll_for_followup
  // instead of sleeping, so that request is neither delayed by a wake-up
  // nor makes its sender pay for one.
  bool expect_followup = false;
};

// Sends the reply to one request, once, from any thread. A Responder that
// is destroyed without Send() replies with an Internal error, so a client
// never waits for an answer that will not come. Move-only.
class Responder {
 public:
  // The connection side; implemented in uds_server.cc.
  class Target {
   public:
    virtual ~Target() = default;
    virtual void Deliver(uint16_t opcode, uint64_t request_id,
                         HandlerReply reply) = 0;
  };

  // Told when a request is answered (e.g. to time it). Must be thread-safe:
  // replies are sent from any thread.
  class Observer {
   public:
    virtual ~Observer() = default;
    virtual void OnReply(uint16_t opcode, bool is_error,
                         std::chrono::steady_clock::time_point received) = 0;
  };

  Responder() = default;
  Responder(std::shared_ptr<Target> target, uint16_t opcode,
            uint64_t request_id)
      : target_(std::move(target)), opcode_(opcode), request_id_(request_id) {}
  Responder(Responder&&) noexcept = default;
  Responder& operator=(Responder&&) noexcept;
  ~Responder();

  // Sends `reply` (opcode | kResponseBit, or an error frame when
  // reply.is_error). REQUIRES: not sent before.
  void Send(HandlerReply reply);

  // `observer` (borrowed; it must outlive the reply) hears of the reply to
  // this request, received at `received`.
  void Observe(Observer* observer,
               std::chrono::steady_clock::time_point received) {
    observer_ = observer;
    received_ = received;
  }

 private:
  std::shared_ptr<Target> target_;
  uint16_t opcode_ = 0;
  uint64_t request_id_ = 0;
  Observer* observer_ = nullptr;
  std::chrono::steady_clock::time_point received_;
};

// Implemented by the daemon. Must be thread-safe across connections.
class FrameHandler {
 public:
  virtual ~FrameHandler() = default;
  virtual void OnConnect(uint64_t connection_id) { (void)connection_id; }
  // Handles one request and answers it through `responder`, now or later.
  // `payload` is valid only during the call. `fd` is a descriptor the client
  // attached to the request (-1 if none); the server closes it when OnFrame
  // returns, so a handler that keeps it must dup() it.
  virtual void OnFrame(uint64_t connection_id, uint16_t opcode,
                       std::span<const std::byte> payload, int fd,
                       Responder responder) = 0;
  virtual void OnDisconnect(uint64_t connection_id) { (void)connection_id; }
};

struct UdsServerOptions {
  std::string path;  // REQUIRES: non-empty; a stale socket file is replaced
  // Permission bits of the socket file. Default: 0660 (owner and group).
  uint32_t mode = 0660;
  // Group owning the socket file; empty keeps the daemon's group.
  std::string group;
  // Largest accepted request payload. A payload's buffer grows as its
  // bytes arrive (at most twice what arrived, or 4 KiB), so announcing
  // a large payload costs nothing until it is sent. Default: 16 MiB.
  uint64_t max_payload_bytes = uint64_t{16} << 20;
  uint32_t io_threads = 2;  // Default: 2
  // Admitted (authenticated) connections; further ones are closed at
  // accept. Default: 1024.
  uint32_t max_connections = 1024;
  // Connections not yet admitted (see HandlerReply::admit). When a new one
  // would exceed this, the OLDEST unadmitted connection is closed to make
  // room, so idle or slow unauthenticated sockets can never lock a real
  // client out: it only has to finish its handshake before this many newer
  // connections arrive. Default: 64.
  uint32_t max_unauthenticated_connections = 64;
  // An unadmitted connection is closed this long after it was accepted.
  // Default: 10 s.
  std::chrono::milliseconds handshake_timeout{10000};
  // An admitted connection with no request in flight and none arriving
  // for this long is closed; 0 disables (engines keep idle connections
  // open between requests). Default: 0.
  std::chrono::milliseconds idle_timeout{0};
  // Requests of one connection being handled at once; the connection is
  // not read further until one completes (bounds memory per connection to
  // about max_payload_bytes plus this many replies). Default: 64.
  uint32_t max_requests_in_flight = 64;
  // Reply bytes of one connection waiting to be written; past this the
  // connection is not read until its client reads (bounds what a client
  // that sends without reading can make the daemon hold). Default: 8 MiB.
  uint64_t max_queued_reply_bytes = uint64_t{8} << 20;
  // Request payload and reply bytes that all connections together may hold
  // (transport/in_flight_budget.h). A request payload larger than
  // in_flight_allowance_bytes is read only once the whole of it fits in
  // the budget (the connection waits, holding nothing, until it does); a
  // connection with more than that many reply bytes unsent is not read
  // while the budget is spent. REQUIRES: >= max_payload_bytes.
  // Default: 256 MiB.
  uint64_t max_in_flight_bytes = uint64_t{256} << 20;
  // Per connection, a request payload and unsent replies up to this size
  // are not charged to max_in_flight_bytes, so small control requests
  // never wait for it (1,024 connections hold at most 64 MiB that way).
  // Default: 64 KiB.
  uint64_t in_flight_allowance_bytes = uint64_t{64} << 10;
  // Largest request payload a connection may send before it is admitted;
  // a larger one is answered InvalidArgument and the connection closed, so
  // unauthenticated peers cannot take the in-flight budget. Default: 64 KiB.
  uint64_t max_unauthenticated_payload_bytes = uint64_t{64} << 10;
  // A connection holding in-flight bytes (a request payload partly
  // received, replies its client has not read) that moves no byte for
  // this long is closed, so a stalled client cannot keep the budget.
  // 0 disables. Default: 30 s.
  std::chrono::milliseconds stall_timeout{30000};
  // After running anything, an IO thread keeps polling its sockets for this
  // long before it sleeps in epoll_wait: a client's next small request
  // (a scheduler's Match after Match) is then picked up without a
  // sleep/wake-up, which costs ~10 us on a VM. Costs CPU only while
  // requests keep arriving within the window; an idle daemon sleeps.
  // 0 disables. Default: 50 us.
  std::chrono::microseconds poll_after_work{50};
  // After a reply marked HandlerReply::expect_followup, the IO thread polls
  // at least this long for the request that completes it. A Put's commit
  // follows its reservation by the client's copy into the arena (~100 us
  // per 2 MiB sub-batch at memory speed), and on a VM each wake-up on the
  // way costs the sender ~10 us and the reply as much again: waking for
  // the commit and the next reservation made a 72 KiB Put 0.76x memcpy
  // instead of 0.86x (bench/RESULTS.md). Costs one core per IO thread
  // only while such a transaction is open, for at most this long. 0
  // disables. Default: 500 us.
  std::chrono::microseconds poll_for_followup{500};
};

class UdsServer {
 public:
  // Binds and listens; IOError when the path cannot be bound or chmod'ed,
  // InvalidArgument for a bad group. `handler` is borrowed and must outlive
  // the server.
  static Result<std::unique_ptr<UdsServer>> Start(const UdsServerOptions& o,
                                                  FrameHandler* handler);
  ~UdsServer();  // Stop()s

  // Closes the listener and every connection, joins the io threads and
  // removes the socket file. Idempotent.
  void Stop();

  size_t connection_count() const;
  // Connections accepted but not admitted yet.
  size_t unauthenticated_count() const;
  // Bytes charged to max_in_flight_bytes now, and connections waiting for
  // room in it.
  uint64_t in_flight_bytes() const;
  size_t in_flight_waiters() const;

  class Impl;  // defined in uds_server.cc

 private:
  explicit UdsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tierkv::transport
