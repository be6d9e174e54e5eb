// PeerTransport: authenticated request/reply between tierkvd daemons over
// UCX active messages (UCP AM), with rendezvous bulk data that lands where
// the requester chooses (scaleout.md §5, §8a, §8b, §8e). No tier logic:
// opcodes and payloads belong to the owner (the peer tier).
//
// One progress thread owns the UCP worker. It sleeps in epoll on the
// worker's event fd (ucp_worker_get_efd + ucp_worker_arm) and an eventfd
// that other threads use to hand it commands, so an idle transport costs no
// CPU. Every public method only queues a command and returns.
//
// Connections are made on first use of an address and authenticated with
// the cluster secret (peer_handshake.h) before any request is sent or
// served. Authentication is tied to every later message, not to the UCX
// endpoint a message arrives on (UCX identifies that from an endpoint id the
// sender writes): both sides derive a per-connection session key from the
// handshake transcript, and every request and reply carries a MAC under it
// (peer_handshake.h, ComputeMessageMac) that is checked, in constant time,
// before anything in the message is trusted; one without a valid MAC counts
// as malformed and is not answered. Call ids are random. Rendezvous bulk
// data is not MACed (UCX pulls it below the AM layer after the MACed header
// was accepted); the peer tier verifies its per-segment checksums. Replays
// on a live connection are not detected here.
//
// UCX receives and reassembles an eager AM in full before any handler runs,
// so an unauthenticated party that reaches the UCX interface can make this
// process buffer up to UCX's own limits: bind listen_address to trusted
// interfaces only.
//
// Endpoints use UCP_ERR_HANDLING_MODE_PEER, so a dead peer (its connection
// broken) fails its outstanding calls at once instead of hanging them; a
// hung one is closed after its calls' deadlines (see ucx_settings); a
// connection that failed is retried on a later call after a back-off.
//
// Thread safety: every method may be called from any thread, except that
// callbacks (RequestHandler, ReplyReceiver, on_sent) run on the progress
// thread and must not block on the transport (e.g. CallAndWait) or for
// long. The transport owns its UCX context, worker, listener and endpoints.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tierkv/status.h"

