// WeightsCatalog: sealed weights shards and their chunks' reference counts
// (see weights_catalog.h).
#include "storage/weights/weights_catalog.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <unordered_set>
#include <utility>

#include "common/sync_point.h"
#include "storage/storage_log.h"

namespace tierkv::storage {
namespace {

uint64_t SystemUnixMs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count());
}

std::string_view AsChars(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

}  // namespace

WeightsCatalog::WeightsCatalog(const WeightsCatalogOptions& options,
                               CacheEngine* engine, EngineNamespace* ns,
                               NvmeCatalog* persist, uint32_t ns_id)
    : options_(options),
      engine_(engine),
      ns_(ns),
      persist_(persist),
      ns_id_(ns_id),
      clock_(options.clock != nullptr ? options.clock
                                      : SteadyClock::Default()) {}

Result<std::unique_ptr<WeightsCatalog>> WeightsCatalog::Open(
    const WeightsCatalogOptions& options, CacheEngine* engine,
    EngineNamespace* ns, NvmeCatalog* persist) {
  if (!ns->weights()) {
    return Status::InvalidArgument(fmt::format(
        "namespace '{}' is not a weights namespace (weights = true)",
        ns->name()));
  }
  uint32_t ns_id = 0;
  if (persist != nullptr) {
    auto id = persist->GetOrCreateNamespace(ns->name());
    if (!id.ok()) {
      // A read-only catalog cannot assign a new id: serve from memory.
      StorageLog().warn(
          "weights namespace '{}': sealed shards are kept in memory only "
          "(the NVMe catalog cannot name the namespace: {})",
          ns->name(), id.status().ToString());
      persist = nullptr;
    } else {
      ns_id = *id;
    }
  }
  std::unique_ptr<WeightsCatalog> catalog(
      new WeightsCatalog(options, engine, ns, persist, ns_id));
  if (persist == nullptr) return catalog;
  std::vector<Shard> loaded;
  uint64_t skipped = 0;
  auto scan =
      persist->ForEachWeights(ns_id, [&](const NvmeCatalog::WeightsRecord& r) {
        const auto bytes = std::as_bytes(std::span(r.manifest));
        auto m = DecodeWeightsManifest(bytes);
        const PageHash version = WeightsChunkKey(bytes);
        if (!m.ok() || version != r.version || m->model != r.model ||
            m->layout != r.layout) {
          ++skipped;
          StorageLog().warn(
              "weights namespace '{}': skipping the stored manifest of '{}' "
              "'{}' {}: {}",
              ns->name(), r.model, r.layout, r.version.ToHex(),
              m.ok() ? "its key does not match its bytes"
                     : m.status().ToString());
          return;
        }
        Shard shard;
        shard.manifest =
            std::make_shared<const WeightsManifest>(std::move(m).value());
        shard.encoded.assign(bytes.begin(), bytes.end());
        shard.version = version;
        shard.sealed_unix_ms = r.sealed_unix_ms;
        loaded.push_back(std::move(shard));
      });
  if (!scan.ok()) return scan.status();
  // Sealed order, so a zero version finds the newest again.
  std::stable_sort(loaded.begin(), loaded.end(),
                   [](const Shard& a, const Shard& b) {
                     return a.sealed_unix_ms < b.sealed_unix_ms;
                   });
  {
    MutexLock lock(&catalog->mu_);
    for (Shard& shard : loaded) catalog->InsertLocked(std::move(shard));
  }
  StorageLog().info(
      "weights namespace '{}': {} sealed shards reloaded ({} skipped, {} "
      "malformed records)",
      ns->name(), loaded.size(), skipped, scan->malformed);
  return catalog;
}

std::vector<SegmentKey> WeightsCatalog::DistinctChunks(
    const WeightsManifest& m) {
  std::vector<SegmentKey> keys;
  keys.reserve(m.chunks.size());
  std::unordered_set<PageHash, ChunkKeyHash> seen;
  for (const WeightsChunk& c : m.chunks) {
    if (seen.insert(c.key).second) keys.push_back(WeightsChunkSegment(c.key));
  }
  return keys;
}

