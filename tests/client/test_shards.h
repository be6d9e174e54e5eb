// Weights shards for tests (issue 28): planned images of seeded tensors,
// their manifests with chunk keys set, and the chunks' Puts. Header-only:
// the test folders build only *_test.cc files.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "tierkv/client.h"
#include "tierkv/weights.h"

namespace tierkv::testing {

inline constexpr uint64_t kMiB = uint64_t{1} << 20;

// A tensor's bytes: a function of its seed alone, so two shards with a
// tensor of the same seed and size share its chunk.
inline std::vector<std::byte> TensorBytes(const std::string& seed,
                                          uint64_t bytes) {
  std::vector<std::byte> out(bytes);
  std::mt19937_64 rng(std::hash<std::string>()(seed));
  for (uint64_t i = 0; i < bytes; i += 8) {
    const uint64_t x = rng();
    std::memcpy(out.data() + i, &x, std::min<uint64_t>(8, bytes - i));
  }
  return out;
}

struct TensorSpec {
  std::string name;
  std::string seed;
  uint32_t layer;
  uint64_t bytes;
};

// A planned shard: its manifest (keys set), image and chunks' bytes.
struct TestShard {
  WeightsManifest manifest;
  std::vector<std::byte> image;
  std::vector<std::byte> encoded;
  PageHash version;

  std::span<const std::byte> ChunkBytes(size_t i) const {
    return std::span(image).subspan(manifest.chunks[i].offset,
                                    manifest.chunks[i].bytes);
  }
  SegmentKey ChunkKey(size_t i) const {
    return SegmentKey{manifest.chunks[i].key, 0, 0};
  }
};

inline TestShard MakeShard(const std::string& model, const std::string& layout,
                           const std::vector<TensorSpec>& specs) {
  std::vector<WeightsTensor> tensors;
  for (const TensorSpec& s : specs) {
    tensors.push_back(
        WeightsTensor{.name = s.name,
                      .dtype = "BF16",
                      .shape = {static_cast<int64_t>(s.bytes / 2)},
                      .layer = s.layer,
                      .bytes = s.bytes});
  }
  auto plan = PlanWeightsImage(model, layout, std::move(tensors));
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  TestShard shard;
  shard.manifest = std::move(plan).value();
  shard.image.assign(shard.manifest.image_bytes, std::byte{0});
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto bytes = TensorBytes(specs[i].seed, specs[i].bytes);
    std::memcpy(shard.image.data() + shard.manifest.tensors[i].offset,
                bytes.data(), bytes.size());
  }
  for (size_t i = 0; i < shard.manifest.chunks.size(); ++i) {
    shard.manifest.chunks[i].key = WeightsChunkKey(shard.ChunkBytes(i));
  }
  shard.encoded = EncodeWeightsManifest(shard.manifest);
  shard.version = WeightsVersionOf(shard.manifest);
  return shard;
}

// Puts chunks of `shard` (all but `skip`, an index or -1).
inline std::vector<PutResult> PutChunks(Client& c, const TestShard& shard,
                                        int skip = -1) {
  std::vector<SegmentWrite> writes;
  for (size_t i = 0; i < shard.manifest.chunks.size(); ++i) {
    if (static_cast<int>(i) == skip) continue;
    writes.push_back({shard.ChunkKey(i), shard.ChunkBytes(i)});
  }
  return c.Put(writes);
}

// Distinct chunk bytes of `shards` together.
inline uint64_t DistinctChunkBytes(
    std::initializer_list<const TestShard*> shards) {
  std::map<PageHash, uint64_t> bytes;
  for (const TestShard* s : shards) {
    for (const WeightsChunk& c : s->manifest.chunks) bytes[c.key] = c.bytes;
  }
  uint64_t total = 0;
  for (const auto& [key, b] : bytes) total += b;
  return total;
}

// A (2 MiB shared tensor, 1 MiB own, small own) and B (the same 2 MiB
// tensor, 1.5 MiB own, small own).
inline TestShard ShardA() {
  return MakeShard("glm-test", "tierkv-run/bf16/rank0-of-1",
                   {{"embed", "shared-embed", 0, 2 * kMiB},
                    {"l1.w", "a-l1w", 1, kMiB},
                    {"l1.norm", "a-norm", 1, 100}});
}
inline TestShard ShardB() {
  return MakeShard("glm-test-b", "tierkv-run/bf16/rank0-of-1",
                   {{"embed", "shared-embed", 0, 2 * kMiB},
                    {"l1.w", "b-l1w", 1, 3 * kMiB / 2},
                    {"l1.norm", "b-norm", 1, 300}});
}

// Flips one byte (its middle one) of chunk `i` of `shard` where the NVMe
// tier's data file at `data_path` holds it, found by its first 64 bytes
// (seeded noise, found nowhere else). REQUIRES: the daemon is stopped.
inline ::testing::AssertionResult FlipAByteOfChunk(const std::string& data_path,
                                                   const TestShard& shard,
                                                   size_t i) {
  std::FILE* f = std::fopen(data_path.c_str(), "r+b");
  if (f == nullptr)
    return ::testing::AssertionFailure() << "open " << data_path;
  std::vector<char> file;
  char buf[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) {
    file.insert(file.end(), buf, buf + n);
  }
  const auto want = shard.ChunkBytes(i);
  const char* head = reinterpret_cast<const char*>(want.data());
  const auto at = std::search(file.begin(), file.end(), head, head + 64);
  if (at == file.end()) {
    std::fclose(f);
    return ::testing::AssertionFailure()
           << "chunk bytes not found in the data file";
  }
  const long offset = static_cast<long>(at - file.begin()) +
                      static_cast<long>(shard.manifest.chunks[i].bytes / 2);
  const char flipped = static_cast<char>(file[offset] ^ 0x5a);
  const bool written = std::fseek(f, offset, SEEK_SET) == 0 &&
                       std::fwrite(&flipped, 1, 1, f) == 1;
  if (std::fclose(f) != 0 || !written) {
    return ::testing::AssertionFailure() << "writing " << data_path;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace tierkv::testing
