// Engines' device pools (PoolSpec::kDeviceIpc) through a real tierkvd with
// an [hbm] section, on the emulated device backend (the same API path as
// CUDA IPC): the engine process allocates and exports its pools, the daemon
// imports them, Load fills their slots from DRAM and NVMe and Store copies
// them out; what the engine then reads from its own device pools is what
// was stored. Bad handles and sizes are refused, and an engine killed with
// device pools registered leaves the daemon serving.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "storage/device/device_backend.h"
#include "tests/client/client_test_util.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/sync_points.h"
#include "tests/testing/temp_dir.h"

namespace tierkv::testing {
namespace {

using storage::DeviceBackend;
using storage::DeviceBackendKind;
constexpr std::chrono::milliseconds kTimeout{10000};
constexpr char kToken[] = "device-pool-token";

// 4 layers of bf16 latent KV; index keys on layers 0 and 2.
LayoutSpec DeviceLayout() { return IndexShareLayout(4, 2); }

// The engine's KV pools in (emulated) device memory: one allocation per
// (layer, part), exported for the daemon.
class DevicePools {
 public:
  // On emulated GPU `device` (its UUID goes with every pool).
  DevicePools(const LayoutSpec& layout, uint32_t slots, int device = 0)
      : slots_(slots) {
    auto b = DeviceBackend::Open(
        {.kind = DeviceBackendKind::kEmulated, .device = device});
    EXPECT_OK(b);
    backend_ = std::move(b).value();
    for (uint16_t l = 0; l < layout.num_layers(); ++l) {
      for (uint8_t p = 0; p < layout.layers[l].parts.size(); ++p) {
        const uint64_t seg = layout.SegmentBytes(l, p);
        auto pool = backend_->AllocatePool(seg * slots);
        EXPECT_OK(pool);
        pools_[{l, p}] = {pool->id, seg};
      }
    }
  }
  Status RegisterAll(Client& c) {
    for (auto& [k, pool] : pools_) {
      auto handle = backend_->ExportPool(pool.id);
      if (!handle.ok()) return handle.status();
      TIERKV_RETURN_IF_ERROR(
          c.RegisterPool({.kind = PoolSpec::Kind::kDeviceIpc,
                          .device_handle = handle->bytes,
                          .device_pool_bytes = handle->pool_bytes,
                          .device_uuid = backend_->uuid(),
                          .slot_bytes = pool.slot_bytes,
                          .slot_count = slots_,
                          .layer = k.first,
                          .part = k.second}));
    }
    return Status::OK();
  }
  // The slot's bytes, copied back from the device.
  std::vector<std::byte> Read(uint16_t l, uint8_t p, uint32_t slot) {
    const Pool& pool = pools_.at({l, p});
    std::vector<std::byte> out(pool.slot_bytes);
    EXPECT_OK(backend_->CopyToHost(
        0, out, {pool.id, slot * pool.slot_bytes, pool.slot_bytes}));
    Sync();
    return out;
  }
  void Write(uint16_t l, uint8_t p, uint32_t slot,
             std::span<const std::byte> bytes) {
    const Pool& pool = pools_.at({l, p});
    EXPECT_OK(backend_->CopyToDevice(
        0, {pool.id, slot * pool.slot_bytes, pool.slot_bytes}, bytes));
    Sync();
  }
  DeviceBackend& backend() { return *backend_; }
  // The slot's bytes in place: the emulated device's memory is host memory
  // (what the engine's kernels read and write in these tests).
  std::span<std::byte> Slot(uint16_t l, uint8_t p, uint32_t slot) {
    const Pool& pool = pools_.at({l, p});
    auto base = backend_->PoolBase(pool.id);
    EXPECT_OK(base);
    if (!base.ok()) return {};
    return {*base + slot * pool.slot_bytes, pool.slot_bytes};
  }
  uint32_t pool_id(uint16_t l, uint8_t p) const { return pools_.at({l, p}).id; }

 private:
  struct Pool {
    uint32_t id = 0;
    uint64_t slot_bytes = 0;
  };
  void Sync() {
    auto e = backend_->RecordEvent(0);
    EXPECT_OK(e);
    if (e.ok()) EXPECT_OK(backend_->WaitEvent(*e, kTimeout));
  }
  uint32_t slots_;
  std::unique_ptr<DeviceBackend> backend_;
  std::map<std::pair<uint16_t, uint8_t>, Pool> pools_;
};

class DevicePoolTest : public ::testing::Test {
 protected:
  // `hbm_device`: the [hbm] device line's value ("" for the default).
  void Start(bool hbm = true, std::string_view hbm_device = "") {
    daemon_ = std::make_unique<DaemonProcess>();
    std::string toml = fmt::format(
        "[nvme]\npath = \"{}/nvme.data\"\ncapacity_bytes = \"64MiB\"\n",
        dir_.path().string());
    if (hbm) {
      toml += "[hbm]\nbackend = \"emulated\"\ncapacity_bytes = \"16MiB\"\n";
      if (!hbm_device.empty()) toml += fmt::format("device = {}\n", hbm_device);
      toml += hbm_extra_;
    }
    toml += fmt::format(
        "[[namespace]]\nname = \"default\"\ntoken = \"{}\"\nhost_bytes = "
        "\"4MiB\"\nshards = 1\nwrite_policy = \"none\"\n",
        kToken);
    toml += namespace_extra_;
    ASSERT_OK(daemon_->Start({.config_toml = toml, .env = env_}));
  }
  std::unique_ptr<Client> Open() {
    auto c = daemon_->Connect("default", kToken);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return nullptr;
    EXPECT_OK((*c)->RegisterLayout(DeviceLayout()));
    return std::move(c).value();
  }
  std::vector<SegmentKey> Keys(const PageHash& page) {
    return LayoutKeys(DeviceLayout(), page);
  }
  void PutAll(Client& c, const std::vector<PageHash>& pages) {
    for (const PutResult& r : PutLayoutPages(c, DeviceLayout(), pages)) {
      ASSERT_OK(r);
    }
  }
  nlohmann::json Stats(Client& c) {
    auto s = c.StatsJson();
    EXPECT_TRUE(s.ok());
    return nlohmann::json::parse(s.ok() ? *s : "{}");
  }

