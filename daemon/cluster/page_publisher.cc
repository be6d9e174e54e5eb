#include "daemon/cluster/page_publisher.h"

#include <algorithm>
#include <unordered_set>

namespace tierkv::daemon::cluster {

PagePublisher::PagePublisher(PagePublisherOptions options,
                             storage::CacheEngine* engine,
                             std::shared_ptr<transport::Directory> directory,
                             std::vector<storage::EngineNamespace*> namespaces)
    : options_(options),
      engine_(engine),
      directory_(std::move(directory)),
      namespaces_(std::move(namespaces)) {
  {
    MutexLock lock(&mu_);
    for (storage::EngineNamespace* ns : namespaces_) published_[ns];
  }
  thread_ = std::thread([this] { Loop(); });
}

PagePublisher::~PagePublisher() { Stop(); }

void PagePublisher::Stored(const storage::EngineNamespace* ns,
                           std::span<const PageHash> pages) {
  MutexLock lock(&mu_);
  if (stopping_ || !published_.contains(ns)) return;
  const bool idle = fresh_pending_ == 0;
  for (const PageHash& page : pages) {
    if (pending_.size() >= options_.max_pending_pages) {
      stats_.dropped += 1;
      continue;
    }
    pending_.push_back({ns, page});
    ++fresh_pending_;
  }
  // Published as soon as the thread is free: peers asking right after a
  // store find it (what arrives meanwhile is batched with it).
  if (idle && fresh_pending_ > 0) cv_.Signal();
}

void PagePublisher::Loop() {
  auto next_sweep = std::chrono::steady_clock::now();
  while (true) {
    {
      MutexLock lock(&mu_);
      // Candidates wake the thread at once; otherwise it sweeps once a
      // period (the period is the point, not a synchronization).
      while (!stopping_ && fresh_pending_ == 0 &&
             std::chrono::steady_clock::now() < next_sweep) {
        cv_.WaitUntil(&mu_, next_sweep);
      }
      if (stopping_) return;
    }
    const auto now = std::chrono::steady_clock::now();
    const bool sweep = now >= next_sweep;
    if (sweep) next_sweep = now + options_.period;
    RunOnce(sweep);
  }
}

void PagePublisher::TEST_RunOnce() { RunOnce(/*sweep=*/true); }

void PagePublisher::RunOnce(bool sweep) {
  MutexLock run(&run_mu_);
  std::vector<Pending> pending;
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    pending.swap(pending_);
    fresh_pending_ = 0;
  }
  for (storage::EngineNamespace* ns : namespaces_) {
    // A candidate already tracked is published again (one add, no new
    // tracking; PublishHeld): Stored names pages this node just committed
    // or fetched (or a Store announces), so it mostly held none of them a
    // moment ago, and the entry may be gone although the sweep has not yet
    // seen the page leave: a peer that found it absent meanwhile removed
    // it (ForgetHolder). Skipping a tracked page left the node unnamed for
    // the page's whole new lifetime (a trace replayed over 4 nodes: the
    // pages of 14 of 3,993 requests never reappeared in the directory).
    std::vector<Pending> candidates;
    std::unordered_set<PageHash> seen;
    for (const Pending& p : pending) {
      if (p.ns == ns && seen.insert(p.page).second) candidates.push_back(p);
    }
    if (!candidates.empty()) PublishHeld(ns, std::move(candidates));
    if (sweep) Sweep(ns);
  }
}

void PagePublisher::PublishHeld(storage::EngineNamespace* ns,
                                std::vector<Pending> candidates) {
  std::vector<PageHash> pages;
  pages.reserve(candidates.size());
  for (const Pending& p : candidates) pages.push_back(p.page);
  // Without a layout nothing is whole yet (HeldLocally: all false).
  const std::vector<bool> held = engine_->HeldLocally(*ns, pages);
  std::vector<PageHash> whole;
  {
    MutexLock lock(&mu_);
    Published& published = published_[ns];
    for (size_t i = 0; i < pages.size(); ++i) {
      if (!held[i]) {
        if (++candidates[i].tries < options_.candidate_retries &&
            pending_.size() < options_.max_pending_pages) {
          pending_.push_back(candidates[i]);
        }
        continue;
      }
      if (published.index.contains(pages[i])) {
        whole.push_back(pages[i]);  // tracked: published again (RunOnce)
        continue;
      }
      if (tracked_ >= options_.max_published_pages) {
        stats_.dropped += 1;
        continue;
      }
      published.index.emplace(pages[i], published.pages.size());
      published.pages.push_back(pages[i]);
      ++tracked_;
      whole.push_back(pages[i]);
    }
  }
  if (whole.empty()) return;
  if (directory_->Publish(NamespaceOf(*ns), whole).ok()) {
    MutexLock lock(&mu_);
    stats_.published += whole.size();
  }
  // Not queued (directory queue full): the directory re-publishes the
  // tracked pages once its queue drained (RedisDirectory::Options::
  // republish), so they stay tracked.
}

void PagePublisher::Sweep(storage::EngineNamespace* ns) {
  std::vector<PageHash> slice;
  {
    MutexLock lock(&mu_);
    Published& published = published_[ns];
    if (published.pages.empty()) return;
    if (published.cursor >= published.pages.size()) published.cursor = 0;
    const size_t end = std::min(published.pages.size(),
                                published.cursor + options_.sweep_pages);
    slice.assign(published.pages.begin() + published.cursor,
                 published.pages.begin() + end);
    published.cursor = end;
  }
  const std::vector<bool> held = engine_->HeldLocally(*ns, slice);
  std::vector<PageHash> gone;
  {
    MutexLock lock(&mu_);
    Published& published = published_[ns];
    for (size_t i = 0; i < slice.size(); ++i) {
      if (held[i]) continue;
      auto it = published.index.find(slice[i]);
      if (it == published.index.end()) continue;
      const size_t at = it->second;
      published.index.erase(it);
      if (at + 1 != published.pages.size()) {
        published.pages[at] = published.pages.back();
        published.index[published.pages[at]] = at;
      }
      published.pages.pop_back();
      --tracked_;
      gone.push_back(slice[i]);
    }
  }
  if (gone.empty()) return;
  // A dropped unpublish leaves a stale entry: a peer's miss repairs it.
  (void)directory_->Unpublish(NamespaceOf(*ns), gone);
  MutexLock lock(&mu_);
  stats_.unpublished += gone.size();
}

void PagePublisher::Republish(transport::DirectoryRepublisher& sink) {
  constexpr size_t kBatch = 4096;
  for (storage::EngineNamespace* ns : namespaces_) {
    const transport::DirectoryNamespace dns = NamespaceOf(*ns);
    for (size_t begin = 0;; begin += kBatch) {
      std::vector<PageHash> batch;
      {
        MutexLock lock(&mu_);
        if (stopping_) return;  // Stop() does not wait for a whole catalog
        const std::vector<PageHash>& pages = published_[ns].pages;
        if (begin >= pages.size()) break;
        batch.assign(pages.begin() + begin,
                     pages.begin() + std::min(pages.size(), begin + kBatch));
      }
      if (!sink.Publish(dns, batch).ok()) return;  // retried by the directory
    }
  }
}

void PagePublisher::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  MutexLock run(&run_mu_);  // a TEST_RunOnce in progress ends first
}

PagePublisherStats PagePublisher::Stats() const {
  MutexLock lock(&mu_);
  PagePublisherStats s = stats_;
  s.tracked = tracked_;
  return s;
}

}  // namespace tierkv::daemon::cluster
