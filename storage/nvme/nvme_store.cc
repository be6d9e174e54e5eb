// NvmeStore: the NVMe tier's writes, reads, eviction and recovery (see
// nvme_store.h). Over 600 lines on purpose: every function here keeps the
// same locking and crash-safety invariants (index, LRU shares, allocator
// and pending catalog deletes under one mutex; data before catalog before
// acknowledgement), which read best in one place.
#include "storage/nvme/nvme_store.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "storage/storage_log.h"
#if defined(__x86_64__)
// libxxhash's runtime dispatch picks AVX2 / AVX-512 when the CPU has them
// (the build targets baseline x86-64, where the inlined XXH3 is SSE2 only,
// about half the speed); the hash value is the same either way.
#define XXH_DISPATCH_DISABLE_REPLACE
#include <xxh_x86dispatch.h>
#endif

#include "storage/nvme/uring_device.h"

namespace tierkv::storage {
namespace {

uint64_t Checksum(std::span<const std::byte> data) {
#if defined(__x86_64__)
  return XXH3_64bits_dispatch(data.data(), data.size());
#else
  return XXH3_64bits(data.data(), data.size());
#endif
}

// Any failure of the data path surfaces as IOError (DESIGN.md §6).
Status AsIoError(const Status& s) {
  if (s.ok() || s.code() == StatusCode::kIOError) return s;
  return Status::IOError(s.ToString());
}

}  // namespace

std::vector<std::span<std::byte>> NvmeStore::StageBounces(
    std::span<const uint64_t> sizes, std::vector<IoBuffer>* held) {
  std::vector<std::span<std::byte>> out(sizes.size());
  uint64_t rest = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) continue;
    IoBuffer b = device_->AllocateRegisteredIoBuffer(sizes[i]);
    if (b.empty()) {
      rest += sizes[i];
      continue;
    }
    out[i] = b.span().first(sizes[i]);
    held->push_back(std::move(b));
  }
  if (rest == 0) return out;
  IoBuffer staging = staging_.Take(rest);
  if (staging.empty()) return out;
  uint64_t at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0 || !out[i].empty()) continue;
    out[i] = staging.span().subspan(at, sizes[i]);
    at += sizes[i];
  }
  held->push_back(std::move(staging));
  return out;
}

std::string NvmeStore::DiagnoseMismatch(const CatalogEntry& entry,
                                        uint64_t got_checksum,
                                        bool* reread_ok) {
  *reread_ok = false;
  std::string what =
      fmt::format("length {}, expected xxh3 {:016x}, read {:016x}",
                  entry.length, entry.checksum, got_checksum);
  IoBuffer again = device_->AllocateIoBuffer(entry.length);
  if (again.empty()) return what + "; no memory to re-read";
  const Status s = device_->Read(entry.offset, again.span());
  if (!s.ok()) return fmt::format("{}; re-read failed: {}", what, s.ToString());
  const uint64_t second = Checksum(again.span().first(entry.length));
  if (second == entry.checksum) {
    *reread_ok = true;
    return what +
           "; a re-read verifies: the device holds the right bytes, "
           "the first read returned wrong ones";
  }
  return fmt::format(
      "{}; a re-read also fails ({:016x}{}): the device holds "
      "other bytes",
      what, second, second == got_checksum ? ", same as the first read" : "");
}

bool NvmeStore::IsBlockAligned(const void* address) const {
  return reinterpret_cast<uintptr_t>(address) % options_.block_size == 0;
}

Status NvmeStoreOptions::Validate() const {
  if (path.empty() && device == nullptr) {
    return Status::InvalidArgument(
        "nvme store: path is empty and no device given");
  }
  if (catalog_path.empty() && path.empty()) {
    return Status::InvalidArgument("nvme store: catalog_path is empty");
  }
  if (block_size < 512 || !std::has_single_bit(block_size)) {
    return Status::InvalidArgument(
        "nvme store: block_size must be a power of two >= 512");
  }
  if (capacity_bytes == 0 || capacity_bytes % block_size != 0) {
    return Status::InvalidArgument(
        "nvme store: capacity_bytes must be a non-zero multiple of block_size");
  }
  if (queue_depth == 0 || queue_depth > 4096) {
    return Status::InvalidArgument("nvme store: queue_depth must be 1..4096");
  }
  if (max_segment_bytes == 0) {
    return Status::InvalidArgument("nvme store: max_segment_bytes is 0");
  }
  if (read_batch_bounce_bytes == 0) {
    return Status::InvalidArgument("nvme store: read_batch_bounce_bytes is 0");
  }
  if (device != nullptr &&
      (device->size() < capacity_bytes || device->block_size() != block_size)) {
    return Status::InvalidArgument(fmt::format(
        "nvme store: device ({} bytes, block {}) does not fit capacity {} / "
        "block {}",
        device->size(), device->block_size(), capacity_bytes, block_size));
  }
  return Status::OK();
}

