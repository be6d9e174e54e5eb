// The cache engine without a socket: matching across layers and parts,
// leases, dedup, promotion from a real NvmeStore (RocksDB catalog on a
// memory device) and batched Flush.
#include "storage/engine/cache_engine.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <future>
#include <map>
#include <mutex>

#include "common/load_ticket.h"
#include "storage/device/device_backend.h"
#include "storage/nvme/nvme_tier.h"
#include "tests/testing/manual_clock.h"
#include "tests/testing/memory_device.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/sync_points.h"
#include "tests/testing/temp_dir.h"

namespace tierkv::storage {
namespace {

using testing::MemoryDevice;
using testing::ScopedSyncPoints;

constexpr uint64_t kOwner = 7;

// 4 layers; layer 0 and 2 also carry an indexer key (IndexShare-like).
LayoutSpec TestLayout() {
  LayoutSpec l;
  l.page_tokens = 16;
  for (int i = 0; i < 4; ++i) {
    LayerSpec layer;
    layer.parts.push_back({"kv", 256});
    if (i % 2 == 0) layer.parts.push_back({"index_k", 33});
    l.layers.push_back(layer);
  }
  return l;
}

PageHash Page(uint64_t n) { return PageHash{n, n * 977 + 1}; }

// Holds every NVMe read in the tier's reader (NvmeTier::kBeforeRead) until
// LetGo() or the end of the object (a failed ASSERT included), which lets
// them go before its sync points are cleared.
class HeldNvmeReads {
 public:
  HeldNvmeReads() {
    sync_.SetCallback(NvmeTier::kBeforeRead, [this](void*) {
      std::unique_lock lock(mu_);
      ++held_;
      cv_.notify_all();
      cv_.wait(lock, [this] { return released_; });
    });
  }
  ~HeldNvmeReads() { LetGo(); }  // then sync_ ends, with no read held

  // Returns once a read is held.
  void WaitForOne() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return held_ > 0; });
  }
  void LetGo() {
    {
      std::lock_guard lock(mu_);
      released_ = true;
    }
    cv_.notify_all();
  }
  // Lets the reads go when a thread reaches sync point `point`.
  void LetGoAt(std::string_view point) {
    sync_.SetCallback(point, [this](void*) { LetGo(); });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int held_ = 0;
  bool released_ = false;
  ScopedSyncPoints sync_;  // declared last: cleared first, after LetGo
};

class CacheEngineTest : public ::testing::Test {
 protected:
  CacheEngineOptions engine_options_{.workers = 2};  // set before Open
  void Open(bool with_nvme, WritePolicy policy = WritePolicy::kNone,
            uint64_t host_bytes = 1 << 20) {
    if (with_nvme) {
      device_ = std::make_shared<MemoryDevice>(64 << 20);
      NvmeStoreOptions o;
      o.catalog_path = dir_.File("catalog");
      o.capacity_bytes = 64 << 20;
      o.device = device_;
      auto nvme = NvmeStore::Open(o);
      ASSERT_OK(nvme);
      nvme_ = std::move(nvme).value();
    }
    std::vector<NamespaceOptions> spaces;
    spaces.push_back(
        {.host = {.name = "ns", .capacity_bytes = host_bytes, .shards = 1},
         .write_policy = policy});
    auto engine =
        CacheEngine::Open(engine_options_, std::move(spaces), nvme_.get());
    ASSERT_OK(engine);
    engine_ = std::move(engine).value();
    ns_ = engine_->Find("ns");
    ASSERT_NE(ns_, nullptr);
    ASSERT_OK(engine_->RegisterLayout(*ns_, TestLayout()));
  }

  std::vector<std::byte> Bytes(const SegmentKey& k, uint64_t size) {
    std::vector<std::byte> b(size);
    for (size_t i = 0; i < size; ++i) {
      b[i] = static_cast<std::byte>(k.page.lo * 7 + k.layer * 3 + k.part + i);
    }
    return b;
  }

  // Stores every segment of page n as a client does: reserve, write into
  // the arena, commit.
  void PutPage(uint64_t n) {
    const LayoutSpec layout = TestLayout();
    std::vector<SegmentSize> items;
    for (uint16_t l = 0; l < layout.num_layers(); ++l) {
      for (uint8_t p = 0; p < layout.layers[l].parts.size(); ++p) {
        const SegmentKey k{Page(n), l, p};
        items.push_back({k, layout.SegmentBytes(l, p)});
      }
    }
    EngineReservation r = ReserveNow(items);
    std::vector<SegmentKey> keys;
    for (size_t i = 0; i < items.size(); ++i) {
      ASSERT_OK(r.items[i]);
      if (r.items[i]->already_stored) continue;
      auto bytes = Bytes(items[i].key, items[i].size);
      std::memcpy(ns_->host().arena().base() + r.items[i]->location.offset,
                  bytes.data(), bytes.size());
      keys.push_back(items[i].key);
    }
    for (const Status& s : engine_->Commit(kOwner, *ns_, r.lease_id, keys)) {
      ASSERT_OK(s);
    }
  }

  // Page 1 on NVMe only (flushed, then evicted by 200 other pages) and page
  // 0 in DRAM.
  void PutPage1OnNvmeOnlyAndPage0InDram() {
    PutPage(1);
    for (const Status& s : FlushNow(AllKeys(1))) ASSERT_OK(s);
    for (uint64_t n = 100; n < 300; ++n) PutPage(n);
    PutPage(0);
    engine_->TEST_DrainBackground();
    ASSERT_FALSE(ns_->host().Touch({Page(1), 0, 0}));
  }

  // Reserve, waiting for the callback (inline or from a worker).
  EngineReservation ReserveNow(std::vector<SegmentSize> items) {
    std::promise<EngineReservation> done;
    engine_->Reserve(kOwner, *ns_, std::move(items), [&](EngineReservation r) {
      done.set_value(std::move(r));
    });
    return done.get_future().get();
  }
  // Acquire, waiting for the callback (inline or from a worker).
  EngineRead AcquireNow(std::vector<SegmentKey> keys) {
    std::promise<EngineRead> done;
    engine_->Acquire(kOwner, *ns_, std::move(keys),
                     [&](EngineRead r) { done.set_value(std::move(r)); });
    return done.get_future().get();
  }
  std::vector<Status> FlushNow(std::vector<SegmentKey> keys) {
    std::promise<std::vector<Status>> done;
    engine_->Flush(*ns_, std::move(keys), [&](std::vector<Status> r) {
      done.set_value(std::move(r));
    });
    return done.get_future().get();
  }
  std::vector<SegmentKey> AllKeys(uint64_t n) {
    const LayoutSpec layout = TestLayout();
    std::vector<SegmentKey> keys;
    for (uint16_t l = 0; l < layout.num_layers(); ++l) {
      for (uint8_t p = 0; p < layout.layers[l].parts.size(); ++p) {
        keys.push_back({Page(n), l, p});
      }
    }
    return keys;
  }

  testing::TempDir dir_;
  std::shared_ptr<MemoryDevice> device_;
  std::unique_ptr<NvmeStore> nvme_;
  std::unique_ptr<CacheEngine> engine_;
  EngineNamespace* ns_ = nullptr;
};

TEST_F(CacheEngineTest, MatchCountsOnlyPagesWithEveryLayerAndPart) {
  Open(/*with_nvme=*/false);
  PutPage(0);
  PutPage(1);
  PutPage(3);
  // Page 2 lacks one indexer key: not a hit, and it ends the prefix.
  std::vector<SegmentSize> partial;
  for (const SegmentKey& k : AllKeys(2)) {
    if (k.layer == 2 && k.part == 1) continue;
    partial.push_back({k, TestLayout().SegmentBytes(k.layer, k.part)});
  }
  EngineReservation r = ReserveNow(partial);
  std::vector<SegmentKey> keys;
  for (const auto& item : partial) keys.push_back(item.key);
  for (const Status& s : engine_->Commit(kOwner, *ns_, r.lease_id, keys)) {
    ASSERT_OK(s);
  }
  const PageHash pages[] = {Page(0), Page(1), Page(2), Page(3)};
  auto m = engine_->Match(*ns_, pages);
  ASSERT_OK(m);
  EXPECT_EQ(m->leading_pages, 2u);
  EXPECT_EQ(m->tiers, (std::vector<tierkv::Tier>{
                          tierkv::Tier::kHost, tierkv::Tier::kHost,
                          tierkv::Tier::kMiss, tierkv::Tier::kHost}));
}

