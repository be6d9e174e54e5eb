// Model weights through a real tierkvd (client/weights_client.cc,
// client/weights_import.cc): PutWeights / LoadWeights round trips, per-layer
// readiness, dedup, list and drop, a chunk the daemon lacks, and
// ImportSafetensors of a file the project's own writer wrote.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "common/safetensors.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/sync_points.h"
#include "tests/testing/temp_dir.h"
#include "tierkv/client.h"

namespace tierkv {
namespace {

using testing::DaemonProcess;

constexpr char kToken[] = "weights-test-token";
// A weights namespace needs 256 MiB of DRAM (config.h, kMinWeightsHostBytes).
constexpr char kConfig[] = R"(
[[namespace]]
name = "weights"
token = "weights-test-token"
host_bytes = "256MiB"
weights = true
)";

std::vector<std::byte> Bytes(size_t n, uint64_t seed) {
  std::vector<std::byte> out(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    out[i] = static_cast<std::byte>(x >> 56);
  }
  return out;
}

// A tensor of `bytes` bytes for the test to keep alive.
struct Owned {
  std::string name;
  uint32_t layer;
  std::vector<std::byte> data;
};

std::vector<WeightsTensorData> Describe(const std::vector<Owned>& owned) {
  std::vector<WeightsTensorData> out;
  for (const Owned& t : owned) {
    out.push_back({.tensor = {.name = t.name,
                              .dtype = "U8",
                              .shape = {static_cast<int64_t>(t.data.size())},
                              .layer = t.layer},
                   .data = t.data});
  }
  return out;
}

// Every tensor's bytes at its offset in `image`.
void ExpectTensorsIn(const WeightsManifest& m, const std::vector<Owned>& owned,
                     std::span<const std::byte> image,
                     uint32_t only_layer = UINT32_MAX) {
  ASSERT_EQ(m.tensors.size(), owned.size());
  for (size_t i = 0; i < owned.size(); ++i) {
    const WeightsTensor& t = m.tensors[i];
    if (only_layer != UINT32_MAX && t.layer != only_layer) continue;
    ASSERT_EQ(t.name, owned[i].name);
    ASSERT_EQ(t.bytes, owned[i].data.size());
    EXPECT_EQ(
        std::memcmp(image.data() + t.offset, owned[i].data.data(), t.bytes), 0)
        << "tensor " << t.name << " differs";
  }
}

class WeightsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_OK(daemon_.Start({.config_toml = kConfig})); }

  std::unique_ptr<Client> Open(ClientOptions options = {}) {
    options.socket_path = daemon_.socket_path();
    auto c = Client::Connect(options);
    EXPECT_OK(c.status());
    if (!c.ok()) return nullptr;
    EXPECT_OK((*c)->OpenNamespace("weights", kToken));
    return std::move(c).value();
  }

  // Several layers: packs of small tensors, 1 MiB-plus tensors of their
  // own, and a layer gap-free load order.
  static std::vector<Owned> SmallModel(uint64_t seed) {
    std::vector<Owned> t;
    t.push_back({"model.embed_tokens.weight", 0, Bytes(3000, seed + 1)});
    for (uint32_t l = 0; l < 4; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      t.push_back({p + "input_layernorm.weight", l, Bytes(512, seed + 10 + l)});
      t.push_back({p + "mlp.up_proj.weight", l,
                   Bytes((1 << 20) + 333 * l, seed + 20 + l)});
      t.push_back({p + "self_attn.o_proj.bias", l, Bytes(77, seed + 30 + l)});
    }
    t.push_back({"model.norm.weight", 3, Bytes(640, seed + 2)});
    return t;
  }

  DaemonProcess daemon_;
};

TEST_F(WeightsTest, PutThenLoadIsBitExactAcrossLayersAndPacks) {
  auto c = Open();
  const auto owned = SmallModel(1);
  WeightsPutStats stats;
  auto m =
      c->PutWeights("small", "test/u8/rank0-of-1", Describe(owned), &stats);
  ASSERT_OK(m);
  EXPECT_EQ(m->num_layers, 4u);
  EXPECT_EQ(stats.chunks_stored, m->chunks.size());
  EXPECT_EQ(stats.chunks_deduplicated, 0u);

  // The daemon hands back the same manifest, newest version by default.
  auto fetched =
      c->GetWeightsManifest({.model = "small", .layout = "test/u8/rank0-of-1"});
  ASSERT_OK(fetched);
  EXPECT_EQ(*fetched, *m);

  std::vector<std::byte> image(m->image_bytes, std::byte{0xAB});
  auto load = c->LoadWeights(*fetched, image);
  ASSERT_OK(load);
  ASSERT_OK(load->Wait());
  EXPECT_EQ(load->LayersDone(), 4u);
  ExpectTensorsIn(*m, owned, image);
}