namespace tierkv::transport::peer {

class Core;  // peer_transport.cc

struct PeerTransportOptions {
  // UCX sockaddr listener, "IPv4:port" or "[IPv6]:port". Port 0 picks a
  // free port (see PeerTransport::listen_address()). Default: loopback, so
  // that a daemon is not reachable from other hosts until configured.
  std::string listen_address = "127.0.0.1:0";
  // Peers must agree on it; it is part of the handshake transcript.
  // REQUIRES: 1..255 bytes. Default: "tierkv".
  std::string cluster_name = "tierkv";
  // This node's stable id, told to peers. REQUIRES: 1..255 bytes.
  std::string node_id;
  // The key of the mutual HMAC handshake, the same on every node
  // (ReadClusterSecretFile). REQUIRES: >= 32 bytes.
  std::vector<std::byte> cluster_secret;
  // Deadline of a call that names none (CallAndWait's default).
  // Default: 2 s (scaleout.md §8e fetch_deadline_ms).
  std::chrono::milliseconds default_deadline{2000};
  // An endpoint that has not completed the handshake this long after it was
  // created is closed (both sides). Default: 5 s.
  std::chrono::milliseconds handshake_timeout{5000};
  // Largest request payload sent or accepted. Requests go eagerly.
  // Default: 1 MiB.
  uint64_t max_request_bytes = uint64_t{1} << 20;
  // Largest reply head (the small, checksummed part of a reply that
  // precedes its bulk data). Must fit UCX's AM header bound with the
  // 32-byte frame; Open checks. Default: 4 KiB.
  uint64_t max_reply_head_bytes = 4096;
  // Largest bulk data of one reply, sent or accepted. Default: 1 GiB.
  uint64_t max_reply_data_bytes = uint64_t{1} << 30;
  // Replies with at least this much bulk data use rendezvous
  // (UCP_AM_SEND_FLAG_RNDV: the requester pulls the bytes into its chosen
  // buffers, zero copy); smaller ones go eagerly and are copied once.
  // Over TCP a rendezvous costs more round trips and progress-thread
  // wake-ups than the copy it saves below a few hundred KiB: a 64 KiB
  // fetch took p50 143-277 us by rendezvous and 69-133 us eagerly on the
  // test VM (bench/RESULTS.md, "peer"). Default: 256 KiB.
  uint64_t rendezvous_threshold_bytes = uint64_t{256} << 10;
  // A rendezvous reply of several pieces (PeerResponder::ReplyWithData) is
  // copied into one buffer and sent as contiguous data while the replies so
  // gathered and not yet sent hold at most this many bytes; past it the
  // pieces go as a UCX IOV, no copy and no memory. UCX 1.13 sends an IOV
  // through its own bounce buffers and contiguous data zero-copy: over TCP
  // 64 x 64 KiB replies went at 0.70-1.22 GB/s as an IOV and 1.38-2.59
  // GB/s gathered on the test VM (bench/RESULTS.md, "peer: multi-piece
  // replies gathered"). Zero: never gather. Default: 64 MiB.
  uint64_t reply_gather_budget_bytes = uint64_t{64} << 20;
  // While a send or a rendezvous receive is in flight, the progress thread
  // keeps polling UCX for up to this long after its last event before it
  // sleeps; idle, it never polls. Over TCP a transfer is a stream of
  // socket events, and a sleep plus wake-up per event cost more CPU than
  // the kernel's copies: 1 MiB fetches went from 0.62-0.78x to 0.91-1.33x
  // an event-driven ucx_perftest with 30-60 us on the test VM, with no
  // change in one small fetch's latency (bench/RESULTS.md, "peer, spin").
  // Zero: sleep as soon as UCX has nothing. Default: 50 us.
  std::chrono::microseconds transfer_spin{50};
  // A call whose rendezvous receive stalls (the peer stopped mid-transfer)
  // completes at most this long after its deadline or its endpoint's
  // failure. UCX 1.13 cannot cancel an AM rendezvous receive, so the
  // endpoint is force-closed first (cutting the path its data takes) and
  // the receive is then abandoned: the transport keeps its reference to the
  // call's ReplyReceiver until UCX completes the receive or the transport
  // shuts down, since UCX may still write into the spans OnReplyHead
  // returned. A receiver must therefore keep those buffers alive as long as
  // it lives (not merely until OnComplete), as CallAndWait's does.
  // Default: 50 ms.
  std::chrono::milliseconds stalled_receive_grace{50};
  // Malformed messages tolerated from one authenticated endpoint; the next
  // one closes it. Each is answered with an error reply when its request id
  // could be read. Default: 3 (scaleout.md §8b).
  uint32_t max_malformed_messages = 3;
  // Requests from one connection handed to the handler and not answered
  // yet (live PeerResponders); beyond it a request is answered Busy at once
  // without reaching the handler, so one peer cannot make this node hold
  // unbounded work. Default: 256.
  uint32_t max_outstanding_requests_per_connection = 256;
  // Incoming endpoints still in the handshake; further connection requests
  // are rejected until some finish or time out. Default: 64.
  uint32_t max_unauthenticated_connections = 64;
  // After a connection to an address fails, calls to it fail at once
  // (Unavailable) for this long; it doubles on each further failure up to
  // the maximum, and resets on a successful handshake. Default: 1 s, 30 s.
  std::chrono::milliseconds reconnect_backoff_min{1000};
  std::chrono::milliseconds reconnect_backoff_max{30000};
  // UCX configuration overrides (ucp_config_modify: names without the
  // "UCX_" prefix), applied over the environment's UCX_* variables. Tests
  // pass {"TLS", "tcp"} (scaleout.md §5d). Default: a 2 s keepalive, which
  // fails the endpoint of a peer whose host is gone (partitioned, powered
  // off) once the transport gives up; it does not notice a hung process
  // whose kernel still acks (SIGSTOP, a wedged progress thread). That is
  // what deadlines are for: a call whose request never left by its deadline,
  // or 2 call deadlines in a row with no message from the peer, force-close
  // the connection, so that the back-off fails later calls at once.
  // Only UCP-level settings apply here: transport-level ones such as
  // TCP_CM_REUSEADDR are read from the environment (UCX_TCP_CM_REUSEADDR).
  std::vector<std::pair<std::string, std::string>> ucx_settings = {
      {"KEEPALIVE_INTERVAL", "2s"}};