// The first layout registered sizes the host index for an arena full of its
// pages (HostTier::ReserveIndex, on a worker): the entries of a fresh
// arena's first pages then take no memory from the heap.
TEST_F(CacheEngineTest, RegisteringALayoutPopulatesTheHostIndex) {
  Open(/*with_nvme=*/false, WritePolicy::kNone, /*host_bytes=*/4 << 20);
  engine_->TEST_WaitWorkersIdle();
  const EngineStats before = engine_->Stats(*ns_);
  EXPECT_GT(before.host.index_populated_bytes, 0u);
  for (uint64_t n = 0; n < 100; ++n) PutPage(n);  // 600 segments
  const EngineStats after = engine_->Stats(*ns_);
  EXPECT_EQ(after.host.segments, 600u);
  EXPECT_EQ(after.host.index_heap_bytes, before.host.index_heap_bytes);
}

TEST_F(CacheEngineTest, DedupIsASuccessAndChecksTheLayout) {
  Open(/*with_nvme=*/false);
  PutPage(0);
  const uint64_t kv = TestLayout().SegmentBytes(0, 0);  // 16 tokens x 256 B
  const SegmentSize again[] = {{{Page(0), 0, 0}, kv},
                               {{Page(0), 1, 0}, kv - 1},
                               {{Page(0), 1, 1}, 16 * 33}};
  EngineReservation r = ReserveNow({std::begin(again), std::end(again)});
  ASSERT_OK(r.items[0]);
  EXPECT_TRUE(r.items[0]->already_stored);
  EXPECT_EQ(r.items[1].status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.items[2].status().code(), StatusCode::kInvalidArgument)
      << "layer 1 has no index_k part";
  EXPECT_EQ(r.lease_id, 0u) << "nothing was reserved";
}