TEST_F(WeightsTest, TensorLargerThanOneChunkRoundTrips) {
  auto c = Open();
  std::vector<Owned> owned;
  owned.push_back({"model.layers.0.mlp.experts.weight", 0,
                   Bytes(kWeightsMaxChunkBytes + 12345, 7)});
  owned.push_back({"model.layers.0.mlp.gate.weight", 0, Bytes(999, 8)});
  auto m = c->PutWeights("big", "test/u8/rank0-of-1", Describe(owned));
  ASSERT_OK(m);
  ASSERT_EQ(m->chunks.size(), 3u);  // 64 MiB, the rest, and a pack
  EXPECT_EQ(m->chunks[0].bytes, kWeightsMaxChunkBytes);
  std::vector<std::byte> image(m->image_bytes);
  auto load = c->LoadWeights(*m, image);
  ASSERT_OK(load);
  ASSERT_OK(load->WaitLayer(0));
  ExpectTensorsIn(*m, owned, image);
}

// The loader is held before layer 1 (a sync point): layer 0 is complete,
// WaitLayer(0) returns OK and LayersDone() is 1 while layer 1's bytes are
// still untouched. Then it goes on.
TEST_F(WeightsTest, LayerZeroIsReadyWhileLaterLayersAreStillLoading) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  auto c = Open();
  const auto owned = SmallModel(2);
  auto m = c->PutWeights("small", "l", Describe(owned));
  ASSERT_OK(m);

  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  testing::ScopedSyncPoints sync;
  sync.SetCallback("WeightsLoad::BeforeLayer", [&](void* arg) {
    if (*static_cast<uint32_t*>(arg) != 1) return;
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return release; });
  });

  std::vector<std::byte> image(m->image_bytes, std::byte{0xAB});
  auto load = c->LoadWeights(*m, image);
  ASSERT_OK(load);
  ASSERT_OK(load->WaitLayer(0));
  EXPECT_EQ(load->LayersDone(), 1u);
  ExpectTensorsIn(*m, owned, image, /*only_layer=*/0);
  const auto [first1, last1] = m->ChunksOfLayer(1);
  for (size_t ch = first1; ch < last1; ++ch) {
    const auto bytes =
        std::span(image).subspan(m->chunks[ch].offset, m->chunks[ch].bytes);
    EXPECT_TRUE(std::all_of(bytes.begin(), bytes.end(), [](std::byte b) {
      return b == std::byte{0xAB};
    })) << "layer 1 was written before the loader got to it";
  }
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  ASSERT_OK(load->Wait());
  ExpectTensorsIn(*m, owned, image);
}

TEST_F(WeightsTest, SecondModelCopiesOnlyTheChunksItDoesNotShare) {
  auto c = Open();
  // Tensors of >= 1 MiB are chunks of their own, so sharing a tensor
  // means sharing a chunk.
  std::vector<Owned> a, b;
  for (uint32_t l = 0; l < 4; ++l) {
    a.push_back({"layers." + std::to_string(l) + ".w", l,
                 Bytes(kWeightsSmallTensorBytes + l, 100 + l)});
    // b shares layers 0 and 1 and differs in 2 and 3.
    b.push_back({"layers." + std::to_string(l) + ".w", l,
                 Bytes(kWeightsSmallTensorBytes + l, (l < 2 ? 100 : 200) + l)});
  }
  WeightsPutStats first, second;
  ASSERT_OK(c->PutWeights("teacher-a", "l", Describe(a), &first).status());
  EXPECT_EQ(first.chunks_stored, 4u);
  auto mb = c->PutWeights("teacher-b", "l", Describe(b), &second);
  ASSERT_OK(mb);
  EXPECT_EQ(second.chunks_deduplicated, 2u);
  EXPECT_EQ(second.chunks_stored, 2u);
  EXPECT_EQ(second.bytes_stored, 2 * kWeightsSmallTensorBytes + 2 + 3);

  // B reads back as B, shared chunks included.
  std::vector<std::byte> image(mb->image_bytes);
  auto load = c->LoadWeights(*mb, image);
  ASSERT_OK(load);
  ASSERT_OK(load->Wait());
  ExpectTensorsIn(*mb, b, image);

  // Storing A again copies nothing.
  WeightsPutStats again;
  ASSERT_OK(c->PutWeights("teacher-a", "l", Describe(a), &again).status());
  EXPECT_EQ(again.chunks_stored, 0u);
  EXPECT_EQ(again.chunks_deduplicated, 4u);
}

