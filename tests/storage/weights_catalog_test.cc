// Tests storage/weights/weights_catalog.cc and the engine's calls for
// weights namespaces (storage/engine/chunk_access.cc) over a real engine
// with an NVMe store on a memory device and its RocksDB catalog.
#include "storage/weights/weights_catalog.h"

#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <random>

#include "common/mutex.h"
#include "common/sync_point.h"
#include "tests/testing/manual_clock.h"
#include "tests/testing/memory_device.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace tierkv::storage {
namespace {

constexpr uint64_t kOwner = 3;
constexpr uint64_t kKiB = 1024;

std::vector<std::byte> Bytes(uint64_t seed, uint64_t size) {
  std::vector<std::byte> out(size);
  std::mt19937_64 rng(seed);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

#ifdef TIERKV_SYNC_POINTS
// Holds the thread that reaches sync point `point` until Release (or until
// it is destroyed, so a failed assertion never leaves that thread waiting),
// then disables and clears the sync points.
class HoldAt {
 public:
  explicit HoldAt(const char* point) {
    SyncPoint& sync = SyncPoint::Get();
    sync.SetCallback(point, [this](void*) {
      MutexLock lock(&mu_);
      reached_ = true;
      cv_.SignalAll();
      while (!released_) cv_.Wait(&mu_);
    });
    sync.EnableProcessing();
  }
  ~HoldAt() {
    Release();
    SyncPoint::Get().DisableProcessing();
    SyncPoint::Get().ClearAllCallbacks();
  }
  void WaitUntilReached() {
    MutexLock lock(&mu_);
    while (!reached_) cv_.Wait(&mu_);
  }
  void Release() {
    MutexLock lock(&mu_);
    released_ = true;
    cv_.SignalAll();
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool reached_ = false;
  bool released_ = false;
};
#endif

// A planned shard with its image: tensor i's bytes come from seeds[i].
struct Shard {
  WeightsManifest manifest;
  std::vector<std::byte> image;
  std::vector<std::byte> encoded;

  std::span<const std::byte> Chunk(size_t i) const {
    return std::span(image).subspan(manifest.chunks[i].offset,
                                    manifest.chunks[i].bytes);
  }
  SegmentKey Key(size_t i) const { return {manifest.chunks[i].key, 0, 0}; }
};

// Tensors of 1 MiB and more get chunks of their own; smaller ones of a
// layer share a pack.
Shard MakeShard(const std::string& model,
                std::vector<std::tuple<std::string, uint64_t, uint32_t,
                                       uint64_t>>
                    specs) {  // name seed layer bytes
  std::vector<WeightsTensor> tensors;
  for (const auto& [name, seed, layer, bytes] : specs) {
    tensors.push_back(WeightsTensor{.name = name,
                                    .dtype = "I8",
                                    .shape = {},
                                    .layer = layer,
                                    .bytes = bytes});
  }
  auto plan = PlanWeightsImage(model, "test/rank0-of-1", std::move(tensors));
  EXPECT_OK(plan);
  Shard s;
  s.manifest = std::move(plan).value();
  s.image.assign(s.manifest.image_bytes, std::byte{0});
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto bytes = Bytes(std::get<1>(specs[i]), std::get<3>(specs[i]));
    std::memcpy(s.image.data() + s.manifest.tensors[i].offset, bytes.data(),
                bytes.size());
  }
  for (size_t i = 0; i < s.manifest.chunks.size(); ++i) {
    s.manifest.chunks[i].key = WeightsChunkKey(s.Chunk(i));
  }
  s.encoded = EncodeWeightsManifest(s.manifest);
  return s;
}

// Chunks: embed (1 MiB, shared with B), layer 1 weight (1 MiB), layer 1
// pack (two small tensors).
Shard ShardA() {
  return MakeShard("model-a", {{"embed", 1, 0, 1 << 20},
                               {"l1.w", 2, 1, 1 << 20},
                               {"l1.norm", 3, 1, 100},
                               {"l1.bias", 4, 1, 60}});
}
Shard ShardB() {
  return MakeShard("model-b",
                   {{"embed", 1, 0, 1 << 20}, {"l1.w", 5, 1, 512 * kKiB}});
}

class WeightsCatalogTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(); }

