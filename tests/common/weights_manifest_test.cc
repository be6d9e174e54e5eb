// Tests common/weights_manifest.cc: the image plan's rules, chunk keys, the
// manifest's rules (Validate) and its encoding.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/testing/status_matchers.h"
#include "tierkv/weights.h"

namespace tierkv {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

WeightsTensor Tensor(std::string name, uint32_t layer, uint64_t bytes) {
  WeightsTensor t;
  t.name = std::move(name);
  t.dtype = "BF16";
  t.shape = {static_cast<int64_t>(bytes)};
  t.layer = layer;
  t.bytes = bytes;
  return t;
}

// Fills every chunk's key from deterministic bytes, so encodings carry
// non-zero keys.
void KeyChunks(WeightsManifest& m) {
  for (size_t i = 0; i < m.chunks.size(); ++i) {
    m.chunks[i].key = PageHash{0x1000 + i, 0x2000 + i};
  }
}

// embed (2 MiB, layer 0); two small tensors of layer 0; a small one, a
// large one of 64 MiB + 5 and a small one of layer 1.
std::vector<WeightsTensor> MixedTensors() {
  return {Tensor("embed", 0, 2 * kMiB),     Tensor("l0.norm", 0, 100),
          Tensor("l0.bias", 0, 300),        Tensor("l1.norm", 1, 10),
          Tensor("l1.w", 1, 64 * kMiB + 5), Tensor("l1.tail", 1, 7)};
}

WeightsManifest MixedPlan() {
  auto plan =
      PlanWeightsImage("glm-5", "tierkv-run/bf16/rank0-of-1", MixedTensors());
  EXPECT_OK(plan);
  return plan.ok() ? *plan : WeightsManifest{};
}

TEST(PlanWeightsImage, PlacesLargeTensorsAlignedAndPacksSmallOnes) {
  const WeightsManifest m = MixedPlan();
  ASSERT_EQ(m.tensors.size(), 6u);
  const uint64_t pack0 = 2 * kMiB;               // right after embed
  const uint64_t pack1 = pack0 + 4096;           // l0's pack is 556 bytes
  const uint64_t big = pack1 + 4096;             // l1.norm's pack is 10 bytes
  const uint64_t tail = big + 64 * kMiB + 4096;  // after l1.w's 5-byte end
  EXPECT_EQ(m.tensors[0].offset, 0u);
  EXPECT_EQ(m.tensors[1].offset, pack0);
  EXPECT_EQ(m.tensors[2].offset, pack0 + 256);  // 256-aligned in its pack
  EXPECT_EQ(m.tensors[3].offset, pack1);        // a new layer, a new pack
  EXPECT_EQ(m.tensors[4].offset, big);
  EXPECT_EQ(m.tensors[5].offset, tail);
  EXPECT_EQ(m.image_bytes, tail + 7);
  EXPECT_EQ(m.num_layers, 2u);

  const std::vector<WeightsChunk> expected = {
      {PageHash{}, 0, 2 * kMiB, 0},        {PageHash{}, pack0, 256 + 300, 0},
      {PageHash{}, pack1, 10, 1},          {PageHash{}, big, 64 * kMiB, 1},
      {PageHash{}, big + 64 * kMiB, 5, 1}, {PageHash{}, tail, 7, 1},
  };
  EXPECT_EQ(m.chunks, expected);
  EXPECT_OK(m.Validate());
}

TEST(PlanWeightsImage, CutsLargeTensorsInto64MiBPieces) {
  auto m = PlanWeightsImage("m", "l", {Tensor("w", 0, 3 * 64 * kMiB)});
  ASSERT_OK(m);
  ASSERT_EQ(m->chunks.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(m->chunks[i].offset, i * 64 * kMiB);
    EXPECT_EQ(m->chunks[i].bytes, 64 * kMiB);
  }
  // A tensor of exactly 1 MiB is large: a chunk of its own, not a pack.
  m = PlanWeightsImage(
      "m", "l", {Tensor("a", 0, 10), Tensor("b", 0, kMiB), Tensor("c", 0, 10)});
  ASSERT_OK(m);
  ASSERT_EQ(m->chunks.size(), 3u);
  EXPECT_EQ(m->tensors[1].offset, 4096u);
  EXPECT_EQ(m->chunks[1].bytes, kMiB);
  EXPECT_EQ(m->tensors[2].offset, 4096u + kMiB);
}

TEST(PlanWeightsImage, ClosesAPackBeforeItPasses64MiB) {
  // Tensors of 1 MiB - 1 take 1 MiB each in a pack: 64 fit, the 65th
  // starts the next pack at the next 4 KiB boundary.
  std::vector<WeightsTensor> tensors;
  for (int i = 0; i < 70; ++i) {
    tensors.push_back(Tensor("t" + std::to_string(i), 0, kMiB - 1));
  }
  auto m = PlanWeightsImage("m", "l", tensors);
  ASSERT_OK(m);
  ASSERT_EQ(m->chunks.size(), 2u);
  EXPECT_EQ(m->chunks[0].offset, 0u);
  EXPECT_EQ(m->chunks[0].bytes, 64 * kMiB - 1);
  EXPECT_EQ(m->tensors[63].offset, 63 * kMiB);
  EXPECT_EQ(m->tensors[64].offset, 64 * kMiB);
  EXPECT_EQ(m->chunks[1].offset, 64 * kMiB);
  EXPECT_EQ(m->chunks[1].bytes, 5 * kMiB + kMiB - 1);
}

TEST(PlanWeightsImage, NoChunkSpansTwoLayers) {
  std::vector<WeightsTensor> tensors;
  for (uint32_t l = 0; l < 5; ++l) {
    for (int i = 0; i < 3; ++i) {
      tensors.push_back(
          Tensor("l" + std::to_string(l) + "." + std::to_string(i), l, 1000));
    }
  }
  auto m = PlanWeightsImage("m", "l", tensors);
  ASSERT_OK(m);
  ASSERT_EQ(m->chunks.size(), 5u);
  for (uint32_t l = 0; l < 5; ++l) {
    EXPECT_EQ(m->chunks[l].layer, l);
    EXPECT_EQ(m->chunks[l].offset, l * 4096u);
    EXPECT_EQ(m->chunks[l].bytes, 2 * 1024u + 1000);
    EXPECT_EQ(m->ChunksOfLayer(l), (std::pair<size_t, size_t>{l, l + 1}));
  }
  EXPECT_EQ(m->ChunksOfLayer(7), (std::pair<size_t, size_t>{5, 5}));
}

TEST(PlanWeightsImage, IsDeterministic) {
  const WeightsManifest a = MixedPlan();
  const WeightsManifest b = MixedPlan();
  EXPECT_EQ(a, b);
  EXPECT_EQ(EncodeWeightsManifest(a), EncodeWeightsManifest(b));
  EXPECT_EQ(WeightsVersionOf(a), WeightsVersionOf(b));
}

TEST(PlanWeightsImage, RefusesWhatValidateWould) {
  auto m = PlanWeightsImage("m", "l", {});
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  m = PlanWeightsImage("m", "l", {Tensor("a", 1, 10), Tensor("b", 0, 10)});
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  m = PlanWeightsImage("bad name", "l", {Tensor("a", 0, 10)});
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("model"), std::string::npos);
}