TEST_F(CacheEngineTest, LeasesPinUntilReleasedOrTheOwnerLeaves) {
  Open(/*with_nvme=*/false);
  PutPage(0);
  EngineRead read = AcquireNow(AllKeys(0));
  ASSERT_NE(read.lease_id, 0u);
  for (const auto& item : read.items) ASSERT_OK(item);
  ASSERT_EQ(read.items.size(), 6u);  // layers 0 and 2 have two parts
  const std::vector<std::byte> want =
      Bytes({Page(0), 3, 0}, TestLayout().SegmentBytes(3, 0));
  EXPECT_EQ(std::memcmp(ns_->host().arena().base() + read.items[5]->offset,
                        want.data(), want.size()),
            0);
  EXPECT_EQ(ns_->host().Stats().referenced_segments, 6u);
  EXPECT_EQ(engine_->Release(kOwner + 1, read.lease_id).code(),
            StatusCode::kNotFound)
      << "not the owner's lease";
  auto pin = engine_->Pin(kOwner, *ns_, AllKeys(0), std::chrono::seconds(5));
  ASSERT_OK(pin);
  EXPECT_OK(engine_->Release(kOwner, read.lease_id));
  EXPECT_EQ(ns_->host().Stats().referenced_segments, 6u) << "still pinned";
  EXPECT_EQ(engine_->ReleaseOwner(kOwner), 1u);
  EXPECT_EQ(ns_->host().Stats().referenced_segments, 0u);
  EXPECT_EQ(engine_->Pin(kOwner, *ns_, AllKeys(0), std::chrono::hours(2))
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

Status StatusOf(const Status& s) { return s; }
template <typename T>
Status StatusOf(const Result<T>& r) {
  return r.status();
}

// One connection may lease at most half of a namespace's DRAM by default
// (leases.max_bytes_percent_per_connection): the items of a Get, Pin or
// Put past that are answered ResourceExhausted, and their references or
// reservations are dropped, so nothing stays pinned for them.
TEST_F(CacheEngineTest, LeasesPastHalfTheNamespaceAreRefusedPerItem) {
  Open(/*with_nvme=*/false);  // 1 MiB
  std::vector<SegmentKey> keys;
  for (uint64_t n = 0; n < 40; ++n) {  // 40 pages of 17,440 B: 67%
    PutPage(n);
    for (const SegmentKey& k : AllKeys(n)) keys.push_back(k);
  }
  // (admitted, refused for bytes) of a batch's per-item results.
  auto count = [](const auto& items) {
    size_t ok = 0, refused = 0;
    for (const auto& item : items) {
      const Status s = StatusOf(item);
      if (s.ok()) {
        ok++;
      } else if (s.code() == StatusCode::kResourceExhausted) {
        refused++;
        EXPECT_NE(
            s.message().find("leases.max_bytes_percent_per_connection 50"),
            std::string::npos)
            << s.ToString();
      }
    }
    return std::pair{ok, refused};
  };
  EngineRead read = AcquireNow(keys);
  const auto [read_ok, read_refused] = count(read.items);
  EXPECT_EQ(read_ok + read_refused, keys.size());
  EXPECT_GT(read_refused, 0u);
  // Admitted in request order: 30 whole pages (523,200 B) fit in 512 KiB,
  // then not the 31st's first 4096 B.
  EXPECT_EQ(read_ok, 30u * 6);
  EXPECT_TRUE(read.items[read_ok - 1].ok());
  EXPECT_FALSE(read.items[read_ok].ok());
  EXPECT_EQ(ns_->host().Stats().referenced_segments, read_ok);
  // Past the limit, a Pin gets nothing either.
  auto pin = engine_->Pin(kOwner, *ns_, AllKeys(39), std::chrono::seconds(5));
  ASSERT_OK(pin);
  EXPECT_EQ(count(pin->items).second, 6u);
  EXPECT_EQ(ns_->host().Stats().referenced_segments, read_ok);
  EXPECT_OK(engine_->Release(kOwner, read.lease_id));
  EXPECT_EQ(ns_->host().Stats().referenced_segments, 0u);
  // Reservations count too: of 140 new 4 KiB segments (evicting clean
  // pages for room), 128 are 512 KiB.
  std::vector<SegmentSize> items;
  for (uint64_t n = 100; n < 240; ++n) items.push_back({{Page(n), 1, 0}, 4096});
  EngineReservation r = ReserveNow(items);
  EXPECT_EQ(count(r.items), std::pair(size_t{128}, size_t{12}));
  EXPECT_EQ(ns_->host().Stats().reserved_bytes, 128u * 4096);
  EXPECT_EQ(engine_->ReleaseOwner(kOwner), 1u);
  EXPECT_EQ(ns_->host().Stats().reserved_bytes, 0u);
}

TEST_F(CacheEngineTest, NvmeOnlyPagesArePromotedOnAcquireWithOneReadBatch) {
  // 1 MiB of DRAM holds ~58 pages of 17 KiB; 200 more evict these.
  Open(/*with_nvme=*/true, WritePolicy::kNone, /*host_bytes=*/1 << 20);
  for (uint64_t n = 0; n < 4; ++n) PutPage(n);
  std::vector<SegmentKey> wanted;
  for (uint64_t n = 0; n < 4; ++n) {
    for (const auto& k : AllKeys(n)) wanted.push_back(k);
  }
  for (const Status& s : FlushNow(wanted)) ASSERT_OK(s);
  // Evict everything from DRAM with other pages.
  for (uint64_t n = 100; n < 300; ++n) PutPage(n);
  engine_->TEST_DrainBackground();
  const PageHash pages[] = {Page(0), Page(1), Page(2), Page(3)};
  auto m = engine_->Match(*ns_, pages);
  ASSERT_OK(m);
  EXPECT_EQ(m->leading_pages, 4u);
  engine_->TEST_DrainBackground();  // Match queued a prefetch; let it land
  for (uint64_t n = 100; n < 300; ++n) PutPage(n);  // evict them again
  engine_->TEST_DrainBackground();
  const uint64_t reads_before = nvme_->Stats().reads;
  EngineRead read = AcquireNow(wanted);
  uint64_t from_nvme = 0;
  for (size_t i = 0; i < wanted.size(); ++i) {
    ASSERT_OK(read.items[i]);
    from_nvme += read.source[i] == tierkv::Tier::kNvme;
    const auto want = Bytes(wanted[i], read.items[i]->size);
    EXPECT_EQ(std::memcmp(ns_->host().arena().base() + read.items[i]->offset,
                          want.data(), want.size()),
              0)
        << wanted[i].ToString();
  }
  EXPECT_GT(from_nvme, 0u);
  EXPECT_EQ(nvme_->Stats().reads - reads_before, from_nvme)
      << "one read per promoted segment, in one batch";
}

TEST_F(CacheEngineTest, AGetPromotingFromNvmeHoldsNoWorkerWhileItReads) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  // One worker: were it to wait for the promotion's read, the Flush after
  // it would queue behind that read.
  engine_options_.workers = 1;
  Open(/*with_nvme=*/true, WritePolicy::kNone, /*host_bytes=*/1 << 20);
  ASSERT_NO_FATAL_FAILURE(PutPage1OnNvmeOnlyAndPage0InDram());
  HeldNvmeReads held;
  std::promise<EngineRead> got;
  engine_->Acquire(kOwner, *ns_, AllKeys(1),
                   [&](EngineRead r) { got.set_value(std::move(r)); });
  held.WaitForOne();
  std::promise<std::vector<Status>> flushed;
  engine_->Flush(*ns_, AllKeys(0), [&](std::vector<Status> r) {
    flushed.set_value(std::move(r));
  });
  auto flush = flushed.get_future();
  // A deadline for a test that would otherwise hang, not a synchronisation.
  ASSERT_EQ(flush.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "the Flush waited for the Get's NVMe read";
  for (const Status& s : flush.get()) EXPECT_OK(s);
  auto read = got.get_future();
  EXPECT_EQ(read.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "its read is still held";
  held.LetGo();
  const EngineRead r = read.get();
  const std::vector<SegmentKey> keys = AllKeys(1);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_OK(r.items[i]);
    EXPECT_EQ(r.source[i], tierkv::Tier::kNvme);
    const auto want = Bytes(keys[i], r.items[i]->size);
    EXPECT_EQ(std::memcmp(ns_->host().arena().base() + r.items[i]->offset,
                          want.data(), want.size()),
              0)
        << keys[i].ToString();
  }
}

TEST_F(CacheEngineTest, MatchPrefetchesOnlyTheLayersTheReaderNamed) {
  // A sparse reader reads one layer group after its Match: only that
  // group's segments below DRAM are promoted, not every layer's.
  Open(/*with_nvme=*/true, WritePolicy::kNone, /*host_bytes=*/1 << 20);
  std::vector<SegmentKey> stored;
  for (uint64_t n = 0; n < 4; ++n) {
    PutPage(n);
    for (const auto& k : AllKeys(n)) stored.push_back(k);
  }
  for (const Status& s : FlushNow(stored)) ASSERT_OK(s);
  for (uint64_t n = 100; n < 300; ++n) PutPage(n);  // evicts pages 0-3
  engine_->TEST_DrainBackground();
  ASSERT_FALSE(ns_->host().Touch({Page(0), 1, 0}));
  const uint64_t promoted_before = engine_->Stats(*ns_).mover.promotions_done;
  const PageHash pages[] = {Page(0), Page(1), Page(2), Page(3)};
  // Layers [1, 3): layer 1 (kv) and layer 2 (kv, index_k) of each page.
  auto m = engine_->Match(*ns_, pages, CacheEngine::NvmePromotion::kQueue,
                          {.first = 1, .count = 2});
  ASSERT_OK(m);
  EXPECT_EQ(m->leading_pages, 4u);
  EXPECT_EQ(m->leading_nvme_pages, 4u);
  engine_->TEST_DrainBackground();
  EXPECT_EQ(engine_->Stats(*ns_).mover.promotions_done - promoted_before,
            4u * 3u);
  for (uint64_t n = 0; n < 4; ++n) {
    for (const auto& k : AllKeys(n)) {
      EXPECT_EQ(ns_->host().Touch(k), k.layer == 1 || k.layer == 2)
          << k.ToString();
    }
  }
}

TEST_F(CacheEngineTest, FlushOfAThousandKeysSyncsTheDeviceOnce) {
  Open(/*with_nvme=*/true, WritePolicy::kNone, /*host_bytes=*/8 << 20);
  std::vector<SegmentKey> keys;
  for (uint64_t n = 0; n < 167; ++n) {  // 167 pages x 6 segments = 1002
    PutPage(n);
    for (const auto& k : AllKeys(n)) keys.push_back(k);
  }
  keys.resize(1000);
  const uint64_t flushes = device_->Stats().flush_ops;
  for (const Status& s : FlushNow(keys)) EXPECT_OK(s);
  EXPECT_EQ(device_->Stats().flush_ops - flushes, 1u);
  EXPECT_EQ(nvme_->Stats().segments, 1000u);
  // Already durable: no further sync.
  for (const Status& s : FlushNow(keys)) EXPECT_OK(s);
  EXPECT_EQ(device_->Stats().flush_ops - flushes, 1u);
}

TEST_F(CacheEngineTest, OpenRegistersTheNamespaceOnNvmeBeforeAnyWrite) {
  // The catalog's synced namespace record is written at Open, not by the
  // first demotion (where it stalled a flood for 1.5 s on a virtual disk).
  Open(/*with_nvme=*/true, WritePolicy::kWriteBack, /*host_bytes=*/8 << 20);
  const NvmeStoreStats stats = nvme_->Stats();
  EXPECT_EQ(stats.namespaces, 1u);
  EXPECT_EQ(stats.writes, 0u);
}

TEST_F(CacheEngineTest, PersistDirtyWritesWhatWriteBackHeldAndSyncsOnce) {
  // Write-back with room to spare demotes nothing; a graceful shutdown
  // then writes every dirty segment, with one device sync.
  Open(/*with_nvme=*/true, WritePolicy::kWriteBack, /*host_bytes=*/8 << 20);
  for (uint64_t n = 0; n < 20; ++n) PutPage(n);
  engine_->TEST_DrainBackground();
  EXPECT_EQ(nvme_->Stats().segments, 0u);
  const uint64_t dirty = ns_->host().Stats().dirty_segments;
  EXPECT_EQ(dirty, 20u * AllKeys(0).size());
  const uint64_t flushes = device_->Stats().flush_ops;
  EXPECT_EQ(engine_->PersistDirty(std::chrono::seconds(30)), dirty);
  EXPECT_EQ(nvme_->Stats().segments, dirty);
  EXPECT_EQ(ns_->host().Stats().dirty_segments, 0u);
  EXPECT_EQ(device_->Stats().flush_ops - flushes, 1u);
  EXPECT_FALSE(nvme_->HasUnsyncedWrites());
  // Nothing left: a second call writes and syncs nothing.
  EXPECT_EQ(engine_->PersistDirty(std::chrono::seconds(30)), 0u);
  EXPECT_EQ(device_->Stats().flush_ops - flushes, 1u);
}

TEST_F(CacheEngineTest, DemotionsAreSyncedWhenTheEngineClockSaysSo) {
  // The group sync's interval is on the engine's clock: real time passing
  // syncs nothing; the clock passing sync_interval syncs once.
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  testing::ManualClock clock;
  engine_options_.clock = &clock;
  engine_options_.mover.sync_interval = std::chrono::hours(1);
  std::promise<void> synced;
  std::atomic<bool> seen{false};
  ScopedSyncPoints sync;
  sync.SetCallback(TierMover::kAfterGroupSync, [&](void*) {
    if (!seen.exchange(true)) synced.set_value();
  });
  Open(/*with_nvme=*/true, WritePolicy::kWriteBack, /*host_bytes=*/1 << 20);
  const uint64_t flushes = device_->Stats().flush_ops;
  for (uint64_t n = 0; n < 400; ++n) PutPage(n);
  engine_->TEST_DrainBackground();
  ASSERT_GT(engine_->Stats(*ns_).mover.demotion_batches, 1u);
  EXPECT_TRUE(nvme_->HasUnsyncedWrites());
  clock.Advance(std::chrono::minutes(59));
  engine_->TEST_DrainBackground();
  EXPECT_FALSE(seen.load()) << "59 minutes of the engine's clock: not due";
  EXPECT_EQ(device_->Stats().flush_ops, flushes);

  clock.Advance(std::chrono::minutes(1));
  ASSERT_EQ(synced.get_future().wait_for(std::chrono::minutes(1)),
            std::future_status::ready);
  EXPECT_FALSE(nvme_->HasUnsyncedWrites());
  EXPECT_EQ(device_->Stats().flush_ops, flushes + 1);
  EXPECT_EQ(engine_->Stats(*ns_).mover.syncs, 1u);
}

TEST_F(CacheEngineTest, WriteBackFloodWaitsForTheMoverAndLosesNothing) {
  // 1 MiB of DRAM (~58 pages) and 400 pages put as fast as possible: every
  // Put succeeds (waiting for write-back when DRAM is all dirty) and every
  // page is afterwards in DRAM or on NVMe.
  Open(/*with_nvme=*/true, WritePolicy::kWriteBack, /*host_bytes=*/1 << 20);
  for (uint64_t n = 0; n < 400; ++n) PutPage(n);
  engine_->TEST_DrainBackground();
  // Before Match: its prefetch brings pages back (and evicts others).
  const EngineStats s = engine_->Stats(*ns_);
  std::vector<PageHash> pages;
  for (uint64_t n = 0; n < 400; ++n) pages.push_back(Page(n));
  auto m = engine_->Match(*ns_, pages);
  ASSERT_OK(m);
  EXPECT_EQ(m->leading_pages, 400u);
  EXPECT_GT(s.host.evictions, 0u);
  EXPECT_EQ(s.mover.demotions_failed, 0u);
  EXPECT_EQ(s.backpressure_busy, 0u);
  EXPECT_GE(s.mover.demotions_done, s.host.evictions);
}

TEST_F(CacheEngineTest, DemotionsAreGroupSyncedAndFlushMakesThemDurable) {
  engine_options_.mover.sync_interval = std::chrono::hours(1);
  Open(/*with_nvme=*/true, WritePolicy::kWriteBack, /*host_bytes=*/1 << 20);
  const uint64_t flushes = device_->Stats().flush_ops;
  for (uint64_t n = 0; n < 400; ++n) PutPage(n);
  engine_->TEST_DrainBackground();
  const EngineStats s = engine_->Stats(*ns_);
  EXPECT_GT(s.mover.demotion_batches, 1u);
  // Demotions are crash safe when written and synced as a group later.
  EXPECT_EQ(device_->Stats().flush_ops, flushes);
  EXPECT_TRUE(nvme_->HasUnsyncedWrites());
  std::vector<SegmentKey> keys;
  for (uint64_t n = 0; n < 10; ++n) {  // the oldest: written back
    for (const auto& k : AllKeys(n)) keys.push_back(k);
  }
  for (const Status& st : FlushNow(keys)) EXPECT_OK(st);
  EXPECT_EQ(device_->Stats().flush_ops, flushes + 1);
  EXPECT_FALSE(nvme_->HasUnsyncedWrites());
}

// A memfd as an engine would register it: sealed against shrinking.
class SealedMemfd {
 public:
  explicit SealedMemfd(uint64_t bytes, bool seal = true) : bytes_(bytes) {
    fd_ = ::memfd_create("pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_EQ(::ftruncate(fd_, static_cast<off_t>(bytes)), 0);
    if (seal) {
      EXPECT_EQ(::fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    }
    base_ = static_cast<std::byte*>(
        ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
  }
  ~SealedMemfd() {
    ::munmap(base_, bytes_);
    ::close(fd_);
  }
  int fd() const { return fd_; }
  std::byte* base() const { return base_; }

 private:
  uint64_t bytes_;
  int fd_ = -1;
  std::byte* base_ = nullptr;
};

class CacheEnginePoolTest : public CacheEngineTest {
 protected:
  static constexpr uint32_t kSlots = 8;
  // One memfd per (layer, part), kSlots slots each, and 4 tickets.
  void RegisterPools() {
    const LayoutSpec layout = TestLayout();
    for (uint16_t l = 0; l < layout.num_layers(); ++l) {
      for (uint8_t p = 0; p < layout.layers[l].parts.size(); ++p) {
        const uint64_t seg = layout.SegmentBytes(l, p);
        pools_[{l, p}] = std::make_unique<SealedMemfd>(seg * kSlots);
        ASSERT_OK(engine_->RegisterPool(
            kOwner, *ns_, pools_[{l, p}]->fd(),
            {.layer = l, .part = p, .slot_bytes = seg, .slot_count = kSlots}));
      }
    }
    tickets_ = std::make_unique<SealedMemfd>(4 * sizeof(LoadTicket));
    ASSERT_OK(engine_->RegisterTickets(kOwner, tickets_->fd(), 4));
  }
  LoadTicket& Ticket(uint32_t i) {
    return reinterpret_cast<LoadTicket*>(tickets_->base())[i];
  }
  // Fills most of a 1 MiB write-back namespace with dirty segments (50
  // pages of 17.1 KiB), then reserves 20 pages more, waiting for
  // write-back: the future is the reservation, once it is answered.
  std::future<EngineReservation> ReservePastDirtyDram() {
    for (uint64_t n = 0; n < 50; ++n) PutPage(n);
    std::vector<SegmentSize> more;
    for (uint64_t n = 50; n < 70; ++n) {
      for (const SegmentKey& k : AllKeys(n)) {
        more.push_back({k, TestLayout().SegmentBytes(k.layer, k.part)});
      }
    }
    auto reserved = std::make_shared<std::promise<EngineReservation>>();
    auto put = reserved->get_future();
    engine_->Reserve(kOwner, *ns_, more, [reserved](EngineReservation r) {
      reserved->set_value(std::move(r));
    });
    return put;
  }
  void WaitFinished(uint32_t i) {
    while (Ticket(i).finished.load(std::memory_order_acquire) == 0) {
      ::syscall(SYS_futex, &Ticket(i).finished, FUTEX_WAIT, 0, nullptr, nullptr,
                0);
    }
  }
  // WaitFinished for at most `limit` (a deadline for a test that would
  // otherwise hang, not a synchronisation): whether it finished.
  bool WaitFinishedFor(uint32_t i, std::chrono::seconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (Ticket(i).finished.load(std::memory_order_acquire) == 0) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return false;
      const auto left =
          std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now);
      const timespec wait{static_cast<time_t>(left.count() / 1000000000),
                          static_cast<long>(left.count() % 1000000000)};
      ::syscall(SYS_futex, &Ticket(i).finished, FUTEX_WAIT, 0, &wait, nullptr,
                0);
    }
    return true;
  }
  // Loads page `page` (every layer) into `slot`, progress in `ticket`.
  Status LoadEveryLayer(uint64_t page, uint32_t slot, uint32_t ticket) {
    return engine_->Load(kOwner, *ns_,
                         {.pages = {Page(page)},
                          .slots = {slot},
                          .first_layer = 0,
                          .num_layers = 4,
                          .ticket = ticket});
  }
  // A finished Load of page `page` into `slot`: every layer, no error,
  // the bytes in place.
  void ExpectLoaded(uint32_t ticket, uint64_t page, uint32_t slot) {
    EXPECT_EQ(Ticket(ticket).finished.load(), 1u);
    EXPECT_EQ(Ticket(ticket).layers_done.load(), 4u);
    EXPECT_EQ(Ticket(ticket).error_count.load(), 0u);
    ExpectPageInSlot(page, slot);
  }
  // Every slot byte of page `page` as Bytes() wrote it, on every layer.
  void ExpectPageInSlot(uint64_t page, uint32_t slot) {
    for (const auto& k : AllKeys(page)) {
      auto got = Slot(k.layer, k.part, slot);
      const auto want = Bytes(k, got.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0)
          << k.ToString();
    }
  }
  std::span<std::byte> Slot(uint16_t l, uint8_t p, uint32_t slot) {
    const uint64_t seg = TestLayout().SegmentBytes(l, p);
    return {pools_[{l, p}]->base() + slot * seg, seg};
  }

  std::map<std::pair<uint16_t, uint8_t>, std::unique_ptr<SealedMemfd>> pools_;
  std::unique_ptr<SealedMemfd> tickets_;
};

TEST_F(CacheEnginePoolTest, LoadCopiesEveryLayerIntoTheSlotsInLayerOrder) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  Open(/*with_nvme=*/true, WritePolicy::kNone, /*host_bytes=*/1 << 20);
  RegisterPools();
  for (uint64_t n = 0; n < 4; ++n) PutPage(n);
  // Page 1 only on NVMe (Flush, then evict), page 3 absent.
  for (const Status& s : FlushNow(AllKeys(1))) ASSERT_OK(s);
  for (uint64_t n = 100; n < 300; ++n) PutPage(n);
  PutPage(0);
  PutPage(2);
  ASSERT_FALSE(ns_->host().Touch({Page(1), 0, 0}));
  const uint64_t missing = 999;
  // Stall layer 2 until the test has seen layers 0 and 1 complete.
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  ScopedSyncPoints sync;
  sync.SetCallback(CacheEngine::kBeforeTransferUnit, [&](void* layer) {
    if (*static_cast<const uint16_t*>(layer) != 2) return;
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return release; });
  });
  ASSERT_OK(engine_->Load(kOwner, *ns_,
                          {.pages = {Page(0), Page(1), Page(2), Page(missing)},
                           .slots = {5, 0, 7, 3},
                           .first_layer = 0,
                           .num_layers = 4,
                           .ticket = 2}));
  while (Ticket(2).layers_done.load(std::memory_order_acquire) < 2) {
    ::syscall(SYS_futex, &Ticket(2).layers_done, FUTEX_WAIT,
              Ticket(2).layers_done.load(), nullptr, nullptr, 0);
  }
  EXPECT_EQ(Ticket(2).layers_done.load(), 2u) << "layer 2 is stalled";
  EXPECT_EQ(Ticket(2).finished.load(), 0u);
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  WaitFinished(2);
  EXPECT_EQ(Ticket(2).layers_done.load(), 4u);
  // Bytes: pages 0, 1 (from NVMe) and 2 in their slots on every layer.
  const std::pair<uint64_t, uint32_t> placed[] = {{0, 5}, {1, 0}, {2, 7}};
  for (const auto& k : AllKeys(0)) {
    for (auto [page, slot] : placed) {
      const SegmentKey key{Page(page), k.layer, k.part};
      auto got = Slot(k.layer, k.part, slot);
      const auto want = Bytes(key, got.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0)
          << key.ToString();
    }
  }
  // The absent page: one NotFound per segment (6), its slot untouched.
  ASSERT_EQ(Ticket(2).error_count.load(), 6u);
  for (uint32_t e = 0; e < 6; ++e) {
    EXPECT_EQ(Ticket(2).errors[e].page, 3u);
    EXPECT_EQ(Ticket(2).errors[e].code,
              static_cast<uint8_t>(StatusCode::kNotFound));
  }
  const EngineStats st = engine_->Stats(*ns_);
  EXPECT_EQ(st.load_segments_nvme, 6u);
  EXPECT_EQ(st.load_segments_host, 12u);
  EXPECT_EQ(st.load_misses, 6u);
  EXPECT_EQ(st.loads, 1u);
  EXPECT_EQ(st.stores, 0u);
  // One Load timed, at least as long as the stall the test held it in.
  EXPECT_EQ(LatencyHistogram::SampleCount(st.load_latency), 1u);
  EXPECT_GT(st.load_latency_nanos, 0u);
  // Only the Flush of page 1 wrote NVMe (write policy none).
  uint64_t page_bytes = 0;
  for (const auto& k : AllKeys(1)) {
    page_bytes += TestLayout().SegmentBytes(k.layer, k.part);
  }
  EXPECT_EQ(st.mover.written_segments, 6u);
  EXPECT_EQ(st.mover.written_bytes, page_bytes);
}

