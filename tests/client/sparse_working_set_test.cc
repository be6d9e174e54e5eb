// Tests for the sparse working set (include/tierkv/sparse_working_set.h,
// client/sparse_working_set.cc and its slot policies): rows served in
// selection order from the slots, row copies only for misses, lru and topk
// replacement, protection, IndexShare groups and clear errors.
#include "tierkv/sparse_working_set.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <vector>

#include "storage/device/device_backend.h"
#include "tests/testing/status_matchers.h"

namespace tierkv {
namespace {

// Rows of a 3-layer model: layer 0 full, layer 1 shares its selection,
// layer 2 full; rows of 8, 8 and 16 bytes derived from (layer, token).
class Rows {
 public:
  explicit Rows(int32_t tokens) {
    const uint32_t bytes[] = {8, 8, 16};
    for (uint16_t l = 0; l < 3; ++l) {
      rows_[l].resize(static_cast<size_t>(tokens) * bytes[l]);
      for (size_t i = 0; i < rows_[l].size(); ++i) {
        rows_[l][i] = static_cast<std::byte>((i * 7 + l * 31) & 0xff);
      }
      row_bytes_[l] = bytes[l];
    }
  }
  static WorkingSetLayout Layout() { return {{0, 0, 2}, {8, 8, 16}}; }
  RowSource Source() {
    return [this](uint16_t layer, int32_t token) -> std::span<const std::byte> {
      const size_t b = row_bytes_[layer];
      if (token < 0 ||
          (static_cast<size_t>(token) + 1) * b > rows_[layer].size() ||
          missing_.count(token)) {
        return {};
      }
      return std::span(rows_[layer]).subspan(static_cast<size_t>(token) * b, b);
    };
  }
  // What Gather must produce for `ids` of `layer`.
  std::vector<std::byte> Expected(uint16_t layer,
                                  const std::vector<int32_t>& ids) const {
    std::vector<std::byte> out;
    for (int32_t id : ids) {
      const auto* row = rows_[layer].data() + size_t(id) * row_bytes_[layer];
      out.insert(out.end(), row, row + row_bytes_[layer]);
    }
    return out;
  }
  void Remove(int32_t token) { missing_[token] = true; }