Result<std::unique_ptr<NvmeStore>> NvmeStore::Open(
    const NvmeStoreOptions& options) {
  TIERKV_RETURN_IF_ERROR(options.Validate());
  std::shared_ptr<Device> device = options.device;
  if (device == nullptr) {
    UringDeviceOptions dev;
    dev.path = options.path;
    dev.size_bytes = options.capacity_bytes;
    dev.use_direct_io = options.use_direct_io;
    dev.queue_depth = options.queue_depth;
    dev.block_size = options.block_size;
    dev.force_sync_io = options.force_sync_io;
    auto opened = UringDevice::Open(dev);
    if (!opened.ok()) return opened.status();
    device = std::move(opened).value();
  }

  NvmeCatalogOptions cat;
  cat.path = options.catalog_path.empty() ? options.path + ".catalog"
                                          : options.catalog_path;
  cat.sync_writes = options.sync_catalog;
  cat.create_if_missing = options.create_catalog_if_missing;
  cat.recreate_if_damaged = options.recreate_damaged_catalog;
  cat.resume_interval = options.catalog_resume_interval;
  auto catalog = NvmeCatalog::Open(cat);
  if (!catalog.ok()) return catalog.status();

  std::unique_ptr<NvmeStore> store(
      new NvmeStore(options, std::move(device), std::move(catalog).value()));
  TIERKV_RETURN_IF_ERROR(store->Recover());
  return store;
}

NvmeStore::NvmeStore(const NvmeStoreOptions& options,
                     std::shared_ptr<Device> device,
                     std::unique_ptr<NvmeCatalog> catalog)
    : options_(options),
      device_(std::move(device)),
      catalog_(std::move(catalog)),
      allocator_(options.capacity_bytes, options.block_size) {
  shared_.limit = options.capacity_bytes;  // no quotas yet
}

NvmeStore::~NvmeStore() {
  // Best effort: make queued deletes durable so a restart does not see
  // entries whose extents may already have been reused (their checksums
  // would catch it, but as corruption).
  Sync().PermitUncheckedError();  // deferred writes, e.g. demotions
  FlushPendingDeletes(UINT64_MAX).PermitUncheckedError();
}

Status NvmeStore::Recover() {
  recovery_.catalog_recreated = catalog_->recreated();
  struct Found {
    FullKey key;
    CatalogEntry entry;
  };
  std::vector<Found> found;
  auto scan = catalog_->ForEach(
      [&](uint32_t ns_id, const SegmentKey& key, const CatalogEntry& entry) {
        found.push_back({{ns_id, key}, entry});
      },
      /*delete_malformed=*/true);
  if (!scan.ok()) return scan.status();
  recovery_.malformed_entries = scan->malformed;

  // Newest first: when two entries overlap, the older one is stale.
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return a.entry.generation > b.entry.generation;
  });
  NvmeCatalog::Batch drop;
  uint64_t max_generation = 0;
  MutexLock lock(&mu_);
  for (const Found& f : found) {
    max_generation = std::max(max_generation, f.entry.generation);
    const Extent extent{f.entry.offset, allocator_.RoundUp(f.entry.length)};
    const bool sane = f.entry.length > 0 &&
                      f.entry.length <= options_.max_segment_bytes &&
                      f.entry.offset % options_.block_size == 0 &&
                      extent.length >= f.entry.length;  // no wrap-around
    if (!sane || !allocator_.Reserve(extent)) {
      ++recovery_.dropped_segments;
      drop.Delete(f.key.ns_id, f.key.key);
      continue;
    }
    auto segment = std::make_shared<Segment>();
    segment->key = f.key;
    segment->entry = f.entry;
    segment->extent = extent;
    // Generation order: the newest is the most recently used. Quotas are
    // set after Open and move their namespaces' segments then.
    Share& share = ShareOfLocked(f.key.ns_id);
    LinkLocked(segment, share, /*used_at=*/f.entry.generation);
    share.allocated += extent.length;
    index_.emplace(f.key, std::move(segment));
    ++recovery_.recovered_segments;
    recovery_.recovered_bytes += f.entry.length;
    bytes_used_ += f.entry.length;
  }
  next_generation_ = max_generation + 1;
  clock_ = max_generation;  // later uses rank after every recovered one
  if (!drop.empty()) {
    Status s = catalog_->Write(drop);
    if (!s.ok()) {
      // Not fatal: the entries are not indexed, and the next Open drops
      // them again.
      StorageLog().warn(
          "tierkv nvme store: cannot delete {} dropped entries: {}",
          drop.count(), s.ToString());
    }
  }
  if (recovery_.dropped_segments > 0 || recovery_.malformed_entries > 0) {
    StorageLog().warn(
        "tierkv nvme store: recovery dropped {} overlapping/out-of-range and "
        "{} malformed catalog entries",
        recovery_.dropped_segments, recovery_.malformed_entries);
  }
  return Status::OK();
}

