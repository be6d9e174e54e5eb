// Weights shards loaded into an engine's registered image pool through a
// real tierkvd (Client::LoadWeightsToPool, issue 28): a memfd image and an
// (emulated) device image, filled from DRAM and from NVMe by the daemon's
// Load machinery, layer by layer; a chunk corrupted on NVMe fails its layer
// and never stays in the pool; shards staged and sealed from an image pool
// (PutWeightsFromPool); requests that cannot be served are refused before
// anything moves.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "storage/device/device_backend.h"
#include "tests/client/test_shards.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace tierkv::testing {
namespace {

using storage::DeviceBackend;
using storage::DeviceBackendKind;

constexpr std::byte kFill{0xee};

// An engine's weights buffer in a memfd (sealable, as RegisterPool needs),
// filled with kFill.
class MemfdImage {
 public:
  explicit MemfdImage(uint64_t bytes) : bytes_(bytes) {
    fd_ = ::memfd_create("image", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(::ftruncate(fd_, static_cast<off_t>(bytes)), 0);
    void* base =
        ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    EXPECT_NE(base, MAP_FAILED);
    base_ = static_cast<std::byte*>(base);
    std::fill(base_, base_ + bytes, kFill);
  }
  ~MemfdImage() {
    ::munmap(base_, bytes_);
    ::close(fd_);
  }
  MemfdImage(const MemfdImage&) = delete;
  MemfdImage& operator=(const MemfdImage&) = delete;

  std::span<std::byte> mutable_bytes() { return {base_, bytes_}; }
  PoolSpec Spec() const {
    return {.kind = PoolSpec::Kind::kMemfd,
            .fd = fd_,
            .slot_bytes = bytes_,
            .slot_count = 1};
  }
  std::span<const std::byte> bytes() const { return {base_, bytes_}; }

 private:
  int fd_ = -1;
  std::byte* base_ = nullptr;
  uint64_t bytes_;
};

// The same in (emulated) device memory, exported by IPC handle.
class DeviceImage {
 public:
  explicit DeviceImage(uint64_t bytes) : bytes_(bytes) {
    auto b = DeviceBackend::Open({.kind = DeviceBackendKind::kEmulated});
    EXPECT_OK(b);
    backend_ = std::move(b).value();
    auto pool = backend_->AllocatePool(bytes);
    EXPECT_OK(pool);
    pool_ = pool->id;
    auto base = backend_->PoolBase(pool_);
    EXPECT_OK(base);
    std::fill(*base, *base + bytes, kFill);
  }
  Result<PoolSpec> Spec() const {
    auto handle = backend_->ExportPool(pool_);
    if (!handle.ok()) return handle.status();
    return PoolSpec{.kind = PoolSpec::Kind::kDeviceIpc,
                    .device_handle = handle->bytes,
                    .device_pool_bytes = handle->pool_bytes,
                    .device_uuid = backend_->uuid(),
                    .slot_bytes = bytes_,
                    .slot_count = 1};
  }
  // What the engine's kernels would read and write (the emulated device's
  // memory is host memory).
  std::span<std::byte> bytes() const {
    auto base = backend_->PoolBase(pool_);
    EXPECT_OK(base);
    return base.ok() ? std::span<std::byte>(*base, bytes_)
                     : std::span<std::byte>();
  }

 private:
  uint64_t bytes_;
  std::unique_ptr<DeviceBackend> backend_;
  uint32_t pool_ = 0;
};

// Whether `image` holds every chunk of `shard` at its offset.
::testing::AssertionResult HoldsShard(std::span<const std::byte> image,
                                      const TestShard& shard) {
  for (size_t i = 0; i < shard.manifest.chunks.size(); ++i) {
    const WeightsChunk& c = shard.manifest.chunks[i];
    const auto want = shard.ChunkBytes(i);
    if (!std::equal(want.begin(), want.end(), image.begin() + c.offset)) {
      return ::testing::AssertionFailure()
             << "chunk " << i << " (layer " << c.layer << ") differs";
    }
  }
  return ::testing::AssertionSuccess();
}

class WeightsPoolTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_OK(Start()); }

