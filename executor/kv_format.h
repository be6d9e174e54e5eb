// KvFormat: the byte layout a KV row is stored in (`--kv-dtype`), and its
// exact encode / decode, shared by every KvCache so that two caches of one
// format hand attention the same floats.
//
//   fp32  the reference rows, 4 B per value (default).
//   bf16  2 B per value, round to nearest even: GLM-5's latent row is
//         576 values = 1152 B, its indexer key 128 values = 256 B.
//   fp8   DeepSeek-V3.2's formats (glm5-dsa.md, appendix "KV byte formats"):
//         latent rows as FlashMLA's fp8_ds_mla record: the NoPE part
//         (kv_lora_rank values) as e4m3 in tiles of 128 values, one fp32
//         scale per tile, then the RoPE part as bf16, not quantized: 512 +
//         16 + 128 = 656 B for GLM-5. Indexer keys as the indexer's
//         act_quant: e4m3 per 128-value tile plus one fp32 scale each: 128
//         + 4 = 132 B. Scales are powers of two (UE8M0, scale_fmt set as in
//         GLM-5 / DeepSeek-V3.2): s = 2^ceil(log2(amax / 448)) with amax =
//         max(|x|, 1e-4) over the tile, q = e4m3(clamp(x / s, -448, 448));
//         decoding is q * s. A last tile shorter than 128 values (small
//         presets) gets its own scale.
//
// A cache quantizes on Write and dequantizes on read; attention sees the
// dequantized floats, as an engine with an fp8 KV cache does.
//
// Thread safety: immutable values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "tierkv/status.h"

namespace tierkv::executor {

enum class KvDtype : uint8_t { kF32, kBF16, kFP8 };

// "fp32" | "bf16" | "fp8"; InvalidArgument otherwise.
Result<KvDtype> ParseKvDtype(std::string_view name);
std::string_view KvDtypeName(KvDtype dtype);

// The stored format of one row kind.
struct KvRowFormat {
  KvDtype dtype = KvDtype::kF32;
  int64_t dim = 0;         // values per row
  int64_t fp8_values = 0;  // leading values quantized in fp8 (the rest bf16)

  // A latent row: `nope` quantized values (kv_lora_rank), then the RoPE part.
  static KvRowFormat Latent(KvDtype dtype, int64_t dim, int64_t nope);
  // An indexer key: every value quantized.
  static KvRowFormat IndexKey(KvDtype dtype, int64_t dim);

  size_t RowBytes() const;
  // REQUIRES: row.size() == dim, out.size() == RowBytes().
  void Encode(std::span<const float> row, std::span<std::byte> out) const;
  // REQUIRES: bytes.size() == RowBytes(), out.size() == dim.
  void Decode(std::span<const std::byte> bytes, std::span<float> out) const;
  // Decode(Encode(row)) in place: what a cache of this format keeps.
  void RoundTrip(std::span<float> row) const;
};

}  // namespace tierkv::executor