  TempDir dir_{"/var/tmp"};  // O_DIRECT needs a disk-backed file
  std::vector<std::pair<std::string, std::string>> env_;  // the daemon's
  std::string namespace_extra_;  // more keys of the namespace's table
  std::string hbm_extra_;        // more [hbm] lines
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(DevicePoolTest, LoadFillsTheEnginesDevicePoolsFromDramAndNvme) {
  // Block-aligned arena extents: promotions into DRAM move in place too, so
  // any bounced NVMe read below would be one of the Load's.
  namespace_extra_ = "host_alignment = 4096\n";
  hbm_extra_ = "staging_bytes = \"32MiB\"\n";  // default 256 MiB
  Start();
  auto c = Open();
  const auto pages = Pages(4);
  PutAll(*c, pages);
  std::vector<SegmentKey> first;
  for (const auto& page : pages) {
    for (const auto& k : Keys(page)) first.push_back(k);
  }
  for (const Status& s : c->Flush(first)) ASSERT_OK(s);
  const auto recent = Pages(40, 100000);  // 4 MiB of DRAM: evicts pages 0-3
  PutAll(*c, recent);
  DevicePools pools(DeviceLayout(), 8);
  ASSERT_OK(pools.RegisterAll(*c));

  // NVMe-only pages 0 and 1, host pages (the newest two), scrambled slots.
  const std::vector<PageHash> want = {pages[0], recent[39], pages[1],
                                      recent[38]};
  const std::vector<uint32_t> slots = {6, 0, 3, 7};
  auto load = c->Load(want, slots);
  ASSERT_OK(load);
  for (uint16_t l = 0; l < 4; ++l) {
    auto statuses = load->WaitLayer(l);
    ASSERT_OK(statuses);
    for (size_t i = 0; i < statuses->size(); ++i) {
      EXPECT_TRUE((*statuses)[i].ok()) << "layer " << l << " page " << i << ": "
                                       << (*statuses)[i].ToString();
    }
    // Layer l is on the device once WaitLayer(l) returns.
    for (size_t i = 0; i < want.size(); ++i) {
      for (uint8_t p = 0; p < (l % 2 == 0 ? 2 : 1); ++p) {
        const SegmentKey k{want[i], l, p};
        const auto got = pools.Read(l, p, slots[i]);
        EXPECT_EQ(got, SegmentBytes(k, got.size())) << k.ToString();
      }
    }
  }
  auto st = Stats(*c)["transfers"];
  EXPECT_EQ(st["load_segments"]["nvme"], 12) << st.dump();
  EXPECT_EQ(st["load_segments"]["host"], 12) << st.dump();
  EXPECT_EQ(st["registered_pools"], 6);
  // The NVMe pages went through the pinned staging arena, and came back.
  const auto staging = Stats(*c)["device"]["staging"];
  EXPECT_EQ(staging["capacity_bytes"], 32 << 20) << staging.dump();
  EXPECT_GT(staging["pinned_borrows"].get<uint64_t>(), 0u) << staging.dump();
  EXPECT_EQ(staging["heap_borrows"], 0) << staging.dump();
  EXPECT_EQ(staging["in_use_bytes"], 0) << staging.dump();
  // Straight into the staging: each read has a block-aligned place with
  // room for whole blocks, the 8,448 B index_k segments too (and the
  // prefetch that promotes the pages into DRAM reads in place as well).
  const auto nvme = Stats(*c)["nvme"];
  EXPECT_EQ(nvme["bounced_reads"], 0) << nvme.dump();

  // A page stored nowhere: NotFound, its device slot untouched.
  const std::vector<std::byte> before = pools.Read(1, 0, 1);
  auto miss = c->Load(Pages(1, 900000), std::vector<uint32_t>{1});
  ASSERT_OK(miss);
  auto all = miss->Wait();
  ASSERT_OK(all);
  EXPECT_EQ((*all)[0].code(), StatusCode::kNotFound);
  EXPECT_EQ(pools.Read(1, 0, 1), before);
}

// An engine whose KV tensors are blocks inside one larger allocation, as
// PyTorch's caching allocator hands them out: each tensor is exported as
// that allocation's handle plus its offset (DeviceBackend::ExportRange),
// registered with PoolSpec::offset, and a Load writes exactly its slots:
// the bytes around every tensor stay as they were.
TEST_F(DevicePoolTest, InteriorTensorsAreRegisteredByAllocationAndOffset) {
  Start();
  auto c = Open();
  const auto pages = Pages(3);
  PutAll(*c, pages);
  const LayoutSpec layout = DeviceLayout();
  constexpr uint32_t kSlots = 4;
  constexpr uint64_t kGap = 768;  // between tensors: must stay untouched
  auto b = DeviceBackend::Open({.kind = DeviceBackendKind::kEmulated});
  ASSERT_OK(b);
  DeviceBackend& device = **b;
  struct Tensor {
    uint16_t layer;
    uint8_t part;
    uint64_t at;  // offset in the allocation
    uint64_t slot_bytes;
  };
  std::vector<Tensor> tensors;
  uint64_t end = kGap;
  for (uint16_t l = 0; l < layout.num_layers(); ++l) {
    for (uint8_t p = 0; p < layout.layers[l].parts.size(); ++p) {
      const uint64_t seg = layout.SegmentBytes(l, p);
      tensors.push_back({l, p, end, seg});
      end += seg * kSlots + kGap;
    }
  }
  auto segment = device.AllocatePool(end);
  ASSERT_OK(segment);
  std::vector<std::byte> before(end);
  for (size_t i = 0; i < end; ++i) before[i] = std::byte(i * 7 + 1);
  auto base = device.PoolBase(segment->id);
  ASSERT_OK(base);
  std::memcpy(*base, before.data(), end);  // emulated: host addressable
  for (const Tensor& t : tensors) {
    auto range = device.ExportRange(*base + t.at, t.slot_bytes * kSlots);
    ASSERT_OK(range);
    EXPECT_EQ(range->offset, t.at);
    EXPECT_EQ(range->handle.pool_bytes, end);  // the whole allocation
    ASSERT_OK(c->RegisterPool({.kind = PoolSpec::Kind::kDeviceIpc,
                               .device_handle = range->handle.bytes,
                               .device_pool_bytes = range->handle.pool_bytes,
                               .offset = range->offset,
                               .slot_bytes = t.slot_bytes,
                               .slot_count = kSlots,
                               .layer = t.layer,
                               .part = t.part}));
  }
  // Past the allocation, or outside any: refused by the exporter.
  EXPECT_EQ(device.ExportRange(*base + end - 8, 16).status().code(),
            StatusCode::kInvalidArgument);
  std::vector<std::byte> elsewhere(64);
  EXPECT_EQ(device.ExportRange(elsewhere.data(), 64).status().code(),
            StatusCode::kInvalidArgument);

  const std::vector<uint32_t> slots = {2, 0, 3};
  {
    auto load = c->Load(pages, slots);
    ASSERT_OK(load);
    auto all = load->Wait();
    ASSERT_OK(all);
    for (const Status& s : *all) ASSERT_OK(s);
  }
  std::vector<std::byte> expected = before;
  for (const Tensor& t : tensors) {
    for (size_t i = 0; i < pages.size(); ++i) {
      const auto bytes =
          SegmentBytes({pages[i], t.layer, t.part}, t.slot_bytes);
      std::memcpy(expected.data() + t.at + slots[i] * t.slot_bytes,
                  bytes.data(), bytes.size());
    }
  }
  EXPECT_EQ(std::memcmp(*base, expected.data(), end), 0)
      << "a slot is wrong, or bytes outside the tensors' slots changed";
  c.reset();  // the daemon closes its imports before the pool goes
  ASSERT_OK(device.FreePool(segment->id));
}

// The fd path (memory without a legacy IPC handle: cudaMallocAsync pools,
// PyTorch's expandable segments): each tensor inside one allocation goes
// as a descriptor of that allocation plus its offset; the Load lands in
// the slots. The daemon's mapping holds the allocation: after the engine
// frees it, the daemon still serves, and a Load into the freed pool
// writes the daemon's own reference to it, never a fault.
TEST_F(DevicePoolTest, AllocationsExportedAsDescriptorsOutliveTheirExporter) {
  Start();
  auto c = Open();
  const auto pages = Pages(2);
  PutAll(*c, pages);
  const LayoutSpec layout = DeviceLayout();
  constexpr uint32_t kSlots = 2;
  auto b = DeviceBackend::Open({.kind = DeviceBackendKind::kEmulated});
  ASSERT_OK(b);
  DeviceBackend& device = **b;
  uint64_t end = 512;  // the first tensor starts inside the allocation
  std::vector<std::pair<SegmentKey, uint64_t>> at;  // (layer, part) -> offset
  for (uint16_t l = 0; l < layout.num_layers(); ++l) {
    for (uint8_t p = 0; p < layout.layers[l].parts.size(); ++p) {
      at.push_back({{PageHash{}, l, p}, end});
      end += layout.SegmentBytes(l, p) * kSlots;
    }
  }
  auto segment = device.AllocatePool(end);
  ASSERT_OK(segment);
  auto base = device.PoolBase(segment->id);
  ASSERT_OK(base);
  for (const auto& [key, offset] : at) {
    const uint64_t seg = layout.SegmentBytes(key.layer, key.part);
    auto exported = device.ExportRangeFd(*base + offset, seg * kSlots);
    ASSERT_OK(exported);
    EXPECT_EQ(exported->offset, offset);
    EXPECT_EQ(exported->pool_bytes, end);
    const Status registered =
        c->RegisterPool({.kind = PoolSpec::Kind::kDeviceFd,
                         .fd = exported->fd,
                         .device_pool_bytes = exported->pool_bytes,
                         .offset = exported->offset,
                         .slot_bytes = seg,
                         .slot_count = kSlots,
                         .layer = key.layer,
                         .part = key.part});
    ::close(exported->fd);  // the daemon holds its own
    ASSERT_OK(registered);
  }
  const std::vector<uint32_t> slots = {1, 0};
  {
    auto load = c->Load(pages, slots);
    ASSERT_OK(load);
    auto all = load->Wait();
    ASSERT_OK(all);
    for (const Status& s : *all) ASSERT_OK(s);
  }
  for (const auto& [key, offset] : at) {
    const uint64_t seg = layout.SegmentBytes(key.layer, key.part);
    for (size_t i = 0; i < pages.size(); ++i) {
      const auto want = SegmentBytes({pages[i], key.layer, key.part}, seg);
      EXPECT_EQ(std::memcmp(*base + offset + slots[i] * seg, want.data(), seg),
                0)
          << "layer " << key.layer << " part " << int(key.part);
    }
  }
  // A size larger than the allocation is refused by the daemon.
  {
    auto exported = device.ExportRangeFd(*base + 512, 64);
    ASSERT_OK(exported);
    const Status too_big =
        c->RegisterPool({.kind = PoolSpec::Kind::kDeviceFd,
                         .fd = exported->fd,
                         .device_pool_bytes = end * 2,
                         .offset = 0,
                         .slot_bytes = layout.SegmentBytes(0, 0),
                         .slot_count = kSlots,
                         .layer = 0,
                         .part = 0});
    ::close(exported->fd);
    EXPECT_EQ(too_big.code(), StatusCode::kInvalidArgument)
        << too_big.ToString();
  }
  // The engine frees the allocation while it stays registered: the
  // daemon's mapping keeps the memory, so a Load still completes.
  ASSERT_OK(device.FreePool(segment->id));
  {
    auto load = c->Load(pages, slots);
    ASSERT_OK(load);
    auto all = load->Wait();
    ASSERT_OK(all);
    for (const Status& s : *all) EXPECT_OK(s);
  }
  // The daemon serves on: a new engine finds the pages.
  auto fresh = Open();
  ASSERT_NE(fresh, nullptr);
  auto m = fresh->Match(pages);
  ASSERT_OK(m);
  EXPECT_EQ(m->leading_pages, pages.size());
}

// One tierkvd serves the engines of every GPU of the node (TP ranks, one
// per GPU): a pool on another GPU than the [hbm] device is imported there
// and served from DRAM and NVMe (the HBM tier copies on its own GPU only),
// and GPUs are named by UUID, which CUDA_VISIBLE_DEVICES cannot renumber.
TEST_F(DevicePoolTest, PoolsOnEveryGpuAreServedAndMatchedByUuid) {
  Start();  // [hbm] device 0
  const auto pages = Pages(2);
  const std::vector<uint32_t> slots = {3, 1};
  auto load_twice = [&](Client& c, DevicePools& pools) {
    for (int round = 0; round < 2; ++round) {
      auto load = c.Load(pages, slots);
      ASSERT_OK(load);
      auto all = load->Wait();
      ASSERT_OK(all);
      for (const Status& s : *all) ASSERT_OK(s);
      for (size_t i = 0; i < pages.size(); ++i) {
        for (const SegmentKey& k : Keys(pages[i])) {
          const auto got = pools.Read(k.layer, k.part, slots[i]);
          ASSERT_EQ(got, SegmentBytes(k, got.size())) << k.ToString();
        }
      }
    }
  };
  auto on_1 = Open();
  PutAll(*on_1, pages);
  DevicePools pools_1(DeviceLayout(), 4, /*device=*/1);
  ASSERT_OK(pools_1.RegisterAll(*on_1));
  load_twice(*on_1, pools_1);
  auto st = Stats(*on_1)["transfers"];
  EXPECT_EQ(st["load_segments"]["host"], 2 * 12) << st.dump();
  EXPECT_EQ(st["load_segments"]["hbm"], 0) << st.dump();
  EXPECT_NE(daemon_->log().find("GPU-eeeeeeee-eeee-eeee-eeee-eeeeeeee0001"),
            std::string::npos)
      << daemon_->log();
  // The [hbm] device's own engine gets the HBM tier.
  auto on_0 = Open();
  DevicePools pools_0(DeviceLayout(), 4, /*device=*/0);
  ASSERT_OK(pools_0.RegisterAll(*on_0));
  load_twice(*on_0, pools_0);
  st = Stats(*on_0)["transfers"];
  EXPECT_EQ(st["load_segments"]["hbm"], 12) << st.dump();

  // A GPU this machine does not have: refused, by name.
  PoolSpec elsewhere{.kind = PoolSpec::Kind::kDeviceIpc,
                     .device_pool_bytes = 1 << 20,
                     .slot_bytes = DeviceLayout().SegmentBytes(0, 0),
                     .slot_count = 4};
  auto uuid =
      storage::ParseDeviceUuid("GPU-12345678-9abc-def0-1234-56789abcdef0");
  ASSERT_OK(uuid);
  elsewhere.device_uuid = *uuid;
  auto on_none = Open();
  const Status refused = on_none->RegisterPool(elsewhere);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("GPU-12345678-9abc-def0-1234-56789abcdef0"),
            std::string::npos)
      << refused.ToString();