void WeightsCatalog::InsertLocked(Shard shard) {
  std::unordered_map<PageHash, uint64_t, ChunkKeyHash> sizes;
  for (const WeightsChunk& c : shard.manifest->chunks) sizes[c.key] = c.bytes;
  shard.chunk_bytes = 0;
  for (const auto& [key, bytes] : sizes) {
    Chunk& chunk = chunks_[key];
    if (chunk.shards++ == 0) {
      chunk.bytes = bytes;
      unique_bytes_ += bytes;
    }
    shard.chunk_bytes += bytes;
  }
  referenced_bytes_ += shard.chunk_bytes;
  manifest_bytes_ += shard.encoded.size();
  last_sealed_unix_ms_ = std::max(last_sealed_unix_ms_, shard.sealed_unix_ms);
  shard.sequence = next_sequence_++;
  ShardKey key{shard.manifest->model, shard.manifest->layout, shard.version};
  shards_.emplace(std::move(key), std::move(shard));
}

const WeightsCatalog::Shard* WeightsCatalog::FindLocked(
    const WeightsId& id) const {
  if (id.version != PageHash{}) {
    auto it = shards_.find(ShardKey{id.model, id.layout, id.version});
    return it == shards_.end() ? nullptr : &it->second;
  }
  const Shard* newest = nullptr;
  for (auto it = shards_.lower_bound(ShardKey{id.model, id.layout, {}});
       it != shards_.end() && std::get<0>(it->first) == id.model &&
       std::get<1>(it->first) == id.layout;
       ++it) {
    const Shard& s = it->second;
    if (newest == nullptr ||
        std::tie(s.sealed_unix_ms, s.sequence) >
            std::tie(newest->sealed_unix_ms, newest->sequence)) {
      newest = &s;
    }
  }
  return newest;
}

WeightsCatalog::~WeightsCatalog() {
  MutexLock lock(&mu_);
  while (pending_seals_ > 0) pending_seals_done_.Wait(&mu_);
}

void WeightsCatalog::EndPendingSeal() {
  MutexLock lock(&mu_);
  if (--pending_seals_ == 0) pending_seals_done_.SignalAll();
}

void WeightsCatalog::AddPendingLocked(uint64_t encoded_bytes,
                                      std::span<const SegmentKey> chunks) {
  ++pending_seals_;
  pending_manifest_bytes_ += encoded_bytes;
  for (const SegmentKey& key : chunks) ++pending_chunks_[key.page];
}

std::vector<SegmentKey> WeightsCatalog::RemovePendingLocked(
    uint64_t encoded_bytes, std::span<const SegmentKey> chunks) {
  pending_manifest_bytes_ -= encoded_bytes;
  std::vector<SegmentKey> erase;
  for (const SegmentKey& key : chunks) {
    auto it = pending_chunks_.find(key.page);
    if (it == pending_chunks_.end() || --it->second > 0) continue;
    pending_chunks_.erase(it);
    if (drop_deferred_.erase(key.page) > 0 && !chunks_.contains(key.page)) {
      erase.push_back(key);
    }
  }
  return erase;
}

