// Weights shards (issue 28) against a real tierkvd with an NVMe tier:
// chunks stored with the existing Client::Put into a `weights = true`
// namespace, then sealed, looked up, listed, prefetched and dropped with raw
// kWeights* frames (the client API for them is built on another branch);
// chunks checked against their keys at commit; manifests back after a
// restart; KV namespaces unaffected.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "tests/client/client_test_util.h"
#include "tests/client/test_shards.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tierkv/weights.h"
#include "transport/protocol.h"
#include "transport/uds_channel.h"

namespace tierkv::testing {
namespace {

using transport::Opcode;

// One connection speaking raw protocol frames, bound to a namespace.
class RawConnection {
 public:
  static Result<RawConnection> Open(const std::string& socket,
                                    const std::string& ns,
                                    const std::string& token) {
    auto ch = transport::UdsChannel::Connect(socket, std::chrono::seconds(5));
    if (!ch.ok()) return ch.status();
    RawConnection c(std::move(ch).value());
    auto reply = c.channel_->Call(
        static_cast<uint16_t>(Opcode::kOpenNamespace),
        transport::Encode(transport::OpenNamespaceRequest{ns, token}));
    if (!reply.ok()) return reply.status();
    if (reply->fd >= 0) ::close(reply->fd);  // the arena: not needed here
    transport::OpenNamespaceResponse resp;
    TIERKV_RETURN_IF_ERROR(transport::Decode(reply->payload, resp));
    TIERKV_RETURN_IF_ERROR(resp.status);
    return c;
  }

  // Sends `request` as `op` and decodes the reply as a Response.
  template <typename Response, typename Request>
  Result<Response> Call(Opcode op, const Request& request) {
    return CallBytes<Response>(op, transport::Encode(request));
  }
  template <typename Response>
  Result<Response> CallBytes(Opcode op, std::span<const std::byte> payload) {
    auto reply = channel_->Call(static_cast<uint16_t>(op), payload);
    if (!reply.ok()) return reply.status();
    if (reply->fd >= 0) ::close(reply->fd);
    Response resp;
    TIERKV_RETURN_IF_ERROR(transport::Decode(reply->payload, resp));
    return resp;
  }

  Result<transport::WeightsSealResponse> Seal(
      std::span<const std::byte> manifest) {
    return Call<transport::WeightsSealResponse>(
        Opcode::kWeightsSeal,
        transport::WeightsSealRequest{{manifest.begin(), manifest.end()}});
  }
  Result<transport::WeightsManifestResponse> Manifest(const std::string& model,
                                                      const std::string& layout,
                                                      PageHash version) {
    return Call<transport::WeightsManifestResponse>(
        Opcode::kWeightsManifest,
        transport::WeightsSelectRequest{model, layout, version, {}});
  }
  Result<transport::WeightsListResponse> List(const std::string& model = "") {
    return Call<transport::WeightsListResponse>(
        Opcode::kWeightsList,
        transport::WeightsSelectRequest{model, "", {}, {}});
  }
  Result<transport::WeightsDropResponse> Drop(const std::string& model,
                                              const std::string& layout = "",
                                              PageHash version = {}) {
    return Call<transport::WeightsDropResponse>(
        Opcode::kWeightsDrop,
        transport::WeightsSelectRequest{model, layout, version, {}});
  }
  Result<transport::ItemStatusResponse> Hint(
      std::vector<transport::WeightsHintItem> items) {
    return Call<transport::ItemStatusResponse>(
        Opcode::kWeightsHint, transport::WeightsHintRequest{std::move(items)});
  }
  Result<transport::StatusResponse> Pin(const WeightsId& id, uint64_t ttl_ms) {
    return Call<transport::StatusResponse>(
        Opcode::kWeightsPin, transport::WeightsPinRequest{id, ttl_ms});
  }
  Result<transport::StatusResponse> Prefetch(const std::string& model,
                                             const std::string& layout,
                                             LayerRange layers) {
    return Call<transport::StatusResponse>(
        Opcode::kWeightsPrefetch,
        transport::WeightsSelectRequest{model, layout, {}, layers});
  }