  // [hbm] device by UUID: that GPU's engine then gets the HBM tier.
  on_1.reset();
  on_0.reset();
  on_none.reset();
  daemon_.reset();
  Start(true, "\"GPU-eeeeeeee-eeee-eeee-eeee-eeeeeeee0001\"");
  auto again = Open();
  PutAll(*again, pages);
  DevicePools pools_1b(DeviceLayout(), 4, /*device=*/1);
  ASSERT_OK(pools_1b.RegisterAll(*again));
  load_twice(*again, pools_1b);
  st = Stats(*again)["transfers"];
  EXPECT_EQ(st["load_segments"]["hbm"], 12) << st.dump();
}

// Stream interop across processes: the engine's kernels (host functions on
// its emulated stream here) wait for a Load's layers on the device
// (StreamWaitLayer), never on the host; a Store ordered after the engine's
// stream (`after`) saves what the engine's still-queued kernels write, not
// what the slots held when it was issued.
TEST_F(DevicePoolTest, TransfersAreOrderedWithTheEnginesStream) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  constexpr uint16_t kStalled = 2;  // of 4 layers
  StallFifo fifo(dir_.path().string() + "/stall.fifo");
  env_ = {{"TIERKV_TEST_STALL_LAYER",
           std::to_string(kStalled) + ":" + fifo.path()}};
  Start();
  auto c = Open();
  const auto pages = Pages(4);
  PutAll(*c, pages);
  DevicePools pools(DeviceLayout(), 8);
  ASSERT_OK(pools.RegisterAll(*c));
  const EngineStream engine{.handle = &pools.backend(), .emulated_stream = 1};