Result<std::optional<WeightsCatalog::Sealed>> WeightsCatalog::CheckSealLocked(
    const Shard& shard, bool durable) const {
  const WeightsManifest& m = *shard.manifest;
  if (shards_.count(ShardKey{m.model, m.layout, shard.version})) {
    return std::optional<Sealed>(Sealed{shard.version, true});
  }
  // After its flush the shard is one of the pending seals: not twice.
  const uint64_t pending =
      pending_manifest_bytes_ - (durable ? shard.encoded.size() : 0);
  if (manifest_bytes_ + pending + shard.encoded.size() >
      options_.max_total_manifest_bytes) {
    return Status::ResourceExhausted(fmt::format(
        "namespace '{}' holds {} bytes of sealed manifests ({} more being "
        "sealed); sealing {} more passes its limit of {}: drop shards first",
        ns_->name(), manifest_bytes_, pending, shard.encoded.size(),
        options_.max_total_manifest_bytes));
  }
  std::vector<SegmentKey> keys;
  keys.reserve(m.chunks.size());
  for (const WeightsChunk& c : m.chunks)
    keys.push_back(WeightsChunkSegment(c.key));
  std::vector<CacheEngine::SegmentWhere> where;
  if (durable) {
    for (const uint64_t bytes : engine_->PersistedBytes(*ns_, keys)) {
      where.push_back(
          {bytes > 0 ? tierkv::Tier::kNvme : tierkv::Tier::kMiss, bytes});
    }
  } else {
    where = engine_->Where(*ns_, keys);
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    const WeightsChunk& c = m.chunks[i];
    if (where[i].tier == tierkv::Tier::kMiss) {
      return Status::NotFound(fmt::format(
          "chunk {} of {} (key {}, layer {}, {} bytes at image offset {}) is "
          "not stored {}in namespace '{}'",
          i, keys.size(), c.key.ToHex(), c.layer, c.bytes, c.offset,
          durable ? "on NVMe " : "", ns_->name()));
    }
    if (where[i].bytes != c.bytes) {
      return Status::NotFound(fmt::format(
          "chunk {} of {} (key {}, layer {}) is stored with {} bytes, the "
          "manifest says {}",
          i, keys.size(), c.key.ToHex(), c.layer, where[i].bytes, c.bytes));
    }
  }
  return std::optional<Sealed>();
}

Result<WeightsCatalog::Sealed> WeightsCatalog::FinishSealLocked(Shard shard) {
  shard.sealed_unix_ms =
      std::max(options_.now_unix_ms ? options_.now_unix_ms() : SystemUnixMs(),
               last_sealed_unix_ms_ + 1);
  if (persist_ != nullptr) {
    NvmeCatalog::WeightsRecord record{
        .ns_id = ns_id_,
        .model = shard.manifest->model,
        .layout = shard.manifest->layout,
        .version = shard.version,
        .sealed_unix_ms = shard.sealed_unix_ms,
        .manifest = std::string(AsChars(shard.encoded))};
    if (Status s = persist_->PutWeights(record); !s.ok()) {
      return Status(s.code(), fmt::format("weights manifest not sealed: {}",
                                          s.message()));
    }
  }
  const PageHash version = shard.version;
  InsertLocked(std::move(shard));
  return Sealed{version, /*already_sealed=*/false};
}

