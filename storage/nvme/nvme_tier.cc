// NvmeTier: NvmeStore's calls behind the Tier interface (see nvme_tier.h).
#include "storage/nvme/nvme_tier.h"

#include "storage/storage_log.h"

namespace tierkv::storage {

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
  v.Gauge("capacity_bytes", static_cast<double>(s.capacity_bytes));
  v.Gauge("used_bytes", static_cast<double>(s.bytes_used));
  v.Gauge("allocated_bytes", static_cast<double>(s.bytes_allocated));
  v.Gauge("segments", static_cast<double>(s.segments));
  v.Gauge("fragmentation", s.fragmentation);
  v.Gauge("read_only", s.read_only ? 1 : 0);
  v.Counter("reads", s.reads);
  v.Counter("read_hits", s.read_hits);
  v.Counter("read_misses", s.read_misses);
  v.Counter("read_errors", s.read_errors);
  v.Counter("writes", s.writes);
  v.Counter("write_dedup", s.write_dedup);
  v.Counter("write_errors", s.write_errors);
  v.Counter("evictions", s.evictions);
  v.Counter("removals", s.removals);
  v.Counter("checksum_failures", s.checksum_failures);
}

}  // namespace tierkv::storage