  // The engine's layer l kernel reads slot 5 (page 0) once layer l is in.
  const std::vector<uint32_t> slots = {5, 1, 2, 3};
  auto load = c->Load(pages, slots);
  ASSERT_OK(load);
  std::vector<std::vector<std::byte>> seen(4);
  std::vector<storage::DeviceEvent> after_layer;
  for (uint16_t l = 0; l < 4; ++l) {
    ASSERT_OK(load->StreamWaitLayer(l, engine));
    ASSERT_OK(pools.backend().LaunchHostFunction(1, [&seen, &pools, l] {
      auto slot = pools.Slot(l, 0, 5);
      seen[l].assign(slot.begin(), slot.end());
    }));
    auto e = pools.backend().RecordEvent(1);
    ASSERT_OK(e);
    after_layer.push_back(*e);
  }
  // Layers before the daemon's stalled one reach the engine's kernels;
  // the stalled one holds them, though no host thread waits for it.
  ASSERT_OK(pools.backend().WaitEvent(after_layer[kStalled - 1], kTimeout));
  EXPECT_FALSE(pools.backend().EventDone(after_layer[kStalled]));
  EXPECT_TRUE(seen[kStalled].empty());
  fifo.Release();
  ASSERT_OK(pools.backend().WaitEvent(after_layer[3], kTimeout));
  for (uint16_t l = 0; l < 4; ++l) {
    const SegmentKey k{pages[0], l, 0};
    EXPECT_EQ(seen[l], SegmentBytes(k, seen[l].size())) << k.ToString();
  }
  auto loaded = load->Wait();
  ASSERT_OK(loaded);
  for (const Status& s : *loaded) EXPECT_OK(s);

