// PeerServeStall: a test-only fault injection that holds the FETCH requests
// a holder would answer, from its n-th on, until a test releases them
// through a FIFO, so that a test can kill the holder (SIGKILL) while a
// peer's fetch from it is in flight, at a point the test chose
// (scaleout.md §8(e), §9.3, §9.5). Like LayerStall (daemon/layer_stall.h)
// it exists only in builds with sync points (TIERKV_SYNC_POINTS): a release
// tierkvd neither reads the variable nor has this code.
//
//   TIERKV_TEST_STALL_PEER_SERVE=<n>:<fifo path>
//
// FETCHes 1 .. n-1 are served as usual. The n-th, and every request after
// it until the release, is held: its responder kept, nothing read from the
// engine. The transport's progress thread is never blocked (it goes on with
// handshakes, keepalives and other connections), so a requester sees
// exactly what a slow holder would show it: no reply until its deadline,
// or an endpoint error the moment the holder dies.
//
// On holding the n-th FETCH, the stall opens the FIFO for reading
// (O_NONBLOCK). A test that opens the FIFO O_WRONLY (which blocks until a
// reader is there) therefore returns from open() exactly when a FETCH is
// held: the event to kill the holder on, without sleeps. The held requests
// are served, in order, on the stall's own thread once the FIFO is
// released: a byte written to it, or every writer closed after one had
// opened it (EOF: a test that fails or dies releases the holder). Requests
// arriving while those are served queue behind them; once they are out,
// requests pass straight through again.
//
// Shutdown never waits for the FIFO: destroying the stall answers the
// requests still held with Unavailable and joins its thread.
//
// Never set in production: the stall logs a warning when it is armed.
//
// Thread safety: Handle may be called from any thread (the transport's
// progress thread); one owner creates and destroys the stall.
#pragma once

#ifdef TIERKV_SYNC_POINTS

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "tierkv/status.h"
#include "transport/peer/peer_transport.h"

namespace tierkv::daemon::cluster {

inline constexpr const char* kPeerServeStallEnv =
    "TIERKV_TEST_STALL_PEER_SERVE";

struct PeerServeStallSpec {
  uint32_t nth_fetch = 1;  // the first FETCH held, counted from 1
  std::string fifo_path;
};

// Parses `<n>:<fifo path>`. InvalidArgument (naming the variable) for a
// missing colon, an n that is not a number in [1, 2^32), an empty path, or
// a path that is not a FIFO.
Result<PeerServeStallSpec> ParsePeerServeStall(const std::string& value);

// The stall configured in the environment: nullopt when the variable is
// unset, InvalidArgument when ParsePeerServeStall refuses its value.
Result<std::optional<PeerServeStallSpec>> PeerServeStallFromEnvironment();

class PeerServeStall {
 public:
  // `serve` answers a request as the node would without the stall; it is
  // called on Handle's thread for requests passed through, and on the
  // stall's thread for held ones. It must stay callable until the stall is
  // destroyed. IOError when the stop eventfd or the thread cannot be made.
  static Result<std::unique_ptr<PeerServeStall>> Start(
      PeerServeStallSpec spec, transport::peer::RequestHandler serve);
  // Answers every request still held with Unavailable, then joins.
  ~PeerServeStall();
  PeerServeStall(const PeerServeStall&) = delete;
  PeerServeStall& operator=(const PeerServeStall&) = delete;

  // The transport's RequestHandler in front of `serve`: passes the request
  // on, or holds it (copying what `request` views), as the file comment
  // says. Never blocks.
  void Handle(const transport::peer::PeerRequest& request,
              transport::peer::PeerResponder responder) EXCLUDES(mu_);

 private:
  enum class Phase { kCounting, kHolding, kReleased, kStopped };
  struct HeldRequest {
    std::string peer_node_id;
    uint16_t opcode = 0;
    std::vector<std::byte> payload;
    transport::peer::PeerResponder responder;
  };

  PeerServeStall(PeerServeStallSpec spec, transport::peer::RequestHandler serve,
                 int stop_fd);
  // The stall's thread: waits until a request is held, then for the FIFO
  // (or the stop eventfd), then serves what is held.
  void Run() EXCLUDES(mu_);
  // Waits for the FIFO's release; false when stopped first.
  bool AwaitRelease();
  void Serve(HeldRequest& held);

  const PeerServeStallSpec spec_;
  const transport::peer::RequestHandler serve_;
  const int stop_fd_;  // eventfd: written once by the destructor

  Mutex mu_;
  CondVar cv_;  // phase_ left kCounting
  Phase phase_ GUARDED_BY(mu_) = Phase::kCounting;
  uint32_t fetches_ GUARDED_BY(mu_) = 0;
  std::deque<HeldRequest> held_ GUARDED_BY(mu_);

  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace tierkv::daemon::cluster

#endif  // TIERKV_SYNC_POINTS