  // (Re)opens the NVMe store on the same device and catalog, the engine
  // and the weights catalog, as a daemon restart does.
  void Open(WritePolicy policy = WritePolicy::kNone,
            WeightsCatalogOptions catalog_options = {}) {
    catalog_.reset();
    engine_.reset();
    nvme_.reset();
    NvmeStoreOptions o;
    o.catalog_path = dir_.File("catalog");
    o.capacity_bytes = 64 << 20;
    o.device = device_;
    auto nvme = NvmeStore::Open(o);
    ASSERT_OK(nvme);
    nvme_ = std::move(nvme).value();
    std::vector<NamespaceOptions> spaces;
    spaces.push_back({.host = {.name = "w",
                               .capacity_bytes = 8 << 20,
                               .shards = 1,
                               .try_hugepages = false,
                               .prefault = false,
                               .eviction_policy = EvictionPolicyKind::kWeights},
                      .write_policy = policy,
                      .weights = true});
    spaces.push_back({.host = {.name = "kv",
                               .capacity_bytes = 1 << 20,
                               .shards = 1,
                               .try_hugepages = false,
                               .prefault = false}});
    CacheEngineOptions engine_options{.workers = 2};
    // One Put may reserve all of DRAM (the schedule tests fill it at once).
    engine_options.lease_limits.max_bytes_percent_per_owner = 100;
    engine_options.lease_limits.max_bytes_percent_per_tier = 100;
    auto engine =
        CacheEngine::Open(engine_options, std::move(spaces), nvme_.get());
    ASSERT_OK(engine);
    engine_ = std::move(engine).value();
    ns_ = engine_->Find("w");
    auto catalog = WeightsCatalog::Open(catalog_options, engine_.get(), ns_,
                                        &nvme_->catalog());
    ASSERT_OK(catalog);
    catalog_ = std::move(catalog).value();
  }

  // Reserve, copy into the arena, commit: one Status per item.
  std::vector<Status> Put(
      const std::vector<std::pair<SegmentKey, std::span<const std::byte>>>&
          items) {
    std::vector<SegmentSize> sizes;
    for (const auto& [key, bytes] : items) sizes.push_back({key, bytes.size()});
    std::promise<EngineReservation> reserved;
    engine_->Reserve(kOwner, *ns_, sizes, [&](EngineReservation r) {
      reserved.set_value(std::move(r));
    });
    EngineReservation r = reserved.get_future().get();
    std::vector<Status> out(items.size());
    std::vector<SegmentKey> commit;
    std::vector<size_t> commit_at;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!r.items[i].ok()) {
        out[i] = r.items[i].status();
        continue;
      }
      if (r.items[i]->already_stored) continue;
      std::memcpy(ns_->host().arena().base() + r.items[i]->location.offset,
                  items[i].second.data(), items[i].second.size());
      commit.push_back(items[i].first);
      commit_at.push_back(i);
    }
    const auto committed = engine_->Commit(kOwner, *ns_, r.lease_id, commit);
    for (size_t j = 0; j < commit_at.size(); ++j) {
      out[commit_at[j]] = committed[j];
    }
    return out;
  }
  void PutShard(const Shard& s, int skip = -1) {
    std::vector<std::pair<SegmentKey, std::span<const std::byte>>> items;
    for (size_t i = 0; i < s.manifest.chunks.size(); ++i) {
      if (static_cast<int>(i) != skip) items.push_back({s.Key(i), s.Chunk(i)});
    }
    for (const Status& st : Put(items)) ASSERT_OK(st);
  }
  std::vector<tierkv::Tier> TiersOf(const Shard& s) {
    std::vector<SegmentKey> keys;
    for (size_t i = 0; i < s.manifest.chunks.size(); ++i) {
      keys.push_back(s.Key(i));
    }
    std::vector<tierkv::Tier> out;
    for (const auto& w : engine_->Where(*ns_, keys)) out.push_back(w.tier);
    return out;
  }
  const WeightsInfo* Find(const std::vector<WeightsInfo>& list,
                          const std::string& model) {
    for (const WeightsInfo& info : list) {
      if (info.id.model == model) return &info;
    }
    return nullptr;
  }

  testing::TempDir dir_;
  std::shared_ptr<testing::MemoryDevice> device_ =
      std::make_shared<testing::MemoryDevice>(64 << 20);
  std::unique_ptr<NvmeStore> nvme_;
  std::unique_ptr<CacheEngine> engine_;
  EngineNamespace* ns_ = nullptr;
  std::unique_ptr<WeightsCatalog> catalog_;
};

