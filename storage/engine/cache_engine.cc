// CacheEngine: matching, leases, dedup, promotion and persistence over the
// host and NVMe tiers (see cache_engine.h).
#include "storage/engine/cache_engine.h"

#include <fmt/format.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <optional>
#include <thread>
#include <tuple>
#include <unordered_set>

#include "common/load_ticket.h"
#include "storage/engine/stream_copy.h"
#include "storage/nvme/nvme_tier.h"
#include "storage/storage_log.h"

namespace tierkv::storage {

Status CacheEngineOptions::Validate() const {
  if (lease_ttl.count() <= 0 || max_pin_ttl.count() <= 0) {
    return Status::InvalidArgument("lease_ttl and max_pin_ttl must be > 0");
  }
  if (workers == 0 || workers > 256) {
    return Status::InvalidArgument("engine workers must be in [1, 256]");
  }
  if (transfer_lanes == 0 || transfer_lanes > 64) {
    return Status::InvalidArgument("engine transfer_lanes must be in [1, 64]");
  }
  if (worker_queue == 0) {
    return Status::InvalidArgument("engine worker_queue must be > 0");
  }
  if (clock == nullptr) return Status::InvalidArgument("engine clock is null");
  if (hbm_pool.bytes > 0 && device == nullptr) {
    return Status::InvalidArgument("an HBM pool needs its device backend");
  }
  return mover.Validate();
}

std::shared_ptr<const LayoutSpec> EngineNamespace::layout() const {
  MutexLock lock(&layout_mu_);
  return layout_;
}

CacheEngine::CacheEngine(const CacheEngineOptions& options,
                         const NvmeStore* nvme,
                         std::unique_ptr<TierChain> chain)
    : options_(options), nvme_(nvme), chain_(std::move(chain)) {}

Result<std::unique_ptr<CacheEngine>> CacheEngine::Open(
    const CacheEngineOptions& options, std::vector<NamespaceOptions> spaces,
    NvmeStore* nvme) {
  std::vector<std::unique_ptr<Tier>> below;
  if (nvme) below.push_back(std::make_unique<NvmeTier>(nvme));
  return Open(options, std::move(spaces), std::move(below), nvme);
}

Result<std::unique_ptr<CacheEngine>> CacheEngine::Open(
    const CacheEngineOptions& options, std::vector<NamespaceOptions> spaces,
    std::vector<std::unique_ptr<Tier>> below, const NvmeStore* nvme) {
  TIERKV_RETURN_IF_ERROR(options.Validate());
  auto chain = TierChain::Create(std::move(below), options.placement);
  if (!chain.ok()) return chain.status();
  std::unique_ptr<CacheEngine> engine(
      new CacheEngine(options, nvme, std::move(chain).value()));
  TierChain* const tiers_below = engine->chain_.get();
  std::unordered_set<std::string> names;
  std::vector<const NamespaceTiers*> pairs;
  std::vector<uint64_t> hbm_quotas;
  for (NamespaceOptions& o : spaces) {
    hbm_quotas.push_back(o.hbm_quota_bytes);
    if (!names.insert(o.host.name).second) {
      return Status::InvalidArgument("duplicate namespace '" + o.host.name +
                                     "'");
    }
    auto host = HostTier::Create(o.host);
    if (!host.ok()) {
      return Status(host.status().code(),
                    "namespace '" + o.host.name +
                        "': " + std::string(host.status().message()));
    }
    const TierNamespace tns{.id = static_cast<uint32_t>(engine->spaces_.size()),
                            .name = o.host.name};
    if (Status s = tiers_below->OpenNamespace(tns); !s.ok()) {
      return Status(s.code(), "namespace '" + o.host.name +
                                  "': cannot register it below DRAM: " +
                                  std::string(s.message()));
    }
    auto ns = std::make_unique<EngineNamespace>();
    ns->host_ = std::move(host).value();
    ns->index_ = tns.id;
    ns->tiers_ = NamespaceTiers{
        .ns = tns,
        .host = ns->host_.get(),
        .policy = tiers_below->empty() ? WritePolicy::kNone : o.write_policy,
        .fingerprint = &ns->fingerprint_,
    };
    pairs.push_back(&ns->tiers_);
    engine->spaces_.push_back(std::move(ns));
  }
  if (options.hbm_pool.bytes > 0) {
    engine->hbm_ = std::make_unique<HbmTier>(options.hbm_pool.bytes,
                                             std::move(hbm_quotas));
  }
  if (options.device != nullptr) {
    engine->PinHostArenas();
    if (options.device_staging_bytes > 0) {
      auto staging =
          PinnedStaging::Create(*options.device, options.device_staging_bytes);
      if (staging.ok()) {
        engine->staging_ = std::move(staging).value();
      } else {
        StorageLog().warn(
            "no pinned staging for NVMe reads into device pools ({}): they "
            "go through pageable memory",
            staging.status().ToString());
      }
    }
    MutexLock lock(&engine->device_streams_mu_);
    auto& free = engine->free_device_streams_[options.device];
    for (StreamId id = 0; id < options.device->streams(); ++id) {
      free.push_back(id);
    }
  }
  engine->leases_ =
      std::make_unique<LeaseTable>(options.clock, options.lease_limits);
  if (!tiers_below->empty()) {
    engine->mover_ =
        std::make_unique<TierMover>(options.mover, tiers_below, pairs);
  }
  // Transfer lanes read the tiers below from these threads: each sets up
  // its io_uring ring now rather than in the first Load it serves (a few
  // ms, up to ~20 ms measured, on the critical path of that Load's layer
  // 0).
  std::function<void()> prepare_thread;
  if (!tiers_below->empty()) {
    prepare_thread = [tiers_below] { tiers_below->PrepareThisThread(); };
  }
  engine->workers_ = std::make_unique<WorkerPool>(
      options.workers, options.worker_queue, std::move(prepare_thread));
  return engine;
}

uint64_t CacheEngine::PersistDirty(
    std::chrono::steady_clock::time_point deadline) {
  return mover_ ? mover_->PersistDirty(deadline) : 0;
}

// Host arenas registered with the device backend (cudaHostRegister), so
// copies between them and device pools are DMA at bus speed rather than
// staged through the driver's pageable buffers. A refusal (e.g. the
// memlock limit) costs speed only: said once per namespace.
void CacheEngine::PinHostArenas() {
  for (const auto& ns : spaces_) {
    const HostArena& arena = ns->host_->arena();
    Status s = options_.device->RegisterHost({arena.base(), arena.size()});
    ns->pinned_ = s.ok();
    if (s.ok()) {
      StorageLog().info(
          "namespace '{}': {} MiB of host DRAM pinned for the device",
          ns->name(), arena.size() >> 20);
    } else {
      StorageLog().warn(
          "namespace '{}': host DRAM not pinned for the device ({}); copies "
          "to device pools go through staging buffers",
          ns->name(), s.ToString());
    }
  }
}

CacheEngine::~CacheEngine() {
  workers_.reset();  // queued calls complete while everything still exists
  // Memory behind a timed-out device wait goes back once its copies are
  // over; copies still running after another timeout keep theirs (the
  // arenas stay mapped until the process ends: said, not freed).
  if (size_t stuck = quarantine_.Drain(options_.device_copy_timeout)) {
    StorageLog().error(
        "{} device transfer units still in flight at shutdown: their "
        "memory is left as it is",
        stuck);
  }
  mover_.reset();
  leases_.reset();  // ends leases while the host tiers exist
  // No copy runs any more (the workers are gone): unpin before the arenas
  // are unmapped.
  for (const auto& ns : spaces_) {
    if (ns->pinned_) {
      (void)options_.device->UnregisterHost(ns->host_->arena().base());
    }
  }
}

EngineNamespace* CacheEngine::Find(std::string_view name) const {
  for (const auto& ns : spaces_) {
    if (ns->name() == name) return ns.get();
  }
  return nullptr;
}

Status CacheEngine::RegisterLayout(EngineNamespace& ns,
                                   const LayoutSpec& layout) {
  TIERKV_RETURN_IF_ERROR(layout.Validate());
  MutexLock lock(&ns.layout_mu_);
  if (!ns.layout_) {
    ns.layout_ = std::make_shared<const LayoutSpec>(layout);
    ns.fingerprint_.store(layout.Fingerprint(), std::memory_order_release);
    return Status::OK();
  }
  if (*ns.layout_ == layout) return Status::OK();
  return Status::InvalidArgument("namespace '" + ns.name() +
                                 "' already has a different layout");
}

Status CacheEngine::CheckSize(const EngineNamespace& ns, const SegmentKey& key,
                              uint64_t size) const {
  if (size == 0) return Status::InvalidArgument("segment size is 0");
  const auto layout = ns.layout();
  if (!layout) return Status::OK();
  const uint64_t expected = layout->SegmentBytes(key.layer, key.part);
  if (expected == 0) {
    return Status::InvalidArgument("layer/part not in the namespace layout");
  }
  if (expected != size) {
    return Status::InvalidArgument(fmt::format(
        "segment size {} differs from the layout's {}", size, expected));
  }
  return Status::OK();
}

bool CacheEngine::Submit(std::function<void()> job) {
  if (workers_->TrySubmit(std::move(job))) return true;
  worker_rejections_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

Result<EngineMatch> CacheEngine::Match(EngineNamespace& ns,
                                       std::span<const PageHash> pages,
                                       NvmePromotion promotion) {
  const auto layout = ns.layout();
  if (!layout) {
    return Status::InvalidArgument("register a layout before Match");
  }
  EngineMatch out;
  out.tiers.reserve(pages.size());
  // Pass 1, DRAM (and HBM), page by page in order, touching what DRAM holds
  // as a read would. What DRAM lacks is looked up below it in pass 2, in
  // one batch (one Lookup per tier); until then such a page counts as
  // stored, so its later segments are touched too. Without a tier below,
  // a DRAM miss ends the page at once.
  const bool below = !chain_->empty();
  std::vector<SegmentKey> below_keys;  // DRAM misses, in page order
  std::vector<uint32_t> below_page;    // the page of each
  std::vector<bool> all_hbm(pages.size(), false);
  for (uint32_t n = 0; n < pages.size(); ++n) {
    bool hbm = HbmUsable();  // every segment in HBM too
    bool miss = false;
    for (uint16_t l = 0; !miss && l < layout->num_layers(); ++l) {
      const auto parts = layout->layers[l].parts.size();
      for (uint8_t p = 0; !miss && p < parts; ++p) {
        const SegmentKey key{pages[n], l, p};
        hbm = hbm && hbm_->Contains(ns.index_, key);
        if (ns.host_->Touch(key)) continue;
        if (below) {
          below_keys.push_back(key);
          below_page.push_back(n);
        } else {
          miss = true;
        }
      }
    }
    all_hbm[n] = hbm && !miss;
    out.tiers.push_back(miss ? tierkv::Tier::kMiss : tierkv::Tier::kHost);
  }
  // Pass 2: where below DRAM the rest is; a page is as slow as its slowest
  // segment's tier, and missing when one segment is nowhere.
  std::vector<TierChain::Location> where;
  if (!below_keys.empty()) {
    where = chain_->Locate(ns.tiers_.ns, ns.fingerprint(), below_keys);
  }
  for (size_t b = 0; b < below_keys.size(); ++b) {
    tierkv::Tier& tier = out.tiers[below_page[b]];
    if (where[b].tier == TierChain::kNowhere) {
      tier = tierkv::Tier::kMiss;
    } else if (tier != tierkv::Tier::kMiss) {
      tier = std::max(tier, chain_->at(where[b].tier).kind());
    }
  }
  // Leading pages, and the prefetch of their segments below DRAM (only what
  // the engine reads next). Prefetching more than half the host tier would
  // evict what it brought in before the Get that follows.
  const uint64_t prefetch_budget = ns.host_->capacity_bytes() / 2;
  uint64_t prefetch_bytes = 0;
  std::vector<SegmentKey> promote;
  size_t b = 0;
  for (uint32_t n = 0; n < pages.size(); ++n) {
    tierkv::Tier& tier = out.tiers[n];
    if (tier == tierkv::Tier::kMiss) break;
    if (all_hbm[n]) tier = tierkv::Tier::kHbm;
    out.leading_pages++;
    out.leading_nvme_pages += tier == tierkv::Tier::kNvme;
    out.leading_hbm_pages += tier == tierkv::Tier::kHbm;
    for (; b < below_keys.size() && below_page[b] == n; ++b) {
      const uint64_t bytes = where[b].bytes;
      if (prefetch_bytes + bytes <= prefetch_budget) {
        promote.push_back(below_keys[b]);
        prefetch_bytes += bytes;
      }
    }
  }
  // Pages past the first miss that are wholly in HBM say so too.
  for (uint32_t n = out.leading_pages; n < pages.size(); ++n) {
    if (all_hbm[n] && out.tiers[n] != tierkv::Tier::kMiss) {
      out.tiers[n] = tierkv::Tier::kHbm;
    }
  }
  if (mover_ && promotion == NvmePromotion::kQueue && !promote.empty()) {
    mover_->Prefetch(&ns.tiers_, std::move(promote));
  }
  return out;
}

bool CacheEngine::HasPools(uint64_t owner) const {
  MutexLock lock(&owners_mu_);
  auto it = owners_.find(owner);
  return it != owners_.end() && !it->second.pools.empty();
}

void CacheEngine::Reserve(uint64_t owner, EngineNamespace& ns,
                          std::vector<SegmentSize> items,
                          std::function<void(EngineReservation)> done) {
  EngineReservation r;
  r.items.reserve(items.size());
  std::vector<size_t> busy;
  LeaseRoomCheck room = CheckLeaseRoom(owner, ns, items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (i >= room.room) {
      r.items.push_back(room.error);
      continue;
    }
    if (Status s = CheckSize(ns, items[i].key, items[i].size); !s.ok()) {
      r.items.push_back(std::move(s));
      continue;
    }
    r.items.push_back(ns.host_->Reserve(items[i].key, items[i].size));
    if (r.items.back().status().code() == StatusCode::kBusy) {
      busy.push_back(i);
    }
  }
  if (busy.empty() || !mover_) {
    FinishReserve(owner, ns, std::move(items), std::move(r), {}, false,
                  std::move(done));
    return;
  }
  // Waiting for the write-back blocks: never on the caller's thread.
  mover_->Kick();
  auto state = std::make_shared<
      std::tuple<std::vector<SegmentSize>, EngineReservation,
                 std::vector<size_t>, std::function<void(EngineReservation)>>>(
      std::move(items), std::move(r), std::move(busy), std::move(done));
  const bool queued = Submit([this, owner, &ns, state] {
    auto& [i, r, b, d] = *state;
    FinishReserve(owner, ns, std::move(i), std::move(r), std::move(b),
                  /*wait=*/true, std::move(d));
  });
  if (!queued) {
    auto& [i, r, b, d] = *state;
    FinishReserve(owner, ns, std::move(i), std::move(r), {}, false,
                  std::move(d));
  }
}

void CacheEngine::FinishReserve(uint64_t owner, EngineNamespace& ns,
                                std::vector<SegmentSize> items,
                                EngineReservation r, std::vector<size_t> busy,
                                bool wait,
                                std::function<void(EngineReservation)> done) {
  if (wait && !busy.empty()) {
    backpressure_waits_.fetch_add(1, std::memory_order_relaxed);
    const auto deadline =
        std::chrono::steady_clock::now() + options_.write_back_wait;
    for (size_t i : busy) {
      r.items[i] =
          ReserveAfterWriteBack(ns, items[i].key, items[i].size, deadline);
    }
  }
  std::vector<std::pair<size_t, LeasedSegment>> candidates;
  for (size_t i = 0; i < items.size(); ++i) {
    if (r.items[i].ok() && !r.items[i]->already_stored) {
      candidates.push_back({i, {items[i].key, items[i].size}});
    }
  }
  std::vector<LeasedSegment> reserved =
      AdmitLeaseBytes(owner, ns, candidates, [&](size_t i, Status refused) {
        ns.host_->Abort(items[i].key);
        r.items[i] = std::move(refused);
      });
  if (!reserved.empty()) {
    r.lease_id = leases_->Add(owner, LeaseKind::kWrite, ns.host_.get(),
                              std::move(reserved), options_.lease_ttl);
  }
  done(std::move(r));
}

Result<Reservation> CacheEngine::ReserveAfterWriteBack(
    EngineNamespace& ns, const SegmentKey& key, uint64_t size,
    std::chrono::steady_clock::time_point deadline) {
  Result<Reservation> r = Status::Busy("write-back backpressure");
  // Each retry needs a reason: a commit, abort or finished write-back in
  // the tier since the last attempt.
  while (r.status().code() == StatusCode::kBusy) {
    const uint64_t seen = ns.host_->Generation();
    r = ns.host_->Reserve(key, size);
    if (r.status().code() != StatusCode::kBusy) break;
    mover_->Kick();
    if (!ns.host_->WaitChange(seen, deadline)) break;
  }
  if (r.status().code() == StatusCode::kBusy) {
    backpressure_busy_.fetch_add(1, std::memory_order_relaxed);
  }
  return r;
}

std::vector<Status> CacheEngine::Commit(uint64_t owner, EngineNamespace& ns,
                                        uint64_t lease_id,
                                        std::span<const SegmentKey> keys) {
  const bool dirty = ns.tiers_.policy != WritePolicy::kNone;
  std::vector<Status> out =
      leases_->Commit(owner, lease_id, keys, dirty, DeepestFirst(ns));
  if (dirty && mover_) mover_->Kick();
  return out;
}

void CacheEngine::Acquire(uint64_t owner, EngineNamespace& ns,
                          std::vector<SegmentKey> keys,
                          std::function<void(EngineRead)> done) {
  EngineRead read;
  read.items.reserve(keys.size());
  read.source.assign(keys.size(), tierkv::Tier::kMiss);
  std::vector<size_t> missing;
  LeaseRoomCheck room = CheckLeaseRoom(owner, ns, keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i >= room.room) {
      read.items.push_back(room.error);
      continue;
    }
    Result<SegmentLocation> loc = ns.host_->Acquire(keys[i]);
    if (loc.ok()) {
      read.source[i] = tierkv::Tier::kHost;
    } else if (!chain_->empty() && loc.status().IsNotFound()) {
      missing.push_back(i);
    }
    read.items.push_back(std::move(loc));
  }
  if (missing.empty()) {
    FinishAcquire(owner, ns, std::move(keys), std::move(read), {},
                  std::move(done));
    return;
  }
  // Promotion reads NVMe: never on the caller's (socket) thread. The
  // references taken above travel with the job.
  auto state = std::make_shared<
      std::tuple<std::vector<SegmentKey>, EngineRead, std::vector<size_t>,
                 std::function<void(EngineRead)>>>(
      std::move(keys), std::move(read), std::move(missing), std::move(done));
  const bool queued = Submit([this, owner, &ns, state] {
    auto& [k, r, m, d] = *state;
    FinishAcquire(owner, ns, std::move(k), std::move(r), std::move(m),
                  std::move(d));
  });
  if (!queued) {
    auto& [k, r, m, d] = *state;
    for (size_t i : m) {
      r.items[i] = Status::Busy("daemon workers are saturated; retry");
    }
    FinishAcquire(owner, ns, std::move(k), std::move(r), {}, std::move(d));
  }
}

void CacheEngine::FinishAcquire(uint64_t owner, EngineNamespace& ns,
                                std::vector<SegmentKey> keys, EngineRead read,
                                std::vector<size_t> missing,
                                std::function<void(EngineRead)> done) {
  if (!missing.empty()) {
    std::vector<SegmentKey> wanted;
    wanted.reserve(missing.size());
    for (size_t i : missing) wanted.push_back(keys[i]);
    // Held: a promoted segment is referenced from its commit on, so a
    // concurrent reservation cannot evict it before this read takes it.
    std::vector<tierkv::Tier> sources;
    const std::vector<Status> promoted = mover_->PromoteBatch(
        ns.tiers_, wanted,
        std::chrono::steady_clock::now() + options_.write_back_wait,
        /*hold=*/true, &sources);
    for (size_t m = 0; m < missing.size(); ++m) {
      const size_t i = missing[m];
      if (!promoted[m].ok()) {
        read.items[i] = promoted[m];
        continue;
      }
      // The read's own reference, then the promotion's handed back.
      read.items[i] = ns.host_->Acquire(keys[i]);
      ns.host_->Release(keys[i]);
      if (read.items[i].ok()) read.source[i] = sources[m];
    }
  }
  std::vector<std::pair<size_t, LeasedSegment>> candidates;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (read.items[i].ok()) {
      candidates.push_back({i, {keys[i], read.items[i]->size}});
    }
  }
  std::vector<LeasedSegment> leased =
      AdmitLeaseBytes(owner, ns, candidates, [&](size_t i, Status refused) {
        ns.host_->Release(keys[i]);
        read.items[i] = std::move(refused);
        read.source[i] = tierkv::Tier::kMiss;
      });
  if (!leased.empty()) {
    read.lease_id = leases_->Add(owner, LeaseKind::kRead, ns.host_.get(),
                                 std::move(leased), options_.lease_ttl);
  }
  done(std::move(read));
}