NvmeStore::Share& NvmeStore::ShareOfLocked(uint32_t ns_id) {
  auto it = quota_shares_.find(ns_id);
  return it == quota_shares_.end() ? shared_ : *it->second;
}

std::optional<Extent> NvmeStore::AllocateLocked(uint64_t length, Share& share) {
  const uint64_t rounded = allocator_.RoundUp(length);
  if (rounded > share.limit) return std::nullopt;
  while (share.allocated + rounded > share.limit) {
    if (!EvictOneLocked(share)) return std::nullopt;
  }
  // Within its limit the share's bytes are free on the device (the limits
  // add up to at most the capacity), unless pinned or fragmented: evict
  // more of its own then.
  for (;;) {
    if (auto extent = allocator_.Allocate(length)) {
      share.allocated += extent->length;
      return extent;
    }
    if (!EvictOneLocked(share)) return std::nullopt;
  }
}

void NvmeStore::FreeAllocatedLocked(const Extent& extent, Share& share) {
  allocator_.Free(extent);
  share.allocated -= extent.length;
}

bool NvmeStore::EvictOneLocked(Share& share) {
  // Segments being read are not linked: the policy never offers them.
  PolicyState* state = share.policy->Victim();
  if (state == nullptr) return false;
  share.policy->Unlink(*state);
  share.policy->Evicted(*state);
  Segment* victim = static_cast<SegmentPolicyState*>(state)->segment;
  ++usage_[victim->key.ns_id].evictions;
  auto found = index_.find(victim->key);
  UnlinkLocked(found->second, /*delete_entry=*/true);
  ++counters_.evictions;
  return true;
}

void NvmeStore::LinkLocked(const std::shared_ptr<Segment>& segment,
                           Share& share, uint64_t used_at) {
  segment->share = &share;
  SegmentPolicyState& state = segment->policy;
  state.segment = segment.get();
  state.key = segment->key.key;
  state.bytes = segment->extent.length;
  share.policy->Admit(state, used_at);
  share.policy->Link(state, used_at, LinkAt::kLastUse);
  NamespaceUsage& u = usage_[segment->key.ns_id];
  ++u.segments;
  u.bytes_used += segment->entry.length;
  u.bytes_allocated += segment->extent.length;
}

void NvmeStore::TouchLocked(Segment& segment) {
  segment.share->policy->Use(segment.policy, ++clock_);
}

void NvmeStore::AddReaderLocked(Segment& segment) {
  if (segment.readers++ == 0) segment.share->policy->Unlink(segment.policy);
}

void NvmeStore::UnlinkLocked(const std::shared_ptr<Segment>& segment,
                             bool delete_entry) {
  std::shared_ptr<Segment> keep = segment;  // index_ may hold the only ref
  keep->live = false;
  keep->share->policy->Unlink(keep->policy);
  keep->share->allocated -= keep->extent.length;
  NamespaceUsage& u = usage_[keep->key.ns_id];
  --u.segments;
  u.bytes_used -= keep->entry.length;
  u.bytes_allocated -= keep->extent.length;
  bytes_used_ -= keep->entry.length;
  // A write of the same key in flight will supersede the entry with its own
  // put (or queue a delete if it fails), so a delete here could only race
  // with that put and erase the newer entry.
  if (delete_entry && !writing_.contains(keep->key)) {
    pending_deletes_.push_back(keep->key);
    ++delete_seq_;
  }
  index_.erase(keep->key);
  if (keep->readers == 0) allocator_.Free(keep->extent);
}

void NvmeStore::ReleaseReaderLocked(const std::shared_ptr<Segment>& segment) {
  if (--segment->readers != 0) return;
  if (segment->live) {  // evictable again, as of its read
    segment->share->policy->Link(segment->policy, clock_, LinkAt::kLastUse);
  } else {
    allocator_.Free(segment->extent);
  }
}

Status NvmeStore::Sync() {
  MutexLock sync_lock(&sync_mu_);
  uint64_t upto = 0;
  {
    MutexLock lock(&mu_);
    if (synced_seq_ >= deferred_seq_) return Status::OK();
    upto = deferred_seq_;  // published before this flush starts: covered
  }
  Status s = options_.sync_data ? AsIoError(device_->Flush()) : Status::OK();
  if (s.ok()) s = catalog_->SyncWal();
  if (s.ok()) {
    MutexLock lock(&mu_);
    synced_seq_ = std::max(synced_seq_, upto);
  }
  return s;
}

