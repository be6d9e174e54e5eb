// Client's model-weights calls (client.h, "Model weights"): PutWeights
// plans, hashes and stores a shard's chunks with the ordinary Put path and
// seals its manifest; LoadWeights reads them back with Get on a loader
// thread, layer by layer (WeightsLoad); the rest are one request each.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <unordered_set>

#include "client/client_impl.h"
#include "client/weights_chunks.h"
#include "common/mutex.h"
#include "common/sync_point.h"
#include "common/thread_annotations.h"
#include "tierkv/client.h"

namespace tierkv {

using transport::Opcode;

namespace {

// The daemon's selector of shard `id` (and, for a prefetch, of its layers).
transport::WeightsSelectRequest SelectOf(const WeightsId& id,
                                         LayerRange layers = {}) {
  return {.model = id.model,
          .layout = id.layout,
          .version = id.version,
          .layers = layers};
}

uint64_t BatchBytes(uint64_t configured) {
  return std::max<uint64_t>(configured, 1);
}

// Transport-level failures: the connection, not one chunk, is broken, so
// every later layer of a load fails the same way.
bool BreaksTheConnection(const Status& s) {
  switch (s.code()) {
    case StatusCode::kIOError:
    case StatusCode::kUnavailable:
    case StatusCode::kProtocolError:
    case StatusCode::kShutdown:
      return true;
    default:
      return false;
  }
}

// Client::Put, with the items that come back Busy put again until they
// are stored or `patience` has passed. Busy means another client is storing
// the same chunk right now (ranks backing up the same replicated tensors at
// once); once it commits, a retry finds the chunk stored and copies nothing.
std::vector<PutResult> PutRetryingBusy(Client& client,
                                       std::span<const SegmentWrite> writes,
                                       std::chrono::milliseconds patience) {
  std::vector<PutResult> results = client.Put(writes);
  const auto deadline = std::chrono::steady_clock::now() + patience;
  // Backoff from 1 ms, doubling to 64 ms: a commit takes about one copy.
  constexpr std::chrono::milliseconds kFirstBackoff{1};
  constexpr std::chrono::milliseconds kLongestBackoff{64};
  std::chrono::milliseconds backoff = kFirstBackoff;
  while (true) {
    std::vector<size_t> busy;
    for (size_t i = 0; i < results.size(); ++i) {
      if (results[i].status.code() == StatusCode::kBusy) busy.push_back(i);
    }
    if (busy.empty() || std::chrono::steady_clock::now() >= deadline) {
      return results;
    }
    TIERKV_SYNC_POINT("WeightsPut::RetryingBusy");
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, kLongestBackoff);
    std::vector<SegmentWrite> again;
    for (size_t i : busy) again.push_back(writes[i]);
    const std::vector<PutResult> retried = client.Put(again);
    for (size_t j = 0; j < busy.size(); ++j) results[busy[j]] = retried[j];
  }
}

// InvalidArgument when the daemon could never seal `manifest`: its
// encoding (which does not depend on the chunk keys) passes what one
// request carries. Checked before any chunk is stored.
Status CheckSealable(const WeightsManifest& manifest) {
  if (const size_t encoded = EncodeWeightsManifest(manifest).size();
      encoded > kWeightsMaxManifestBytes) {
    return Status::InvalidArgument(fmt::format(
        "the shard's manifest would take {} bytes, more than the {} one "
        "request can carry: split it into shards with fewer tensors",
        encoded, kWeightsMaxManifestBytes));
  }
  return Status::OK();
}

// Makes one batch's chunks `keys` durable on NVMe before the next batch:
// Seal makes every chunk durable before it answers, and a whole shard's
// write-back at that point would take longer than one reply may
// (ClientOptions::timeout) for shards of tens of GiB; it also keeps the
// dirty (unevictable) bytes in DRAM to about one batch. Stored and
// deduplicated chunks alike: a chunk another shard stored may still wait
// for write-back. Sets *flush_batches false once the daemon says it has no
// NVMe tier (nothing to make durable, now or at Seal). `describe(i)` names
// key i in an error.
Status FlushBatch(Client& client, std::span<const SegmentKey> keys,
                  bool* flush_batches,
                  const std::function<std::string(size_t)>& describe) {
  if (!*flush_batches || keys.empty()) return Status::OK();
  const std::vector<Status> flushed = client.Flush(keys);
  const bool no_nvme_tier = std::all_of(
      flushed.begin(), flushed.end(),
      [](const Status& f) { return f.code() == StatusCode::kInvalidArgument; });
  if (no_nvme_tier) {
    *flush_batches = false;
    return Status::OK();
  }
  for (size_t i = 0; i < flushed.size(); ++i) {
    if (!flushed[i].ok()) {
      return Status(flushed[i].code(),
                    fmt::format("writing {} to NVMe: {}", describe(i),
                                flushed[i].message()));
    }
  }
  return Status::OK();
}

// Why chunk `chunk` of layer `layer` is not in place, from the daemon's
// answer for it.
Status ChunkFailure(const WeightsChunk& chunk, uint32_t layer,
                    const Status& got) {
  const std::string key = chunk.key.ToHex();
  if (got.IsNotFound()) {
    return Status::NotFound(fmt::format(
        "chunk {} of layer {} is in no tier: evicted, or dropped when it "
        "failed its checksum on NVMe (tierkvd's log says which); the shard "
        "must be stored again",
        key, layer));
  }
  return Status(got.code(),
                fmt::format("chunk {} of layer {}: {}", key, layer,
                            got.code() == StatusCode::kBusy
                                ? "the engine's stream did not reach the load "
                                  "in time; nothing was moved"
                                : got.message()));
}

// How many layers `layers` of `manifest` covers, or why it is refused.
Result<uint32_t> LayersOfLoad(const WeightsManifest& manifest,
                              LayerRange layers) {
  TIERKV_RETURN_IF_ERROR(manifest.Validate());
  if (layers.first >= manifest.num_layers ||
      (layers.count != 0 &&
       uint32_t{layers.first} + layers.count > manifest.num_layers)) {
    return Status::InvalidArgument(
        fmt::format("layers [{}, +{}) are outside the shard's {} layers",
                    layers.first, layers.count, manifest.num_layers));
  }
  return layers.count ? layers.count : manifest.num_layers - layers.first;
}

}  // namespace