 private:
  std::vector<std::byte> rows_[3];
  size_t row_bytes_[3];
  std::map<int32_t, bool> missing_;
};

std::vector<std::byte> GatherOf(SparseWorkingSet& ws, uint16_t layer,
                                size_t ids, size_t row_bytes) {
  std::vector<std::byte> out(ids * row_bytes);
  EXPECT_OK(ws.Gather(layer, out));
  return out;
}

// Every test runs with the slots in host memory and in (emulated) device
// memory: the same decisions and the same rows either way.
class SparseWorkingSetTest : public ::testing::TestWithParam<WorkingSetMemory> {
 protected:
  std::unique_ptr<SparseWorkingSet> Make(Rows& rows, WorkingSetOptions o) {
    o.memory = GetParam();
    o.device_backend = "emulated";
    auto ws = SparseWorkingSet::Create(Rows::Layout(), o, rows.Source());
    EXPECT_OK(ws);
    return ws.ok() ? std::move(ws).value() : nullptr;
  }
  bool on_device() const { return GetParam() == WorkingSetMemory::kDevice; }
};

INSTANTIATE_TEST_SUITE_P(Memory, SparseWorkingSetTest,
                         ::testing::Values(WorkingSetMemory::kHost,
                                           WorkingSetMemory::kDevice),
                         [](const auto& info) {
                           return info.param == WorkingSetMemory::kHost
                                      ? "Host"
                                      : "Device";
                         });

TEST_P(SparseWorkingSetTest, ServesEachLayerItsRowsInSelectionOrder) {
  Rows rows(1000);
  auto ws = Make(rows, {.slots = 16});
  const std::vector<int32_t> a = {900, 3, 41, 7};
  ASSERT_OK(ws->Select(0, a, 1000));
  EXPECT_EQ(GatherOf(*ws, 0, a.size(), 8), rows.Expected(0, a));
  EXPECT_EQ(GatherOf(*ws, 1, a.size(), 8), rows.Expected(1, a))
      << "the shared layer reads its own rows for its full layer's ids";
  const std::vector<int32_t> b = {5, 6};
  ASSERT_OK(ws->Select(2, b, 1000));
  EXPECT_EQ(GatherOf(*ws, 2, b.size(), 16), rows.Expected(2, b));
  // Group 0's selection is untouched by group 2's.
  EXPECT_EQ(GatherOf(*ws, 1, a.size(), 8), rows.Expected(1, a));
}

TEST_P(SparseWorkingSetTest, OnlyMissedRowsAreCopiedAndEachOnce) {
  Rows rows(100);
  auto ws = Make(rows, {.slots = 8});
  const std::vector<int32_t> a = {1, 2, 3};
  ASSERT_OK(ws->Select(0, a, 100));
  GatherOf(*ws, 0, 3, 8);
  GatherOf(*ws, 1, 3, 8);
  GatherOf(*ws, 0, 3, 8);  // gathered again: nothing more to copy
  EXPECT_EQ(ws->stats().misses, 3u);
  EXPECT_EQ(ws->stats().bytes_in, 3u * (8 + 8));
  const std::vector<int32_t> b = {3, 4, 1};
  ASSERT_OK(ws->Select(0, b, 100));
  EXPECT_EQ(GatherOf(*ws, 0, 3, 8), rows.Expected(0, b));
  EXPECT_EQ(GatherOf(*ws, 1, 3, 8), rows.Expected(1, b));
  const WorkingSetStats s = ws->stats();
  EXPECT_EQ(s.steps, 2u);
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.misses, 4u);
  EXPECT_EQ(s.bytes_in, 4u * (8 + 8));
}

TEST_P(SparseWorkingSetTest, LruReplacesTheLeastRecentlySelected) {
  Rows rows(100);
  auto ws = Make(rows, {.slots = 4, .policy = WorkingSetPolicy::kLru});
  ASSERT_OK(ws->Select(0, std::vector<int32_t>{0, 1}, 100));
  ASSERT_OK(ws->Select(0, std::vector<int32_t>{2, 3}, 100));
  ASSERT_OK(ws->Select(0, std::vector<int32_t>{0, 4}, 100));  // evicts 1
  EXPECT_EQ(ws->stats().evictions, 1u);
  const uint64_t hits = ws->stats().hits;
  ASSERT_OK(ws->Select(0, std::vector<int32_t>{0, 2, 3, 4}, 100));
  EXPECT_EQ(ws->stats().hits, hits + 4);
  ASSERT_OK(ws->Select(0, std::vector<int32_t>{1}, 100));
  EXPECT_EQ(ws->stats().hits, hits + 4) << "1 was evicted";
}

TEST_P(SparseWorkingSetTest, TopkKeepsWhatTheIndexerKeepsChoosing) {
  for (auto policy : {WorkingSetPolicy::kLru, WorkingSetPolicy::kTopk}) {
    Rows rows(100);
    auto ws = Make(
        rows,
        {.slots = 4, .policy = policy, .sink_tokens = 0, .recent_tokens = 0});
    // 10 and 11 keep coming back between one-off pairs.
    for (int32_t other : {20, 22, 24}) {
      ASSERT_OK(ws->Select(0, std::vector<int32_t>{10, 11}, 100));
      ASSERT_OK(ws->Select(0, std::vector<int32_t>{other, other + 1}, 100));
    }
    ASSERT_OK(ws->Select(0, std::vector<int32_t>{30, 31}, 100));
    const uint64_t hits = ws->stats().hits;
    ASSERT_OK(ws->Select(0, std::vector<int32_t>{10, 11}, 100));
    // LRU dropped the favourites for the newcomers; topk kept them.
    EXPECT_EQ(ws->stats().hits - hits,
              policy == WorkingSetPolicy::kTopk ? 2u : 0u)
        << WorkingSetPolicyName(policy);
  }
}

TEST_P(SparseWorkingSetTest, TopkEvictsSinksAndTheRecentWindowLast) {
  Rows rows(1000);
  auto ws = Make(rows, {.slots = 8,
                        .policy = WorkingSetPolicy::kTopk,
                        .sink_tokens = 2,
                        .recent_tokens = 4});
  int64_t context = 500;
  ASSERT_OK(
      ws->Select(0, std::vector<int32_t>{0, 1, 496, 497, 498, 499}, context));
  // Six newcomers selected once each, in pairs: sinks (0, 1) and the
  // window (496..499) stay; the newcomers churn through the other slots.
  for (int32_t base : {100, 200, 300}) {
    ASSERT_OK(ws->Select(0, std::vector<int32_t>{base, base + 1}, context));
  }
  const uint64_t hits = ws->stats().hits;
  ASSERT_OK(
      ws->Select(0, std::vector<int32_t>{0, 1, 496, 497, 498, 499}, context));
  EXPECT_EQ(ws->stats().hits - hits, 6u);
  // Three newcomers with two unprotected slots: the third takes a
  // protected token's slot rather than fail.
  const std::vector<int32_t> three = {450, 451, 452};
  ASSERT_OK(ws->Select(0, three, context));
  EXPECT_EQ(GatherOf(*ws, 0, 3, 8), rows.Expected(0, three));
  const uint64_t before = ws->stats().hits;
  ASSERT_OK(
      ws->Select(0, std::vector<int32_t>{0, 1, 496, 497, 498, 499}, context));
  EXPECT_EQ(ws->stats().hits - before, 5u);
}

TEST_P(SparseWorkingSetTest, BadSelectionsAreRefusedAndChangeNothing) {
  Rows rows(100);
  auto ws = Make(rows, {.slots = 4});
  ASSERT_OK(ws->Select(0, std::vector<int32_t>{1, 2}, 100));
  EXPECT_EQ(ws->Select(1, std::vector<int32_t>{1}, 100).code(),
            StatusCode::kInvalidArgument)
      << "layer 1 is a shared layer";
  EXPECT_EQ(ws->Select(0, std::vector<int32_t>{3, 3}, 100).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ws->Select(0, std::vector<int32_t>{100}, 100).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ws->Select(0, std::vector<int32_t>{1, 2, 3, 4, 5}, 100).code(),
            StatusCode::kInvalidArgument);
  rows.Remove(50);
  EXPECT_EQ(ws->Select(0, std::vector<int32_t>{50}, 100).code(),
            StatusCode::kNotFound);
  EXPECT_EQ(ws->stats().steps, 1u);
  EXPECT_EQ(GatherOf(*ws, 0, 2, 8), rows.Expected(0, {1, 2}));
  std::vector<std::byte> wrong(3);
  EXPECT_EQ(ws->Gather(0, wrong).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ws->Gather(2, std::span<std::byte>()).code(),
            StatusCode::kInvalidArgument)
      << "group 2 has no selection yet";
  EXPECT_FALSE(
      SparseWorkingSet::Create({{0, 2, 2}, {8, 8, 8}}, {}, rows.Source()).ok())
      << "layer 1 cannot follow a later layer";
  EXPECT_FALSE(
      SparseWorkingSet::Create(Rows::Layout(), {.decay = 1.0}, rows.Source())
          .ok());
}

TEST_P(SparseWorkingSetTest, SelectionCountsArePerPageAndFullLayer) {
  Rows rows(1000);
  auto ws = Make(rows, {.slots = 64, .page_tokens = 64});
  ASSERT_OK(ws->Select(0, std::vector<int32_t>{0, 63, 64, 700}, 1000));
  ASSERT_OK(ws->Select(0, std::vector<int32_t>{1, 701}, 1000));
  ASSERT_OK(ws->Select(2, std::vector<int32_t>{2}, 1000));
  const auto counts = ws->TakeSelectionCounts();
  ASSERT_EQ(counts.size(), 4u);
  auto at = [&](size_t i) {
    return std::tuple(counts[i].layer, counts[i].page, counts[i].count);
  };
  EXPECT_EQ(at(0), std::tuple(uint16_t{0}, 0u, 3u));
  EXPECT_EQ(at(1), std::tuple(uint16_t{0}, 1u, 1u));
  EXPECT_EQ(at(2), std::tuple(uint16_t{0}, 10u, 2u));
  EXPECT_EQ(at(3), std::tuple(uint16_t{2}, 0u, 1u));
  EXPECT_TRUE(ws->TakeSelectionCounts().empty());
}

// Whatever is evicted, every Gather returns exactly the source's rows.
TEST_P(SparseWorkingSetTest, RandomSelectionsAlwaysGatherTheSourceRows) {
  for (auto policy : {WorkingSetPolicy::kLru, WorkingSetPolicy::kTopk}) {
    Rows rows(3000);
    auto ws = Make(
        rows,
        {.slots = 40, .policy = policy, .sink_tokens = 2, .recent_tokens = 4});
    std::mt19937 rng(7);
    int64_t context = 2000;
    for (int step = 0; step < 300; ++step, ++context) {
      for (uint16_t full : {uint16_t{0}, uint16_t{2}}) {
        std::vector<int32_t> ids(static_cast<size_t>(context));
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        // A skewed pick: a hot set of 30 tokens plus the current one.
        ids.resize(std::uniform_int_distribution<size_t>(1, 20)(rng));
        for (auto& id : ids) {
          if (rng() % 2) id = static_cast<int32_t>(rng() % 30);
        }
        ids.push_back(static_cast<int32_t>(context - 1));
        std::sort(ids.begin(), ids.end());
        ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
        ASSERT_OK(ws->Select(full, ids, context));
        for (uint16_t l = full; l < (full == 0 ? 2 : 3); ++l) {
          const size_t b = l == 2 ? 16 : 8;
          ASSERT_EQ(GatherOf(*ws, l, ids.size(), b), rows.Expected(l, ids))
              << WorkingSetPolicyName(policy) << " step " << step;
        }
      }
    }
    EXPECT_GT(ws->stats().hits, 0u);
    EXPECT_GT(ws->stats().evictions, 0u);
  }
}

// Rows: the slots in place, each selected token's row at its slot; a hit
// copies nothing, a step's misses are one device gather per layer.
TEST_P(SparseWorkingSetTest, RowsAreTheSlotsInPlaceAndHitsAreNeverCopied) {
  Rows rows(100);
  auto ws = Make(rows, {.slots = 8});
  EXPECT_EQ(ws->buffer_backend(), on_device() ? "emulated" : "host");
  auto check = [&](uint16_t layer, const std::vector<int32_t>& ids) {
    auto in_place = ws->Rows(layer);
    ASSERT_OK(in_place);
    ASSERT_TRUE(in_place->host_addressable);
    ASSERT_EQ(in_place->slots.size(), ids.size());
    const auto want = rows.Expected(layer, ids);
    const uint32_t b = in_place->row_bytes;
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(std::memcmp(in_place->base + size_t{in_place->slots[i]} * b,
                            want.data() + i * b, b),
                0)
          << "layer " << layer << " id " << ids[i];
    }
  };
  const std::vector<int32_t> a = {5, 9, 2};
  ASSERT_OK(ws->Select(0, a, 100));
  check(0, a);
  check(1, a);
  const WorkingSetStats first = ws->stats();
  EXPECT_EQ(first.gathers, on_device() ? 2u : 0u) << "one per layer";
  const std::vector<int32_t> same = {2, 5, 9};
  ASSERT_OK(ws->Select(0, same, 100));
  check(0, same);
  check(1, same);
  EXPECT_EQ(ws->stats().bytes_in, first.bytes_in) << "hits copy nothing";
  EXPECT_EQ(ws->stats().gathers, first.gathers);
  EXPECT_EQ(ws->Rows(2).status().code(), StatusCode::kInvalidArgument)
      << "group 2 has no selection yet";
}

