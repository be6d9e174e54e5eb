// DType: the safetensors element types the executor reads and writes, and
// their conversions to and from fp32.
//
// bf16/fp16 conversions round to nearest even. fp8 is e4m3fn (OCP FP8: bias
// 7, no infinities, 0x7f/0xff = NaN, max 448), as in DeepSeek / GLM FP8
// checkpoints.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "tierkv/status.h"

namespace tierkv::executor {

enum class DType : uint8_t { kF32, kF16, kBF16, kF8E4M3 };

// Parses a safetensors dtype string ("F32", "F16", "BF16", "F8_E4M3").
// Returns InvalidArgument for anything else.
Result<DType> ParseDType(std::string_view name);
std::string_view DTypeName(DType dtype);
size_t DTypeSize(DType dtype);

float Bf16ToF32(uint16_t v);
uint16_t F32ToBf16(float f);
float F16ToF32(uint16_t v);
uint16_t F32ToF16(float f);
float Fp8E4M3ToF32(uint8_t v);
// Saturates to ±448; NaN maps to 0x7f.
uint8_t F32ToFp8E4M3(float f);

// Converts `src` (raw little-endian elements of `dtype`) into `dst`.
// REQUIRES: src.size() == dst.size() * DTypeSize(dtype).
void ConvertToF32(DType dtype, std::span<const std::byte> src,
                  std::span<float> dst);
// Converts fp32 values to `dtype` bytes (fp8 without scaling).
// REQUIRES: dst.size() == src.size() * DTypeSize(dtype).
void ConvertFromF32(DType dtype, std::span<const float> src,
                    std::span<std::byte> dst);

}  // namespace tierkv::executor