  Status Start() {
    daemon_ = std::make_unique<DaemonProcess>();
    const std::string config = fmt::format(R"(
[nvme]
path = "{}/nvme.data"
capacity_bytes = "256MiB"
[hbm]
backend = "emulated"
capacity_bytes = "16MiB"
[[namespace]]
name = "kv"
token = "token-of-kv"
host_bytes = "4MiB"
shards = 1
[[namespace]]
name = "w"
token = "token-of-w"
host_bytes = "256MiB"
shards = 2
prefault = false
hugepages = false
weights = true
)",
                                           dir_.path().string());
    return daemon_->Start({.config_toml = config});
  }
  std::unique_ptr<Client> Connect(const std::string& ns = "w") {
    auto c = daemon_->Connect(ns, "token-of-" + ns);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  nlohmann::json Stats(Client& c) {
    auto s = c.StatsJson();
    EXPECT_TRUE(s.ok());
    return nlohmann::json::parse(s.ok() ? *s : "{}");
  }
  // Stores and seals `shard` with PutWeights (durably: the namespace has
  // an NVMe tier, so every batch is flushed before the seal).
  void StoreSealed(const TestShard& shard) {
    auto c = Connect();
    ASSERT_NE(c, nullptr);
    // PutWeights plans the tensors anew: the same plan, so the same
    // manifest and version.
    std::vector<WeightsTensorData> tensors;
    for (const WeightsTensor& t : shard.manifest.tensors) {
      tensors.push_back({t, std::span(shard.image).subspan(t.offset, t.bytes)});
    }
    auto sealed =
        c->PutWeights(shard.manifest.model, shard.manifest.layout, tensors);
    ASSERT_OK(sealed);
    ASSERT_EQ(WeightsVersionOf(*sealed), shard.version);
  }
  // Loads every layer of `shard` into the connection's image pool and
  // waits for each in order.
  void LoadAll(Client& c, const TestShard& shard) {
    auto load = c.LoadWeightsToPool(shard.manifest);
    ASSERT_OK(load);
    EXPECT_EQ(load->first_layer(), 0u);
    EXPECT_EQ(load->layer_count(), shard.manifest.num_layers);
    for (uint32_t l = 0; l < shard.manifest.num_layers; ++l) {
      ASSERT_OK(load->WaitLayer(l));
      EXPECT_GE(load->LayersDone(), l + 1);
    }
    EXPECT_OK(load->Wait());
  }
  void Restart() {
    ASSERT_EQ(daemon_->Stop(SIGKILL), SIGKILL);
    ASSERT_OK(Start());
  }

  // Disk-backed: the NVMe tier's data file needs O_DIRECT. Declared before
  // daemon_, so the daemon stops before the directory is removed.
  TempDir dir_{"/var/tmp"};
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(WeightsPoolTest, AMemfdImageFillsFromDramThenFromNvme) {
  const TestShard a = ShardA();
  ASSERT_NO_FATAL_FAILURE(StoreSealed(a));
  {
    auto c = Connect();
    MemfdImage image(a.manifest.image_bytes + 4096);
    ASSERT_OK(c->RegisterPool(image.Spec()));
    ASSERT_NO_FATAL_FAILURE(LoadAll(*c, a));
    EXPECT_TRUE(HoldsShard(image.bytes(), a));
    // Past the image the pool is not written.
    EXPECT_EQ(image.bytes().back(), kFill);
    const nlohmann::json t = Stats(*c)["transfers"];
    EXPECT_EQ(t["load_segments"]["host"], a.manifest.chunks.size());
    EXPECT_EQ(t["load_segments"]["nvme"], 0);
    // Timed apart from KV loads, in the stats and in Prometheus.
    EXPECT_EQ(t["weights_loads"], 1);
    EXPECT_EQ(t["loads"], 0);
    EXPECT_EQ(t["weights_load_seconds"]["count"], 1);
    EXPECT_EQ(t["load_seconds"]["count"], 0);
    auto metrics = HttpGet(daemon_->metrics_port(), "/metrics");
    ASSERT_OK(metrics);
    EXPECT_EQ(
        MetricValue(*metrics, "tierkv_transfers_total{op=\"weights_load\"}"),
        1);
    EXPECT_EQ(MetricValue(*metrics, "tierkv_transfers_total{op=\"load\"}"), 0);
    EXPECT_EQ(MetricValue(*metrics,
                          "tierkv_transfer_seconds_count{op=\"weights_load\"}"),
              1);
    EXPECT_EQ(
        MetricValue(*metrics, "tierkv_transfer_seconds_count{op=\"load\"}"), 0);
  }
  // A restart empties DRAM: every chunk comes from NVMe, read straight into
  // the image.
  ASSERT_NO_FATAL_FAILURE(Restart());
  auto c = Connect();
  MemfdImage image(a.manifest.image_bytes);
  ASSERT_OK(c->RegisterPool(image.Spec()));
  ASSERT_NO_FATAL_FAILURE(LoadAll(*c, a));
  EXPECT_TRUE(HoldsShard(image.bytes(), a));
  const nlohmann::json t = Stats(*c)["transfers"];
  EXPECT_EQ(t["load_segments"]["nvme"], a.manifest.chunks.size());
  EXPECT_EQ(t["load_segments"]["host"], 0);
  EXPECT_EQ(t["load_segments"]["miss"], 0);
}

TEST_F(WeightsPoolTest, ADeviceImageFillsFromDramThenFromNvme) {
  const TestShard a = ShardA();
  const TestShard b = ShardB();
  ASSERT_NO_FATAL_FAILURE(StoreSealed(a));
  ASSERT_NO_FATAL_FAILURE(StoreSealed(b));
  {
    auto c = Connect();
    DeviceImage image(std::max(a.manifest.image_bytes, b.manifest.image_bytes));
    auto spec = image.Spec();
    ASSERT_OK(spec);
    ASSERT_OK(c->RegisterPool(*spec));
    ASSERT_NO_FATAL_FAILURE(LoadAll(*c, a));
    EXPECT_TRUE(HoldsShard(image.bytes(), a));
    // The same pool takes the next model: a teacher switch.
    ASSERT_NO_FATAL_FAILURE(LoadAll(*c, b));
    EXPECT_TRUE(HoldsShard(image.bytes(), b));
  }
  ASSERT_NO_FATAL_FAILURE(Restart());
  auto c = Connect();
  DeviceImage image(a.manifest.image_bytes);
  auto spec = image.Spec();
  ASSERT_OK(spec);
  ASSERT_OK(c->RegisterPool(*spec));
  ASSERT_NO_FATAL_FAILURE(LoadAll(*c, a));
  EXPECT_TRUE(HoldsShard(image.bytes(), a));
  const nlohmann::json t = Stats(*c)["transfers"];
  EXPECT_EQ(t["load_segments"]["nvme"], a.manifest.chunks.size());
  EXPECT_EQ(t["load_segments"]["miss"], 0);
}

TEST_F(WeightsPoolTest, LayersLoadAloneAndInAnyRange) {
  const TestShard a = ShardA();
  ASSERT_NO_FATAL_FAILURE(StoreSealed(a));
  auto c = Connect();
  MemfdImage image(a.manifest.image_bytes);
  ASSERT_OK(c->RegisterPool(image.Spec()));
  auto load = c->LoadWeightsToPool(a.manifest, LayerRange{1, 1});
  ASSERT_OK(load);
  EXPECT_EQ(load->first_layer(), 1u);
  EXPECT_EQ(load->layer_count(), 1u);
  EXPECT_EQ(load->WaitLayer(0).code(), StatusCode::kInvalidArgument);
  ASSERT_OK(load->Wait());
  // Layer 1's chunks are in place; layer 0's were never written.
  for (size_t i = 0; i < a.manifest.chunks.size(); ++i) {
    const WeightsChunk& chunk = a.manifest.chunks[i];
    const auto got = image.bytes().subspan(chunk.offset, chunk.bytes);
    if (chunk.layer == 1) {
      EXPECT_TRUE(std::equal(got.begin(), got.end(), a.ChunkBytes(i).begin()));
    } else {
      EXPECT_TRUE(std::all_of(got.begin(), got.end(),
                              [](std::byte x) { return x == kFill; }));
    }
  }
}

TEST_F(WeightsPoolTest, ACorruptChunkOnNvmeFailsItsLayerAndLeavesNoByteOfIt) {
  const TestShard a = ShardA();
  // A chunk of each tensor of 1 MiB or more: layer 1's, then layer 0's.
  std::vector<size_t> victims;
  for (size_t i = a.manifest.chunks.size(); i-- > 0;) {
    if (a.manifest.chunks[i].bytes >= kMiB) victims.push_back(i);
  }
  ASSERT_EQ(victims.size(), 2u);
  const std::string data_path = dir_.path().string() + "/nvme.data";
  // Round 0 loads into a memfd image, round 1 into a device image. Each
  // corrupts another chunk: the NVMe tier drops a chunk that failed its
  // checksum, so the data file's dead copy of round 0's victim still
  // starts like it.
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "memfd image" : "device image");
    const size_t victim = victims[round];
    const WeightsChunk& chunk = a.manifest.chunks[victim];
    ASSERT_NO_FATAL_FAILURE(StoreSealed(a));  // again: round 0 dropped one
    ASSERT_EQ(daemon_->Stop(SIGKILL), SIGKILL);
    ASSERT_TRUE(FlipAByteOfChunk(data_path, a, victim));
    ASSERT_OK(Start());
    auto c = Connect();
    // Declared before the load: its handle waits for the daemon before
    // the images go.
    MemfdImage memfd(a.manifest.image_bytes);
    DeviceImage device(a.manifest.image_bytes);
    std::span<const std::byte> image;
    if (round == 0) {
      ASSERT_OK(c->RegisterPool(memfd.Spec()));
      image = memfd.bytes();
    } else {
      auto spec = device.Spec();
      ASSERT_OK(spec);
      ASSERT_OK(c->RegisterPool(*spec));
      image = device.bytes();
    }
    auto load = c->LoadWeightsToPool(a.manifest);
    ASSERT_OK(load);
    for (uint32_t l = 0; l < chunk.layer; ++l) EXPECT_OK(load->WaitLayer(l));
    const Status bad = load->WaitLayer(chunk.layer);
    EXPECT_FALSE(bad.ok());
    EXPECT_NE(bad.ToString().find(chunk.key.ToHex()), std::string::npos)
        << bad.ToString();
    EXPECT_EQ(load->Wait().ToString(), bad.ToString());
    // The chunk's bytes in the pool are what was there, or zeros: never
    // what the corrupt read brought.
    const auto got = image.subspan(chunk.offset, chunk.bytes);
    const bool clean = std::all_of(got.begin(), got.end(), [](std::byte x) {
      return x == kFill || x == std::byte{0};
    });
    EXPECT_TRUE(clean);
    // The other chunks of the shard are in place.
    for (size_t i = 0; i < a.manifest.chunks.size(); ++i) {
      if (i == victim) continue;
      const WeightsChunk& other = a.manifest.chunks[i];
      EXPECT_TRUE(std::equal(a.ChunkBytes(i).begin(), a.ChunkBytes(i).end(),
                             image.begin() + other.offset))
          << "chunk " << i;
    }
  }
}