Result<WeightsManifest> Client::PutWeights(
    std::string model, std::string layout,
    std::span<const WeightsTensorData> tensors, WeightsPutStats* stats) {
  std::vector<WeightsTensor> described;
  std::vector<std::span<const std::byte>> data;
  described.reserve(tensors.size());
  data.reserve(tensors.size());
  for (const WeightsTensorData& t : tensors) {
    if (t.tensor.bytes != 0 && t.tensor.bytes != t.data.size()) {
      return Status::InvalidArgument(
          fmt::format("tensor '{}' says {} bytes but its data has {}",
                      t.tensor.name, t.tensor.bytes, t.data.size()));
    }
    described.push_back(t.tensor);
    described.back().bytes = t.data.size();
    data.push_back(t.data);
  }
  auto planned = PlanWeightsImage(std::move(model), std::move(layout),
                                  std::move(described));
  if (!planned.ok()) return planned.status();
  WeightsManifest manifest = std::move(planned).value();
  if (manifest.tensors.size() != data.size()) {
    return Status::Internal("PlanWeightsImage changed the tensor count");
  }
  TIERKV_RETURN_IF_ERROR(CheckSealable(manifest));

  client_internal::WeightsChunkSource source(manifest, data);
  WeightsPutStats counted;
  const uint64_t batch_bytes = BatchBytes(impl_->weights_batch_bytes_);
  // Keys stored (or found stored) by this call: a chunk that repeats in the
  // shard (two equal tensors) is put once; a second reservation of a key
  // in flight would be refused as Busy.
  std::unordered_set<PageHash> stored;
  std::vector<std::byte> pack_buffer;
  bool flush_batches = true;  // until the daemon says it has no NVMe tier
  for (size_t begin = 0; begin < manifest.chunks.size();) {
    // One batch: chunks [begin, end), about batch_bytes.
    size_t end = begin;
    uint64_t bytes = 0;
    uint64_t pack_bytes = 0;
    std::vector<std::optional<std::span<const std::byte>>> direct;
    while (
        end < manifest.chunks.size() &&
        (end == begin || bytes + manifest.chunks[end].bytes <= batch_bytes)) {
      direct.push_back(source.Direct(end));
      if (!direct.back()) pack_bytes += manifest.chunks[end].bytes;
      bytes += manifest.chunks[end].bytes;
      ++end;
    }
    pack_buffer.resize(pack_bytes);
    std::vector<SegmentWrite> writes;
    std::vector<size_t> written;  // chunk index per write
    uint64_t pack_used = 0;
    for (size_t c = begin; c < end; ++c) {
      WeightsChunk& chunk = manifest.chunks[c];
      std::span<const std::byte> bytes_of_chunk;
      if (direct[c - begin]) {
        bytes_of_chunk = *direct[c - begin];
      } else {
        std::span<std::byte> out(pack_buffer.data() + pack_used, chunk.bytes);
        source.Assemble(c, out);
        pack_used += chunk.bytes;
        bytes_of_chunk = out;
      }
      chunk.key = WeightsChunkKey(bytes_of_chunk);
      if (!stored.insert(chunk.key).second) {
        ++counted.chunks_deduplicated;
        counted.bytes_deduplicated += chunk.bytes;
        continue;
      }
      writes.push_back({WeightsChunkSegment(chunk.key), bytes_of_chunk});
      written.push_back(c);
    }
    const std::vector<PutResult> results =
        PutRetryingBusy(*this, writes, impl_->timeout_);
    for (size_t i = 0; i < results.size(); ++i) {
      const size_t c = written[i];
      if (!results[i].ok()) {
        return Status(results[i].status.code(),
                      fmt::format("storing {}: {}", source.Describe(c),
                                  results[i].status.message()));
      }
      if (results[i].already_stored) {
        ++counted.chunks_deduplicated;
        counted.bytes_deduplicated += manifest.chunks[c].bytes;
      } else {
        ++counted.chunks_stored;
        counted.bytes_stored += manifest.chunks[c].bytes;
      }
    }
    // Durable batch by batch: Seal makes every chunk durable on NVMe before
    // it answers, and a whole shard's write-back at that point would take
    // longer than one reply may (ClientOptions::timeout) for shards of tens
    // of GiB; it also keeps the dirty (unevictable) bytes in DRAM to about
    // one batch. Stored and deduplicated chunks alike: a chunk another
    // shard stored may still wait for write-back.
    std::vector<SegmentKey> keys;
    keys.reserve(writes.size());
    for (const SegmentWrite& w : writes) keys.push_back(w.key);
    TIERKV_RETURN_IF_ERROR(
        FlushBatch(*this, keys, &flush_batches,
                   [&](size_t i) { return source.Describe(written[i]); }));
    begin = end;
  }
  pack_buffer = {};

  TIERKV_RETURN_IF_ERROR(SealWeights(manifest));
  if (stats) *stats = counted;
  return manifest;
}