  // A Store ordered after the engine's stream, whose kernel writing the
  // slots is still held: the daemon waits for it (no host thread does).
  const auto fresh = Pages(2, 50000);
  const std::vector<uint32_t> fresh_slots = {6, 7};
  for (uint16_t l = 0; l < 4; ++l) {
    for (uint8_t p = 0; p < (l % 2 == 0 ? 2 : 1); ++p) {
      for (uint32_t slot : fresh_slots) {
        auto bytes = pools.Slot(l, p, slot);
        std::fill(bytes.begin(), bytes.end(), std::byte{0x5a});
      }
    }
  }
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  ASSERT_OK(pools.backend().LaunchHostFunction(1, [&] {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return go; });
    for (uint16_t l = 0; l < 4; ++l) {
      for (uint8_t p = 0; p < (l % 2 == 0 ? 2 : 1); ++p) {
        for (size_t i = 0; i < fresh.size(); ++i) {
          auto slot = pools.Slot(l, p, fresh_slots[i]);
          const auto want = SegmentBytes({fresh[i], l, p}, slot.size());
          std::copy(want.begin(), want.end(), slot.begin());
        }
      }
    }
  }));
  auto store = c->Store(fresh, fresh_slots, {}, engine);
  ASSERT_OK(store);
  // The daemon says it is waiting for the engine's stream.
  const auto deadline = std::chrono::steady_clock::now() + kTimeout;
  while (Stats(*c)["transfers"]["stream_gate"]["waiting"] != 1 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  ASSERT_EQ(Stats(*c)["transfers"]["stream_gate"]["waiting"], 1)
      << Stats(*c)["transfers"].dump();
  EXPECT_EQ(store->LayersDone(), 0);
  {
    std::lock_guard lock(mu);
    go = true;
  }
  cv.notify_all();
  auto stored = store->Wait();
  ASSERT_OK(stored);
  for (const Status& s : *stored) EXPECT_OK(s);
  for (size_t i = 0; i < fresh.size(); ++i) {
    for (const SegmentKey& k : Keys(fresh[i])) {
      std::vector<std::byte> got(DeviceLayout().SegmentBytes(k.layer, k.part));
      SegmentRead r{k, got};
      ASSERT_OK(c->Get(std::span(&r, 1))[0]);
      EXPECT_EQ(got, SegmentBytes(k, got.size())) << k.ToString();
    }
  }
  const auto gate = Stats(*c)["transfers"]["stream_gate"];
  EXPECT_EQ(gate["waits"], 1) << gate.dump();
  EXPECT_EQ(gate["waiting"], 0) << gate.dump();
  EXPECT_EQ(gate["timeouts"], 0) << gate.dump();
}

