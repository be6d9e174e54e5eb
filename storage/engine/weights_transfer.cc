// CacheEngine's weights loads into an engine's image pool (LoadWeights, see
// cache_engine.h): one unit per layer, whose chunks land at their image
// offsets. The job, its lanes, its ticket and its promotion afterwards are
// the KV Load's (pool_transfer.cc); what differs is where a chunk goes
// (an offset of one pool, not a slot of a layer's pool) and its size (each
// its own).
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <future>

#include "common/stream_copy.h"
#include "storage/engine/cache_engine.h"
#include "tierkv/weights.h"

namespace tierkv::storage {

namespace {

// A device load reads chunks from below DRAM into staging in rounds, with
// up to this many rounds per lane in flight: while one round is copied to
// the device, the next ones are read (NVMe wants several reads queued).
// Fewer when the lane's share of the pinned staging holds fewer rounds of
// the layer's largest chunk (two at least: a borrow past the arena falls
// back to heap memory, slower, never refused).
constexpr size_t kRoundsInFlight = 4;
// A round's bytes (it holds one chunk at least): the lane's share of the
// pinned staging split among its rounds, within these bounds.
constexpr uint64_t kMinRoundBytes = uint64_t{4} << 20;
constexpr uint64_t kMaxRoundBytes = uint64_t{128} << 20;

// Staging outside the pinned arena (none configured, or no room in it):
// block-aligned (so tiers read straight into it) and not zero-filled.
PinnedStaging::Buffer HeapStaging(uint64_t bytes) {
  const uint64_t rounded = std::max<uint64_t>(
      kTierBlockBytes,
      (bytes + kTierBlockBytes - 1) / kTierBlockBytes * kTierBlockBytes);
  auto* heap =
      static_cast<std::byte*>(std::aligned_alloc(kTierBlockBytes, rounded));
  if (heap == nullptr) return {};
  return {{heap, bytes}, false, std::shared_ptr<void>(heap, std::free)};
}

uint64_t RoundUpToBlock(uint64_t bytes) {
  return (bytes + kTierBlockBytes - 1) / kTierBlockBytes * kTierBlockBytes;
}

}  // namespace

bool CacheEngine::LoadWeightsLayer(const std::shared_ptr<TransferJob>& shared,
                                   uint32_t k) {
  TransferJob& job = *shared;
  const Pool& pool = job.pools[k].front();
  if (pool.device) {
    LoadWeightsToDevice(job, pool, k);
    return false;
  }
  EngineNamespace& ns = *job.ns;
  const WeightsManifest& m = *job.weights;
  const uint16_t l = job.t.first_layer + k;
  std::byte* const image = pool.Slot(0);
  const auto [first, last] = m.ChunksOfLayer(l);
  std::vector<TierReadItem> reads;
  std::vector<LoadRead> read_of;
  for (size_t c = first; c < last; ++c) {
    const WeightsChunk& chunk = m.chunks[c];
    const SegmentKey key = WeightsChunkSegment(chunk.key);
    const auto page = static_cast<uint32_t>(c);
    const std::span<std::byte> dst{image + chunk.offset, chunk.bytes};
    // A reference keeps the chunk from eviction during the copy.
    auto loc = ns.host_->Acquire(key);
    if (loc.ok() && loc->size == chunk.bytes) {
      StreamCopy(dst.data(), ns.host_->arena().base() + loc->offset, loc->size);
      ns.host_->Release(key);
      load_segments_host_.fetch_add(1, std::memory_order_relaxed);
      load_bytes_host_.fetch_add(loc->size, std::memory_order_relaxed);
      continue;
    }
    if (loc.ok()) ns.host_->Release(key);
    if (chain_->empty()) {
      RecordError(job, page, l, 0, StatusCode::kNotFound);
      load_misses_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    // Straight into the image: the pool is host memory, so the O_DIRECT
    // read is the copy (a staging buffer would only add one). A chunk
    // whose read fails its checksum is zeroed before its layer is
    // published (LoadRead::scrub), so no corrupt byte stays in the pool.
    reads.push_back({key, dst});
    read_of.push_back({key, page, chunk.bytes, l, dst});
  }
  if (reads.empty()) return false;
  ReadBelow(shared, k, std::move(reads), std::move(read_of));
  return true;
}

void CacheEngine::LoadWeightsToDevice(TransferJob& job, const Pool& pool,
                                      uint32_t k) {
  EngineNamespace& ns = *job.ns;
  const WeightsManifest& m = *job.weights;
  DeviceBackend& device = *pool.device->backend;
  const uint16_t l = job.t.first_layer + k;
  const auto [first, last] = m.ChunksOfLayer(l);
  auto region = [&](const WeightsChunk& chunk) {
    return DeviceRegion{pool.device->pool.pool,
                        pool.layout.offset + chunk.offset, chunk.bytes};
  };
  quarantine_.Reap();
  // DRAM chunks first, as one batch straight from the arena (referenced
  // until the copies are over). Weights namespaces have no HBM tier entry
  // of their own: a shard's home on the device is the engine's image.
  std::vector<SegmentKey> held;
  std::vector<uint32_t> copied, below;
  std::vector<DeviceRegion> dsts;
  std::vector<std::span<const std::byte>> srcs;
  uint64_t host_bytes = 0;
  for (size_t c = first; c < last; ++c) {
    const WeightsChunk& chunk = m.chunks[c];
    const SegmentKey key = WeightsChunkSegment(chunk.key);
    auto loc = ns.host_->Acquire(key);
    if (loc.ok() && loc->size == chunk.bytes) {
      held.push_back(key);
      copied.push_back(static_cast<uint32_t>(c));
      dsts.push_back(region(chunk));
      srcs.push_back({ns.host_->arena().base() + loc->offset, chunk.bytes});
      host_bytes += chunk.bytes;
      continue;
    }
    if (loc.ok()) ns.host_->Release(key);
    if (chain_->empty()) {
      RecordError(job, static_cast<uint32_t>(c), l, 0, StatusCode::kNotFound);
      load_misses_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    below.push_back(static_cast<uint32_t>(c));
  }
  Status failed;  // the first refused submission or failed wait
  auto fail = [&](std::span<const uint32_t> chunks, const Status& s) {
    for (uint32_t c : chunks) RecordError(job, c, l, 0, s.code());
    if (failed.ok()) failed = s;
  };
  if (!copied.empty()) {
    // A stream only around the copies and their wait: never across NVMe
    // reads, which would keep KV transfers from the device's few streams.
    const StreamId stream = AcquireDeviceStream(device);
    Status s = device.CopyToDeviceBatch(stream, dsts, srcs);
    if (s.ok()) {
      s = WaitDeviceCopies(device, stream,
                           [&ns, held = std::move(held),
                            // keeps the image imported while copies run
                            target = pool.device](const Status&) {
                             for (const SegmentKey& key : held) {
                               ns.host_->Release(key);
                             }
                           });
    } else {
      for (const SegmentKey& key : held) ns.host_->Release(key);
    }
    ReleaseDeviceStream(device, stream);
    if (s.ok()) {
      load_segments_host_.fetch_add(copied.size(), std::memory_order_relaxed);
      load_bytes_host_.fetch_add(host_bytes, std::memory_order_relaxed);
    } else {
      fail(copied, s);
    }
  }
  if (below.empty()) return;

  // Chunks only below DRAM: read in rounds of about round_bytes into
  // staging (pinned where the arena has room), each verified by the tier's
  // checksum before it is copied, so a corrupt chunk never reaches the
  // device. Pipelined: the next rounds (up to in_flight - 1) are read while
  // round r's copy runs.
  const uint64_t lanes = std::max<uint32_t>(1, options_.transfer_lanes);
  const uint64_t share = staging_ ? staging_->Stats().capacity_bytes / lanes
                                  : kRoundsInFlight * kMaxRoundBytes;
  uint64_t largest = 0;
  for (uint32_t c : below) {
    largest = std::max(largest, RoundUpToBlock(m.chunks[c].bytes));
  }
  const uint64_t round_bytes = std::max(
      largest,
      std::clamp(share / kRoundsInFlight, kMinRoundBytes, kMaxRoundBytes));
  const size_t in_flight =
      std::clamp<size_t>(share / round_bytes, 2, kRoundsInFlight);
  struct Round {
    std::vector<uint32_t> chunks;
    std::vector<TierReadItem> reads;
    PinnedStaging::Buffer staging;
    std::future<TierChain::ReadResult> got;
  };
  auto start = [&](size_t at, Round* round) -> size_t {
    uint64_t bytes = 0;
    size_t end = at;
    while (end < below.size() &&
           (end == at || bytes + RoundUpToBlock(m.chunks[below[end]].bytes) <=
                             round_bytes)) {
      bytes += RoundUpToBlock(m.chunks[below[end]].bytes);
      ++end;
    }
    round->chunks.assign(below.begin() + at, below.begin() + end);
    round->reads.clear();
    round->staging = staging_ ? staging_->Borrow(bytes) : HeapStaging(bytes);
    if (round->staging.bytes.size() < bytes) {
      // No memory to read into: the round's chunks fail, nothing is read.
      std::promise<TierChain::ReadResult> none;
      TierChain::ReadResult result;
      result.items.assign(round->chunks.size(),
                          Status::ResourceExhausted("no staging memory"));
      none.set_value(std::move(result));
      round->got = none.get_future();
      return end;
    }
    uint64_t offset = 0;
    for (uint32_t c : round->chunks) {
      const WeightsChunk& chunk = m.chunks[c];
      const uint64_t stride = RoundUpToBlock(chunk.bytes);
      round->reads.push_back({WeightsChunkSegment(chunk.key),
                              round->staging.bytes.subspan(offset, stride)});
      offset += stride;
    }
    auto promise = std::make_shared<std::promise<TierChain::ReadResult>>();
    round->got = promise->get_future();
    chain_->Read(ns.tiers_.ns, ns.fingerprint(), round->reads,
                 [promise](TierChain::ReadResult r) {
                   promise->set_value(std::move(r));
                 });
    return end;
  };
  Round rounds[kRoundsInFlight];
  size_t next = 0, started = 0;
  while (started < in_flight && next < below.size()) {
    next = start(next, &rounds[started++]);
  }
  std::vector<SegmentKey> read_ok;
  uint64_t nvme_bytes = 0;
  for (size_t r = 0; r < started; ++r) {
    Round& round = rounds[r % in_flight];
    // Always waited for: the read writes into this lane's staging. The
    // other rounds' reads run while this one is copied.
    const TierChain::ReadResult got = round.got.get();
    std::vector<uint32_t> ok_chunks;
    dsts.clear();
    srcs.clear();
    for (size_t i = 0; i < round.chunks.size(); ++i) {
      const uint32_t c = round.chunks[i];
      const WeightsChunk& chunk = m.chunks[c];
      if (!got.items[i].ok() || *got.items[i] != chunk.bytes) {
        RecordError(job, c, l, 0,
                    got.items[i].ok() ? StatusCode::kCorruption
                                      : got.items[i].status().code());
        load_misses_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      ok_chunks.push_back(c);
      dsts.push_back(region(chunk));
      srcs.push_back(round.reads[i].dst.first(chunk.bytes));
    }
    if (!ok_chunks.empty() && failed.ok()) {
      const StreamId stream = AcquireDeviceStream(device);
      Status s = device.CopyToDeviceBatch(stream, dsts, srcs);
      if (s.ok()) {
        // The staging stays lent until the copies are over, even past a
        // timed-out wait (quarantine).
        s = WaitDeviceCopies(device, stream,
                             [staging = round.staging.owner,
                              target = pool.device](const Status&) {});
      }
      ReleaseDeviceStream(device, stream);
      if (s.ok()) {
        for (uint32_t c : ok_chunks) {
          read_ok.push_back(WeightsChunkSegment(m.chunks[c].key));
          nvme_bytes += m.chunks[c].bytes;
        }
      } else {
        fail(ok_chunks, s);
      }
    } else if (!ok_chunks.empty()) {
      // The device already refused this layer: say so for these too.
      fail(ok_chunks, failed);
    }
    // Its copy is over (or quarantined with the staging): the buffer takes
    // the next round.
    round.staging = {};
    if (next < below.size()) {
      next = start(next, &round);
      ++started;
    }
  }
  load_segments_nvme_.fetch_add(read_ok.size(), std::memory_order_relaxed);
  load_bytes_nvme_.fetch_add(nvme_bytes, std::memory_order_relaxed);
  if (!read_ok.empty()) {
    MutexLock lock(&job.mu);
    job.from_nvme.insert(job.from_nvme.end(), read_ok.begin(), read_ok.end());
  }
}

Result<WeightsStaged> CacheEngine::StageChunks(
    EngineNamespace& ns, const Pool& pool,
    std::span<const WeightsExtent> extents) {
  WeightsStaged out;
  out.keys.resize(extents.size());
  out.already_stored.resize(extents.size());
  const bool dirty = ns.tiers_.policy != WritePolicy::kNone;
  // Private staging for one chunk at a time: the bytes are hashed where
  // no one else writes them, then stored (an engine writing its pool
  // meanwhile cannot make a chunk's bytes differ from its key).
  uint64_t largest = 0;
  for (const WeightsExtent& e : extents) largest = std::max(largest, e.bytes);
  PinnedStaging::Buffer staging;
  if (pool.device && staging_) staging = staging_->Borrow(largest);
  if (staging.bytes.size() < largest) staging = HeapStaging(largest);
  if (staging.bytes.size() < largest) {
    return Status::ResourceExhausted("no memory to stage a chunk in");
  }
  std::optional<Clock::TimePoint> deadline;
  auto extent_error = [&](size_t i, const Status& s) {
    return Status(
        s.code(),
        fmt::format("the chunk at image offset {} ({} bytes): {}",
                    extents[i].offset, extents[i].bytes, s.message()));
  };
  for (size_t i = 0; i < extents.size(); ++i) {
    const WeightsExtent& e = extents[i];
    const std::span<std::byte> bytes = staging.bytes.first(e.bytes);
    if (pool.device) {
      DeviceBackend& device = *pool.device->backend;
      const StreamId stream = AcquireDeviceStream(device);
      Status s = device.CopyToHost(
          stream, bytes,
          DeviceRegion{pool.device->pool.pool, pool.layout.offset + e.offset,
                       e.bytes});
      if (s.ok()) {
        // The staging stays lent until the copy is over, even past a
        // timed-out wait (quarantine).
        s = WaitDeviceCopies(
            device, stream,
            [owner = staging.owner, source = pool.device](const Status&) {});
      }
      ReleaseDeviceStream(device, stream);
      if (!s.ok()) return extent_error(i, s);
    } else {
      std::memcpy(bytes.data(), pool.Slot(0) + e.offset, e.bytes);
    }
    const PageHash key = WeightsChunkKey(bytes);
    out.keys[i] = key;
    const SegmentKey segment = WeightsChunkSegment(key);
    auto r = ns.host_->Reserve(segment, e.bytes);
    if (r.status().code() == StatusCode::kBusy && mover_) {
      if (!deadline) {
        deadline = options_.clock->Now() + options_.write_back_wait;
        backpressure_waits_.fetch_add(1, std::memory_order_relaxed);
      }
      r = ReserveAfterWriteBack(ns, segment, e.bytes, *deadline);
    }
    if (!r.ok()) return extent_error(i, r.status());
    if (r->already_stored) {
      out.already_stored[i] = true;
      store_dedup_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    StreamCopy(ns.host_->arena().base() + r->location.offset, bytes.data(),
               e.bytes);
    if (Status s = ns.host_->Commit(segment, dirty); !s.ok()) {
      return extent_error(i, s);
    }
    store_segments_.fetch_add(1, std::memory_order_relaxed);
    store_bytes_.fetch_add(e.bytes, std::memory_order_relaxed);
    if (dirty && mover_) {
      mover_->Kick();
    }
  }
  return out;
}

}  // namespace tierkv::storage
