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
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "executor/generator.h"
#include "executor/model.h"
#include "executor/topk_trace.h"
#include "tests/testing/daemon_process.h"
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

std::string Ids(int first, int count) {
  std::string out;
  for (int i = 0; i < count; ++i) {
    if (i) out += ",";
    out += std::to_string((first + i * 7) % 128);
  }
  return out;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Two tierkv-run processes whose prompts share a 192-token system prompt,
// in every KV format (one namespace each: a namespace holds one layout):
// the second loads those three pages from tierkvd and prefills only its
// own tokens, the daemon holds the shared pages once, and each process's
// logits equal its run without tierkv, byte for byte.
TEST_F(TierkvRunTest, TwoProcessesShareASystemPromptThroughTierkvd) {
  const std::vector<std::string> formats = {"fp32", "bf16", "fp8"};
  std::string config;
  for (const auto& f : formats) {
    config += "[[namespace]]\nname = \"" + f + "\"\ntoken = \"token-" + f +
              "\"\nhost_bytes = \"8MiB\"\nshards = 1\n";
  }
  tierkv::testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start({.config_toml = config}).ok());
  const std::string system = Ids(5, 192);
  const std::string user_a = Ids(1, 20), user_b = Ids(2, 30);
  const std::string dir = dir_.path().string();
  for (const auto& format : formats) {
    SCOPED_TRACE(format);
    const std::string token_file = dir + "/" + format + ".token";
    std::ofstream(token_file) << "token-" << format << "\n";
    const std::string tierkv = " --tierkv " + daemon.socket_path() +
                               " --namespace " + format + " --token-file " +
                               token_file + " --tierkv-required";
    auto run = [&](const std::string& user, bool with_tierkv,
                   const std::string& npy) {
      return RunTool("--model " + model_.string() + " --prompt-ids " + system +
                     "," + user + " --max-new-tokens 3 --attention mqa" +
                     " --kv-dtype " + format + " --logits-out " + npy +
                     (with_tierkv ? tierkv : ""));
    };
    const std::string out = dir + "/" + format;
    RunResult a = run(user_a, true, out + "-a.npy");
    ASSERT_EQ(a.exit_code, 0) << a.output;
    EXPECT_NE(a.output.find("tierkv: 0 of 212 prompt tokens loaded"),
              std::string::npos)
        << a.output;
    RunResult b = run(user_b, true, out + "-b.npy");
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_NE(b.output.find("tierkv: 192 of 222 prompt tokens loaded (pages: "
                            "hbm 0, host 3, nvme 0, peer 0)"),
              std::string::npos)
        << b.output;
    ASSERT_EQ(run(user_a, false, out + "-a0.npy").exit_code, 0);
    ASSERT_EQ(run(user_b, false, out + "-b0.npy").exit_code, 0);
    EXPECT_EQ(ReadAll(out + "-a.npy"), ReadAll(out + "-a0.npy"));
    EXPECT_EQ(ReadAll(out + "-b.npy"), ReadAll(out + "-b0.npy"));

    // The three system pages are stored once: 7 segments each (tiny: 4
    // layers, 3 of them with indexer keys), and neither process has a
    // fourth full page (212 + 2 and 222 + 2 fed tokens).
    auto c = daemon.Connect(format, "token-" + format);
    ASSERT_TRUE(c.ok());
    auto stats = nlohmann::json::parse(*(*c)->StatsJson());
    EXPECT_EQ(stats["host"]["segments"].get<int>(), 3 * 7) << stats.dump();
  }
  // The formats really differ: bf16 and fp8 logits are not fp32's.
  EXPECT_NE(ReadAll(dir + "/fp32-b.npy"), ReadAll(dir + "/bf16-b.npy"));
  EXPECT_NE(ReadAll(dir + "/fp32-b.npy"), ReadAll(dir + "/fp8-b.npy"));
}

