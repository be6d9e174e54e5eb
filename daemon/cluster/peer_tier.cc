#include "daemon/cluster/peer_tier.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>

#include "daemon/cluster/fetch_protocol.h"

namespace tierkv::daemon::cluster {

using transport::DirectoryNamespace;

namespace {

// Set while a FETCH's completion runs on the transport's progress thread
// (and with it whatever the engine does in the read's `done`, such as
// planning a promotion's next round): PrefixHolders and HoldersOfEach then
// make no directory round trip there.
thread_local bool tls_in_fetch_completion = false;

class InFetchCompletion {
 public:
  InFetchCompletion() : saved_(tls_in_fetch_completion) {
    tls_in_fetch_completion = true;
  }
  ~InFetchCompletion() { tls_in_fetch_completion = saved_; }

 private:
  const bool saved_;
};

}  // namespace

// A Read in flight: its items' results, filled by its FETCH calls, and
// what to tell the directory and the listener once they all ended.
struct PeerTier::ReadState {
  storage::TierNamespace ns;
  DirectoryNamespace dns;
  std::vector<storage::TierReadItem> items;
  storage::TierReadDone done;
  Clock::time_point started;
  Clock::time_point deadline;  // of every FETCH of the read
  // Per item: the live holders of its page, in the order to try them, and
  // how peers are reached.
  std::vector<std::vector<std::string>> candidates;
  std::unordered_map<std::string, std::string> address;

  Mutex mu;
  std::vector<Result<uint64_t>> results GUARDED_BY(mu);
  // Per item: which of its candidates is being (or was last) tried.
  std::vector<size_t> attempt GUARDED_BY(mu);
  // Holders that answered "absent" for a page: repaired in the directory.
  std::map<std::string, std::vector<PageHash>> stale GUARDED_BY(mu);
  // Calls not ended yet, plus one held by Read until every call is sent.
  uint32_t pending GUARDED_BY(mu) = 1;
};

// One FETCH to one holder, for some items of a ReadState.
class PeerTier::FetchCall final : public transport::peer::ReplyReceiver {
 public:
  FetchCall(PeerTier* tier, std::shared_ptr<ReadState> state,
            std::string holder, std::vector<size_t> items)
      : tier_(tier),
        state_(std::move(state)),
        holder_(std::move(holder)),
        items_(std::move(items)) {}

  // The transport lets go of a receiver only once UCX can no longer write
  // into the spans OnReplyHead handed out (peer_transport.h,
  // stalled_receive_grace). A call that failed after handing them out ends
  // here, not in OnComplete: until now its items' dst belonged to UCX, so
  // they could neither be handed back to the engine nor fetched again.
  ~FetchCall() override {
    if (!deferred_) return;
    InFetchCompletion scope;
    End(std::move(*deferred_), {});
  }

  Result<std::vector<std::span<std::byte>>> OnReplyHead(
      std::span<const std::byte> head, uint64_t data_bytes) override {
    auto decoded = DecodeFetchReplyHead(head, items_.size());
    if (!decoded.ok()) return decoded.status();
    segments_ = std::move(decoded).value();
    std::vector<std::span<std::byte>> spans;
    uint64_t total = 0;
    for (size_t i = 0; i < items_.size(); ++i) {
      const uint32_t bytes = segments_[i].bytes;
      if (segments_[i].state != FetchedSegment::State::kServed) continue;
      const std::span<std::byte> dst = state_->items[items_[i]].dst;
      if (bytes > dst.size()) {
        return Status::ProtocolError(
            fmt::format("peer {} sent a segment of {} bytes where {} fit",
                        holder_, bytes, dst.size()));
      }
      spans.push_back(dst.first(bytes));
      total += bytes;
    }
    if (total != data_bytes) {
      return Status::ProtocolError(
          fmt::format("peer {} announced {} bytes for segments of {}", holder_,
                      data_bytes, total));
    }
    spans_handed_ = !spans.empty();
    return spans;
  }