TEST_P(SparseWorkingSetTest, SourceMemoryIsRegisteredOnceOnADevice) {
  Rows rows(100);
  auto ws = Make(rows, {.slots = 8});
  std::vector<std::byte> arena(1 << 16);
  ASSERT_OK(ws->RegisterSourceMemory(arena));
  const auto again = ws->RegisterSourceMemory(std::span(arena).subspan(64));
  if (on_device()) {
    EXPECT_EQ(again.code(), StatusCode::kAlreadyExists);
  } else {
    EXPECT_OK(again);  // a host buffer needs no registration
  }
}

// An engine thread on device 2 (cudaSetDevice(2)) gets its slots on
// device 2 by default, and every call leaves device 2 current.
TEST(SparseWorkingSetDeviceTest, TheSlotsGoOnTheCallersCurrentDevice) {
  Rows rows(100);
  storage::SetEmulatedCurrentDevice(2);
  auto ws = SparseWorkingSet::Create(Rows::Layout(),
                                     {.slots = 8,
                                      .memory = WorkingSetMemory::kDevice,
                                      .device_backend = "emulated"},
                                     rows.Source());
  ASSERT_OK(ws);
  EXPECT_EQ((*ws)->buffer_device(), 2);
  const std::vector<int32_t> ids = {7, 3};
  ASSERT_OK((*ws)->Select(0, ids, 100));
  EXPECT_EQ(GatherOf(**ws, 0, ids.size(), 8), rows.Expected(0, ids));
  EXPECT_EQ(storage::EmulatedCurrentDevice(), 2);
  // An explicit ordinal still wins, and is made current only inside calls.
  auto on_1 = SparseWorkingSet::Create(Rows::Layout(),
                                       {.slots = 8,
                                        .memory = WorkingSetMemory::kDevice,
                                        .device_backend = "emulated",
                                        .device = 1},
                                       rows.Source());
  ASSERT_OK(on_1);
  EXPECT_EQ((*on_1)->buffer_device(), 1);
  ASSERT_OK((*on_1)->Select(0, ids, 100));
  EXPECT_EQ(GatherOf(**on_1, 0, ids.size(), 8), rows.Expected(0, ids));
  EXPECT_EQ(storage::EmulatedCurrentDevice(), 2);
  ws->reset();
  on_1->reset();
  storage::SetEmulatedCurrentDevice(0);
}

