// `tierkv-bench weights` end to end on a small checkpoint pair (issue 28,
// item 6): the bench that gives the weights figures runs on every CI run,
// so a change to the daemon, the NVMe catalog (the bench reads A's extents
// from it for fio) or fio's arguments cannot break it unseen. Its speed is
// not checked here (performance lives in bench/RESULTS.md): that every case
// ran against its peer, and that dedup counted exactly.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/testing/daemon_process.h"
#include "tests/testing/temp_dir.h"

namespace tierkv::bench {
namespace {

TEST(WeightsBenchTest, RunsEveryCaseAgainstItsPeerAndCountsDedupExactly) {
  // O_DIRECT (the daemon's NVMe file, fio) needs a real file system.
  testing::TempDir dir("/var/tmp");
  const std::string json = dir.File("weights.json");
  // Checkpoints of 192 MiB against the weights DRAM's least, 256 MiB: A
  // and B do not fit together. No safetensors Python: the naive baseline
  // falls back to read + copy.
  const std::string command =
      testing::BinDir() +
      "/tierkv-bench weights --model-bytes 192MiB --layers 4 --iterations 1 "
      "--switches 2 --python /nonexistent/python --dir " +
      dir.File("work") + " --json " + json + " 2>&1";
  const testing::CommandRun run = testing::RunCommand(command);
  const std::string& output = run.output;
  ASSERT_EQ(run.exit_code, 0) << output;

  std::ifstream in(json);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << output;
  const uint64_t model = uint64_t{192} << 20;
  // B shares layers 0 and 2 of 4 with A byte for byte: half a checkpoint
  // more, to the byte.
  EXPECT_EQ(j.at("dedup_unique_bytes").get<uint64_t>(), model + model / 2);
  EXPECT_GT(j.at("import").at("fio_write_gbps").get<double>(), 0);
  EXPECT_GT(j.at("cold").at("gbps").get<double>(), 0);
  EXPECT_GT(j.at("cold").at("fio_read_gbps").get<double>(), 0) << output;
  EXPECT_GT(j.at("warm").at("memcpy_gbps").get<double>(), 0);
  EXPECT_EQ(j.at("warm").at("naive").get<std::string>(), "read() + copy");
  ASSERT_EQ(j.at("switch").size(), 3u) << output;
  for (const auto& mode : j.at("switch")) {
    EXPECT_GT(mode.at("layer0_p50_s").get<double>(), 0) << mode.dump();
    EXPECT_GT(mode.at("stall_p50_s").get<double>(), 0) << mode.dump();
  }
}

}  // namespace
}  // namespace tierkv::bench