TEST_F(CacheEnginePoolTest, ALoadLaneGoesOnWhileItsNvmeReadsAreInFlight) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  // One Load worker with one lane: were it to wait for its NVMe reads, a
  // second Load, served from DRAM alone, would queue behind them.
  engine_options_.load_workers = 1;
  engine_options_.transfer_lanes = 1;
  Open(/*with_nvme=*/true, WritePolicy::kNone, /*host_bytes=*/1 << 20);
  RegisterPools();
  ASSERT_NO_FATAL_FAILURE(PutPage1OnNvmeOnlyAndPage0InDram());
  HeldNvmeReads held;  // every NVMe read, until the test lets go
  ASSERT_OK(LoadEveryLayer(1, /*slot=*/0, /*ticket=*/1));
  held.WaitForOne();
  ASSERT_OK(LoadEveryLayer(0, /*slot=*/1, /*ticket=*/2));
  EXPECT_TRUE(WaitFinishedFor(2, std::chrono::seconds(60)))
      << "the DRAM Load waited for the other Load's NVMe reads";
  ExpectLoaded(2, 0, /*slot=*/1);
  EXPECT_EQ(Ticket(1).finished.load(), 0u) << "its reads are still held";
  EXPECT_EQ(Ticket(1).layers_done.load(), 0u);
  held.LetGo();
  WaitFinished(1);
  ExpectLoaded(1, 1, /*slot=*/0);
  const EngineStats st = engine_->Stats(*ns_);
  EXPECT_EQ(st.load_segments_nvme, 6u);
  EXPECT_EQ(st.load_segments_host, 6u);
  EXPECT_EQ(st.loads, 2u);
}