TEST_F(TierkvRunTest, UnreachableTierkvdFailsWhenRequiredElseRunsWithout) {
  const std::string base = "--model " + model_.string() +
                           " --prompt-ids 1,2,3 --max-new-tokens 2 --tierkv " +
                           (dir_.path() / "no.sock").string() +
                           " --token-file /dev/null";
  RunResult r = RunTool(base + " --tierkv-required");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot connect to tierkvd"), std::string::npos)
      << r.output;
  r = RunTool(base);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tierkv unavailable"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("degraded"), std::string::npos) << r.output;
}

// The steps of a top-k trace file (failing the test on a read error).
std::vector<tierkv::executor::TopkStep> TraceSteps(const std::string& path) {
  std::vector<tierkv::executor::TopkStep> steps;
  auto reader = tierkv::executor::TopkTraceReader::Open(path);
  EXPECT_TRUE(reader.ok()) << reader.status().ToString();
  if (!reader.ok()) return steps;
  tierkv::executor::TopkStep step;
  while (true) {
    auto more = (*reader)->Next(&step);
    EXPECT_TRUE(more.ok()) << more.status().ToString();
    if (!more.ok() || !*more) break;
    steps.push_back(step);
  }
  return steps;
}

// The decode-step selections an in-process SelectionObserver sees for the
// same run: per position >= the prompt length, one per full layer in
// layer order.
std::vector<tierkv::executor::TopkStep> ObservedSteps(
    const std::filesystem::path& model_dir, const std::string& prompt_ids,
    int64_t new_tokens, tierkv::executor::AttentionMode mode) {
  using namespace tierkv::executor;
  std::vector<int32_t> prompt;
  for (size_t pos = 0; pos < prompt_ids.size();) {
    const size_t comma = std::min(prompt_ids.find(',', pos), prompt_ids.size());
    prompt.push_back(std::stoi(prompt_ids.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  const auto first = static_cast<int64_t>(prompt.size());
  std::map<int64_t, TopkStep> by_position;
  ModelOptions o;
  o.attention_mode = mode;
  o.observer = [&](int64_t, int64_t position, std::span<const float>,
                   std::span<const int32_t> selected) {
    if (position < first) return;
    TopkStep& step = by_position[position];
    step.context_tokens = position + 1;
    step.selections.emplace_back(selected.begin(), selected.end());
  };
  auto model = Model::Load(model_dir, o);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  if (!model.ok()) return {};
  auto cache = (*model)->NewCache(first + new_tokens);
  EXPECT_TRUE(cache.ok());
  GenerateOptions g;
  g.max_new_tokens = new_tokens;
  auto r = Generate(**model, cache->get(), prompt, g);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  std::vector<TopkStep> steps;
  for (auto& [position, step] : by_position) steps.push_back(step);
  return steps;
}

// --record-topk: one record per decode step (not the prompt's), one
// selection per full layer, equal to what an observer sees in process.
TEST_F(TierkvRunTest, RecordTopkWritesEachDecodeStepAsAnObserverSeesIt) {
  const std::string trace = dir_.File("topk.tk");
  const std::string prompt = Ids(1, 40);  // > index_topk 16
  const RunResult r =
      RunTool("--model " + model_.string() + " --prompt-ids " + prompt +
              " --max-new-tokens 10 --record-topk " + trace);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("9 decode steps x 3 full layers (k 16)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("consecutive-step overlap per full layer: 0:"),
            std::string::npos)
      << r.output;
  auto reader = tierkv::executor::TopkTraceReader::Open(trace);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ((*reader)->header().full_layers, (std::vector<int32_t>{0, 1, 3}));
  EXPECT_NE((*reader)->header().source.find("prompt 40 tokens"),
            std::string::npos);
  const auto steps = TraceSteps(trace);
  ASSERT_EQ(steps.size(), 9u);
  for (const auto& step : steps) EXPECT_EQ(step.selections.size(), 3u);
  EXPECT_EQ(steps, ObservedSteps(model_, prompt, 10,
                                 tierkv::executor::AttentionMode::kAuto));
}

// With --tierkv (a prefix loaded from tierkvd, so part of the prompt is
// never prefilled) the trace equals the one of a run without it.
TEST_F(TierkvRunTest, RecordTopkWorksWithTierkvd) {
  tierkv::testing::DaemonProcess daemon;
  const tierkv::Status started = daemon.Start(
      {.config_toml = "[[namespace]]\nname = \"topk\"\ntoken = "
                      "\"token-topk\"\nhost_bytes = \"8MiB\"\nshards = 1\n"});
  ASSERT_TRUE(started.ok()) << started.ToString() << "\n" << daemon.log();
  const std::string token_file = dir_.File("topk.token");
  std::ofstream(token_file) << "token-topk\n";
  const std::string prompt = Ids(3, 150);
  auto run = [&](const std::string& trace, bool with_tierkv) {
    return RunTool("--model " + model_.string() + " --prompt-ids " + prompt +
                   " --max-new-tokens 9 --attention mqa --record-topk " +
                   trace +
                   (with_tierkv ? " --tierkv " + daemon.socket_path() +
                                      " --namespace topk --token-file " +
                                      token_file + " --tierkv-required"
                                : ""));
  };
  const std::string plain = dir_.File("plain.tk"), first = dir_.File("a.tk"),
                    second = dir_.File("b.tk");
  RunResult r = run(plain, false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run(first, true);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run(second, true);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tierkv: 128 of 150 prompt tokens loaded"),
            std::string::npos)
      << r.output;
  const auto expected = TraceSteps(plain);
  ASSERT_EQ(expected.size(), 8u);
  EXPECT_EQ(TraceSteps(first), expected);
  EXPECT_EQ(TraceSteps(second), expected);
  EXPECT_EQ(expected,
            ObservedSteps(model_, prompt, 9,
                          tierkv::executor::AttentionMode::kAbsorbedMqa));
}

// --working-set: decode reads its sparse attention rows through a working
// set smaller than the context (tiny: index_topk 16; 24 slots for 90+
// tokens), with the same logits, and says what the working set did.
TEST_F(TierkvRunTest, AWorkingSetSmallerThanTheContextGivesTheSameLogits) {
  std::string ids;
  for (int i = 0; i < 90; ++i) ids += (i ? "," : "") + std::to_string(i % 97);
  const std::string base = "--model " + model_.string() + " --prompt-ids " +
                           ids + " --max-new-tokens 40 --logits-out ";
  const std::string direct = (dir_.path() / "direct.npy").string();
  ASSERT_EQ(RunTool(base + direct).exit_code, 0);
  for (const std::string policy : {"lru", "topk"}) {
    const std::string npy = (dir_.path() / (policy + ".npy")).string();
    const RunResult r = RunTool(base + npy + " --working-set 24 " +
                                "--working-set-policy " + policy);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(
        r.output.find("working set (" + policy + ", 24 slots in host memory)"),
        std::string::npos)
        << r.output;
    EXPECT_EQ(ReadAll(npy), ReadAll(direct)) << policy;
  }
  // The slots on the device: this machine has none (CI never has a GPU),
  // so the working set says it emulates one, and the logits stay the same.
  const std::string npy = (dir_.path() / "device.npy").string();
  const RunResult on_device =
      RunTool(base + npy + " --working-set 24 --working-set-memory device");
  ASSERT_EQ(on_device.exit_code, 0) << on_device.output;
  if (on_device.output.find("in cuda device memory") == std::string::npos) {
    EXPECT_NE(on_device.output.find("24 slots in emulated device memory"),
              std::string::npos)
        << on_device.output;
    EXPECT_NE(on_device.output.find("emulated in host memory"),
              std::string::npos)
        << on_device.output;
  }
  EXPECT_EQ(ReadAll(npy), ReadAll(direct));
  const RunResult small = RunTool(base + direct + " --working-set 8");
  EXPECT_NE(small.exit_code, 0);
  EXPECT_NE(small.output.find("index_topk 16"), std::string::npos)
      << small.output;
}

}  // namespace
