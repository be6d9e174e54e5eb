// Element type conversions (see dtype.h).
#include "executor/dtype.h"

#include <fmt/format.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstring>

namespace tierkv::executor {
namespace {

// All 256 e4m3fn values, decoded once.
std::array<float, 256> BuildFp8Table() {
  std::array<float, 256> t{};
  for (int v = 0; v < 256; ++v) {
    const int sign = v >> 7;
    const int exp = (v >> 3) & 0xf;
    const int man = v & 0x7;
    float mag;
    if (exp == 0xf && man == 0x7) {
      mag = std::numeric_limits<float>::quiet_NaN();
    } else if (exp == 0) {
      mag = std::ldexp(static_cast<float>(man) / 8.0f, -6);
    } else {
      mag = std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
    }
    t[v] = sign ? -mag : mag;
  }
  return t;
}

const std::array<float, 256>& Fp8Table() {
  static const std::array<float, 256> table = BuildFp8Table();
  return table;
}

}  // namespace

Result<DType> ParseDType(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "F8_E4M3") return DType::kF8E4M3;
  return Status::InvalidArgument(fmt::format(
      "unsupported dtype '{}' (supported: F32, F16, BF16, F8_E4M3)", name));
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF8E4M3:
      return "F8_E4M3";
  }
  return "?";
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kF8E4M3:
      return 1;
  }
  return 0;
}

float Bf16ToF32(uint16_t v) {
  return std::bit_cast<float>(static_cast<uint32_t>(v) << 16);
}

uint16_t F32ToBf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1;
  const int exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  float mag;
  if (exp == 0) {
    mag = std::ldexp(static_cast<float>(man), -24);
  } else if (exp == 31) {
    mag = man ? std::numeric_limits<float>::quiet_NaN()
              : std::numeric_limits<float>::infinity();
  } else {
    mag = std::ldexp(1.0f + static_cast<float>(man) / 1024.0f, exp - 15);
  }
  return sign ? -mag : mag;
}

uint16_t F32ToF16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  if (std::isnan(f)) return sign | 0x7e00;
  float a = std::fabs(f);
  if (a >= 65520.0f) return sign | 0x7c00;  // rounds to inf
  if (a < std::ldexp(1.0f, -14)) {          // subnormal: units of 2^-24
    const float units = std::nearbyint(a * std::ldexp(1.0f, 24));
    return sign | static_cast<uint16_t>(units);
  }
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  float man = std::nearbyint((m * 2.0f - 1.0f) * 1024.0f);
  int exp = e - 1 + 15;
  if (man >= 1024.0f) {
    man = 0;
    ++exp;
  }
  if (exp >= 31) return sign | 0x7c00;
  return sign | static_cast<uint16_t>(exp << 10) | static_cast<uint16_t>(man);
}

float Fp8E4M3ToF32(uint8_t v) { return Fp8Table()[v]; }

uint8_t F32ToFp8E4M3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::min(std::fabs(f), 448.0f);
  // Positive codes 0..0x7e are monotonic in value; pick the nearest,
  // ties to the even code.
  const auto& t = Fp8Table();
  int lo = 0, hi = 0x7e;
  while (lo < hi) {  // first code with value >= a
    const int mid = (lo + hi) / 2;
    if (t[mid] < a)
      lo = mid + 1;
    else
      hi = mid;
  }
  int best = lo;
  if (lo > 0) {
    const float dlo = a - t[lo - 1], dhi = t[lo] - a;
    if (dlo < dhi || (dlo == dhi && ((lo - 1) & 1) == 0)) best = lo - 1;
  }
  return sign | static_cast<uint8_t>(best);
}

void ConvertToF32(DType dtype, std::span<const std::byte> src,
                  std::span<float> dst) {
  const size_t n = dst.size();
  const auto* p = reinterpret_cast<const unsigned char*>(src.data());
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst.data(), p, n * 4);
      return;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        const uint32_t bits = static_cast<uint32_t>(p[2 * i]) |
                              (static_cast<uint32_t>(p[2 * i + 1]) << 8);
        dst[i] = std::bit_cast<float>(bits << 16);
      }
      return;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) {
        dst[i] =
            F16ToF32(static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8)));
      }
      return;
    case DType::kF8E4M3: {
      const auto& t = Fp8Table();
      for (size_t i = 0; i < n; ++i) dst[i] = t[p[i]];
      return;
    }
  }
}

void ConvertFromF32(DType dtype, std::span<const float> src,
                    std::span<std::byte> dst) {
  auto* p = reinterpret_cast<unsigned char*>(dst.data());
  const size_t n = src.size();
  switch (dtype) {
    case DType::kF32:
      std::memcpy(p, src.data(), n * 4);
      return;
    case DType::kBF16:
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h =
            dtype == DType::kBF16 ? F32ToBf16(src[i]) : F32ToF16(src[i]);
        p[2 * i] = static_cast<unsigned char>(h & 0xff);
        p[2 * i + 1] = static_cast<unsigned char>(h >> 8);
      }
      return;
    case DType::kF8E4M3:
      for (size_t i = 0; i < n; ++i) p[i] = F32ToFp8E4M3(src[i]);
      return;
  }
}

}  // namespace tierkv::executor