  void OnComplete(Status status) override {
    InFetchCompletion scope;
    ReadState& s = *state_;
    std::vector<PageHash> stale;
    std::vector<Result<uint64_t>> out;
    out.reserve(items_.size());
    if (status.ok()) {
      for (size_t i = 0; i < items_.size(); ++i) {
        const storage::TierReadItem& item = s.items[items_[i]];
        const FetchedSegment& seg = segments_[i];
        if (seg.state == FetchedSegment::State::kAbsent) {
          tier_->errors_stale_.fetch_add(1, std::memory_order_relaxed);
          if (stale.empty() || stale.back() != item.key.page) {
            stale.push_back(item.key.page);
          }
          out.push_back(Status::NotFound(
              fmt::format("peer {} no longer holds the segment", holder_)));
        } else if (seg.state == FetchedSegment::State::kUnavailable) {
          tier_->errors_unavailable_.fetch_add(1, std::memory_order_relaxed);
          out.push_back(Status::IOError(fmt::format(
              "peer {} holds the segment but cannot serve it now", holder_)));
        } else if (SegmentChecksum(item.dst.first(seg.bytes)) != seg.checksum) {
          tier_->errors_checksum_.fetch_add(1, std::memory_order_relaxed);
          out.push_back(Status::NotFound(fmt::format(
              "segment from peer {} failed its checksum", holder_)));
        } else {
          tier_->fetch_segments_.fetch_add(1, std::memory_order_relaxed);
          tier_->fetch_bytes_.fetch_add(seg.bytes, std::memory_order_relaxed);
          out.push_back(uint64_t{seg.bytes});
        }
      }
    } else {
      CountError(status);
      const bool refused = status.code() == StatusCode::kPermissionDenied ||
                           status.code() == StatusCode::kInvalidArgument;
      if (!refused) tier_->HolderFailed(holder_);
      for (size_t i = 0; i < items_.size(); ++i) {
        // A refusal (namespace not shared there, another layout) is a
        // miss; a failed peer is an error the engine reports per segment.
        out.push_back(
            refused ? Status::NotFound(fmt::format("peer {} refused: {}",
                                                   holder_, status.message()))
                    : Status::IOError(fmt::format("peer {}: {}", holder_,
                                                  status.ToString())));
      }
    }
    if (!status.ok() && spans_handed_) {
      deferred_ = std::move(out);  // ~FetchCall ends the call
      return;
    }
    // Failover: an item this holder did not serve (a stale entry, a failed
    // or refusing peer) goes to the next live holder of its page, while the
    // read's deadline allows: the directory is a hint, and a holder's entry
    // outlives its copy until its sweep unpublishes it. (Without it, a
    // cluster replay of the Mooncake trace over 4 nodes missed 11,839 pages
    // another node held: 53.7% hit rate against an offline bound of 54.9%.)
    // Its dst is free to reuse: no span of it was handed to UCX, or the
    // call succeeded.
    if (Clock::now() < s.deadline) {
      std::vector<size_t> retry;
      {
        MutexLock lock(&s.mu);
        for (size_t i = 0; i < items_.size(); ++i) {
          const size_t item = items_[i];
          if (!out[i].ok() && s.attempt[item] + 1 < s.candidates[item].size()) {
            ++s.attempt[item];
            retry.push_back(item);
          }
        }
      }
      if (!retry.empty()) {
        tier_->failovers_.fetch_add(retry.size(), std::memory_order_relaxed);
        tier_->Issue(state_, retry);  // before this call ends (pending)
      }
    }
    End(std::move(out), std::move(stale));
  }

