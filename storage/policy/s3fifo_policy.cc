// S3FifoPolicy (`s3fifo`): S3-FIFO (Yang et al., SOSP 2023: a small FIFO
// for new segments, a main FIFO for segments used again, a ghost list of
// keys evicted from the small one), fed pages deepest first. An
// alternative to `2q` for prefix caches: on Mooncake's trace it gains more
// at some capacities and loses at 4K blocks (bench/RESULTS.md).
//
// Why, for a prefix cache: most stored pages are never used again (on
// Mooncake's public trace 58% of cacheable blocks are seen once), while a
// page used again is likely to be used once more (75-84%). A new segment
// enters `small` (small_fraction of the capacity). When it must make room,
// small's oldest segment leaves unless it was used meanwhile, in which case
// it moves to `main`; main's oldest segment is evicted unless it was used
// since it was last looked at (up to 3 uses are remembered: each costs it
// one more pass). A segment evicted from small unused and stored again
// while its key is in the ghost list goes straight to main. Uses move
// nothing (a counter), so a prompt's many reads cost no list updates.
//
// Deepest first: a page is useful only with every page before it, so of a
// request's new pages the last ones should go first. The engine hands a
// batch's new pages to non-LRU policies last to first (CacheEngine), and
// FIFO order then evicts a prompt's tail before its head (in simulation of
// Mooncake's trace, worth 0.5-1 point over forward order).

#include "storage/policy/eviction_policy.h"
#include "storage/policy/ghost_list.h"

namespace tierkv::storage {
namespace {

constexpr uint8_t kSmall = 0;
constexpr uint8_t kMain = 1;
constexpr uint8_t kMaxFreq = 3;

class S3FifoPolicy final : public EvictionPolicy {
 public:
  explicit S3FifoPolicy(const EvictionPolicyOptions& o)
      : options_(o),
        small_target_(static_cast<uint64_t>(
            o.small_fraction * static_cast<double>(o.capacity_bytes))) {}
  ~S3FifoPolicy() override {
    queues_[kSmall].clear();
    queues_[kMain].clear();
  }

  EvictionPolicyKind kind() const override {
    return EvictionPolicyKind::kS3Fifo;
  }

  void Admit(PolicyState& s, uint64_t now) override {
    s.last_use = now;
    s.uses = 1;
    s.freq = 0;
    resident_++;
    s.promoted =
        ghost_.Take(s.key).has_value();  // evicted unused, wanted again
    s.queue = s.promoted ? kMain : kSmall;
    s.rank = ++insertions_;  // FIFO position, kept while referenced
  }

  void Use(PolicyState& s, uint64_t now) override {
    s.last_use = now;
    if (s.uses < UINT32_MAX) ++s.uses;
    if (s.freq < kMaxFreq) ++s.freq;
  }

  // A segment released by a reader (kNow) goes back at its queue's newest
  // end, as a reinsertion (a read is a use; finding its old place could
  // walk half the queue); one back from write-back (kLastUse) takes its old
  // place, near the oldest end.
  void Link(PolicyState& s, uint64_t, LinkAt at) override {
    if (at == LinkAt::kNow) {
      s.rank = ++insertions_;
      queues_[s.queue].push_front(s);
    } else {
      InsertByRank(queues_[s.queue], s);
    }
    s.linked = true;
    bytes_[s.queue] += s.bytes;
  }

  void Unlink(PolicyState& s) override {
    if (!s.linked) return;
    queues_[s.queue].erase(queues_[s.queue].iterator_to(s));
    bytes_[s.queue] -= s.bytes;
    s.linked = false;
  }

  PolicyState* Victim() override {
    while (!queues_[kSmall].empty() || !queues_[kMain].empty()) {
      const bool from_small =
          !queues_[kSmall].empty() &&
          (bytes_[kSmall] >= small_target_ || queues_[kMain].empty());
      PolicyList& q = queues_[from_small ? kSmall : kMain];
      PolicyState& oldest = q.back();
      if (oldest.freq == 0) return &oldest;
      // Used since it was queued: another round, in main.
      Unlink(oldest);
      if (from_small) {
        oldest.queue = kMain;
        oldest.freq = 0;
      } else {
        oldest.freq--;
      }
      Link(oldest, 0, LinkAt::kNow);
    }
    return nullptr;
  }

  void Evicted(const PolicyState& s) override {
    resident_--;
    if (s.queue != kSmall) return;
    ghost_.Remember(s.key, {}, GhostLimit(options_.ghost_factor, resident_));
  }

  uint64_t linked_bytes() const override {
    return bytes_[kSmall] + bytes_[kMain];
  }

 private:
  const EvictionPolicyOptions options_;
  const uint64_t small_target_;
  PolicyList queues_[2];  // front: newest (highest rank)
  uint64_t bytes_[2] = {0, 0};
  uint64_t insertions_ = 0;
  uint64_t resident_ = 0;  // admitted and not evicted
  GhostList<Unit> ghost_;  // keys evicted unused
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewS3FifoPolicy(
    const EvictionPolicyOptions& options) {
  return std::make_unique<S3FifoPolicy>(options);
}

}  // namespace tierkv::storage