  // InvalidArgument naming the first field that breaks its REQUIRES.
  Status Validate() const;
};

// Counters, a snapshot (PeerTransport::counters()). Monotonic except
// live_connections.
struct PeerTransportCounters {
  uint64_t requests_sent = 0;     // calls whose request was sent
  uint64_t requests_served = 0;   // requests handed to the handler
  uint64_t replies_received = 0;  // calls completed OK
  uint64_t bytes_sent = 0;        // request payloads + reply heads + data
  uint64_t bytes_received = 0;    // the same, received
  uint64_t reply_data_bytes_served = 0;  // bulk data sent in replies
  uint64_t errors_timeout = 0;           // calls past their deadline
  uint64_t errors_reset = 0;      // calls failed by an endpoint error/close
  uint64_t errors_auth = 0;       // handshakes refused (wrong proof, wrong
                                  // cluster, traffic before AUTH, timeout,
                                  // too many unauthenticated endpoints)
  uint64_t errors_malformed = 0;  // messages that failed decoding
  // Rendezvous receives given up after stalled_receive_grace (UCX could not
  // end them); each one's endpoint had been force-closed.
  uint64_t abandoned_receives = 0;
  uint64_t connections_opened = 0;  // handshakes completed
  uint64_t live_connections = 0;    // authenticated endpoints now
  // Replies whose pieces were gathered into one buffer to be sent
  // (reply_gather_budget_bytes).
  uint64_t replies_gathered = 0;
};

// One incoming request, as the handler sees it. Valid during the call only.
struct PeerRequest {
  std::string_view peer_node_id;  // authenticated by the handshake
  uint16_t opcode = 0;
  std::span<const std::byte> payload;
};

// Answers one incoming request, once, from any thread. Destroying it
// unanswered sends an Internal error reply, so a requester never waits for
// an answer that will not come. Move-only. May outlive the transport (its
// reply is then dropped and on_sent hears Shutdown).
class PeerResponder {
 public:
  PeerResponder() = default;
  PeerResponder(std::weak_ptr<Core> core, uint64_t connection_id,
                uint16_t opcode, uint64_t request_id);
  PeerResponder(PeerResponder&& other) noexcept;
  PeerResponder& operator=(PeerResponder&& other) noexcept;
  PeerResponder(const PeerResponder&) = delete;
  PeerResponder& operator=(const PeerResponder&) = delete;
  ~PeerResponder();

  // A reply without bulk data. REQUIRES: not answered yet;
  // head.size() <= max_reply_head_bytes (else the requester gets an
  // Internal error).
  void Reply(std::vector<std::byte> head);

  // A reply whose bulk data is `data`, in order: sent straight from the
  // caller's memory (rendezvous when large: no copy), except that several
  // pieces of a rendezvous-sized reply are first copied into one buffer on
  // this thread, within reply_gather_budget_bytes. The spans must stay
  // valid and unchanged until `on_sent` runs (on the progress thread) with
  // OK when the requester has the bytes, or the error that ended the send
  // (then the bytes may have been read partly or not at all); it runs
  // exactly once, also when the transport shuts down. This is when the
  // owner releases its leases.
  // REQUIRES: not answered yet; total size <= max_reply_data_bytes.
  void ReplyWithData(std::vector<std::byte> head,
                     std::vector<std::span<const std::byte>> data,
                     std::function<void(Status)> on_sent);

  // An error reply: the requester's call completes with `status`.
  // REQUIRES: !status.ok(); not answered yet.
  void ReplyError(const Status& status);

  bool answered() const { return core_.expired() || answered_; }