// A client that gives up on a Load (its timeout) lets the engine's stream
// go: nothing on the GPU waits for a daemon that may never answer, and the
// slot holds what it held.
TEST_F(DevicePoolTest, AClientThatGivesUpReleasesTheEnginesStream) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  StallFifo fifo(dir_.path().string() + "/stall.fifo");
  env_ = {{"TIERKV_TEST_STALL_LAYER", "1:" + fifo.path()}};
  Start();
  auto opened = Client::Connect({.socket_path = daemon_->socket_path(),
                                 .timeout = std::chrono::milliseconds(300)});
  ASSERT_OK(opened);
  Client& c = **opened;
  ASSERT_OK(c.OpenNamespace("default", kToken));
  ASSERT_OK(c.RegisterLayout(DeviceLayout()));
  const auto pages = Pages(2);
  PutAll(c, pages);
  DevicePools pools(DeviceLayout(), 4);
  ASSERT_OK(pools.RegisterAll(c));
  auto before = pools.Slot(1, 0, 2);
  std::fill(before.begin(), before.end(), std::byte{0xee});
  const EngineStream engine{.handle = &pools.backend(), .emulated_stream = 1};

  auto load = c.Load(pages, std::vector<uint32_t>{2, 3});
  ASSERT_OK(load);
  ASSERT_OK(load->StreamWaitLayer(1, engine));
  std::vector<std::byte> seen;
  ASSERT_OK(pools.backend().LaunchHostFunction(1, [&] {
    auto slot = pools.Slot(1, 0, 2);
    seen.assign(slot.begin(), slot.end());
  }));
  auto kernel = pools.backend().RecordEvent(1);
  ASSERT_OK(kernel);
  // The daemon is held before layer 1: the client's wait gives up...
  auto waited = load->WaitLayer(1);
  EXPECT_EQ(waited.status().code(), StatusCode::kIOError)
      << waited.status().ToString();
  // ... and the engine's stream goes on, the slot unwritten.
  ASSERT_OK(pools.backend().WaitEvent(*kernel, kTimeout));
  EXPECT_EQ(seen, std::vector<std::byte>(seen.size(), std::byte{0xee}));
  fifo.Release();
}

// A device fault in a real tierkvd (the emulated backend's fault drill):
// the Load's segments fail with Unavailable instead of IOError for ever,
// the HBM tier is off, the failure is logged once and exported
// (tierkv_device_up 0, `device` in the stats), and DRAM keeps serving.
TEST_F(DevicePoolTest, ADeviceFaultTurnsTheHbmTierOffLoudly) {
  hbm_extra_ = "emulated_fault_after_copies = 1\n";
  Start();
  EXPECT_NE(daemon_->log().find("FAULT DRILL"), std::string::npos)
      << daemon_->log();
  auto c = Open();
  const auto pages = Pages(2);
  PutAll(*c, pages);
  DevicePools pools(DeviceLayout(), 4);
  ASSERT_OK(pools.RegisterAll(*c));
  auto load = c->Load(pages, std::vector<uint32_t>{0, 1});
  ASSERT_OK(load);
  auto statuses = load->Wait();
  ASSERT_OK(statuses);
  for (const Status& s : *statuses) {
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  }
  const auto device = Stats(*c)["device"];
  EXPECT_EQ(device["failed"], true) << device.dump();
  EXPECT_NE(device["error"].get<std::string>().find("injected"),
            std::string::npos)
      << device.dump();
  auto text = HttpGet(daemon_->metrics_port(), "/metrics");
  ASSERT_OK(text);
  EXPECT_EQ(MetricValue(*text, "tierkv_device_up"), 0) << *text;
  // The next Load fails at once, and says so the same way.
  auto again = c->Load(pages, std::vector<uint32_t>{2, 3});
  ASSERT_OK(again);
  auto second = again->Wait();
  ASSERT_OK(second);
  EXPECT_EQ((*second)[0].code(), StatusCode::kUnavailable);
  // Host DRAM serves on, and the failure was logged once.
  EXPECT_TRUE(ReadsBackExact(*c, pages[0], DeviceLayout().SegmentBytes(0, 0)));
  const std::string log = daemon_->log();
  const std::string said = "the HBM tier is off";
  ASSERT_NE(log.find(said), std::string::npos) << log;
  EXPECT_EQ(log.find(said, log.find(said) + 1), std::string::npos) << log;
}