TEST_F(CacheEnginePoolTest, EndingTheEngineLetsItsNvmeReadsFinishTheirLoad) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  Open(/*with_nvme=*/true, WritePolicy::kNone, /*host_bytes=*/1 << 20);
  RegisterPools();
  ASSERT_NO_FATAL_FAILURE(PutPage1OnNvmeOnlyAndPage0InDram());
  HeldNvmeReads held;
  held.LetGoAt(CacheEngine::kBeforeWaitingForTierReads);
  ASSERT_OK(LoadEveryLayer(1, /*slot=*/0, /*ticket=*/1));
  held.WaitForOne();
  EXPECT_EQ(Ticket(1).finished.load(), 0u);
  // The lanes are idle, the reads held: the engine ends, its destructor
  // lets them go, and it returns only once they finished the Load.
  engine_.reset();
  ExpectLoaded(1, 1, /*slot=*/0);
}

TEST_F(CacheEnginePoolTest, LoadReadsNvmeOnceAndPromotesItAfterwards) {
  Open(/*with_nvme=*/true, WritePolicy::kNone, /*host_bytes=*/1 << 20);
  EXPECT_FALSE(engine_->HasPools(kOwner));
  RegisterPools();
  EXPECT_TRUE(engine_->HasPools(kOwner));
  PutPage(1);
  for (const Status& s : FlushNow(AllKeys(1))) ASSERT_OK(s);
  for (uint64_t n = 100; n < 300; ++n) PutPage(n);  // page 1: NVMe only
  engine_->TEST_DrainBackground();
  ASSERT_FALSE(ns_->host().Touch({Page(1), 0, 0}));
  const PageHash page[] = {Page(1)};
  const uint64_t queued = engine_->Stats(*ns_).mover.prefetch_batches;
  // A pool owner's Match promotes nothing: its Load reads NVMe itself.
  auto m = engine_->Match(*ns_, page, CacheEngine::NvmePromotion::kNone);
  ASSERT_OK(m);
  EXPECT_EQ(m->leading_nvme_pages, 1u);
  EXPECT_EQ(engine_->Stats(*ns_).mover.prefetch_batches, queued);
  const uint64_t reads = nvme_->Stats().reads;
  ASSERT_OK(engine_->Load(kOwner, *ns_,
                          {.pages = {Page(1)},
                           .slots = {4},
                           .first_layer = 0,
                           .num_layers = 4,
                           .ticket = 1}));
  WaitFinished(1);
  EXPECT_EQ(Ticket(1).error_count.load(), 0u);
  engine_->TEST_DrainBackground();
  // The Load read each segment once (6), then queued one promotion of
  // them, which read them again into DRAM: a second Load hits DRAM.
  const EngineStats st = engine_->Stats(*ns_);
  EXPECT_EQ(st.load_segments_nvme, 6u);
  EXPECT_EQ(st.mover.prefetch_batches, queued + 1);
  EXPECT_EQ(st.mover.promotions_done, 6u);
  EXPECT_EQ(nvme_->Stats().reads - reads, 12u);
  for (const auto& k : AllKeys(1)) EXPECT_TRUE(ns_->host().Touch(k));
  ASSERT_OK(engine_->Load(kOwner, *ns_,
                          {.pages = {Page(1)},
                           .slots = {5},
                           .first_layer = 0,
                           .num_layers = 4,
                           .ticket = 2}));
  WaitFinished(2);
  EXPECT_EQ(engine_->Stats(*ns_).load_segments_host, 6u);
  for (const auto& k : AllKeys(1)) {
    auto got = Slot(k.layer, k.part, 5);
    const auto want = Bytes(k, got.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0)
        << k.ToString();
  }
  // A Get client's Match still queues the promotion ahead of its Get.
  for (uint64_t n = 300; n < 500; ++n) PutPage(n);
  engine_->TEST_DrainBackground();
  ASSERT_FALSE(ns_->host().Touch({Page(1), 0, 0}));
  ASSERT_OK(engine_->Match(*ns_, page));
  EXPECT_EQ(engine_->Stats(*ns_).mover.prefetch_batches, queued + 2);
}