bool NvmeStore::HasUnsyncedWrites() const {
  MutexLock lock(&mu_);
  return synced_seq_ < deferred_seq_;
}

Status NvmeStore::FlushPendingDeletes(uint64_t upto_seq, bool sync) {
  MutexLock flush_lock(&flush_mu_);
  std::vector<FullKey> keys;
  uint64_t seq = 0;
  {
    MutexLock lock(&mu_);
    if (durable_delete_seq_ >= std::min(upto_seq, delete_seq_))
      return Status::OK();
    keys.swap(pending_deletes_);
    seq = delete_seq_;
  }
  NvmeCatalog::Batch batch;
  for (const FullKey& k : keys) batch.Delete(k.ns_id, k.key);
  Status s = catalog_->Write(batch, sync);
  MutexLock lock(&mu_);
  if (s.ok()) {
    durable_delete_seq_ = seq;
  } else {
    pending_deletes_.insert(pending_deletes_.end(), keys.begin(), keys.end());
  }
  return s;
}

Status NvmeStore::OpenNamespace(std::string_view ns) {
  return AsIoError(catalog_->GetOrCreateNamespace(ns).status());
}

std::vector<Status> NvmeStore::Write(std::string_view ns,
                                     uint64_t layout_fingerprint,
                                     std::span<const NvmeWriteItem> items,
                                     Durability durability) {
  const bool durable = durability == Durability::kDurable;
  std::vector<Status> results(items.size());
  // A read-only catalog (full disk): refuse before writing any data.
  const Status writable = catalog_->TryWritable();
  Result<uint32_t> ns_id = writable.ok() ? catalog_->GetOrCreateNamespace(ns)
                                         : Result<uint32_t>(writable);
  if (!ns_id.ok()) {
    std::fill(results.begin(), results.end(), AsIoError(ns_id.status()));
    MutexLock lock(&mu_);
    counters_.write_errors += items.size();
    return results;
  }

  struct Planned {
    size_t item;
    FullKey key;
    Extent extent;
    Share* share;  // charged for `extent`
    CatalogEntry entry;
  };
  std::vector<Planned> planned;
  uint64_t needs_seq = 0;
  {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < items.size(); ++i) {
      const NvmeWriteItem& item = items[i];
      const uint64_t length = item.data.size();
      if (length == 0 || length > options_.max_segment_bytes ||
          length > options_.capacity_bytes) {
        results[i] = Status::InvalidArgument(fmt::format(
            "nvme store: segment size {} outside [1, {}]", length,
            std::min(options_.max_segment_bytes, options_.capacity_bytes)));
        continue;
      }
      const FullKey key{*ns_id, item.key};
      if (writing_.contains(key)) {
        results[i] =
            Status::Busy("nvme store: a write of this segment is in flight");
        continue;
      }
      if (auto it = index_.find(key); it != index_.end()) {
        Segment& existing = *it->second;
        if (existing.entry.layout_fingerprint == layout_fingerprint &&
            existing.entry.length == length) {
          TouchLocked(existing);
          results[i] =
              Status::AlreadyExists("nvme store: segment already stored");
          ++counters_.write_dedup;
          continue;
        }
      }
      Share& share = ShareOfLocked(*ns_id);
      std::optional<Extent> extent = AllocateLocked(length, share);
      if (!extent) {
        results[i] = Status::ResourceExhausted(
            &share == &shared_
                ? "nvme store: no space even after evicting every unpinned "
                  "segment"
                : "nvme store: no room in the namespace's NVMe quota (its "
                  "segments are being read, or this one exceeds it)");
        continue;
      }
      writing_.insert(key);
      CatalogEntry entry{extent->offset, length, 0, layout_fingerprint,
                         next_generation_++};
      planned.push_back({i, key, *extent, &share, entry});
    }
    needs_seq = delete_seq_;
  }

  // Extents may have come from segments whose catalog deletes are still
  // queued: make those durable before overwriting the bytes.
  Status common =
      planned.empty() ? Status::OK() : FlushPendingDeletes(needs_seq, durable);

  uint64_t covers_deferred = 0;  // deferred_seq_ before a durable flush

  // Data first: in place where the item is one block-aligned extent,
  // else through a bounce copy (StageBounces: registered memory, then one
  // staging region for the batch; staging_pool.h says why).
  std::vector<IoRequest> requests;
  std::vector<size_t> request_of;  // planned index per request
  std::vector<IoBuffer> held;      // the bounces, until the batch is done
  uint64_t bounced = 0;
  if (common.ok()) {
    std::vector<uint64_t> bounce_sizes(planned.size(), 0);
    for (size_t p = 0; p < planned.size(); ++p) {
      const Planned& plan = planned[p];
      const std::span<const std::byte> data = items[plan.item].data;
      const uint64_t readable =
          std::max<uint64_t>(data.size(), items[plan.item].readable_bytes);
      if (readable < plan.extent.length || !IsBlockAligned(data.data())) {
        bounce_sizes[p] = plan.extent.length;
        ++bounced;
      }
    }
    const std::vector<std::span<std::byte>> bounces =
        StageBounces(bounce_sizes, &held);
    requests.reserve(planned.size());
    for (size_t p = 0; p < planned.size(); ++p) {
      Planned& plan = planned[p];
      std::span<const std::byte> data = items[plan.item].data;
      if (bounce_sizes[p] == 0) {
        // Written in place, whole blocks: the segment and, past its end,
        // the caller's readable padding. IoRequest carries one mutable
        // span for both directions; a write only reads from it, so nothing
        // is stored through the dropped const.
        requests.push_back(IoRequest{
            IoOp::kWrite,
            plan.extent.offset,
            {const_cast<std::byte*>(data.data()), plan.extent.length}});
        request_of.push_back(p);
        continue;
      }
      const std::span<std::byte> bounce = bounces[p];
      if (bounce.empty()) {
        results[plan.item] =
            Status::ResourceExhausted("nvme store: out of memory");
        continue;
      }
      std::memcpy(bounce.data(), data.data(), data.size());
      std::memset(bounce.data() + data.size(), 0, bounce.size() - data.size());
      requests.push_back(IoRequest{IoOp::kWrite, plan.extent.offset, bounce});
      request_of.push_back(p);
    }
    // Checksum each item while the rest of the batch is in flight; a
    // write only reads `data`, so hashing it after the IO is the same.
    device_->SubmitBatch(requests, [&](size_t r) {
      if (!requests[r].status.ok()) return;
      Planned& plan = planned[request_of[r]];
      plan.entry.checksum = Checksum(items[plan.item].data);
    });
    bool any_written = false;
    for (size_t r = 0; r < requests.size(); ++r) {
      if (!requests[r].status.ok()) {
        results[planned[request_of[r]].item] = AsIoError(requests[r].status);
      } else {
        any_written = true;
      }
    }
    if (any_written && durable) {
      // A durable write's flush also covers the deferred writes published
      // before it: Sync has nothing to do for them afterwards.
      {
        MutexLock lock(&mu_);
        covers_deferred = deferred_seq_;
      }
      if (options_.sync_data) common = AsIoError(device_->Flush());
    }
  }

  // Then the catalog, in one batch.
  if (common.ok()) {
    NvmeCatalog::Batch batch;
    for (const Planned& plan : planned) {
      if (results[plan.item].ok())
        batch.Put(plan.key.ns_id, plan.key.key, plan.entry);
    }
    common = AsIoError(catalog_->Write(batch, durable));
  }

  // Then publish (or roll back).
  MutexLock lock(&mu_);
  if (durable && common.ok()) {
    synced_seq_ = std::max(synced_seq_, covers_deferred);
  }
  bool published_deferred = false;
  for (Planned& plan : planned) {
    writing_.erase(plan.key);
    Status& result = results[plan.item];
    if (result.ok() && !common.ok()) result = common;
    if (!result.ok()) {
      FreeAllocatedLocked(plan.extent, *plan.share);
      if (!index_.contains(plan.key)) {
        // An older entry of this key may have been unlinked while we wrote
        // (its delete skipped, see UnlinkLocked): retire it now.
        pending_deletes_.push_back(plan.key);
        ++delete_seq_;
      }
      continue;
    }
    if (auto it = index_.find(plan.key); it != index_.end()) {
      // Replaced (other layout or size): the put above superseded its entry.
      UnlinkLocked(it->second, /*delete_entry=*/false);
    }
    auto segment = std::make_shared<Segment>();
    segment->key = plan.key;
    segment->entry = plan.entry;
    segment->extent = plan.extent;
    LinkLocked(segment, *plan.share, ++clock_);  // charged already
    bytes_used_ += plan.entry.length;
    index_.emplace(plan.key, std::move(segment));
    published_deferred |= !durable;
  }
  if (published_deferred) ++deferred_seq_;  // not durable until a Sync
  counters_.bounced_writes += bounced;
  for (const Status& s : results) {
    if (s.ok()) {
      ++counters_.writes;
    } else if (!s.IsAlreadyExists()) {
      ++counters_.write_errors;
    }
  }
  return results;
}

