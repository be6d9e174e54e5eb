// The whole daemon path on a real GPU: a real tierkvd with [hbm] backend =
// "cuda", and this process as the engine. Its KV tensors are blocks inside
// one cudaMalloc allocation, as PyTorch's caching allocator hands them out,
// registered by the allocation's IPC handle and their offset; Loads fill
// them from DRAM, NVMe and the daemon's HBM tier (device to device) while
// the engine's stream waits for each layer on the device, and a Store
// ordered after the engine's stream saves what its copies wrote. An engine
// process killed with device pools registered leaves the daemon serving.
// Skips without a device; the GPU check fails on a skip
// (TIERKV_REQUIRE_GPU=1). Needs TIERKV_BIN_DIR (tierkvd), as ctest and the
// bundle's runner set it.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "storage/device/device_backend.h"
#include "tests/client/client_test_util.h"
#include "tests/gpu/spawn_self.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace tierkv::testing {
namespace {

using storage::DeviceBackend;
using storage::DeviceBackendKind;
constexpr char kToken[] = "gpu-daemon-path-token";
constexpr char kChildEnv[] = "TIERKV_GPU_TEST_ENGINE_SOCKET";
constexpr uint32_t kSlots = 8;
constexpr uint64_t kGap = 4096;  // between tensors, checked untouched

LayoutSpec Layout() { return IndexShareLayout(4, 2); }

// The engine's KV tensors: one per (layer, part), kGap apart inside one
// cudaMalloc allocation filled with 0xee, each exported as the
// allocation's handle and its offset.
class EngineTensors {
 public:
  explicit EngineTensors(DeviceBackend& backend) : backend_(backend) {
    const LayoutSpec layout = Layout();
    uint64_t at = kGap;
    for (uint16_t l = 0; l < layout.num_layers(); ++l) {
      for (uint8_t p = 0; p < layout.layers[l].parts.size(); ++p) {
        const uint64_t seg = layout.SegmentBytes(l, p);
        tensors_[{l, p}] = {at, seg};
        at += (seg * kSlots + kGap + 255) / 256 * 256;
      }
    }
    bytes_ = at;
    EXPECT_EQ(cudaMalloc(&base_, bytes_), cudaSuccess);
    EXPECT_EQ(cudaMemset(base_, 0xee, bytes_), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  ~EngineTensors() { cudaFree(base_); }

  Status RegisterAll(Client& c) {
    for (const auto& [k, t] : tensors_) {
      auto range =
          backend_.ExportRange(Address(k.first, k.second, 0), t.seg * kSlots);
      if (!range.ok()) return range.status();
      PoolSpec spec{.kind = PoolSpec::Kind::kDeviceIpc,
                    .device_handle = range->handle.bytes,
                    .device_pool_bytes = range->handle.pool_bytes,
                    .device_uuid = range->device_uuid,
                    .offset = range->offset,
                    .slot_bytes = t.seg,
                    .slot_count = kSlots,
                    .layer = k.first,
                    .part = k.second};
      TIERKV_RETURN_IF_ERROR(c.RegisterPool(spec));
    }
    return Status::OK();
  }
  std::byte* Address(uint16_t l, uint8_t p, uint32_t slot) const {
    const Tensor& t = tensors_.at({l, p});
    return static_cast<std::byte*>(base_) + t.offset + slot * t.seg;
  }
  uint64_t SlotBytes(uint16_t l, uint8_t p) const {
    return tensors_.at({l, p}).seg;
  }
  // The whole allocation, copied back after `stream`'s work.
  std::vector<std::byte> Snapshot(cudaStream_t stream) const {
    std::vector<std::byte> out(bytes_);
    EXPECT_EQ(cudaMemcpyAsync(out.data(), base_, bytes_, cudaMemcpyDeviceToHost,
                              stream),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    return out;
  }
  std::span<const std::byte> SlotIn(const std::vector<std::byte>& snapshot,
                                    uint16_t l, uint8_t p,
                                    uint32_t slot) const {
    const Tensor& t = tensors_.at({l, p});
    return std::span(snapshot).subspan(t.offset + slot * t.seg, t.seg);
  }
  // Every byte outside the tensors' slots still 0xee.
  ::testing::AssertionResult GapsUntouched(
      const std::vector<std::byte>& snapshot) const {
    std::vector<bool> inside(bytes_, false);
    for (const auto& [k, t] : tensors_) {
      std::fill_n(inside.begin() + t.offset, t.seg * kSlots, true);
    }
    for (uint64_t i = 0; i < bytes_; ++i) {
      if (!inside[i] && snapshot[i] != std::byte{0xee}) {
        return ::testing::AssertionFailure()
               << "byte " << i << " outside every tensor was written";
      }
    }
    return ::testing::AssertionSuccess();
  }

 private:
  struct Tensor {
    uint64_t offset = 0;
    uint64_t seg = 0;
  };
  DeviceBackend& backend_;
  void* base_ = nullptr;
  uint64_t bytes_ = 0;
  std::map<std::pair<uint16_t, uint8_t>, Tensor> tensors_;
};

class GpuDaemonPathTest : public ::testing::Test {
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
    daemon_ = std::make_unique<DaemonProcess>();
    ASSERT_OK(daemon_->Start(
        {.config_toml = fmt::format("[hbm]\nbackend = \"cuda\"\n"
                                    "capacity_bytes = \"64MiB\"\n"
                                    "[nvme]\npath = \"{}/nvme.data\"\n"
                                    "capacity_bytes = \"64MiB\"\n"
                                    "[[namespace]]\nname = \"default\"\n"
                                    "token = \"{}\"\nhost_bytes = \"4MiB\"\n"
                                    "shards = 1\nwrite_policy = \"none\"\n",
                                    dir_.path().string(), kToken)}));
    ASSERT_NE(daemon_->log().find("cuda"), std::string::npos) << daemon_->log();
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  std::unique_ptr<Client> Open() {
    auto c = daemon_->Connect("default", kToken);
    EXPECT_OK(c);
    if (!c.ok()) return nullptr;
    EXPECT_OK((*c)->RegisterLayout(Layout()));
    return std::move(c).value();
  }
  nlohmann::json Transfers(Client& c) {
    auto s = c.StatsJson();
    EXPECT_OK(s);
    return nlohmann::json::parse(s.ok() ? *s : "{}")["transfers"];
  }
  // Loads `pages` into `slots` with the engine's stream waiting for every
  // layer on the device, then checks each slot and the gaps from a copy
  // queued behind those waits.
  void LoadAndCheck(Client& c, EngineTensors& tensors,
                    const std::vector<PageHash>& pages,
                    const std::vector<uint32_t>& slots) {
    auto load = c.Load(pages, slots);
    ASSERT_OK(load);
    const EngineStream engine{.handle = stream_};
    for (uint16_t l = 0; l < Layout().num_layers(); ++l) {
      ASSERT_OK(load->StreamWaitLayer(l, engine));
    }
    const auto snapshot = tensors.Snapshot(stream_);
    auto statuses = load->Wait();
    ASSERT_OK(statuses);
    for (const Status& s : *statuses) ASSERT_OK(s);
    for (size_t i = 0; i < pages.size(); ++i) {
      for (const SegmentKey& k : LayoutKeys(Layout(), pages[i])) {
        const auto got = tensors.SlotIn(snapshot, k.layer, k.part, slots[i]);
        const auto want = SegmentBytes(k, got.size());
        ASSERT_TRUE(std::equal(got.begin(), got.end(), want.begin()))
            << k.ToString();
      }
    }
    EXPECT_TRUE(tensors.GapsUntouched(snapshot));
  }

  TempDir dir_{"/var/tmp"};  // O_DIRECT needs a disk-backed file
  std::unique_ptr<DeviceBackend> engine_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(GpuDaemonPathTest, EngineTensorsMoveThroughEveryTier) {
  auto c = Open();
  ASSERT_NE(c, nullptr);
  const auto pages = Pages(4);
  for (const PutResult& r : PutLayoutPages(*c, Layout(), pages)) ASSERT_OK(r);
  std::vector<SegmentKey> first;
  for (const auto& page : pages) {
    for (const auto& k : LayoutKeys(Layout(), page)) first.push_back(k);
  }
  for (const Status& s : c->Flush(first)) ASSERT_OK(s);
  const auto recent = Pages(40, 100000);  // 4 MiB of DRAM: evicts pages 0-3
  for (const PutResult& r : PutLayoutPages(*c, Layout(), recent)) {
    ASSERT_OK(r);
  }
  EngineTensors tensors(*engine_);
  ASSERT_OK(tensors.RegisterAll(*c));

  // NVMe-only and DRAM pages, scrambled slots.
  const std::vector<PageHash> want = {pages[0], recent[39], pages[1],
                                      recent[38]};
  LoadAndCheck(*c, tensors, want, {6, 0, 3, 7});
  auto t = Transfers(*c);
  EXPECT_EQ(t["load_segments"]["nvme"], 12) << t.dump();
  EXPECT_EQ(t["load_segments"]["host"], 12) << t.dump();
  // Again, into other slots: the daemon's HBM tier serves, device to device.
  LoadAndCheck(*c, tensors, want, {1, 2, 4, 5});
  t = Transfers(*c);
  EXPECT_GT(t["load_segments"]["hbm"].get<uint64_t>(), 0u) << t.dump();

  // A Store ordered after the engine's stream, whose copies write the
  // slots: the daemon saves what they wrote.
  const auto fresh = Pages(2, 50000);
  const std::vector<uint32_t> fresh_slots = {6, 7};
  std::vector<std::vector<std::byte>> sources;
  for (size_t i = 0; i < fresh.size(); ++i) {
    for (const SegmentKey& k : LayoutKeys(Layout(), fresh[i])) {
      sources.push_back(SegmentBytes(k, tensors.SlotBytes(k.layer, k.part)));
      ASSERT_EQ(
          cudaMemcpyAsync(tensors.Address(k.layer, k.part, fresh_slots[i]),
                          sources.back().data(), sources.back().size(),
                          cudaMemcpyHostToDevice, stream_),
          cudaSuccess);
    }
  }
  auto store = c->Store(fresh, fresh_slots, {}, {.handle = stream_});
  ASSERT_OK(store);
  auto stored = store->Wait();
  ASSERT_OK(stored);
  for (const Status& s : *stored) ASSERT_OK(s);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  for (const auto& page : fresh) {
    for (const SegmentKey& k : LayoutKeys(Layout(), page)) {
      std::vector<std::byte> got(tensors.SlotBytes(k.layer, k.part));
      SegmentRead r{k, got};
      ASSERT_OK(c->Get(std::span(&r, 1))[0]);
      EXPECT_EQ(got, SegmentBytes(k, got.size())) << k.ToString();
    }
  }
  EXPECT_EQ(Transfers(*c)["stream_gate"]["timeouts"], 0);
}

// Runs this binary again as an engine that registers its device pools
// with the daemon at `socket` and is SIGKILLed holding them; returns its
// exit status (128 + SIGKILL).
int RunDyingEngine(const std::string& socket) {
  return RunThisBinaryAs("GpuDyingEngineChild.RegistersAndDies",
                         fmt::format("{}={}", kChildEnv, socket));
}

// Only in the re-executed child (RunDyingEngine); skipped otherwise.
TEST(GpuDyingEngineChild, RegistersAndDies) {
  const char* socket = std::getenv(kChildEnv);
  if (socket == nullptr) GTEST_SKIP() << "runs only as a dying engine";
  auto b = DeviceBackend::Open({.kind = DeviceBackendKind::kCuda});
  ASSERT_OK(b);
  auto c = Client::Connect({.socket_path = socket});
  ASSERT_OK(c);
  ASSERT_OK((*c)->OpenNamespace("default", kToken));
  ASSERT_OK((*c)->RegisterLayout(Layout()));
  EngineTensors tensors(**b);
  ASSERT_OK(tensors.RegisterAll(**c));
  auto load = (*c)->Load(Pages(2), std::vector<uint32_t>{0, 1});
  ASSERT_OK(load);
  ::kill(::getpid(), SIGKILL);  // mid-Load, pools registered
}

TEST_F(GpuDaemonPathTest, AnEngineKilledWithDevicePoolsLeavesTheDaemonServing) {
  auto c = Open();
  ASSERT_NE(c, nullptr);
  const auto pages = Pages(2);
  for (const PutResult& r : PutLayoutPages(*c, Layout(), pages)) ASSERT_OK(r);
  ASSERT_EQ(RunDyingEngine(daemon_->socket_path()), 128 + SIGKILL);
  ASSERT_OK(c->Ping().status());
  EngineTensors tensors(*engine_);
  ASSERT_OK(tensors.RegisterAll(*c));
  LoadAndCheck(*c, tensors, pages, {2, 3});
}

}  // namespace
}  // namespace tierkv::testing