TEST_F(CacheEnginePoolTest, StoreSavesSlotsAndDedupsWhatIsStored) {
  Open(/*with_nvme=*/false);
  RegisterPools();
  PutPage(0);  // already stored: Store copies nothing for it
  for (const auto& k : AllKeys(1)) {
    auto slot = Slot(k.layer, k.part, 4);
    const auto bytes = Bytes(k, slot.size());
    std::memcpy(slot.data(), bytes.data(), slot.size());
  }
  ASSERT_OK(engine_->Store(kOwner, *ns_,
                           {.pages = {Page(0), Page(1)},
                            .slots = {6, 4},
                            .first_layer = 0,
                            .num_layers = 4,
                            .ticket = 0}));
  WaitFinished(0);
  EXPECT_EQ(Ticket(0).error_count.load(), 0u);
  const PageHash pages[] = {Page(0), Page(1)};
  auto m = engine_->Match(*ns_, pages);
  ASSERT_OK(m);
  EXPECT_EQ(m->leading_pages, 2u);
  EngineRead read = AcquireNow(AllKeys(1));
  for (size_t i = 0; i < read.items.size(); ++i) {
    ASSERT_OK(read.items[i]);
    const auto want = Bytes(AllKeys(1)[i], read.items[i]->size);
    EXPECT_EQ(std::memcmp(ns_->host().arena().base() + read.items[i]->offset,
                          want.data(), want.size()),
              0);
  }
  const EngineStats st = engine_->Stats(*ns_);
  EXPECT_EQ(st.store_segments, 6u);
  EXPECT_EQ(st.store_dedup, 6u);
  EXPECT_EQ(st.stores, 1u);
  EXPECT_EQ(LatencyHistogram::SampleCount(st.store_latency), 1u);
}

TEST_F(CacheEnginePoolTest, StoreFloodUnderWriteBackWaitsForTheMover) {
  // 200 pages (3.4 MiB) stored through a 1 MiB write-back host tier, 8 at a
  // time: a Store that finds only dirty segments waits for the mover, as a
  // Put does, instead of failing its pages with Busy.
  Open(/*with_nvme=*/true, WritePolicy::kWriteBack, /*host_bytes=*/1 << 20);
  RegisterPools();
  std::vector<PageHash> all;
  for (uint64_t batch = 0; batch < 25; ++batch) {
    std::vector<PageHash> pages;
    std::vector<uint32_t> slots;
    for (uint32_t s = 0; s < kSlots; ++s) {
      const uint64_t n = 1000 + batch * kSlots + s;
      for (const auto& k : AllKeys(n)) {
        auto slot = Slot(k.layer, k.part, s);
        const auto bytes = Bytes(k, slot.size());
        std::memcpy(slot.data(), bytes.data(), slot.size());
      }
      pages.push_back(Page(n));
      slots.push_back(s);
    }
    all.insert(all.end(), pages.begin(), pages.end());
    ASSERT_OK(engine_->Store(kOwner, *ns_,
                             {.pages = pages,
                              .slots = slots,
                              .first_layer = 0,
                              .num_layers = 4,
                              .ticket = 0}));
    WaitFinished(0);
    ASSERT_EQ(Ticket(0).error_count.load(), 0u) << "batch " << batch;
  }
  auto m = engine_->Match(*ns_, all);
  ASSERT_OK(m);
  EXPECT_EQ(m->leading_pages, all.size());
  const EngineStats st = engine_->Stats(*ns_);
  EXPECT_EQ(st.backpressure_busy, 0u);
  EXPECT_EQ(st.mover.demotions_failed, 0u);
}

