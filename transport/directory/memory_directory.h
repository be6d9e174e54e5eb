// MemoryDirectory: an in-process Directory (directory.h) for tests of code
// that uses one (the peer tier, the engine's Match) and for single-process
// simulations of a cluster. Several MemoryDirectory nodes share one
// MemoryDirectoryCluster, which plays the Redis server: liveness and
// outages are switched by the test instead of waiting on a TTL.
//
// Same semantics as RedisDirectory where the contract fixes them (prefix
// lookup, own node left out, live filter, sorted holders); differences:
// writes are applied synchronously (Flush has nothing to wait for), and
// while the cluster is "down" every call answers at once (Lookup
// Unavailable; Publish and friends ResourceExhausted, as a full queue).
//
// Thread safety: both classes are thread-safe. A MemoryDirectoryCluster
// must outlive its MemoryDirectory nodes (they borrow it).
#pragma once

#include <atomic>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "tierkv/status.h"
#include "transport/directory/directory.h"

namespace tierkv::transport {

class MemoryDirectoryCluster {
 public:
  MemoryDirectoryCluster() = default;
  MemoryDirectoryCluster(const MemoryDirectoryCluster&) = delete;
  MemoryDirectoryCluster& operator=(const MemoryDirectoryCluster&) = delete;

  // An outage: every call of every node answers at once with an error
  // while `down`.
  void SetDown(bool down) EXCLUDES(mu_);
  // What the liveness TTL would do: a registered node stays registered but
  // is left out of lookups and LiveNodes while not live.
  void SetLive(std::string_view node_id, bool live) EXCLUDES(mu_);
  // The server restarted empty: every page entry is gone (registrations
  // too, until each node's next call re-registers it). Nothing is
  // re-published by itself.
  void Clear() EXCLUDES(mu_);

  // Page entries held, summed over pages (for assertions).
  size_t EntryCount() const EXCLUDES(mu_);

 private:
  friend class MemoryDirectory;
  using PageKey = std::pair<std::string, PageHash>;  // {ns key, page}

  mutable Mutex mu_;
  bool down_ GUARDED_BY(mu_) = false;
  std::map<std::string, DirectoryNode> registered_ GUARDED_BY(mu_);
  std::set<std::string> dead_ GUARDED_BY(mu_);
  std::map<PageKey, std::set<std::string>> holders_ GUARDED_BY(mu_);
};

class MemoryDirectory final : public Directory {
 public:
  // Registers `self` (live) in `cluster`, which the caller owns and keeps
  // until this is destroyed. REQUIRES: cluster != nullptr.
  MemoryDirectory(MemoryDirectoryCluster* cluster, DirectoryNode self);
  // Removes the registration (a graceful leave).
  ~MemoryDirectory() override;

  Status Publish(const DirectoryNamespace& ns,
                 std::span<const PageHash> pages) override;
  Status Unpublish(const DirectoryNamespace& ns,
                   std::span<const PageHash> pages) override;
  Status ForgetHolder(const DirectoryNamespace& ns,
                      std::span<const PageHash> pages,
                      std::string_view node_id) override;
  Result<std::vector<PageHolders>> Lookup(
      const DirectoryNamespace& ns, std::span<const PageHash> pages,
      Clock::time_point deadline = kDefaultDeadline) override;
  std::vector<DirectoryNode> LiveNodes() const override;
  Status RefreshLiveNodes(
      Clock::time_point deadline = kDefaultDeadline) override;
  Status Flush(Clock::time_point deadline) override;
  const DirectoryNode& self() const override { return self_; }
  DirectoryStats GetStats() const override;

 private:
  // Adds or removes `member` for each page; registers self again first
  // (as a heartbeat after Clear() would).
  Status Write(const DirectoryNamespace& ns, std::span<const PageHash> pages,
               bool add, const std::string& member);
  bool LiveLocked(const std::string& node_id) const REQUIRES(cluster_->mu_);

  MemoryDirectoryCluster* const cluster_;  // borrowed; see the constructor
  const DirectoryNode self_;

  std::atomic<uint64_t> lookups_{0};
  std::atomic<uint64_t> lookup_pages_{0};
  std::atomic<uint64_t> lookup_hit_pages_{0};
  std::atomic<uint64_t> lookups_short_circuited_{0};
  std::atomic<uint64_t> published_pages_{0};
  std::atomic<uint64_t> unpublished_pages_{0};
  std::atomic<uint64_t> forgotten_holders_{0};
  std::atomic<uint64_t> dropped_pages_{0};
};

}  // namespace tierkv::transport