// A client naming GPU after GPU cannot make the daemon open device
// backends without end (the emulated backend names any number).
TEST_F(DevicePoolTest, DevicePoolsSpanABoundedNumberOfGpus) {
  Start();
  auto c = Open();
  PoolSpec spec{.kind = PoolSpec::Kind::kDeviceIpc,
                .device_pool_bytes = 1 << 20,
                .slot_bytes = DeviceLayout().SegmentBytes(0, 0),
                .slot_count = 4};
  Status last;
  int opened = 0;
  for (int gpu = 1; gpu <= 100; ++gpu) {
    spec.device_uuid = storage::EmulatedDeviceUuid(gpu);
    last = c->RegisterPool(spec);  // a handle of nothing: never imported
    ASSERT_FALSE(last.ok());
    if (last.code() == StatusCode::kResourceExhausted) break;
    ++opened;
  }
  EXPECT_EQ(last.code(), StatusCode::kResourceExhausted) << last.ToString();
  EXPECT_EQ(opened, 63);
  ASSERT_OK(c->Ping().status());
}

TEST_F(DevicePoolTest, ASecondLoadIsServedFromTheHbmTierAndMatchSaysSo) {
  Start();
  auto c = Open();
  const auto pages = Pages(2, 7000);
  PutAll(*c, pages);
  DevicePools pools(DeviceLayout(), 4);
  ASSERT_OK(pools.RegisterAll(*c));
  auto before = c->Match(pages);
  ASSERT_OK(before);
  EXPECT_EQ(before->tiers, (std::vector<Tier>{Tier::kHost, Tier::kHost}));
  auto first = c->Load(pages, std::vector<uint32_t>{0, 1});
  ASSERT_OK(first);
  ASSERT_OK(first->Wait());
  // The first Load copied the pages into HBM on its way to the pools.
  auto after = c->Match(pages);
  ASSERT_OK(after);
  EXPECT_EQ(after->leading_pages, 2u);
  EXPECT_EQ(after->tiers, (std::vector<Tier>{Tier::kHbm, Tier::kHbm}));
  auto second = c->Load(pages, std::vector<uint32_t>{2, 3});
  ASSERT_OK(second);
  auto statuses = second->Wait();
  ASSERT_OK(statuses);
  for (const Status& s : *statuses) EXPECT_OK(s);
  for (uint32_t i = 0; i < 2; ++i) {
    for (const auto& k : Keys(pages[i])) {
      const auto got = pools.Read(k.layer, k.part, 2 + i);
      EXPECT_EQ(got, SegmentBytes(k, got.size())) << k.ToString();
    }
  }
  auto st = Stats(*c);
  EXPECT_EQ(st["transfers"]["load_segments"]["host"], 12) << st.dump();
  EXPECT_EQ(st["transfers"]["load_segments"]["hbm"], 12) << st.dump();
  EXPECT_EQ(st["hbm"]["segments"], 12) << st.dump();
  EXPECT_EQ(st["hbm"]["hits"], 12) << st.dump();
  EXPECT_EQ(st["hbm"]["namespace"]["segments"], 12) << st.dump();
  EXPECT_EQ(st["lookup_tokens"]["hbm"], 2 * 64) << st.dump();
  // The arena the host copies come from is registered with the device.
  EXPECT_NE(daemon_->log().find("host DRAM pinned for the device"),
            std::string::npos)
      << daemon_->log();
  auto text = HttpGet(daemon_->metrics_port(), "/metrics");
  ASSERT_OK(text);
  for (const char* want :
       {"tierkv_tier_reads_total{tier=\"hbm\",result=\"hit\"} 12",
        "tierkv_tier_segments{tier=\"hbm\"} 12",
        "tierkv_namespace_segments{namespace=\"default\",tier=\"hbm\"} 12",
        "tierkv_transfer_segments_total{src=\"hbm\",dst=\"pool\"} 12",
        "tierkv_lookup_tokens_total{namespace=\"default\",tier=\"hbm\"} "
        "128"}) {
    EXPECT_NE(text->find(want), std::string::npos) << want;
  }
}

