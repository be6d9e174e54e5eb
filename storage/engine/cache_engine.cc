// CacheEngine: namespaces and layouts, prefix Match across the tiers, Flush,
// stats and ReportTopk (see cache_engine.h; leased_access.cc,
// pool_transfer.cc and device_transfer.cc hold the rest of the class).
#include "storage/engine/cache_engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_set>

#include "common/sync_point.h"
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
  if (load_workers == 0 || load_workers > 256) {
    return Status::InvalidArgument("engine load_workers must be in [1, 256]");
  }
  if (transfer_lanes == 0 || transfer_lanes > 64) {
    return Status::InvalidArgument("engine transfer_lanes must be in [1, 64]");
  }
  if (nvme_readers == 0 || nvme_readers > 64) {
    return Status::InvalidArgument("engine nvme_readers must be in [1, 64]");
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
  TIERKV_RETURN_IF_ERROR(options.Validate());  // before readers start
  std::vector<std::unique_ptr<Tier>> below;
  if (nvme) {
    below.push_back(std::make_unique<NvmeTier>(
        nvme, NvmeTierOptions{.readers = options.nvme_readers}));
  }
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
    ns->weights_ = o.weights;
    ns->host_ = std::move(host).value();
    ns->tiers_ = NamespaceTiers{
        .ns = tns,
        .top = ns->host_.get(),
        .policy = tiers_below->empty() ? WritePolicy::kNone : o.write_policy,
        .fingerprint = &ns->fingerprint_,
        .prefetch_bytes_per_second = o.prefetch_bytes_per_second,
    };
    pairs.push_back(&ns->tiers_);
    engine->spaces_.push_back(std::move(ns));
  }
  if (options.hbm_pool.bytes > 0) {
    engine->hbm_ = std::make_unique<HbmTier>(options.hbm_pool.bytes,
                                             std::move(hbm_quotas));
    for (const auto& space : engine->spaces_) {
      space->hbm_ =
          std::make_unique<HbmNamespaceTier>(engine->hbm_.get(), space->id());
    }
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
    engine->mover_ = std::make_unique<TierMover>(options.mover, options.clock,
                                                 tiers_below, pairs);
  }
  // No IO below DRAM runs on these threads (the tiers read on their own,
  // the mover writes), so none sets up an io_uring ring.
  engine->workers_ =
      std::make_unique<WorkerPool>(options.workers, options.worker_queue);
  engine->load_workers_ =
      std::make_unique<WorkerPool>(options.load_workers, options.worker_queue);
  return engine;
}

void CacheEngine::BeginTierRead() {
  MutexLock lock(&tier_reads_mu_);
  ++tier_reads_;
}

void CacheEngine::EndTierRead() {
  MutexLock lock(&tier_reads_mu_);
  // Signalled under the lock: the destructor may end the engine as soon
  // as it sees 0.
  if (--tier_reads_ == 0) tier_reads_cv_.SignalAll();
}

uint64_t CacheEngine::PersistDirty(std::chrono::milliseconds budget) {
  return mover_ ? mover_->PersistDirty(options_.clock->Now() + budget) : 0;
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
  // Queued calls complete while everything still exists, and so do the
  // reads below DRAM they started (their completions finish transfers and
  // Gets). The pools stay, refusing work: a late completion's Submit is
  // answered, not a use of a destroyed pool.
  if (load_workers_) load_workers_->Shutdown();  // null when Open failed
  if (workers_) workers_->Shutdown();
  TIERKV_SYNC_POINT(kBeforeWaitingForTierReads);
  {
    MutexLock lock(&tier_reads_mu_);
    while (tier_reads_ > 0) tier_reads_cv_.Wait(&tier_reads_mu_);
  }
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
  if (ns.weights_) {
    return Status::InvalidArgument("a weights namespace has no KV layout");
  }
  TIERKV_RETURN_IF_ERROR(layout.Validate());
  MutexLock lock(&ns.layout_mu_);
  if (!ns.layout_) {
    ns.layout_ = std::make_shared<const LayoutSpec>(layout);
    ns.fingerprint_.store(layout.Fingerprint(), std::memory_order_release);
    // The host index's memory for an arena full of this layout's pages,
    // populated as the arena was (HostTier::ReserveIndex), on a worker so
    // that this reply does not wait. Skipped when the workers are saturated:
    // the index then grows on first use, as it always may.
    uint64_t page_bytes = 0, page_segments = 0;
    for (const LayerSpec& l : layout.layers) {
      for (const PartSpec& part : l.parts) {
        page_bytes += uint64_t{part.bytes_per_token} * layout.page_tokens;
        ++page_segments;
      }
    }
    const uint64_t segments =
        ns.host_->capacity_bytes() / page_bytes * page_segments;
    (void)Submit([&ns, segments] { ns.host_->ReserveIndex(segments); });
    return Status::OK();
  }
  if (*ns.layout_ == layout) return Status::OK();
  return Status::InvalidArgument("namespace '" + ns.name() +
                                 "' already has a different layout");
}

