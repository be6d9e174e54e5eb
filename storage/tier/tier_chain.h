// TierChain: the tiers below a daemon's host DRAM in read order, and the
// placement decisions over them (placement.h). The engine and the mover
// ask the chain; they never name a tier.
//
// Reads fall through: a batch goes to the first tier, its misses to the
// next, and so on, so every item is read from the cheapest tier holding
// it and one tier sees at most one call per batch. Locate does the same
// for probes (Match), one Lookup per tier per batch.
//
// Thread safety: thread-safe (immutable after Create; the tiers are).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "storage/tier/placement.h"
#include "storage/tier/tier.h"

namespace tierkv::storage {

// Which tiers of a chain a probe or read may use: all of them, or only the
// node's own (not remote(): what a node serves to a peer).
enum class TierScope { kAll, kLocal };

class TierChain {
 public:
  // Orders `tiers` by placement.read_order and resolves the demotion
  // target. InvalidArgument naming the problem: a tier named twice, a name
  // in read_order or demote_to that no tier has, a tier read_order leaves
  // out.
  static Result<std::unique_ptr<TierChain>> Create(
      std::vector<std::unique_ptr<Tier>> tiers,
      const PlacementOptions& placement);

  // Where a segment is (Locate): the read-order index of the first tier
  // holding it and its length there, or kNowhere.
  static constexpr uint8_t kNowhere = 0xff;
  struct Location {
    uint8_t tier = kNowhere;
    uint64_t bytes = 0;
  };
  // A read's results, one per item, and which tier served each (kNowhere
  // for a failed item).
  struct ReadResult {
    std::vector<Result<uint64_t>> items;
    std::vector<uint8_t> served_by;
  };
  using ReadDone = std::function<void(ReadResult)>;

  bool empty() const { return tiers_.empty(); }
  size_t size() const { return tiers_.size(); }
  // The tier at read-order index `i`. REQUIRES: i < size().
  Tier& at(size_t i) const { return *tiers_[i]; }
  // Where dirty host segments go; null for an empty chain.
  Tier* demotion_target() const { return demote_to_; }
  // Whether a Flush can make segments durable (the demotion target
  // persists).
  bool can_persist() const {
    return demote_to_ != nullptr && demote_to_->persistent();
  }

  // OpenNamespace on every tier; the first error, prefixed with the tier.
  Status OpenNamespace(const TierNamespace& ns);
  // One Lookup per tier, each with the keys the tiers before it lacked.
  std::vector<Location> Locate(const TierNamespace& ns, uint64_t fingerprint,
                               std::span<const SegmentKey> keys,
                               TierScope scope = TierScope::kAll) const;
  // Reads each item from the first tier that has it (see the top); `done`
  // runs once, as Tier::Read's. An item a tier failed (IOError, ...) is
  // tried further down too: segments are immutable, so any tier's copy is
  // the same bytes. It fails with the first such error when no tier has it
  // (NotFound only when every tier missed), and InvalidArgument (dst too
  // small) ends it at once.
  void Read(const TierNamespace& ns, uint64_t fingerprint,
            std::span<const TierReadItem> items, ReadDone done,
            TierScope scope = TierScope::kAll) const;
  ReadResult ReadAndWait(const TierNamespace& ns, uint64_t fingerprint,
                         std::span<const TierReadItem> items) const;
  // Syncs every tier with unsynced writes; the first error.
  Status Sync() const;
  bool HasUnsyncedWrites() const;
  // Tier::PrepareThisThread on every tier.
  void PrepareThisThread() const;

 private:
  TierChain(std::vector<std::unique_ptr<Tier>> tiers, Tier* demote_to)
      : tiers_(std::move(tiers)), demote_to_(demote_to) {}
  struct PendingRead;
  // Whether tier `level` is in `scope`.
  bool InScope(size_t level, TierScope scope) const {
    return scope == TierScope::kAll || !tiers_[level]->remote();
  }
  // Reads what is still NotFound in `state` from tier `level` on.
  void ReadFrom(size_t level, std::shared_ptr<PendingRead> state) const;

  const std::vector<std::unique_ptr<Tier>> tiers_;
  Tier* const demote_to_;
};

}  // namespace tierkv::storage
