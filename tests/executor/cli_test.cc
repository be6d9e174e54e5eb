// Tests of the real tierkv-run binary ($TIERKV_BIN_DIR/tierkv-run): writes a
// model, runs it, and rejects broken model directories with a clear message
// and a non-zero exit.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/testing/temp_dir.h"

namespace {

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout + stderr
};

std::string Binary() {
  const char* dir = std::getenv("TIERKV_BIN_DIR");
  return std::string(dir ? dir : "build/bin") + "/tierkv-run";
}

RunResult RunTool(const std::string& args) {
  RunResult r;
  const std::string cmd = Binary() + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0)
    r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return r;
}

class TierkvRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(Binary())) {
      GTEST_SKIP() << Binary() << " not built";
    }
    model_ = dir_.path() / "model";
    const RunResult w = RunTool("--write-random-model " + model_.string() +
                                " --preset tiny --seed 3");
    ASSERT_EQ(w.exit_code, 0) << w.output;
  }
  tierkv::testing::TempDir dir_;
  std::filesystem::path model_;
};

TEST_F(TierkvRunTest, GeneratesAndWritesLogitsNpy) {
  const std::string npy = (dir_.path() / "logits.npy").string();
  const RunResult r = RunTool("--model " + model_.string() +
                              " --prompt-ids 1,2,3 --max-new-tokens 4 --greedy"
                              " --logits-out " +
                              npy);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tokens/s"), std::string::npos) << r.output;
  // Header + 4 rows x 128 vocab x 4 bytes.
  const auto size = std::filesystem::file_size(npy);
  EXPECT_EQ(size % 64, (4u * 128u * 4u) % 64);
  EXPECT_GE(size, 4u * 128u * 4u);
  std::ifstream in(npy, std::ios::binary);
  std::string head(128, '\0');
  in.read(head.data(), 128);
  EXPECT_EQ(head.substr(1, 5), "NUMPY");
  EXPECT_NE(head.find("'shape': (4, 128)"), std::string::npos) << head;
}

TEST_F(TierkvRunTest, TruncatedSafetensorsExitsNonZeroWithMessage) {
  const auto file = model_ / "model.safetensors";
  std::filesystem::resize_file(file, std::filesystem::file_size(file) / 2);
  const RunResult r =
      RunTool("--model " + model_.string() + " --prompt-ids 1,2");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("truncated"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model.safetensors"), std::string::npos) << r.output;
}

TEST_F(TierkvRunTest, ConfigWithoutRequiredKeyExitsNonZeroNamingTheKey) {
  std::ifstream in(model_ / "config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  in.close();
  j.erase("index_topk");
  std::ofstream(model_ / "config.json") << j.dump();
  const RunResult r = RunTool("--model " + model_.string() + " --prompt-ids 1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("index_topk"), std::string::npos) << r.output;
}

TEST_F(TierkvRunTest, MismatchedShapeExitsNonZeroNamingTheTensor) {
  std::ifstream in(model_ / "config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  in.close();
  j["index_head_dim"] = 24;  // checkpoint has 16
  std::ofstream(model_ / "config.json") << j.dump();
  const RunResult r = RunTool("--model " + model_.string() + " --prompt-ids 1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("indexer.wq_b.weight"), std::string::npos)
      << r.output;
}

TEST_F(TierkvRunTest, MissingModelDirAndBadPromptAreErrors) {
  RunResult r = RunTool("--model " + (dir_.path() / "nope").string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("does not exist"), std::string::npos) << r.output;
  r = RunTool("--model " + model_.string() + " --prompt-ids 1,x");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("'x'"), std::string::npos) << r.output;
}

}  // namespace