Result<uint64_t> NvmeStore::Read(std::string_view ns, const SegmentKey& key,
                                 uint64_t layout_fingerprint,
                                 std::span<std::byte> dst) {
  const NvmeReadItem item{key, dst};
  return std::move(ReadBatch(ns, layout_fingerprint, {&item, 1})[0]);
}

std::vector<Result<uint64_t>> NvmeStore::ReadBatch(
    std::string_view ns, uint64_t layout_fingerprint,
    std::span<const NvmeReadItem> items) {
  std::vector<Result<uint64_t>> results(items.size(),
                                        Result<uint64_t>(uint64_t{0}));
  auto ns_id = catalog_->FindNamespace(ns);

  // One pinned segment of the current round.
  struct PendingRead {
    size_t item;
    std::shared_ptr<Segment> segment;  // pinned (readers > 0) until released
    CatalogEntry entry;                // immutable once published
    std::span<std::byte> landing;      // item.dst or bounce; rounded length
    bool bounced = false;              // landing is staged, not item.dst
    size_t request = SIZE_MAX;         // index into `requests`, if submitted
  };
  std::vector<PendingRead> round;
  std::vector<IoRequest> requests;
  bool dropped_corrupt = false;
  size_t next = 0;
  while (next < items.size()) {
    // 1. Look up and pin as many items as the bounce budget allows.
    round.clear();
    uint64_t bounce_bytes = 0;
    {
      MutexLock lock(&mu_);
      for (; next < items.size(); ++next) {
        const NvmeReadItem& item = items[next];
        std::shared_ptr<Segment> segment;
        if (ns_id.ok()) {
          if (auto it = index_.find(FullKey{*ns_id, item.key});
              it != index_.end()) {
            segment = it->second;
          }
        }
        const bool hit =
            segment != nullptr &&
            segment->entry.layout_fingerprint == layout_fingerprint;
        const uint64_t rounded = hit ? segment->extent.length : 0;
        const bool in_place = hit && item.dst.size() >= rounded &&
                              IsBlockAligned(item.dst.data());
        if (hit && !in_place && !round.empty() &&
            bounce_bytes + rounded > options_.read_batch_bounce_bytes) {
          break;  // next round
        }
        ++counters_.reads;
        if (!hit) {
          ++counters_.read_misses;
          results[next] = Status::NotFound("nvme store: segment not stored");
          continue;
        }
        if (item.dst.size() < segment->entry.length) {
          results[next] = Status::InvalidArgument(fmt::format(
              "nvme store: destination holds {} bytes, segment has {}",
              item.dst.size(), segment->entry.length));
          continue;
        }
        TouchLocked(*segment);
        AddReaderLocked(*segment);  // pins the extent until released
        PendingRead pending{next, segment, segment->entry, {}};
        if (in_place) {
          pending.landing = item.dst.first(rounded);
        } else {
          bounce_bytes += rounded;
          ++counters_.bounced_reads;
        }
        round.push_back(std::move(pending));
      }
    }

    // 2. Stage bounce buffers (StageBounces) and read the whole round in
    //    one device batch.
    requests.clear();
    std::vector<IoBuffer> held;  // the round's bounces
    std::vector<uint64_t> bounce_sizes(round.size(), 0);
    for (size_t r = 0; r < round.size(); ++r) {
      if (round[r].landing.empty()) {
        bounce_sizes[r] = round[r].segment->extent.length;
      }
    }
    const std::vector<std::span<std::byte>> bounces =
        StageBounces(bounce_sizes, &held);
    for (size_t r = 0; r < round.size(); ++r) {
      PendingRead& p = round[r];
      if (bounce_sizes[r] != 0) {
        if (bounces[r].empty()) continue;  // reported below
        p.landing = bounces[r];
        p.bounced = true;
      }
      p.request = requests.size();
      requests.push_back(IoRequest{IoOp::kRead, p.entry.offset, p.landing});
    }
    // 3. Verify and copy out of bounce buffers as each IO completes, while
    //    the rest of the round is still in flight.
    std::vector<size_t> pending_of(requests.size());
    for (size_t r = 0; r < round.size(); ++r) {
      if (round[r].request != SIZE_MAX) pending_of[round[r].request] = r;
    }
    std::vector<bool> corrupt(round.size(), false);
    std::vector<uint64_t> got_checksum;  // per round item; only on mismatch
    device_->SubmitBatch(requests, [&](size_t q) {
      const size_t r = pending_of[q];
      PendingRead& p = round[r];
      Result<uint64_t>& result = results[p.item];
      if (!requests[q].status.ok()) {
        result = AsIoError(requests[q].status);
        return;
      }
      std::span<std::byte> dst = items[p.item].dst;
      if (const uint64_t got = Checksum(p.landing.first(p.entry.length));
          got != p.entry.checksum) {
        corrupt[r] = true;
        got_checksum.resize(round.size(), 0);
        got_checksum[r] = got;
        // Never leave bytes that failed verification where a caller that
        // ignores the status might use them.
        if (!p.bounced) std::memset(dst.data(), 0, p.entry.length);
        result =
            Status::NotFound("nvme store: checksum mismatch (segment dropped)");
        return;
      }
      if (p.bounced) std::memcpy(dst.data(), p.landing.data(), p.entry.length);
      result = p.entry.length;
    });
    for (const PendingRead& p : round) {
      if (p.request == SIZE_MAX) {
        results[p.item] =
            Status::ResourceExhausted("nvme store: out of memory");
      }
    }
    // Diagnostics (cold path): re-read each extent that failed verification
    // once, synchronously, while it is still pinned. If the second read
    // verifies, the bytes on the device are right and the first read
    // returned wrong bytes (a read-path problem); if it fails again, the
    // device holds other bytes (an acknowledged write was lost or
    // overwritten). Either way the item stays a miss and is dropped below.
    std::vector<std::string> diagnosis;
    uint64_t reread_ok = 0;
    if (!got_checksum.empty()) {
      diagnosis.resize(round.size());
      for (size_t r = 0; r < round.size(); ++r) {
        bool ok = false;
        if (corrupt[r])
          diagnosis[r] = DiagnoseMismatch(round[r].entry, got_checksum[r], &ok);
        reread_ok += ok;
      }
    }

    // 4. Unpin and count.
    MutexLock lock(&mu_);
    counters_.checksum_reread_ok += reread_ok;
    for (size_t r = 0; r < round.size(); ++r) {
      PendingRead& p = round[r];
      ReleaseReaderLocked(p.segment);
      if (corrupt[r]) {
        ++counters_.checksum_failures;
        ++counters_.read_misses;
        if (p.segment->live) {
          UnlinkLocked(p.segment, /*delete_entry=*/true);
          dropped_corrupt = true;
        }
        StorageLog().warn(
            "tierkv nvme store: checksum mismatch for {} at offset {} ({})",
            items[p.item].key.ToString(), p.entry.offset, diagnosis[r]);
      } else if (results[p.item].ok()) {
        ++counters_.read_hits;
      } else {
        ++counters_.read_errors;
      }
    }
  }
  if (dropped_corrupt) {
    // Deletes are otherwise deferred until their space is reused: a crash
    // before that would bring back the entry of bytes known to be wrong,
    // and a Put of the same content after the restart would find it
    // "stored" (dedup below DRAM) and skip the write that repairs it.
    // Rare (a failed checksum), so one synced catalog write is cheap.
    FlushPendingDeletes(UINT64_MAX).PermitUncheckedError();
  }
  return results;
}

