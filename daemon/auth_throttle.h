// AuthThrottle: answers refusals late. Refused OpenNamespace requests are
// answered late and hung up after, so guessing a namespace token costs a
// new connection and `delay` per guess. With at most
// max_unauthenticated_connections open at once (UdsServerOptions), that bounds
// guesses to cap / delay per second (64 / 200 ms = 320/s by default) instead of
// the ~20,000/s one connection managed without it. Legitimate clients are not
// slowed: only refusals wait. The daemon keeps a second one for requests
// refused for a resource limit (a Get whose every segment hit a lease limit),
// without the hang-up: a client that keeps asking past its limit then waits
// instead of spinning the daemon's IO threads (tierkv-bench flood).
//
// Thread safety: Refuse() may be called from any thread.
#pragma once

#include <chrono>
#include <deque>
#include <thread>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "transport/uds_server.h"

namespace tierkv::daemon {

class AuthThrottle {
 public:
  // delay 0 answers at once (still hanging up).
  explicit AuthThrottle(std::chrono::milliseconds delay);
  ~AuthThrottle();  // answers everything still waiting, at once

  AuthThrottle(const AuthThrottle&) = delete;
  AuthThrottle& operator=(const AuthThrottle&) = delete;

  // Sends `reply` through `responder` after the delay, then (hang_up)
  // closes the connection. When kMaxWaiting refusals already wait, this
  // one is answered at once (memory stays bounded).
  void Refuse(transport::Responder responder, transport::HandlerReply reply,
              bool hang_up = true) EXCLUDES(mu_);

  static constexpr size_t kMaxWaiting = 4096;

 private:
  using Clock = std::chrono::steady_clock;
  struct Waiting {
    Clock::time_point due;
    transport::Responder responder;
    transport::HandlerReply reply;
  };
  void Run() EXCLUDES(mu_);

  const std::chrono::milliseconds delay_;
  Mutex mu_;
  CondVar cv_;
  // Due times are in order: every refusal waits the same delay.
  std::deque<Waiting> waiting_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the fields above exist
};

}  // namespace tierkv::daemon
