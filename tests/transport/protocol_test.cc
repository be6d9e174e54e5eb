#include "transport/protocol.h"

#include <gtest/gtest.h>

#include <random>

#include "tests/testing/status_matchers.h"

namespace tierkv::transport {
namespace {

TEST(ProtocolTest, BatchedMessagesRoundTrip) {
  PutReserveRequest put;
  put.items = {{{PageHash{1, 2}, 3, 1}, 73728},
               {{PageHash{5, 6}, 77, 0}, 8448}};
  PutReserveRequest put2;
  ASSERT_OK(Decode(Encode(put), put2));
  ASSERT_EQ(put2.items.size(), 2u);
  EXPECT_EQ(put2.items[1].key, put.items[1].key);
  EXPECT_EQ(put2.items[1].size, 8448u);

  GetResponse get;
  get.lease_id = 9;
  get.items = {{Status::OK(), Tier::kHost, 4096, 100},
               {Status::NotFound("gone"), Tier::kMiss, 0, 0}};
  GetResponse get2;
  ASSERT_OK(Decode(Encode(get), get2));
  EXPECT_EQ(get2.lease_id, 9u);
  EXPECT_EQ(get2.items[0].offset, 4096u);
  EXPECT_EQ(get2.items[1].status.code(), StatusCode::kNotFound);
  EXPECT_EQ(get2.items[1].status.message(), "gone");
  EXPECT_EQ(get2.items[1].tier, Tier::kMiss);
}

TEST(ProtocolTest, PlacementsCarryDedupAsASuccessFlag) {
  PutReserveResponse resp;
  resp.lease_id = 3;
  resp.items = {{Status::OK(), 8192, /*already_stored=*/false},
                {Status::OK(), 0, /*already_stored=*/true},
                {Status::Busy("being written"), 0, /*already_stored=*/false}};
  PutReserveResponse out;
  ASSERT_OK(Decode(Encode(resp), out));
  ASSERT_EQ(out.items.size(), 3u);
  EXPECT_OK(out.items[0].status);
  EXPECT_EQ(out.items[0].offset, 8192u);
  EXPECT_FALSE(out.items[0].already_stored);
  EXPECT_OK(out.items[1].status);
  EXPECT_TRUE(out.items[1].already_stored);
  EXPECT_EQ(out.items[2].status.code(), StatusCode::kBusy);
  EXPECT_FALSE(out.items[2].already_stored);
}

TEST(ProtocolTest, PlacementFlagIsStrict) {
  // Layout: status(1+4) lease(8) count(4), then per item status(1+4+msg)
  // offset(8) flag(1); an OK status has an empty message.
  PutReserveResponse resp;
  resp.items = {{Status::OK(), 0, /*already_stored=*/true}};
  auto bytes = Encode(resp);
  const size_t flag = 5 + 8 + 4 + 5 + 8;
  ASSERT_EQ(bytes.size(), flag + 1);
  ASSERT_EQ(bytes[flag], std::byte{1});
  PutReserveResponse out;
  auto bad_flag = bytes;
  bad_flag[flag] = std::byte{2};
  EXPECT_EQ(Decode(bad_flag, out).code(), StatusCode::kProtocolError);
  // Dedup never comes with an error status.
  resp.items = {{Status::Busy(""), 0, /*already_stored=*/true}};
  EXPECT_EQ(Decode(Encode(resp), out).code(), StatusCode::kProtocolError);
  // Truncated anywhere: refused.
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_EQ(Decode(std::span(bytes).first(cut), out).code(),
              StatusCode::kProtocolError)
        << cut;
  }
}

TEST(ProtocolTest, LayoutWithPerLayerPartsRoundTrips) {
  LayoutSpec layout = LayoutSpec::Uniform(64, 78, {{"kv", 1152}});
  for (uint32_t l : {0u, 1u, 2u, 6u, 10u})
    layout.layers[l].parts.push_back({"index_k", 132});
  RegisterLayoutRequest out;
  ASSERT_OK(Decode(Encode(RegisterLayoutRequest{layout}), out));
  EXPECT_EQ(out.layout, layout);
}

// Each pool kind carries what it needs, and only that: a memfd nothing, a
// device IPC handle its 64 bytes, size and GPU, a device descriptor its
// size and GPU.
TEST(ProtocolTest, RegisterPoolCarriesWhatEachKindNeeds) {
  RegisterPoolRequest ipc{.layer = 3,
                          .part = 1,
                          .kind = RegisterPoolRequest::kDeviceIpc,
                          .offset = 4096,
                          .slot_bytes = 656,
                          .slot_count = 64,
                          .device_pool_bytes = 1 << 30};
  ipc.device_handle[7] = std::byte{0x42};
  ipc.device_uuid[15] = std::byte{0x07};
  RegisterPoolRequest fd = ipc;
  fd.kind = RegisterPoolRequest::kDeviceFd;
  fd.device_handle = {};
  RegisterPoolRequest memfd = fd;
  memfd.kind = RegisterPoolRequest::kMemfd;
  memfd.device_pool_bytes = 0;
  memfd.device_uuid = {};
  for (const RegisterPoolRequest& in : {ipc, fd, memfd}) {
    RegisterPoolRequest out;
    const auto bytes = Encode(in);
    ASSERT_OK(Decode(bytes, out));
    EXPECT_EQ(out.kind, in.kind);
    EXPECT_EQ(out.offset, in.offset);
    EXPECT_EQ(out.device_handle, in.device_handle);
    EXPECT_EQ(out.device_pool_bytes, in.device_pool_bytes);
    EXPECT_EQ(out.device_uuid, in.device_uuid);
  }
  EXPECT_EQ(Encode(ipc).size(), Encode(fd).size() + 64);
  EXPECT_EQ(Encode(fd).size(), Encode(memfd).size() + 8 + 16);
}

TEST(ProtocolTest, TrailingBytesAndTruncationAreRejected) {
  auto bytes = Encode(MatchRequest{{PageHash{1, 1}, PageHash{2, 2}}});
  MatchRequest m;
  auto longer = bytes;
  longer.push_back(std::byte{0});
  EXPECT_EQ(Decode(longer, m).code(), StatusCode::kProtocolError);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_EQ(Decode(std::span(bytes).first(cut), m).code(),
              StatusCode::kProtocolError)
        << cut;
  }
}

