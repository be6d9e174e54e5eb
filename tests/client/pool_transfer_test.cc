// Registered pools and per-layer Load/Store through a real tierkvd: bytes
// land in the engine's own memfd slots from DRAM and from NVMe, bad pools
// and transfers are refused cleanly, WaitLayer(l) returns while a later
// layer is held (TIERKV_TEST_STALL_LAYER), and a client that dies mid-Load
// leaves the daemon with nothing of it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "tests/client/client_test_util.h"
#include "tests/client/engine_pools.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/sync_points.h"
#include "tests/testing/temp_dir.h"

namespace tierkv::testing {
namespace {

// GLM-5-shaped, shrunk: 6 layers of bf16 latent KV, indexer keys on the
// "full" layers 0 and 3 only (IndexShare).
LayoutSpec PoolLayout() { return IndexShareLayout(6, 3); }

class PoolTransferTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(data_dir_.empty()); }
  DaemonSpec Spec() const {
    return {.extra_args = {"--host-bytes", "8MiB", "--shards", "1",
                           "--nvme-path", data_dir_ + "/nvme.data",
                           "--nvme-bytes", "64MiB", "--write-policy", "none"}};
  }
  void Start(std::vector<std::pair<std::string, std::string>> env = {}) {
    daemon_ = std::make_unique<DaemonProcess>();
    DaemonSpec spec = Spec();
    spec.env = std::move(env);
    ASSERT_OK(daemon_->Start(spec));
  }
  std::unique_ptr<Client> Open() {
    auto c = daemon_->Connect();
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return nullptr;
    EXPECT_OK((*c)->RegisterLayout(PoolLayout()));
    return std::move(c).value();
  }
  std::vector<SegmentKey> Keys(const PageHash& page) {
    return LayoutKeys(PoolLayout(), page);
  }
  // Puts every segment of `pages` with Put (buffer mode).
  void PutAll(Client& c, const std::vector<PageHash>& pages) {
    for (const PutResult& r : PutLayoutPages(c, PoolLayout(), pages)) {
      ASSERT_OK(r);
    }
  }
  nlohmann::json Stats(Client& c) {
    auto s = c.StatsJson();
    EXPECT_TRUE(s.ok());
    return nlohmann::json::parse(s.ok() ? *s : "{}");
  }
  ::testing::AssertionResult SlotHolds(EnginePools& pools, const PageHash& page,
                                       uint32_t slot) {
    for (const auto& k : Keys(page)) {
      auto got = pools.Slot(k.layer, k.part, slot);
      if (std::vector<std::byte>(got.begin(), got.end()) !=
          SegmentBytes(k, got.size())) {
        return ::testing::AssertionFailure() << k.ToString() << " differs";
      }
    }
    return ::testing::AssertionSuccess();
  }

  // Disk-backed: the NVMe tier's data file needs O_DIRECT. Declared before
  // daemon_, so the daemon stops before the directory is removed.
  TempDir dir_{"/var/tmp"};
  const std::string data_dir_ = dir_.path().string();
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(PoolTransferTest, LoadYieldsStoredBytesFromHostNvmeAndMixedPages) {
  Start();
  auto c = Open();
  const auto pages = Pages(40);
  PutAll(*c, pages);  // ~18 pages fit in 8 MiB: the first ones are evicted
  std::vector<SegmentKey> first;
  for (int i = 0; i < 4; ++i) {
    for (const auto& k : Keys(pages[i])) first.push_back(k);
  }
  // Pages 0..3 must be durable before they leave DRAM: put them again
  // (promoting nothing), flush, then evict them with 30 new pages.
  PutAll(*c, {pages.begin(), pages.begin() + 4});
  for (const Status& s : c->Flush(first)) ASSERT_OK(s);
  const auto recent = Pages(30, 100000);
  PutAll(*c, recent);  // the last ~18 of these are in DRAM
  EnginePools pools(PoolLayout(), 8);
  ASSERT_OK(pools.RegisterAll(*c));

  // Mixed: NVMe-only pages 0, 1 and host pages 38, 39, in scrambled slots.
  const std::vector<PageHash> want = {pages[0], recent[29], pages[1],
                                      recent[28]};
  const std::vector<uint32_t> slots = {6, 0, 3, 7};
  auto load = c->Load(want, slots);
  ASSERT_OK(load);
  for (uint16_t l = 0; l < 6; ++l) {
    auto statuses = load->WaitLayer(l);
    ASSERT_OK(statuses);
    for (size_t i = 0; i < statuses->size(); ++i) {
      const Status& s = (*statuses)[i];
      EXPECT_TRUE(s.ok()) << "layer " << l << " page " << i << ": "
                          << s.ToString();
    }
  }
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(SlotHolds(pools, want[i], slots[i])) << i;
  }
  auto st = Stats(*c)["transfers"];
  EXPECT_EQ(st["load_segments"]["nvme"], 16) << st.dump();
  EXPECT_EQ(st["load_segments"]["host"], 16) << st.dump();
  EXPECT_EQ(st["registered_pools"], 8);