std::optional<uint64_t> NvmeStore::Lookup(std::string_view ns,
                                          const SegmentKey& key,
                                          uint64_t layout_fingerprint) const {
  const uint64_t bytes = LookupBatch(ns, layout_fingerprint, {&key, 1})[0];
  if (bytes == 0) return std::nullopt;
  return bytes;
}

std::vector<uint64_t> NvmeStore::LookupBatch(
    std::string_view ns, uint64_t layout_fingerprint,
    std::span<const SegmentKey> keys) const {
  std::vector<uint64_t> out(keys.size(), 0);
  auto ns_id = catalog_->FindNamespace(ns);
  if (!ns_id.ok()) return out;
  MutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = index_.find(FullKey{*ns_id, keys[i]});
    if (it != index_.end() &&
        it->second->entry.layout_fingerprint == layout_fingerprint) {
      out[i] = it->second->entry.length;
    }
  }
  return out;
}

Status NvmeStore::Remove(std::string_view ns, const SegmentKey& key) {
  auto ns_id = catalog_->FindNamespace(ns);
  if (!ns_id.ok()) return Status::NotFound("nvme store: unknown namespace");
  uint64_t needs_seq = 0;
  {
    MutexLock lock(&mu_);
    auto it = index_.find(FullKey{*ns_id, key});
    if (it == index_.end())
      return Status::NotFound("nvme store: segment not stored");
    UnlinkLocked(it->second, /*delete_entry=*/true);
    ++counters_.removals;
    needs_seq = delete_seq_;
  }
  return FlushPendingDeletes(needs_seq);
}