void WeightsCatalog::Seal(std::span<const std::byte> encoded, SealDone done) {
  if (encoded.size() > options_.max_manifest_bytes) {
    done(Status::InvalidArgument(
        fmt::format("a weights manifest of {} bytes is larger than the {} a "
                    "reply can carry",
                    encoded.size(), options_.max_manifest_bytes)));
    return;
  }
  auto m = DecodeWeightsManifest(encoded);
  if (!m.ok()) {
    done(m.status());
    return;
  }
  auto shard = std::make_shared<Shard>();
  shard->manifest =
      std::make_shared<const WeightsManifest>(std::move(m).value());
  shard->encoded.assign(encoded.begin(), encoded.end());
  // The encoding is canonical (a decoded manifest encodes to the same
  // bytes), so its hash is WeightsVersionOf without encoding it again.
  shard->version = WeightsChunkKey(encoded);
  std::vector<SegmentKey> keys = DistinctChunks(*shard->manifest);
  const uint64_t encoded_bytes = shard->encoded.size();
  {
    MutexLock lock(&mu_);
    auto checked = CheckSealLocked(*shard, /*durable=*/false);
    if (checked.ok() && !checked->has_value() &&
        (persist_ == nullptr || !engine_->can_persist())) {
      // In memory only: nothing to make durable first.
      Result<Sealed> sealed = FinishSealLocked(std::move(*shard));
      lock.Unlock();
      done(std::move(sealed));
      return;
    }
    if (!checked.ok() || checked->has_value()) {
      lock.Unlock();
      done(checked.ok() ? Result<Sealed>(**checked)
                        : Result<Sealed>(checked.status()));
      return;
    }
    AddPendingLocked(encoded_bytes, keys);
  }
  // Chunks durable first, then the manifest: a crash in between leaves
  // stored chunks and no shard, never a shard without its chunks.
  std::vector<SegmentKey> flush = keys;
  engine_->Flush(*ns_, std::move(flush),
                 [this, shard, keys = std::move(keys), encoded_bytes,
                  done = std::move(done)](std::vector<Status> flushed) {
                   Result<Sealed> result = Status::Internal("unset");
                   size_t failed = 0;
                   while (failed < flushed.size() && flushed[failed].ok())
                     ++failed;
                   TIERKV_SYNC_POINT(kSealFlushed);
                   MutexLock lock(&mu_);
                   if (failed < flushed.size()) {
                     result = Status(
                         flushed[failed].code(),
                         fmt::format("chunk {} is not durable on NVMe: {}",
                                     keys[failed].page.ToHex(),
                                     flushed[failed].message()));
                   } else {
                     // Checked again, on NVMe now: NVMe may have evicted a
                     // chunk since its flush, or another Seal sealed the same
                     // version.
                     auto checked = CheckSealLocked(*shard, /*durable=*/true);
                     if (!checked.ok()) {
                       result = checked.status();
                     } else if (checked->has_value()) {
                       result = **checked;
                     } else {
                       result = FinishSealLocked(std::move(*shard));
                     }
                   }
                   // After the seal (if it sealed): chunks a Drop deferred for
                   // it are erased only when nothing names them now.
                   const std::vector<SegmentKey> erase =
                       RemovePendingLocked(encoded_bytes, keys);
                   if (!erase.empty()) engine_->Erase(*ns_, erase);
                   lock.Unlock();
                   done(std::move(result));
                   EndPendingSeal();  // the last use of `this`
                 });
}

Result<WeightsCatalog::Sealed> WeightsCatalog::Seal(
    std::span<const std::byte> encoded) {
  std::promise<Result<Sealed>> answer;
  Seal(encoded,
       [&answer](Result<Sealed> r) { answer.set_value(std::move(r)); });
  return answer.get_future().get();
}

namespace {

Status NoSuchShard(const WeightsId& id) {
  return Status::NotFound(
      fmt::format("no sealed weights shard '{}' '{}'{}", id.model, id.layout,
                  id.version == PageHash{} ? std::string()
                                           : " version " + id.version.ToHex()));
}

}  // namespace

Result<std::vector<std::byte>> WeightsCatalog::Manifest(
    const WeightsId& id) const {
  MutexLock lock(&mu_);
  const Shard* shard = FindLocked(id);
  if (shard == nullptr) return NoSuchShard(id);
  return shard->encoded;
}

Result<std::shared_ptr<const WeightsManifest>> WeightsCatalog::Decoded(
    const WeightsId& id) const {
  MutexLock lock(&mu_);
  const Shard* shard = FindLocked(id);
  if (shard == nullptr) return NoSuchShard(id);
  return shard->manifest;  // immutable: shared, not copied
}

std::vector<WeightsInfo> WeightsCatalog::List(std::string_view model,
                                              size_t limit) const {
  std::vector<WeightsInfo> out;
  MutexLock lock(&mu_);
  auto it = model.empty()
                ? shards_.begin()
                : shards_.lower_bound(ShardKey{std::string(model), "", {}});
  for (; it != shards_.end() && out.size() < limit; ++it) {
    const Shard& s = it->second;
    if (!model.empty() && s.manifest->model != model) break;
    WeightsInfo info;
    info.id = {s.manifest->model, s.manifest->layout, s.version};
    info.image_bytes = s.manifest->image_bytes;
    info.tensors = static_cast<uint32_t>(s.manifest->tensors.size());
    info.chunks = static_cast<uint32_t>(s.manifest->chunks.size());
    info.num_layers = s.manifest->num_layers;
    info.sealed_unix_ms = s.sealed_unix_ms;
    std::vector<SegmentKey> keys;
    keys.reserve(s.manifest->chunks.size());
    for (const WeightsChunk& c : s.manifest->chunks) {
      keys.push_back(WeightsChunkSegment(c.key));
    }
    for (const CacheEngine::SegmentWhere& w : engine_->Where(*ns_, keys)) {
      if (w.tier == tierkv::Tier::kMiss) {
        info.chunks_missing++;
      } else if (w.tier == tierkv::Tier::kHost ||
                 w.tier == tierkv::Tier::kHbm) {
        info.chunks_in_dram++;
      } else {
        info.chunks_on_nvme++;
      }
    }
    for (const SegmentKey& key : DistinctChunks(*s.manifest)) {
      auto c = chunks_.find(key.page);
      if (c != chunks_.end() && c->second.shards == 1) {
        info.unique_bytes += c->second.bytes;
      }
    }
    out.push_back(std::move(info));
  }
  return out;
}