Result<EnginePin> CacheEngine::Pin(uint64_t owner, EngineNamespace& ns,
                                   std::span<const SegmentKey> keys,
                                   std::chrono::milliseconds ttl) {
  if (ttl.count() <= 0 || ttl > options_.max_pin_ttl) {
    return Status::InvalidArgument(fmt::format("pin ttl must be in [1, {}] ms",
                                               options_.max_pin_ttl.count()));
  }
  EnginePin out;
  std::vector<std::pair<size_t, LeasedSegment>> candidates;
  LeaseRoomCheck room = CheckLeaseRoom(owner, ns, keys.size());
  for (const SegmentKey& key : keys) {
    if (out.items.size() >= room.room) {
      out.items.push_back(room.error);
      continue;
    }
    auto found = ns.host_->Acquire(key);
    out.items.push_back(found.status());
    if (found.ok())
      candidates.push_back({out.items.size() - 1, {key, found->size}});
  }
  std::vector<LeasedSegment> pinned =
      AdmitLeaseBytes(owner, ns, candidates, [&](size_t i, Status refused) {
        ns.host_->Release(keys[i]);
        out.items[i] = std::move(refused);
      });
  if (!pinned.empty()) {
    out.lease_id = leases_->Add(owner, LeaseKind::kPin, ns.host_.get(),
                                std::move(pinned), ttl);
  }
  return out;
}