// Two ranks store the same tensor at once: the second finds its chunk
// reserved by the first (Busy), puts it again once the first committed,
// and finds it stored. Both seal.
TEST_F(WeightsTest, PutOfAChunkAnotherClientIsStoringWaitsForIt) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  auto a = Open();
  auto b = Open();
  std::vector<Owned> shared;
  shared.push_back(
      {"layers.0.replicated", 0, Bytes(kWeightsSmallTensorBytes, 77)});

  std::mutex mu;
  std::condition_variable cv;
  bool a_reserved = false, b_saw_busy = false;
  std::thread::id a_thread;
  testing::ScopedSyncPoints sync;
  sync.SetCallback("Client::Put:Reserved", [&](void*) {
    std::unique_lock lock(mu);
    if (std::this_thread::get_id() != a_thread) return;
    a_reserved = true;
    cv.notify_all();
    // A bounded wait only so that a daemon that never answers Busy fails
    // the test below instead of hanging it.
    cv.wait_for(lock, std::chrono::seconds(20), [&] { return b_saw_busy; });
  });
  sync.SetCallback("WeightsPut::RetryingBusy", [&](void*) {
    std::lock_guard lock(mu);
    b_saw_busy = true;
    cv.notify_all();
  });

  Result<WeightsManifest> from_a = Status::Internal("not run");
  std::thread rank_a([&] {
    {
      std::lock_guard lock(mu);
      a_thread = std::this_thread::get_id();
    }
    from_a = a->PutWeights("replica", "rank0", Describe(shared));
  });
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return a_reserved; });
  }
  WeightsPutStats stats;
  auto from_b = b->PutWeights("replica", "rank1", Describe(shared), &stats);
  rank_a.join();
  ASSERT_OK(from_a);
  ASSERT_OK(from_b);
  EXPECT_TRUE(b_saw_busy);
  EXPECT_EQ(stats.chunks_stored, 0u);
  EXPECT_EQ(stats.chunks_deduplicated, 1u);
}

TEST_F(WeightsTest, ListShowsSealedShardsAndDropRemovesThem) {
  auto c = Open();
  const auto owned = SmallModel(3);
  auto m0 = c->PutWeights("m", "rank0", Describe(owned));
  auto m1 = c->PutWeights("m", "rank1", Describe(SmallModel(4)));
  auto other = c->PutWeights("other", "rank0", Describe(SmallModel(5)));
  ASSERT_OK(m0);
  ASSERT_OK(m1);
  ASSERT_OK(other);

  auto all = c->ListWeights();
  ASSERT_OK(all);
  EXPECT_EQ(all->size(), 3u);
  auto of_m = c->ListWeights("m");
  ASSERT_OK(of_m);
  ASSERT_EQ(of_m->size(), 2u);
  std::set<std::string> layouts;
  for (const WeightsInfo& info : *of_m) {
    EXPECT_EQ(info.id.model, "m");
    layouts.insert(info.id.layout);
    if (info.id.layout == "rank0") {
      EXPECT_EQ(info.id.version, WeightsVersionOf(*m0));
      EXPECT_EQ(info.image_bytes, m0->image_bytes);
      EXPECT_EQ(info.tensors, m0->tensors.size());
      EXPECT_EQ(info.chunks, m0->chunks.size());
      EXPECT_EQ(info.num_layers, 4u);
      EXPECT_EQ(info.chunks_missing, 0u);
    }
  }
  EXPECT_EQ(layouts, (std::set<std::string>{"rank0", "rank1"}));

  auto dropped = c->DropWeights({.model = "m", .layout = "rank0"});
  ASSERT_OK(dropped);
  EXPECT_EQ(dropped->shards, 1u);
  EXPECT_GT(dropped->freed_bytes, 0u);
  auto gone = c->GetWeightsManifest({.model = "m", .layout = "rank0"});
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
  ASSERT_OK(c->GetWeightsManifest({.model = "m", .layout = "rank1"}).status());

  // Every layout of a model at once; a second drop finds nothing.
  dropped = c->DropWeights({.model = "m"});
  ASSERT_OK(dropped);
  EXPECT_EQ(dropped->shards, 1u);
  EXPECT_EQ(c->DropWeights({.model = "m"}).status().code(),
            StatusCode::kNotFound);
  auto left = c->ListWeights();
  ASSERT_OK(left);
  ASSERT_EQ(left->size(), 1u);
  EXPECT_EQ((*left)[0].id.model, "other");
}