Status Client::SealWeights(const WeightsManifest& manifest) {
  transport::WeightsSealResponse sealed;
  TIERKV_RETURN_IF_ERROR(impl_->Call(
      Opcode::kWeightsSeal,
      transport::Encode(
          transport::WeightsSealRequest{EncodeWeightsManifest(manifest)}),
      sealed));
  if (sealed.version != WeightsVersionOf(manifest)) {
    return Status::ProtocolError(fmt::format(
        "the daemon sealed version {} of a manifest whose "
        "version is {}",
        sealed.version.ToHex(), WeightsVersionOf(manifest).ToHex()));
  }
  return Status::OK();
}

Result<WeightsManifest> Client::PutWeightsFromPool(const WeightsManifest& plan,
                                                   WeightsPutStats* stats) {
  TIERKV_RETURN_IF_ERROR(plan.Validate());
  TIERKV_RETURN_IF_ERROR(CheckSealable(plan));
  WeightsManifest manifest = plan;
  WeightsPutStats counted;
  // The daemon refuses a staging request of more than 4 GiB.
  const uint64_t batch_bytes = std::min<uint64_t>(
      BatchBytes(impl_->weights_batch_bytes_), uint64_t{1} << 30);
  bool flush_batches = true;  // until the daemon says it has no NVMe tier
  auto describe = [&](size_t c) {
    return fmt::format("chunk {} of layer {} (image offset {})", c,
                       manifest.chunks[c].layer, manifest.chunks[c].offset);
  };
  for (size_t begin = 0; begin < manifest.chunks.size();) {
    // One request: chunks [begin, end), about batch_bytes.
    size_t end = begin;
    uint64_t bytes = 0;
    transport::WeightsStageRequest req;
    while (
        end < manifest.chunks.size() &&
        end - begin < transport::kMaxBatchItems &&
        (end == begin || bytes + manifest.chunks[end].bytes <= batch_bytes)) {
      req.extents.push_back(
          {manifest.chunks[end].offset, manifest.chunks[end].bytes});
      bytes += manifest.chunks[end].bytes;
      ++end;
    }
    // Busy: another client stores one of these chunks right now (ranks
    // staging the same replicated tensors at once); again, until it is
    // stored and this one finds it so, for up to the client timeout.
    transport::WeightsStageResponse resp;
    const auto deadline = std::chrono::steady_clock::now() + impl_->timeout_;
    std::chrono::milliseconds backoff{1};
    Status s;
    while (true) {
      s = impl_->Call(Opcode::kWeightsStage, transport::Encode(req), resp);
      if (s.code() != StatusCode::kBusy ||
          std::chrono::steady_clock::now() >= deadline) {
        break;
      }
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(64));
    }
    if (!s.ok()) {
      return Status(s.code(), fmt::format("staging chunks {}..{} of the image "
                                          "pool: {}",
                                          begin, end - 1, s.message()));
    }
    if (resp.keys.size() != end - begin) {
      return Status::ProtocolError(
          fmt::format("the daemon staged {} chunks of the {} asked",
                      resp.keys.size(), end - begin));
    }
    std::vector<SegmentKey> keys;
    for (size_t c = begin; c < end; ++c) {
      WeightsChunk& chunk = manifest.chunks[c];
      chunk.key = resp.keys[c - begin];
      keys.push_back(WeightsChunkSegment(chunk.key));
      if (resp.already_stored[c - begin]) {
        ++counted.chunks_deduplicated;
        counted.bytes_deduplicated += chunk.bytes;
      } else {
        ++counted.chunks_stored;
        counted.bytes_stored += chunk.bytes;
      }
    }
    TIERKV_RETURN_IF_ERROR(
        FlushBatch(*this, keys, &flush_batches,
                   [&](size_t i) { return describe(begin + i); }));
    begin = end;
  }
  TIERKV_RETURN_IF_ERROR(SealWeights(manifest));
  if (stats) *stats = counted;
  return manifest;
}