bool CacheEngine::DeepestFirst(const EngineNamespace& ns) {
  return ns.host_->eviction_policy() != EvictionPolicyKind::kLru;
}

CacheEngine::LeaseRoomCheck CacheEngine::CheckLeaseRoom(
    uint64_t owner, const EngineNamespace& ns, size_t want) const {
  const char* limit = nullptr;
  LeaseRoomCheck check;
  check.room = leases_->Room(owner, ns.host_.get(), want, &limit);
  if (check.room < want) check.error = LeaseLimitStatus(owner, limit);
  return check;
}

Status CacheEngine::LeaseLimitStatus(uint64_t owner, const char* limit) const {
  const LeaseLimits& l = leases_->limits();
  return Status::ResourceExhausted(fmt::format(
      "lease limit reached ({}: this connection holds {} leases over {} "
      "segments, {} B; limits leases.max_per_connection {}, "
      "leases.max_segments_per_connection {}, "
      "leases.max_segments_per_namespace {}, "
      "leases.max_bytes_percent_per_connection {}, "
      "leases.max_bytes_percent_per_namespace {}); release earlier reads",
      limit ? limit : "limits", leases_->leases_of(owner),
      leases_->segments_of(owner), leases_->bytes_of(owner),
      l.max_leases_per_owner, l.max_segments_per_owner, l.max_segments_per_tier,
      l.max_bytes_percent_per_owner, l.max_bytes_percent_per_tier));
}

std::vector<LeasedSegment> CacheEngine::AdmitLeaseBytes(
    uint64_t owner, const EngineNamespace& ns,
    const std::vector<std::pair<size_t, LeasedSegment>>& candidates,
    const std::function<void(size_t item, Status)>& refuse) const {
  std::vector<uint64_t> sizes;
  sizes.reserve(candidates.size());
  for (const auto& [i, segment] : candidates) sizes.push_back(segment.bytes);
  const char* limit = nullptr;
  const size_t fit = leases_->FitBytes(owner, ns.host_.get(), sizes, &limit);
  std::vector<LeasedSegment> admitted;
  admitted.reserve(fit);
  for (size_t c = 0; c < fit; ++c) admitted.push_back(candidates[c].second);
  if (fit < candidates.size()) {
    const Status refused = LeaseLimitStatus(owner, limit);
    for (size_t c = fit; c < candidates.size(); ++c) {
      refuse(candidates[c].first, refused);
    }
  }
  return admitted;
}

Status CacheEngine::Release(uint64_t owner, uint64_t lease_id) {
  return leases_->Release(owner, lease_id);
}

size_t CacheEngine::ReleaseOwner(uint64_t owner) {
  {
    MutexLock lock(&owners_mu_);
    owners_.erase(owner);  // running transfers keep their regions mapped
  }
  return leases_->ReleaseOwner(owner);
}

size_t CacheEngine::ExpireLeases() { return leases_->ExpireDue(); }

size_t CacheEngine::active_leases() const { return leases_->size(); }

