// Teacher switching through tierkvd (issue 28): checkpoints stored in a
// real daemon's weights namespace, loaded back in turn (from DRAM, and from
// NVMe after a restart) by DaemonWeights and by `tierkv-run
// switch-models`; every run's logits must equal those of the same model
// loaded from its files, bit for bit.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <stdio.h>
#include <sys/wait.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "executor/checkpoint_writer.h"
#include "executor/daemon_weights.h"
#include "executor/generator.h"
#include "executor/presets.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace tierkv::executor {
namespace {

using testing::DaemonProcess;

constexpr char kToken[] = "weights-switch-token";

std::string DaemonConfig() {
  return fmt::format(
      "[[namespace]]\nname = \"weights\"\ntoken = \"{}\"\n"
      "host_bytes = \"256MiB\"\nweights = true\n"
      "[nvme]\npath = \"{{DIR}}/nvme.data\"\ncapacity_bytes = \"512MiB\"\n",
      kToken);
}

// The logits of `model` on a fixed prompt (4 new tokens, greedy).
std::vector<float> Logits(Model& model) {
  const std::vector<int32_t> prompt = {3, 17, 5, 99, 42, 7, 1, 64};
  auto cache = model.NewCache(static_cast<int64_t>(prompt.size()) + 4);
  EXPECT_OK(cache);
  if (!cache.ok()) return {};
  GenerateOptions g;
  g.max_new_tokens = 4;
  g.keep_logits = true;
  auto r = Generate(model, cache->get(), prompt, g);
  EXPECT_OK(r);
  return r.ok() ? r->logits : std::vector<float>{};
}

bool Identical(const std::vector<float>& a, const std::vector<float>& b) {
  return !a.empty() && a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class WeightsSwitchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tiny = PresetConfig("tiny");
    ASSERT_OK(tiny);
    config_ = *tiny;
    // Two teachers of one shape, and a third stored in fp8 (scales too).
    ASSERT_OK(WriteRandomCheckpoint(dir_.File("a"), config_, {.seed = 11}));
    ASSERT_OK(WriteRandomCheckpoint(dir_.File("b"), config_, {.seed = 12}));
    ASSERT_OK(WriteRandomCheckpoint(dir_.File("c"), config_,
                                    {.seed = 13, .dtype = DType::kF8E4M3}));
    ASSERT_OK(daemon_.Start({.config_toml = DaemonConfig()}));
  }

  Result<std::unique_ptr<DaemonWeights>> Connect() {
    DaemonWeightsOptions o;
    o.client.socket_path = daemon_.socket_path();
    o.token = kToken;
    return DaemonWeights::Connect(o);
  }

  std::vector<float> FromFiles(const std::string& name) {
    auto model = Model::Load(dir_.File(name), {});
    EXPECT_OK(model);
    return model.ok() ? Logits(**model) : std::vector<float>{};
  }

  testing::TempDir dir_;
  ModelConfig config_;
  DaemonProcess daemon_;
};

TEST_F(WeightsSwitchTest, EverySwitchGivesTheLogitsOfTheFiles) {
  auto weights = Connect();
  ASSERT_OK(weights);
  std::map<std::string, WeightsManifest> stored;
  std::map<std::string, std::vector<float>> expected;
  for (const std::string name : {"a", "b", "c"}) {
    auto m = (*weights)->Import("teacher-" + name, dir_.File(name));
    ASSERT_OK(m);
    stored[name] = *m;
    expected[name] = FromFiles(name);
  }
  ASSERT_FALSE(Identical(expected["a"], expected["b"]));  // really switching
  for (const std::string name : {"a", "b", "a", "c", "b", "a"}) {
    WeightsLoadReport report;
    auto model = (*weights)->LoadModel(stored[name], config_, {}, &report);
    ASSERT_OK(model);
    EXPECT_EQ(report.bytes, stored[name].image_bytes);
    EXPECT_EQ(report.chunks_in_dram, stored[name].chunks.size());
    EXPECT_TRUE(Identical(Logits(**model), expected[name])) << name;
  }
}