// The plan of `shard` as an engine holds it before staging: no keys.
WeightsManifest PlanOf(const TestShard& shard) {
  WeightsManifest plan = shard.manifest;
  for (WeightsChunk& c : plan.chunks) c.key = PageHash{};
  return plan;
}

TEST_F(WeightsPoolTest, AShardStagedFromAMemfdImageIsSealedAndLoadsBack) {
  const TestShard a = ShardA();
  const TestShard b = ShardB();
  auto c = Connect();
  MemfdImage image(a.manifest.image_bytes);
  std::copy(a.image.begin(), a.image.end(), image.mutable_bytes().begin());
  ASSERT_OK(c->RegisterPool(image.Spec()));
  WeightsPutStats stats;
  auto sealed = c->PutWeightsFromPool(PlanOf(a), &stats);
  ASSERT_OK(sealed);
  EXPECT_EQ(*sealed, a.manifest);  // every key is the hash of its bytes
  EXPECT_EQ(stats.chunks_stored, a.manifest.chunks.size());
  EXPECT_EQ(stats.bytes_stored, DistinctChunkBytes({&a}));
  EXPECT_EQ(stats.chunks_deduplicated, 0u);
  // Again: every chunk is held, nothing is copied, the same version.
  sealed = c->PutWeightsFromPool(PlanOf(a), &stats);
  ASSERT_OK(sealed);
  EXPECT_EQ(stats.chunks_stored, 0u);
  EXPECT_EQ(stats.chunks_deduplicated, a.manifest.chunks.size());
  // B's plan does not fit this pool: refused, naming the chunk.
  auto too_big = c->PutWeightsFromPool(PlanOf(b));
  EXPECT_EQ(too_big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.status().message().find("image pool"), std::string::npos)
      << too_big.status().ToString();

  // Another engine loads it into its own pool.
  auto c2 = Connect();
  MemfdImage other(a.manifest.image_bytes);
  ASSERT_OK(c2->RegisterPool(other.Spec()));
  ASSERT_NO_FATAL_FAILURE(LoadAll(*c2, a));
  EXPECT_TRUE(HoldsShard(other.bytes(), a));
}

