// PagePublisher: keeps the cluster directory's record of the pages this node
// holds whole (scaleout.md §8(c)): publishes a page once every segment of its
// layout is here (DRAM or a local tier below), and unpublishes it once that
// stops being true.
//
// Off the request path: callers only queue candidate pages (Stored), and a
// background thread checks them against the engine (CacheEngine::
// HeldLocally, not a use) and writes to the directory (itself queued and
// batched). Pages leave a node by eviction, which the storage layer does not
// announce, so the thread also sweeps what it published, a slice per
// period, and unpublishes what is gone. Until a sweep reaches such a page
// its entry is stale, which costs a peer one miss and repairs the entry
// (the holder answers "absent"; PeerTier forgets it): the directory is a
// hint. A page costs two directory writes in its lifetime here (publish,
// unpublish), plus re-publishes when the directory lost its contents; a page
// stored again before the sweep saw it leave is published again (a new
// lifetime whose unpublish the sweep skipped).
//
// Memory: at most max_pending_pages candidates (more are dropped: a hint)
// and max_published_pages tracked pages (more are not published).
//
// Thread safety: thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "storage/engine/cache_engine.h"
#include "transport/directory/directory.h"

namespace tierkv::daemon::cluster {

struct PagePublisherOptions {
  // How often a sweep slice runs, and candidates not yet whole are checked
  // again (new candidates are checked at once). Default: 100 ms.
  std::chrono::milliseconds period{100};
  // Published pages re-checked per period (the sweep). Default: 8192.
  size_t sweep_pages = 8192;
  // Candidates waiting for the thread. Default: 1 Mi.
  size_t max_pending_pages = size_t{1} << 20;
  // Pages tracked as published (24 bytes each, plus the index). Default:
  // 16 Mi.
  size_t max_published_pages = size_t{1} << 24;
  // Periods a candidate not yet whole is checked again (a Store announces
  // its pages before its bytes land, a page's layers arrive in several
  // calls). Default: 30 (3 s).
  uint32_t candidate_retries = 30;
};

struct PagePublisherStats {
  uint64_t published = 0;    // pages published
  uint64_t unpublished = 0;  // pages unpublished by the sweep
  uint64_t dropped = 0;      // candidates dropped (queue or table full)
  uint64_t tracked = 0;      // pages published now
};

class PagePublisher {
 public:
  // `namespaces`: the shared ones (others never publish). `engine` is
  // borrowed until Stop() returned.
  PagePublisher(PagePublisherOptions options, storage::CacheEngine* engine,
                std::shared_ptr<transport::Directory> directory,
                std::vector<storage::EngineNamespace*> namespaces);
  ~PagePublisher();  // Stop()
  PagePublisher(const PagePublisher&) = delete;
  PagePublisher& operator=(const PagePublisher&) = delete;

  // Pages of `ns` that may have become whole here (a Put or Store, a
  // peer fetch). Never blocks on the directory; ignored for a namespace
  // that is not shared.
  void Stored(const storage::EngineNamespace* ns,
              std::span<const PageHash> pages) EXCLUDES(mu_);

  // Writes every tracked page through `sink` (the directory's re-publish
  // callback, after it lost its contents). Stops at the first failure, and
  // at the next batch once Stop() was called.
  void Republish(transport::DirectoryRepublisher& sink) EXCLUDES(mu_);

  // Ends the thread; no call reaches the engine afterwards. Idempotent.
  void Stop() EXCLUDES(mu_);

  // Checks the queued candidates and one sweep slice now, on the caller's
  // thread (tests).
  void TEST_RunOnce() EXCLUDES(mu_);

  PagePublisherStats Stats() const EXCLUDES(mu_);

 private:
  // One shared namespace's published pages: a vector to sweep in slices
  // and an index into it (removal swaps the last page in).
  struct Published {
    std::vector<PageHash> pages;
    std::unordered_map<PageHash, size_t> index;
    size_t cursor = 0;  // the next page the sweep checks
  };
  struct Pending {
    const storage::EngineNamespace* ns;
    PageHash page;
    uint32_t tries = 0;  // periods it was checked and not whole
  };

  void Loop() EXCLUDES(mu_);
  // The queued candidates, then (with `sweep`) a sweep slice, per
  // namespace.
  void RunOnce(bool sweep) EXCLUDES(mu_);
  // Publishes those of `candidates` (all of `ns`) held whole; requeues the
  // others that have tries left.
  void PublishHeld(storage::EngineNamespace* ns,
                   std::vector<Pending> candidates) EXCLUDES(mu_);
  void Sweep(storage::EngineNamespace* ns) EXCLUDES(mu_);
  static transport::DirectoryNamespace NamespaceOf(
      const storage::EngineNamespace& ns) {
    return {ns.name(), ns.fingerprint()};
  }

  const PagePublisherOptions options_;
  storage::CacheEngine* const engine_;
  const std::shared_ptr<transport::Directory> directory_;
  const std::vector<storage::EngineNamespace*> namespaces_;

  mutable Mutex mu_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<Pending> pending_ GUARDED_BY(mu_);
  // Candidates Stored since the thread last took them (retries of pages not
  // yet whole are not counted: they wait for the next period).
  size_t fresh_pending_ GUARDED_BY(mu_) = 0;
  std::unordered_map<const storage::EngineNamespace*, Published> published_
      GUARDED_BY(mu_);
  size_t tracked_ GUARDED_BY(mu_) = 0;
  PagePublisherStats stats_ GUARDED_BY(mu_);

  // Serializes RunOnce (the thread's and TEST_RunOnce) and Stop's join.
  Mutex run_mu_;
  std::thread thread_;
};

}  // namespace tierkv::daemon::cluster