// Stream-ordered Rows: each step's misses are gathered on the engine's
// stream, after the engine's previous readers of the slots and before its
// next, and Rows returns without a host wait. The engine's first reader is
// held on its stream while eight more steps are selected, each replacing
// every slot: were the gathers not ordered behind it, they would overwrite
// the rows it has yet to read (and a host wait would hang behind it).
TEST(SparseWorkingSetDeviceTest, RowsOnTheEnginesStreamAreOrderedWithIt) {
  Rows rows(1000);
  auto ws = SparseWorkingSet::Create(Rows::Layout(),
                                     {.slots = 4,
                                      .memory = WorkingSetMemory::kDevice,
                                      .device_backend = "emulated"},
                                     rows.Source());
  ASSERT_OK(ws);
  // The engine's device and stream (CUDA: its cudaStream_t).
  auto engine = storage::OpenEmulatedBackend({.streams = 1});
  ASSERT_OK(engine);
  const EngineStream stream{.handle = engine->get()};
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  std::vector<std::string> wrong;  // what the engine's readers saw amiss
  constexpr int kSteps = 9;
  std::mt19937 rng(5);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<int32_t> ids(1000);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(4);
    ASSERT_OK((*ws)->Select(0, ids, 1000));
    auto r = (*ws)->Rows(0, stream);
    ASSERT_OK(r);
    // The engine's attention for this step: reads the slots in place.
    std::vector<uint32_t> slots(r->slots.begin(), r->slots.end());
    ASSERT_OK((*engine)->LaunchHostFunction(
        0, [&, step, base = r->base, row_bytes = r->row_bytes, slots,
            want = rows.Expected(0, ids)] {
          std::unique_lock lock(mu);
          if (step == 0) cv.wait(lock, [&] { return go; });
          std::vector<std::byte> got;
          for (uint32_t slot : slots) {
            got.insert(got.end(), base + size_t{slot} * row_bytes,
                       base + size_t{slot + 1} * row_bytes);
          }
          if (got != want) wrong.push_back(fmt::format("step {}", step));
        }));
  }
  // Every step was queued while the first reader still held the stream:
  // layer 0's gathers, and layer 1's (it shares layer 0's selection) that
  // each next Select owed, on the same stream.
  EXPECT_EQ((*ws)->stats().gathers, uint64_t{2 * kSteps - 1});
  {
    std::lock_guard lock(mu);
    go = true;
  }
  cv.notify_all();
  auto all = (*engine)->RecordEvent(0);
  ASSERT_OK(all);
  ASSERT_OK((*engine)->WaitEvent(*all, std::chrono::seconds(10)));
  std::lock_guard lock(mu);
  EXPECT_TRUE(wrong.empty()) << wrong.size() << " readers saw other rows, "
                             << "first at " << wrong.front();
}