 private:
  // Records the call's answers (those of items handed to another replica
  // are that call's to give) and ends it: the last call of a read
  // finishes the read.
  void End(std::vector<Result<uint64_t>> out, std::vector<PageHash> stale) {
    ReadState& s = *state_;
    bool last = false;
    {
      MutexLock lock(&s.mu);
      for (size_t i = 0; i < items_.size(); ++i) {
        if (s.candidates[items_[i]].empty() ||
            s.candidates[items_[i]][s.attempt[items_[i]]] == holder_) {
          s.results[items_[i]] = std::move(out[i]);
        }
      }
      if (!stale.empty()) {
        auto& pages = s.stale[holder_];
        pages.insert(pages.end(), stale.begin(), stale.end());
      }
      last = --s.pending == 0;
    }
    if (last) tier_->Finish(state_);
  }

  void CountError(const Status& status) {
    std::atomic<uint64_t>* counter = &tier_->errors_unavailable_;
    switch (status.code()) {
      case StatusCode::kBusy:  // the transport's "deadline exceeded"
        counter = &tier_->errors_timeout_;
        break;
      case StatusCode::kPermissionDenied:
      case StatusCode::kInvalidArgument:
        counter = &tier_->errors_refused_;
        break;
      case StatusCode::kProtocolError:
      case StatusCode::kCorruption:
        counter = &tier_->errors_protocol_;
        break;
      default:
        break;
    }
    counter->fetch_add(1, std::memory_order_relaxed);
  }

  PeerTier* const tier_;
  const std::shared_ptr<ReadState> state_;
  const std::string holder_;
  const std::vector<size_t> items_;  // indexes into state_->items
  std::vector<FetchedSegment> segments_;
  bool spans_handed_ = false;  // OnReplyHead gave UCX some items' dst
  // A failed call's answers, given when UCX let go of the spans.
  std::optional<std::vector<Result<uint64_t>>> deferred_;
};

PeerTier::PeerTier(PeerTierOptions options,
                   std::shared_ptr<transport::Directory> directory,
                   std::shared_ptr<transport::peer::PeerTransport> transport,
                   const LayoutSource* layouts)
    : options_(std::move(options)),
      directory_(std::move(directory)),
      transport_(std::move(transport)),
      layouts_(layouts) {}

PeerTier::~PeerTier() = default;

Status PeerTier::OpenNamespace(const storage::TierNamespace& ns) {
  if (std::find(options_.shared.begin(), options_.shared.end(), ns.name) !=
      options_.shared.end()) {
    MutexLock lock(&mu_);
    shared_ids_.insert(ns.id);
  }
  return Status::OK();
}

bool PeerTier::Shared(uint32_t ns_id) const {
  MutexLock lock(&mu_);
  return shared_ids_.contains(ns_id);
}

std::vector<uint64_t> PeerTier::Lookup(const storage::TierNamespace& ns,
                                       uint64_t fingerprint,
                                       std::span<const SegmentKey> keys) {
  std::vector<uint64_t> out(keys.size(), 0);
  if (keys.empty() || !Shared(ns.id)) return out;
  const auto layout = layouts_->LayoutOf(ns.id);
  if (!layout || layout->Fingerprint() != fingerprint) return out;
  // The distinct pages, in the order the keys name them (Match asks in
  // prefix order, so the directory's prefix lookup fits).
  std::vector<PageHash> pages;
  for (const SegmentKey& key : keys) {
    if (pages.empty() || pages.back() != key.page) pages.push_back(key.page);
  }
  lookups_.fetch_add(1, std::memory_order_relaxed);
  const size_t held = PrefixHolders(ns, fingerprint, pages).size();
  lookup_hit_pages_.fetch_add(held, std::memory_order_relaxed);
  // Keys of the pages in the prefix some peer holds.
  size_t page = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    while (page < held && pages[page] != keys[i].page) ++page;
    if (page >= held) break;
    out[i] = layout->SegmentBytes(keys[i].layer, keys[i].part);
  }
  return out;
}

void PeerTier::Remember(uint32_t ns_id, std::span<const PageHash> pages,
                        std::span<const transport::PageHolders> holders) {
  const Clock::time_point now = Clock::now();
  MutexLock lock(&mu_);
  if (holders_.size() + pages.size() > options_.holder_cache_pages) {
    holders_.clear();  // a cache for the calls of one request, not an index
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    holders_[CachedPage{ns_id, pages[i]}] = {holders[i].node_ids, now};
  }
}