Result<WeightsManifest> Client::GetWeightsManifest(const WeightsId& id) {
  transport::WeightsManifestResponse resp;
  TIERKV_RETURN_IF_ERROR(impl_->Call(Opcode::kWeightsManifest,
                                     transport::Encode(SelectOf(id)), resp));
  auto manifest = DecodeWeightsManifest(resp.manifest);
  if (!manifest.ok()) return manifest.status();
  // Never trust that the daemon answered the question asked: an engine
  // that loads other weights than it asked for computes garbage silently.
  if (manifest->model != id.model || manifest->layout != id.layout ||
      (id.version != PageHash{} && WeightsVersionOf(*manifest) != id.version)) {
    return Status::Corruption(fmt::format(
        "asked for the manifest of {} / {} version {}, the daemon sent {} / "
        "{} version {}",
        id.model, id.layout, id.version.ToHex(), manifest->model,
        manifest->layout, WeightsVersionOf(*manifest).ToHex()));
  }
  return manifest;
}

Status Client::PrefetchWeights(const WeightsId& id, LayerRange layers) {
  transport::StatusResponse resp;
  return impl_->Call(Opcode::kWeightsPrefetch,
                     transport::Encode(SelectOf(id, layers)), resp);
}

Result<std::vector<WeightsInfo>> Client::ListWeights(const std::string& model) {
  transport::WeightsListResponse resp;
  TIERKV_RETURN_IF_ERROR(impl_->Call(
      Opcode::kWeightsList,
      transport::Encode(transport::WeightsSelectRequest{.model = model}),
      resp));
  return std::move(resp.shards);
}