  // A page stored nowhere: NotFound per layer, its slot left as it was.
  const PageHash absent = Pages(1, 900000)[0];
  auto miss = c->Load(std::vector<PageHash>{absent}, std::vector<uint32_t>{1});
  ASSERT_OK(miss);
  auto all = miss->Wait();
  ASSERT_OK(all);
  EXPECT_EQ((*all)[0].code(), StatusCode::kNotFound);
  EXPECT_EQ(pools.Slot(2, 0, 1)[100], std::byte{0xee});
}

TEST_F(PoolTransferTest, WaitLayerReturnsWhileALaterLayerIsStalled) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  constexpr uint16_t kStalled = 3;  // of 6 layers
  StallFifo fifo(data_dir_ + "/stall.fifo");
  Start({{"TIERKV_TEST_STALL_LAYER",
          std::to_string(kStalled) + ":" + fifo.path()}});
  EXPECT_NE(daemon_->log().find("TEST-ONLY FAULT INJECTION"), std::string::npos)
      << daemon_->log();
  auto c = Open();
  const auto pages = Pages(8, 7000);
  PutAll(*c, pages);
  EnginePools pools(PoolLayout(), 8);
  ASSERT_OK(pools.RegisterAll(*c));
  const std::vector<uint32_t> slots = {7, 6, 5, 4, 3, 2, 1, 0};
  const auto issued = std::chrono::steady_clock::now();
  auto load = c->Load(pages, slots);
  ASSERT_OK(load);

  // Layers 0..2 are in place while the worker is held before layer 3.
  auto early = load->WaitLayer(kStalled - 1);
  ASSERT_OK(early);
  for (const Status& s : *early) EXPECT_OK(s);
  EXPECT_EQ(load->LayersDone(), kStalled);
  for (size_t i = 0; i < pages.size(); ++i) {
    for (const auto& k : Keys(pages[i])) {
      auto got = pools.Slot(k.layer, k.part, slots[i]);
      const std::vector<std::byte> bytes(got.begin(), got.end());
      if (k.layer < kStalled) {
        EXPECT_EQ(bytes, SegmentBytes(k, got.size())) << k.ToString();
      } else if (k.layer == kStalled) {
        EXPECT_EQ(bytes, std::vector<std::byte>(got.size(), std::byte{0xee}))
            << k.ToString() << " was written before its layer was released";
      }
      // Later layers may already have been moved by the daemon's second
      // transfer lane, but they are not reported done before layer 3.
    }
  }
  // The daemon still serves while one of its workers is held.
  ASSERT_OK(c->Ping().status());
  auto match = c->Match(pages);
  ASSERT_OK(match);
  EXPECT_EQ(match->leading_pages, pages.size());
  EXPECT_EQ(load->LayersDone(), kStalled);
  EXPECT_FALSE(load->times()) << "stamped before its last layer";

  const auto released = std::chrono::steady_clock::now();
  fifo.Release();
  auto last = load->WaitLayer(5);
  ASSERT_OK(last);
  for (const Status& s : *last) EXPECT_OK(s);
  EXPECT_EQ(load->LayersDone(), 6);
  // The daemon's stamps, on this process's clock: accepted after the call,
  // layer 0 before the stall was released, the last layer after.
  auto times = load->times();
  ASSERT_TRUE(times);
  EXPECT_LE(issued, times->accepted);
  EXPECT_LE(times->accepted, times->first_layer);
  EXPECT_LT(times->first_layer, released);
  EXPECT_LT(released, times->last_layer);
  EXPECT_LE(times->last_layer, std::chrono::steady_clock::now());
  for (size_t i = 0; i < pages.size(); ++i) {
    EXPECT_TRUE(SlotHolds(pools, pages[i], slots[i])) << i;
  }
  EXPECT_NE(daemon_->log().find("released layer 3"), std::string::npos)
      << daemon_->log();
  // The stall is one-shot: the next Load runs straight through.
  auto again =
      c->Load(pages, std::vector<uint32_t>(slots.rbegin(), slots.rend()));
  ASSERT_OK(again);
  ASSERT_OK(again->Wait());
  EXPECT_EQ(again->LayersDone(), 6);
  EXPECT_TRUE(SlotHolds(pools, pages[0], 0));
}