TEST(ProtocolTest, UnknownStatusCodesAndTiersAreRejected) {
  GetResponse get;
  get.items = {{Status::OK(), Tier::kHost, 0, 1}};
  auto bytes = Encode(get);
  auto bad_status = bytes;
  bad_status[0] = std::byte{200};
  GetResponse out;
  EXPECT_EQ(Decode(bad_status, out).code(), StatusCode::kProtocolError);
  // The item's tier byte sits after: status(1+4) lease(8) count(4) item
  // status(1+4).
  auto bad_tier = bytes;
  bad_tier[5 + 8 + 4 + 5] = std::byte{77};
  EXPECT_EQ(Decode(bad_tier, out).code(), StatusCode::kProtocolError);
}

TransferRequest SampleTransfer() {
  TransferRequest t;
  t.ticket = 3;
  t.first_layer = 1;
  t.num_layers = 4;
  t.pages = {PageHash{1, 2}, PageHash{3, 4}};
  t.slots = {7, 9};
  return t;
}

TEST(ProtocolTest, TransferRequestCarriesAnOptionalWaitReport) {
  TransferRequest t = SampleTransfer();
  TransferRequest out;
  ASSERT_OK(Decode(Encode(t), out));
  EXPECT_FALSE(out.waits.has_value());
  EXPECT_EQ(out.slots, t.slots);

  WaitReport report;
  report.counts[0] = 5;  // returned at once
  report.counts[12] = 2;
  report.counts[kWaitReportBuckets - 1] = 1;
  report.total_nanos = 123456789;
  t.waits = report;
  ASSERT_OK(Decode(Encode(t), out));
  ASSERT_TRUE(out.waits.has_value());
  EXPECT_EQ(out.waits->counts, report.counts);
  EXPECT_EQ(out.waits->total_nanos, report.total_nanos);
  EXPECT_EQ(out.pages, t.pages);
  EXPECT_EQ(out.num_layers, 4);

  // An empty report is not sent: the encoding is the one without it.
  TransferRequest empty = SampleTransfer();
  empty.waits = WaitReport{};
  EXPECT_EQ(Encode(empty), Encode(SampleTransfer()));
}

