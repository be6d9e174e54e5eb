// PeerServer: answers peers' FETCH requests (fetch_protocol.h) from this
// node's own tiers (scaleout.md §8(a), (d)): DRAM, or NVMe promoted into DRAM
// first, never another peer (the engine reads with TierScope::kLocal, so a
// fetch never hops onwards and two stale hints cannot send it round).
//
// Every segment is served under a read lease of the engine, taken before its
// checksum is computed and released only when the transport has sent the
// bytes (or failed to), so eviction never frees bytes in flight; the lease's
// TTL bounds how long a requester that vanished can pin them.
//
// Refused (an error reply, no bytes): a namespace this node does not have or
// does not share (PermissionDenied), a layout fingerprint other than this
// node's (InvalidArgument), a malformed request (ProtocolError). A segment
// the node does not hold is answered "absent" (the requester repairs the
// directory), as is one that fails its NVMe checksum; one it holds but
// cannot lease or promote now is "unavailable" (the hint stands).
//
// Thread safety: Handle runs on the transport's progress thread (a request
// held by the test-only PeerServeStall, on that stall's thread) and never
// blocks; Stop may be called from any thread, once.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>

#include "common/mutex.h"
#include "storage/engine/cache_engine.h"
#include "transport/peer/peer_transport.h"

namespace tierkv::daemon::cluster {

struct PeerServerCounters {
  uint64_t requests = 0;         // FETCH requests handled
  uint64_t refused = 0;          // answered with an error reply
  uint64_t served_segments = 0;  // segments sent
  uint64_t served_bytes = 0;
  uint64_t absent_segments = 0;  // asked for, not held here
  // Held, but not servable now (lease limits, no DRAM to promote into).
  uint64_t unavailable_segments = 0;
};

// Owned by a shared_ptr (make it with std::make_shared): the engine's and
// the transport's callbacks keep it alive past Stop().
class PeerServer : public std::enable_shared_from_this<PeerServer> {
 public:
  // The lease owner of reads on behalf of peer `node_id`: one per peer, so
  // the engine's per-owner lease limits bound what each peer pins (one that
  // never pulls its replies starves only itself), all with the top bit set
  // (client connections are numbered from 1, far below).
  static uint64_t OwnerOf(std::string_view node_id) {
    return kPeerOwnerBit |
           (std::hash<std::string_view>()(node_id) & (kPeerOwnerBit - 1));
  }
  static constexpr uint64_t kPeerOwnerBit = uint64_t{1} << 63;

  // `engine` is borrowed until Stop() returned; `shared` names the
  // namespaces peers may read.
  PeerServer(storage::CacheEngine* engine,
             std::unordered_set<std::string> shared);

  // The transport's RequestHandler.
  void Handle(const transport::peer::PeerRequest& request,
              transport::peer::PeerResponder responder) EXCLUDES(mu_);

  // From now on every request is refused (Unavailable) and nothing here
  // touches the engine again (an Acquire finishing later is answered with
  // an error); leases still held end with the engine.
  void Stop() EXCLUDES(mu_);

  PeerServerCounters counters() const;

 private:
  // Sends the reply for an Acquire's result; releases its lease once sent.
  void Reply(storage::EngineNamespace& ns, uint64_t owner,
             std::vector<SegmentKey> keys, storage::EngineRead read,
             transport::peer::PeerResponder responder) EXCLUDES(mu_);
  void Release(uint64_t owner, uint64_t lease_id) EXCLUDES(mu_);

  storage::CacheEngine* const engine_;
  const std::unordered_set<std::string> shared_;

  // Takes a call into the engine: false once stopped. Each true is ended
  // by Leave(), and Stop() waits for every one (never held across a call:
  // the engine may complete an Acquire, and the transport a send, inline).
  bool Enter() EXCLUDES(mu_);
  void Leave() EXCLUDES(mu_);

  mutable Mutex mu_;
  CondVar idle_cv_;
  bool stopped_ GUARDED_BY(mu_) = false;
  uint32_t active_ GUARDED_BY(mu_) = 0;

  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> served_segments_{0};
  std::atomic<uint64_t> served_bytes_{0};
  std::atomic<uint64_t> absent_segments_{0};
  std::atomic<uint64_t> unavailable_segments_{0};
};

}  // namespace tierkv::daemon::cluster