TEST_F(WeightsCatalogTest, OnlyAWeightsNamespaceHasACatalog) {
  auto kv =
      WeightsCatalog::Open({}, engine_.get(), engine_->Find("kv"), nullptr);
  EXPECT_EQ(kv.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(
      engine_->RegisterLayout(*ns_, LayoutSpec::Uniform(64, 1, {{"kv", 8}}))
          .code(),
      StatusCode::kInvalidArgument);
}

TEST_F(WeightsCatalogTest, CommitDropsChunksWhoseBytesDoNotMatchTheirKey) {
  const Shard a = ShardA();
  const auto statuses = Put({{a.Key(0), a.Chunk(1)}, {a.Key(1), a.Chunk(1)}});
  EXPECT_EQ(statuses[0].code(), StatusCode::kCorruption);
  EXPECT_OK(statuses[1]);
  EXPECT_FALSE(ns_->host().Contains(a.Key(0)));
  EXPECT_EQ(ns_->host().Reserved(a.Key(0)).status().code(),
            StatusCode::kNotFound);  // the reservation went too
  EXPECT_TRUE(ns_->host().Contains(a.Key(1)));
  for (const Status& s : Put({{a.Key(0), a.Chunk(0)}})) EXPECT_OK(s);
  EXPECT_TRUE(ns_->host().Contains(a.Key(0)));
}

TEST_F(WeightsCatalogTest, SealsOnlyOverEveryChunkStoredWithItsSize) {
  const Shard a = ShardA();
  PutShard(a, /*skip=*/2);
  auto sealed = catalog_->Seal(a.encoded);
  EXPECT_EQ(sealed.status().code(), StatusCode::kNotFound);
  EXPECT_NE(sealed.status().message().find("chunk 2 of 3 (key " +
                                           a.manifest.chunks[2].key.ToHex()),
            std::string::npos)
      << sealed.status().ToString();
  PutShard(a);
  sealed = catalog_->Seal(a.encoded);
  ASSERT_OK(sealed);
  EXPECT_EQ(sealed->version, WeightsVersionOf(a.manifest));
  EXPECT_FALSE(sealed->already_sealed);
  sealed = catalog_->Seal(a.encoded);
  ASSERT_OK(sealed);
  EXPECT_TRUE(sealed->already_sealed);

  // A manifest claiming another size for a stored key.
  WeightsManifest lying = a.manifest;
  lying.model = "liar";
  lying.tensors.resize(1);
  lying.tensors[0].bytes = (1 << 20) + 4096;
  lying.image_bytes = lying.tensors[0].bytes;
  lying.num_layers = 1;
  lying.chunks = {{a.manifest.chunks[0].key, 0, lying.image_bytes, 0}};
  ASSERT_OK(lying.Validate());
  auto refused = catalog_->Seal(EncodeWeightsManifest(lying));
  EXPECT_EQ(refused.status().code(), StatusCode::kNotFound);
  EXPECT_NE(refused.status().message().find("stored with 1048576 bytes"),
            std::string::npos)
      << refused.status().ToString();

  auto garbage = catalog_->Seal(std::vector<std::byte>(10, std::byte{7}));
  EXPECT_EQ(garbage.status().code(), StatusCode::kCorruption);
  WeightsCatalogOptions small;
  small.max_manifest_bytes = 16;
  auto tiny = WeightsCatalog::Open(small, engine_.get(), ns_, nullptr);
  ASSERT_OK(tiny);
  EXPECT_EQ((*tiny)->Seal(a.encoded).status().code(),
            StatusCode::kInvalidArgument);
  // All sealed manifests together are bounded too.
  WeightsCatalogOptions bounded;
  bounded.max_total_manifest_bytes = a.encoded.size() + 10;
  auto one = WeightsCatalog::Open(bounded, engine_.get(), ns_, nullptr);
  ASSERT_OK(one);
  ASSERT_OK((*one)->Seal(a.encoded));
  WeightsManifest renamed = a.manifest;
  renamed.model = "model-a2";
  EXPECT_EQ((*one)->Seal(EncodeWeightsManifest(renamed)).status().code(),
            StatusCode::kResourceExhausted);
  ASSERT_OK((*one)->Drop("model-a", "", {}));  // erases its chunks too
  PutShard(a);
  ASSERT_OK((*one)->Seal(EncodeWeightsManifest(renamed)));
}

TEST_F(WeightsCatalogTest, DropErasesOnlyChunksNoOtherShardNames) {
  const Shard a = ShardA();
  const Shard b = ShardB();
  ASSERT_EQ(a.manifest.chunks[0].key, b.manifest.chunks[0].key);
  for (const Shard* s : {&a, &b}) {
    PutShard(*s);
    // Sealing puts the chunks on NVMe too: the drop must erase both.
    ASSERT_OK(catalog_->Seal(s->encoded));
  }
  const uint64_t shared = a.manifest.chunks[0].bytes;
  const uint64_t a_own =
      a.manifest.chunks[1].bytes + a.manifest.chunks[2].bytes;
  const uint64_t b_own = b.manifest.chunks[1].bytes;
  auto totals = catalog_->totals();
  EXPECT_EQ(totals.shards, 2u);
  EXPECT_EQ(totals.unique_bytes, shared + a_own + b_own);
  EXPECT_EQ(totals.referenced_bytes, 2 * shared + a_own + b_own);
  const auto list = catalog_->List("", 100);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(Find(list, "model-a")->unique_bytes, a_own);
  EXPECT_EQ(Find(list, "model-b")->unique_bytes, b_own);

  EXPECT_EQ(catalog_->Drop("", "", {}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(catalog_->Drop("model-a", "other/layout", {}).status().code(),
            StatusCode::kNotFound);
  auto dropped = catalog_->Drop("model-a", "", {});
  ASSERT_OK(dropped);
  EXPECT_EQ(dropped->shards, 1u);
  EXPECT_EQ(dropped->freed_bytes, a_own);
  EXPECT_EQ(TiersOf(a),
            (std::vector<tierkv::Tier>{tierkv::Tier::kHost, tierkv::Tier::kMiss,
                                       tierkv::Tier::kMiss}));
  totals = catalog_->totals();
  EXPECT_EQ(totals.shards, 1u);
  EXPECT_EQ(totals.unique_bytes, shared + b_own);
  EXPECT_EQ(catalog_->List("model-b", 10).at(0).unique_bytes, shared + b_own);
  EXPECT_EQ(
      catalog_->Manifest({"model-a", a.manifest.layout, {}}).status().code(),
      StatusCode::kNotFound);
}

TEST_F(WeightsCatalogTest, ManifestsComeBackAfterARestartWithMissingChunks) {
  const Shard a = ShardA();
  const Shard b = ShardB();
  // Write policy none: only sealing puts the chunks on NVMe.
  PutShard(a);
  ASSERT_OK(catalog_->Seal(a.encoded));
  PutShard(b);
  ASSERT_OK(catalog_->Seal(b.encoded));
  // B's own chunk is lost after sealing (as NVMe eviction would lose it).
  engine_->Erase(*ns_, std::vector{b.Key(1)});
  const auto before = catalog_->totals();

  Open();
  const auto after = catalog_->totals();
  EXPECT_EQ(after.shards, 2u);
  EXPECT_EQ(after.unique_bytes, before.unique_bytes);
  EXPECT_EQ(after.referenced_bytes, before.referenced_bytes);
  const auto list = catalog_->List("", 100);
  const WeightsInfo* info_a = Find(list, "model-a");
  const WeightsInfo* info_b = Find(list, "model-b");
  ASSERT_NE(info_a, nullptr);
  ASSERT_NE(info_b, nullptr);
  EXPECT_EQ(info_a->chunks_on_nvme, 3u);
  EXPECT_EQ(info_a->chunks_missing, 0u);
  EXPECT_EQ(info_b->chunks_on_nvme, 1u);  // the shared one
  EXPECT_EQ(info_b->chunks_missing, 1u);
  EXPECT_EQ(info_b->chunks_in_dram, 0u);
  auto manifest = catalog_->Manifest({"model-b", b.manifest.layout, {}});
  ASSERT_OK(manifest);
  EXPECT_EQ(*manifest, b.encoded);
  // Storing B's lost chunk again makes it whole; sealing is a no-op.
  PutShard(b);
  auto sealed = catalog_->Seal(b.encoded);
  ASSERT_OK(sealed);
  EXPECT_TRUE(sealed->already_sealed);
}

TEST_F(WeightsCatalogTest, PrefetchPromotesTheAskedLayersInOrder) {
  const Shard a = ShardA();
  PutShard(a);
  ASSERT_OK(catalog_->Seal(a.encoded));  // durable: on NVMe too
  Open();                                // DRAM starts empty
  ASSERT_EQ(TiersOf(a), (std::vector<tierkv::Tier>(3, tierkv::Tier::kNvme)));
  auto queued = catalog_->Prefetch({"model-a", a.manifest.layout, {}}, {1, 1});
  ASSERT_OK(queued);
  EXPECT_EQ(*queued, 2u);  // layer 1: its weight and its pack
  engine_->TEST_DrainBackground();
  EXPECT_EQ(TiersOf(a),
            (std::vector<tierkv::Tier>{tierkv::Tier::kNvme, tierkv::Tier::kHost,
                                       tierkv::Tier::kHost}));
  EXPECT_EQ(catalog_->Prefetch({"model-a", a.manifest.layout, {}}, {2, 0})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      catalog_->Prefetch({"nope", a.manifest.layout, {}}, {}).status().code(),
      StatusCode::kNotFound);
}

TEST_F(WeightsCatalogTest, ChunksEvictedFromDramAreReadBackFromNvme) {
  Open(WritePolicy::kWriteThrough);
  // Twelve 1 MiB chunks through an 8 MiB DRAM tier: the first ones are
  // evicted once written through to NVMe.
  std::vector<std::vector<std::byte>> chunks;
  for (uint64_t i = 0; i < 12; ++i) {
    chunks.push_back(Bytes(100 + i, 1 << 20));
    const SegmentKey key{WeightsChunkKey(chunks.back()), 0, 0};
    for (const Status& s : Put({{key, chunks.back()}})) ASSERT_OK(s);
    engine_->TEST_DrainBackground();  // written through before the next
  }
  const SegmentKey first{WeightsChunkKey(chunks[0]), 0, 0};
  const auto where = engine_->Where(*ns_, std::vector{first});
  ASSERT_EQ(where[0].tier, tierkv::Tier::kNvme);
  EXPECT_EQ(where[0].bytes, uint64_t{1} << 20);
  std::promise<EngineRead> read;
  engine_->Acquire(kOwner, *ns_, {first},
                   [&](EngineRead r) { read.set_value(std::move(r)); });
  EngineRead r = read.get_future().get();
  ASSERT_OK(r.items[0]);
  EXPECT_EQ(r.source[0], tierkv::Tier::kNvme);
  const auto got = ns_->host().HostBytes(*r.items[0]);
  EXPECT_TRUE(
      std::equal(got.begin(), got.end(), chunks[0].begin(), chunks[0].end()));
  ASSERT_OK(engine_->Release(kOwner, r.lease_id));
}

TEST_F(WeightsCatalogTest, ZeroVersionNamesTheNewestSealed) {
  uint64_t now = 1000;
  catalog_.reset();
  WeightsCatalogOptions o;
  static uint64_t* clock = nullptr;
  clock = &now;
  o.now_unix_ms = [] { return *clock; };
  auto catalog = WeightsCatalog::Open(o, engine_.get(), ns_, nullptr);
  ASSERT_OK(catalog);
  catalog_ = std::move(catalog).value();
  const Shard v1 = ShardA();
  Shard v2 = MakeShard("model-a", {{"embed", 1, 0, 1 << 20},
                                   {"l1.w", 9, 1, 1 << 20},
                                   {"l1.norm", 3, 1, 100},
                                   {"l1.bias", 4, 1, 60}});
  PutShard(v1);
  PutShard(v2);
  // v2 sealed first, v1 later: the newest is v1, whatever the keys' order.
  ASSERT_OK(catalog_->Seal(v2.encoded));
  now = 2000;
  ASSERT_OK(catalog_->Seal(v1.encoded));
  auto newest = catalog_->Manifest({"model-a", v1.manifest.layout, {}});
  ASSERT_OK(newest);
  EXPECT_EQ(*newest, v1.encoded);
  auto asked = catalog_->Manifest(
      {"model-a", v1.manifest.layout, WeightsVersionOf(v2.manifest)});
  ASSERT_OK(asked);
  EXPECT_EQ(*asked, v2.encoded);
  EXPECT_EQ(catalog_->List("model-a", 10).size(), 2u);
  EXPECT_EQ(catalog_->List("model-a", 1).size(), 1u);
  EXPECT_EQ(catalog_->List("model", 10).size(), 0u);

  // The clock steps back: a later seal is still the newest, sealed one
  // millisecond after the previous one.
  Shard v3 = MakeShard("model-a", {{"embed", 1, 0, 1 << 20},
                                   {"l1.w", 11, 1, 1 << 20},
                                   {"l1.norm", 3, 1, 100},
                                   {"l1.bias", 4, 1, 60}});
  PutShard(v3);
  now = 500;
  ASSERT_OK(catalog_->Seal(v3.encoded));
  newest = catalog_->Manifest({"model-a", v1.manifest.layout, {}});
  ASSERT_OK(newest);
  EXPECT_EQ(*newest, v3.encoded);
  for (const WeightsInfo& info : catalog_->List("model-a", 10)) {
    if (info.id.version == WeightsVersionOf(v3.manifest)) {
      EXPECT_EQ(info.sealed_unix_ms, 2001u);
    }
  }
}

#ifdef TIERKV_SYNC_POINTS
// A Drop of the last sealed shard naming a chunk, while a Seal naming it
// too makes its chunks durable, leaves the chunk stored for that Seal,
// which then seals over it (it did not: the Drop erased it, the seal
// failed NotFound, and with a read lease keeping the DRAM copy a while the
// shard could be sealed over a chunk NVMe no longer had).
TEST_F(WeightsCatalogTest, ADropDuringASealsFlushKeepsTheChunksItNames) {
  Open(WritePolicy::kWriteThrough);
  const Shard a = ShardA();
  const Shard b = ShardB();  // shares chunk 0 (embed) with A
  PutShard(a);
  ASSERT_OK(catalog_->Seal(a.encoded));
  PutShard(b);  // embed: already stored

  std::future<Result<WeightsCatalog::Sealed>> sealing;  // outlives hold
  HoldAt hold(WeightsCatalog::kSealFlushed);
  sealing =
      std::async(std::launch::async, [&] { return catalog_->Seal(b.encoded); });
  hold.WaitUntilReached();
  auto drop = catalog_->Drop("model-a", "", {});
  hold.Release();
  auto sealed = sealing.get();
  ASSERT_OK(drop);
  EXPECT_EQ(drop->shards, 1u);
  // Without the fix: NotFound, the drop erased a chunk the seal named.
  ASSERT_OK(sealed);
  // B's chunks, the shared one included, are all stored (and on NVMe).
  std::vector<SegmentKey> keys;
  for (size_t i = 0; i < b.manifest.chunks.size(); ++i)
    keys.push_back(b.Key(i));
  for (const uint64_t bytes : engine_->PersistedBytes(*ns_, keys)) {
    EXPECT_GT(bytes, 0u);
  }
  // A's own chunks are gone.
  const auto a_own = engine_->Where(*ns_, std::vector<SegmentKey>{a.Key(1)});
  EXPECT_EQ(a_own[0].tier, tierkv::Tier::kMiss);
}
#endif

#ifdef TIERKV_SYNC_POINTS
// Seals waiting for their flush count against the manifest-bytes limit: two
// seals at once cannot pass it together.
TEST_F(WeightsCatalogTest, PendingSealsCountAgainstTheManifestLimit) {
  const Shard a = ShardA();
  const Shard b = ShardB();
  WeightsCatalogOptions o;
  o.max_total_manifest_bytes = a.encoded.size() + b.encoded.size() - 1;
  Open(WritePolicy::kWriteThrough, o);
  PutShard(a);
  PutShard(b);
  std::future<Result<WeightsCatalog::Sealed>> sealing;  // outlives hold
  HoldAt hold(WeightsCatalog::kSealFlushed);
  sealing =
      std::async(std::launch::async, [&] { return catalog_->Seal(a.encoded); });
  hold.WaitUntilReached();
  // A is waiting for its flush: B does not fit beside it.
  auto refused = catalog_->Seal(b.encoded);
  hold.Release();
  ASSERT_OK(sealing.get());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted)
      << refused.status().ToString();
  // Dropping A makes room (and erases the chunk A shared with B: stored
  // again).
  ASSERT_OK(catalog_->Drop("model-a", "", {}));
  PutShard(b);
  EXPECT_OK(catalog_->Seal(b.encoded));
}
#endif

}  // namespace
}  // namespace tierkv::storage