void NvmeStore::SetNamespaceSchedule(std::string_view ns, ScheduleTable table) {
  auto ns_id = catalog_->FindNamespace(ns);
  if (!ns_id.ok()) return;  // nothing stored, no quota
  MutexLock lock(&mu_);
  auto it = quota_shares_.find(*ns_id);
  if (it == quota_shares_.end()) return;
  Share& share = *it->second;
  for (const SegmentKey& key : share.policy->SetSchedule(std::move(table))) {
    auto s = index_.find(FullKey{*ns_id, key});
    if (s == index_.end() || s->second->share != &share) continue;
    share.policy->Rerank(s->second->policy);
  }
}

Status NvmeStore::SetNamespaceQuota(std::string_view ns, uint64_t bytes,
                                    EvictionPolicyKind policy) {
  if (bytes == 0 || bytes % options_.block_size != 0) {
    return Status::InvalidArgument(fmt::format(
        "nvme store: quota of {} must be a positive multiple of {} bytes", ns,
        options_.block_size));
  }
  auto ns_id = catalog_->GetOrCreateNamespace(ns);
  if (!ns_id.ok()) return AsIoError(ns_id.status());
  uint64_t needs_seq = 0;
  {
    MutexLock lock(&mu_);
    uint64_t others = 0;
    for (const auto& [id, share] : quota_shares_) {
      if (id != *ns_id) others += share->limit;
    }
    if (others + bytes > options_.capacity_bytes) {
      return Status::InvalidArgument(fmt::format(
          "nvme store: NVMe quotas would total {} bytes, more than the "
          "tier's {}",
          others + bytes, options_.capacity_bytes));
    }
    std::unique_ptr<Share>& share = quota_shares_[*ns_id];
    if (!share) {
      // Its segments leave the shared rest, keeping their last uses (and
      // so their order); those being read join when released.
      // Linked oldest first, each goes in at the newest end: O(1) apiece.
      share = std::make_unique<Share>();
      share->policy = NewEvictionPolicy(policy);
      std::vector<Segment*> evictable;
      for (const auto& [key, segment] : index_) {
        if (key.ns_id != *ns_id) continue;
        if (segment->policy.linked) evictable.push_back(segment.get());
        shared_.policy->Unlink(segment->policy);
        segment->share = share.get();
        shared_.allocated -= segment->extent.length;
        share->allocated += segment->extent.length;
      }
      std::sort(evictable.begin(), evictable.end(),
                [](const Segment* a, const Segment* b) {
                  return a->policy.last_use < b->policy.last_use;
                });
      for (Segment* segment : evictable) {
        share->policy->Link(segment->policy, clock_, LinkAt::kLastUse);
      }
    }
    share->limit = bytes;
    shared_.limit = options_.capacity_bytes - others - bytes;
    // A share over its new limit gives up its least recently used.
    while (share->allocated > share->limit && EvictOneLocked(*share)) {
    }
    while (shared_.allocated > shared_.limit && EvictOneLocked(shared_)) {
    }
    needs_seq = delete_seq_;
  }
  return FlushPendingDeletes(needs_seq);
}

