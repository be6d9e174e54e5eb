// InFlightBudget: the bytes that all connections of a server together may
// hold in request payloads being received and in replies waiting to be
// written (UdsServerOptions::max_in_flight_bytes).
//
// Per connection, those bytes are bounded already (one payload of at most
// max_payload_bytes, max_queued_reply_bytes of replies); this bounds their
// sum, which is otherwise connections x (16 + 8) MiB. How the server uses
// it, and why it cannot deadlock:
//   - a request payload above the free allowance is charged whole, before
//     its bytes are read (ChargeOrWait: all or nothing). A connection whose
//     charge fails reads nothing more until woken; it holds no budget
//     while it waits;
//   - replies are charged as they are queued (Charge: never refused, the
//     handler's work is done already). A connection with unsent replies is
//     not read while the budget is exhausted; it resumes once its own
//     client has read them, which needs no budget;
//   - so budget is held only by connections that are receiving a charged
//     payload or sending replies, both of which finish without more budget
//     (or are closed by the server's stall timeout when their client stops).
//
// Thread safety: thread-safe. Wake-ups run on the releasing thread, outside
// the lock, in the order the waiters registered.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace tierkv::transport {

class InFlightBudget {
 public:
  // REQUIRES: limit > 0.
  explicit InFlightBudget(uint64_t limit) : limit_(limit) {}

  InFlightBudget(const InFlightBudget&) = delete;
  InFlightBudget& operator=(const InFlightBudget&) = delete;

  // Charges `bytes` and returns true if they fit under the limit.
  // Otherwise charges nothing, arranges for `wake` to be called once at the
  // next Release (when the caller retries), and returns false. A charge
  // larger than the whole limit fits only into an empty budget, so no
  // request of a size the server accepts waits forever.
  bool ChargeOrWait(uint64_t bytes, std::function<void()> wake) EXCLUDES(mu_);
  // Charges `bytes` even past the limit.
  void Charge(uint64_t bytes) EXCLUDES(mu_);
  // Returns `bytes` charged earlier and wakes every waiter.
  void Release(uint64_t bytes) EXCLUDES(mu_);

  // The charge is at or past the limit.
  // Lock-free reads (relaxed: a hint for whether to read more, which the
  // next Release corrects).
  bool exhausted() const {
    return charged_.load(std::memory_order_relaxed) >= limit_;
  }
  uint64_t charged() const { return charged_.load(std::memory_order_relaxed); }
  uint64_t limit() const { return limit_; }
  // Destroys every pending wake-up without calling it (a stopping server).
  void DropWaiters() EXCLUDES(mu_);
  // Callers waiting for a Release now.
  size_t waiters() const EXCLUDES(mu_);

 private:
  const uint64_t limit_;
  mutable Mutex mu_;
  // Written under mu_ only; read without it.
  std::atomic<uint64_t> charged_{0};
  std::deque<std::function<void()>> waiters_ GUARDED_BY(mu_);
};

}  // namespace tierkv::transport