TEST(WeightsChunkKey, IsXxh3Of128BitsOfTheBytes) {
  const std::string text = "tierkv weights";
  const auto bytes = std::as_bytes(std::span(text.data(), text.size()));
  const XXH128_hash_t h = XXH3_128bits(text.data(), text.size());
  EXPECT_EQ(WeightsChunkKey(bytes), (PageHash{h.low64, h.high64}));
  const std::string other = "tierkv weightz";
  EXPECT_NE(WeightsChunkKey(std::as_bytes(std::span(other.data(), 14))),
            WeightsChunkKey(bytes));
}

TEST(WeightsManifestEncoding, RoundTrips) {
  WeightsManifest m = MixedPlan();
  KeyChunks(m);
  const auto bytes = EncodeWeightsManifest(m);
  auto decoded = DecodeWeightsManifest(bytes);
  ASSERT_OK(decoded);
  EXPECT_EQ(*decoded, m);
  EXPECT_EQ(WeightsVersionOf(*decoded), WeightsVersionOf(m));
  // Another key, another version.
  WeightsManifest changed = m;
  changed.chunks[2].key.lo ^= 1;
  EXPECT_NE(WeightsVersionOf(changed), WeightsVersionOf(m));
}

TEST(WeightsManifestEncoding, TruncationIsCorruptionAtEveryCut) {
  WeightsManifest m = MixedPlan();
  KeyChunks(m);
  const auto bytes = EncodeWeightsManifest(m);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    auto r = DecodeWeightsManifest(std::span(bytes).first(cut));
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << cut;
  }
  auto longer = bytes;
  longer.push_back(std::byte{0});
  EXPECT_EQ(DecodeWeightsManifest(longer).status().code(),
            StatusCode::kCorruption);
}