TEST_F(WeightsPoolTest, AShardStagedFromADeviceImageIsDurable) {
  const TestShard b = ShardB();
  {
    auto c = Connect();
    DeviceImage image(b.manifest.image_bytes);
    std::copy(b.image.begin(), b.image.end(), image.bytes().begin());
    auto spec = image.Spec();
    ASSERT_OK(spec);
    ASSERT_OK(c->RegisterPool(*spec));
    WeightsPutStats stats;
    auto sealed = c->PutWeightsFromPool(PlanOf(b), &stats);
    ASSERT_OK(sealed);
    EXPECT_EQ(WeightsVersionOf(*sealed), b.version);
    EXPECT_EQ(stats.chunks_stored, b.manifest.chunks.size());
  }
  // Sealed means on NVMe: a crash right after loses nothing.
  ASSERT_NO_FATAL_FAILURE(Restart());
  auto c = Connect();
  DeviceImage image(b.manifest.image_bytes);
  auto spec = image.Spec();
  ASSERT_OK(spec);
  ASSERT_OK(c->RegisterPool(*spec));
  ASSERT_NO_FATAL_FAILURE(LoadAll(*c, b));
  EXPECT_TRUE(HoldsShard(image.bytes(), b));
  EXPECT_EQ(Stats(*c)["transfers"]["load_segments"]["nvme"],
            b.manifest.chunks.size());
}

