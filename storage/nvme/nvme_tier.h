// NvmeTier: the NVMe tier (NvmeStore) behind the Tier interface.
//
// Reads and writes run on the calling thread today (NvmeStore drives one
// io_uring submission stream per thread) and complete before they return.
// A namespace the catalog cannot register because it is read-only (a full
// disk) opens anyway: its writes are refused until the catalog recovers,
// and DRAM keeps serving it.
#pragma once

#include <string_view>

#include "storage/nvme/nvme_store.h"
#include "storage/policy/eviction_policy_kind.h"
#include "storage/tier/tier.h"

namespace tierkv::storage {

class NvmeTier final : public Tier {
 public:
  // `store` is borrowed and must outlive the tier.
  explicit NvmeTier(NvmeStore* store) : store_(store) {}

  std::string_view name() const override { return "nvme"; }
  // NvmeStore orders each namespace share with one EvictionPolicy.
  std::string_view policy() const override {
    return EvictionPolicyName(NvmeStore::kPolicy);
  }
  tierkv::Tier kind() const override { return tierkv::Tier::kNvme; }
  bool persistent() const override { return true; }

  Status OpenNamespace(const TierNamespace& ns) override;
  std::vector<uint64_t> Lookup(const TierNamespace& ns, uint64_t fingerprint,
                               std::span<const SegmentKey> keys) override;
  void Read(const TierNamespace& ns, uint64_t fingerprint,
            std::span<const TierReadItem> items, TierReadDone done) override;
  void Write(const TierNamespace& ns, uint64_t fingerprint,
             std::span<const TierWriteItem> items, Durability durability,
             TierWriteDone done) override;
  std::vector<Status> Evict(const TierNamespace& ns,
                            std::span<const SegmentKey> keys) override;
  Status Sync() override { return store_->Sync(); }
  bool HasUnsyncedWrites() const override {
    return store_->HasUnsyncedWrites();
  }
  void VisitCounters(TierCounterVisitor& visitor) const override;
  void VisitNamespaceCounters(const TierNamespace& ns,
                              TierCounterVisitor& visitor) const override;
  void PrepareThisThread() override { store_->device().PrepareThisThread(); }

  NvmeStore& store() const { return *store_; }

 private:
  NvmeStore* const store_;
};

}  // namespace tierkv::storage