TEST(WeightsManifestEncoding, GarbledBytesAreCorruptionOrAValidManifest) {
  WeightsManifest m = MixedPlan();
  KeyChunks(m);
  const auto bytes = EncodeWeightsManifest(m);
  std::mt19937 rng(28);
  for (size_t at = 0; at < bytes.size(); ++at) {
    for (uint8_t flip : {0x01, 0x80, 0xFF}) {
      auto garbled = bytes;
      garbled[at] ^= std::byte{flip};
      auto r = DecodeWeightsManifest(garbled);
      if (r.ok()) {
        EXPECT_OK(r->Validate());  // e.g. a key byte: still well-formed
      } else {
        EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << at;
      }
    }
  }
  for (int i = 0; i < 2000; ++i) {
    std::vector<std::byte> noise(rng() % 256);
    for (auto& b : noise) b = std::byte(rng());
    if (noise.size() >= 6 && i % 2 == 0) {  // past the magic and format
      std::memcpy(noise.data(), bytes.data(), 6);
    }
    EXPECT_FALSE(DecodeWeightsManifest(noise).ok());
  }
}

TEST(WeightsManifestEncoding, HostileCountsDoNotAllocate) {
  WeightsManifest m = MixedPlan();
  auto bytes = EncodeWeightsManifest(m);
  // The tensor count follows magic(4) format(2) model layout (u32 + bytes
  // each) num_layers(4) image_bytes(8).
  const size_t count_at = 6 + 4 + m.model.size() + 4 + m.layout.size() + 12;
  uint32_t count;
  std::memcpy(&count, bytes.data() + count_at, 4);
  ASSERT_EQ(count, m.tensors.size());
  for (uint32_t hostile : {0xFFFFFFFFu, 1u << 17, 1000u}) {
    auto bad = bytes;
    std::memcpy(bad.data() + count_at, &hostile, 4);
    EXPECT_EQ(DecodeWeightsManifest(bad).status().code(),
              StatusCode::kCorruption);
  }
}

TEST(WeightsManifestEncoding, InvalidManifestsDecodeAsCorruptionNamingIt) {
  WeightsManifest m = MixedPlan();
  m.num_layers = 5;
  auto r = DecodeWeightsManifest(EncodeWeightsManifest(m));
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_NE(r.status().message().find("num_layers"), std::string::npos);
}

// Validate: one broken rule at a time; the message names it.
struct Broken {
  const char* what;
  void (*breaks)(WeightsManifest&);
  const char* message_part;
};

class WeightsManifestValidate : public ::testing::TestWithParam<Broken> {};

TEST_P(WeightsManifestValidate, NamesTheFirstProblem) {
  WeightsManifest m = MixedPlan();
  ASSERT_OK(m.Validate());
  GetParam().breaks(m);
  const Status s = m.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << GetParam().what;
  EXPECT_NE(s.message().find(GetParam().message_part), std::string::npos)
      << GetParam().what << ": " << s.ToString();
}