TEST_F(PoolTransferTest, InvalidStallSettingIsAStartupError) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  const std::string not_fifo = data_dir_ + "/plain";
  std::ofstream(not_fifo) << "x";
  for (const std::string& value : std::vector<std::string>{
           "three:" + not_fifo, "3", "3:", "70000:" + not_fifo, "3:" + not_fifo,
           "3:" + data_dir_ + "/missing"}) {
    DaemonProcess d;
    DaemonSpec spec = Spec();
    spec.env = {{"TIERKV_TEST_STALL_LAYER", value}};
    const Status s = d.Start(spec);
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << value;
    EXPECT_NE(s.message().find("TIERKV_TEST_STALL_LAYER='" + value + "'"),
              std::string_view::npos)
        << s.ToString();
  }
}

TEST_F(PoolTransferTest, StoreThenLoadRoundTripsAndDedups) {
  Start();
  auto c = Open();
  EnginePools pools(PoolLayout(), 4);
  ASSERT_OK(pools.RegisterAll(*c));
  const auto pages = Pages(2, 5000);
  for (uint32_t i = 0; i < 2; ++i) {
    for (const auto& k : Keys(pages[i])) {
      auto slot = pools.Slot(k.layer, k.part, i);
      const auto bytes = SegmentBytes(k, slot.size());
      std::memcpy(slot.data(), bytes.data(), slot.size());
    }
  }
  const std::vector<uint32_t> slots = {0, 1};
  auto store = c->Store(pages, slots);
  ASSERT_OK(store);
  auto saved = store->Wait();
  ASSERT_OK(saved);
  for (const Status& s : *saved) EXPECT_OK(s);
  auto again = c->Store(pages, slots);
  ASSERT_OK(again);
  ASSERT_OK(again->Wait());
  auto match = c->Match(pages);
  ASSERT_OK(match);
  EXPECT_EQ(match->leading_pages, 2u);
  auto st = Stats(*c)["transfers"];
  EXPECT_EQ(st["store_segments"], 16);
  EXPECT_EQ(st["store_dedup"], 16);
  // Back into other slots.
  auto load = c->Load(pages, std::vector<uint32_t>{3, 2});
  ASSERT_OK(load);
  ASSERT_OK(load->Wait());
  EXPECT_TRUE(SlotHolds(pools, pages[0], 3));
  EXPECT_TRUE(SlotHolds(pools, pages[1], 2));
}

// The /metrics series of one scrape, read by their full names.
class Scrape {
 public:
  explicit Scrape(const DaemonProcess& d) {
    auto text = HttpGet(d.metrics_port(), "/metrics");
    EXPECT_TRUE(text.ok()) << text.status().ToString();
    if (text.ok()) text_ = *text;
  }
  double operator[](const std::string& series) const {
    const double v = MetricValue(text_, series);
    EXPECT_GE(v, 0) << series << " missing from\n" << text_;
    return v;
  }

 private:
  std::string text_;
};

constexpr const char* kPoolToHost =
    R"(tierkv_transfer_bytes_total{src="pool",dst="host"})";
constexpr const char* kHostToPool =
    R"(tierkv_transfer_bytes_total{src="host",dst="pool"})";
constexpr const char* kHostToNvme =
    R"(tierkv_transfer_bytes_total{src="host",dst="nvme"})";
constexpr const char* kLoadSeconds =
    R"(tierkv_transfer_seconds_count{op="load"})";
constexpr const char* kStoreSeconds =
    R"(tierkv_transfer_seconds_count{op="store"})";
constexpr const char* kLayerWaits =
    R"(tierkv_layer_wait_seconds_count{namespace="default"})";