 private:
  explicit RawConnection(std::unique_ptr<transport::UdsChannel> ch)
      : channel_(std::move(ch)) {}
  std::unique_ptr<transport::UdsChannel> channel_;
};

class WeightsDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_OK(Start()); }

  Status Start() {
    daemon_ = std::make_unique<DaemonProcess>();
    const std::string config = R"(
[nvme]
path = ")" + dir_.path().string() +
                               R"(/nvme.data"
capacity_bytes = "256MiB"
[[namespace]]
name = "kv"
token = "token-of-kv"
host_bytes = "16MiB"
shards = 2
[[namespace]]
name = "w"
token = "token-of-w"
host_bytes = "256MiB"
shards = 2
prefault = false
hugepages = false
weights = true
)";
    return daemon_->Start({.config_toml = config});
  }
  std::unique_ptr<Client> Connect(const std::string& ns = "w") {
    auto c = daemon_->Connect(ns, "token-of-" + ns);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  RawConnection Raw(const std::string& ns = "w") {
    auto c = RawConnection::Open(daemon_->socket_path(), ns, "token-of-" + ns);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return std::move(c).value();
  }
  nlohmann::json Stats(Client& c) {
    auto s = c.StatsJson();
    EXPECT_TRUE(s.ok());
    return nlohmann::json::parse(s.ok() ? *s : "{}");
  }
  // Stores every chunk of `shard` and seals it (a connection of its own).
  void StoreSealed(const TestShard& shard) {
    auto c = Connect();
    ASSERT_NE(c, nullptr);
    for (const PutResult& r : PutChunks(*c, shard)) ASSERT_OK(r);
    auto sealed = Raw().Seal(shard.encoded);
    ASSERT_OK(sealed);
    ASSERT_OK(sealed->status);
  }
  // Whether chunk i of `shard` reads back exactly.
  ::testing::AssertionResult ReadsBack(Client& c, const TestShard& shard,
                                       size_t i) {
    std::vector<std::byte> got(shard.manifest.chunks[i].bytes);
    const SegmentRead read{shard.ChunkKey(i), got};
    const Status s = c.Get(std::span(&read, 1))[0];
    if (!s.ok()) {
      return ::testing::AssertionFailure()
             << "chunk " << i << ": " << s.ToString();
    }
    const auto want = shard.ChunkBytes(i);
    if (!std::equal(got.begin(), got.end(), want.begin(), want.end())) {
      return ::testing::AssertionFailure() << "chunk " << i << " differs";
    }
    return ::testing::AssertionSuccess();
  }

  // Disk-backed: the NVMe tier's data file needs O_DIRECT. Declared before
  // daemon_, so the daemon stops before the directory is removed.
  TempDir dir_{"/var/tmp"};
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(WeightsDaemonTest, SealNeedsEveryChunkAndIsIdempotent) {
  auto c = Connect();
  RawConnection raw = Raw();
  const TestShard a = ShardA();
  ASSERT_EQ(a.manifest.chunks.size(), 3u);
  for (const PutResult& r : PutChunks(*c, a, /*skip=*/1)) ASSERT_OK(r);
  auto sealed = raw.Seal(a.encoded);
  ASSERT_OK(sealed);
  EXPECT_EQ(sealed->status.code(), StatusCode::kNotFound);
  EXPECT_NE(sealed->status.message().find(a.manifest.chunks[1].key.ToHex()),
            std::string::npos)
      << sealed->status.ToString();

  for (const PutResult& r : PutChunks(*c, a)) ASSERT_OK(r);
  sealed = raw.Seal(a.encoded);
  ASSERT_OK(sealed);
  ASSERT_OK(sealed->status);
  EXPECT_EQ(sealed->version, a.version);
  EXPECT_FALSE(sealed->already_sealed);
  sealed = raw.Seal(a.encoded);
  ASSERT_OK(sealed);
  ASSERT_OK(sealed->status);
  EXPECT_EQ(sealed->version, a.version);
  EXPECT_TRUE(sealed->already_sealed);
  const nlohmann::json stats = Stats(*c);
  EXPECT_EQ(stats["weights"]["shards"], 1);
  EXPECT_EQ(stats["weights"]["unique_bytes"], DistinctChunkBytes({&a}));
  auto metrics = HttpGet(daemon_->metrics_port(), "/metrics");
  ASSERT_OK(metrics);
  EXPECT_EQ(MetricValue(*metrics, "tierkv_weights_shards{namespace=\"w\"}"), 1);
  EXPECT_EQ(
      MetricValue(*metrics, "tierkv_weights_unique_bytes{namespace=\"w\"}"),
      static_cast<double>(DistinctChunkBytes({&a})));
  EXPECT_EQ(MetricValue(*metrics,
                        "tierkv_request_seconds_count{op=\"weights_seal\"}"),
            3);
}

TEST_F(WeightsDaemonTest, ChunkBytesThatDoNotMatchTheirKeyAreNeverStored) {
  auto c = Connect();
  const TestShard a = ShardA();
  // Chunk 0's key over chunk 2's bytes: refused at commit.
  const SegmentWrite wrong{a.ChunkKey(0), a.ChunkBytes(2)};
  const PutResult r = c->Put(std::span(&wrong, 1))[0];
  EXPECT_EQ(r.status.code(), StatusCode::kCorruption) << r.status.ToString();
  EXPECT_NE(r.status.message().find("do not match their key"),
            std::string::npos);
  std::vector<std::byte> got(a.ChunkBytes(2).size());
  const SegmentRead read{a.ChunkKey(0), got};
  EXPECT_EQ(c->Get(std::span(&read, 1))[0].code(), StatusCode::kNotFound);
  // The reservation went with it: the right bytes store at once.
  const SegmentWrite right{a.ChunkKey(0), a.ChunkBytes(0)};
  const PutResult ok = c->Put(std::span(&right, 1))[0];
  ASSERT_OK(ok);
  EXPECT_FALSE(ok.already_stored);
  EXPECT_TRUE(ReadsBack(*c, a, 0));
}

TEST_F(WeightsDaemonTest, ChunkKeysAndSizesFollowTheRules) {
  auto c = Connect();
  const std::vector<std::byte> small(16, std::byte{1});
  const SegmentWrite layered{{WeightsChunkKey(small), 1, 0}, small};
  EXPECT_EQ(c->Put(std::span(&layered, 1))[0].status.code(),
            StatusCode::kInvalidArgument);
  const std::vector<std::byte> huge(kWeightsMaxChunkBytes + 1);
  const SegmentWrite too_big{{WeightsChunkKey(huge), 0, 0}, huge};
  EXPECT_EQ(c->Put(std::span(&too_big, 1))[0].status.code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c->RegisterLayout(OnePartLayout()).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(WeightsDaemonTest, ManifestLookupFindsTheNewestOrTheAskedVersion) {
  auto c = Connect();
  RawConnection raw = Raw();
  const TestShard v1 = ShardA();
  const TestShard v2 = MakeShard(v1.manifest.model, v1.manifest.layout,
                                 {{"embed", "shared-embed", 0, 2 * kMiB},
                                  {"l1.w", "a-l1w-step2", 1, kMiB},
                                  {"l1.norm", "a-norm", 1, 100}});
  ASSERT_NE(v1.version, v2.version);
  for (const TestShard* s : {&v1, &v2}) {
    for (const PutResult& r : PutChunks(*c, *s)) ASSERT_OK(r);
    auto sealed = raw.Seal(s->encoded);
    ASSERT_OK(sealed);
    ASSERT_OK(sealed->status);
  }
  auto newest = raw.Manifest(v1.manifest.model, v1.manifest.layout, {});
  ASSERT_OK(newest);
  ASSERT_OK(newest->status);
  EXPECT_EQ(newest->manifest, v2.encoded);
  auto first = raw.Manifest(v1.manifest.model, v1.manifest.layout, v1.version);
  ASSERT_OK(first);
  ASSERT_OK(first->status);
  EXPECT_EQ(first->manifest, v1.encoded);
  auto decoded = DecodeWeightsManifest(first->manifest);
  ASSERT_OK(decoded);
  EXPECT_EQ(*decoded, v1.manifest);
  auto missing = raw.Manifest(v1.manifest.model, "other/layout", {});
  ASSERT_OK(missing);
  EXPECT_EQ(missing->status.code(), StatusCode::kNotFound);
}

TEST_F(WeightsDaemonTest, DropFreesExactlyTheChunksNoOtherShardNames) {
  auto c = Connect();
  RawConnection raw = Raw();
  const TestShard a = ShardA();
  const TestShard b = ShardB();
  ASSERT_EQ(a.manifest.chunks[0].key, b.manifest.chunks[0].key);  // shared
  for (const TestShard* s : {&a, &b}) {
    for (const PutResult& r : PutChunks(*c, *s)) ASSERT_OK(r);
    auto sealed = raw.Seal(s->encoded);
    ASSERT_OK(sealed);
    ASSERT_OK(sealed->status);
  }
  nlohmann::json stats = Stats(*c);
  EXPECT_EQ(stats["weights"]["shards"], 2);
  EXPECT_EQ(stats["weights"]["unique_bytes"], DistinctChunkBytes({&a, &b}));
  const uint64_t a_only =
      DistinctChunkBytes({&a, &b}) - DistinctChunkBytes({&b});
  // Durable first, so no write-back is still reading a chunk the drop
  // erases (DRAM keeps a chunk being written back until eviction).
  std::vector<SegmentKey> all;
  for (const TestShard* s : {&a, &b}) {
    for (size_t i = 0; i < s->manifest.chunks.size(); ++i) {
      all.push_back(s->ChunkKey(i));
    }
  }
  for (const Status& s : c->Flush(all)) ASSERT_OK(s);

  auto list = raw.List();
  ASSERT_OK(list);
  ASSERT_OK(list->status);
  ASSERT_EQ(list->shards.size(), 2u);
  const WeightsInfo& info_a = list->shards[0];  // "glm-test" < "glm-test-b"
  EXPECT_EQ(info_a.id.model, a.manifest.model);
  EXPECT_EQ(info_a.id.version, a.version);
  EXPECT_EQ(info_a.chunks, 3u);
  EXPECT_EQ(info_a.tensors, 3u);
  EXPECT_EQ(info_a.num_layers, 2u);
  EXPECT_EQ(info_a.image_bytes, a.manifest.image_bytes);
  EXPECT_EQ(info_a.chunks_in_dram + info_a.chunks_on_nvme, 3u);
  EXPECT_EQ(info_a.chunks_missing, 0u);
  EXPECT_EQ(info_a.unique_bytes, a_only);
  EXPECT_GT(info_a.sealed_unix_ms, 0u);

  auto dropped = raw.Drop(a.manifest.model);
  ASSERT_OK(dropped);
  ASSERT_OK(dropped->status);
  EXPECT_EQ(dropped->dropped, 1u);
  EXPECT_EQ(dropped->freed_bytes, a_only);
  EXPECT_EQ(Stats(*c)["weights"]["unique_bytes"], DistinctChunkBytes({&b}));
  // A's own chunks are gone from every tier; the shared one serves B.
  for (size_t i : {1, 2}) {
    std::vector<std::byte> got(a.manifest.chunks[i].bytes);
    const SegmentRead read{a.ChunkKey(i), got};
    EXPECT_EQ(c->Get(std::span(&read, 1))[0].code(), StatusCode::kNotFound)
        << i;
  }
  EXPECT_TRUE(ReadsBack(*c, b, 0));
  list = raw.List();
  ASSERT_OK(list);
  ASSERT_EQ(list->shards.size(), 1u);
  EXPECT_EQ(list->shards[0].id.model, b.manifest.model);
  EXPECT_EQ(list->shards[0].unique_bytes, DistinctChunkBytes({&b}));

  auto again = raw.Drop(a.manifest.model);
  ASSERT_OK(again);
  EXPECT_EQ(again->status.code(), StatusCode::kNotFound);
  auto no_model = raw.Drop("");
  ASSERT_OK(no_model);
  EXPECT_EQ(no_model->status.code(), StatusCode::kInvalidArgument);
}

TEST_F(WeightsDaemonTest, SealedShardsComeBackAfterARestartFromNvme) {
  const TestShard a = ShardA();
  ASSERT_NO_FATAL_FAILURE(StoreSealed(a));
  ASSERT_EQ(daemon_->Stop(SIGTERM), 0);
  ASSERT_OK(Start());
  auto c = Connect();
  RawConnection raw = Raw();
  auto list = raw.List(a.manifest.model);
  ASSERT_OK(list);
  ASSERT_OK(list->status);
  ASSERT_EQ(list->shards.size(), 1u);
  EXPECT_EQ(list->shards[0].id.version, a.version);
  // DRAM starts empty: every chunk is on NVMe only.
  EXPECT_EQ(list->shards[0].chunks_on_nvme, 3u);
  EXPECT_EQ(list->shards[0].chunks_in_dram, 0u);
  auto manifest = raw.Manifest(a.manifest.model, a.manifest.layout, {});
  ASSERT_OK(manifest);
  ASSERT_OK(manifest->status);
  EXPECT_EQ(manifest->manifest, a.encoded);
  EXPECT_EQ(Stats(*c)["weights"]["shards"], 1);
  // An NVMe-only chunk reads back right (promoted by the Get).
  EXPECT_TRUE(ReadsBack(*c, a, 1));
  // Sealing it again finds it sealed.
  auto sealed = raw.Seal(a.encoded);
  ASSERT_OK(sealed);
  EXPECT_TRUE(sealed->already_sealed);
  // Layer 0's chunks queue for promotion; then all of them are in DRAM.
  auto prefetch = raw.Prefetch(a.manifest.model, a.manifest.layout, {0, 0});
  ASSERT_OK(prefetch);
  ASSERT_OK(prefetch->status);
  ASSERT_TRUE(PollUntil(
      [&] {
        auto l = raw.List(a.manifest.model);
        return l.ok() && !l->shards.empty() &&
               l->shards[0].chunks_in_dram == 3u;
      },
      std::chrono::milliseconds(10000)));
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(ReadsBack(*c, a, i)) << i;
  auto past = raw.Prefetch(a.manifest.model, a.manifest.layout, {5, 1});
  ASSERT_OK(past);
  EXPECT_EQ(past->status.code(), StatusCode::kInvalidArgument);
}

// A sealed shard survives a SIGKILL right after its Seal answered (the
// chunks and the manifest were durable first). Then, chunk by chunk, one
// byte of the chunk is flipped in the NVMe data file while the daemon is
// down: a load after the restart fails that chunk's layer, naming the
// chunk, every time, and never leaves the flipped bytes in the image. The
// NVMe tier drops a chunk that fails its checksum (a miss, logged), so the
// shard's chunks are stored again before the next one is corrupted.
TEST_F(WeightsDaemonTest, ACorruptChunkOnNvmeFailsItsLayerEveryTime) {
  const TestShard a = ShardA();
  ASSERT_NO_FATAL_FAILURE(StoreSealed(a));
  ASSERT_EQ(daemon_->Stop(SIGKILL), SIGKILL);
  const std::string data_path = dir_.path().string() + "/nvme.data";

  for (size_t victim = 0; victim < a.manifest.chunks.size(); ++victim) {
    SCOPED_TRACE("corrupt chunk " + std::to_string(victim));
    if (victim > 0) {
      // The previous victim was dropped: store it again, durably.
      ASSERT_OK(Start());
      auto c = Connect();
      for (const PutResult& r : PutChunks(*c, a)) ASSERT_OK(r);
      std::vector<SegmentKey> keys;
      for (size_t i = 0; i < a.manifest.chunks.size(); ++i) {
        keys.push_back(a.ChunkKey(i));
      }
      for (const Status& st : c->Flush(keys)) ASSERT_OK(st);
      c.reset();
      ASSERT_EQ(daemon_->Stop(SIGKILL), SIGKILL);
    }
    const WeightsChunk& chunk = a.manifest.chunks[victim];
    ASSERT_TRUE(FlipAByteOfChunk(data_path, a, victim));
    ASSERT_OK(Start());
    auto c = Connect();
    {
      RawConnection raw = Raw();
      auto list = raw.List(a.manifest.model);
      ASSERT_OK(list);
      ASSERT_OK(list->status);
      ASSERT_EQ(list->shards.size(), 1u);  // sealed before the SIGKILL
    }
    std::vector<std::byte> image(a.manifest.image_bytes, std::byte{0xee});
    auto load = c->LoadWeights(a.manifest, image);
    ASSERT_OK(load);
    const Status done = load->Wait();
    EXPECT_FALSE(done.ok());
    EXPECT_NE(done.ToString().find(chunk.key.ToHex()), std::string::npos)
        << done.ToString();
    EXPECT_FALSE(load->WaitLayer(chunk.layer).ok());
    for (uint32_t l = 0; l < chunk.layer; ++l) EXPECT_OK(load->WaitLayer(l));
    // The chunk's range holds the right bytes or none of the read ones:
    // never the corrupt read.
    const auto got = std::span(image).subspan(chunk.offset, chunk.bytes);
    const auto want = a.ChunkBytes(victim);
    const bool untouched = std::all_of(got.begin(), got.end(), [](std::byte b) {
      return b == std::byte{0xee};
    });
    EXPECT_TRUE(untouched || std::equal(got.begin(), got.end(), want.begin()));
    EXPECT_NE(got[chunk.bytes / 2], want[chunk.bytes / 2] ^ std::byte{0x5a});
    c.reset();
    ASSERT_EQ(daemon_->Stop(SIGKILL), SIGKILL);
  }
}

// Issue 28 round 2: re-importing a checkpoint after a restart found every
// chunk on NVMe and still copied each into DRAM ("stored 4 chunks, 0
// deduplicated"). A chunk held below DRAM is already stored.
TEST_F(WeightsDaemonTest, ChunksOnNvmeAreDeduplicatedWithoutPromotion) {
  const TestShard a = ShardA();
  ASSERT_NO_FATAL_FAILURE(StoreSealed(a));
  ASSERT_EQ(daemon_->Stop(SIGTERM), 0);
  ASSERT_OK(Start());
  auto c = Connect();
  RawConnection raw = Raw();
  for (const PutResult& r : PutChunks(*c, a)) {
    ASSERT_OK(r);
    EXPECT_TRUE(r.already_stored);
  }
  // B shares A's embedding chunk (on NVMe only) and brings two of its own.
  const TestShard b = ShardB();
  const std::vector<PutResult> put_b = PutChunks(*c, b);
  ASSERT_EQ(put_b.size(), b.manifest.chunks.size());
  size_t deduplicated = 0;
  for (const PutResult& r : put_b) {
    ASSERT_OK(r);
    deduplicated += r.already_stored ? 1 : 0;
  }
  EXPECT_EQ(deduplicated, 1u);
  // Nothing of A was copied or promoted into DRAM.
  auto list = raw.List(a.manifest.model);
  ASSERT_OK(list);
  ASSERT_EQ(list->shards.size(), 1u);
  EXPECT_EQ(list->shards[0].chunks_in_dram, 0u);
  EXPECT_EQ(list->shards[0].chunks_on_nvme, 3u);
  // B seals over the deduplicated chunk, and every chunk reads back.
  auto sealed = raw.Seal(b.encoded);
  ASSERT_OK(sealed);
  ASSERT_OK(sealed->status);
  for (size_t i = 0; i < b.manifest.chunks.size(); ++i) {
    EXPECT_TRUE(ReadsBack(*c, b, i)) << i;
  }
}

// Round 2 on a real daemon: a hint within the (default 60 s) horizon
// promotes an NVMe-only shard; pins are counted and end on unpin; unknown
// shards are per-item NotFound.
TEST_F(WeightsDaemonTest, HintsPrefetchSoonNeededShardsAndPinsAreCounted) {
  const TestShard a = ShardA();
  ASSERT_NO_FATAL_FAILURE(StoreSealed(a));
  ASSERT_EQ(daemon_->Stop(SIGTERM), 0);
  ASSERT_OK(Start());
  auto c = Connect();
  RawConnection raw = Raw();
  const WeightsId id{a.manifest.model, a.manifest.layout, {}};
  auto hinted = raw.Hint({{id, 1000}, {{"nope", "x", {}}, 5}});
  ASSERT_OK(hinted);
  ASSERT_OK(hinted->status);
  ASSERT_EQ(hinted->items.size(), 2u);
  EXPECT_OK(hinted->items[0]);
  EXPECT_EQ(hinted->items[1].code(), StatusCode::kNotFound);
  ASSERT_TRUE(PollUntil(
      [&] {
        auto l = raw.List(a.manifest.model);
        return l.ok() && !l->shards.empty() &&
               l->shards[0].chunks_in_dram == 3u;
      },
      std::chrono::milliseconds(10000)));
  EXPECT_EQ(Stats(*c)["weights"]["hinted_shards"], 1);
  auto pinned = raw.Pin(id, 60000);
  ASSERT_OK(pinned);
  ASSERT_OK(pinned->status);
  EXPECT_EQ(Stats(*c)["weights"]["pinned_shards"], 1);
  EXPECT_EQ(Stats(*c)["weights"]["pinned_bytes"], DistinctChunkBytes({&a}));
  auto missing = raw.Pin({"nope", "", {}}, 1000);
  ASSERT_OK(missing);
  EXPECT_EQ(missing->status.code(), StatusCode::kNotFound);
  auto unpinned = raw.Pin(id, 0);
  ASSERT_OK(unpinned);
  ASSERT_OK(unpinned->status);
  EXPECT_EQ(Stats(*c)["weights"]["pinned_shards"], 0);
  auto cleared = raw.Hint({{id, -1}});
  ASSERT_OK(cleared);
  EXPECT_OK(cleared->items[0]);
  EXPECT_EQ(Stats(*c)["weights"]["hinted_shards"], 0);
  // KV namespaces refuse both.
  RawConnection kv = Raw("kv");
  auto kv_hint = kv.Hint({{id, 5}});
  ASSERT_OK(kv_hint);
  EXPECT_EQ(kv_hint->status.code(), StatusCode::kInvalidArgument);
  auto kv_pin = kv.Pin(id, 5);
  ASSERT_OK(kv_pin);
  EXPECT_EQ(kv_pin->status.code(), StatusCode::kInvalidArgument);
}

// The client calls for the same requests (client/weights_policy.cc).
TEST_F(WeightsDaemonTest, ClientHintsAndPinsShards) {
  const TestShard a = ShardA();
  ASSERT_NO_FATAL_FAILURE(StoreSealed(a));
  auto c = Connect();
  RawConnection raw = Raw();
  const WeightsId id{a.manifest.model, a.manifest.layout, {}};
  const WeightsHint hints[] = {{id, std::chrono::seconds(30)}};
  ASSERT_OK(c->HintWeights(hints));
  EXPECT_EQ(Stats(*c)["weights"]["hinted_shards"], 1);
  const WeightsHint unknown[] = {{id, std::chrono::seconds(1)},
                                 {{"nope", "x", {}}, std::chrono::seconds(1)}};
  const Status partly = c->HintWeights(unknown);
  EXPECT_EQ(partly.code(), StatusCode::kNotFound);
  EXPECT_NE(partly.message().find("hint 1 ('nope' 'x')"), std::string::npos)
      << partly.ToString();
  const WeightsHint clear[] = {{id, std::chrono::milliseconds(-1)}};
  ASSERT_OK(c->HintWeights(clear));
  EXPECT_EQ(Stats(*c)["weights"]["hinted_shards"], 0);
  ASSERT_OK(c->PinWeights(id, std::chrono::minutes(1)));
  EXPECT_EQ(Stats(*c)["weights"]["pinned_shards"], 1);
  ASSERT_OK(c->PinWeights(id, std::chrono::milliseconds(0)));
  EXPECT_EQ(Stats(*c)["weights"]["pinned_shards"], 0);
  EXPECT_EQ(c->PinWeights({"nope", "", {}}, std::chrono::seconds(1)).code(),
            StatusCode::kNotFound);
}

TEST_F(WeightsDaemonTest, KvNamespacesRefuseWeightsRequestsAndKeepWorking) {
  RawConnection raw = Raw("kv");
  const TestShard a = ShardA();
  auto sealed = raw.Seal(a.encoded);
  ASSERT_OK(sealed);
  EXPECT_EQ(sealed->status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(sealed->status.message().find("not a weights namespace"),
            std::string::npos);
  auto list = raw.List();
  ASSERT_OK(list);
  EXPECT_EQ(list->status.code(), StatusCode::kInvalidArgument);
  auto manifest = raw.Manifest("m", "l", {});
  ASSERT_OK(manifest);
  EXPECT_EQ(manifest->status.code(), StatusCode::kInvalidArgument);
  auto dropped = raw.Drop("m");
  ASSERT_OK(dropped);
  EXPECT_EQ(dropped->status.code(), StatusCode::kInvalidArgument);
  auto prefetch = raw.Prefetch("m", "l", {});
  ASSERT_OK(prefetch);
  EXPECT_EQ(prefetch->status.code(), StatusCode::kInvalidArgument);

  auto kv = Connect("kv");
  ASSERT_OK(kv->RegisterLayout(OnePartLayout()));
  const auto pages = Pages(4, 0, "kv");
  for (const PutResult& r : PutPages(*kv, pages, 64 * 1024)) ASSERT_OK(r);
  for (const PageHash& p : pages) {
    EXPECT_TRUE(ReadsBackExact(*kv, p, 64 * 1024));
  }
  EXPECT_FALSE(Stats(*kv).contains("weights"));
}

TEST_F(WeightsDaemonTest, MalformedManifestsAreRefusedAndTheDaemonServesOn) {
  auto c = Connect();
  RawConnection raw = Raw();
  const TestShard a = ShardA();
  for (const PutResult& r : PutChunks(*c, a)) ASSERT_OK(r);
  std::mt19937 rng(28);
  for (int i = 0; i < 200; ++i) {
    std::vector<std::byte> bad = a.encoded;
    if (i % 2 == 0) {
      bad.resize(rng() % bad.size());
    } else {
      bad[rng() % bad.size()] ^= std::byte(1 + rng() % 255);
    }
    auto sealed = raw.Seal(bad);
    ASSERT_OK(sealed);                  // an answer, not a dropped connection
    if (sealed->status.ok()) continue;  // a flipped key byte: still valid
    EXPECT_TRUE(sealed->status.code() == StatusCode::kCorruption ||
                sealed->status.code() == StatusCode::kNotFound)
        << sealed->status.ToString();
  }
  auto sealed = raw.Seal(a.encoded);
  ASSERT_OK(sealed);
  EXPECT_OK(sealed->status);
}

}  // namespace
}  // namespace tierkv::testing