INSTANTIATE_TEST_SUITE_P(
    Rules, WeightsManifestValidate,
    ::testing::Values(
        Broken{"empty model", [](WeightsManifest& m) { m.model.clear(); },
               "model"},
        Broken{"model char", [](WeightsManifest& m) { m.model = "a b"; },
               "model"},
        Broken{"long model",
               [](WeightsManifest& m) { m.model = std::string(129, 'a'); },
               "model"},
        Broken{"layout char", [](WeightsManifest& m) { m.layout = "x|y"; },
               "layout"},
        Broken{"no tensors", [](WeightsManifest& m) { m.tensors.clear(); },
               "at least one tensor"},
        Broken{"duplicate name",
               [](WeightsManifest& m) { m.tensors[2].name = "l0.norm"; },
               "appears twice"},
        Broken{"empty name",
               [](WeightsManifest& m) { m.tensors[1].name.clear(); }, "name"},
        Broken{"dtype",
               [](WeightsManifest& m) { m.tensors[1].dtype = "BF\x01"; },
               "dtype"},
        Broken{"long dtype",
               [](WeightsManifest& m) {
                 m.tensors[1].dtype = std::string(17, 'F');
               },
               "dtype"},
        Broken{"rank",
               [](WeightsManifest& m) { m.tensors[1].shape.assign(9, 1); },
               "dimensions"},
        Broken{"negative dim",
               [](WeightsManifest& m) { m.tensors[1].shape = {-1}; },
               "negative"},
        Broken{"zero bytes", [](WeightsManifest& m) { m.tensors[1].bytes = 0; },
               "bytes"},
        Broken{"layers decrease",
               [](WeightsManifest& m) { m.tensors[2].layer = 2; },
               "must not decrease"},
        Broken{"first layer",
               [](WeightsManifest& m) {
                 for (auto& t : m.tensors) t.layer += 1;
               },
               "first tensor's layer"},
        Broken{"overlap",
               [](WeightsManifest& m) { m.tensors[2].offset -= 200; },
               "overlaps"},
        Broken{"image_bytes", [](WeightsManifest& m) { m.image_bytes += 1; },
               "image_bytes"},
        Broken{"num_layers", [](WeightsManifest& m) { m.num_layers = 3; },
               "num_layers"},
        Broken{"chunk too large",
               [](WeightsManifest& m) {
                 m.chunks[3].bytes += 5;
                 m.chunks.erase(m.chunks.begin() + 4);
               },
               "bytes, not in 1.."},
        Broken{"chunk spans layers",
               [](WeightsManifest& m) {
                 // l0's pack grows to cover l1.norm's pack.
                 m.chunks[1].bytes = m.chunks[2].offset + m.chunks[2].bytes -
                                     m.chunks[1].offset;
                 m.chunks.erase(m.chunks.begin() + 2);
               },
               "holds tensor 'l1.norm' of layer 1"},
        Broken{"chunk layer", [](WeightsManifest& m) { m.chunks[0].layer = 1; },
               "holds tensor 'embed'"},
        Broken{"tensor bytes skipped",
               [](WeightsManifest& m) { m.chunks.erase(m.chunks.begin() + 4); },
               "next tensor byte to cover"},
        Broken{"last tensor uncovered",
               [](WeightsManifest& m) { m.chunks.pop_back(); },
               "'l1.tail' is not covered"},
        Broken{"chunk ends in padding",
               [](WeightsManifest& m) { m.chunks[1].bytes += 100; },
               "in padding"},
        Broken{"chunk starts in padding",
               [](WeightsManifest& m) {
                 m.chunks[2].offset -= 16;
                 m.chunks[2].bytes += 16;
               },
               "starts at"},
        Broken{"no chunks", [](WeightsManifest& m) { m.chunks.clear(); },
               "without chunks"}),
    [](const auto& info) {
      std::string name = info.param.what;
      for (char& c : name) {
        if (!isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

TEST(WeightsManifestLimits, TensorCountLimitIsEnforced) {
  WeightsManifest m;
  m.model = "m";
  m.layout = "l";
  for (uint32_t i = 0; i <= kWeightsMaxTensors; ++i) {
    WeightsTensor t = Tensor("t" + std::to_string(i), 0, 1);
    t.offset = i * 256;
    m.tensors.push_back(std::move(t));
  }
  const Status s = m.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tensors, more than"), std::string::npos);
}

}  // namespace
}  // namespace tierkv
