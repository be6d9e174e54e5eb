// TierMover's promotion: chain -> host DRAM in rounds, completion based
// (PromoteBatchAsync) or waited for on the caller (PromoteBatch); see
// tier_mover.h.
#include <algorithm>
#include <deque>
#include <optional>

#include "storage/tier/tier_mover.h"

namespace tierkv::storage {

// A promotion in progress: shared by the rounds' read completions and the
// posted waits, one at a time (each round starts after the last ended).
struct TierMover::Promotion {
  const NamespaceTiers* tiers = nullptr;
  std::vector<SegmentKey> keys;
  Clock::TimePoint wait_until;
  bool hold = false;
  TierScope scope = TierScope::kAll;
  Executor post;
  std::function<void(Promoted)> done;
  uint64_t fingerprint = 0;
  uint64_t round_bytes = 0;
  Promoted out;
  std::vector<size_t> todo;  // key indexes still to promote
  // The round being planned or read.
  std::vector<TierReadItem> reads;
  std::vector<size_t> read_of;      // key index per read
  std::vector<uint64_t> read_size;  // the segment's size per read
  std::vector<size_t> next_round, busy;
  uint64_t busy_generation = 0;
};

void TierMover::PromoteBatchAsync(const NamespaceTiers& tiers,
                                  std::vector<SegmentKey> keys,
                                  Clock::TimePoint wait_until, bool hold,
                                  Executor post,
                                  std::function<void(Promoted)> done,
                                  TierScope scope) {
  auto p = std::make_shared<Promotion>();
  p->tiers = &tiers;
  p->scope = scope;
  p->wait_until = wait_until;
  p->hold = hold;
  p->post = std::move(post);
  p->done = std::move(done);
  p->fingerprint = tiers.Fingerprint();
  p->round_bytes =
      std::max<uint64_t>(1, std::min(options_.promotion_batch_bytes,
                                     tiers.top->capacity_bytes() / 4));
  p->out.results.assign(keys.size(), Status::OK());
  p->out.sources.assign(keys.size(), tierkv::Tier::kMiss);
  p->todo.resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) p->todo[i] = i;
  p->keys = std::move(keys);
  RunPromotion(p);
}

void TierMover::RunPromotion(const std::shared_ptr<Promotion>& p) {
  while (!p->todo.empty()) {
    PlanRound(*p);
    if (!p->reads.empty()) {
      chain_->Read(
          p->tiers->ns, p->fingerprint, p->reads,
          [this, p](TierChain::ReadResult got) {
            CommitRound(*p, got);
            if (AdvanceRound(p)) RunPromotion(p);
          },
          p->scope);
      return;
    }
    if (!AdvanceRound(p)) return;
  }
  for (size_t i = 0; i < p->keys.size(); ++i) {
    if (!p->out.results[i].ok()) p->out.sources[i] = tierkv::Tier::kMiss;
  }
  auto done = std::move(p->done);
  done(std::move(p->out));
}

void TierMover::PlanRound(Promotion& p) {
  const NamespaceTiers& tiers = *p.tiers;
  p.reads.clear();
  p.read_of.clear();
  p.read_size.clear();
  p.next_round.clear();
  p.busy.clear();
  uint64_t bytes = 0;
  std::vector<SegmentKey> probe;
  probe.reserve(p.todo.size());
  for (size_t i : p.todo) probe.push_back(p.keys[i]);
  const std::vector<TierChain::Location> where =
      chain_->Locate(tiers.ns, p.fingerprint, probe, p.scope);
  for (size_t t = 0; t < p.todo.size(); ++t) {
    const size_t i = p.todo[t];
    const SegmentKey& key = p.keys[i];
    const uint64_t size = where[t].bytes;
    if (where[t].tier == TierChain::kNowhere) {
      p.out.results[i] = Status::NotFound("segment in no tier below DRAM");
      continue;
    }
    if (!p.reads.empty() && bytes + size > p.round_bytes) {
      p.next_round.push_back(i);
      continue;
    }
    const uint64_t generation = tiers.top->Generation();
    auto reserved = tiers.top->Reserve(key, size);
    if (!reserved.ok()) {
      p.out.results[i] = reserved.status();
      if (reserved.status().code() == StatusCode::kBusy) {
        if (p.busy.empty()) p.busy_generation = generation;
        p.busy.push_back(i);
      }
      continue;
    }
    p.out.results[i] = Status::OK();
    if (reserved->already_stored) {  // another promoter won
      p.out.sources[i] = chain_->at(where[t].tier).kind();
      if (p.hold && !tiers.top->Acquire(key).ok()) {
        p.out.results[i] = Status::NotFound("segment evicted again meanwhile");
      }
      continue;
    }
    // The whole extent: a tier below that reads whole blocks lands a
    // block-aligned one in place, the padding past the segment's end
    // included (the segment is still `size` bytes).
    SegmentLocation at = reserved->location;
    at.size = at.owned_bytes();
    const std::span<std::byte> dst = tiers.top->HostBytes(at);
    if (dst.empty()) {
      tiers.top->Abort(key);
      p.out.results[i] = NotHostAddressable(tiers);
      continue;
    }
    p.reads.push_back({key, dst});
    p.read_size.push_back(size);
    p.read_of.push_back(i);
    bytes += size;
  }
}