Result<WeightsDropped> Client::DropWeights(const WeightsId& id) {
  if (id.model.empty()) {
    return Status::InvalidArgument("DropWeights needs a model");
  }
  transport::WeightsDropResponse resp;
  TIERKV_RETURN_IF_ERROR(
      impl_->Call(Opcode::kWeightsDrop, transport::Encode(SelectOf(id)), resp));
  return WeightsDropped{.shards = resp.dropped,
                        .freed_bytes = resp.freed_bytes};
}

// ---- LoadWeights ----------------------------------------------------------

// The loader thread and what it publishes: one Status per finished layer,
// in layer order. `statuses_` grows under mu_ (waiters block on done_cv_);
// `done_` mirrors its size for the lock-free LayersDone (release: the
// layer's bytes in the image and its Status are written before it).
// What a WeightsLoad does; the handle forwards to it.
class WeightsLoad::Loader {
 public:
  Loader(uint32_t first, uint32_t count) : first_(first), count_(count) {}
  virtual ~Loader() = default;
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  virtual Status WaitLayer(uint32_t layer) = 0;
  virtual Status Wait() = 0;
  virtual uint32_t LayersDone() const = 0;
  virtual Status StreamWaitLayer(uint32_t layer,
                                 const EngineStream& stream) = 0;
  uint32_t first() const { return first_; }
  uint32_t count() const { return count_; }

 protected:
  Status CheckLayer(uint32_t layer) const {
    if (layer < first_ || layer - first_ >= count_) {
      return Status::InvalidArgument(
          fmt::format("layer {} is outside this load (layers [{}, {}))", layer,
                      first_, first_ + count_));
    }
    return Status::OK();
  }

  const uint32_t first_;
  const uint32_t count_;
};

// LoadWeights: a thread of this process Gets each layer's chunks and copies
// them into the caller's buffer.
class WeightsLoad::ImageLoader final : public WeightsLoad::Loader {
 public:
  // How far ahead of the copies the daemon reads from NVMe: enough to
  // keep its reads streaming while a layer is copied (a 256 MiB window is
  // ~0.1-0.2 s of one NVMe drive), small next to the daemon's DRAM, which
  // must hold the window beside what is being read.
  static constexpr uint64_t kReadAheadBytes = uint64_t{256} << 20;

  ImageLoader(Client* client, uint64_t batch_bytes, bool verify,
              WeightsManifest manifest, std::span<std::byte> image,
              uint32_t first, uint32_t count)
      : Loader(first, count),
        client_(client),
        batch_bytes_(batch_bytes),
        manifest_(std::move(manifest)),
        image_(image),
        verify_(verify) {
    thread_ = std::thread([this] { Run(); });
  }
  ~ImageLoader() override {
    stop_.store(true, std::memory_order_relaxed);
    thread_.join();
  }

