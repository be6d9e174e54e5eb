// Implements MemoryDirectory and MemoryDirectoryCluster
// (memory_directory.h).
#include "transport/directory/memory_directory.h"

#include <algorithm>

namespace tierkv::transport {

void MemoryDirectoryCluster::SetDown(bool down) {
  MutexLock lock(&mu_);
  down_ = down;
}

void MemoryDirectoryCluster::SetLive(std::string_view node_id, bool live) {
  MutexLock lock(&mu_);
  if (live) {
    dead_.erase(std::string(node_id));
  } else {
    dead_.insert(std::string(node_id));
  }
}

void MemoryDirectoryCluster::Clear() {
  MutexLock lock(&mu_);
  registered_.clear();
  holders_.clear();
}

size_t MemoryDirectoryCluster::EntryCount() const {
  MutexLock lock(&mu_);
  size_t entries = 0;
  for (const auto& [key, members] : holders_) entries += members.size();
  return entries;
}

MemoryDirectory::MemoryDirectory(MemoryDirectoryCluster* cluster,
                                 DirectoryNode self)
    : cluster_(cluster), self_(std::move(self)) {
  MutexLock lock(&cluster_->mu_);
  cluster_->registered_[self_.node_id] = self_;
}

MemoryDirectory::~MemoryDirectory() {
  MutexLock lock(&cluster_->mu_);
  cluster_->registered_.erase(self_.node_id);
}

bool MemoryDirectory::LiveLocked(const std::string& node_id) const {
  return cluster_->registered_.contains(node_id) &&
         !cluster_->dead_.contains(node_id);
}

Status MemoryDirectory::Write(const DirectoryNamespace& ns,
                              std::span<const PageHash> pages, bool add,
                              const std::string& member) {
  TIERKV_RETURN_IF_ERROR(ns.Validate());
  const std::string ns_key = ns.KeyComponent();
  MutexLock lock(&cluster_->mu_);
  if (cluster_->down_) {
    dropped_pages_.fetch_add(pages.size(), std::memory_order_relaxed);
    return Status::ResourceExhausted("directory down: dropped " +
                                     std::to_string(pages.size()) + " pages");
  }
  cluster_->registered_.try_emplace(self_.node_id, self_);
  for (const PageHash& page : pages) {
    if (add) {
      cluster_->holders_[{ns_key, page}].insert(member);
      continue;
    }
    auto it = cluster_->holders_.find({ns_key, page});
    if (it == cluster_->holders_.end()) continue;
    it->second.erase(member);
    if (it->second.empty()) cluster_->holders_.erase(it);
  }
  return Status::OK();
}

Status MemoryDirectory::Publish(const DirectoryNamespace& ns,
                                std::span<const PageHash> pages) {
  TIERKV_RETURN_IF_ERROR(Write(ns, pages, /*add=*/true, self_.node_id));
  published_pages_.fetch_add(pages.size(), std::memory_order_relaxed);
  return Status::OK();
}

Status MemoryDirectory::Unpublish(const DirectoryNamespace& ns,
                                  std::span<const PageHash> pages) {
  TIERKV_RETURN_IF_ERROR(Write(ns, pages, /*add=*/false, self_.node_id));
  unpublished_pages_.fetch_add(pages.size(), std::memory_order_relaxed);
  return Status::OK();
}

Status MemoryDirectory::ForgetHolder(const DirectoryNamespace& ns,
                                     std::span<const PageHash> pages,
                                     std::string_view node_id) {
  if (node_id.empty()) {
    return Status::InvalidArgument("ForgetHolder: empty node id");
  }
  TIERKV_RETURN_IF_ERROR(Write(ns, pages, /*add=*/false, std::string(node_id)));
  forgotten_holders_.fetch_add(pages.size(), std::memory_order_relaxed);
  return Status::OK();
}

Result<std::vector<PageHolders>> MemoryDirectory::Lookup(
    const DirectoryNamespace& ns, std::span<const PageHash> pages,
    Clock::time_point deadline) {
  TIERKV_RETURN_IF_ERROR(ns.Validate());
  if (Clock::now() >= deadline) {
    return Status::Unavailable("directory lookup deadline passed");
  }
  const std::string ns_key = ns.KeyComponent();
  std::vector<PageHolders> result;
  MutexLock lock(&cluster_->mu_);
  if (cluster_->down_) {
    lookups_short_circuited_.fetch_add(1, std::memory_order_relaxed);
    return Status::Unavailable("directory down");
  }
  lookups_.fetch_add(1, std::memory_order_relaxed);
  lookup_pages_.fetch_add(pages.size(), std::memory_order_relaxed);
  for (const PageHash& page : pages) {
    PageHolders holders;
    auto it = cluster_->holders_.find({ns_key, page});
    if (it != cluster_->holders_.end()) {
      for (const std::string& member : it->second) {  // std::set: sorted
        if (member != self_.node_id && LiveLocked(member)) {
          holders.node_ids.push_back(member);
        }
      }
    }
    if (holders.node_ids.empty()) break;
    result.push_back(std::move(holders));
  }
  lookup_hit_pages_.fetch_add(result.size(), std::memory_order_relaxed);
  return result;
}

std::vector<DirectoryNode> MemoryDirectory::LiveNodes() const {
  MutexLock lock(&cluster_->mu_);
  std::vector<DirectoryNode> nodes;
  for (const auto& [id, node] : cluster_->registered_) {
    if (!cluster_->dead_.contains(id)) nodes.push_back(node);
  }
  return nodes;
}

Status MemoryDirectory::RefreshLiveNodes(Clock::time_point deadline) {
  (void)deadline;  // nothing is cached
  MutexLock lock(&cluster_->mu_);
  if (cluster_->down_) return Status::Unavailable("directory down");
  return Status::OK();
}

Status MemoryDirectory::Flush(Clock::time_point deadline) {
  (void)deadline;  // writes are synchronous
  return Status::OK();
}

DirectoryStats MemoryDirectory::GetStats() const {
  DirectoryStats stats;
  {
    MutexLock lock(&cluster_->mu_);
    stats.up = !cluster_->down_;
    for (const auto& [id, node] : cluster_->registered_) {
      stats.live_nodes += cluster_->dead_.contains(id) ? 0 : 1;
    }
  }
  const auto load = [](const std::atomic<uint64_t>& counter) {
    return counter.load(std::memory_order_relaxed);
  };
  stats.lookups = load(lookups_);
  stats.lookup_pages = load(lookup_pages_);
  stats.lookup_hit_pages = load(lookup_hit_pages_);
  stats.lookups_short_circuited = load(lookups_short_circuited_);
  stats.published_pages = load(published_pages_);
  stats.unpublished_pages = load(unpublished_pages_);
  stats.forgotten_holders = load(forgotten_holders_);
  stats.dropped_pages = load(dropped_pages_);
  return stats;
}

}  // namespace tierkv::transport