namespace tierkv::storage {
namespace {

// Shards of two 1 MiB tensors (layers 0 and 1): one chunk each.
Shard TwoChunkShard(const std::string& model, uint64_t seed) {
  return MakeShard(
      model, {{"l0.w", seed, 0, 1 << 20}, {"l1.w", seed + 1, 1, 1 << 20}});
}

class WeightsScheduleTest : public WeightsCatalogTest {
 protected:
  void SetUp() override {}
  void OpenWith(std::chrono::milliseconds horizon) {
    Open(WritePolicy::kNone, {.clock = &clock_, .prefetch_horizon = horizon});
  }
  // Puts `n` fresh unhinted 1 MiB chunks in one call (all reserved before
  // any commits, so none of them is evictable meanwhile).
  std::vector<Status> PutFresh(size_t n) {
    std::vector<std::vector<std::byte>> chunks;
    for (size_t i = 0; i < n; ++i)
      chunks.push_back(Bytes(next_seed_++, 1 << 20));
    std::vector<std::pair<SegmentKey, std::span<const std::byte>>> items;
    for (const auto& c : chunks) {
      items.push_back({SegmentKey{WeightsChunkKey(c), 0, 0}, c});
    }
    return Put(items);
  }
  size_t InDram(const Shard& s) {
    const std::vector<tierkv::Tier> tiers = TiersOf(s);
    return std::count(tiers.begin(), tiers.end(), tierkv::Tier::kHost);
  }
  WeightsId Id(const Shard& s) {
    return {s.manifest.model, s.manifest.layout, {}};
  }