Result<WeightsCatalog::Dropped> WeightsCatalog::Drop(std::string_view model,
                                                     std::string_view layout,
                                                     const PageHash& version) {
  if (model.empty()) {
    return Status::InvalidArgument("dropping weights needs a model name");
  }
  MutexLock lock(&mu_);
  std::vector<ShardKey> matched;
  for (auto it = shards_.lower_bound(ShardKey{std::string(model), "", {}});
       it != shards_.end() && std::get<0>(it->first) == model; ++it) {
    if (!layout.empty() && std::get<1>(it->first) != layout) continue;
    if (version != PageHash{} && std::get<2>(it->first) != version) continue;
    matched.push_back(it->first);
  }
  if (matched.empty()) {
    return Status::NotFound(fmt::format(
        "no sealed weights shard of model '{}'{}{} to drop", model,
        layout.empty() ? "" : fmt::format(" layout '{}'", layout),
        version == PageHash{} ? "" : " version " + version.ToHex()));
  }
  Dropped dropped;
  Status persist_error;
  std::vector<SegmentKey> freed;
  bool scheduled = false;  // a dropped shard was hinted or pinned
  for (const ShardKey& key : matched) {
    if (persist_ != nullptr) {
      // Deleted on disk first: a crash then leaves unreferenced chunks
      // (evicted in time), never a sealed shard whose chunks were erased.
      persist_error = persist_->DeleteWeights(
          ns_id_, std::get<0>(key), std::get<1>(key), std::get<2>(key));
      if (!persist_error.ok()) break;
    }
    auto it = shards_.find(key);
    const Shard& shard = it->second;
    for (const SegmentKey& chunk_key : DistinctChunks(*shard.manifest)) {
      auto c = chunks_.find(chunk_key.page);
      if (c == chunks_.end() || --c->second.shards > 0) continue;
      dropped.freed_bytes += c->second.bytes;
      unique_bytes_ -= c->second.bytes;
      // A Seal being made durable names it: it stays stored for that seal
      // (erased when the seal ends, unless sealed).
      if (pending_chunks_.contains(chunk_key.page)) {
        drop_deferred_.insert(chunk_key.page);
      } else {
        freed.push_back(chunk_key);
      }
      chunks_.erase(c);
    }
    referenced_bytes_ -= shard.chunk_bytes;
    manifest_bytes_ -= shard.encoded.size();
    scheduled |= shard.next_use.has_value() || shard.pinned_until.has_value();
    shards_.erase(it);
    dropped.shards++;
  }
  if (scheduled) PushScheduleLocked();
  if (!freed.empty()) engine_->Erase(*ns_, freed);
  if (!persist_error.ok()) {
    if (dropped.shards == 0) return persist_error;
    StorageLog().warn(
        "weights namespace '{}': dropped {} of {} shards of '{}'; the rest "
        "stay sealed: {}",
        ns_->name(), dropped.shards, matched.size(), model,
        persist_error.ToString());
  }
  return dropped;
}

