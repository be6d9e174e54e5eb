// LruPolicy (`lru`): evicts the segment whose last use is oldest.
//
// One list, most recent at the front; a segment's rank is its last use on
// the tier's clock (a release counts as a use).
#include "storage/policy/eviction_policy.h"

namespace tierkv::storage {
namespace {

class LruPolicy final : public EvictionPolicy {
 public:
  ~LruPolicy() override { list_.clear(); }

  EvictionPolicyKind kind() const override { return EvictionPolicyKind::kLru; }

  void Admit(PolicyState& s, uint64_t now) override {
    s.last_use = now;
    s.uses = 1;
  }

  void Use(PolicyState& s, uint64_t now) override {
    s.last_use = now;
    if (s.uses < UINT32_MAX) ++s.uses;
    if (!s.linked) return;
    s.rank = now;
    list_.splice(list_.begin(), list_, list_.iterator_to(s));
  }

  void Link(PolicyState& s, uint64_t now, LinkAt at) override {
    if (at == LinkAt::kNow) {
      s.rank = now;
      list_.push_front(s);
    } else {
      s.rank = s.last_use;
      InsertByRank(list_, s);
    }
    s.linked = true;
    bytes_ += s.bytes;
  }

  void Unlink(PolicyState& s) override {
    if (!s.linked) return;
    list_.erase(list_.iterator_to(s));
    s.linked = false;
    bytes_ -= s.bytes;
  }

  PolicyState* Victim() override {
    return list_.empty() ? nullptr : &list_.back();
  }

  uint64_t linked_bytes() const override { return bytes_; }

 private:
  PolicyList list_;  // front: most recently used
  uint64_t bytes_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewLruPolicy() {
  return std::make_unique<LruPolicy>();
}

}  // namespace tierkv::storage
