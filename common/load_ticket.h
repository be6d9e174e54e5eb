// LoadTicket: the shared-memory completion record of one per-layer Load or
// Store (DESIGN.md §5, registered-pool mode). The client creates a memfd of
// tickets and registers it once; each Load/Store names a ticket, and the
// daemon publishes progress there instead of sending a message per layer:
//
//   layers_done  the number of layers of the request that are complete, in
//                layer order (release-stored by the daemon, then a futex
//                wake on it; the client acquire-loads it and futex-waits);
//   device_layers the same progress for the engine's GPU, whose stream waits
//                on this word (CUDA: cuStreamWaitValue32 GEQ, the ticket
//                being host memory mapped for the device) instead of its
//                host thread on layers_done. A cyclic counter that never
//                goes back (comparisons are CUDA's: (int32_t)(a - b) >= 0),
//                so a wait queued for an earlier use of the ticket can never
//                block on a later one: a transfer starts at the value the
//                previous one left (its base) and the daemon raises it to
//                base + layers as it publishes layers_done; a client that
//                gives up on the transfer (a timeout, a lost daemon) raises
//                it to base + its layer count, so no stream waits for ever;
//   gate, gate_target  an ordered transfer (Client::Load/Store `after`):
//                gate_target is 0 for none; else the daemon starts once
//                gate reaches it (cyclically), written by the engine's
//                stream after the work the slots wait for (CUDA:
//                cuStreamWriteValue32). The client sets gate_target before
//                it sends the request, from a per-ticket sequence of its
//                own (never 0), so a late stream write of an earlier use
//                cannot open a later one's gate. The daemon waits up to its
//                device_copy_timeout;
//   errors       (page, layer, part, status code) of segments that could not
//                be moved after the daemon accepted the request (an NVMe
//                read error, a checksum failure): such a page is a miss for
//                that layer, never stale bytes. Written before layers_done
//                covers their layer.
//   *_ns         when the daemon accepted the request and when its first
//                and its last layer were complete: CLOCK_MONOTONIC
//                nanoseconds (std::chrono::steady_clock on Linux), one clock
//                for every process of the node. Written before the
//                layers_done store that publishes the layer they time, so a
//                client that saw that layer reads them set.
//
// The layout is fixed (both sides compile it from this header) and 4 KiB per
// ticket, so a ticket index names a page-aligned record.
#pragma once

#include <atomic>
#include <cstdint>

namespace tierkv {

struct LoadTicket {
  static constexpr uint32_t kMaxErrors = 500;
  struct Error {
    uint32_t page = 0;  // index into the request's pages
    uint16_t layer = 0;
    uint8_t part = 0;
    uint8_t code = 0;  // a StatusCode
  };

  std::atomic<uint32_t> layers_done{0};  // the futex word
  std::atomic<uint32_t> error_count{0};  // may exceed kMaxErrors (overflow)
  // 1 once the daemon is done with the ticket (a futex word too).
  std::atomic<uint32_t> finished{0};
  std::atomic<uint32_t> gate{0};
  // Stamps (CLOCK_MONOTONIC ns), published by the release store of
  // layers_done. Atomic (relaxed) although that order suffices: the daemon
  // rewrites them when a client reuses the ticket, and the client and the
  // daemon map the ticket at different addresses, which a race detector
  // cannot see through (a plain field was a ThreadSanitizer report).
  std::atomic<uint64_t> accepted_ns{0};
  std::atomic<uint64_t> first_layer_ns{0};
  std::atomic<uint64_t> last_layer_ns{0};
  std::atomic<uint32_t> device_layers{0};
  std::atomic<uint32_t> gate_target{0};
  Error errors[kMaxErrors];
  uint8_t padding[4096 - 48 - kMaxErrors * sizeof(Error)];
};
static_assert(sizeof(LoadTicket) == 4096);
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// Cyclic order of the device words (CUDA's stream-wait GEQ): true when
// `a` is at or past `b`, across wrap-around.
inline bool CyclicAtLeast(uint32_t a, uint32_t b) {
  return static_cast<int32_t>(a - b) >= 0;
}

// Raises `word` to `value` unless it is already there (release):
// device_layers only moves forward, whoever writes it.
inline void RaiseTo(std::atomic<uint32_t>& word, uint32_t value) {
  uint32_t seen = word.load(std::memory_order_relaxed);
  while (!CyclicAtLeast(seen, value) &&
         !word.compare_exchange_weak(seen, value, std::memory_order_release,
                                     std::memory_order_relaxed)) {
  }
}

}  // namespace tierkv