TEST(ProtocolTest, PrefetchRequestCarriesAnOptionalWaitReport) {
  PrefetchRequest m{{PageHash{1, 1}}, WaitReport{}};
  m.waits->counts[3] = 4;
  m.waits->total_nanos = 20000;
  PrefetchRequest out;
  ASSERT_OK(Decode(Encode(m), out));
  ASSERT_TRUE(out.waits.has_value());
  EXPECT_EQ(out.waits->counts[3], 4u);
  EXPECT_EQ(out.waits->total_nanos, 20000u);
}

TEST(ProtocolTest, MalformedWaitReportsAreRejected) {
  TransferRequest t = SampleTransfer();
  t.waits = WaitReport{};
  t.waits->counts[1] = 1;
  const auto bytes = Encode(t);
  const size_t report_at = Encode(SampleTransfer()).size();
  ASSERT_EQ(bytes.size(), report_at + 1 + (kWaitReportBuckets + 1) * 8);
  TransferRequest out;
  // A bucket count other than the fixed one (fewer, more, hostile).
  for (uint8_t buckets : {0, 1, 20, 22, 255}) {
    auto bad = bytes;
    bad[report_at] = std::byte{buckets};
    EXPECT_EQ(Decode(bad, out).code(), StatusCode::kProtocolError)
        << int{buckets};
  }
  // An oversized report: more buckets' worth of bytes than declared.
  auto longer = bytes;
  longer.insert(longer.end(), 8, std::byte{0});
  EXPECT_EQ(Decode(longer, out).code(), StatusCode::kProtocolError);
  // Truncated anywhere inside the report.
  for (size_t cut = report_at + 1; cut < bytes.size(); ++cut) {
    EXPECT_EQ(Decode(std::span(bytes).first(cut), out).code(),
              StatusCode::kProtocolError)
        << cut;
  }
}

WeightsInfo SampleWeightsInfo() {
  WeightsInfo info;
  info.id = {"glm-5", "tierkv-run/bf16/rank0-of-1", PageHash{7, 8}};
  info.image_bytes = 1 << 30;
  info.tensors = 1500;
  info.chunks = 40;
  info.num_layers = 79;
  info.sealed_unix_ms = 1796000000000;
  info.chunks_in_dram = 30;
  info.chunks_on_nvme = 9;
  info.chunks_missing = 1;
  info.unique_bytes = 12345;
  return info;
}

TEST(ProtocolTest, WeightsMessagesRoundTrip) {
  WeightsSealRequest seal{{std::byte{1}, std::byte{2}, std::byte{3}}};
  WeightsSealRequest seal2;
  ASSERT_OK(Decode(Encode(seal), seal2));
  EXPECT_EQ(seal2.manifest, seal.manifest);

  WeightsSealResponse sealed{Status::OK(), PageHash{5, 6},
                             /*already_sealed=*/true};
  WeightsSealResponse sealed2;
  ASSERT_OK(Decode(Encode(sealed), sealed2));
  EXPECT_EQ(sealed2.version, (PageHash{5, 6}));
  EXPECT_TRUE(sealed2.already_sealed);

  WeightsSelectRequest select{"glm-5", "a/b", PageHash{9, 10}, {3, 4}};
  WeightsSelectRequest select2;
  ASSERT_OK(Decode(Encode(select), select2));
  EXPECT_EQ(select2.model, "glm-5");
  EXPECT_EQ(select2.layout, "a/b");
  EXPECT_EQ(select2.version, (PageHash{9, 10}));
  EXPECT_EQ(select2.layers.first, 3);
  EXPECT_EQ(select2.layers.count, 4);

  WeightsManifestResponse manifest{Status::OK(), {std::byte{7}}};
  WeightsManifestResponse manifest2;
  ASSERT_OK(Decode(Encode(manifest), manifest2));
  EXPECT_EQ(manifest2.manifest, manifest.manifest);
  WeightsManifestResponse missing{Status::NotFound("no such shard"), {}};
  ASSERT_OK(Decode(Encode(missing), manifest2));
  EXPECT_EQ(manifest2.status.code(), StatusCode::kNotFound);
  EXPECT_TRUE(manifest2.manifest.empty());

  WeightsListResponse list{Status::OK(), {SampleWeightsInfo(), {}}};
  WeightsListResponse list2;
  ASSERT_OK(Decode(Encode(list), list2));
  ASSERT_EQ(list2.shards.size(), 2u);
  const WeightsInfo& info = list2.shards[0];
  const WeightsInfo want = SampleWeightsInfo();
  EXPECT_EQ(info.id, want.id);
  EXPECT_EQ(info.image_bytes, want.image_bytes);
  EXPECT_EQ(info.tensors, want.tensors);
  EXPECT_EQ(info.chunks, want.chunks);
  EXPECT_EQ(info.num_layers, want.num_layers);
  EXPECT_EQ(info.sealed_unix_ms, want.sealed_unix_ms);
  EXPECT_EQ(info.chunks_in_dram, want.chunks_in_dram);
  EXPECT_EQ(info.chunks_on_nvme, want.chunks_on_nvme);
  EXPECT_EQ(info.chunks_missing, want.chunks_missing);
  EXPECT_EQ(info.unique_bytes, want.unique_bytes);

  WeightsDropResponse drop{Status::OK(), 2, 1 << 20};
  WeightsDropResponse drop2;
  ASSERT_OK(Decode(Encode(drop), drop2));
  EXPECT_EQ(drop2.dropped, 2u);
  EXPECT_EQ(drop2.freed_bytes, 1u << 20);
}