void CacheEngine::Flush(EngineNamespace& ns, std::vector<SegmentKey> keys,
                        std::function<void(std::vector<Status>)> done) {
  if (!chain_->can_persist()) {
    done(std::vector<Status>(
        keys.size(), Status::InvalidArgument("this daemon has no NVMe tier")));
    return;
  }
  auto state =
      std::make_shared<std::pair<std::vector<SegmentKey>,
                                 std::function<void(std::vector<Status>)>>>(
          std::move(keys), std::move(done));
  const bool queued = Submit([this, &ns, state] {
    state->second(mover_->PersistBatch(ns.tiers_, state->first));
  });
  if (!queued) {
    state->second(std::vector<Status>(
        state->first.size(),
        Status::Busy("daemon workers are saturated; retry")));
  }
}

std::vector<SegmentInfo> CacheEngine::List(EngineNamespace& ns,
                                           size_t limit) const {
  return ns.host_->List(limit);
}

EngineStats CacheEngine::Stats(EngineNamespace& ns) const {
  EngineStats s = SharedStats();
  s.host = ns.host_->Stats();
  s.hbm_namespace = ns.index_;
  s.active_leases = leases_->leases_on(ns.host_.get());
  return s;
}

EngineStats CacheEngine::SharedStats() const {
  EngineStats s;
  if (nvme_) {
    s.has_nvme = true;
    s.nvme = nvme_->Stats();
  }
  if (mover_) s.mover = mover_->Stats();
  s.active_leases = leases_->size();
  s.worker_queue_depth = workers_->queue_depth();
  s.worker_rejections = worker_rejections_.load(std::memory_order_relaxed);
  s.backpressure_waits = backpressure_waits_.load(std::memory_order_relaxed);
  s.backpressure_busy = backpressure_busy_.load(std::memory_order_relaxed);
  auto get = [](const std::atomic<uint64_t>& a) {
    return a.load(std::memory_order_relaxed);
  };
  s.stream_gate_waiting = get(stream_gate_waiting_);
  s.stream_gate_waits = get(stream_gate_waits_);
  s.stream_gate_timeouts = get(stream_gate_timeouts_);
  if (hbm_) {
    s.has_hbm = true;
    s.hbm = hbm_->Stats();
  }
  if (options_.device != nullptr) {
    quarantine_.Reap();
    s.has_device = true;
    s.device_failed = DeviceFailed();
    if (s.device_failed) s.device_error = options_.device->health().message();
    s.device_quarantined = quarantine_.held();
    s.device_quarantined_total = quarantine_.total();
    if (staging_) s.device_staging = staging_->Stats();
  }
  s.load_segments_hbm = get(load_segments_hbm_);
  s.load_bytes_hbm = get(load_bytes_hbm_);
  s.load_segments_host = get(load_segments_host_);
  s.load_bytes_host = get(load_bytes_host_);
  s.load_segments_nvme = get(load_segments_nvme_);
  s.load_bytes_nvme = get(load_bytes_nvme_);
  s.load_misses = get(load_misses_);
  s.store_segments = get(store_segments_);
  s.store_bytes = get(store_bytes_);
  s.store_dedup = get(store_dedup_);
  s.loads = get(loads_);
  s.stores = get(stores_);
  s.transfers = s.loads + s.stores;
  s.prefetches = get(prefetches_);
  s.topk_reports = get(topk_reports_);
  s.load_latency = load_latency_.Snapshot();
  s.load_latency_nanos = load_latency_.total_nanos();
  s.store_latency = store_latency_.Snapshot();
  s.store_latency_nanos = store_latency_.total_nanos();
  MutexLock lock(&owners_mu_);
  for (const auto& [owner, o] : owners_) s.registered_pools += o.pools.size();
  return s;
}

namespace {

uint32_t PoolKey(uint16_t layer, uint8_t part) {
  return uint32_t{layer} << 8 | part;
}

LoadTicket& TicketAt(MappedRegion& region, uint32_t index) {
  return *reinterpret_cast<LoadTicket*>(region.bytes().data() +
                                        uint64_t{index} * sizeof(LoadTicket));
}

// A LoadTicket time stamp: steady_clock is CLOCK_MONOTONIC on Linux, the
// clock the client reads too.
uint64_t MonotonicNanos(std::chrono::steady_clock::time_point t) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch())
          .count());
}

// Publishes that `layers` layers are complete and wakes every waiter (the
// client futex-waits on the word in its own mapping of the same memfd).
// `device_base`: the ticket's device_layers when the transfer began, which
// the engine's stream waits on instead (LoadTicket::device_layers).
void PublishLayers(LoadTicket& ticket, uint32_t layers, uint32_t device_base) {
  ticket.layers_done.store(layers, std::memory_order_release);
  RaiseTo(ticket.device_layers, device_base + layers);
  ::syscall(SYS_futex, &ticket.layers_done, FUTEX_WAKE, INT_MAX, nullptr,
            nullptr, 0);
}

// The daemon is done with the ticket (the client may reuse it): a futex word
// of its own, so a waiter for it cannot miss the wake-up.
void PublishFinished(LoadTicket& ticket) {
  ticket.finished.store(1, std::memory_order_release);
  ::syscall(SYS_futex, &ticket.finished, FUTEX_WAKE, INT_MAX, nullptr, nullptr,
            0);
}

}  // namespace

Status CacheEngine::CheckPoolLayout(EngineNamespace& ns,
                                    const PoolLayout& pool) const {
  const auto layout = ns.layout();
  if (!layout) return Status::InvalidArgument("register a layout first");
  const uint64_t segment = layout->SegmentBytes(pool.layer, pool.part);
  if (segment == 0) {
    return Status::InvalidArgument(
        fmt::format("layer {} part {} is not in the namespace layout",
                    pool.layer, pool.part));
  }
  if (pool.slot_bytes != segment) {
    return Status::InvalidArgument(
        fmt::format("pool slot of {} B differs from the {} B segment",
                    pool.slot_bytes, segment));
  }
  if (pool.slot_count == 0) return Status::InvalidArgument("pool of 0 slots");
  return Status::OK();
}

Status CacheEngine::AddPool(uint64_t owner, Pool pool) {
  const PoolLayout layout = pool.layout;
  MutexLock lock(&owners_mu_);
  auto [it, inserted] = owners_[owner].pools.emplace(
      PoolKey(layout.layer, layout.part), std::move(pool));
  if (!inserted) {
    return Status::InvalidArgument(
        fmt::format("layer {} part {} already has a pool on this connection",
                    layout.layer, layout.part));
  }
  return Status::OK();
}

Status CacheEngine::RegisterPool(uint64_t owner, EngineNamespace& ns, int fd,
                                 const PoolLayout& pool) {
  TIERKV_RETURN_IF_ERROR(CheckPoolLayout(ns, pool));
  // Only the pool's own bytes, with the page tables filled now: every
  // Load writes them after.
  auto region = MappedRegion::Map(fd, pool.offset,
                                  uint64_t{pool.slot_count} * pool.slot_bytes,
                                  /*prefault=*/true);
  if (!region.ok()) return region.status();
  return AddPool(owner,
                 Pool{.region = std::move(region).value(), .layout = pool});
}

Status CacheEngine::CheckDevicePool(EngineNamespace& ns, const PoolLayout& pool,
                                    uint64_t allocation_bytes) const {
  if (options_.device == nullptr) {
    return Status::InvalidArgument(
        "this tierkvd has no device backend: device pools need an [hbm] "
        "section");
  }
  TIERKV_RETURN_IF_ERROR(CheckPoolLayout(ns, pool));
  const uint64_t bytes = uint64_t{pool.slot_count} * pool.slot_bytes;
  if (pool.offset > allocation_bytes ||
      bytes > allocation_bytes - pool.offset) {
    return Status::InvalidArgument(fmt::format(
        "pool of {} slots x {} B at offset {} exceeds the {}-byte device "
        "allocation",
        pool.slot_count, pool.slot_bytes, pool.offset, allocation_bytes));
  }
  return Status::OK();
}

Status CacheEngine::RegisterDevicePool(uint64_t owner, EngineNamespace& ns,
                                       const IpcHandle& handle,
                                       const DeviceUuid& device_uuid,
                                       const PoolLayout& pool) {
  TIERKV_RETURN_IF_ERROR(CheckDevicePool(ns, pool, handle.pool_bytes));
  auto device = DeviceFor(device_uuid);
  if (!device.ok()) return device.status();
  return AddDevicePool(owner, *device, (*device)->ImportPool(handle), pool);
}

Status CacheEngine::RegisterDevicePoolFd(uint64_t owner, EngineNamespace& ns,
                                         int fd, uint64_t allocation_bytes,
                                         const DeviceUuid& device_uuid,
                                         const PoolLayout& pool) {
  TIERKV_RETURN_IF_ERROR(CheckDevicePool(ns, pool, allocation_bytes));
  auto device = DeviceFor(device_uuid);
  if (!device.ok()) return device.status();
  return AddDevicePool(owner, *device,
                       (*device)->ImportPoolFd(fd, allocation_bytes), pool);
}