  testing::ManualClock clock_;
  uint64_t next_seed_ = 1000;
};

using Tiers = std::vector<tierkv::Tier>;
constexpr tierkv::Tier kHost = tierkv::Tier::kHost;
constexpr tierkv::Tier kNvme = tierkv::Tier::kNvme;

TEST_F(WeightsScheduleTest, DramEvictsTheFarthestNextUseFirstWholeVersions) {
  OpenWith(std::chrono::milliseconds(0));  // no prefetch
  const Shard x = TwoChunkShard("x", 10), y = TwoChunkShard("y", 20),
              z = TwoChunkShard("z", 30);
  for (const Shard* s : {&x, &y, &z}) {
    PutShard(*s);
    ASSERT_OK(catalog_->Seal(s->encoded));  // on NVMe too, and clean
  }
  const WeightsCatalog::ShardHint hints[] = {
      {Id(x), std::chrono::seconds(10)},
      {Id(y), std::chrono::seconds(1000)},
      {Id(z), std::chrono::seconds(100)}};
  for (const Status& st : catalog_->Hint(hints)) ASSERT_OK(st);
  // 8 MiB of DRAM holds the three shards and two more chunks; five more
  // evict three: y's two (farthest), then z's first.
  for (const Status& st : PutFresh(5)) ASSERT_OK(st);
  EXPECT_EQ(TiersOf(y), (Tiers{kNvme, kNvme}));
  EXPECT_EQ(InDram(z), 1u);  // chunks of one next use: either goes first
  EXPECT_EQ(TiersOf(x), (Tiers{kHost, kHost}));
  // Unhinted chunks go before any hinted one: the five fresh ones first.
  for (const Status& st : PutFresh(5)) ASSERT_OK(st);
  EXPECT_EQ(InDram(z), 1u);
  EXPECT_EQ(TiersOf(x), (Tiers{kHost, kHost}));
  // Cleared hints make x and z unhinted (least recently used first).
  const WeightsCatalog::ShardHint clear[] = {
      {Id(x), std::chrono::milliseconds(-1)},
      {Id(z), std::chrono::milliseconds(-1)}};
  for (const Status& st : catalog_->Hint(clear)) ASSERT_OK(st);
  EXPECT_EQ(catalog_->schedule_totals().hinted_shards, 1u);  // y
  for (const Status& st : PutFresh(6)) ASSERT_OK(st);
  EXPECT_EQ(TiersOf(x), (Tiers{kNvme, kNvme}));
  EXPECT_EQ(TiersOf(z), (Tiers{kNvme, kNvme}));
}

TEST_F(WeightsScheduleTest, AHintWithinTheHorizonPrefetchesTheShard) {
  OpenWith(std::chrono::seconds(60));
  const Shard a = ShardA(), b = ShardB();
  PutShard(a);
  PutShard(b);
  ASSERT_OK(catalog_->Seal(a.encoded));
  ASSERT_OK(catalog_->Seal(b.encoded));
  OpenWith(std::chrono::seconds(60));  // a restart: DRAM starts empty
  ASSERT_EQ(TiersOf(a), (Tiers(3, kNvme)));
  const WeightsCatalog::ShardHint hints[] = {
      {Id(a), std::chrono::seconds(120)},
      {{"nope", a.manifest.layout, {}}, std::chrono::seconds(1)}};
  const std::vector<Status> hinted = catalog_->Hint(hints);
  EXPECT_OK(hinted[0]);
  EXPECT_EQ(hinted[1].code(), StatusCode::kNotFound);
  catalog_->Tick();
  engine_->TEST_DrainBackground();
  EXPECT_EQ(TiersOf(a), (Tiers(3, kNvme)));  // 120 s away: not yet
  clock_.Advance(std::chrono::seconds(61));
  catalog_->Tick();
  engine_->TEST_DrainBackground();
  EXPECT_EQ(TiersOf(a), (Tiers(3, kHost)));
  // A hint already within the horizon prefetches at once.
  const WeightsCatalog::ShardHint soon[] = {{Id(b), std::chrono::seconds(5)}};
  ASSERT_OK(catalog_->Hint(soon)[0]);
  engine_->TEST_DrainBackground();
  EXPECT_EQ(TiersOf(b), (Tiers(b.manifest.chunks.size(), kHost)));
}

TEST_F(WeightsScheduleTest, PinnedShardsStayInDramUntilTheirTtl) {
  OpenWith(std::chrono::milliseconds(0));
  const Shard a = ShardA(), b = ShardB(), x = TwoChunkShard("x", 10);
  for (const Shard* s : {&a, &b, &x}) {
    PutShard(*s);
    ASSERT_OK(catalog_->Seal(s->encoded));
  }
  OpenWith(std::chrono::milliseconds(0));  // DRAM starts empty
  ASSERT_OK(catalog_->Pin(Id(a), std::chrono::seconds(10)));
  engine_->TEST_DrainBackground();
  ASSERT_EQ(TiersOf(a), (Tiers(3, kHost)));
  // Half of the 8 MiB DRAM at most: a's 2 MiB and x's 2 MiB are more.
  EXPECT_EQ(catalog_->Pin(Id(x), std::chrono::seconds(10)).code(),
            StatusCode::kResourceExhausted);
  const auto totals = catalog_->schedule_totals();
  EXPECT_EQ(totals.pinned_shards, 1u);
  EXPECT_GT(totals.pinned_bytes, uint64_t{2} << 20);
  // b shares a's embedding; dropping b leaves it in DRAM with a.
  ASSERT_OK(catalog_->Drop("model-b", "", {}));
  EXPECT_EQ(TiersOf(a), (Tiers(3, kHost)));
  // Six fresh chunks need all of DRAM: the pinned ones are never victims.
  const std::vector<Status> full = PutFresh(6);
  EXPECT_EQ(full.back().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(TiersOf(a), (Tiers(3, kHost)));
  // The pin ends at its ttl: a's chunks are evictable again.
  clock_.Advance(std::chrono::seconds(11));
  catalog_->Tick();
  EXPECT_EQ(catalog_->schedule_totals().pinned_shards, 0u);
  for (const Status& st : PutFresh(6)) EXPECT_OK(st);
  EXPECT_EQ(TiersOf(a)[0], kNvme);
  // Unpinning what is not pinned is OK; pinning nothing is NotFound.
  EXPECT_OK(catalog_->Pin(Id(a), std::chrono::milliseconds(0)));
  EXPECT_EQ(catalog_->Pin({"nope", "", {}}, std::chrono::seconds(1)).code(),
            StatusCode::kNotFound);
}

// A pin that ran out before the next sweep, ended by an unpin of it, leaves
// the policies too (the unpin found it not pinned and answered at once,
// with the chunks still held back in DRAM).
TEST_F(WeightsScheduleTest, AnUnpinAfterTheTtlBeforeASweepReleasesTheChunks) {
  OpenWith(std::chrono::milliseconds(0));
  const Shard x = TwoChunkShard("x", 10);
  PutShard(x);
  ASSERT_OK(catalog_->Seal(x.encoded));
  ASSERT_OK(catalog_->Pin(Id(x), std::chrono::seconds(10)));
  clock_.Advance(std::chrono::seconds(11));  // no Tick
  ASSERT_OK(catalog_->Pin(Id(x), std::chrono::milliseconds(0)));
  EXPECT_EQ(catalog_->schedule_totals().pinned_shards, 0u);
  // All of DRAM: x's chunks must be evictable (held back, the last
  // Put would be ResourceExhausted).
  for (const Status& st : PutFresh(8)) EXPECT_OK(st);
  EXPECT_EQ(TiersOf(x), (Tiers{kNvme, kNvme}));
}

// "Forever" neither wraps into the past nor overflows: a pin of the largest
// ttl outlives any sweep, and the largest next use ranks farthest (first to
// go), not nearest.
TEST_F(WeightsScheduleTest, TheLargestTtlAndNextUseMeanForever) {
  OpenWith(std::chrono::milliseconds(0));
  const Shard x = TwoChunkShard("x", 10), y = TwoChunkShard("y", 20);
  for (const Shard* s : {&x, &y}) {
    PutShard(*s);
    ASSERT_OK(catalog_->Seal(s->encoded));
  }
  ASSERT_OK(catalog_->Pin(Id(x), std::chrono::milliseconds::max()));
  clock_.Advance(std::chrono::hours(24 * 365));
  catalog_->Tick();
  EXPECT_EQ(catalog_->schedule_totals().pinned_shards, 1u);
  ASSERT_OK(catalog_->Pin(Id(x), std::chrono::milliseconds(0)));
  const WeightsCatalog::ShardHint hints[] = {
      {Id(x), std::chrono::milliseconds::max()},
      {Id(y), std::chrono::seconds(1)}};
  for (const Status& st : catalog_->Hint(hints)) ASSERT_OK(st);
  // Four fresh chunks fill DRAM (8 MiB holds the two shards and four
  // more); two more evict x's two, the farthest.
  for (const Status& st : PutFresh(6)) ASSERT_OK(st);
  EXPECT_EQ(TiersOf(x), (Tiers{kNvme, kNvme}));
  EXPECT_EQ(TiersOf(y), (Tiers{kHost, kHost}));
}

#ifdef TIERKV_SYNC_POINTS
// A chunk a Drop left stored for a pending seal goes once that seal fails:
// nothing names it then. (The seal fails here because another of its chunks
// is gone from NVMe at the re-check, as an eviction would leave it.)
TEST_F(WeightsCatalogTest, AChunkKeptForASealThatFailsIsErasedAfterIt) {
  Open(WritePolicy::kWriteThrough);
  const Shard a = ShardA();
  const Shard b = ShardB();  // chunk 0 (embed) is A's chunk 0 too
  PutShard(a);
  ASSERT_OK(catalog_->Seal(a.encoded));
  PutShard(b);
  std::future<Result<WeightsCatalog::Sealed>> sealing;  // outlives hold
  HoldAt hold(WeightsCatalog::kSealFlushed);
  sealing =
      std::async(std::launch::async, [&] { return catalog_->Seal(b.encoded); });
  hold.WaitUntilReached();
  ASSERT_OK(catalog_->Drop("model-a", "", {}));  // keeps embed for B
  EXPECT_NE(engine_->Where(*ns_, std::vector<SegmentKey>{b.Key(0)})[0].tier,
            tierkv::Tier::kMiss);
  engine_->Erase(*ns_, std::vector<SegmentKey>{b.Key(1)});
  hold.Release();
  const auto sealed = sealing.get();
  EXPECT_TRUE(sealed.status().IsNotFound()) << sealed.status().ToString();
  EXPECT_EQ(engine_->Where(*ns_, std::vector<SegmentKey>{b.Key(0)})[0].tier,
            tierkv::Tier::kMiss);
  EXPECT_EQ(catalog_->totals().shards, 0u);
}
#endif

TEST_F(WeightsScheduleTest, UnpinReleasesAtOnce) {
  OpenWith(std::chrono::milliseconds(0));
  const Shard x = TwoChunkShard("x", 10);
  PutShard(x);
  ASSERT_OK(catalog_->Seal(x.encoded));
  ASSERT_OK(catalog_->Pin(Id(x), std::chrono::hours(1)));
  EXPECT_EQ(PutFresh(7).back().code(), StatusCode::kResourceExhausted);
  ASSERT_OK(catalog_->Pin(Id(x), std::chrono::milliseconds(0)));
  for (const Status& st : PutFresh(7)) EXPECT_OK(st);
  EXPECT_EQ(TiersOf(x), (Tiers{kNvme, kNvme}));
}

}  // namespace
}  // namespace tierkv::storage