  Status WaitLayer(uint32_t layer) override EXCLUDES(mu_) {
    TIERKV_RETURN_IF_ERROR(CheckLayer(layer));
    MutexLock lock(&mu_);
    while (statuses_.size() <= layer - first_) done_cv_.Wait(&mu_);
    return statuses_[layer - first_];
  }
  Status Wait() override EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    while (statuses_.size() < count_) done_cv_.Wait(&mu_);
    for (const Status& s : statuses_) {
      if (!s.ok()) return s;
    }
    return Status::OK();
  }
  uint32_t LayersDone() const override {
    return done_.load(std::memory_order_acquire);
  }
  Status StreamWaitLayer(uint32_t, const EngineStream&) override {
    return Status::InvalidArgument(
        "StreamWaitLayer needs a load into a registered pool "
        "(LoadWeightsToPool); this one fills a host buffer");
  }

 private:
  void Run();
  // Asks the daemon to promote from NVMe the layers after `layer` up to
  // about kReadAheadBytes ahead of it, in layer order, that it has not
  // been asked for yet: a Get of a chunk only on NVMe waits for its read,
  // so without this a cold load alternates reading and copying. The
  // daemon skips what is in DRAM already; a refusal (or no NVMe tier)
  // costs nothing but the call, so its status is not the load's.
  void ReadAhead(uint32_t layer);
  uint64_t LayerBytes(uint32_t layer) const;
  Status LoadLayer(uint32_t layer);
  void Publish(Status s) EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      statuses_.push_back(std::move(s));
      done_.store(static_cast<uint32_t>(statuses_.size()),
                  std::memory_order_release);
    }
    done_cv_.SignalAll();
  }

  Client* const client_;  // borrowed; outlives the handle (REQUIRES)
  const uint64_t batch_bytes_;
  const WeightsManifest manifest_;
  const std::span<std::byte> image_;  // the caller's
  const PageHash version_ = WeightsVersionOf(manifest_);
  const bool verify_;              // ClientOptions::weights_verify_loads
  uint32_t asked_until_ = first_;  // layers [first_, asked_until_) asked for
  std::atomic<bool> stop_{false};
  std::atomic<uint32_t> done_{0};
  Mutex mu_;
  CondVar done_cv_;
  std::vector<Status> statuses_ GUARDED_BY(mu_);
  std::thread thread_;  // last: starts once the rest is set
};

void WeightsLoad::ImageLoader::Run() {
  Status broken;  // a connection failure: every later layer fails with it
  for (uint32_t layer = first_; layer < first_ + count_; ++layer) {
    TIERKV_SYNC_POINT_CALLBACK("WeightsLoad::BeforeLayer", &layer);
    if (stop_.load(std::memory_order_relaxed)) {
      broken = Status::Shutdown("the load was abandoned");
    }
    if (broken.ok()) ReadAhead(layer);
    Status s = broken.ok() ? LoadLayer(layer) : broken;
    if (BreaksTheConnection(s)) broken = s;
    Publish(std::move(s));
  }
}

void WeightsLoad::ImageLoader::ReadAhead(uint32_t layer) {
  const uint32_t end = first_ + count_;
  uint64_t ahead = 0;  // bytes in [layer, asked_until_)
  for (uint32_t l = layer; l < asked_until_; ++l) ahead += LayerBytes(l);
  const uint32_t from = std::max(asked_until_, layer);
  uint32_t until = from;
  while (until < end && (until == layer || ahead < kReadAheadBytes)) {
    ahead += LayerBytes(until);
    ++until;
  }
  if (until == from) return;
  asked_until_ = until;
  (void)client_->PrefetchWeights(
      {manifest_.model, manifest_.layout, version_},
      LayerRange{static_cast<uint16_t>(from),
                 static_cast<uint16_t>(until - from)});
}

