// KV row formats (see kv_format.h).
#include "executor/kv_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "executor/dtype.h"

namespace tierkv::executor {

namespace {

constexpr int64_t kTile = 128;     // values per fp8 scale
constexpr float kFp8Max = 448.0f;  // largest finite e4m3fn

int64_t Tiles(int64_t n) { return (n + kTile - 1) / kTile; }

// UE8M0 scale of one tile: 2^ceil(log2(amax / 448)), amax >= 1e-4.
float TileScale(std::span<const float> tile) {
  float amax = 1e-4f;
  for (float v : tile) amax = std::max(amax, std::fabs(v));
  return std::exp2(std::ceil(std::log2(amax / kFp8Max)));
}

}  // namespace

Result<KvDtype> ParseKvDtype(std::string_view name) {
  if (name == "fp32") return KvDtype::kF32;
  if (name == "bf16") return KvDtype::kBF16;
  if (name == "fp8") return KvDtype::kFP8;
  return Status::InvalidArgument("--kv-dtype must be fp32, bf16 or fp8, not '" +
                                 std::string(name) + "'");
}

std::string_view KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return "fp32";
    case KvDtype::kBF16:
      return "bf16";
    case KvDtype::kFP8:
      return "fp8";
  }
  return "?";
}

KvRowFormat KvRowFormat::Latent(KvDtype dtype, int64_t dim, int64_t nope) {
  return {dtype, dim, dtype == KvDtype::kFP8 ? nope : 0};
}

KvRowFormat KvRowFormat::IndexKey(KvDtype dtype, int64_t dim) {
  return {dtype, dim, dtype == KvDtype::kFP8 ? dim : 0};
}

size_t KvRowFormat::RowBytes() const {
  switch (dtype) {
    case KvDtype::kF32:
      return static_cast<size_t>(dim) * 4;
    case KvDtype::kBF16:
      return static_cast<size_t>(dim) * 2;
    case KvDtype::kFP8:
      return static_cast<size_t>(fp8_values + Tiles(fp8_values) * 4 +
                                 (dim - fp8_values) * 2);
  }
  return 0;
}

void KvRowFormat::Encode(std::span<const float> row,
                         std::span<std::byte> out) const {
  switch (dtype) {
    case KvDtype::kF32:
      std::memcpy(out.data(), row.data(), row.size() * 4);
      return;
    case KvDtype::kBF16:
      for (size_t i = 0; i < row.size(); ++i) {
        const uint16_t b = F32ToBf16(row[i]);
        std::memcpy(out.data() + 2 * i, &b, 2);
      }
      return;
    case KvDtype::kFP8: {
      // [fp8 values][fp32 scale per tile][bf16 rest], little-endian.
      std::byte* scales = out.data() + fp8_values;
      for (int64_t t = 0; t < Tiles(fp8_values); ++t) {
        const int64_t begin = t * kTile;
        const int64_t end = std::min(fp8_values, begin + kTile);
        const float s = TileScale(row.subspan(
            static_cast<size_t>(begin), static_cast<size_t>(end - begin)));
        std::memcpy(scales + 4 * t, &s, 4);
        for (int64_t i = begin; i < end; ++i) {
          const float q = std::clamp(row[i] / s, -kFp8Max, kFp8Max);
          out[i] = static_cast<std::byte>(F32ToFp8E4M3(q));
        }
      }
      std::byte* rest = scales + 4 * Tiles(fp8_values);
      for (int64_t i = fp8_values; i < dim; ++i) {
        const uint16_t b = F32ToBf16(row[i]);
        std::memcpy(rest + 2 * (i - fp8_values), &b, 2);
      }
      return;
    }
  }
}

void KvRowFormat::Decode(std::span<const std::byte> bytes,
                         std::span<float> out) const {
  switch (dtype) {
    case KvDtype::kF32:
      std::memcpy(out.data(), bytes.data(), out.size() * 4);
      return;
    case KvDtype::kBF16:
      for (size_t i = 0; i < out.size(); ++i) {
        uint16_t b;
        std::memcpy(&b, bytes.data() + 2 * i, 2);
        out[i] = Bf16ToF32(b);
      }
      return;
    case KvDtype::kFP8: {
      const std::byte* scales = bytes.data() + fp8_values;
      for (int64_t t = 0; t < Tiles(fp8_values); ++t) {
        float s;
        std::memcpy(&s, scales + 4 * t, 4);
        const int64_t end = std::min(fp8_values, (t + 1) * kTile);
        for (int64_t i = t * kTile; i < end; ++i) {
          out[i] = Fp8E4M3ToF32(static_cast<uint8_t>(bytes[i])) * s;
        }
      }
      const std::byte* rest = scales + 4 * Tiles(fp8_values);
      for (int64_t i = fp8_values; i < dim; ++i) {
        uint16_t b;
        std::memcpy(&b, rest + 2 * (i - fp8_values), 2);
        out[i] = Bf16ToF32(b);
      }
      return;
    }
  }
}

void KvRowFormat::RoundTrip(std::span<float> row) const {
  if (dtype == KvDtype::kF32) return;
  std::vector<std::byte> bytes(RowBytes());
  Encode(row, bytes);
  Decode(bytes, row);
}

}  // namespace tierkv::executor
