// Wire-visible value types: tiers, page hashes, segment keys and layouts.
//
// These are plain values shared by the client, the daemon and storage; all
// are safe to copy and to use from any thread. See DESIGN.md §3.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tierkv/status.h"

namespace tierkv {

// Where a segment lives. Lower values are faster. Values travel on the wire.
enum class Tier : uint8_t {
  kHbm = 0,   // GPU memory pool (or its host emulation)
  kHost = 1,  // host DRAM arena (memfd shared memory)
  kNvme = 2,  // local NVMe, io_uring + O_DIRECT
  kPeer = 3,  // another node (later)
  kMiss = 255,
};

constexpr std::string_view TierName(Tier tier) {
  switch (tier) {
    case Tier::kHbm:
      return "hbm";
    case Tier::kHost:
      return "host";
    case Tier::kNvme:
      return "nvme";
    case Tier::kPeer:
      return "peer";
    case Tier::kMiss:
      return "miss";
  }
  return "unknown";
}

// A 128-bit chained prefix hash naming one page of tokens (see page_hash.h).
// Equal hashes mean equal prefixes, so equal pages are stored once.
struct PageHash {
  uint64_t lo = 0;
  uint64_t hi = 0;

  friend auto operator<=>(const PageHash&, const PageHash&) = default;
  // 32 lowercase hex digits, high word first.
  std::string ToHex() const;
  // Parses ToHex()'s output. Returns InvalidArgument on anything else.
  static Result<PageHash> FromHex(std::string_view hex);
};

// How often sparse attention's indexer selected tokens of `page` on full
// (indexer) layer `layer` since the last report (Client::ReportTopk): the
// daemon's `topk` eviction policy keeps what is selected often.
struct SelectionReport {
  PageHash page;
  uint16_t layer = 0;
  uint32_t count = 0;
};

// Layers [first, first + count) of a layout (a transfer's, a prefetch's);
// count 0 means through the last layer.
struct LayerRange {
  uint16_t first = 0;
  uint16_t count = 0;
  bool Contains(uint16_t layer) const {
    return layer >= first && (count == 0 || layer - first < count);
  }
};

// The unit of storage, transfer and eviction: one part of one layer of one
// page, e.g. (page, layer 7, part "kv").
struct SegmentKey {
  PageHash page;
  uint16_t layer = 0;
  uint8_t part = 0;  // index into the layer's part list in the LayoutSpec

  friend auto operator<=>(const SegmentKey&, const SegmentKey&) = default;
  std::string ToString() const;  // "<hex>/<layer>/<part>"
};

// One kind of per-token data stored for a layer, e.g. {"kv", 1152} for bf16
// MLA latent KV or {"index_k", 132} for an FP8 indexer key plus scale.
struct PartSpec {
  std::string name;
  uint32_t bytes_per_token = 0;  // any positive size; no power of two assumed

  friend bool operator==(const PartSpec&, const PartSpec&) = default;
};

struct LayerSpec {
  std::vector<PartSpec> parts;  // may differ per layer (IndexShare)

  friend bool operator==(const LayerSpec&, const LayerSpec&) = default;
};

// The KV layout of a namespace, registered once. A segment's size is
// page_tokens * bytes_per_token of its part.
struct LayoutSpec {
  uint32_t page_tokens = 64;  // FlashMLA requires 64
  std::vector<LayerSpec> layers;

  friend bool operator==(const LayoutSpec&, const LayoutSpec&) = default;

  // Same part list on every layer.
  static LayoutSpec Uniform(uint32_t page_tokens, uint32_t num_layers,
                            std::vector<PartSpec> parts);

  uint32_t num_layers() const { return static_cast<uint32_t>(layers.size()); }

  // InvalidArgument when a field is zero or out of range: page_tokens in
  // [1, 65536], 1..65535 layers, 1..255 parts per layer, unique part names
  // within a layer, bytes_per_token in [1, 1 MiB], segments up to 1 GiB.
  Status Validate() const;

  // Size in bytes of segment (layer, part); 0 when no such part.
  uint64_t SegmentBytes(uint16_t layer, uint8_t part) const;

  // Index of the part called `name` on `layer`, or -1 when absent.
  int FindPart(uint16_t layer, std::string_view name) const;

  // A stable 64-bit fingerprint of the layout (stored with persisted data).
  uint64_t Fingerprint() const;
};

}  // namespace tierkv

namespace tierkv::internal {
// MurmurHash3's 64-bit finalizer: every input bit affects every output bit,
// so low bits are usable for sharding even for structured test keys.
constexpr uint64_t Mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}
}  // namespace tierkv::internal

template <>
struct std::hash<tierkv::PageHash> {
  size_t operator()(const tierkv::PageHash& h) const noexcept {
    return static_cast<size_t>(
        tierkv::internal::Mix64(h.lo ^ tierkv::internal::Mix64(h.hi)));
  }
};

template <>
struct std::hash<tierkv::SegmentKey> {
  size_t operator()(const tierkv::SegmentKey& k) const noexcept {
    const uint64_t mix = (uint64_t{k.layer} << 8) | k.part;
    return static_cast<size_t>(tierkv::internal::Mix64(
        k.page.lo ^ tierkv::internal::Mix64(k.page.hi ^ (mix << 40))));
  }
};