void TierMover::CommitRound(Promotion& p, const TierChain::ReadResult& got) {
  const NamespaceTiers& tiers = *p.tiers;
  for (size_t r = 0; r < p.reads.size(); ++r) {
    const size_t i = p.read_of[r];
    const SegmentKey& key = p.keys[i];
    Status& result = p.out.results[i];
    if (got.items[r].ok() && *got.items[r] == p.read_size[r]) {
      p.out.sources[i] = chain_->at(got.served_by[r]).kind();
      // Clean: a tier below holds it, so eviction may drop the copy.
      result = tiers.top->Commit(key, /*dirty=*/false, /*acquire=*/p.hold);
    } else {
      tiers.top->Abort(key);
      result = got.items[r].ok()
                   ? Status::Corruption("segment changed size mid-read")
                   : got.items[r].status();
    }
    (result.ok() ? promotions_done_ : promotions_failed_)
        .fetch_add(1, std::memory_order_relaxed);
    if (result.ok()) {
      promoted_bytes_.fetch_add(p.read_size[r], std::memory_order_relaxed);
    }
  }
  p.reads.clear();
}

bool TierMover::AdvanceRound(const std::shared_ptr<Promotion>& p) {
  if (!p->busy.empty() && p->next_round.empty()) {
    // Busy: another promoter or a client's Put fills the key, or DRAM
    // holds only unpersisted segments. Retry once the tier changes, on a
    // thread allowed to wait for that.
    Kick();
    if (clock_->Now() >= p->wait_until) {
      p->todo.clear();  // out of time: those keys stay Busy
      return true;
    }
    const bool posted = p->post([this, p] {
      if (p->tiers->top->WaitChange(p->busy_generation, *clock_,
                                    p->wait_until)) {
        p->todo = std::move(p->busy);
      } else {
        p->todo.clear();  // out of time: those keys stay Busy
      }
      RunPromotion(p);
    });
    if (posted) return false;
    p->todo.clear();  // nowhere to wait: those keys stay Busy
    return true;
  }
  p->next_round.insert(p->next_round.end(), p->busy.begin(), p->busy.end());
  p->todo = std::move(p->next_round);
  return true;
}

namespace {

// Runs what a promotion posts on the thread that waits for it (a
// PromoteBatch caller may wait), until its answer is in.
class CallerRuns {
 public:
  bool Post(std::function<void()> job) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    jobs_.push_back(std::move(job));
    cv_.SignalAll();
    return true;
  }
  void Finish(TierMover::Promoted answer) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    answer_ = std::move(answer);
    cv_.SignalAll();  // under the lock: the waiter may end this at once
  }
  TierMover::Promoted Run() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    while (!answer_) {
      if (jobs_.empty()) {
        cv_.Wait(&mu_);
        continue;
      }
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.Unlock();
      job();
      lock.Lock();
    }
    return std::move(*answer_);
  }

 private:
  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> jobs_ GUARDED_BY(mu_);
  std::optional<TierMover::Promoted> answer_ GUARDED_BY(mu_);
};

}  // namespace

std::vector<Status> TierMover::PromoteBatch(
    const NamespaceTiers& tiers, std::span<const SegmentKey> keys,
    Clock::TimePoint wait_until, bool hold,
    std::vector<tierkv::Tier>* sources) {
  auto runs = std::make_shared<CallerRuns>();
  PromoteBatchAsync(
      tiers, std::vector<SegmentKey>(keys.begin(), keys.end()), wait_until,
      hold,
      [runs](std::function<void()> job) { return runs->Post(std::move(job)); },
      [runs](Promoted answer) { runs->Finish(std::move(answer)); });
  Promoted answer = runs->Run();
  if (sources != nullptr) *sources = std::move(answer.sources);
  return std::move(answer.results);
}

}  // namespace tierkv::storage