// A manifest naming a chunk the daemon never stored (as one evicted past
// the NVMe budget would be): that layer fails, naming the chunk and the
// layer; the layers around it load.
TEST_F(WeightsTest, MissingChunkFailsOnlyItsLayerAndSaysWhich) {
  auto c = Open();
  const auto owned = SmallModel(6);
  auto m = c->PutWeights("small", "l", Describe(owned));
  ASSERT_OK(m);
  WeightsManifest damaged = *m;
  const auto [first, last] = damaged.ChunksOfLayer(2);
  ASSERT_LT(first, last);
  damaged.chunks[first].key = PageHash{0x1234, 0x5678};

  std::vector<std::byte> image(m->image_bytes);
  auto load = c->LoadWeights(damaged, image);
  ASSERT_OK(load);
  ASSERT_OK(load->WaitLayer(0));
  ASSERT_OK(load->WaitLayer(1));
  const Status s = load->WaitLayer(2);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  const std::string want =
      "chunk " + PageHash{0x1234, 0x5678}.ToHex() + " of layer 2 is in no tier";
  EXPECT_NE(s.message().find(want), std::string::npos) << s.ToString();
  ASSERT_OK(load->WaitLayer(3));
  EXPECT_EQ(load->Wait().code(), StatusCode::kNotFound);
  EXPECT_EQ(load->WaitLayer(4).code(), StatusCode::kInvalidArgument);
}

TEST_F(WeightsTest, LoadRefusesASmallImageAndLayersOutsideTheShard) {
  auto c = Open();
  auto m = c->PutWeights("small", "l", Describe(SmallModel(7)));
  ASSERT_OK(m);
  std::vector<std::byte> small(m->image_bytes - 1);
  EXPECT_EQ(c->LoadWeights(*m, small).status().code(),
            StatusCode::kInvalidArgument);
  std::vector<std::byte> image(m->image_bytes);
  EXPECT_EQ(c->LoadWeights(*m, image, {.first = 4}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c->LoadWeights(*m, image, {.first = 2, .count = 3}).status().code(),
            StatusCode::kInvalidArgument);
  // A sub-range loads only its layers.
  auto part = c->LoadWeights(*m, image, {.first = 1, .count = 2});
  ASSERT_OK(part);
  EXPECT_EQ(part->WaitLayer(0).code(), StatusCode::kInvalidArgument);
  ASSERT_OK(part->Wait());
  EXPECT_EQ(part->LayersDone(), 2u);
}

TEST_F(WeightsTest, PutNamesTheTensorWhoseSizeIsWrong) {
  auto c = Open();
  auto owned = SmallModel(8);
  auto tensors = Describe(owned);
  tensors[2].tensor.bytes = 5;
  auto m = c->PutWeights("small", "l", tensors);
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find(owned[2].name), std::string::npos);
  EXPECT_EQ(c->ListWeights()->size(), 0u);  // nothing sealed
}

TEST_F(WeightsTest, PrefetchOfAnUnknownShardIsNotFound) {
  auto c = Open();
  EXPECT_EQ(c->PrefetchWeights({.model = "nope", .layout = "l"}).code(),
            StatusCode::kNotFound);
  auto m = c->PutWeights("small", "l", Describe(SmallModel(9)));
  ASSERT_OK(m);
  ASSERT_OK(c->PrefetchWeights({.model = "small", .layout = "l"},
                               {.first = 1, .count = 2}));
}

