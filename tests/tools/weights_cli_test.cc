// `tierkv weights import / ls / drop / hint / pin` (tools/weights_command.cc)
// run as the real binary against a real tierkvd with a weights namespace.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tierkv/client.h"

namespace tierkv {
namespace {

constexpr char kConfig[] = R"(
[[namespace]]
name = "weights"
token = "cli-token"
host_bytes = "256MiB"
weights = true
)";

// A tierkv run: its exit code and its stdout and stderr.
using Ran = testing::CommandRun;

class WeightsCliTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_OK(daemon_.Start({.config_toml = kConfig})); }

  // tierkv --socket ... -n weights --token ... weights <args> 2>&1
  Ran Tierkv(const std::string& args) {
    const std::string command =
        testing::BinDir() + "/tierkv --socket " + daemon_.socket_path() +
        " -n weights --token cli-token weights " + args + " 2>&1";
    return testing::RunCommand(command);
  }

  std::string WriteCheckpoint() {
    std::vector<RawTensor> raw;
    for (int l = 0; l < 3; ++l) {
      raw.push_back({"model.layers." + std::to_string(l) + ".w",
                     "U8",
                     {4096},
                     std::vector<std::byte>(4096, std::byte(l + 1))});
    }
    raw.push_back({"lm_head.weight", "U8", {16}, std::vector<std::byte>(16)});
    const std::string file = dir_.File("tiny.safetensors");
    EXPECT_OK(WriteSafetensors(file, raw));
    return file;
  }

  testing::DaemonProcess daemon_;
  testing::TempDir dir_;
};

TEST_F(WeightsCliTest, ImportListDrop) {
  const std::string file = WriteCheckpoint();
  Ran ran =
      Tierkv("import " + file + " --model tiny --layout hf/u8/rank0-of-1");
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  EXPECT_NE(ran.output.find("imported tiny / hf/u8/rank0-of-1 version "),
            std::string::npos)
      << ran.output;
  EXPECT_NE(ran.output.find("4 tensors in 3 layers"), std::string::npos)
      << ran.output;
  EXPECT_NE(ran.output.find("0 deduplicated"), std::string::npos) << ran.output;

  // Again: the same version, every chunk deduplicated.
  ran = Tierkv("import " + file + " --model tiny --layout hf/u8/rank0-of-1");
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  EXPECT_NE(ran.output.find("stored 0 chunks"), std::string::npos)
      << ran.output;

  ran = Tierkv("ls --json");
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  const auto listed = nlohmann::json::parse(ran.output);
  ASSERT_EQ(listed.size(), 1u) << ran.output;
  EXPECT_EQ(listed[0]["model"], "tiny");
  EXPECT_EQ(listed[0]["layout"], "hf/u8/rank0-of-1");
  EXPECT_EQ(listed[0]["num_layers"], 3);
  EXPECT_EQ(listed[0]["tensors"], 4);
  const std::string version = listed[0]["version"];

  ran = Tierkv("ls --model tiny");
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  EXPECT_NE(ran.output.find(version), std::string::npos) << ran.output;
  ran = Tierkv("ls --model other --json");
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  EXPECT_EQ(nlohmann::json::parse(ran.output).size(), 0u);

  ran = Tierkv("drop --model tiny --version xyz");
  EXPECT_EQ(ran.exit_code, 1);
  EXPECT_NE(ran.output.find("32 hex digits"), std::string::npos) << ran.output;
  ran = Tierkv("drop --model tiny --version " + version);
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  EXPECT_NE(ran.output.find("dropped 1 shard,"), std::string::npos)
      << ran.output;
  ran = Tierkv("drop --model tiny");
  EXPECT_EQ(ran.exit_code, 1);
  EXPECT_NE(ran.output.find("not_found"), std::string::npos) << ran.output;
  ran = Tierkv("ls --json");
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  EXPECT_EQ(nlohmann::json::parse(ran.output).size(), 0u);
}

TEST_F(WeightsCliTest, HintAndPinReachTheCatalog) {
  const std::string file = WriteCheckpoint();
  ASSERT_EQ(Tierkv("import " + file + " --model tiny --layout hf/u8/rank0-of-1")
                .exit_code,
            0);
  auto client = Client::Connect(
      {.socket_path = daemon_.socket_path(), .prefault_arena = false});
  ASSERT_OK(client.status());
  ASSERT_OK((*client)->OpenNamespace("weights", "cli-token"));
  auto schedule = [&] {
    auto stats = (*client)->StatsJson();
    EXPECT_OK(stats.status());
    return nlohmann::json::parse(stats.ok() ? *stats : "{}")["weights"];
  };

  Ran ran = Tierkv("hint --model tiny --layout hf/u8/rank0-of-1 --in 30");
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  EXPECT_NE(ran.output.find("next used in 30 s"), std::string::npos)
      << ran.output;
  EXPECT_EQ(schedule()["hinted_shards"], 1);
  ran = Tierkv("hint --model tiny --layout hf/u8/rank0-of-1 --clear");
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  EXPECT_EQ(schedule()["hinted_shards"], 0);
  // Neither or both of --in / --clear; an unknown shard; a bad version.
  ran = Tierkv("hint --model tiny --layout hf/u8/rank0-of-1");
  EXPECT_EQ(ran.exit_code, 1);
  EXPECT_NE(ran.output.find("--in SECONDS or --clear"), std::string::npos)
      << ran.output;
  ran = Tierkv("hint --model tiny --layout hf/u8/rank0-of-1 --in 1 --clear");
  EXPECT_NE(ran.exit_code, 0);
  ran = Tierkv("hint --model other --layout hf/u8/rank0-of-1 --in 1");
  EXPECT_EQ(ran.exit_code, 1);
  EXPECT_NE(ran.output.find("not_found"), std::string::npos) << ran.output;
  ran = Tierkv("pin --model tiny --layout l --version xyz --ttl 1");
  EXPECT_EQ(ran.exit_code, 1);
  EXPECT_NE(ran.output.find("32 hex digits"), std::string::npos) << ran.output;

  ran = Tierkv("pin --model tiny --layout hf/u8/rank0-of-1 --ttl 600");
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  EXPECT_NE(ran.output.find("pinned tiny / hf/u8/rank0-of-1"),
            std::string::npos)
      << ran.output;
  EXPECT_EQ(schedule()["pinned_shards"], 1);
  ran = Tierkv("ls --json");
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  // The shard's distinct chunks cover its image exactly.
  EXPECT_EQ(schedule()["pinned_bytes"],
            nlohmann::json::parse(ran.output)[0]["image_bytes"]);
  ran = Tierkv("pin --model tiny --layout hf/u8/rank0-of-1 --unpin");
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  EXPECT_EQ(schedule()["pinned_shards"], 0);
  ran = Tierkv("pin --model tiny --layout hf/u8/rank0-of-1 --ttl 0");
  EXPECT_NE(ran.exit_code, 0) << ran.output;  // a pin needs a positive ttl
}

TEST_F(WeightsCliTest, ImportOfACorruptFileSaysWhy) {
  const std::string file = dir_.File("bad.safetensors");
  FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("not a safetensors file", f);
  std::fclose(f);
  const Ran ran = Tierkv("import " + file + " --model m --layout l");
  EXPECT_EQ(ran.exit_code, 1);
  EXPECT_NE(ran.output.find("corruption"), std::string::npos) << ran.output;
}

}  // namespace
}  // namespace tierkv