std::map<std::string, NvmeNamespaceStats, std::less<>>
NvmeStore::NamespaceStats() const {
  const auto names = catalog_->Namespaces();
  std::map<std::string, NvmeNamespaceStats, std::less<>> out;
  MutexLock lock(&mu_);
  for (const auto& [name, id] : names) {
    NvmeNamespaceStats& s = out[name];
    if (auto q = quota_shares_.find(id); q != quota_shares_.end()) {
      s.quota_bytes = q->second->limit;
    }
    if (auto u = usage_.find(id); u != usage_.end()) {
      s.segments = u->second.segments;
      s.bytes_used = u->second.bytes_used;
      s.bytes_allocated = u->second.bytes_allocated;
      s.evictions = u->second.evictions;
    }
  }
  return out;
}

std::optional<CatalogEntry> NvmeStore::TEST_Entry(std::string_view ns,
                                                  const SegmentKey& key) const {
  auto ns_id = catalog_->FindNamespace(ns);
  if (!ns_id.ok()) return std::nullopt;
  MutexLock lock(&mu_);
  auto it = index_.find(FullKey{*ns_id, key});
  if (it == index_.end()) return std::nullopt;
  return it->second->entry;
}

NvmeStoreStats NvmeStore::Stats() const {
  NvmeStoreStats s;
  {
    MutexLock lock(&mu_);
    s = counters_;
    s.segments = index_.size();
    s.bytes_used = bytes_used_;
    const ExtentAllocatorStats alloc = allocator_.Stats();
    s.bytes_allocated = alloc.allocated_bytes;
    s.capacity_bytes = alloc.capacity_bytes;
    s.fragmentation = alloc.fragmentation();
    s.pending_catalog_deletes = pending_deletes_.size();
  }
  s.namespaces = catalog_->Namespaces().size();
  s.read_only = catalog_->read_only();
  s.read_only_entries = catalog_->read_only_entries();
  s.recovery = recovery_;
  s.device = device_->Stats();
  auto* uring = dynamic_cast<UringDevice*>(device_.get());
  s.direct_io = uring != nullptr && uring->direct_io();
  s.io_uring = uring != nullptr && uring->backend() == IoBackend::kIoUring;
  return s;
}

}  // namespace tierkv::storage