std::vector<std::vector<std::string>> PeerTier::CachedPrefix(
    uint32_t ns_id, std::span<const PageHash> pages) const {
  std::vector<std::vector<std::string>> out;
  const Clock::time_point now = Clock::now();
  MutexLock lock(&mu_);
  for (const PageHash& page : pages) {
    auto it = holders_.find(CachedPage{ns_id, page});
    if (it == holders_.end() ||
        now - it->second.at >= options_.holder_cache_ttl) {
      break;
    }
    out.push_back(it->second.node_ids);
  }
  return out;
}

std::vector<std::vector<std::string>> PeerTier::PrefixHolders(
    const storage::TierNamespace& ns, uint64_t fingerprint,
    std::span<const PageHash> pages) {
  if (tls_in_fetch_completion) return CachedPrefix(ns.id, pages);
  auto found =
      directory_->Lookup(DirectoryNamespace{ns.name, fingerprint}, pages);
  if (!found.ok()) {
    lookup_errors_.fetch_add(1, std::memory_order_relaxed);
    return CachedPrefix(ns.id, pages);
  }
  Remember(ns.id, pages.first(found->size()), *found);
  std::vector<std::vector<std::string>> out;
  for (auto& holders : *found) out.push_back(std::move(holders.node_ids));
  return out;
}

std::vector<std::vector<std::string>> PeerTier::HoldersOfEach(
    const storage::TierNamespace& ns, uint64_t fingerprint,
    std::span<const PageHash> pages) {
  std::vector<std::vector<std::string>> out(pages.size());
  std::vector<PageHash> unknown;
  std::vector<size_t> unknown_at;
  {
    const Clock::time_point now = Clock::now();
    MutexLock lock(&mu_);
    for (size_t i = 0; i < pages.size(); ++i) {
      auto it = holders_.find(CachedPage{ns.id, pages[i]});
      if (it != holders_.end() &&
          now - it->second.at < options_.holder_cache_ttl) {
        out[i] = it->second.node_ids;
      } else {
        unknown.push_back(pages[i]);
        unknown_at.push_back(i);
      }
    }
  }
  if (unknown.empty() || tls_in_fetch_completion) return out;
  auto found =
      directory_->Lookup(DirectoryNamespace{ns.name, fingerprint}, unknown);
  if (!found.ok()) {
    lookup_errors_.fetch_add(1, std::memory_order_relaxed);
    return out;
  }
  Remember(ns.id, std::span(unknown).first(found->size()), *found);
  for (size_t k = 0; k < found->size(); ++k) {
    out[unknown_at[k]] = std::move((*found)[k].node_ids);
  }
  return out;
}