uint64_t WeightsLoad::ImageLoader::LayerBytes(uint32_t layer) const {
  const auto [first, last] = manifest_.ChunksOfLayer(layer);
  uint64_t bytes = 0;
  for (size_t c = first; c < last; ++c) bytes += manifest_.chunks[c].bytes;
  return bytes;
}

Status WeightsLoad::ImageLoader::LoadLayer(uint32_t layer) {
  const auto [first, last] = manifest_.ChunksOfLayer(layer);
  for (size_t begin = first; begin < last;) {
    // Abandoned: stop after the Get in flight, as the handle promises (a
    // layer of several GiB, an embedding, takes many Gets).
    if (stop_.load(std::memory_order_relaxed)) {
      return Status::Shutdown("the load was abandoned");
    }
    // A few Get calls per layer, each about batch_bytes_: the daemon leases
    // (pins) what one call reads until it is copied.
    size_t end = begin;
    uint64_t bytes = 0;
    std::vector<SegmentRead> reads;
    while (end < last && (end == begin || bytes + manifest_.chunks[end].bytes <=
                                              batch_bytes_)) {
      const WeightsChunk& chunk = manifest_.chunks[end];
      reads.push_back({WeightsChunkSegment(chunk.key),
                       image_.subspan(chunk.offset, chunk.bytes)});
      bytes += chunk.bytes;
      ++end;
    }
    const std::vector<Status> got = client_->Get(reads);
    for (size_t i = 0; i < got.size(); ++i) {
      if (!got[i].ok()) {
        return ChunkFailure(manifest_.chunks[begin + i], layer, got[i]);
      }
    }
    if (verify_) {
      for (size_t i = 0; i < reads.size(); ++i) {
        const WeightsChunk& chunk = manifest_.chunks[begin + i];
        if (WeightsChunkKey(reads[i].dst) != chunk.key) {
          return Status::Corruption(fmt::format(
              "chunk {} of layer {}: the bytes read do not hash to its key",
              chunk.key.ToHex(), layer));
        }
      }
    }
    begin = end;
  }
  return Status::OK();
}

// LoadWeightsToPool: the daemon moves the bytes into the registered image
// pool; this reads the transfer's ticket and names the chunks that failed.
class WeightsLoad::PoolLoader final : public WeightsLoad::Loader {
 public:
  PoolLoader(TransferHandle handle, WeightsManifest manifest, uint32_t first,
             uint32_t count)
      : Loader(first, count),
        handle_(std::move(handle)),
        manifest_(std::move(manifest)) {}

  Status WaitLayer(uint32_t layer) override {
    TIERKV_RETURN_IF_ERROR(CheckLayer(layer));
    bool gave_up = false;
    return LayerStatus(layer, &gave_up);
  }
  Status Wait() override {
    Status first_failure;
    for (uint32_t layer = first_; layer < first_ + count_; ++layer) {
      bool gave_up = false;
      Status s = LayerStatus(layer, &gave_up);
      // The daemon did not finish a layer within the client timeout: the
      // later layers would each wait that long again.
      if (gave_up) return s;
      if (first_failure.ok()) first_failure = std::move(s);
    }
    return first_failure;
  }
  uint32_t LayersDone() const override { return handle_.LayersDone(); }
  Status StreamWaitLayer(uint32_t layer, const EngineStream& stream) override {
    TIERKV_RETURN_IF_ERROR(CheckLayer(layer));
    return handle_.StreamWaitLayer(static_cast<uint16_t>(layer), stream);
  }