Result<size_t> WeightsCatalog::Prefetch(const WeightsId& id,
                                        LayerRange layers) const {
  std::vector<SegmentKey> keys;
  {
    MutexLock lock(&mu_);
    const Shard* shard = FindLocked(id);
    if (shard == nullptr) {
      return Status::NotFound(
          fmt::format("no sealed weights shard '{}' '{}' to prefetch", id.model,
                      id.layout));
    }
    const WeightsManifest& m = *shard->manifest;
    if (layers.first >= m.num_layers) {
      return Status::InvalidArgument(
          fmt::format("layer {} is past the shard's {} layers", layers.first,
                      m.num_layers));
    }
    const uint32_t end =
        layers.count == 0
            ? m.num_layers
            : std::min<uint32_t>(m.num_layers,
                                 uint32_t{layers.first} + layers.count);
    const size_t first = m.ChunksOfLayer(layers.first).first;
    const size_t last = m.ChunksOfLayer(end - 1).second;
    std::unordered_set<PageHash, ChunkKeyHash> seen;
    for (size_t i = first; i < last; ++i) {
      if (seen.insert(m.chunks[i].key).second) {
        keys.push_back(WeightsChunkSegment(m.chunks[i].key));
      }
    }
  }
  return engine_->PromoteInOrder(*ns_, keys);
}

std::vector<Status> WeightsCatalog::Hint(std::span<const ShardHint> hints) {
  std::vector<Status> out(hints.size());
  std::vector<SegmentKey> due;
  {
    MutexLock lock(&mu_);
    const Clock::TimePoint now = clock_->Now();
    for (size_t i = 0; i < hints.size(); ++i) {
      Shard* shard = FindLocked(hints[i].id);
      if (shard == nullptr) {
        out[i] = Status::NotFound(
            fmt::format("no sealed weights shard '{}' '{}' to hint",
                        hints[i].id.model, hints[i].id.layout));
        continue;
      }
      if (hints[i].next_use.count() < 0) {
        shard->next_use.reset();
      } else {
        shard->next_use = Later(now, hints[i].next_use);
      }
      shard->hint_prefetched = false;
    }
    ExpirePinsLocked(now);
    PushScheduleLocked();
    due = DueForPrefetchLocked(now);
  }
  if (!due.empty()) (void)engine_->PromoteInOrder(*ns_, due);
  return out;
}

Status WeightsCatalog::Pin(const WeightsId& id, std::chrono::milliseconds ttl) {
  std::vector<SegmentKey> promote;
  {
    MutexLock lock(&mu_);
    const Clock::TimePoint now = clock_->Now();
    // A pin that ended here must leave the policies' tables too, whatever
    // this call answers.
    if (ExpirePinsLocked(now)) PushScheduleLocked();
    Shard* shard = FindLocked(id);
    if (shard == nullptr) {
      return Status::NotFound(fmt::format(
          "no sealed weights shard '{}' '{}' to pin", id.model, id.layout));
    }
    if (ttl.count() <= 0) {
      if (!shard->pinned_until) return Status::OK();
      shard->pinned_until.reset();
      PushScheduleLocked();
      return Status::OK();
    }
    const uint64_t limit = options_.max_pinned_bytes > 0
                               ? options_.max_pinned_bytes
                               : engine_->HostCapacity(*ns_) / 2;
    if (!shard->pinned_until) {
      if (const uint64_t bytes = PinnedBytesLocked(shard); bytes > limit) {
        return Status::ResourceExhausted(fmt::format(
            "pinning '{}' '{}' would pin {} B of weights, past the {} B "
            "pins may hold (half the namespace's DRAM, or of its NVMe "
            "share); unpin another shard first",
            id.model, id.layout, bytes, limit));
      }
    }
    shard->pinned_until = Later(now, ttl);
    PushScheduleLocked();
    promote = DistinctChunks(*shard->manifest);
  }
  // Those in DRAM are held from now on; the rest are held once promoted.
  (void)engine_->PromoteInOrder(*ns_, promote);
  return Status::OK();
}

