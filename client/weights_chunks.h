// WeightsChunkSource: where the bytes of each chunk of a planned weights
// image come from (Client::PutWeights). A chunk inside one tensor (a large
// tensor's piece, or a pack holding a single tensor) is that tensor's bytes,
// borrowed from the caller; any other chunk is a pack, assembled into a
// buffer: its tensors at their offsets, zeros in between (weights.h: the
// padding inside a pack is zero, so equal packs hash equal).
//
// Thread safety: immutable after construction; borrows the manifest and the
// tensors' bytes, which must outlive it.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tierkv/weights.h"

namespace tierkv::client_internal {

class WeightsChunkSource {
 public:
  // data[i] holds the bytes of manifest.tensors[i].
  // REQUIRES: data.size() == manifest.tensors.size(), data[i].size() ==
  // manifest.tensors[i].bytes, and the manifest is planned (offsets and
  // chunk ranges set, as PlanWeightsImage returns it).
  WeightsChunkSource(const WeightsManifest& manifest,
                     std::span<const std::span<const std::byte>> data);

  // Chunk c's bytes when they lie inside one tensor, else nullopt.
  std::optional<std::span<const std::byte>> Direct(size_t c) const;
  // Writes chunk c's bytes into `out`. REQUIRES: out.size() == its bytes.
  void Assemble(size_t c, std::span<std::byte> out) const;
  // "chunk 4 (layer 2, image bytes [8192, 12288): a.weight, a.bias)", for
  // error messages (names at most a few tensors).
  std::string Describe(size_t c) const;

 private:
  // Tensors [first, last) overlapping chunk c.
  std::pair<size_t, size_t> TensorsOf(size_t c) const;

  const WeightsManifest& manifest_;
  std::span<const std::span<const std::byte>> data_;
};

}  // namespace tierkv::client_internal