 private:
  // The layer's first failed chunk, if any. *gave_up: no answer for the
  // layer within the client timeout (IOError).
  Status LayerStatus(uint32_t layer, bool* gave_up) {
    // One Status per chunk of the shard (the ticket's "page" is the
    // chunk's index); only this layer's chunks can have failed in it.
    auto chunks = handle_.WaitLayer(static_cast<uint16_t>(layer));
    if (!chunks.ok()) {
      *gave_up = true;
      return chunks.status();
    }
    const auto [first, last] = manifest_.ChunksOfLayer(layer);
    for (size_t c = first; c < last; ++c) {
      if (!(*chunks)[c].ok()) {
        return ChunkFailure(manifest_.chunks[c], layer, (*chunks)[c]);
      }
    }
    return Status::OK();
  }

  // Its destructor waits until the daemon is done with the transfer (up
  // to the client timeout), so nothing writes the pool once it is gone.
  TransferHandle handle_;
  const WeightsManifest manifest_;
};

WeightsLoad::WeightsLoad() = default;
WeightsLoad::WeightsLoad(WeightsLoad&&) noexcept = default;
WeightsLoad& WeightsLoad::operator=(WeightsLoad&&) noexcept = default;
WeightsLoad::~WeightsLoad() = default;

Status WeightsLoad::WaitLayer(uint32_t layer) {
  if (!loader_) return Status::InvalidArgument("empty weights load handle");
  return loader_->WaitLayer(layer);
}

Status WeightsLoad::Wait() {
  if (!loader_) return Status::InvalidArgument("empty weights load handle");
  return loader_->Wait();
}

uint32_t WeightsLoad::LayersDone() const {
  return loader_ ? loader_->LayersDone() : 0;
}
Status WeightsLoad::StreamWaitLayer(uint32_t layer,
                                    const EngineStream& stream) {
  if (!loader_) return Status::InvalidArgument("empty weights load handle");
  return loader_->StreamWaitLayer(layer, stream);
}

uint32_t WeightsLoad::first_layer() const {
  return loader_ ? loader_->first() : 0;
}
uint32_t WeightsLoad::layer_count() const {
  return loader_ ? loader_->count() : 0;
}

Result<WeightsLoad> Client::LoadWeights(const WeightsManifest& manifest,
                                        std::span<std::byte> image,
                                        LayerRange layers) {
  auto count = LayersOfLoad(manifest, layers);
  if (!count.ok()) return count.status();
  if (image.size() < manifest.image_bytes) {
    return Status::InvalidArgument(
        fmt::format("the image buffer has {} bytes, the shard needs {}",
                    image.size(), manifest.image_bytes));
  }
  WeightsLoad load;
  load.loader_ = std::make_unique<WeightsLoad::ImageLoader>(
      this, BatchBytes(impl_->weights_batch_bytes_),
      impl_->weights_verify_loads_, manifest, image, layers.first, *count);
  return load;
}

Result<WeightsLoad> Client::LoadWeightsToPool(const WeightsManifest& manifest,
                                              LayerRange layers,
                                              const EngineStream* after) {
  auto count = LayersOfLoad(manifest, layers);
  if (!count.ok()) return count.status();
  if (*count > UINT16_MAX) {
    return Status::InvalidArgument(fmt::format(
        "one load covers at most {} layers, not {}", UINT16_MAX, *count));
  }
  const auto layer_count = static_cast<uint16_t>(*count);
  const WeightsId id{manifest.model, manifest.layout,
                     WeightsVersionOf(manifest)};
  auto handle = SubmitTransfer(
      static_cast<uint16_t>(Opcode::kWeightsLoad),
      [&](uint32_t ticket) {
        return transport::Encode(transport::WeightsLoadRequest{
            ticket, id, layers.first, layer_count, impl_->TakeWaits()});
      },
      layers.first, layer_count, static_cast<uint32_t>(manifest.chunks.size()),
      after);
  if (!handle.ok()) return handle.status();
  WeightsLoad load;
  load.loader_ = std::make_unique<WeightsLoad::PoolLoader>(
      std::move(handle).value(), manifest, layers.first, layer_count);
  return load;
}

}  // namespace tierkv
