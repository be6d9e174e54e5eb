// Tests for executor/weights, executor/dtype and executor/checkpoint_writer
// (the safetensors reader's own: tests/common/safetensors_test.cc):
// formats, dequantization, bad input.
#include "executor/weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/safetensors.h"
#include "executor/checkpoint_writer.h"
#include "executor/dtype.h"
#include "executor/model.h"
#include "executor/presets.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace tierkv::executor {
namespace {

std::vector<std::byte> Bytes(std::initializer_list<uint8_t> v) {
  std::vector<std::byte> out;
  for (uint8_t b : v) out.push_back(static_cast<std::byte>(b));
  return out;
}

std::vector<std::byte> F32Bytes(const std::vector<float>& v) {
  std::vector<std::byte> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

ModelConfig TinyConfig() { return PresetConfig("tiny").value(); }

TEST(Dtype, Fp8E4M3DecodesKnownCodes) {
  EXPECT_EQ(Fp8E4M3ToF32(0x38), 1.0f);  // exp 7, man 0
  EXPECT_EQ(Fp8E4M3ToF32(0x40), 2.0f);
  EXPECT_EQ(Fp8E4M3ToF32(0xB8), -1.0f);
  EXPECT_EQ(Fp8E4M3ToF32(0x39), 1.125f);      // 1 + 1/8
  EXPECT_EQ(Fp8E4M3ToF32(0x7E), 448.0f);      // max finite
  EXPECT_EQ(Fp8E4M3ToF32(0x01), 1.0f / 512);  // subnormal 1/8 * 2^-6
  EXPECT_TRUE(std::isnan(Fp8E4M3ToF32(0x7F)));
  EXPECT_EQ(F32ToFp8E4M3(1.0f), 0x38);
  EXPECT_EQ(F32ToFp8E4M3(1000.0f), 0x7E);  // saturates
  EXPECT_EQ(F32ToFp8E4M3(-1.06f), 0xB8);   // nearest: 1.0 (not 1.125)
}

TEST(Dtype, Bf16AndF16RoundTripRepresentableValues) {
  for (float f : {0.0f, 1.0f, -2.5f, 0.15625f, 65504.0f}) {
    EXPECT_EQ(F16ToF32(F32ToF16(f)), f) << f;
  }
  for (float f : {0.0f, 1.0f, -2.5f, 0x1p100f}) {
    EXPECT_EQ(Bf16ToF32(F32ToBf16(f)), f) << f;
  }
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.00390625f)), 1.0f);  // tie -> even
  EXPECT_EQ(F32ToBf16(1.01171875f), 0x3F82);           // tie -> even (up)
}

// Hand-worked: a [2, 130] fp8 weight spans two 128-column blocks; block
// (0,0) has scale_inv 2.0 and block (0,1) 0.5.
TEST(ReadTensorF32, Fp8BlockDequantizationMatchesHandWorkedCase) {
  testing::TempDir dir;
  std::vector<uint8_t> w(2 * 130, 0x00);
  w[0 * 130 + 0] = 0x38;    // 1.0   * 2.0 = 2.0
  w[0 * 130 + 1] = 0xB9;    // -1.125 * 2.0 = -2.25
  w[1 * 130 + 127] = 0x7E;  // 448   * 2.0 = 896
  w[0 * 130 + 128] = 0x40;  // 2.0   * 0.5 = 1.0
  w[1 * 130 + 129] = 0x01;  // 2^-9  * 0.5 = 2^-10
  std::vector<std::byte> wb(w.size());
  std::memcpy(wb.data(), w.data(), w.size());
  ASSERT_OK(WriteSafetensors(
      dir.File("m.safetensors"),
      {{"x.weight", "F8_E4M3", {2, 130}, wb},
       {"x.weight_scale_inv", "F32", {1, 2}, F32Bytes({2.0f, 0.5f})}}));
  auto reader = SafetensorsReader::Open(dir.File("m.safetensors"));
  ASSERT_OK(reader);
  auto t = ReadTensorF32(**reader, "x.weight", {2, 130}, 128, 128);
  ASSERT_OK(t);
  EXPECT_EQ(t->data[0], 2.0f);
  EXPECT_EQ(t->data[1], -2.25f);
  EXPECT_EQ(t->data[130 + 127], 896.0f);
  EXPECT_EQ(t->data[128], 1.0f);
  EXPECT_EQ(t->data[130 + 129], 1.0f / 1024);
  EXPECT_EQ(t->data[2], 0.0f);
}

TEST(ReadTensorF32, Fp8WithoutScaleTensorNamesTheMissingScale) {
  testing::TempDir dir;
  ASSERT_OK(
      WriteSafetensors(dir.File("m.safetensors"),
                       {{"x.weight", "F8_E4M3", {1, 2}, Bytes({0x38, 0x38})}}));
  auto reader = SafetensorsReader::Open(dir.path());
  ASSERT_OK(reader);
  auto t = ReadTensorF32(**reader, "x.weight", {1, 2}, 128, 128);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("x.weight_scale_inv"), std::string::npos);
}

TEST(ReadTensorF32, UnknownDtypeIsReportedWithTensorName) {
  testing::TempDir dir;
  ASSERT_OK(WriteSafetensors(dir.File("m.safetensors"),
                             {{"x.weight", "Q4_K", {2}, Bytes({1, 2})}}));
  auto reader = SafetensorsReader::Open(dir.path());
  ASSERT_OK(reader);
  auto t = ReadTensorF32(**reader, "x.weight", {2}, 128, 128);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("Q4_K"), std::string::npos);
  EXPECT_NE(t.status().message().find("x.weight"), std::string::npos);
}

