// tierkv::Client: what an inference engine links to use tierkvd.
//
// A Client is one connection to the daemon, bound to one namespace. Control
// calls (Match, reserve/commit, lease/release) travel over the Unix socket;
// payload bytes never do: the namespace's arena is mapped into this process
// and Put/Get copy straight into and out of it (DESIGN.md §5, buffer mode).
//
//   auto client = tierkv::Client::Connect({.socket_path =
//   "/run/tierkv/tierkv.sock"}); ASSERT_OK(client->OpenNamespace("glm-5@bf16",
//   token)); ASSERT_OK(client->RegisterLayout(layout)); auto hit =
//   client->Match(page_hashes);        // leading pages present auto put =
//   client->Put(writes);               // one Status per segment auto got =
//   client->Get(reads);                // one Status per segment
//
// Thread safety: all methods are thread-safe. One Client's connection is
// multiplexed: requests from many threads are in flight at once, each call
// waits only for its own replies (matched by request id), and no lock is
// held while bytes are copied, so concurrent Put/Get calls copy in
// parallel.
//
// Failure model: every call returns Status / Result; nothing throws. If the
// daemon goes away, calls return Unavailable or IOError and the Client must
// be reconnected; the mapped arena stays valid until the Client is destroyed.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv {

struct ClientOptions {
  // Default: the daemon's default socket.
  std::string socket_path = "/run/tierkv/tierkv.sock";
  // Longest wait for one reply from the daemon. Default: 10 s.
  std::chrono::milliseconds timeout{10000};
  // Map the arena with every page faulted in, so Put/Get never fault.
  // Costs ~0.1-0.3 s per GiB at OpenNamespace. Default: true.
  bool prefault_arena = true;
};

// Result of Match: which of the asked pages are fully stored.
struct MatchResult {
  // Pages [0, leading_pages) have every segment of the layout stored: the
  // engine can skip prefill for leading_pages * page_tokens tokens.
  uint32_t leading_pages = 0;
  std::vector<Tier> tiers;  // per asked page; kMiss when not fully present
};

// One segment to store; `data.size()` is the segment's size.
struct SegmentWrite {
  SegmentKey key;
  std::span<const std::byte> data;
};

// One segment to fetch into `dst`, whose size must equal the segment's.
struct SegmentRead {
  SegmentKey key;
  std::span<std::byte> dst;
};

// Zero-copy read access to segments, valid while the lease is held. The
// destructor releases the lease (RAII); the daemon also drops it after the
// lease TTL, after which the bytes may be reused: finish reading before.
// REQUIRES: the Client that made the lease outlives it.
class ReadLease {
 public:
  ReadLease() = default;
  ReadLease(ReadLease&&) noexcept;
  ReadLease& operator=(ReadLease&&) noexcept;
  ~ReadLease();

  // Per requested key: NotFound (miss) or OK with data() valid.
  const std::vector<Status>& statuses() const { return statuses_; }
  // The segment's bytes in the shared arena; empty for a miss.
  std::span<const std::byte> data(size_t i) const { return views_[i]; }
  size_t size() const { return views_.size(); }

  // Releases now. Returns the daemon's answer (NotFound if it expired).
  Status Release();

 private:
  friend class Client;
  class Client* client_ = nullptr;
  uint64_t lease_id_ = 0;
  std::vector<Status> statuses_;
  std::vector<std::span<const std::byte>> views_;
};

// Segments protected from eviction until Unpin, destruction, the TTL or
// the Client's disconnect. REQUIRES: the Client outlives the PinLease.
class PinLease {
 public:
  PinLease() = default;
  PinLease(PinLease&&) noexcept;
  PinLease& operator=(PinLease&&) noexcept;
  ~PinLease();

  const std::vector<Status>& statuses() const { return statuses_; }
  Status Unpin();

 private:
  friend class Client;
  class Client* client_ = nullptr;
  uint64_t lease_id_ = 0;
  std::vector<Status> statuses_;
};

class Client {
 public:
  // Unavailable when no daemon listens at options.socket_path.
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Binds this client to namespace `name` and maps its arena. Returns
  // PermissionDenied for an unknown namespace or a wrong token.
  // REQUIRES: not called before on this Client with another namespace.
  Status OpenNamespace(const std::string& name, const std::string& token);

  // Registers the namespace's KV layout (once per namespace; identical
  // re-registration is OK, a different layout is InvalidArgument).
  Status RegisterLayout(const LayoutSpec& layout);
  // The layout known to the daemon, if any (fetched at OpenNamespace or
  // set by RegisterLayout). A copy: safe against a concurrent
  // RegisterLayout.
  std::optional<LayoutSpec> layout() const;

  // Which leading pages are fully present (all layers and parts).
  // REQUIRES: a registered layout.
  Result<MatchResult> Match(std::span<const PageHash> pages);

  // Stores segments: one Status per item. OK = stored now; AlreadyExists =
  // deduplicated (stored before, nothing copied); InvalidArgument = size
  // does not fit the layout; Busy = another client is writing it;
  // ResourceExhausted = no evictable space.
  std::vector<Status> Put(std::span<const SegmentWrite> writes);

  // Copies segments into caller buffers: one Status per item. NotFound =
  // miss; InvalidArgument = dst size differs from the segment's size.
  std::vector<Status> Get(std::span<const SegmentRead> reads);

  // Makes stored segments durable on the daemon's NVMe tier before
  // returning: one Status per key. OK = on NVMe (now or before); NotFound =
  // in neither tier; IOError = the device failed (the segment stays in
  // DRAM). The whole call fails with InvalidArgument when the daemon has no
  // NVMe tier. A segment acknowledged here survives a daemon crash.
  std::vector<Status> Flush(std::span<const SegmentKey> keys);

  // Leases segments for zero-copy reads from the mapped arena.
  Result<ReadLease> Acquire(std::span<const SegmentKey> keys);

  // Protects stored segments from eviction for up to `ttl`.
  Result<PinLease> Pin(std::span<const SegmentKey> keys,
                       std::chrono::milliseconds ttl);

  // Daemon information (JSON: version, pid, uptime, namespaces). Works
  // without an opened namespace.
  Result<std::string> Ping();
  // This namespace's statistics as JSON (see README "tierkv stats").
  Result<std::string> StatsJson();

  struct ListedSegment {
    SegmentKey key;
    uint64_t size = 0;
    uint32_t refs = 0;
    Tier tier = Tier::kMiss;
  };
  // Up to `limit` stored segments of this namespace (for debugging).
  Result<std::vector<ListedSegment>> List(uint32_t limit);

 private:
  friend class ReadLease;
  friend class PinLease;
  class Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  Status ReleaseLease(uint64_t lease_id);

  std::unique_ptr<Impl> impl_;
};

}  // namespace tierkv
