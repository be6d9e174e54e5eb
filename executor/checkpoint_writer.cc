// Random checkpoint writer (see checkpoint_writer.h).
#include "executor/checkpoint_writer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/safetensors.h"
#include "executor/weights.h"

namespace tierkv::executor {
namespace {

constexpr float kFp8Max = 448.0f;

// What each safetensors entry holds: a tensor's values, or the block scales
// of the fp8 tensor `source`.
struct Entry {
  TensorSpec spec;
  size_t source = 0;      // index into ExpectedTensors()
  bool is_scale = false;  // weight_scale_inv of `source`
  DType dtype = DType::kBF16;
};

// Quantizes a [rows, cols] matrix per (br x bc) block: scale = amax / 448.
void QuantizeFp8(const std::vector<float>& w, int64_t rows, int64_t cols,
                 int64_t br, int64_t bc, std::vector<float>* scales,
                 std::span<std::byte> out) {
  const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
  scales->assign(static_cast<size_t>(sr * sc), 1.0f);
  for (int64_t bi = 0; bi < sr; ++bi) {
    for (int64_t bj = 0; bj < sc; ++bj) {
      float amax = 0;
      for (int64_t i = bi * br; i < std::min(rows, (bi + 1) * br); ++i) {
        for (int64_t j = bj * bc; j < std::min(cols, (bj + 1) * bc); ++j) {
          amax = std::max(amax, std::fabs(w[i * cols + j]));
        }
      }
      (*scales)[bi * sc + bj] = amax > 0 ? amax / kFp8Max : 1.0f;
    }
  }
  auto* p = reinterpret_cast<unsigned char*>(out.data());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const float s = (*scales)[(i / br) * sc + j / bc];
      p[i * cols + j] = F32ToFp8E4M3(w[i * cols + j] / s);
    }
  }
}

}  // namespace

Status WriteRandomCheckpoint(const std::filesystem::path& dir,
                             const ModelConfig& config,
                             const CheckpointWriterOptions& options) {
  TIERKV_RETURN_IF_ERROR(config.Validate());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return Status::IOError(
        fmt::format("cannot create {}: {}", dir.string(), ec.message()));
  }
  {
    nlohmann::json j = ModelConfigToJson(config);
    if (options.dtype == DType::kF8E4M3) {
      j["quantization_config"] = {
          {"quant_method", "fp8"},
          {"fmt", "e4m3"},
          {"weight_block_size",
           {config.weight_block_rows, config.weight_block_cols}}};
    }
    std::ofstream out(dir / "config.json", std::ios::trunc);
    out << j.dump(2) << "\n";
    if (!out) {
      return Status::IOError(
          fmt::format("cannot write {}", (dir / "config.json").string()));
    }
  }
  if (options.config_only) return Status::OK();

  const std::vector<ExpectedTensor> tensors = ExpectedTensors(config);
  std::vector<Entry> entries;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ExpectedTensor& t = tensors[i];
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    const bool fp8 = options.dtype == DType::kF8E4M3 && t.fp8_quantizable;
    DType dt = options.dtype == DType::kF8E4M3 ? DType::kBF16 : options.dtype;
    if (fp8) dt = DType::kF8E4M3;
    if (t.name.ends_with("e_score_correction_bias")) dt = DType::kF32;
    entries.push_back(
        {{t.name, std::string(DTypeName(dt)), t.shape, numel * DTypeSize(dt)},
         i,
         false,
         dt});
    if (fp8) {
      const int64_t sr = (t.shape[0] + config.weight_block_rows - 1) /
                         config.weight_block_rows;
      const int64_t sc = (t.shape[1] + config.weight_block_cols - 1) /
                         config.weight_block_cols;
      entries.push_back({{t.name + "_scale_inv",
                          "F32",
                          {sr, sc},
                          static_cast<uint64_t>(sr * sc * 4)},
                         i,
                         true,
                         DType::kF32});
    }
  }
  // Shard greedily; an fp8 tensor and its scale stay in the same shard.
  std::vector<std::vector<size_t>> shards(1);
  uint64_t shard_bytes = 0;
  for (size_t e = 0; e < entries.size(); ++e) {
    const uint64_t n = entries[e].spec.nbytes;
    if (!entries[e].is_scale && !shards.back().empty() &&
        shard_bytes + n > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(e);
    shard_bytes += n;
  }
  const size_t num_shards = shards.size();
  nlohmann::json weight_map = nlohmann::json::object();
  std::vector<float> values, scales;
  size_t cached_source = SIZE_MAX;
  for (size_t s = 0; s < num_shards; ++s) {
    const std::string file =
        num_shards == 1 ? "model.safetensors"
                        : fmt::format("model-{:05d}-of-{:05d}.safetensors",
                                      s + 1, num_shards);
    std::vector<TensorSpec> specs;
    for (size_t e : shards[s]) {
      specs.push_back(entries[e].spec);
      weight_map[entries[e].spec.name] = file;
    }
    TIERKV_RETURN_IF_ERROR(WriteSafetensors(
        dir / file, specs, [&](size_t k, std::span<std::byte> out) -> Status {
          const Entry& e = entries[shards[s][k]];
          const ExpectedTensor& t = tensors[e.source];
          if (cached_source != e.source) {
            GenerateRandomTensor(t, options.seed, &values);
            cached_source = e.source;
            if (e.dtype == DType::kF8E4M3) {
              QuantizeFp8(values, t.shape[0], t.shape[1],
                          config.weight_block_rows, config.weight_block_cols,
                          &scales, out);
              return Status::OK();
            }
          }
          if (e.is_scale) {
            ConvertFromF32(DType::kF32, scales, out);
          } else {
            ConvertFromF32(e.dtype, values, out);
          }
          return Status::OK();
        }));
  }
  if (num_shards > 1) {
    uint64_t total = 0;
    for (const auto& e : entries) total += e.spec.nbytes;
    nlohmann::json index = {{"metadata", {{"total_size", total}}},
                            {"weight_map", weight_map}};
    std::ofstream out(dir / "model.safetensors.index.json", std::ios::trunc);
    out << index.dump(2) << "\n";
    if (!out)
      return Status::IOError("cannot write model.safetensors.index.json");
  }
  return Status::OK();
}

}  // namespace tierkv::executor