TEST(LoadWeights, Fp32CheckpointLoadsExactlyTheRandomWeights) {
  testing::TempDir dir;
  const ModelConfig c = TinyConfig();
  CheckpointWriterOptions opts;
  opts.dtype = DType::kF32;
  opts.seed = 11;
  ASSERT_OK(WriteRandomCheckpoint(dir.path(), c, opts));
  auto reader = SafetensorsReader::Open(dir.path());
  ASSERT_OK(reader);
  auto loaded = LoadWeights(c, **reader);
  ASSERT_OK(loaded);
  const ModelWeights expected = RandomWeights(c, 11);
  EXPECT_EQ(loaded->embed_tokens.data, expected.embed_tokens.data);
  EXPECT_EQ(loaded->layers[1].attn.kv_b_proj.data,
            expected.layers[1].attn.kv_b_proj.data);
  EXPECT_EQ(loaded->layers[3].moe->experts[5].down_proj.data,
            expected.layers[3].moe->experts[5].down_proj.data);
  // IndexShare: the shared layer 2 has no indexer weights at all.
  EXPECT_FALSE(loaded->layers[2].attn.indexer.has_value());
  EXPECT_EQ(reader.value()->Find("model.layers.2.self_attn.indexer.wk.weight"),
            nullptr);
  EXPECT_TRUE(loaded->layers[3].attn.indexer.has_value());
}

TEST(LoadWeights, ShardedBf16CheckpointUsesTheIndexAndRoundsToBf16) {
  testing::TempDir dir;
  const ModelConfig c = TinyConfig();
  CheckpointWriterOptions opts;
  opts.seed = 5;
  opts.max_shard_bytes = 64 * 1024;
  ASSERT_OK(WriteRandomCheckpoint(dir.path(), c, opts));
  ASSERT_TRUE(
      std::filesystem::exists(dir.path() / "model.safetensors.index.json"));
  int shards = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    shards += e.path().extension() == ".safetensors" ? 1 : 0;
  }
  EXPECT_GT(shards, 1);
  auto reader = SafetensorsReader::Open(dir.path());
  ASSERT_OK(reader);
  auto loaded = LoadWeights(c, **reader);
  ASSERT_OK(loaded);
  const ModelWeights expected = RandomWeights(c, 5);
  const auto& a = loaded->layers[0].attn.q_b_proj.data;
  const auto& b = expected.layers[0].attn.q_b_proj.data;
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i], Bf16ToF32(F32ToBf16(b[i]))) << i;
  }
}

TEST(LoadWeights, Fp8CheckpointDequantizesCloseToTheRandomWeights) {
  testing::TempDir dir;
  const ModelConfig c = TinyConfig();
  CheckpointWriterOptions opts;
  opts.dtype = DType::kF8E4M3;
  opts.seed = 3;
  ASSERT_OK(WriteRandomCheckpoint(dir.path(), c, opts));
  auto model = Model::Load(dir.path(), ModelOptions{});
  ASSERT_OK(model);
  const auto& got = (*model)->weights().layers[1].attn.o_proj.data;
  const ModelWeights reference = RandomWeights(c, 3);
  const auto& want = reference.layers[1].attn.o_proj.data;
  float max_rel = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    max_rel = std::max(max_rel, std::fabs(got[i] - want[i]) /
                                    std::max(std::fabs(want[i]), 0.05f));
  }
  EXPECT_LT(max_rel, 0.07f);  // e4m3 has 3 mantissa bits
  EXPECT_GT(max_rel, 0.0f);   // and really was quantized
}

TEST(LoadWeights, MissingTensorIsNamed) {
  testing::TempDir dir;
  ModelConfig c = TinyConfig();
  ASSERT_OK(WriteRandomCheckpoint(dir.path(), c, {}));
  c.num_hidden_layers = 5;  // the checkpoint has layers 0..3 only
  c.indexer_full.push_back(true);
  auto reader = SafetensorsReader::Open(dir.path());
  ASSERT_OK(reader);
  auto w = LoadWeights(c, **reader);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kNotFound);
  EXPECT_NE(w.status().message().find("model.layers.4.input_layernorm.weight"),
            std::string::npos)
      << w.status().ToString();
}

TEST(LoadWeights, WrongShapeNamesTensorAndBothShapes) {
  testing::TempDir dir;
  ModelConfig c = TinyConfig();
  ASSERT_OK(WriteRandomCheckpoint(dir.path(), c, {}));
  c.vocab_size = 256;
  auto reader = SafetensorsReader::Open(dir.path());
  ASSERT_OK(reader);
  auto w = LoadWeights(c, **reader);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  const std::string msg(w.status().message());
  EXPECT_NE(msg.find("model.embed_tokens.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[128, 64]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[256, 64]"), std::string::npos) << msg;
}

TEST(WriteRandomCheckpoint, ConfigOnlyWritesNoWeights) {
  testing::TempDir dir;
  CheckpointWriterOptions opts;
  opts.config_only = true;
  ASSERT_OK(WriteRandomCheckpoint(dir.path(),
                                  PresetConfig("glm5-shape").value(), opts));
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "config.json"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "model.safetensors"));
  auto c = LoadModelConfig(dir.path());
  ASSERT_OK(c);
  EXPECT_EQ(c->num_hidden_layers, 78);
  EXPECT_EQ(c->NumFullIndexerLayers(), 21);
}

}  // namespace
}  // namespace tierkv::executor
