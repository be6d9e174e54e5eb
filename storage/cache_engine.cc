// CacheEngine: matching, leases, dedup, promotion and persistence over the
// host and NVMe tiers (see cache_engine.h).
#include "storage/cache_engine.h"

#include <fmt/format.h>

#include <unordered_set>

namespace tierkv::storage {

Status CacheEngineOptions::Validate() const {
  if (lease_ttl.count() <= 0 || max_pin_ttl.count() <= 0) {
    return Status::InvalidArgument("lease_ttl and max_pin_ttl must be > 0");
  }
  if (workers == 0 || workers > 256) {
    return Status::InvalidArgument("engine workers must be in [1, 256]");
  }
  if (worker_queue == 0) {
    return Status::InvalidArgument("engine worker_queue must be > 0");
  }
  if (clock == nullptr) return Status::InvalidArgument("engine clock is null");
  return mover.Validate();
}

std::optional<LayoutSpec> EngineNamespace::layout() const {
  MutexLock lock(&layout_mu_);
  return layout_;
}

CacheEngine::CacheEngine(const CacheEngineOptions& options, NvmeStore* nvme)
    : options_(options), nvme_(nvme) {}

Result<std::unique_ptr<CacheEngine>> CacheEngine::Open(
    const CacheEngineOptions& options, std::vector<NamespaceOptions> spaces,
    NvmeStore* nvme) {
  TIERKV_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<CacheEngine> engine(new CacheEngine(options, nvme));
  std::unordered_set<std::string> names;
  std::vector<const TierPair*> pairs;
  for (NamespaceOptions& o : spaces) {
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
    auto ns = std::make_unique<EngineNamespace>();
    ns->host_ = std::move(host).value();
    ns->tiers_ = TierPair{
        .ns = o.host.name,
        .host = ns->host_.get(),
        .nvme = nvme,
        .policy = nvme ? o.write_policy : WritePolicy::kNone,
        .fingerprint = &ns->fingerprint_,
    };
    pairs.push_back(&ns->tiers_);
    engine->spaces_.push_back(std::move(ns));
  }
  engine->leases_ = std::make_unique<LeaseTable>(options.clock);
  if (nvme) {
    engine->mover_ = std::make_unique<TierMover>(options.mover, pairs);
  }
  engine->workers_ =
      std::make_unique<WorkerPool>(options.workers, options.worker_queue);
  return engine;
}

CacheEngine::~CacheEngine() {
  workers_.reset();  // queued calls complete while everything still exists
  mover_.reset();
  leases_.reset();  // ends leases while the host tiers exist
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
    ns.layout_ = layout;
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
                                       std::span<const PageHash> pages) {
  const auto layout = ns.layout();
  if (!layout) {
    return Status::InvalidArgument("register a layout before Match");
  }
  const uint64_t fingerprint = ns.fingerprint();
  EngineMatch out;
  out.tiers.reserve(pages.size());
  bool leading = true;
  std::vector<SegmentKey> promote;  // NVMe-only segments of leading pages
  // Prefetching more than half the host tier would evict what it brought
  // in before the Get that follows.
  const uint64_t prefetch_budget = ns.host_->Stats().capacity_bytes / 2;
  uint64_t prefetch_bytes = 0;
  for (const PageHash& page : pages) {
    Tier tier = Tier::kHost;
    const size_t mark = promote.size();
    for (uint16_t l = 0; tier != Tier::kMiss && l < layout->num_layers(); ++l) {
      const auto parts = layout->layers[l].parts.size();
      for (uint8_t p = 0; tier != Tier::kMiss && p < parts; ++p) {
        const SegmentKey key{page, l, p};
        if (ns.host_->Touch(key)) continue;
        if (nvme_ && nvme_->Contains(ns.name(), key, fingerprint)) {
          tier = Tier::kNvme;
          const uint64_t bytes = layout->SegmentBytes(l, p);
          if (prefetch_bytes + bytes <= prefetch_budget) {
            promote.push_back(key);
            prefetch_bytes += bytes;
          }
        } else {
          tier = Tier::kMiss;
        }
      }
    }
    out.tiers.push_back(tier);
    leading = leading && tier != Tier::kMiss;
    if (leading) {
      out.leading_pages++;
      out.leading_nvme_pages += tier == Tier::kNvme;
    } else {
      // Only what the engine will read next.
      for (size_t k = mark; k < promote.size(); ++k) {
        prefetch_bytes -=
            layout->SegmentBytes(promote[k].layer, promote[k].part);
      }
      promote.resize(mark);
    }
  }
  if (mover_ && !promote.empty()) {
    mover_->Prefetch(&ns.tiers_, std::move(promote));
  }
  return out;
}

void CacheEngine::Reserve(uint64_t owner, EngineNamespace& ns,
                          std::vector<SegmentSize> items,
                          std::function<void(EngineReservation)> done) {
  EngineReservation r;
  r.items.reserve(items.size());
  std::vector<size_t> busy;
  for (size_t i = 0; i < items.size(); ++i) {
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
      const SegmentSize& item = items[i];
      // Each retry needs a reason: a commit, abort or finished write-back
      // in the key's shard since the last attempt.
      while (r.items[i].status().code() == StatusCode::kBusy) {
        const uint64_t seen = ns.host_->ShardGeneration(item.key);
        r.items[i] = ns.host_->Reserve(item.key, item.size);
        if (r.items[i].status().code() != StatusCode::kBusy) break;
        mover_->Kick();
        if (!ns.host_->WaitShardChange(item.key, seen, deadline)) break;
      }
      if (r.items[i].status().code() == StatusCode::kBusy) {
        backpressure_busy_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  std::vector<SegmentKey> reserved;
  for (size_t i = 0; i < items.size(); ++i) {
    if (r.items[i].ok() && !r.items[i]->already_stored) {
      reserved.push_back(items[i].key);
    }
  }
  if (!reserved.empty()) {
    r.lease_id = leases_->Add(owner, LeaseKind::kWrite, ns.host_.get(),
                              std::move(reserved), options_.lease_ttl);
  }
  done(std::move(r));
}

std::vector<Status> CacheEngine::Commit(uint64_t owner, EngineNamespace& ns,
                                        uint64_t lease_id,
                                        std::span<const SegmentKey> keys) {
  const bool dirty = ns.tiers_.policy != WritePolicy::kNone;
  std::vector<Status> out = leases_->Commit(owner, lease_id, keys, dirty);
  if (dirty && mover_) mover_->Kick();
  return out;
}

void CacheEngine::Acquire(uint64_t owner, EngineNamespace& ns,
                          std::vector<SegmentKey> keys,
                          std::function<void(EngineRead)> done) {
  EngineRead read;
  read.items.reserve(keys.size());
  read.source.assign(keys.size(), Tier::kMiss);
  std::vector<size_t> missing;
  for (size_t i = 0; i < keys.size(); ++i) {
    Result<SegmentLocation> loc = ns.host_->Acquire(keys[i]);
    if (loc.ok()) {
      read.source[i] = Tier::kHost;
    } else if (nvme_ && loc.status().IsNotFound()) {
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
    const std::vector<Status> promoted = mover_->PromoteBatch(
        ns.tiers_, wanted,
        std::chrono::steady_clock::now() + options_.write_back_wait);
    for (size_t m = 0; m < missing.size(); ++m) {
      const size_t i = missing[m];
      if (!promoted[m].ok()) {
        read.items[i] = promoted[m];
        continue;
      }
      read.items[i] = ns.host_->Acquire(keys[i]);
      if (read.items[i].ok()) read.source[i] = Tier::kNvme;
    }
  }
  std::vector<SegmentKey> leased;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (read.items[i].ok()) leased.push_back(keys[i]);
  }
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
  std::vector<SegmentKey> pinned;
  for (const SegmentKey& key : keys) {
    auto found = ns.host_->Acquire(key);
    out.items.push_back(found.status());
    if (found.ok()) pinned.push_back(key);
  }
  if (!pinned.empty()) {
    out.lease_id = leases_->Add(owner, LeaseKind::kPin, ns.host_.get(),
                                std::move(pinned), ttl);
  }
  return out;
}

Status CacheEngine::Release(uint64_t owner, uint64_t lease_id) {
  return leases_->Release(owner, lease_id);
}

size_t CacheEngine::ReleaseOwner(uint64_t owner) {
  return leases_->ReleaseOwner(owner);
}

size_t CacheEngine::ExpireLeases() { return leases_->ExpireDue(); }

size_t CacheEngine::active_leases() const { return leases_->size(); }

void CacheEngine::Flush(EngineNamespace& ns, std::vector<SegmentKey> keys,
                        std::function<void(std::vector<Status>)> done) {
  if (!nvme_) {
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
  EngineStats s;
  s.host = ns.host_->Stats();
  if (nvme_) {
    s.has_nvme = true;
    s.nvme = nvme_->Stats();
    s.mover = mover_->Stats();
  }
  s.active_leases = leases_->size();
  s.worker_queue_depth = workers_->queue_depth();
  s.worker_rejections = worker_rejections_.load(std::memory_order_relaxed);
  s.backpressure_waits = backpressure_waits_.load(std::memory_order_relaxed);
  s.backpressure_busy = backpressure_busy_.load(std::memory_order_relaxed);
  return s;
}

void CacheEngine::TEST_DrainBackground() {
  if (mover_) mover_->TEST_Drain();
}

}  // namespace tierkv::storage
