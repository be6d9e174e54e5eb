// Weights shards through a real tierkvd ([hbm] backend = "cuda") into and
// out of an engine's weights buffer in GPU memory (issue 28): the buffer is
// a block inside one cudaMalloc allocation, registered by the allocation's
// IPC handle and its offset as the connection's image pool. A shard the
// engine wrote there is staged and sealed by the daemon
// (PutWeightsFromPool), then loaded back from DRAM and, after a SIGKILL,
// from NVMe (LoadWeightsToPool) while the engine's stream waits for each
// layer on the device; bytes outside the image are never written.
// Skips without a device; the GPU check fails on a skip
// (TIERKV_REQUIRE_GPU=1). Needs TIERKV_BIN_DIR (tierkvd).
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "storage/device/device_backend.h"
#include "tests/client/test_shards.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace tierkv::testing {
namespace {

using storage::DeviceBackend;
using storage::DeviceBackendKind;
constexpr char kToken[] = "gpu-weights-token";
constexpr uint64_t kGap = 4096;  // before and after the image, untouched

class GpuWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = DeviceBackend::Open({.kind = DeviceBackendKind::kCuda});
    if (!b.ok()) {
      if (std::getenv("TIERKV_REQUIRE_GPU") != nullptr) {
        FAIL() << "no CUDA backend: " << b.status().ToString();
      }
      GTEST_SKIP() << "no CUDA device here: " << b.status().ToString();
    }
    engine_ = std::move(b).value();
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
              cudaSuccess);
    ASSERT_NO_FATAL_FAILURE(Start());
  }
  void TearDown() override {
    if (base_ != nullptr) cudaFree(base_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  void Start() {
    daemon_ = std::make_unique<DaemonProcess>();
    ASSERT_OK(daemon_->Start(
        {.config_toml = fmt::format("[hbm]\nbackend = \"cuda\"\n"
                                    "capacity_bytes = \"64MiB\"\n"
                                    "[nvme]\npath = \"{}/nvme.data\"\n"
                                    "capacity_bytes = \"512MiB\"\n"
                                    "[[namespace]]\nname = \"w\"\n"
                                    "token = \"{}\"\nhost_bytes = \"256MiB\"\n"
                                    "shards = 2\nweights = true\n",
                                    dir_.path().string(), kToken)}));
  }
  // The engine's weights buffer: `image_bytes` at kGap inside one
  // allocation filled with 0xee, registered as the image pool of `c`.
  void RegisterImage(Client& c, uint64_t image_bytes) {
    if (base_ == nullptr) {
      bytes_ = image_bytes + 2 * kGap;
      ASSERT_EQ(cudaMalloc(&base_, bytes_), cudaSuccess);
    }
    ASSERT_EQ(cudaMemset(base_, 0xee, bytes_), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto range = engine_->ExportRange(Image(), image_bytes);
    ASSERT_OK(range);
    ASSERT_OK(c.RegisterPool({.kind = PoolSpec::Kind::kDeviceIpc,
                              .device_handle = range->handle.bytes,
                              .device_pool_bytes = range->handle.pool_bytes,
                              .device_uuid = range->device_uuid,
                              .offset = range->offset,
                              .slot_bytes = image_bytes,
                              .slot_count = 1}));
  }
  std::byte* Image() const { return static_cast<std::byte*>(base_) + kGap; }
  // The whole allocation, copied back after `stream_`'s work.
  std::vector<std::byte> Snapshot() const {
    std::vector<std::byte> out(bytes_);
    EXPECT_EQ(cudaMemcpyAsync(out.data(), base_, bytes_, cudaMemcpyDeviceToHost,
                              stream_),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    return out;
  }
  // Loads every layer of `shard` with the engine's stream waiting for each
  // on the device, then checks every chunk and the gaps from a copy queued
  // behind those waits.
  void LoadAndCheck(Client& c, const TestShard& shard) {
    auto load = c.LoadWeightsToPool(shard.manifest);
    ASSERT_OK(load);
    const EngineStream engine{.handle = stream_};
    for (uint32_t l = 0; l < shard.manifest.num_layers; ++l) {
      ASSERT_OK(load->StreamWaitLayer(l, engine));
    }
    const std::vector<std::byte> snapshot = Snapshot();
    ASSERT_OK(load->Wait());
    for (size_t i = 0; i < shard.manifest.chunks.size(); ++i) {
      const WeightsChunk& chunk = shard.manifest.chunks[i];
      const auto want = shard.ChunkBytes(i);
      ASSERT_TRUE(std::equal(want.begin(), want.end(),
                             snapshot.begin() + kGap + chunk.offset))
          << "chunk " << i;
    }
    for (uint64_t i = 0; i < kGap; ++i) {
      ASSERT_EQ(snapshot[i], std::byte{0xee}) << "before the image: " << i;
      ASSERT_EQ(snapshot[bytes_ - 1 - i], std::byte{0xee}) << "after: " << i;
    }
  }
  nlohmann::json Transfers(Client& c) {
    auto s = c.StatsJson();
    EXPECT_OK(s);
    return nlohmann::json::parse(s.ok() ? *s : "{}")["transfers"];
  }

  TempDir dir_{"/var/tmp"};  // O_DIRECT needs a disk-backed file
  std::unique_ptr<DeviceBackend> engine_;
  cudaStream_t stream_ = nullptr;
  void* base_ = nullptr;
  uint64_t bytes_ = 0;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(GpuWeightsTest, AShardMovesOutOfAndBackIntoACudaImage) {
  const TestShard a = ShardA();
  {
    auto c = daemon_->Connect("w", kToken);
    ASSERT_OK(c);
    ASSERT_NO_FATAL_FAILURE(RegisterImage(**c, a.manifest.image_bytes));
    // The engine's weights, written by its own copies.
    ASSERT_EQ(cudaMemcpy(Image(), a.image.data(), a.image.size(),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    WeightsManifest plan = a.manifest;
    for (WeightsChunk& chunk : plan.chunks) chunk.key = PageHash{};
    WeightsPutStats stats;
    auto sealed = (*c)->PutWeightsFromPool(plan, &stats);
    ASSERT_OK(sealed);
    EXPECT_EQ(*sealed, a.manifest);
    EXPECT_EQ(stats.chunks_stored, a.manifest.chunks.size());

    // Warm: from DRAM into the (wiped) image.
    ASSERT_EQ(cudaMemset(base_, 0xee, bytes_), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_NO_FATAL_FAILURE(LoadAndCheck(**c, a));
    EXPECT_EQ(Transfers(**c)["load_segments"]["host"],
              a.manifest.chunks.size());
  }
  // Cold: sealed means durable; after a crash every chunk comes from NVMe
  // through the pinned staging.
  ASSERT_EQ(daemon_->Stop(SIGKILL), SIGKILL);
  ASSERT_NO_FATAL_FAILURE(Start());
  auto c = daemon_->Connect("w", kToken);
  ASSERT_OK(c);
  ASSERT_NO_FATAL_FAILURE(RegisterImage(**c, a.manifest.image_bytes));
  ASSERT_NO_FATAL_FAILURE(LoadAndCheck(**c, a));
  const nlohmann::json t = Transfers(**c);
  EXPECT_EQ(t["load_segments"]["nvme"], a.manifest.chunks.size()) << t.dump();
  EXPECT_EQ(t["load_segments"]["miss"], 0) << t.dump();
}

}  // namespace
}  // namespace tierkv::testing