Status CacheEngine::AddDevicePool(uint64_t owner, DeviceBackend* backend,
                                  Result<ImportedPool> imported,
                                  const PoolLayout& pool) {
  if (!imported.ok()) return imported.status();
  auto device = std::make_shared<ImportedDevicePool>(backend, *imported);
  return AddPool(owner, Pool{.device = std::move(device), .layout = pool});
}

Status CacheEngine::RegisterTickets(uint64_t owner, int fd, uint32_t count) {
  if (count == 0 || count > 65536) {
    return Status::InvalidArgument("ticket count must be in [1, 65536]");
  }
  auto region = MappedRegion::Map(fd, uint64_t{count} * sizeof(LoadTicket));
  if (!region.ok()) return region.status();
  MutexLock lock(&owners_mu_);
  OwnerPools& o = owners_[owner];
  o.tickets = std::move(region).value();
  o.ticket_count = count;
  return Status::OK();
}

Result<std::shared_ptr<CacheEngine::TransferJob>> CacheEngine::PrepareTransfer(
    uint64_t owner, EngineNamespace& ns, PoolTransfer t) {
  auto layout = ns.layout();
  if (!layout) return Status::InvalidArgument("register a layout first");
  if (t.pages.size() != t.slots.size()) {
    return Status::InvalidArgument("one slot per page");
  }
  if (t.num_layers == 0 ||
      uint32_t{t.first_layer} + t.num_layers > layout->num_layers()) {
    return Status::InvalidArgument(
        fmt::format("layers [{}, {}) outside the layout's {}", t.first_layer,
                    t.first_layer + t.num_layers, layout->num_layers()));
  }
  auto job = std::make_shared<TransferJob>();
  job->ns = &ns;
  job->pools.resize(t.num_layers);
  {
    MutexLock lock(&owners_mu_);
    auto it = owners_.find(owner);
    if (it == owners_.end() || !it->second.tickets) {
      return Status::InvalidArgument("register tickets before Load/Store");
    }
    const OwnerPools& o = it->second;
    if (t.ticket >= o.ticket_count) {
      return Status::InvalidArgument("ticket index out of range");
    }
    job->tickets = o.tickets;
    for (uint16_t k = 0; k < t.num_layers; ++k) {
      const uint16_t l = t.first_layer + k;
      for (uint8_t p = 0; p < layout->layers[l].parts.size(); ++p) {
        auto pool = o.pools.find(PoolKey(l, p));
        if (pool == o.pools.end()) {
          return Status::InvalidArgument(
              fmt::format("layer {} part {} has no registered pool", l, p));
        }
        job->pools[k].push_back(pool->second);
      }
    }
  }
  for (const auto& layer_pools : job->pools) {
    for (const Pool& pool : layer_pools) {
      for (uint32_t slot : t.slots) {
        if (slot >= pool.layout.slot_count) {
          return Status::InvalidArgument(fmt::format(
              "slot {} outside the pool of layer {} part {} ({} slots)", slot,
              pool.layout.layer, pool.layout.part, pool.layout.slot_count));
        }
      }
    }
  }
  LoadTicket& ticket = TicketAt(*job->tickets, t.ticket);
  ticket.error_count.store(0, std::memory_order_relaxed);
  ticket.finished.store(0, std::memory_order_relaxed);
  ticket.first_layer_ns.store(0, std::memory_order_relaxed);
  ticket.last_layer_ns.store(0, std::memory_order_relaxed);
  ticket.layers_done.store(0, std::memory_order_release);
  // The client set both before it sent the request; read once, so a
  // client rewriting them later changes nothing here.
  job->gate_target = ticket.gate_target.load(std::memory_order_acquire);
  job->device_base = ticket.device_layers.load(std::memory_order_acquire);
  job->layout = std::move(layout);
  job->t = std::move(t);
  job->splits = std::clamp<uint32_t>(
      options_.transfer_lanes, 1,
      std::max<uint32_t>(1, static_cast<uint32_t>(job->t.pages.size())));
  {
    MutexLock lock(&job->mu);
    job->units_left.assign(job->t.num_layers, job->splits);
    job->layer_done.assign(job->t.num_layers, false);
  }
  return job;
}

Status CacheEngine::Load(uint64_t owner, EngineNamespace& ns, PoolTransfer t) {
  const auto accepted = std::chrono::steady_clock::now();
  return StartTransfer(PrepareTransfer(owner, ns, std::move(t)), true,
                       accepted);
}

Status CacheEngine::Store(uint64_t owner, EngineNamespace& ns, PoolTransfer t) {
  const auto accepted = std::chrono::steady_clock::now();
  return StartTransfer(PrepareTransfer(owner, ns, std::move(t)), false,
                       accepted);
}

Status CacheEngine::StartTransfer(
    Result<std::shared_ptr<TransferJob>> job, bool load,
    std::chrono::steady_clock::time_point accepted) {
  if (!job.ok()) return job.status();
  (*job)->load = load;
  (*job)->accepted = accepted;
  TicketAt(*(*job)->tickets, (*job)->t.ticket)
      .accepted_ns.store(MonotonicNanos(accepted), std::memory_order_relaxed);
  if (!Submit([this, job = *job] { RunLane(job, /*first=*/true); })) {
    return Status::Busy("daemon workers are saturated; retry");
  }
  (load ? loads_ : stores_).fetch_add(1, std::memory_order_relaxed);
  return Status::OK();
}

void CacheEngine::RunLane(const std::shared_ptr<TransferJob>& job, bool first) {
  if (first) {
    // More lanes only where workers are idle now: a rejected lane is not a
    // rejected request, so it is not counted as one.
    const uint32_t lanes =
        std::min<uint32_t>(options_.transfer_lanes, job->t.num_layers);
    for (uint32_t i = 1; i < lanes; ++i) {
      job->lanes.fetch_add(1, std::memory_order_relaxed);
      if (!workers_->TrySubmit([this, job] { RunLane(job, false); })) {
        job->lanes.fetch_sub(1, std::memory_order_relaxed);
        break;
      }
    }
  }
  const uint32_t pages = static_cast<uint32_t>(job->t.pages.size());
  const bool gate_open = PassStreamGate(*job);
  while (true) {
    const uint32_t u = job->next_unit.fetch_add(1, std::memory_order_relaxed);
    const uint32_t k = u / job->splits, s = u % job->splits;
    if (k >= job->t.num_layers) break;
    if (before_transfer_layer_) before_transfer_layer_(job->t.first_layer + k);
    const uint32_t begin =
        static_cast<uint32_t>(uint64_t{pages} * s / job->splits);
    const uint32_t end =
        static_cast<uint32_t>(uint64_t{pages} * (s + 1) / job->splits);
    if (!gate_open) {
      // The engine's stream never reached the transfer: its slots may still
      // be in use, so nothing is moved and every segment says why.
      const uint16_t l = job->t.first_layer + k;
      for (uint32_t i = begin; i < end; ++i) {
        for (uint8_t p = 0; p < job->pools[k].size(); ++p) {
          RecordError(*job, i, l, p, StatusCode::kBusy);
        }
      }
    } else if (job->load) {
      LoadLayer(*job, k, begin, end);
    } else {
      StoreLayer(*job, k, begin, end);
    }
    FinishUnit(*job, k);
  }
  // acq_rel: the last lane out sees every other lane's writes to the pools.
  if (job->lanes.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    // Queued before the ticket says finished, so a finished Load's
    // promotion is already on the mover's queue.
    if (job->load) PromoteLoaded(*job);
    PublishFinished(TicketAt(*job->tickets, job->t.ticket));
  }
}

bool CacheEngine::PassStreamGate(TransferJob& job) {
  using Job = TransferJob;
  const uint8_t known = job.gate.load(std::memory_order_acquire);
  if (known != Job::kGateUnknown) return known == Job::kGatePassed;
  const std::atomic<uint32_t>& word = TicketAt(*job.tickets, job.t.ticket).gate;
  const uint32_t target = job.gate_target;
  auto open = [&word, target] {
    return target == 0 ||
           CyclicAtLeast(word.load(std::memory_order_acquire), target);
  };
  if (open()) {
    job.gate.store(Job::kGatePassed, std::memory_order_release);
    return true;
  }
  // Every lane waits; the first counts the transfer.
  const bool counts = !job.gate_counted.exchange(true);
  if (counts) {
    stream_gate_waits_.fetch_add(1, std::memory_order_relaxed);
    stream_gate_waiting_.fetch_add(1, std::memory_order_relaxed);
  }
  const auto deadline = job.accepted + options_.device_copy_timeout;
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(10);
  bool passed = false;
  while (job.gate.load(std::memory_order_acquire) == Job::kGateUnknown) {
    if (open()) {
      passed = true;
      break;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    if (now - start < std::chrono::microseconds(20)) continue;
    if (now - start < std::chrono::microseconds(200)) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(100));
  }
  if (counts) stream_gate_waiting_.fetch_sub(1, std::memory_order_relaxed);
  uint8_t expected = Job::kGateUnknown;
  const uint8_t mine = passed ? Job::kGatePassed : Job::kGateTimedOut;
  if (job.gate.compare_exchange_strong(expected, mine,
                                       std::memory_order_acq_rel)) {
    if (!passed) stream_gate_timeouts_.fetch_add(1, std::memory_order_relaxed);
    return passed;
  }
  return expected == Job::kGatePassed;  // another lane decided first
}