TEST_F(CacheEnginePoolTest, APutStalledOnWriteBackDoesNotHoldALoad) {
  // One worker for calls that may wait, no mover threads (nothing cleans
  // DRAM until the test persists it), and a Put that waits as long as the
  // test needs: the Put's Reserve holds that worker; a Load must still
  // finish, on the load workers, while it waits.
  engine_options_.workers = 1;
  engine_options_.mover.workers = 0;
  engine_options_.write_back_wait = std::chrono::minutes(10);
  Open(/*with_nvme=*/true, WritePolicy::kWriteBack, /*host_bytes=*/1 << 20);
  RegisterPools();
  auto put = ReservePastDirtyDram();
  ASSERT_EQ(engine_->Stats(*ns_).backpressure_waits, 1u)
      << "the Put went to a worker to wait for write-back";

  ASSERT_OK(engine_->Load(kOwner, *ns_,
                          {.pages = {Page(0)},
                           .slots = {1},
                           .first_layer = 0,
                           .num_layers = 4,
                           .ticket = 1}));
  WaitFinished(1);
  EXPECT_EQ(Ticket(1).error_count.load(), 0u);
  EXPECT_EQ(put.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "the Put is still waiting for write-back";
  for (const auto& k : AllKeys(0)) {
    auto got = Slot(k.layer, k.part, 1);
    const auto want = Bytes(k, got.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0);
  }

  // Write-back now: the waiting Put gets its room.
  EXPECT_GT(engine_->PersistDirty(std::chrono::minutes(1)), 0u);
  EngineReservation r = put.get();
  for (const auto& item : r.items) EXPECT_OK(item);
  EXPECT_EQ(engine_->Stats(*ns_).backpressure_busy, 0u);
}

TEST_F(CacheEnginePoolTest, AWriteBackWaitEndsWhenTheEngineClockPassesIt) {
  // write_back_wait is on the engine's clock: a Put waiting for a
  // write-back that never comes (no mover threads) outlives 1 ms of it
  // in real time, and gives up, Busy, once the clock passes it.
  testing::ManualClock clock;
  engine_options_.clock = &clock;
  engine_options_.workers = 1;
  engine_options_.mover.workers = 0;
  engine_options_.write_back_wait = std::chrono::milliseconds(1);
  Open(/*with_nvme=*/true, WritePolicy::kWriteBack, /*host_bytes=*/1 << 20);
  auto put = ReservePastDirtyDram();
  ASSERT_EQ(engine_->Stats(*ns_).backpressure_waits, 1u);
  EXPECT_EQ(put.wait_for(std::chrono::milliseconds(50)),
            std::future_status::timeout)
      << "50 ms of real time is not 1 ms of the engine's clock";

  clock.Advance(std::chrono::milliseconds(1));
  EngineReservation r = put.get();
  uint64_t busy = 0;
  for (const auto& item : r.items) {
    if (!item.ok()) {
      EXPECT_EQ(item.status().code(), StatusCode::kBusy);
      ++busy;
    }
  }
  EXPECT_GT(busy, 0u);
  EXPECT_EQ(engine_->Stats(*ns_).backpressure_busy, busy);
}

TEST_F(CacheEnginePoolTest, BadPoolsAndTransfersAreRefusedAndChangeNothing) {
  Open(/*with_nvme=*/false);
  const uint64_t seg = TestLayout().SegmentBytes(0, 0);
  SealedMemfd small(seg * 3);
  EXPECT_EQ(engine_
                ->RegisterPool(
                    kOwner, *ns_, small.fd(),
                    {.layer = 0, .part = 0, .slot_bytes = seg, .slot_count = 4})
                .code(),
            StatusCode::kInvalidArgument)
      << "smaller than its spec";
  SealedMemfd unsealed(seg * 4, /*seal=*/false);
  EXPECT_EQ(engine_
                ->RegisterPool(
                    kOwner, *ns_, unsealed.fd(),
                    {.layer = 0, .part = 0, .slot_bytes = seg, .slot_count = 4})
                .code(),
            StatusCode::kInvalidArgument)
      << "may shrink under the daemon";
  SealedMemfd readonly(seg * 4);
  ASSERT_EQ(::fcntl(readonly.fd(), F_ADD_SEALS, F_SEAL_FUTURE_WRITE), 0);
  EXPECT_EQ(engine_
                ->RegisterPool(
                    kOwner, *ns_, readonly.fd(),
                    {.layer = 0, .part = 0, .slot_bytes = seg, .slot_count = 4})
                .code(),
            StatusCode::kInvalidArgument)
      << "sealed read-only";
  EXPECT_EQ(
      engine_
          ->RegisterPool(
              kOwner, *ns_, small.fd(),
              {.layer = 0, .part = 0, .slot_bytes = seg - 1, .slot_count = 1})
          .code(),
      StatusCode::kInvalidArgument)
      << "slot size differs from the layout";
  RegisterPools();
  PutPage(0);
  auto before =
      std::vector<std::byte>(Slot(0, 0, 0).begin(), Slot(0, 0, 0).end());
  EXPECT_EQ(engine_
                ->Load(kOwner, *ns_,
                       {.pages = {Page(0)}, .slots = {kSlots}, .num_layers = 4})
                .code(),
            StatusCode::kInvalidArgument)
      << "slot out of range";
  EXPECT_EQ(engine_
                ->Load(kOwner + 1, *ns_,
                       {.pages = {Page(0)}, .slots = {0}, .num_layers = 4})
                .code(),
            StatusCode::kInvalidArgument)
      << "another connection has no pools";
  EXPECT_EQ(engine_
                ->Load(kOwner, *ns_,
                       {.pages = {Page(0)}, .slots = {0}, .num_layers = 5})
                .code(),
            StatusCode::kInvalidArgument)
      << "layers outside the layout";
  EXPECT_EQ(
      engine_
          ->Load(
              kOwner, *ns_,
              {.pages = {Page(0)}, .slots = {0}, .num_layers = 4, .ticket = 4})
          .code(),
      StatusCode::kInvalidArgument)
      << "ticket out of range";
  engine_->TEST_DrainBackground();
  EXPECT_EQ(std::memcmp(Slot(0, 0, 0).data(), before.data(), before.size()), 0);
  EXPECT_EQ(engine_->Stats(*ns_).transfers, 0u);
  // The connection's pools end with it.
  engine_->ReleaseOwner(kOwner);
  EXPECT_EQ(engine_
                ->Load(kOwner, *ns_,
                       {.pages = {Page(0)}, .slots = {0}, .num_layers = 4})
                .code(),
            StatusCode::kInvalidArgument);
}

TEST_F(CacheEngineTest, FlushWithoutNvmeIsInvalidArgument) {
  Open(/*with_nvme=*/false);
  PutPage(0);
  for (const Status& s : FlushNow(AllKeys(0))) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  }
}

// Device pools on the emulated backend, whose faults and stalls
// (DeviceBackendOptions) stand in for a real GPU's.
class CacheEngineDevicePoolTest : public CacheEnginePoolTest {
 protected:
  void OpenWithDevice(DeviceBackendOptions daemon_options = {}) {
    daemon_options.streams = 2;
    auto daemon_side = OpenEmulatedBackend(daemon_options);
    ASSERT_OK(daemon_side);
    daemon_device_ = std::move(daemon_side).value();
    auto hbm = daemon_device_->AllocatePool(1 << 20);
    ASSERT_OK(hbm);
    engine_options_.device = daemon_device_.get();
    engine_options_.hbm_pool = *hbm;
    Open(/*with_nvme=*/false);
    auto engine_side = OpenEmulatedBackend({.streams = 1});
    ASSERT_OK(engine_side);
    engine_device_ = std::move(engine_side).value();
    const LayoutSpec layout = TestLayout();
    for (uint16_t l = 0; l < layout.num_layers(); ++l) {
      for (uint8_t p = 0; p < layout.layers[l].parts.size(); ++p) {
        const uint64_t seg = layout.SegmentBytes(l, p);
        auto pool = engine_device_->AllocatePool(seg * kSlots);
        ASSERT_OK(pool);
        auto handle = engine_device_->ExportPool(pool->id);
        ASSERT_OK(handle);
        ASSERT_OK(engine_->RegisterDevicePool(
            kOwner, *ns_, *handle, engine_device_->uuid(),
            {.layer = l, .part = p, .slot_bytes = seg, .slot_count = kSlots}));
      }
    }
    tickets_ = std::make_unique<SealedMemfd>(4 * sizeof(LoadTicket));
    ASSERT_OK(engine_->RegisterTickets(kOwner, tickets_->fd(), 4));
  }
  void TearDown() override {
    engine_.reset();  // closes its imports before the backends go
  }

  std::unique_ptr<DeviceBackend> daemon_device_, engine_device_;
};

