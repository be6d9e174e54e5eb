// EvictionPolicy: which evictable segment of a host tier goes first
// (DESIGN.md §4: pluggable per namespace; `lru`, `2q`, `s3fifo`, `topk`).
//
// A segment is *evictable* while it is committed, clean (nothing to write
// back), unreferenced and not being written back; the tier links it into
// its policy then and unlinks it when that stops. Every segment, evictable
// or not, carries a PolicyState the policy owns: intrusive list hooks and
// counters, so hooks allocate nothing and are O(1) (topk: O(log n); a
// policy's Victim may move a few segments between its queues first,
// amortized O(1)). A ghost history, where a policy keeps one, is bounded
// by the segments the tier holds.
//
// One instance orders a whole tier (every shard of its index), so a
// policy sees the tier's exact event order and capacity.
//
// Thread safety: none; the tier calls it under one lock.
#pragma once

#include <boost/intrusive/list.hpp>
#include <boost/intrusive/set.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "storage/policy/eviction_policy_kind.h"
#include "storage/policy/schedule_standing.h"
#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv::storage {

// Per-segment state, embedded in the tier's entry.
struct PolicyState {
  using Hook = boost::intrusive::list_member_hook<
      boost::intrusive::link_mode<boost::intrusive::safe_link>>;
  using SetHook = boost::intrusive::set_member_hook<
      boost::intrusive::link_mode<boost::intrusive::safe_link>>;
  Hook hook;               // in one of the policy's lists while linked
  SetHook set_hook;        // in the policy's ordered set (topk)
  SegmentKey key;          // set by the tier before the first hook
  uint64_t bytes = 0;      // extent bytes the segment holds
  uint64_t last_use = 0;   // tier clock at the last Admit / Use
  uint64_t rank = 0;       // the policy's order key while linked
  uint32_t uses = 0;       // Admit + Use calls while resident, saturating
  double score = 0;        // topk: decayed uses and reported selections
  uint64_t scored_at = 0;  // topk: tier clock when `score` was computed
  uint8_t queue = 0;       // which of the policy's lists (policy-defined)
  uint8_t freq = 0;        // s3fifo: uses since insertion, saturating
  bool promoted = false;   // a policy's "seen again" mark (2q)
  bool linked = false;
};

using PolicyList = boost::intrusive::list<
    PolicyState, boost::intrusive::member_hook<PolicyState, PolicyState::Hook,
                                               &PolicyState::hook>>;

// Evictable segments ordered by rank (ties in insertion order).
struct RankOf {
  using type = uint64_t;
  uint64_t operator()(const PolicyState& s) const { return s.rank; }
};
using PolicySet = boost::intrusive::multiset<
    PolicyState,
    boost::intrusive::member_hook<PolicyState, PolicyState::SetHook,
                                  &PolicyState::set_hook>,
    boost::intrusive::key_of_value<RankOf>>;

// Where Link places a segment in the order.
enum class LinkAt : uint8_t {
  kNow,      // as used at `now` (a commit, a release: the segment was used)
  kLastUse,  // where its last use puts it (a segment written back to a
             // lower tier: nothing used it meanwhile)
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual EvictionPolicyKind kind() const = 0;

  // `s` was just stored (committed) at `now`, not yet linked.
  virtual void Admit(PolicyState& s, uint64_t now) = 0;
  // `s` was used (matched, read, stored again) at `now`, linked or not.
  virtual void Use(PolicyState& s, uint64_t now) = 0;
  // `s` became evictable, placed as `at` says.
  virtual void Link(PolicyState& s, uint64_t now, LinkAt at) = 0;
  // `s` stopped being evictable (referenced, or erased).
  virtual void Unlink(PolicyState& s) = 0;
  // The segment to evict next (linked), or nullptr when none is; the tier
  // then calls Unlink and Evicted on it, or asks again if it raced.
  virtual PolicyState* Victim() = 0;
  // `s` leaves the tier to make room (after Unlink).
  virtual void Evicted(const PolicyState& s) { (void)s; }
  // Engines reported `weight` selections of `s`'s tokens by their sparse
  // attention's indexer (Client::ReportTopk) at `now`, linked or not.
  // Default: ignored.
  virtual void Report(PolicyState& s, double weight, uint64_t now) {
    (void)s;
    (void)weight;
    (void)now;
  }
  // Replaces the schedule standings of keys (keys absent: no hint, no pin)
  // and returns every key whose standing may have changed (the old and
  // the new table's); the tier then calls Rerank on those it holds.
  // Default: ignored, returns nothing.
  virtual std::vector<SegmentKey> SetSchedule(ScheduleTable table) {
    (void)table;
    return {};
  }
  // `s`'s standing may have changed: re-place it if it is linked (or
  // held back as pinned). Default: nothing.
  virtual void Rerank(PolicyState& s) { (void)s; }
  // Bytes of the linked segments.
  virtual uint64_t linked_bytes() const = 0;
};

struct EvictionPolicyOptions {
  // The tier's bytes (set by the tier).
  uint64_t capacity_bytes = 0;
  // 2q: the share of the evictable bytes that segments used more than
  // once (or seen again soon after their eviction) may hold; the rest is
  // for segments used once. Default: 0.7 (two_queue_policy.cc).
  double protected_fraction = 0.7;
  // 2q, s3fifo: keys of segments evicted unused, remembered, as a multiple
  // of the segments the tier holds (~80 B each). Default: 1.
  double ghost_factor = 1.0;
  // s3fifo: the share of the capacity for segments not yet used again
  // (the small FIFO). Default: 0.3.
  double small_fraction = 0.3;
  // topk: a score halves every this many ticks of the tier's clock (one
  // tick per use, store or report). Default: 65536.
  double half_life_ticks = 65536;
};

std::unique_ptr<EvictionPolicy> NewEvictionPolicy(
    EvictionPolicyKind kind, const EvictionPolicyOptions& options = {});

// For implementations: inserts `s` into `list` (ranks non-increasing from
// front to back) after the segments ranked above s.rank, walking from both
// ends at once: O(distance to the nearer end), so a segment of about the
// newest or oldest rank goes in in O(1).
void InsertByRank(PolicyList& list, PolicyState& s);

// The implementations, one file each (lru_policy.cc, two_queue_policy.cc,
// s3fifo_policy.cc, topk_policy.cc, weights_policy.cc).
std::unique_ptr<EvictionPolicy> NewLruPolicy();
std::unique_ptr<EvictionPolicy> NewTwoQueuePolicy(
    const EvictionPolicyOptions& options);
std::unique_ptr<EvictionPolicy> NewS3FifoPolicy(
    const EvictionPolicyOptions& options);
std::unique_ptr<EvictionPolicy> NewTopkPolicy(
    const EvictionPolicyOptions& options);
std::unique_ptr<EvictionPolicy> NewWeightsPolicy();

}  // namespace tierkv::storage