TEST_F(WeightsPoolTest, LoadsThatCannotBeServedAreRefusedUpFront) {
  const TestShard a = ShardA();
  ASSERT_NO_FATAL_FAILURE(StoreSealed(a));
  auto c = Connect();
  // No image pool yet.
  auto load = c->LoadWeightsToPool(a.manifest);
  EXPECT_EQ(load.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(load.status().message().find("image pool"), std::string::npos)
      << load.status().ToString();
  EXPECT_EQ(c->PutWeightsFromPool(PlanOf(a)).status().code(),
            StatusCode::kInvalidArgument);

  // An image pool is one slot of layer 0, part 0.
  MemfdImage small(a.manifest.image_bytes - 1);
  PoolSpec two_slots = small.Spec();
  two_slots.slot_bytes /= 2;
  two_slots.slot_count = 2;
  EXPECT_EQ(c->RegisterPool(two_slots).code(), StatusCode::kInvalidArgument);
  PoolSpec layer_one = small.Spec();
  layer_one.layer = 1;
  EXPECT_EQ(c->RegisterPool(layer_one).code(), StatusCode::kInvalidArgument);

  // Too small for the shard's image.
  ASSERT_OK(c->RegisterPool(small.Spec()));
  load = c->LoadWeightsToPool(a.manifest);
  EXPECT_EQ(load.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(load.status().message().find("needs"), std::string::npos)
      << load.status().ToString();
  // One image pool per connection.
  MemfdImage big(a.manifest.image_bytes);
  EXPECT_EQ(c->RegisterPool(big.Spec()).code(), StatusCode::kInvalidArgument);

  auto c2 = Connect();
  ASSERT_OK(c2->RegisterPool(big.Spec()));
  // A version the daemon never sealed.
  TestShard other = ShardB();
  load = c2->LoadWeightsToPool(other.manifest);
  EXPECT_EQ(load.status().code(), StatusCode::kNotFound);
  // Layers outside the shard.
  load = c2->LoadWeightsToPool(a.manifest, LayerRange{2, 1});
  EXPECT_EQ(load.status().code(), StatusCode::kInvalidArgument);
  // A load into a host buffer has no device-side wait.
  std::vector<std::byte> buffer(a.manifest.image_bytes);
  auto host = c2->LoadWeights(a.manifest, buffer);
  ASSERT_OK(host);
  ASSERT_OK(host->Wait());
  const EngineStream stream{};
  EXPECT_EQ(host->StreamWaitLayer(0, stream).code(),
            StatusCode::kInvalidArgument);
  // Nothing of the above stopped the good load.
  ASSERT_NO_FATAL_FAILURE(LoadAll(*c2, a));
  EXPECT_TRUE(HoldsShard(big.bytes(), a));

  // A KV namespace takes no image pool and loads no weights.
  auto kv = Connect("kv");
  MemfdImage kv_image(a.manifest.image_bytes);
  EXPECT_EQ(kv->RegisterPool(kv_image.Spec()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(kv->LoadWeightsToPool(a.manifest).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(kv->PutWeightsFromPool(PlanOf(a)).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tierkv::testing