// A device fault fails the backend as a sticky CUDA error fails the
// context: every segment of the Load is an error, nothing it admitted to
// HBM stays, the HBM tier is off from then on, and the host tier serves.
TEST_F(CacheEngineDevicePoolTest, ADeviceFaultTurnsHbmOffAndTheHostServes) {
  // The first copy works; the second (its HBM admission) faults.
  OpenWithDevice({.emulated_fault_after_copies = 1});
  PutPage(0);
  PutPage(1);
  ASSERT_OK(engine_->Load(kOwner, *ns_,
                          {.pages = {Page(0), Page(1)},
                           .slots = {0, 1},
                           .first_layer = 0,
                           .num_layers = 4,
                           .ticket = 0}));
  WaitFinished(0);
  EXPECT_EQ(Ticket(0).layers_done.load(), 4u);
  // The fault failed the backend during the first unit: its wait and every
  // later copy answer Unavailable. All 12 segments are errors, none counted
  // as loaded.
  ASSERT_EQ(Ticket(0).error_count.load(), 12u);
  for (uint32_t e = 0; e < 12; ++e) {
    EXPECT_EQ(Ticket(0).errors[e].code,
              static_cast<uint8_t>(StatusCode::kUnavailable));
  }
  const EngineStats st = engine_->Stats(*ns_);
  ASSERT_TRUE(st.has_device);
  EXPECT_TRUE(st.device_failed);
  EXPECT_NE(st.device_error.find("injected"), std::string::npos)
      << st.device_error;
  EXPECT_EQ(st.device_quarantined, 0u);  // a fault ends the copies
  EXPECT_EQ(st.load_segments_host, 0u);
  ASSERT_TRUE(st.has_hbm);
  EXPECT_EQ(st.hbm.segments, 0u);
  EXPECT_EQ(st.hbm.admissions, 0u);
  EXPECT_EQ(st.hbm.used_bytes, 0u);  // the aborted reservations went
  EXPECT_TRUE(ns_->host().Touch({Page(0), 0, 0}));  // host copies stay
  // Nothing in HBM to match, and the pages still match from DRAM.
  auto m = engine_->Match(*ns_, std::vector<PageHash>{Page(0), Page(1)});
  ASSERT_OK(m);
  EXPECT_EQ(m->leading_pages, 2u);
  EXPECT_EQ(m->tiers, (std::vector<tierkv::Tier>{tierkv::Tier::kHost,
                                                 tierkv::Tier::kHost}));
}

TEST_F(CacheEngineDevicePoolTest,
       ConcurrentLoadsShareTwoStreamsAndAllComplete) {
  OpenWithDevice();  // no fault
  for (uint64_t n = 0; n < 8; ++n) PutPage(n);
  // Four Loads at once, their units taking turns on two streams (each
  // holds one alone from its first copy to its event): all complete, with
  // no error and every segment admitted to HBM.
  for (uint32_t t = 0; t < 4; ++t) {
    ASSERT_OK(engine_->Load(kOwner, *ns_,
                            {.pages = {Page(2 * t), Page(2 * t + 1)},
                             .slots = {2 * t, 2 * t + 1},
                             .first_layer = 0,
                             .num_layers = 4,
                             .ticket = t}));
  }
  for (uint32_t t = 0; t < 4; ++t) {
    WaitFinished(t);
    EXPECT_EQ(Ticket(t).error_count.load(), 0u) << "ticket " << t;
  }
  const EngineStats st = engine_->Stats(*ns_);
  EXPECT_EQ(st.load_segments_host, 48u);
  EXPECT_EQ(st.hbm.segments, 48u);
}

// A Store whose device copies outlive their wait: the engine hears the
// error at the timeout, but the reservations the copies write stay out of
// reuse (quarantined) until the copies are over, then go back.
TEST_F(CacheEngineDevicePoolTest, ATimedOutCopyKeepsItsMemoryUntilItIsOver) {
  std::mutex mu;
  std::condition_variable cv;
  bool stall = false, released = false;
  engine_options_.device_copy_timeout = std::chrono::milliseconds(50);
  OpenWithDevice({.emulated_before_op = [&] {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return !stall || released; });
  }});
  {
    std::lock_guard lock(mu);
    stall = true;  // device work from here on waits for `released`
  }
  ASSERT_OK(engine_->Store(kOwner, *ns_,
                           {.pages = {Page(1)},
                            .slots = {4},
                            .first_layer = 0,
                            .num_layers = 1,
                            .ticket = 0}));
  WaitFinished(0);
  const uint32_t parts = TestLayout().layers[0].parts.size();
  ASSERT_EQ(Ticket(0).error_count.load(), parts);
  EXPECT_EQ(Ticket(0).errors[0].code,
            static_cast<uint8_t>(StatusCode::kIOError));
  EngineStats st = engine_->Stats(*ns_);
  EXPECT_FALSE(st.device_failed);
  EXPECT_EQ(st.device_quarantined, parts);  // one unit per pool (part)
  EXPECT_EQ(st.device_quarantined_total, parts);
  // The reservations the stalled copies write are still held.
  EXPECT_GT(st.host.reserved_bytes, 0u);
  {
    std::lock_guard lock(mu);
    released = true;
  }
  cv.notify_all();
  // In-order streams: an event recorded now is done once the stalled
  // copies are.
  for (StreamId stream = 0; stream < 2; ++stream) {
    auto after = daemon_device_->RecordEvent(stream);
    ASSERT_OK(after);
    ASSERT_OK(daemon_device_->WaitEvent(*after, std::chrono::seconds(10)));
  }
  st = engine_->Stats(*ns_);  // reaps the quarantine
  EXPECT_EQ(st.device_quarantined, 0u);
  EXPECT_EQ(st.device_quarantined_total, parts);
  EXPECT_EQ(st.host.reserved_bytes, 0u);
  EXPECT_EQ(st.store_segments, 0u);  // failed: aborted, not committed
  const PageHash page[] = {Page(1)};
  auto m = engine_->Match(*ns_, page);
  ASSERT_OK(m);
  EXPECT_EQ(m->leading_pages, 0u);
}

// A transfer ordered after an engine's stream that never reaches it (a
// hung engine, a hostile client): the daemon gives up after
// device_copy_timeout, moves nothing (the slots may still be in use) and
// says Busy for every segment; the gate does not hold the next transfer.
TEST_F(CacheEngineDevicePoolTest, AGateTheEnginesStreamNeverOpensTimesOut) {
  engine_options_.device_copy_timeout = std::chrono::milliseconds(50);
  OpenWithDevice();
  PutPage(1);
  Ticket(0).gate_target.store(7);  // the stream would write 7; it never does
  Ticket(0).gate.store(6);
  ASSERT_OK(engine_->Load(kOwner, *ns_,
                          {.pages = {Page(1)},
                           .slots = {3},
                           .first_layer = 0,
                           .num_layers = 2,
                           .ticket = 0}));
  WaitFinished(0);
  const uint32_t parts =
      TestLayout().layers[0].parts.size() + TestLayout().layers[1].parts.size();
  ASSERT_EQ(Ticket(0).error_count.load(), parts);
  for (uint32_t e = 0; e < parts; ++e) {
    EXPECT_EQ(Ticket(0).errors[e].code,
              static_cast<uint8_t>(StatusCode::kBusy));
  }
  // device_layers still moved on: an engine's stream waiting on it goes on.
  EXPECT_EQ(Ticket(0).device_layers.load(), 2u);
  EngineStats st = engine_->Stats(*ns_);
  EXPECT_EQ(st.stream_gate_waits, 1u);
  EXPECT_EQ(st.stream_gate_timeouts, 1u);
  EXPECT_EQ(st.stream_gate_waiting, 0u);
  EXPECT_EQ(st.load_segments_host, 0u);

  // The next use of the ticket has no gate (target 0) and starts from the
  // device_layers the last one left.
  Ticket(0).gate_target.store(0);
  ASSERT_OK(engine_->Load(kOwner, *ns_,
                          {.pages = {Page(1)},
                           .slots = {3},
                           .first_layer = 0,
                           .num_layers = 2,
                           .ticket = 0}));
  WaitFinished(0);
  EXPECT_EQ(Ticket(0).error_count.load(), 0u);
  EXPECT_EQ(Ticket(0).device_layers.load(), 4u);
  st = engine_->Stats(*ns_);
  EXPECT_EQ(st.stream_gate_timeouts, 1u);
  EXPECT_EQ(st.load_segments_host, parts);
}

}  // namespace
}  // namespace tierkv::storage