// After a restart the daemon's DRAM is empty: the shards come from NVMe.
TEST_F(WeightsSwitchTest, ShardsComeBackFromNvmeAfterARestart) {
  std::map<std::string, WeightsManifest> stored;
  {
    auto weights = Connect();
    ASSERT_OK(weights);
    for (const std::string name : {"a", "b"}) {
      auto m = (*weights)->Import("teacher-" + name, dir_.File(name));
      ASSERT_OK(m);
      stored[name] = *m;
    }
  }
  ASSERT_EQ(daemon_.Stop(SIGTERM), 0);
  ASSERT_OK(daemon_.Start({.config_toml = DaemonConfig()}));
  auto weights = Connect();
  ASSERT_OK(weights);
  for (const std::string name : {"b", "a"}) {
    // The manifest as the daemon kept it.
    auto m = (*weights)->client().GetWeightsManifest(
        {"teacher-" + name, kExecutorWeightsLayout, PageHash{}});
    ASSERT_OK(m);
    EXPECT_EQ(*m, stored[name]);
    WeightsLoadReport report;
    auto model = (*weights)->LoadModel(*m, config_, {}, &report);
    ASSERT_OK(model);
    EXPECT_EQ(report.chunks_in_dram, 0u);
    EXPECT_EQ(report.chunks_on_nvme, m->chunks.size());
    EXPECT_TRUE(Identical(Logits(**model), FromFiles(name))) << name;
  }
}

// A dropped shard cannot be loaded, and says which chunk is gone.
TEST_F(WeightsSwitchTest, ADroppedShardFailsClearly) {
  auto weights = Connect();
  ASSERT_OK(weights);
  auto a = (*weights)->Import("teacher-a", dir_.File("a"));
  ASSERT_OK(a);
  auto dropped = (*weights)->client().DropWeights(
      {"teacher-a", kExecutorWeightsLayout, PageHash{}});
  ASSERT_OK(dropped);
  EXPECT_EQ(dropped->shards, 1u);
  auto model = (*weights)->LoadModel(*a, config_, {});
  ASSERT_FALSE(model.ok());
  EXPECT_TRUE(model.status().IsNotFound()) << model.status().ToString();
  EXPECT_NE(model.status().ToString().find("chunk"), std::string::npos)
      << model.status().ToString();
}

// The same through the tool: tierkv-run switch-models.
TEST_F(WeightsSwitchTest, TierkvRunSwitchModelsChecksEveryStep) {
  const std::string tool = testing::BinDir() + "/tierkv-run";
  if (!std::filesystem::exists(tool)) GTEST_SKIP() << "tierkv-run not built";
  std::ofstream(dir_.File("weights.token")) << kToken << "\n";
  const std::string cmd = fmt::format(
      "{} switch-models --model {} --model {} --sequence 0,1,0,1 "
      "--tierkv {} --weights-token-file {} --threads 1 --max-new-tokens 3 "
      "--logits-dir {} 2>&1",
      tool, dir_.File("a"), dir_.File("b"), daemon_.socket_path(),
      dir_.File("weights.token"), dir_.path().string());
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string output;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) {
    output.append(buf.data(), n);
  }
  const int status = ::pclose(p);
  ASSERT_TRUE(WIFEXITED(status)) << output;
  EXPECT_EQ(WEXITSTATUS(status), 0) << output;
  EXPECT_NE(output.find("logits identical to loading from files: 4 of 4 steps"),
            std::string::npos)
      << output;
  // Steps 0 and 2 ran the same model: the same logits files.
  auto read = [&](int step) {
    std::ifstream f(dir_.File(fmt::format("step{}.npy", step)),
                    std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  EXPECT_FALSE(read(0).empty());
  EXPECT_EQ(read(0), read(2));
  EXPECT_NE(read(0), read(1));
}

}  // namespace
}  // namespace tierkv::executor