TEST(ProtocolTest, WeightsHintAndPinRoundTrip) {
  WeightsHintRequest hint{
      {{{"glm-5", "a/b", PageHash{1, 2}}, 20000}, {{"teacher", "", {}}, -1}}};
  WeightsHintRequest hint2;
  ASSERT_OK(Decode(Encode(hint), hint2));
  ASSERT_EQ(hint2.items.size(), 2u);
  EXPECT_EQ(hint2.items[0].id, (WeightsId{"glm-5", "a/b", PageHash{1, 2}}));
  EXPECT_EQ(hint2.items[0].next_use_ms, 20000);
  EXPECT_EQ(hint2.items[1].id.model, "teacher");
  EXPECT_EQ(hint2.items[1].next_use_ms, -1);

  WeightsPinRequest pin{{"glm-5", "a/b", PageHash{3, 4}}, 60000};
  WeightsPinRequest pin2;
  ASSERT_OK(Decode(Encode(pin), pin2));
  EXPECT_EQ(pin2.id, pin.id);
  EXPECT_EQ(pin2.ttl_ms, 60000u);
}

TEST(ProtocolTest, MalformedHintAndPinMessagesAreRejected) {
  const auto hint =
      Encode(WeightsHintRequest{{{{"m", "l", PageHash{1, 2}}, 5}}});
  WeightsHintRequest hint_out;
  for (size_t cut = 0; cut < hint.size(); ++cut) {
    EXPECT_EQ(Decode(std::span(hint).first(cut), hint_out).code(),
              StatusCode::kProtocolError)
        << cut;
  }
  auto longer = hint;
  longer.push_back(std::byte{0});
  EXPECT_EQ(Decode(longer, hint_out).code(), StatusCode::kProtocolError);
  // An item count past the bytes sent.
  auto hostile = hint;
  hostile[3] = std::byte{0x7F};
  EXPECT_EQ(Decode(hostile, hint_out).code(), StatusCode::kProtocolError);
  // A model name longer than weights.h allows.
  WeightsPinRequest pin_out;
  EXPECT_EQ(
      Decode(Encode(WeightsPinRequest{{std::string(129, 'm'), "l", {}}, 1}),
             pin_out)
          .code(),
      StatusCode::kProtocolError);
  const auto pin = Encode(WeightsPinRequest{{"m", "l", {}}, 1});
  EXPECT_EQ(Decode(std::span(pin).first(pin.size() - 1), pin_out).code(),
            StatusCode::kProtocolError);
}

