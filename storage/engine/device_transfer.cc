// CacheEngine's device side: engines' device pools (backends per GPU,
// streams per transfer unit), Load / Store units that copy on a device
// stream and wait for its event, HBM tier hits and admissions, and the
// quarantine of memory behind a timed-out wait (see cache_engine.h).
#include <fmt/format.h>

#include "storage/engine/cache_engine.h"
#include "storage/storage_log.h"

namespace tierkv::storage {

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
                                    const DeviceRegion& src,
                                    HbmAdmissions* batch) {
  if (&device != options_.device || !HbmUsable()) return;
  auto at = ns.hbm_->Reserve(key, src.bytes);
  if (!at.ok() || at->already_stored) return;  // no room, or already there
  batch->keys.push_back(key);
  batch->dsts.push_back({options_.hbm_pool.id, at->location.offset, src.bytes});
  batch->srcs.push_back(src);
}

void CacheEngine::SubmitHbmAdmissions(EngineNamespace& ns, StreamId stream,
                                      HbmAdmissions* batch,
                                      std::vector<SegmentKey>* admitted) {
  if (batch->keys.empty()) return;
  if (options_.device->CopyOnDeviceBatch(stream, batch->dsts, batch->srcs)
          .ok()) {
    admitted->insert(admitted->end(), batch->keys.begin(), batch->keys.end());
  } else {
    for (const SegmentKey& key : batch->keys) ns.hbm_->Abort(key);
  }
  *batch = {};
}

void CacheEngine::FinishHbmAdmissions(EngineNamespace& ns,
                                      std::span<const SegmentKey> admitted,
                                      bool copied) {
  for (const SegmentKey& key : admitted) {
    if (copied) {
      // NotFound only if the reservation is gone; nothing to undo then.
      ns.hbm_->Commit(key).PermitUncheckedError();
    } else {
      ns.hbm_->Abort(key);
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
  LeasedTier* const hbm =
      &device == options_.device && HbmUsable() ? ns.hbm_.get() : nullptr;
  const uint32_t hbm_pool = options_.hbm_pool.id;
  std::vector<SegmentKey> held, hbm_held, admitted;
  std::vector<uint32_t> copied;  // pages whose copy was submitted
  uint64_t host_bytes = 0, nvme_bytes = 0, nvme_segments = 0;
  std::vector<TierReadItem> reads;
  std::vector<uint32_t> read_page;
  PinnedStaging::Buffer bounce;
  // Host -> device copies go in batches (one submission per source tier:
  // CopyToDeviceBatch), the batch's HBM admissions as one device batch
  // after it.
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
    HbmAdmissions admissions;
    for (size_t b = 0; b < batch_pages.size(); ++b) {
      const uint32_t i = batch_pages[b];
      if (!s.ok()) {
        RecordError(job, i, l, p, s.code());
        ok[b] = false;
        continue;
      }
      copied.push_back(i);
      QueueHbmAdmission(ns, {t.pages[i], l, p}, device, batch_slots[b],
                        &admissions);
    }
    SubmitHbmAdmissions(ns, stream, &admissions, &admitted);
    batch_pages.clear();
    batch_slots.clear();
    batch_sources.clear();
    return ok;
  };
  // HBM hits first, copied as one device-to-device batch; if the batch is
  // refused, every page is served from below instead.
  std::vector<bool> from_hbm(end - begin, false);
  if (hbm != nullptr) {
    std::vector<uint32_t> hit_pages;
    std::vector<DeviceRegion> hit_slots, hit_sources;
    for (uint32_t i = begin; i < end; ++i) {
      const SegmentKey key{t.pages[i], l, p};
      auto at = hbm->Acquire(key);
      if (!at.ok()) continue;
      if (at->size != bytes) {
        hbm->Release(key);
        continue;
      }
      hbm_held.push_back(key);
      hit_pages.push_back(i);
      hit_slots.push_back(pool.DeviceSlot(t.slots[i]));
      hit_sources.push_back({hbm_pool, at->offset, bytes});
    }
    if (!hit_pages.empty()) {
      if (device.CopyOnDeviceBatch(stream, hit_slots, hit_sources).ok()) {
        for (uint32_t i : hit_pages) {
          from_hbm[i - begin] = true;
          copied.push_back(i);
        }
      } else {
        for (const SegmentKey& key : hbm_held) hbm->Release(key);
        hbm_held.clear();
      }
    }
  }
  for (uint32_t i = begin; i < end; ++i) {
    if (from_hbm[i - begin]) continue;
    const SegmentKey key{t.pages[i], l, p};
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
  // Each read lands block-aligned with room for whole blocks, so a tier
  // that reads blocks reads straight into the (pinned) staging.
  const uint64_t stride =
      (bytes + kTierBlockBytes - 1) / kTierBlockBytes * kTierBlockBytes;
  if (!read_page.empty()) {
    const uint64_t bounce_bytes = read_page.size() * stride;
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
                       bounce.bytes.subspan(r * stride, stride)});
    }
  }
  if (!read_page.empty()) {
    // Waits, unlike a host pool's unit: the staged segments' device copies
    // follow on this unit's stream, and the unit waits for that stream's
    // event below anyway. A Load lane (load_workers), apart from Puts
    // waiting for write-back room.
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
      copy(i, reads[r].dst.first(bytes));
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
    for (const SegmentKey& key : hbm_held) ns.hbm_->Release(key);
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
  // Under write-back pressure a reservation waits for the mover as the
  // memfd path's and a Put's do.
  std::optional<Clock::TimePoint> deadline;
  std::vector<std::pair<uint32_t, SegmentKey>> reserved;
  HbmAdmissions admissions;  // HBM copies of what is stored
  for (uint32_t i = begin; i < end; ++i) {
    const SegmentKey key{t.pages[i], l, p};
    auto r = ReserveForStore(job, key, bytes, i, &deadline);
    if (!r) continue;
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
    QueueHbmAdmission(ns, key, device, pool.DeviceSlot(t.slots[i]),
                      &admissions);
  }
  std::vector<SegmentKey> admitted;
  SubmitHbmAdmissions(ns, stream, &admissions, &admitted);
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

}  // namespace tierkv::storage