void CacheEngine::PromoteLoaded(TransferJob& job) {
  std::vector<SegmentKey> keys;
  {
    MutexLock lock(&job.mu);
    keys.swap(job.from_nvme);
  }
  if (!mover_ || keys.empty()) return;
  // As Match's prefetch: more than half the host tier would evict what it
  // brings in. Leading layers first, so a partial promotion still saves a
  // layer-ordered Load its first waits.
  std::sort(keys.begin(), keys.end(),
            [](const SegmentKey& a, const SegmentKey& b) {
              return std::tie(a.layer, a.part) < std::tie(b.layer, b.part);
            });
  const uint64_t budget = job.ns->host_->capacity_bytes() / 2;
  uint64_t bytes = 0;
  size_t n = 0;
  for (; n < keys.size(); ++n) {
    bytes += job.layout->SegmentBytes(keys[n].layer, keys[n].part);
    if (bytes > budget) break;
  }
  keys.resize(n);
  mover_->Prefetch(&job.ns->tiers_, std::move(keys));
}

void CacheEngine::FinishUnit(TransferJob& job, uint32_t k) {
  MutexLock lock(&job.mu);
  if (--job.units_left[k] > 0) return;
  job.layer_done[k] = true;
  const uint32_t before = job.published;
  while (job.published < job.t.num_layers && job.layer_done[job.published]) {
    ++job.published;
  }
  if (job.published == before) return;
  // Recorded before the layers are published, so a client whose Wait
  // returned sees them (the ticket's times, this transfer in the stats).
  LoadTicket& ticket = TicketAt(*job.tickets, job.t.ticket);
  const auto now = std::chrono::steady_clock::now();
  if (before == 0) {
    ticket.first_layer_ns.store(MonotonicNanos(now), std::memory_order_relaxed);
  }
  if (job.published == job.t.num_layers) {
    ticket.last_layer_ns.store(MonotonicNanos(now), std::memory_order_relaxed);
    (job.load ? load_latency_ : store_latency_).Record(now - job.accepted);
  }
  // Under mu, so the published count only grows.
  PublishLayers(ticket, job.published, job.device_base);
}

void CacheEngine::RecordError(TransferJob& job, uint32_t page, uint16_t layer,
                              uint8_t part, StatusCode code) {
  LoadTicket& ticket = TicketAt(*job.tickets, job.t.ticket);
  MutexLock lock(&job.mu);  // lanes of one job record errors concurrently
  const uint32_t at = ticket.error_count.load(std::memory_order_relaxed);
  if (at < LoadTicket::kMaxErrors) {
    ticket.errors[at] = {page, layer, part, static_cast<uint8_t>(code)};
  }
  // Release: the entry is written before the count that covers it.
  ticket.error_count.store(at + 1, std::memory_order_release);
}