// Batches smaller than a chunk: every chunk is put and read one by one.
TEST_F(WeightsTest, TinyBatchesStillRoundTrip) {
  auto c = Open({.weights_batch_bytes = 1});
  const auto owned = SmallModel(10);
  auto m = c->PutWeights("small", "l", Describe(owned));
  ASSERT_OK(m);
  std::vector<std::byte> image(m->image_bytes);
  auto load = c->LoadWeights(*m, image);
  ASSERT_OK(load);
  ASSERT_OK(load->Wait());
  ExpectTensorsIn(*m, owned, image);
}

TEST_F(WeightsTest, ImportSafetensorsGroupsByLayerNumberInFileOrder) {
  testing::TempDir dir;
  // Written in this order: embeddings, layers 1 then 0 (file order is not
  // layer order), the final norm and the head.
  const std::vector<RawTensor> raw = {
      {"model.embed_tokens.weight", "BF16", {64, 8}, Bytes(1024, 1)},
      {"model.layers.1.mlp.down_proj.weight",
       "F32",
       {512, 512},
       Bytes(512 * 512 * 4, 2)},
      {"model.layers.1.input_layernorm.weight", "BF16", {8}, Bytes(16, 3)},
      {"model.layers.0.mlp.down_proj.weight",
       "F32",
       {512, 512},
       Bytes(512 * 512 * 4, 4)},
      {"model.layers.0.input_layernorm.weight", "BF16", {8}, Bytes(16, 5)},
      {"model.norm.weight", "BF16", {8}, Bytes(16, 6)},
      {"lm_head.weight", "BF16", {64, 8}, Bytes(1024, 7)},
  };
  ASSERT_OK(WriteSafetensors(dir.File("model.safetensors"), raw));

  auto c = Open();
  WeightsPutStats stats;
  auto m =
      ImportSafetensors(*c, "tiny", "hf/mixed/rank0-of-1", dir.path(), &stats);
  ASSERT_OK(m);
  std::vector<std::pair<std::string, uint32_t>> order;
  for (const WeightsTensor& t : m->tensors) order.emplace_back(t.name, t.layer);
  const std::vector<std::pair<std::string, uint32_t>> want = {
      {"model.embed_tokens.weight", 0},
      {"model.layers.0.mlp.down_proj.weight", 0},
      {"model.layers.0.input_layernorm.weight", 0},
      {"model.layers.1.mlp.down_proj.weight", 1},
      {"model.layers.1.input_layernorm.weight", 1},
      {"model.norm.weight", 1},
      {"lm_head.weight", 1},
  };
  EXPECT_EQ(order, want);
  EXPECT_EQ(m->tensors[3].dtype, "F32");
  EXPECT_EQ(m->tensors[3].shape, (std::vector<int64_t>{512, 512}));

  std::vector<std::byte> image(m->image_bytes);
  auto load = c->LoadWeights(*m, image);
  ASSERT_OK(load);
  ASSERT_OK(load->Wait());
  for (const WeightsTensor& t : m->tensors) {
    const auto it = std::find_if(raw.begin(), raw.end(), [&](const auto& r) {
      return r.name == t.name;
    });
    ASSERT_NE(it, raw.end());
    EXPECT_EQ(std::memcmp(image.data() + t.offset, it->bytes.data(), t.bytes),
              0)
        << t.name;
  }
  // The same file again is the same version, and copies nothing.
  WeightsPutStats again;
  auto m2 = ImportSafetensors(*c, "tiny", "hf/mixed/rank0-of-1",
                              dir.File("model.safetensors"), &again);
  ASSERT_OK(m2);
  EXPECT_EQ(WeightsVersionOf(*m2), WeightsVersionOf(*m));
  EXPECT_EQ(again.chunks_stored, 0u);
}

