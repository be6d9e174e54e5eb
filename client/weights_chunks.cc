// WeightsChunkSource (weights_chunks.h).
#include "client/weights_chunks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace tierkv::client_internal {

WeightsChunkSource::WeightsChunkSource(
    const WeightsManifest& manifest,
    std::span<const std::span<const std::byte>> data)
    : manifest_(manifest), data_(data) {}

std::pair<size_t, size_t> WeightsChunkSource::TensorsOf(size_t c) const {
  const WeightsChunk& chunk = manifest_.chunks[c];
  const auto& tensors = manifest_.tensors;
  // Tensors are in ascending, non-overlapping offsets: the first one that
  // ends past the chunk's start, then every one that starts before its end.
  auto first = std::partition_point(tensors.begin(), tensors.end(),
                                    [&](const WeightsTensor& t) {
                                      return t.offset + t.bytes <= chunk.offset;
                                    });
  auto last =
      std::partition_point(first, tensors.end(), [&](const WeightsTensor& t) {
        return t.offset < chunk.offset + chunk.bytes;
      });
  return {static_cast<size_t>(first - tensors.begin()),
          static_cast<size_t>(last - tensors.begin())};
}

std::optional<std::span<const std::byte>> WeightsChunkSource::Direct(
    size_t c) const {
  const WeightsChunk& chunk = manifest_.chunks[c];
  const auto [first, last] = TensorsOf(c);
  if (last - first != 1) return std::nullopt;
  const WeightsTensor& t = manifest_.tensors[first];
  if (chunk.offset < t.offset ||
      chunk.offset + chunk.bytes > t.offset + t.bytes) {
    return std::nullopt;  // the chunk has padding around the tensor
  }
  return data_[first].subspan(chunk.offset - t.offset, chunk.bytes);
}

void WeightsChunkSource::Assemble(size_t c, std::span<std::byte> out) const {
  const WeightsChunk& chunk = manifest_.chunks[c];
  std::memset(out.data(), 0, out.size());
  const auto [first, last] = TensorsOf(c);
  for (size_t i = first; i < last; ++i) {
    const WeightsTensor& t = manifest_.tensors[i];
    // The overlap of tensor i and the chunk, in image offsets.
    const uint64_t begin = std::max(t.offset, chunk.offset);
    const uint64_t end =
        std::min(t.offset + t.bytes, chunk.offset + chunk.bytes);
    std::memcpy(out.data() + (begin - chunk.offset),
                data_[i].data() + (begin - t.offset), end - begin);
  }
}

std::string WeightsChunkSource::Describe(size_t c) const {
  const WeightsChunk& chunk = manifest_.chunks[c];
  const auto [first, last] = TensorsOf(c);
  constexpr size_t kNamed = 3;  // a pack may hold hundreds
  std::string names;
  for (size_t i = first; i < last && i < first + kNamed; ++i) {
    if (!names.empty()) names += ", ";
    names += manifest_.tensors[i].name;
  }
  if (last - first > kNamed) {
    names += fmt::format(" and {} more", last - first - kNamed);
  }
  return fmt::format("chunk {} (layer {}, image bytes [{}, {}): {})", c,
                     chunk.layer, chunk.offset, chunk.offset + chunk.bytes,
                     names);
}

}  // namespace tierkv::client_internal