void CacheEngine::LoadLayer(TransferJob& job, uint32_t k, uint32_t begin,
                            uint32_t end) {
  const PoolTransfer& t = job.t;
  EngineNamespace& ns = *job.ns;
  const uint16_t l = t.first_layer + k;
  // What DRAM lacks, read from NVMe in one batch for every part of the
  // unit, so the device queue holds all of it at once.
  std::vector<TierReadItem> reads;
  struct ReadOf {
    uint32_t page;
    uint8_t part;
    uint64_t bytes;
  };
  std::vector<ReadOf> read_of;
  for (const Pool& pool : job.pools[k]) {
    if (pool.device) {
      DeviceBackend& device = *pool.device->backend;
      const StreamId stream = AcquireDeviceStream(device);
      LoadUnitToDevice(job, pool, k, begin, end, stream);
      ReleaseDeviceStream(device, stream);
      continue;
    }
    const uint8_t p = pool.layout.part;
    for (uint32_t i = begin; i < end; ++i) {
      const SegmentKey key{t.pages[i], l, p};
      std::byte* slot = pool.Slot(t.slots[i]);
      // A reference keeps the segment from eviction during the copy.
      auto loc = ns.host_->Acquire(key);
      if (loc.ok() && loc->size == pool.layout.slot_bytes) {
        StreamCopy(slot, ns.host_->arena().base() + loc->offset, loc->size);
        ns.host_->Release(key);
        load_segments_host_.fetch_add(1, std::memory_order_relaxed);
        load_bytes_host_.fetch_add(loc->size, std::memory_order_relaxed);
        continue;
      }
      if (loc.ok()) ns.host_->Release(key);
      if (!chain_->empty()) {
        reads.push_back({key, {slot, pool.layout.slot_bytes}});
        read_of.push_back({i, p, pool.layout.slot_bytes});
      } else {
        RecordError(job, i, l, p, StatusCode::kNotFound);
        load_misses_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  if (reads.empty()) return;
  // Straight into the slots where aligned, else through a bounce buffer;
  // either way the checksum is verified before a hit counts. While this
  // batch drains, the other lanes' batches (the rest of this layer, then
  // the next) keep the device's queue full.
  auto got = chain_->ReadAndWait(ns.tiers_.ns, ns.fingerprint(), reads).items;
  std::vector<SegmentKey> read_ok;
  for (size_t r = 0; r < reads.size(); ++r) {
    if (got[r].ok() && *got[r] == read_of[r].bytes) {
      load_segments_nvme_.fetch_add(1, std::memory_order_relaxed);
      load_bytes_nvme_.fetch_add(*got[r], std::memory_order_relaxed);
      read_ok.push_back(reads[r].key);
    } else {
      RecordError(
          job, read_of[r].page, l, read_of[r].part,
          got[r].ok() ? StatusCode::kCorruption : got[r].status().code());
      load_misses_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (!read_ok.empty()) {
    MutexLock lock(&job.mu);
    job.from_nvme.insert(job.from_nvme.end(), read_ok.begin(), read_ok.end());
  }
}

void CacheEngine::StoreLayer(TransferJob& job, uint32_t k, uint32_t begin,
                             uint32_t end) {
  const PoolTransfer& t = job.t;
  EngineNamespace& ns = *job.ns;
  const uint16_t l = t.first_layer + k;
  const bool dirty = ns.tiers_.policy != WritePolicy::kNone;
  // Under write-back pressure a Store waits for the mover as a Put does (it
  // runs on a worker, never on an IO thread), up to write_back_wait.
  std::optional<std::chrono::steady_clock::time_point> deadline;
  const bool deepest_first = DeepestFirst(ns);
  for (const Pool& pool : job.pools[k]) {
    if (pool.device) {
      DeviceBackend& device = *pool.device->backend;
      const StreamId stream = AcquireDeviceStream(device);
      StoreUnitFromDevice(job, pool, k, begin, end, stream);
      ReleaseDeviceStream(device, stream);
      continue;
    }
    const uint8_t p = pool.layout.part;
    for (uint32_t n = begin; n < end; ++n) {
      const uint32_t i = deepest_first ? begin + end - 1 - n : n;
      const SegmentKey key{t.pages[i], l, p};
      auto r = ns.host_->Reserve(key, pool.layout.slot_bytes);
      if (r.status().code() == StatusCode::kBusy && mover_) {
        if (!deadline) {
          deadline =
              std::chrono::steady_clock::now() + options_.write_back_wait;
          backpressure_waits_.fetch_add(1, std::memory_order_relaxed);
        }
        r = ReserveAfterWriteBack(ns, key, pool.layout.slot_bytes, *deadline);
      }
      if (!r.ok()) {
        RecordError(job, i, l, p, r.status().code());
        continue;
      }
      if (r->already_stored) {
        store_dedup_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      std::memcpy(ns.host_->arena().base() + r->location.offset,
                  pool.Slot(t.slots[i]), pool.layout.slot_bytes);
      if (Status s = ns.host_->Commit(key, dirty); !s.ok()) {
        RecordError(job, i, l, p, s.code());
        continue;
      }
      store_segments_.fetch_add(1, std::memory_order_relaxed);
      store_bytes_.fetch_add(pool.layout.slot_bytes, std::memory_order_relaxed);
    }
  }
  if (dirty && mover_) mover_->Kick();
}

StreamId CacheEngine::AcquireDeviceStream(DeviceBackend& device) {
  MutexLock lock(&device_streams_mu_);
  std::vector<StreamId>& free = free_device_streams_[&device];
  while (free.empty()) device_streams_cv_.Wait(&device_streams_mu_);
  const StreamId stream = free.back();
  free.pop_back();
  return stream;
}

void CacheEngine::ReleaseDeviceStream(DeviceBackend& device, StreamId stream) {
  {
    MutexLock lock(&device_streams_mu_);
    free_device_streams_[&device].push_back(stream);
  }
  // Waiters of every device share the condition variable.
  device_streams_cv_.SignalAll();
}

Result<DeviceBackend*> CacheEngine::DeviceFor(const DeviceUuid& uuid) {
  DeviceBackend* const primary = options_.device;
  if (IsUnsetDeviceUuid(uuid) || uuid == primary->uuid()) return primary;
  MutexLock lock(&other_devices_mu_);
  auto it = other_devices_.find(uuid);
  if (it != other_devices_.end()) return it->second.get();
  // A bound no node reaches (NVL72 trays hold 4 GPUs, HGX boards 8), so no
  // client can make the daemon open backends without end (the emulated
  // backend names any number of devices).
  constexpr size_t kMaxDevices = 64;
  if (other_devices_.size() + 1 >= kMaxDevices) {
    return Status::ResourceExhausted(fmt::format(
        "device pools on more than {} GPUs of one node", kMaxDevices));
  }
  // The same kind as the [hbm] backend, on the engine's GPU. Host memory
  // pinned by the primary is pinned for every device of the process
  // (cudaHostRegisterPortable), so DRAM copies stay DMA here too.
  auto kind = ParseDeviceBackendKind(primary->name());
  if (!kind.ok()) return kind.status();
  auto opened = DeviceBackend::Open(
      {.kind = *kind, .device_uuid = uuid, .streams = primary->streams()});
  if (!opened.ok()) {
    return Status(
        opened.status().code(),
        fmt::format("the device pool is on {}, which this tierkvd "
                    "cannot open: {}",
                    FormatDeviceUuid(uuid), opened.status().message()));
  }
  StorageLog().info(
      "device pools on {} (device {} here): served from DRAM and NVMe; the "
      "HBM tier stays on {}",
      FormatDeviceUuid(uuid), (*opened)->device(),
      FormatDeviceUuid(primary->uuid()));
  DeviceBackend* backend = opened->get();
  {
    MutexLock streams_lock(&device_streams_mu_);
    std::vector<StreamId>& free = free_device_streams_[backend];
    for (StreamId id = 0; id < backend->streams(); ++id) free.push_back(id);
  }
  other_devices_.emplace(uuid, std::move(opened).value());
  return backend;
}

void CacheEngine::QueueHbmAdmission(EngineNamespace& ns, const SegmentKey& key,
                                    const DeviceBackend& device,
                                    const DeviceRegion& src, StreamId stream,
                                    std::vector<SegmentKey>* admitted) {
  if (&device != options_.device || !HbmUsable()) return;
  auto at = hbm_->Reserve(ns.index_, key, src.bytes);
  if (!at.ok()) return;  // no room, or already there
  if (options_.device
          ->CopyOnDevice(stream, {options_.hbm_pool.id, *at, src.bytes}, src)
          .ok()) {
    admitted->push_back(key);
  } else {
    hbm_->Abort(ns.index_, key);
  }
}

void CacheEngine::FinishHbmAdmissions(EngineNamespace& ns,
                                      std::span<const SegmentKey> admitted,
                                      bool copied) {
  for (const SegmentKey& key : admitted) {
    if (copied) {
      hbm_->Commit(ns.index_, key);
    } else {
      hbm_->Abort(ns.index_, key);
    }
  }
}

bool CacheEngine::DeviceFailed() const {
  if (options_.device == nullptr || !options_.device->failed()) return false;
  if (!device_failure_logged_.exchange(true)) {
    StorageLog().error(
        "{}; the HBM tier is off (neither read nor filled: it only held "
        "copies) and loads and stores into engines' device pools fail, so "
        "engines recompute; host DRAM and NVMe keep serving",
        options_.device->health().message());
  }
  return true;
}

bool CacheEngine::HbmUsable() const {
  return hbm_ != nullptr && !DeviceFailed();
}

Status CacheEngine::WaitDeviceCopies(
    DeviceBackend& device, StreamId stream,
    std::function<void(const Status&)> release) {
  auto event = device.RecordEvent(stream);
  Status done = event.ok()
                    ? device.WaitEvent(*event, options_.device_copy_timeout)
                    : event.status();
  if (!done.ok() && event.ok() && !device.EventDone(*event)) {
    // The wait gave up, the copies did not: keep what they touch.
    StorageLog().warn(
        "device copies on stream {} not done after {} ms: their memory is "
        "quarantined until they are",
        stream, options_.device_copy_timeout.count());
    quarantine_.Hold(device, *event,
                     [release = std::move(release), done] { release(done); });
    return done;
  }
  release(done);
  return done;
}

void CacheEngine::LoadUnitToDevice(TransferJob& job, const Pool& pool,
                                   uint32_t k, uint32_t begin, uint32_t end,
                                   StreamId stream) {
  const PoolTransfer& t = job.t;
  EngineNamespace& ns = *job.ns;
  DeviceBackend& device = *pool.device->backend;
  const uint16_t l = t.first_layer + k;
  const uint8_t p = pool.layout.part;
  const uint64_t bytes = pool.layout.slot_bytes;
  // HBM hits are device-to-device copies. Host segments stay referenced
  // (not evictable) until their copies are done; NVMe segments are read
  // into a bounce buffer first, copied from it. What came from below is
  // admitted into HBM by a device copy from the slot just filled, and
  // committed there once the event says the bytes are in place.
  quarantine_.Reap();
  // The HBM tier serves pools on its own GPU only (no peer copies).
  HbmTier* const hbm =
      &device == options_.device && HbmUsable() ? hbm_.get() : nullptr;
  const uint32_t hbm_pool = options_.hbm_pool.id;
  std::vector<SegmentKey> held, hbm_held, admitted;
  std::vector<uint32_t> copied;  // pages whose copy was submitted
  uint64_t host_bytes = 0, nvme_bytes = 0, nvme_segments = 0;
  std::vector<TierReadItem> reads;
  std::vector<uint32_t> read_page;
  PinnedStaging::Buffer bounce;
  // Host -> device copies go in batches (one submission per source tier:
  // CopyToDeviceBatch), each page's HBM admission queued after its batch.
  std::vector<uint32_t> batch_pages;
  std::vector<DeviceRegion> batch_slots;
  std::vector<std::span<const std::byte>> batch_sources;
  auto copy = [&](uint32_t i, std::span<const std::byte> src) {
    batch_pages.push_back(i);
    batch_slots.push_back(pool.DeviceSlot(t.slots[i]));
    batch_sources.push_back(src);
  };
  // Submits the batch; false for a page whose copy was refused (its error
  // recorded).
  auto submit = [&]() -> std::vector<bool> {
    std::vector<bool> ok(batch_pages.size(), true);
    Status s = device.CopyToDeviceBatch(stream, batch_slots, batch_sources);
    for (size_t b = 0; b < batch_pages.size(); ++b) {
      const uint32_t i = batch_pages[b];
      if (!s.ok()) {
        RecordError(job, i, l, p, s.code());
        ok[b] = false;
        continue;
      }
      copied.push_back(i);
      QueueHbmAdmission(ns, {t.pages[i], l, p}, device, batch_slots[b], stream,
                        &admitted);
    }
    batch_pages.clear();
    batch_slots.clear();
    batch_sources.clear();
    return ok;
  };
  for (uint32_t i = begin; i < end; ++i) {
    const SegmentKey key{t.pages[i], l, p};
    if (hbm != nullptr) {
      if (auto at = hbm->Acquire(ns.index_, key, bytes)) {
        if (device
                .CopyOnDevice(stream, pool.DeviceSlot(t.slots[i]),
                              {hbm_pool, *at, bytes})
                .ok()) {
          hbm_held.push_back(key);
          copied.push_back(i);
          continue;
        }
        hbm->Release(ns.index_, key);  // served from below instead
      }
    }
    auto loc = ns.host_->Acquire(key);
    if (loc.ok() && loc->size == bytes) {
      copy(i, {ns.host_->arena().base() + loc->offset, bytes});
      held.push_back(key);  // released once the copy is over (or refused)
      continue;
    }
    if (loc.ok()) ns.host_->Release(key);
    if (!chain_->empty()) {
      read_page.push_back(i);
    } else {
      RecordError(job, i, l, p, StatusCode::kNotFound);
      load_misses_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  uint64_t host_segments = 0;
  for (bool ok : submit()) {
    host_segments += ok ? 1 : 0;
    host_bytes += ok ? bytes : 0;
  }
  if (!read_page.empty()) {
    const uint64_t bounce_bytes = read_page.size() * bytes;
    if (staging_) {
      bounce = staging_->Borrow(bounce_bytes);
    } else {
      auto heap = std::make_shared<std::vector<std::byte>>(bounce_bytes);
      bounce = {*heap, false, heap};
    }
    if (bounce.bytes.empty()) {
      for (uint32_t i : read_page) {
        RecordError(job, i, l, p, StatusCode::kResourceExhausted);
      }
      read_page.clear();
    }
    for (size_t r = 0; r < read_page.size(); ++r) {
      reads.push_back({SegmentKey{t.pages[read_page[r]], l, p},
                       bounce.bytes.subspan(r * bytes, bytes)});
    }
  }
  if (!read_page.empty()) {
    auto got = chain_->ReadAndWait(ns.tiers_.ns, ns.fingerprint(), reads).items;
    std::vector<SegmentKey> read_ok;
    std::vector<size_t> batch_reads;  // the reads[] index of each copy
    for (size_t r = 0; r < reads.size(); ++r) {
      const uint32_t i = read_page[r];
      if (!got[r].ok() || *got[r] != bytes) {
        RecordError(
            job, i, l, p,
            got[r].ok() ? StatusCode::kCorruption : got[r].status().code());
        load_misses_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      copy(i, reads[r].dst);
      batch_reads.push_back(r);
    }
    const std::vector<bool> ok = submit();
    for (size_t b = 0; b < ok.size(); ++b) {
      if (!ok[b]) continue;
      read_ok.push_back(reads[batch_reads[b]].key);
      nvme_bytes += bytes;
      ++nvme_segments;
    }
    if (!read_ok.empty()) {
      MutexLock lock(&job.mu);
      job.from_nvme.insert(job.from_nvme.end(), read_ok.begin(), read_ok.end());
    }
  }
  // The layer is published only after this wait: what the engine reads
  // after WaitLayer is on the device. What the copies read (host segments,
  // HBM entries, the bounce buffer, the engine's pool) stays theirs until
  // they are over, even past a timed-out wait.
  const size_t hbm_hits = hbm_held.size();
  auto release = [this, &ns, held = std::move(held),
                  hbm_held = std::move(hbm_held),
                  admitted = std::move(admitted), bounce = std::move(bounce),
                  // keeps the engine's pool imported while copies run
                  target = pool.device](const Status& done) {
    for (const SegmentKey& key : held) ns.host_->Release(key);
    for (const SegmentKey& key : hbm_held) hbm_->Release(ns.index_, key);
    FinishHbmAdmissions(ns, admitted, done.ok());
  };
  Status done;
  if (copied.empty()) {
    release(done);
  } else {
    done = WaitDeviceCopies(device, stream, std::move(release));
  }
  if (!done.ok()) {
    for (uint32_t i : copied) RecordError(job, i, l, p, done.code());
    return;
  }
  load_segments_hbm_.fetch_add(hbm_hits, std::memory_order_relaxed);
  load_bytes_hbm_.fetch_add(hbm_hits * bytes, std::memory_order_relaxed);
  load_segments_host_.fetch_add(host_segments, std::memory_order_relaxed);
  load_bytes_host_.fetch_add(host_bytes, std::memory_order_relaxed);
  load_segments_nvme_.fetch_add(nvme_segments, std::memory_order_relaxed);
  load_bytes_nvme_.fetch_add(nvme_bytes, std::memory_order_relaxed);
}

void CacheEngine::StoreUnitFromDevice(TransferJob& job, const Pool& pool,
                                      uint32_t k, uint32_t begin, uint32_t end,
                                      StreamId stream) {
  const PoolTransfer& t = job.t;
  EngineNamespace& ns = *job.ns;
  DeviceBackend& device = *pool.device->backend;
  const uint16_t l = t.first_layer + k;
  const uint8_t p = pool.layout.part;
  const uint64_t bytes = pool.layout.slot_bytes;
  const bool dirty = ns.tiers_.policy != WritePolicy::kNone;
  quarantine_.Reap();
  // Reserved segments are copied into straight from the device and
  // committed once the copies' event is done (aborted if they failed).
  // Unlike the memfd path, a reservation refused for write-back pressure
  // is not retried here: the engine's Store says Busy for it.
  std::vector<std::pair<uint32_t, SegmentKey>> reserved;
  std::vector<SegmentKey> admitted;  // HBM copies of what is stored
  for (uint32_t i = begin; i < end; ++i) {
    const SegmentKey key{t.pages[i], l, p};
    auto r = ns.host_->Reserve(key, bytes);
    if (!r.ok()) {
      RecordError(job, i, l, p, r.status().code());
      continue;
    }
    if (r->already_stored) {
      store_dedup_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    std::span<std::byte> dst{ns.host_->arena().base() + r->location.offset,
                             bytes};
    if (Status s = device.CopyToHost(stream, dst, pool.DeviceSlot(t.slots[i]));
        !s.ok()) {
      ns.host_->Abort(key);
      RecordError(job, i, l, p, s.code());
      continue;
    }
    reserved.emplace_back(i, key);
    // A segment an engine just computed is likely read again soon: keep a
    // copy in HBM too (device to device, off the PCIe bus).
    QueueHbmAdmission(ns, key, device, pool.DeviceSlot(t.slots[i]), stream,
                      &admitted);
  }
  if (reserved.empty()) return;
  // Failed copies give their reservations back, once the copies are over
  // (a copy past a timed-out wait may still write them).
  const Status done =
      WaitDeviceCopies(device, stream,
                       [this, &ns, reserved, admitted = std::move(admitted),
                        // keeps the engine's pool imported while copies run
                        source = pool.device](const Status& done) {
                         FinishHbmAdmissions(ns, admitted, done.ok());
                         if (done.ok()) return;
                         for (const auto& [i, key] : reserved)
                           ns.host_->Abort(key);
                       });
  for (const auto& [i, key] : reserved) {
    if (!done.ok()) {
      RecordError(job, i, l, p, done.code());
      continue;
    }
    if (Status s = ns.host_->Commit(key, dirty); !s.ok()) {
      RecordError(job, i, l, p, s.code());
      continue;
    }
    store_segments_.fetch_add(1, std::memory_order_relaxed);
    store_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  if (dirty && mover_) mover_->Kick();
}

Status CacheEngine::Prefetch(EngineNamespace& ns,
                             std::span<const PageHash> pages) {
  auto m = Match(ns, pages);  // queues the NVMe-only segments it finds
  if (!m.ok()) return m.status();
  prefetches_.fetch_add(1, std::memory_order_relaxed);
  return Status::OK();
}

Status CacheEngine::ReportTopk(EngineNamespace& ns,
                               std::span<const SelectionReport> reports) {
  const auto layout = ns.layout();
  if (!layout) return Status::InvalidArgument("register a layout first");
  const uint32_t layers = layout->num_layers();
  for (const SelectionReport& r : reports) {
    if (r.layer >= layers) {
      return Status::InvalidArgument(fmt::format(
          "report for layer {} outside the layout's {}", r.layer, layers));
    }
  }
  // A full layer's group: it and the layers after it without index keys.
  auto has_index_key = [&](uint32_t l) {
    for (const PartSpec& p : layout->layers[l].parts) {
      if (p.name == "index_k") return true;
    }
    return false;
  };
  std::vector<std::pair<SegmentKey, double>> weighted;
  for (const SelectionReport& r : reports) {
    if (r.count == 0) continue;
    for (uint32_t l = r.layer; l < layers; ++l) {
      if (l > r.layer && has_index_key(l)) break;
      const auto& parts = layout->layers[l].parts;
      for (uint8_t p = 0; p < parts.size(); ++p) {
        const double weight = parts[p].name == "index_k"
                                  ? r.count * options_.index_key_report_weight
                                  : r.count;
        weighted.push_back(
            {SegmentKey{r.page, static_cast<uint16_t>(l), p}, weight});
      }
    }
  }
  ns.host_->Report(weighted);
  topk_reports_.fetch_add(reports.size(), std::memory_order_relaxed);
  return Status::OK();
}

void CacheEngine::TEST_DrainBackground() {
  if (mover_) mover_->TEST_Drain();
}

}  // namespace tierkv::storage