// With an NVMe tier (write_through), a shard outlives the daemon: after a
// restart its manifest is still sealed and its chunks, now only on NVMe,
// are promoted back into DRAM by the loader's Gets.
TEST(WeightsRestartTest, ShardLoadsFromNvmeAfterADaemonRestart) {
  testing::TempDir data("/var/tmp");  // O_DIRECT: not tmpfs
  const std::string config = "[nvme]\npath = \"" + data.File("nvme.data") +
                             "\"\ncapacity_bytes = \"128MiB\"\n" +
                             std::string(kConfig) +
                             "write_policy = \"write_through\"\n";
  std::vector<Owned> owned;
  for (uint32_t l = 0; l < 3; ++l) {
    owned.push_back({"layers." + std::to_string(l) + ".w", l,
                     Bytes(kWeightsSmallTensorBytes + 100 * l, 40 + l)});
    owned.push_back(
        {"layers." + std::to_string(l) + ".norm", l, Bytes(300, 50 + l)});
  }
  auto connect = [](const DaemonProcess& d) {
    auto c = Client::Connect({.socket_path = d.socket_path()});
    EXPECT_OK(c.status());
    EXPECT_OK((*c)->OpenNamespace("weights", kToken));
    return std::move(c).value();
  };
  WeightsManifest stored;
  {
    DaemonProcess first;
    ASSERT_OK(first.Start({.config_toml = config}));
    auto m = connect(first)->PutWeights("durable", "l", Describe(owned));
    ASSERT_OK(m);
    stored = *m;
    first.Stop(SIGTERM);
  }
  DaemonProcess second;
  ASSERT_OK(second.Start({.config_toml = config}));
  auto c = connect(second);
  auto listed = c->ListWeights("durable");
  ASSERT_OK(listed);
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].chunks_missing, 0u);
  auto m = c->GetWeightsManifest({.model = "durable", .layout = "l"});
  ASSERT_OK(m);
  EXPECT_EQ(*m, stored);
  std::vector<std::byte> image(m->image_bytes);
  auto load = c->LoadWeights(*m, image);
  ASSERT_OK(load);
  ASSERT_OK(load->Wait());
  ExpectTensorsIn(*m, owned, image);
}

// A sharded checkpoint (model.safetensors.index.json): file order runs
// through the shards in name order, and layers split across shards are
// regrouped.
TEST_F(WeightsTest, ImportSafetensorsReadsAShardedCheckpointDirectory) {
  testing::TempDir dir;
  const std::vector<RawTensor> first = {
      {"model.embed_tokens.weight", "U8", {64}, Bytes(64, 1)},
      {"model.layers.0.w", "U8", {100}, Bytes(100, 2)},
      {"model.layers.1.a", "U8", {100}, Bytes(100, 3)}};
  const std::vector<RawTensor> second = {
      {"model.layers.1.b", "U8", {100}, Bytes(100, 4)},
      {"model.norm.weight", "U8", {8}, Bytes(8, 5)}};
  ASSERT_OK(
      WriteSafetensors(dir.File("model-00001-of-00002.safetensors"), first));
  ASSERT_OK(
      WriteSafetensors(dir.File("model-00002-of-00002.safetensors"), second));
  {
    std::ofstream index(dir.File("model.safetensors.index.json"));
    index
        << R"({"metadata": {}, "weight_map": {)"
        << R"("model.embed_tokens.weight": "model-00001-of-00002.safetensors",)"
        << R"("model.layers.0.w": "model-00001-of-00002.safetensors",)"
        << R"("model.layers.1.a": "model-00001-of-00002.safetensors",)"
        << R"("model.layers.1.b": "model-00002-of-00002.safetensors",)"
        << R"("model.norm.weight": "model-00002-of-00002.safetensors"}})";
  }
  auto c = Open();
  auto m = ImportSafetensors(*c, "sharded", "hf/u8/rank0-of-1", dir.path());
  ASSERT_OK(m);
  std::vector<std::pair<std::string, uint32_t>> order;
  for (const WeightsTensor& t : m->tensors) order.emplace_back(t.name, t.layer);
  const std::vector<std::pair<std::string, uint32_t>> want = {
      {"model.embed_tokens.weight", 0}, {"model.layers.0.w", 0},
      {"model.layers.1.a", 1},          {"model.layers.1.b", 1},
      {"model.norm.weight", 1},
  };
  EXPECT_EQ(order, want);
  std::vector<std::byte> image(m->image_bytes);
  auto load = c->LoadWeights(*m, image);
  ASSERT_OK(load);
  ASSERT_OK(load->Wait());
  EXPECT_EQ(std::memcmp(image.data() + m->tensors[3].offset,
                        second[0].bytes.data(), 100),
            0);
}

TEST_F(WeightsTest, ImportOfAMissingPathIsNotFound) {
  auto c = Open();
  auto m = ImportSafetensors(*c, "tiny", "l", "/nonexistent/x.safetensors");
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace tierkv
