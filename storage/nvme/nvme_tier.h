// NvmeTier: the NVMe tier (NvmeStore) behind the Tier interface.
//
// Reads are completion based: Read queues the batch for the tier's reader
// threads and returns; a reader drives it through its own io_uring ring
// (queue_depth IOs in flight, each verified as it completes) and runs
// `done` there. So a caller never waits for the device: the engine's
// transfer lanes go on with the next layer while NVMe serves this one. The
// model is CacheLib navy's reader pool. Why threads and not one shared
// ring reaped by one thread: a ring is never shared between threads (STYLE
// habit 7) and NvmeStore's verification and bounce copies then run on
// several cores; a batch is already many IOs in flight on one ring.
// When the readers' queue is full, or the tier has no readers, Read runs on
// the caller's thread (the Tier contract allows either).
//
// Writes run on the caller's thread and complete before Write returns:
// only the mover's threads and Flush write, and waiting is their job.
//
// A namespace the catalog cannot register because it is read-only (a full
// disk) opens anyway: its writes are refused until the catalog recovers,
// and DRAM keeps serving it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string_view>

#include "common/worker_pool.h"
#include "storage/nvme/nvme_store.h"
#include "storage/policy/eviction_policy_kind.h"
#include "storage/tier/tier.h"

namespace tierkv::storage {

struct NvmeTierOptions {
  // Threads that run reads (each with its own io_uring ring); 0 runs every
  // read on the caller's thread. Default: 4 (transfer lanes of two Loads
  // and the mover's promotions at once).
  uint32_t readers = 4;
  // Read batches waiting for a reader; further ones run on the caller's
  // thread. Default: 1024.
  uint32_t read_queue = 1024;
};

class NvmeTier final : public Tier {
 public:
  // `store` is borrowed and must outlive the tier.
  explicit NvmeTier(NvmeStore* store, NvmeTierOptions options = {});
  void SetSchedule(const TierNamespace& ns,
                   const ScheduleTable& table) override {
    store_->SetNamespaceSchedule(ns.name, table);
  }
  // Runs the reads already queued (their `done` included), then joins the
  // readers.
  ~NvmeTier() override;

  // A reader is about to read a batch (the argument: the batch's
  // std::span<const TierReadItem>*). Tests stall it there.
  static constexpr const char* kBeforeRead = "NvmeTier::Read:BeforeRead";

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
  // Reads `items` now, on this thread, and runs `done`.
  void ReadNow(const TierNamespace& ns, uint64_t fingerprint,
               std::span<const TierReadItem> items, const TierReadDone& done);

  NvmeStore* const store_;
  std::unique_ptr<WorkerPool> readers_;  // null: reads run inline
  // Read batches the readers' full queue sent back to their caller.
  std::atomic<uint64_t> inline_reads_{0};
};

}  // namespace tierkv::storage