TEST_F(PoolTransferTest, TransfersAreCountedInMetricsByRouteAndTime) {
  Start();
  auto c = Open();
  EnginePools pools(PoolLayout(), 4);
  ASSERT_OK(pools.RegisterAll(*c));
  const LayoutSpec layout = PoolLayout();
  const auto pages = Pages(2, 7000);
  uint64_t page_bytes = 0;
  for (const auto& k : Keys(pages[0])) {
    page_bytes += layout.SegmentBytes(k.layer, k.part);
  }
  for (uint32_t i = 0; i < 2; ++i) {
    for (const auto& k : Keys(pages[i])) {
      auto slot = pools.Slot(k.layer, k.part, i);
      const auto bytes = SegmentBytes(k, slot.size());
      std::memcpy(slot.data(), bytes.data(), slot.size());
    }
  }
  const Scrape before(*daemon_);
  EXPECT_EQ(before[kLayerWaits], 0);
  EXPECT_EQ(before["tierkv_worker_queue_depth"], 0);
  EXPECT_EQ(before["tierkv_worker_rejections_total"], 0);

  auto store = c->Store(pages, std::vector<uint32_t>{0, 1});
  ASSERT_OK(store);
  ASSERT_OK(store->Wait());  // one wait, reported with the next request
  std::vector<SegmentKey> keys = Keys(pages[0]);
  for (const auto& k : Keys(pages[1])) keys.push_back(k);
  for (const Status& s : c->Flush(keys)) ASSERT_OK(s);
  const Scrape stored(*daemon_);
  EXPECT_EQ(stored[kPoolToHost] - before[kPoolToHost], 2 * page_bytes);
  EXPECT_EQ(
      stored[R"(tierkv_transfer_segments_total{src="pool",dst="host"})"] -
          before[R"(tierkv_transfer_segments_total{src="pool",dst="host"})"],
      16);
  EXPECT_EQ(stored[kHostToNvme] - before[kHostToNvme], 2 * page_bytes);
  EXPECT_EQ(stored[kStoreSeconds] - before[kStoreSeconds], 1);
  EXPECT_EQ(stored[R"(tierkv_transfers_total{op="store"})"] -
                before[R"(tierkv_transfers_total{op="store"})"],
            1);
  EXPECT_EQ(stored[kLayerWaits], 0);  // not reported yet

  auto load = c->Load(pages, std::vector<uint32_t>{3, 2});
  ASSERT_OK(load);
  for (uint16_t l = 0; l < layout.num_layers(); ++l) {
    ASSERT_OK(load->WaitLayer(l));
  }
  const Scrape loaded(*daemon_);
  EXPECT_EQ(loaded[kHostToPool] - stored[kHostToPool], 2 * page_bytes);
  EXPECT_EQ(
      loaded[R"(tierkv_transfer_segments_total{src="host",dst="pool"})"] -
          stored[R"(tierkv_transfer_segments_total{src="host",dst="pool"})"],
      16);
  EXPECT_EQ(loaded[kLoadSeconds] - stored[kLoadSeconds], 1);
  EXPECT_EQ(loaded[kPoolToHost], stored[kPoolToHost]);
  EXPECT_EQ(loaded[kLayerWaits], 1);  // the Store's Wait came with the Load
  EXPECT_TRUE(SlotHolds(pools, pages[0], 3));

  // The six WaitLayer calls travel with the next Load, its Wait with the
  // Prefetch after it.
  auto again = c->Load(pages, std::vector<uint32_t>{1, 0});
  ASSERT_OK(again);
  const Scrape reported(*daemon_);
  EXPECT_EQ(reported[kLayerWaits], 1 + layout.num_layers());
  ASSERT_OK(again->Wait());
  ASSERT_OK(c->Prefetch(pages));
  const Scrape prefetched(*daemon_);
  EXPECT_EQ(prefetched[kLayerWaits], 2 + layout.num_layers());
  EXPECT_EQ(prefetched[R"(tierkv_transfers_total{op="prefetch"})"] -
                before[R"(tierkv_transfers_total{op="prefetch"})"],
            1);
  EXPECT_EQ(prefetched[kLoadSeconds] - before[kLoadSeconds], 2);
  EXPECT_GT(prefetched[R"(tierkv_transfer_seconds_sum{op="load"})"], 0);

  // `tierkv stats` reads the same counters.
  auto st = Stats(*c)["transfers"];
  EXPECT_EQ(st["loads"], 2) << st.dump();
  EXPECT_EQ(st["stores"], 1);
  EXPECT_EQ(st["prefetches"], 1);
  EXPECT_EQ(st["load_bytes"]["host"], 4 * page_bytes);
  EXPECT_EQ(st["written_to_nvme"]["bytes"], 2 * page_bytes);
  EXPECT_EQ(st["load_seconds"]["count"], 2);
  EXPECT_EQ(st["layer_waits"]["count"], 2 + layout.num_layers());
}