void PeerTier::Read(const storage::TierNamespace& ns, uint64_t fingerprint,
                    std::span<const storage::TierReadItem> items,
                    storage::TierReadDone done) {
  auto state = std::make_shared<ReadState>();
  state->ns = ns;
  state->dns = DirectoryNamespace{ns.name, fingerprint};
  state->items.assign(items.begin(), items.end());
  state->done = std::move(done);
  state->started = Clock::now();
  {
    MutexLock lock(&state->mu);
    state->results.assign(items.size(),
                          Status::NotFound("no live peer holds the segment"));
  }
  if (items.empty() || !Shared(ns.id)) {
    Finish(state);
    return;
  }
  // Holders per distinct page, in the order to try them: first the one
  // that serves the page before it when it can (fewer, larger FETCHes),
  // else one picked by the page's hash (spreading pages over replicas);
  // then the other live holders; holders that failed lately last.
  std::vector<PageHash> pages;
  std::unordered_map<PageHash, size_t> page_index;
  for (const auto& item : items) {
    if (page_index.emplace(item.key.page, pages.size()).second) {
      pages.push_back(item.key.page);
    }
  }
  const auto holders = HoldersOfEach(ns, fingerprint, pages);
  for (const auto& node : directory_->LiveNodes()) {
    if (node.node_id != directory_->self().node_id) {
      state->address[node.node_id] = node.address;
    }
  }
  std::vector<std::vector<std::string>> order(pages.size());
  std::string previous;
  const Clock::time_point now = Clock::now();
  for (size_t p = 0; p < pages.size(); ++p) {
    std::vector<std::string> live;
    std::vector<std::string> paused;
    {
      MutexLock lock(&mu_);
      for (const std::string& id : holders[p]) {
        if (!state->address.contains(id)) continue;
        (HolderPaused(id, now) ? paused : live).push_back(id);
      }
    }
    if (live.empty() && paused.empty()) continue;
    if (!live.empty()) {
      auto first = std::find(live.begin(), live.end(), previous);
      if (first == live.end()) {
        first = live.begin() + std::hash<PageHash>()(pages[p]) % live.size();
      }
      std::rotate(live.begin(), first, live.end());
    }
    live.insert(live.end(), paused.begin(), paused.end());
    previous = live.front();
    order[p] = std::move(live);
  }
  state->deadline = now + options_.fetch_deadline;
  std::vector<size_t> todo;
  state->candidates.resize(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    state->candidates[i] = order[page_index[items[i].key.page]];
    if (!state->candidates[i].empty()) todo.push_back(i);
  }
  {
    MutexLock lock(&state->mu);
    state->attempt.assign(items.size(), 0);
  }
  Issue(state, todo);
  bool last = false;
  {
    MutexLock lock(&state->mu);
    last = --state->pending == 0;
  }
  if (last) Finish(state);
}

void PeerTier::Issue(const std::shared_ptr<ReadState>& state,
                     std::span<const size_t> todo) {
  // Items per holder (each item's current candidate), in item order, cut
  // into FETCH-sized calls.
  std::map<std::string, std::vector<size_t>> by_holder;
  {
    MutexLock lock(&state->mu);
    for (size_t i : todo) {
      by_holder[state->candidates[i][state->attempt[i]]].push_back(i);
    }
  }
  const auto& items = state->items;
  for (auto& [holder, indexes] : by_holder) {
    size_t begin = 0;
    while (begin < indexes.size()) {
      size_t end = begin;
      uint64_t bytes = 0;
      while (end < indexes.size() && end - begin < kMaxFetchSegments &&
             (end == begin || bytes + items[indexes[end]].dst.size() <=
                                  options_.max_fetch_bytes)) {
        bytes += items[indexes[end]].dst.size();
        ++end;
      }
      FetchRequest request{.ns = state->ns.name,
                           .fingerprint = state->dns.layout_fingerprint};
      std::vector<size_t> call_items(indexes.begin() + begin,
                                     indexes.begin() + end);
      for (size_t i : call_items) request.keys.push_back(items[i].key);
      {
        MutexLock lock(&state->mu);
        ++state->pending;
      }
      fetches_.fetch_add(1, std::memory_order_relaxed);
      transport_->Call(state->address.at(holder), kFetchOpcode,
                       EncodeFetchRequest(request), state->deadline,
                       std::make_shared<FetchCall>(this, state, holder,
                                                   std::move(call_items)));
      begin = end;
    }
  }
}