Status CacheEngine::CheckSize(const EngineNamespace& ns, const SegmentKey& key,
                              uint64_t size) const {
  if (ns.weights_) return CheckChunk(key, size);
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
  return Submit(*workers_, std::move(job));
}

bool CacheEngine::Submit(WorkerPool& pool, std::function<void()> job) {
  if (pool.TrySubmit(std::move(job))) return true;
  worker_rejections_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

Result<EngineMatch> CacheEngine::Match(EngineNamespace& ns,
                                       std::span<const PageHash> pages,
                                       NvmePromotion promotion,
                                       LayerRange prefetch) {
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
        hbm = hbm && ns.hbm_->Contains(key);
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
    out.leading_peer_pages += tier == tierkv::Tier::kPeer;
    out.leading_hbm_pages += tier == tierkv::Tier::kHbm;
    for (; b < below_keys.size() && below_page[b] == n; ++b) {
      const uint64_t bytes = where[b].bytes;
      if (prefetch.Contains(below_keys[b].layer) &&
          prefetch_bytes + bytes <= prefetch_budget) {
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

std::vector<bool> CacheEngine::HeldLocally(
    EngineNamespace& ns, std::span<const PageHash> pages) const {
  std::vector<bool> held(pages.size(), false);
  const auto layout = ns.layout();
  if (!layout) return held;
  std::vector<SegmentKey> below_keys;  // DRAM misses, in page order
  std::vector<uint32_t> below_page;    // the page of each
  for (uint32_t n = 0; n < pages.size(); ++n) {
    held[n] = true;
    for (uint16_t l = 0; l < layout->num_layers(); ++l) {
      const auto parts = layout->layers[l].parts.size();
      for (uint8_t p = 0; p < parts; ++p) {
        const SegmentKey key{pages[n], l, p};
        if (ns.host_->Contains(key)) continue;
        below_keys.push_back(key);
        below_page.push_back(n);
      }
    }
  }
  if (below_keys.empty()) return held;
  const std::vector<TierChain::Location> where = chain_->Locate(
      ns.tiers_.ns, ns.fingerprint(), below_keys, TierScope::kLocal);
  for (size_t b = 0; b < below_keys.size(); ++b) {
    if (where[b].tier == TierChain::kNowhere) held[below_page[b]] = false;
  }
  return held;
}

bool CacheEngine::HasPools(uint64_t owner) const {
  MutexLock lock(&owners_mu_);
  auto it = owners_.find(owner);
  return it != owners_.end() && !it->second.pools.empty();
}

void CacheEngine::Flush(EngineNamespace& ns, std::vector<SegmentKey> keys,
                        std::function<void(std::vector<Status>)> done) {
  if (!chain_->can_persist()) {
    done(std::vector<Status>(
        keys.size(), Status::InvalidArgument("this daemon has no NVMe tier")));
    return;
  }
  // The mover's workers write and sync: no engine worker waits for that.
  mover_->Persist(&ns.tiers_, std::move(keys), std::move(done));
}

std::vector<SegmentInfo> CacheEngine::List(EngineNamespace& ns,
                                           size_t limit) const {
  return ns.host_->List(limit);
}

EngineStats CacheEngine::Stats(EngineNamespace& ns) const {
  EngineStats s = SharedStats();
  s.host = ns.host_->Stats();
  s.hbm_namespace = ns.id();
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
  s.worker_queue_depth = workers_->queue_depth() + load_workers_->queue_depth();
  s.worker_rejections = worker_rejections_.load(std::memory_order_relaxed);
  s.backpressure_waits = backpressure_waits_.load(std::memory_order_relaxed);
  s.lower_tier_dedup_hits =
      lower_tier_dedup_hits_.load(std::memory_order_relaxed);
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
  s.weights_loads = get(weights_loads_);
  s.transfers = s.loads + s.stores + s.weights_loads;
  s.prefetches = get(prefetches_);
  s.topk_reports = get(topk_reports_);
  s.load_latency = load_latency_.Snapshot();
  s.load_latency_nanos = load_latency_.total_nanos();
  s.store_latency = store_latency_.Snapshot();
  s.store_latency_nanos = store_latency_.total_nanos();
  s.weights_load_latency = weights_load_latency_.Snapshot();
  s.weights_load_latency_nanos = weights_load_latency_.total_nanos();
  MutexLock lock(&owners_mu_);
  for (const auto& [owner, o] : owners_) s.registered_pools += o.pools.size();
  return s;
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
