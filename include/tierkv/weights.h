// Model weights in the tiers (issue 28): named, versioned, content-addressed
// weight shards stored in a daemon namespace marked `weights = true`, beside
// the KV namespaces and under their own DRAM and NVMe budgets.
//
// The model. A *shard* is what one engine rank loads: its tensors in load
// order, laid out back to back in one byte *image* (the engine's weights
// buffer; tensor i lives at image offset tensors[i].offset). The image is
// cut into *chunks*, each named by the XXH3-128 of its bytes:
//   - a tensor of >= kWeightsSmallTensorBytes starts 4 KiB aligned and is
//     cut into pieces of kWeightsMaxChunkBytes (the last one shorter);
//   - a run of consecutive smaller tensors of one layer is packed into one
//     chunk (each 256-byte aligned inside it; a pack starts 4 KiB aligned
//     and closes before it would pass kWeightsMaxChunkBytes).
// No chunk spans two layers, so layer l is in place once its chunks are.
// Equal bytes get equal keys, so a tensor two versions (or two models)
// share is stored once. Padding between tensors is zero inside a pack and
// belongs to no chunk outside one (a loader leaves it untouched).
//
// A *manifest* lists the shard's tensors and chunks; sealing it in the
// daemon makes the shard loadable. Its *version* is the XXH3-128 of the
// manifest's encoding, so (model, layout, version) names exactly one set
// of bytes, and an engine can check the version it loaded (a resumed
// teacher that silently kept other weights is a known failure elsewhere).
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv {

inline constexpr uint64_t kWeightsMaxChunkBytes = uint64_t{64} << 20;
// Tensors smaller than this are packed with their layer's neighbours.
inline constexpr uint64_t kWeightsSmallTensorBytes = uint64_t{1} << 20;
// Where a large tensor or a pack starts in the image.
inline constexpr uint64_t kWeightsChunkAlignment = 4096;
// Where a small tensor starts inside its pack.
inline constexpr uint64_t kWeightsPackedAlignment = 256;
// Limits a manifest must keep (the daemon refuses larger ones; an encoded
// manifest must also fit one request frame, 16 MiB by default). GLM-5 has
// 59,870 tensors in all, and a rank loads a share of them.
inline constexpr uint32_t kWeightsMaxTensors = 1u << 17;
inline constexpr uint32_t kWeightsMaxLayers = 1u << 16;
// The largest manifest encoding a daemon seals: what one frame of the
// default 16 MiB can carry, less room for the message around it.
inline constexpr uint64_t kWeightsMaxManifestBytes =
    (uint64_t{16} << 20) - 4096;
inline constexpr uint64_t kWeightsMaxImageBytes = uint64_t{1} << 42;  // 4 TiB

struct WeightsTensor {
  std::string name;  // 1..1024 bytes, unique in the shard
  // The safetensors dtype string ("BF16", "F32", "F8_E4M3", "I8", ...):
  // 1..16 printable ASCII characters; tierkv never interprets it.
  std::string dtype;
  std::vector<int64_t> shape;  // up to 8 dimensions, each >= 0
  // The layer group it belongs to: nondecreasing in load order, from 0.
  // Tensors outside the transformer layers (embeddings, final norm, head)
  // go with the first or the last group, as the engine uses them.
  uint32_t layer = 0;
  uint64_t offset = 0;  // in the image (set by PlanWeightsImage)
  uint64_t bytes = 0;   // >= 1

  friend bool operator==(const WeightsTensor&, const WeightsTensor&) = default;
};

struct WeightsChunk {
  PageHash key;         // WeightsChunkKey of its bytes
  uint64_t offset = 0;  // in the image
  uint64_t bytes = 0;   // 1..kWeightsMaxChunkBytes
  uint32_t layer = 0;

  friend bool operator==(const WeightsChunk&, const WeightsChunk&) = default;
};

struct WeightsManifest {
  // The model's name: 1..128 of [A-Za-z0-9._@+-]. A teacher, an actor, a
  // checkpoint step: whatever the caller switches between.
  std::string model;
  // The shard layout: which engine, quantization, rank and world size the
  // image is for, e.g. "tierkv-run/bf16/rank0-of-1" (1..256 of the model
  // name's characters plus / : = ,). A capture from one engine version
  // must not be loaded by another: put what matters in here.
  std::string layout;
  uint32_t num_layers = 0;   // layer groups: the last tensor's layer + 1
  uint64_t image_bytes = 0;  // the end of the last tensor
  std::vector<WeightsTensor> tensors;  // load order
  std::vector<WeightsChunk> chunks;    // by offset

  friend bool operator==(const WeightsManifest&,
                         const WeightsManifest&) = default;

  // InvalidArgument, naming the first problem, unless: names and lengths
  // as above; tensors in load order with nondecreasing layers, ascending
  // non-overlapping offsets inside the image; chunks ascending and
  // non-overlapping, each inside one layer's range and of a valid size;
  // every tensor byte inside exactly one chunk and every chunk byte inside
  // a tensor or a pack's padding; image_bytes and num_layers consistent;
  // the limits above.
  Status Validate() const;
  // Chunks [first, last) hold layer `layer` (chunks are in layer order).
  std::pair<size_t, size_t> ChunksOfLayer(uint32_t layer) const;
};

// Lays out `tensors` (name, dtype, shape, layer and bytes set; in load
// order) in an image as described at the top, and returns the manifest
// with every offset and chunk range set and every chunk key zero (the
// caller hashes the bytes: WeightsChunkKey). Deterministic: the same
// tensors always give the same plan. InvalidArgument as Validate would.
Result<WeightsManifest> PlanWeightsImage(std::string model, std::string layout,
                                         std::vector<WeightsTensor> tensors);

// The content key of a chunk: XXH3-128 of its bytes.
PageHash WeightsChunkKey(std::span<const std::byte> bytes);

// The segment a chunk is stored as in a weights namespace: its key as the
// page, layer 0, part 0 (equal keys are equal bytes, so dedup is exact).
constexpr SegmentKey WeightsChunkSegment(const PageHash& key) {
  return SegmentKey{.page = key, .layer = 0, .part = 0};
}

// A versioned binary encoding (little-endian; see weights_manifest.cc).
std::vector<std::byte> EncodeWeightsManifest(const WeightsManifest& manifest);
// Corruption for anything malformed (never trusts its input: lengths are
// checked before use), else the decoded manifest, Validate()d.
Result<WeightsManifest> DecodeWeightsManifest(std::span<const std::byte> in);
// XXH3-128 of EncodeWeightsManifest(manifest).
PageHash WeightsVersionOf(const WeightsManifest& manifest);

// Names one sealed shard. A zero version means "the newest sealed version
// of (model, layout)" where an API says it accepts that.
struct WeightsId {
  std::string model;
  std::string layout;
  PageHash version;

  friend bool operator==(const WeightsId&, const WeightsId&) = default;
};

// What the daemon holds of one sealed shard (Client::ListWeights).
struct WeightsInfo {
  WeightsId id;
  uint64_t image_bytes = 0;
  uint32_t tensors = 0;
  uint32_t chunks = 0;
  uint32_t num_layers = 0;
  uint64_t sealed_unix_ms = 0;
  // Where its chunks are now: in DRAM, only on NVMe, or nowhere (evicted
  // past the namespace's NVMe budget: the shard must be stored again).
  uint32_t chunks_in_dram = 0;
  uint32_t chunks_on_nvme = 0;
  uint32_t chunks_missing = 0;
  // Bytes of its chunks no other sealed shard references.
  uint64_t unique_bytes = 0;
};

}  // namespace tierkv