void PeerTier::Finish(const std::shared_ptr<ReadState>& state) {
  std::vector<Result<uint64_t>> results;
  std::map<std::string, std::vector<PageHash>> stale;
  {
    MutexLock lock(&state->mu);
    results = state->results;
    stale = std::move(state->stale);
  }
  // Pages every asked segment of which arrived.
  std::vector<PageHash> fetched;
  {
    std::unordered_map<PageHash, bool> whole;
    std::vector<PageHash> order;
    for (size_t i = 0; i < results.size(); ++i) {
      const PageHash& page = state->items[i].key.page;
      auto [it, fresh] = whole.emplace(page, true);
      if (fresh) order.push_back(page);
      it->second = it->second && results[i].ok();
    }
    for (const PageHash& page : order) {
      if (whole[page]) fetched.push_back(page);
    }
  }
  if (!fetched.empty()) {
    fetch_micros_.fetch_add(
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() -
                                                              state->started)
            .count(),
        std::memory_order_relaxed);
  }
  // Before `done`: once it ran, the engine may end the read it waited for
  // and, at shutdown, destroy this tier.
  for (const auto& [holder, pages] : stale) {
    // A hint repaired; a full queue drops it (the next stale read retries).
    (void)directory_->ForgetHolder(state->dns, pages, holder);
    Forget(state->ns.id, pages);
  }
  if (fetched_ && !fetched.empty()) fetched_(state->ns.id, std::move(fetched));
  storage::TierReadDone done = std::move(state->done);
  done(std::move(results));  // last: `this` may be gone afterwards
}

void PeerTier::Forget(uint32_t ns_id, std::span<const PageHash> pages) {
  MutexLock lock(&mu_);
  for (const PageHash& page : pages) holders_.erase(CachedPage{ns_id, page});
}

void PeerTier::HolderFailed(const std::string& node_id) {
  MutexLock lock(&mu_);
  paused_[node_id] = Clock::now() + options_.failed_holder_pause;
}

bool PeerTier::HolderPaused(const std::string& node_id,
                            Clock::time_point now) const {
  auto it = paused_.find(node_id);
  return it != paused_.end() && it->second > now;
}

void PeerTier::Write(const storage::TierNamespace& ns, uint64_t fingerprint,
                     std::span<const storage::TierWriteItem> items,
                     storage::Durability durability,
                     storage::TierWriteDone done) {
  (void)ns;
  (void)fingerprint;
  (void)durability;
  done(std::vector<Status>(
      items.size(),
      Status::InvalidArgument("the peer tier is read-only: pages reach peers "
                              "by their own fetches")));
}

std::vector<Status> PeerTier::Evict(const storage::TierNamespace& ns,
                                    std::span<const SegmentKey> keys) {
  (void)ns;
  return std::vector<Status>(
      keys.size(), Status::NotFound("the peer tier holds nothing to evict"));
}

void PeerTier::VisitCounters(storage::TierCounterVisitor& visitor) const {
  auto get = [](const std::atomic<uint64_t>& a) {
    return a.load(std::memory_order_relaxed);
  };
  visitor.Counter("lookups", get(lookups_));
  visitor.Counter("lookup_errors", get(lookup_errors_));
  visitor.Counter("lookup_hit_pages", get(lookup_hit_pages_));
  visitor.Counter("fetches", get(fetches_));
  visitor.Counter("fetch_segments", get(fetch_segments_));
  visitor.Counter("fetch_bytes", get(fetch_bytes_));
  visitor.Counter("fetch_micros", get(fetch_micros_));
  visitor.Counter("errors_timeout", get(errors_timeout_));
  visitor.Counter("errors_unavailable", get(errors_unavailable_));
  visitor.Counter("errors_stale", get(errors_stale_));
  visitor.Counter("errors_checksum", get(errors_checksum_));
  visitor.Counter("errors_refused", get(errors_refused_));
  visitor.Counter("errors_protocol", get(errors_protocol_));
  visitor.Counter("failovers", get(failovers_));
  if (served_) {
    const PeerServerCounters served = served_();
    visitor.Counter("served_segments", served.served_segments);
    visitor.Counter("served_bytes", served.served_bytes);
    visitor.Counter("served_refused", served.refused);
    visitor.Counter("served_absent", served.absent_segments);
    visitor.Counter("served_unavailable", served.unavailable_segments);
  }
  const transport::DirectoryStats dir = directory_->GetStats();
  visitor.Flag("directory_up", dir.up);
  visitor.Gauge("live_peers", static_cast<double>(
                                  dir.live_nodes > 0 ? dir.live_nodes - 1 : 0));
}

}  // namespace tierkv::daemon::cluster