TEST_F(PoolTransferTest, BadPoolsAndTransfersGetClearErrorsAndChangeNothing) {
  Start();
  auto c = Open();
  const uint64_t seg = PoolLayout().SegmentBytes(0, 0);
  auto memfd = [](uint64_t bytes) {
    int fd = ::memfd_create("bad", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
    return fd;
  };
  const int small = memfd(seg * 2);
  Status s = c->RegisterPool(
      {.fd = small, .slot_bytes = seg, .slot_count = 4, .layer = 0});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("spec needs"), std::string_view::npos)
      << s.ToString();
  const int readonly = memfd(seg * 4);
  ASSERT_EQ(::fcntl(readonly, F_ADD_SEALS, F_SEAL_FUTURE_WRITE), 0);
  s = c->RegisterPool(
      {.fd = readonly, .slot_bytes = seg, .slot_count = 4, .layer = 0});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("read-only"), std::string_view::npos)
      << s.ToString();
  EXPECT_EQ(
      c->RegisterPool(
           {.fd = small, .slot_bytes = seg - 1, .slot_count = 1, .layer = 0})
          .code(),
      StatusCode::kInvalidArgument);
  ::close(small);
  ::close(readonly);
  EXPECT_EQ(Stats(*c)["transfers"]["registered_pools"], 0);

  EnginePools pools(PoolLayout(), 4);
  const auto pages = Pages(1);
  PutAll(*c, pages);
  // Before any pool: the Load names unregistered pools.
  s = c->Load(pages, std::vector<uint32_t>{0}).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no registered pool"), std::string_view::npos)
      << s.ToString();
  ASSERT_OK(pools.RegisterAll(*c));
  s = c->Load(pages, std::vector<uint32_t>{4}).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "slot out of range";
  EXPECT_EQ(pools.Slot(0, 0, 0)[0], std::byte{0xee});
  EXPECT_EQ(Stats(*c)["transfers"]["calls"], 0);
  // The connection still works.
  auto ok = c->Load(pages, std::vector<uint32_t>{0});
  ASSERT_OK(ok);
  ASSERT_OK(ok->Wait());
  EXPECT_TRUE(SlotHolds(pools, pages[0], 0));
}

TEST_F(PoolTransferTest, ClientKilledMidLoadLeavesNoPoolsOrLeases) {
  Start();
  {
    auto c = Open();
    PutAll(*c, Pages(16));
  }
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto c = daemon_->Connect();
    if (!c.ok() || !(*c)->RegisterLayout(PoolLayout()).ok()) ::_exit(2);
    EnginePools pools(PoolLayout(), 16);
    if (!pools.RegisterAll(**c).ok()) ::_exit(3);
    const auto pages = Pages(16);
    std::vector<uint32_t> slots(16);
    for (uint32_t i = 0; i < 16; ++i) slots[i] = i;
    for (int round = 0; round < 8; ++round) {
      auto load = (*c)->Load(pages, slots);
      if (!load.ok()) ::_exit(4);
      if (round == 7) ::_exit(0);  // mid-Load, handles never waited for
      (void)load->Wait();
    }
    ::_exit(5);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  auto c = Open();
  // The daemon notices the closed socket on its own schedule: ask until the
  // dead client's pools are gone (each question is a round trip).
  nlohmann::json st;
  for (int i = 0; i < 20000; ++i) {
    st = Stats(*c);
    if (st["transfers"]["registered_pools"] == 0) break;
  }
  EXPECT_EQ(st["transfers"]["registered_pools"], 0) << st.dump();
  EXPECT_EQ(st["active_leases"], 0);
  EXPECT_OK(c->Ping().status());
  EXPECT_EQ(daemon_->Stop(SIGTERM), 0) << "the daemon exits cleanly";
}

}  // namespace
}  // namespace tierkv::testing