 private:
  std::weak_ptr<Core> core_;
  uint64_t connection_id_ = 0;
  uint16_t opcode_ = 0;
  uint64_t request_id_ = 0;
  bool answered_ = true;  // a default-constructed one has nothing to answer
};

// Handles incoming requests on the progress thread: it must not block; slow
// work keeps the responder and answers later from another thread.
using RequestHandler = std::function<void(const PeerRequest&, PeerResponder)>;

// What a caller is told about its call's reply. Callbacks run on the
// progress thread, in this order: OnReplyHead at most once, then
// OnComplete exactly once (also on timeout, error or shutdown).
class ReplyReceiver {
 public:
  virtual ~ReplyReceiver() = default;
  // The reply's head arrived, announcing `data_bytes` bytes of bulk data.
  // Returns where they land: spans whose sizes sum to exactly `data_bytes`
  // (none when 0), valid and untouched by others until OnComplete (and
  // not reused while this receiver lives, when OnComplete reports an
  // error: see stalled_receive_grace); or an error, which drops the data
  // and completes the call with that error.
  // Not called for error replies.
  virtual Result<std::vector<std::span<std::byte>>> OnReplyHead(
      std::span<const std::byte> head, uint64_t data_bytes) = 0;
  // OK once every byte has landed; otherwise: the peer's error reply;
  // Busy for a deadline that passed ("deadline exceeded"); Unavailable when
  // the connection failed or is backing off; PermissionDenied when the
  // peer failed the handshake; Shutdown when the transport closed.
  virtual void OnComplete(Status status) = 0;
};

// A reply gathered into memory (CallAndWait).
struct PeerReply {
  std::vector<std::byte> head;
  std::vector<std::byte> data;
};

class PeerTransport {
 public:
  // Starts the UCX context, worker, listener and progress thread.
  // InvalidArgument for bad options; IOError when UCX cannot start or
  // listen (the message names the UCX status). `handler` may be empty: then
  // requests are answered with an Unavailable error.
  static Result<std::unique_ptr<PeerTransport>> Open(
      const PeerTransportOptions& options, RequestHandler handler);

  // Closes every endpoint, completes every outstanding call with Shutdown
  // and every pending reply send's on_sent with Shutdown, then stops.
  ~PeerTransport();
  // What the destructor does, now: for an owner whose buffers (the spans
  // of receives and reply sends) go away before the transport object does.
  // Afterwards UCX touches no memory of the owner's, every Call completes
  // at once with Shutdown (on the calling thread), and every reply is
  // dropped (its on_sent hears Shutdown). Idempotent.
  void Shutdown();
  PeerTransport(const PeerTransport&) = delete;
  PeerTransport& operator=(const PeerTransport&) = delete;

  // The bound listener address, "ip:port" (the real port when the option
  // said 0): what the directory should publish.
  const std::string& listen_address() const { return listen_address_; }
  const std::string& node_id() const;

  // Sends request `opcode` with `payload` to the peer listening at
  // `address` (connecting and authenticating first if needed) and reports
  // the reply to `receiver`, at the latest at `deadline` (plus
  // stalled_receive_grace when its data stalled mid-transfer). Errors are
  // reported through receiver->OnComplete, never here (InvalidArgument for
  // an opcode >= 0x7FFF, whose reply opcode would be kErrorOpcode, or an
  // oversized payload); only when the transport is already shutting down does
  // OnComplete run on the calling thread, before Call returns.
  void Call(std::string_view address, uint16_t opcode,
            std::vector<std::byte> payload,
            std::chrono::steady_clock::time_point deadline,
            std::shared_ptr<ReplyReceiver> receiver);

  // Call that waits, gathering the reply into memory; `timeout` 0 means
  // options.default_deadline. The Status is what OnComplete would get.
  // REQUIRES: not called from a transport callback.
  Result<PeerReply> CallAndWait(
      std::string_view address, uint16_t opcode, std::vector<std::byte> payload,
      std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

  // Forgets `address`'s connection (closing it) and its back-off; the next
  // call reconnects at once. Outstanding calls on it fail with Unavailable.
  void Disconnect(std::string_view address);

  PeerTransportCounters counters() const;

  // Sends an arbitrary AM (`header`, `data`) on the connection to `address`,
  // making it (HELLO sent, not yet authenticated) if there is none, without
  // waiting for the handshake. With `sign`, the connection's message MAC is
  // appended to `header` (as for a real request or reply). Lets tests play
  // a hostile or buggy peer.
  void TEST_SendRaw(std::string_view address, unsigned am_id,
                    std::vector<std::byte> header, std::vector<std::byte> data,
                    bool sign = false);

 private:
  PeerTransport(std::shared_ptr<Core> core, std::string listen_address);

  std::shared_ptr<Core> core_;
  std::string listen_address_;
};

}  // namespace tierkv::transport::peer