// Without a stream after stream-ordered steps: the host read waits for
// the gathers still queued on the engine's stream.
TEST(SparseWorkingSetDeviceTest, AHostReadAfterStreamOrderedRowsSeesThem) {
  Rows rows(100);
  auto ws = SparseWorkingSet::Create(Rows::Layout(),
                                     {.slots = 4,
                                      .memory = WorkingSetMemory::kDevice,
                                      .device_backend = "emulated"},
                                     rows.Source());
  ASSERT_OK(ws);
  auto engine = storage::OpenEmulatedBackend({.streams = 1});
  ASSERT_OK(engine);
  const std::vector<int32_t> ids = {9, 3, 50, 7};
  ASSERT_OK((*ws)->Select(0, ids, 100));
  ASSERT_OK((*ws)->Rows(0, EngineStream{.handle = engine->get()}));
  EXPECT_EQ(GatherOf(**ws, 0, ids.size(), 8), rows.Expected(0, ids));
  // A host buffer has no stream to order on.
  auto host = SparseWorkingSet::Create(Rows::Layout(), {}, rows.Source());
  ASSERT_OK(host);
  ASSERT_OK((*host)->Select(0, ids, 100));
  EXPECT_EQ(
      (*host)->Rows(0, EngineStream{.handle = engine->get()}).status().code(),
      StatusCode::kInvalidArgument);
  auto sync = (*engine)->RecordEvent(0);
  ASSERT_OK(sync);
  ASSERT_OK((*engine)->WaitEvent(*sync, std::chrono::seconds(10)));
}

TEST(SparseWorkingSetDeviceTest, AnUnknownOrMissingDeviceIsAClearError) {
  Rows rows(10);
  auto unknown = SparseWorkingSet::Create(
      Rows::Layout(),
      {.memory = WorkingSetMemory::kDevice, .device_backend = "tpu"},
      rows.Source());
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  // This machine has no GPU (CI never has one): "auto" emulates and says
  // why, "cuda" refuses.
  auto any = SparseWorkingSet::Create(
      Rows::Layout(), {.memory = WorkingSetMemory::kDevice}, rows.Source());
  ASSERT_OK(any);
  if ((*any)->buffer_backend() == "emulated") {
    EXPECT_FALSE((*any)->buffer_fallback().empty());
    auto cuda = SparseWorkingSet::Create(
        Rows::Layout(),
        {.memory = WorkingSetMemory::kDevice, .device_backend = "cuda"},
        rows.Source());
    EXPECT_EQ(cuda.status().code(), StatusCode::kUnavailable);
  }
}

}  // namespace
}  // namespace tierkv