void WeightsCatalog::Tick() {
  std::vector<SegmentKey> due;
  {
    MutexLock lock(&mu_);
    const Clock::TimePoint now = clock_->Now();
    if (ExpirePinsLocked(now)) PushScheduleLocked();
    due = DueForPrefetchLocked(now);
  }
  if (!due.empty()) (void)engine_->PromoteInOrder(*ns_, due);
}

Clock::TimePoint WeightsCatalog::Later(Clock::TimePoint now,
                                       std::chrono::milliseconds ahead) {
  using std::chrono::duration_cast;
  const auto room =
      duration_cast<std::chrono::milliseconds>(Clock::TimePoint::max() - now);
  if (ahead >= room) return Clock::TimePoint::max();
  return now + duration_cast<Clock::TimePoint::duration>(ahead);
}

bool WeightsCatalog::ExpirePinsLocked(Clock::TimePoint now) {
  bool ended = false;
  for (auto& [key, shard] : shards_) {
    if (shard.pinned_until && *shard.pinned_until <= now) {
      shard.pinned_until.reset();
      ended = true;
    }
  }
  return ended;
}

std::vector<SegmentKey> WeightsCatalog::DueForPrefetchLocked(
    Clock::TimePoint now) {
  if (options_.prefetch_horizon.count() <= 0) return {};
  std::vector<Shard*> due;
  for (auto& [key, shard] : shards_) {
    if (shard.next_use && !shard.hint_prefetched &&
        *shard.next_use - now <= options_.prefetch_horizon) {
      due.push_back(&shard);
    }
  }
  std::sort(due.begin(), due.end(), [](const Shard* a, const Shard* b) {
    return *a->next_use < *b->next_use;
  });
  std::vector<SegmentKey> keys;
  std::unordered_set<PageHash, ChunkKeyHash> seen;
  for (Shard* shard : due) {
    shard->hint_prefetched = true;
    for (const SegmentKey& k : DistinctChunks(*shard->manifest)) {
      if (seen.insert(k.page).second) keys.push_back(k);
    }
  }
  return keys;
}

void WeightsCatalog::PushScheduleLocked() {
  ScheduleTable table;
  for (const auto& [key, shard] : shards_) {
    if (!shard.next_use && !shard.pinned_until) continue;
    const std::optional<int64_t> next_ms =
        shard.next_use
            ? std::optional<int64_t>(
                  std::chrono::duration_cast<std::chrono::milliseconds>(
                      shard.next_use->time_since_epoch())
                      .count())
            : std::nullopt;
    for (const SegmentKey& k : DistinctChunks(*shard.manifest)) {
      ScheduleStanding& st = table[k];
      st.pinned |= shard.pinned_until.has_value();
      if (next_ms && (!st.next_use_ms || *next_ms < *st.next_use_ms)) {
        st.next_use_ms = next_ms;
      }
    }
  }
  engine_->SetSchedule(*ns_, std::move(table));
}

uint64_t WeightsCatalog::PinnedBytesLocked(const Shard* extra) const {
  std::unordered_set<PageHash, ChunkKeyHash> seen;
  uint64_t bytes = 0;
  auto add = [&](const Shard& shard) {
    for (const WeightsChunk& c : shard.manifest->chunks) {
      if (seen.insert(c.key).second) bytes += c.bytes;
    }
  };
  for (const auto& [key, shard] : shards_) {
    if (shard.pinned_until) add(shard);
  }
  if (extra != nullptr && !extra->pinned_until) add(*extra);
  return bytes;
}

WeightsCatalog::ScheduleTotals WeightsCatalog::schedule_totals() const {
  MutexLock lock(&mu_);
  ScheduleTotals t;
  for (const auto& [key, shard] : shards_) {
    t.hinted_shards += shard.next_use ? 1 : 0;
    t.pinned_shards += shard.pinned_until ? 1 : 0;
  }
  t.pinned_bytes = PinnedBytesLocked(nullptr);
  return t;
}

WeightsCatalog::Totals WeightsCatalog::totals() const {
  MutexLock lock(&mu_);
  return Totals{shards_.size(), referenced_bytes_, unique_bytes_};
}

}  // namespace tierkv::storage
