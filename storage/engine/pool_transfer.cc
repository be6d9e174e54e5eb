// CacheEngine's registered pools and per-layer transfers: pool and ticket
// registration, Load / Store lanes over layer units, the stream gate, layer
// publication through the client's tickets, and the memfd copies (see
// cache_engine.h; device pools: device_transfer.cc).
#include <fmt/format.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <thread>
#include <tuple>

#include "common/load_ticket.h"
#include "common/stream_copy.h"
#include "common/sync_point.h"
#include "storage/engine/cache_engine.h"
#include "tierkv/weights.h"

namespace tierkv::storage {

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
  if (ns.weights()) {
    // A weights namespace has no KV layout: an engine registers the one
    // buffer its shards' images load into (LoadWeights).
    if (pool.layer != 0 || pool.part != 0 || pool.slot_count != 1) {
      return Status::InvalidArgument(
          "a weights namespace takes one image pool per connection: layer "
          "0, part 0, one slot of the image's bytes");
    }
    if (pool.slot_bytes == 0 || pool.slot_bytes > kWeightsMaxImageBytes) {
      return Status::InvalidArgument(
          fmt::format("an image pool holds 1..{} bytes, not {}",
                      kWeightsMaxImageBytes, pool.slot_bytes));
    }
    return Status::OK();
  }
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

Result<const CacheEngine::OwnerPools*> CacheEngine::OwnerWithTicketLocked(
    uint64_t owner, uint32_t ticket, std::string_view call) const {
  auto it = owners_.find(owner);
  if (it == owners_.end() || !it->second.tickets) {
    return Status::InvalidArgument(
        fmt::format("register tickets before {}", call));
  }
  if (ticket >= it->second.ticket_count) {
    return Status::InvalidArgument("ticket index out of range");
  }
  return &it->second;
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
    auto found = OwnerWithTicketLocked(owner, t.ticket, "Load/Store");
    if (!found.ok()) return found.status();
    const OwnerPools& o = **found;
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
  ArmTicket(*job, t.ticket);
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

void CacheEngine::ArmTicket(TransferJob& job, uint32_t index) {
  LoadTicket& ticket = TicketAt(*job.tickets, index);
  ticket.error_count.store(0, std::memory_order_relaxed);
  ticket.finished.store(0, std::memory_order_relaxed);
  ticket.first_layer_ns.store(0, std::memory_order_relaxed);
  ticket.last_layer_ns.store(0, std::memory_order_relaxed);
  ticket.layers_done.store(0, std::memory_order_release);
  // The client set both before it sent the request; read once, so a
  // client rewriting them later changes nothing here.
  job.gate_target = ticket.gate_target.load(std::memory_order_acquire);
  job.device_base = ticket.device_layers.load(std::memory_order_acquire);
}

Result<std::shared_ptr<CacheEngine::TransferJob>>
CacheEngine::PrepareWeightsTransfer(uint64_t owner, EngineNamespace& ns,
                                    WeightsTransfer t) {
  if (!ns.weights()) {
    return Status::InvalidArgument(
        "LoadWeights needs a weights namespace (weights = true)");
  }
  if (t.manifest == nullptr) return Status::InvalidArgument("no manifest");
  const WeightsManifest& m = *t.manifest;
  if (t.num_layers == 0 ||
      uint32_t{t.first_layer} + t.num_layers > m.num_layers) {
    return Status::InvalidArgument(
        fmt::format("layers [{}, {}) outside the shard's {}", t.first_layer,
                    t.first_layer + t.num_layers, m.num_layers));
  }
  auto job = std::make_shared<TransferJob>();
  job->ns = &ns;
  {
    MutexLock lock(&owners_mu_);
    auto found = OwnerWithTicketLocked(owner, t.ticket, "LoadWeights");
    if (!found.ok()) return found.status();
    const OwnerPools& o = **found;
    auto pool = o.pools.find(PoolKey(0, 0));
    if (pool == o.pools.end()) {
      return Status::InvalidArgument(
          "register an image pool (layer 0, part 0, one slot) on this "
          "connection before LoadWeights");
    }
    if (pool->second.layout.slot_bytes < m.image_bytes) {
      return Status::InvalidArgument(fmt::format(
          "the image pool holds {} bytes; the shard's image needs {}",
          pool->second.layout.slot_bytes, m.image_bytes));
    }
    job->tickets = o.tickets;
    job->pools.assign(t.num_layers, std::vector<Pool>{pool->second});
  }
  ArmTicket(*job, t.ticket);
  job->t = PoolTransfer{.first_layer = t.first_layer,
                        .num_layers = t.num_layers,
                        .ticket = t.ticket};
  job->weights = std::move(t.manifest);
  job->splits = 1;  // a layer's chunks are one unit; lanes share layers
  {
    MutexLock lock(&job->mu);
    job->units_left.assign(job->t.num_layers, 1);
    job->layer_done.assign(job->t.num_layers, false);
  }
  return job;
}

void CacheEngine::StageWeights(uint64_t owner, EngineNamespace& ns,
                               std::vector<WeightsExtent> extents,
                               StageDone done) {
  if (!ns.weights()) {
    return done(Status::InvalidArgument(
        "staging weights needs a weights namespace (weights = true)"));
  }
  Pool pool;
  {
    MutexLock lock(&owners_mu_);
    auto it = owners_.find(owner);
    const Pool* found = nullptr;
    if (it != owners_.end()) {
      auto p = it->second.pools.find(PoolKey(0, 0));
      if (p != it->second.pools.end()) found = &p->second;
    }
    if (found == nullptr) {
      return done(Status::InvalidArgument(
          "register an image pool (layer 0, part 0, one slot) on this "
          "connection before staging weights from it"));
    }
    pool = *found;
  }
  // One request's copying and hashing, bounded so that a client cannot
  // hold a worker for long (the client sends about weights_batch_bytes).
  constexpr uint64_t kMaxStageBytes = uint64_t{4} << 30;
  uint64_t total = 0;
  for (const WeightsExtent& e : extents) {
    total += std::min(e.bytes, kWeightsMaxChunkBytes + 1);
    if (total > kMaxStageBytes) {
      return done(Status::InvalidArgument(fmt::format(
          "one staging request moves at most {} bytes", kMaxStageBytes)));
    }
    if (e.bytes == 0 || e.bytes > kWeightsMaxChunkBytes ||
        e.offset > pool.layout.slot_bytes ||
        e.bytes > pool.layout.slot_bytes - e.offset) {
      return done(Status::InvalidArgument(fmt::format(
          "a chunk of {} bytes at image offset {}: a chunk has 1..{} bytes "
          "inside the {}-byte image pool",
          e.bytes, e.offset, kWeightsMaxChunkBytes, pool.layout.slot_bytes)));
    }
  }
  auto shared = std::make_shared<StageDone>(std::move(done));
  if (!Submit([this, &ns, pool = std::move(pool), extents = std::move(extents),
               shared] { (*shared)(StageChunks(ns, pool, extents)); })) {
    (*shared)(Status::Busy("daemon workers are saturated; retry"));
  }
}

Status CacheEngine::LoadWeights(uint64_t owner, EngineNamespace& ns,
                                WeightsTransfer t) {
  const auto accepted = std::chrono::steady_clock::now();
  return StartTransfer(PrepareWeightsTransfer(owner, ns, std::move(t)), true,
                       accepted);
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
  (*job)->gate_deadline = options_.clock->Now() + options_.device_copy_timeout;
  TicketAt(*(*job)->tickets, (*job)->t.ticket)
      .accepted_ns.store(MonotonicNanos(accepted), std::memory_order_relaxed);
  if (!Submit(LanesFor(load),
              [this, job = *job] { RunLane(job, /*first=*/true); })) {
    return Status::Busy("daemon workers are saturated; retry");
  }
  (!load             ? stores_
   : (*job)->weights ? weights_loads_
                     : loads_)
      .fetch_add(1, std::memory_order_relaxed);
  return Status::OK();
}

void CacheEngine::RunLane(const std::shared_ptr<TransferJob>& job, bool first) {
  if (first) {
    // More lanes only where workers are idle now: a rejected lane is not a
    // rejected request, so it is not counted as one.
    const uint32_t lanes =
        std::min<uint32_t>(options_.transfer_lanes, job->t.num_layers);
    for (uint32_t i = 1; i < lanes; ++i) {
      job->working.fetch_add(1, std::memory_order_relaxed);
      if (!LanesFor(job->load).TrySubmit(
              [this, job] { RunLane(job, false); })) {
        job->working.fetch_sub(1, std::memory_order_relaxed);
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
    [[maybe_unused]] uint16_t layer = job->t.first_layer + k;
    TIERKV_SYNC_POINT_CALLBACK(kBeforeTransferUnit, &layer);
    const uint32_t begin =
        static_cast<uint32_t>(uint64_t{pages} * s / job->splits);
    const uint32_t end =
        static_cast<uint32_t>(uint64_t{pages} * (s + 1) / job->splits);
    if (!gate_open) {
      FailUnit(*job, k, begin, end);
    } else if (job->weights) {
      if (LoadWeightsLayer(job, k)) continue;  // its read finishes it
    } else if (job->load) {
      if (LoadLayer(job, k, begin, end)) continue;  // its read finishes it
    } else {
      StoreLayer(*job, k, begin, end);
    }
    FinishUnit(*job, k);
  }
  LeaveJob(job);
}

void CacheEngine::FailUnit(TransferJob& job, uint32_t k, uint32_t begin,
                           uint32_t end) {
  // The engine's stream never reached the transfer: its slots may still be
  // in use, so nothing is moved and every segment says why.
  const uint16_t l = job.t.first_layer + k;
  if (job.weights) {
    const auto [first, last] = job.weights->ChunksOfLayer(l);
    for (size_t c = first; c < last; ++c) {
      RecordError(job, static_cast<uint32_t>(c), l, 0, StatusCode::kBusy);
    }
    return;
  }
  for (uint32_t i = begin; i < end; ++i) {
    for (uint8_t p = 0; p < job.pools[k].size(); ++p) {
      RecordError(job, i, l, p, StatusCode::kBusy);
    }
  }
}

void CacheEngine::LeaveJob(const std::shared_ptr<TransferJob>& job) {
  // acq_rel: the last one out sees every lane's and read's writes to the
  // pools.
  if (job->working.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  // Queued before the ticket says finished, so a finished Load's promotion
  // is already on the mover's queue.
  if (job->load) PromoteLoaded(*job);
  PublishFinished(TicketAt(*job->tickets, job->t.ticket));
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
  // Spin, yield, then back off: pacing in real time; the deadline is on the
  // engine's clock.
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(10);
  bool passed = false;
  while (job.gate.load(std::memory_order_acquire) == Job::kGateUnknown) {
    if (open()) {
      passed = true;
      break;
    }
    if (options_.clock->Now() >= job.gate_deadline) break;
    const auto now = std::chrono::steady_clock::now();
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
  if (job.weights) {
    // In the order the reads completed (lanes take layers in order, so
    // roughly layer order); at the background IO class, within the
    // namespace's prefetch cap, as every weights promotion.
    PromoteInOrder(*job.ns, keys);
    return;
  }
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
    (!job.load     ? store_latency_
     : job.weights ? weights_load_latency_
                   : load_latency_)
        .Record(now - job.accepted);
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

bool CacheEngine::LoadLayer(const std::shared_ptr<TransferJob>& shared,
                            uint32_t k, uint32_t begin, uint32_t end) {
  TransferJob& job = *shared;
  const PoolTransfer& t = job.t;
  EngineNamespace& ns = *job.ns;
  const uint16_t l = t.first_layer + k;
  // What DRAM lacks, read from below in one batch for every part of the
  // unit, so the device queue holds all of it at once.
  std::vector<TierReadItem> reads;
  std::vector<LoadRead> read_of;
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
        read_of.push_back({key, i, pool.layout.slot_bytes, l});
      } else {
        RecordError(job, i, l, p, StatusCode::kNotFound);
        load_misses_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  if (reads.empty()) return false;
  ReadBelow(shared, k, std::move(reads), std::move(read_of));
  return true;
}

void CacheEngine::ReadBelow(const std::shared_ptr<TransferJob>& shared,
                            uint32_t k, std::vector<TierReadItem> reads,
                            std::vector<LoadRead> read_of) {
  EngineNamespace& ns = *shared->ns;
  // Straight into the slots where aligned, else through a bounce buffer;
  // either way the checksum is verified before a hit counts. The read
  // completes on the tier's thread: this lane goes on with the next unit
  // meanwhile, so the device's queue holds this layer and the next.
  shared->working.fetch_add(1, std::memory_order_relaxed);
  BeginTierRead();
  chain_->Read(ns.tiers_.ns, ns.fingerprint(), reads,
               [this, job = shared, k, read_of = std::move(read_of)](
                   TierChain::ReadResult got) mutable {
                 FinishLoadReads(*job, read_of, got.items);
                 FinishUnit(*job, k);
                 LeaveJob(job);
                 job.reset();  // before the engine may end (EndTierRead)
                 EndTierRead();
               });
}

void CacheEngine::FinishLoadReads(TransferJob& job,
                                  std::span<const LoadRead> reads,
                                  std::span<const Result<uint64_t>> got) {
  std::vector<SegmentKey> read_ok;
  for (size_t r = 0; r < reads.size(); ++r) {
    const LoadRead& read = reads[r];
    if (got[r].ok() && *got[r] == read.bytes) {
      load_segments_nvme_.fetch_add(1, std::memory_order_relaxed);
      load_bytes_nvme_.fetch_add(*got[r], std::memory_order_relaxed);
      read_ok.push_back(read.key);
    } else {
      // What a failed read left where it landed is not the segment's.
      if (!read.scrub.empty()) {
        std::memset(read.scrub.data(), 0, read.scrub.size());
      }
      RecordError(
          job, read.page, read.layer, read.key.part,
          got[r].ok() ? StatusCode::kCorruption : got[r].status().code());
      load_misses_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (!read_ok.empty()) {
    MutexLock lock(&job.mu);
    job.from_nvme.insert(job.from_nvme.end(), read_ok.begin(), read_ok.end());
  }
}

std::optional<Reservation> CacheEngine::ReserveForStore(
    TransferJob& job, const SegmentKey& key, uint64_t bytes, uint32_t page,
    std::optional<Clock::TimePoint>* deadline) {
  EngineNamespace& ns = *job.ns;
  auto r = ns.host_->Reserve(key, bytes);
  if (r.status().code() == StatusCode::kBusy && mover_) {
    if (!*deadline) {
      *deadline = options_.clock->Now() + options_.write_back_wait;
      backpressure_waits_.fetch_add(1, std::memory_order_relaxed);
    }
    r = ReserveAfterWriteBack(ns, key, bytes, **deadline);
  }
  if (!r.ok()) {
    RecordError(job, page, key.layer, key.part, r.status().code());
    return std::nullopt;
  }
  if (r->already_stored) {
    store_dedup_.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  return *r;
}

void CacheEngine::StoreLayer(TransferJob& job, uint32_t k, uint32_t begin,
                             uint32_t end) {
  const PoolTransfer& t = job.t;
  EngineNamespace& ns = *job.ns;
  const uint16_t l = t.first_layer + k;
  const bool dirty = ns.tiers_.policy != WritePolicy::kNone;
  // Under write-back pressure a Store waits for the mover as a Put does (it
  // runs on a worker, never on an IO thread), up to write_back_wait.
  std::optional<Clock::TimePoint> deadline;
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
      auto r = ReserveForStore(job, key, pool.layout.slot_bytes, i, &deadline);
      if (!r) continue;
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

}  // namespace tierkv::storage
