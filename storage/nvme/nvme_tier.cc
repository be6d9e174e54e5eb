// NvmeTier: NvmeStore's calls behind the Tier interface (see nvme_tier.h).
#include "storage/nvme/nvme_tier.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "common/sync_point.h"
#include "storage/storage_log.h"

namespace tierkv::storage {

NvmeTier::NvmeTier(NvmeStore* store, NvmeTierOptions options) : store_(store) {
  if (options.readers == 0) return;
  readers_ = std::make_unique<WorkerPool>(
      options.readers, std::max<uint32_t>(1, options.read_queue),
      // Each reader's ring and registered buffers, before its first read.
      [store] { store->device().PrepareThisThread(); });
}

NvmeTier::~NvmeTier() { readers_.reset(); }

Status NvmeTier::OpenNamespace(const TierNamespace& ns) {
  // Registered now, not lazily on the first demotion: that catalog sync
  // would stall a data path already under pressure.
  Status s = store_->OpenNamespace(ns.name);
  if (s.ok() || !store_->read_only()) return s;
  // A full disk is no reason not to serve DRAM: the namespace's NVMe writes
  // are refused until the catalog is writable again, when it registers.
  StorageLog().warn(
      "namespace '{}': not registered on NVMe (catalog read-only: {}); it is "
      "served from DRAM",
      ns.name, s.ToString());
  return Status::OK();
}

std::vector<uint64_t> NvmeTier::Lookup(const TierNamespace& ns,
                                       uint64_t fingerprint,
                                       std::span<const SegmentKey> keys) {
  return store_->LookupBatch(ns.name, fingerprint, keys);
}

void NvmeTier::Read(const TierNamespace& ns, uint64_t fingerprint,
                    std::span<const TierReadItem> items, TierReadDone done) {
  if (readers_ != nullptr && !items.empty()) {
    // The items are the caller's until Read returns: the job keeps a copy
    // (the bytes they point at are borrowed until `done`, as the contract
    // says). The done is shared so that a refused job can still run it.
    auto job =
        std::make_shared<std::pair<std::vector<TierReadItem>, TierReadDone>>(
            std::vector<TierReadItem>(items.begin(), items.end()),
            std::move(done));
    if (readers_->TrySubmit([this, ns, fingerprint, job] {
          ReadNow(ns, fingerprint, job->first, job->second);
        })) {
      return;
    }
    // Queue full (or shutting down): the caller reads itself, which also
    // slows it down to what the device serves.
    inline_reads_.fetch_add(1, std::memory_order_relaxed);
    ReadNow(ns, fingerprint, items, job->second);
    return;
  }
  ReadNow(ns, fingerprint, items, done);
}

void NvmeTier::ReadNow(const TierNamespace& ns, uint64_t fingerprint,
                       std::span<const TierReadItem> items,
                       const TierReadDone& done) {
  TIERKV_SYNC_POINT_CALLBACK(kBeforeRead, &items);
  done(store_->ReadBatch(ns.name, fingerprint, items));
}

void NvmeTier::Write(const TierNamespace& ns, uint64_t fingerprint,
                     std::span<const TierWriteItem> items,
                     Durability durability, TierWriteDone done) {
  done(store_->Write(ns.name, fingerprint, items, durability));
}

std::vector<Status> NvmeTier::Evict(const TierNamespace& ns,
                                    std::span<const SegmentKey> keys) {
  std::vector<Status> out;
  out.reserve(keys.size());
  for (const SegmentKey& key : keys)
    out.push_back(store_->Remove(ns.name, key));
  return out;
}

void NvmeTier::VisitCounters(TierCounterVisitor& v) const {
  const NvmeStoreStats s = store_->Stats();
  auto gauge = [&v](std::string_view name, uint64_t value) {
    v.Gauge(name, static_cast<double>(value));
  };
  gauge("capacity_bytes", s.capacity_bytes);
  gauge("used_bytes", s.bytes_used);
  gauge("allocated_bytes", s.bytes_allocated);
  gauge("segments", s.segments);
  v.Gauge("fragmentation", s.fragmentation);
  v.Flag("read_only", s.read_only);
  v.Flag("direct_io", s.direct_io);
  v.Flag("io_uring", s.io_uring);
  v.Counter("reads", s.reads);
  v.Counter("read_hits", s.read_hits);
  v.Counter("read_misses", s.read_misses);
  v.Counter("read_errors", s.read_errors);
  v.Counter("writes", s.writes);
  v.Counter("write_dedup", s.write_dedup);
  v.Counter("write_errors", s.write_errors);
  v.Counter("bounced_writes", s.bounced_writes);
  v.Counter("bounced_reads", s.bounced_reads);
  // Reader saturation: batches waiting for a reader now, and those a full
  // queue made their caller read.
  gauge("readers", readers_ ? readers_->threads() : 0);
  gauge("read_queue_depth", readers_ ? readers_->queue_depth() : 0);
  v.Counter("inline_reads", inline_reads_.load(std::memory_order_relaxed));
  v.Counter("evictions", s.evictions);
  v.Counter("removals", s.removals);
  v.Counter("checksum_failures", s.checksum_failures);
  v.Counter("checksum_reread_ok", s.checksum_reread_ok);
  v.Counter("read_bytes", s.device.read_bytes);
  v.Counter("written_bytes", s.device.write_bytes);
  v.Counter("device_syncs", s.device.flush_ops);
  // What start-up recovered from the catalog: fixed for the process.
  gauge("recovered_segments", s.recovery.recovered_segments);
  gauge("recovered_bytes", s.recovery.recovered_bytes);
  gauge("dropped_segments", s.recovery.dropped_segments);
  v.Flag("catalog_recreated", s.recovery.catalog_recreated);
}

void NvmeTier::VisitNamespaceCounters(const TierNamespace& ns,
                                      TierCounterVisitor& v) const {
  const auto all = store_->NamespaceStats();
  auto it = all.find(ns.name);
  if (it == all.end()) return;  // nothing stored and no quota
  const NvmeNamespaceStats& n = it->second;
  v.Gauge("quota_bytes", static_cast<double>(n.quota_bytes));
  v.Gauge("used_bytes", static_cast<double>(n.bytes_used));
  v.Gauge("allocated_bytes", static_cast<double>(n.bytes_allocated));
  v.Gauge("segments", static_cast<double>(n.segments));
  v.Counter("evictions", n.evictions);
}

}  // namespace tierkv::storage