TEST_F(DevicePoolTest, StoreCopiesDeviceSlotsOutAndDedups) {
  Start();
  auto c = Open();
  DevicePools pools(DeviceLayout(), 4);
  ASSERT_OK(pools.RegisterAll(*c));
  const auto pages = Pages(3, 5000);
  const LayoutSpec layout = DeviceLayout();
  for (uint32_t i = 0; i < pages.size(); ++i) {
    for (const auto& k : Keys(pages[i])) {
      pools.Write(k.layer, k.part, i + 1,
                  SegmentBytes(k, layout.SegmentBytes(k.layer, k.part)));
    }
  }
  auto store = c->Store(pages, std::vector<uint32_t>{1, 2, 3});
  ASSERT_OK(store);
  auto stored = store->Wait();
  ASSERT_OK(stored);
  for (const Status& s : *stored) EXPECT_OK(s);
  // Read back through the buffer path: the bytes the device held.
  for (const auto& page : pages) {
    for (const auto& k : Keys(page)) {
      std::vector<std::byte> got(layout.SegmentBytes(k.layer, k.part));
      const SegmentRead read{k, got};
      ASSERT_OK(c->Get({&read, 1})[0]);
      EXPECT_EQ(got, SegmentBytes(k, got.size())) << k.ToString();
    }
  }
  auto again = c->Store(pages, std::vector<uint32_t>{1, 2, 3});
  ASSERT_OK(again);
  ASSERT_OK(again->Wait());
  auto st = Stats(*c)["transfers"];
  EXPECT_EQ(st["store_segments"], 18) << st.dump();
  EXPECT_EQ(st["store_dedup"], 18) << st.dump();
}

TEST_F(DevicePoolTest, BadDevicePoolsAreRefusedWithClearErrors) {
  Start();
  auto c = Open();
  DevicePools pools(DeviceLayout(), 4);
  auto handle = pools.backend().ExportPool(pools.pool_id(0, 0));
  ASSERT_OK(handle);
  PoolSpec spec{.kind = PoolSpec::Kind::kDeviceIpc,
                .device_handle = handle->bytes,
                .device_pool_bytes = handle->pool_bytes,
                .slot_bytes = DeviceLayout().SegmentBytes(0, 0),
                .slot_count = 4,
                .layer = 0,
                .part = 0};
  // More slots than the allocation holds.
  PoolSpec big = spec;
  big.slot_count = 5;
  Status s = c->RegisterPool(big);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("exceeds"), std::string_view::npos) << s.message();
  // A size that lies about the allocation.
  PoolSpec lying = spec;
  lying.device_pool_bytes *= 2;
  lying.slot_count = 8;
  EXPECT_EQ(c->RegisterPool(lying).code(), StatusCode::kInvalidArgument);
  // Garbage handle bytes.
  PoolSpec junk = spec;
  junk.device_handle.fill(std::byte{0x42});
  EXPECT_EQ(c->RegisterPool(junk).code(), StatusCode::kInvalidArgument);
  // The real one registers once; a second pool for (0, 0) is refused.
  ASSERT_OK(c->RegisterPool(spec));
  EXPECT_EQ(c->RegisterPool(spec).code(), StatusCode::kInvalidArgument);
  // A freed allocation cannot be registered.
  auto other = pools.backend().AllocatePool(handle->pool_bytes);
  ASSERT_OK(other);
  auto gone = pools.backend().ExportPool(other->id);
  ASSERT_OK(gone);
  ASSERT_OK(pools.backend().FreePool(other->id));
  PoolSpec freed = spec;
  freed.layer = 1;
  freed.device_handle = gone->bytes;
  EXPECT_EQ(c->RegisterPool(freed).code(), StatusCode::kNotFound);
  EXPECT_OK(c->Ping().status());
}

TEST_F(DevicePoolTest, WithoutAnHbmSectionDevicePoolsAreRefused) {
  Start(/*hbm=*/false);
  auto c = Open();
  DevicePools pools(DeviceLayout(), 2);
  Status s = pools.RegisterAll(*c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("[hbm]"), std::string_view::npos) << s.message();
}

TEST_F(DevicePoolTest, AnEngineKilledWithDevicePoolsLeavesTheDaemonServing) {
  Start();
  {
    auto c = Open();
    PutAll(*c, Pages(8));
  }
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto c = daemon_->Connect("default", kToken);
    if (!c.ok() || !(*c)->RegisterLayout(DeviceLayout()).ok()) ::_exit(2);
    DevicePools pools(DeviceLayout(), 8);
    if (!pools.RegisterAll(**c).ok()) ::_exit(3);
    std::vector<uint32_t> slots = {0, 1, 2, 3, 4, 5, 6, 7};
    auto load = (*c)->Load(Pages(8), slots);
    if (!load.ok()) ::_exit(4);
    ::raise(SIGKILL);  // mid-Load, holding its exported pools
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  auto c = Open();
  // The daemon notices the closed socket on its own schedule: ask until the
  // dead engine's pools are gone (each question is a round trip).
  nlohmann::json st;
  for (int i = 0; i < 20000; ++i) {
    st = Stats(*c);
    if (st["transfers"]["registered_pools"] == 0) break;
  }
  EXPECT_EQ(st["transfers"]["registered_pools"], 0) << st.dump();
  // It still serves a new engine's device pools.
  DevicePools pools(DeviceLayout(), 8);
  ASSERT_OK(pools.RegisterAll(*c));
  auto load = c->Load(Pages(1), std::vector<uint32_t>{5});
  ASSERT_OK(load);
  ASSERT_OK(load->Wait());
  const SegmentKey k{Pages(1)[0], 3, 0};
  EXPECT_EQ(pools.Read(3, 0, 5),
            SegmentBytes(k, DeviceLayout().SegmentBytes(3, 0)));
  EXPECT_EQ(daemon_->Stop(SIGTERM), 0) << "the daemon exits cleanly";
}

}  // namespace
}  // namespace tierkv::testing