TEST(ProtocolTest, MalformedWeightsMessagesAreRejected) {
  // already_sealed is strict and never comes with an error.
  auto sealed = Encode(WeightsSealResponse{Status::OK(), {}, true});
  WeightsSealResponse sealed_out;
  sealed.back() = std::byte{2};
  EXPECT_EQ(Decode(sealed, sealed_out).code(), StatusCode::kProtocolError);
  EXPECT_EQ(Decode(Encode(WeightsSealResponse{Status::Busy(""), {}, true}),
                   sealed_out)
                .code(),
            StatusCode::kProtocolError);
  // A manifest length past the bytes sent.
  auto seal = Encode(WeightsSealRequest{{std::byte{1}, std::byte{2}}});
  seal[0] = std::byte{0xFF};
  WeightsSealRequest seal_out;
  EXPECT_EQ(Decode(seal, seal_out).code(), StatusCode::kProtocolError);
  // A model name longer than weights.h allows.
  WeightsSelectRequest select_out;
  EXPECT_EQ(
      Decode(Encode(WeightsSelectRequest{std::string(129, 'm'), "l", {}, {}}),
             select_out)
          .code(),
      StatusCode::kProtocolError);
  // Truncated anywhere, or trailing bytes: refused.
  const auto list =
      Encode(WeightsListResponse{Status::OK(), {SampleWeightsInfo()}});
  WeightsListResponse list_out;
  for (size_t cut = 0; cut < list.size(); ++cut) {
    EXPECT_EQ(Decode(std::span(list).first(cut), list_out).code(),
              StatusCode::kProtocolError)
        << cut;
  }
  auto longer = list;
  longer.push_back(std::byte{0});
  EXPECT_EQ(Decode(longer, list_out).code(), StatusCode::kProtocolError);
  // A hostile shard count.
  auto hostile = Encode(WeightsListResponse{Status::OK(), {}});
  hostile[hostile.size() - 1] = std::byte{0x7F};
  EXPECT_EQ(Decode(hostile, list_out).code(), StatusCode::kProtocolError);
}

// A cheap, always-on fuzz pass: random and mutated inputs to every decoder
// must fail cleanly (the sanitizer builds turn any overflow into a failure).
TEST(ProtocolTest, DecodersSurviveRandomAndMutatedInput) {
  std::mt19937_64 rng(99);
  std::vector<std::vector<std::byte>> seeds = {
      Encode(MatchRequest{{PageHash{1, 2}}}),
      Encode(PutReserveRequest{{{{PageHash{1, 2}, 1, 1}, 100}}}),
      Encode(KeysRequest{1, 2, {{PageHash{3, 4}, 5, 0}}}),
      Encode(RegisterLayoutRequest{LayoutSpec::Uniform(64, 2, {{"kv", 8}})}),
      Encode(OpenNamespaceRequest{"ns", "token"}),
      Encode(GetResponse{Status::OK(), 1, {{Status::OK(), Tier::kHost, 1, 2}}}),
      Encode([] {
        TransferRequest t = SampleTransfer();
        t.waits = WaitReport{};
        t.waits->counts[2] = 1;
        return t;
      }()),
      Encode(PutReserveResponse{
          Status::OK(), 1, {{Status::OK(), 0, /*already_stored=*/true}}}),
      Encode(WeightsSealRequest{{std::byte{1}, std::byte{2}}}),
      Encode(WeightsSelectRequest{"m", "l", PageHash{1, 2}, {3, 4}}),
      Encode(WeightsListResponse{Status::OK(), {SampleWeightsInfo()}}),
  };
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::byte> in = seeds[rng() % seeds.size()];
    if (rng() % 4 == 0) in.resize(rng() % 64);
    for (int flips = 1 + rng() % 4; flips > 0 && !in.empty(); --flips) {
      in[rng() % in.size()] = static_cast<std::byte>(rng());
    }
    MatchRequest a;
    PutReserveRequest b;
    KeysRequest c;
    RegisterLayoutRequest d;
    OpenNamespaceRequest e;
    GetResponse f;
    ListResponse g;
    MatchResponse h;
    TransferRequest t;
    (void)Decode(in, t);
    PutReserveResponse k;
    WeightsSealRequest ws;
    WeightsSealResponse wsr;
    WeightsSelectRequest wq;
    WeightsManifestResponse wm;
    WeightsListResponse wl;
    WeightsDropResponse wd;
    (void)Decode(in, ws);
    (void)Decode(in, wsr);
    (void)Decode(in, wq);
    (void)Decode(in, wm);
    (void)Decode(in, wl);
    (void)Decode(in, wd);
    EXPECT_LE(ws.manifest.size(), in.size());
    EXPECT_LE(wl.shards.size(), in.size());
    (void)Decode(in, a);
    (void)Decode(in, b);
    (void)Decode(in, c);
    (void)Decode(in, d);
    (void)Decode(in, e);
    (void)Decode(in, f);
    (void)Decode(in, g);
    (void)Decode(in, h);
    (void)Decode(in, k);
    // Whatever decoded must be bounded by the input size.
    EXPECT_LE(b.items.size() * kWireKeyBytes, in.size() + kWireKeyBytes);
  }
}

}  // namespace
}  // namespace tierkv::transport
