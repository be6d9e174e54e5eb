// The NVMe tier behind a real tierkvd: restart, corruption, damaged or
// missing files, promotion on Get and Match, one data sync per Flush.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/client/client_test_util.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/small_tmpfs.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace tierkv::testing {
namespace {

constexpr size_t kSeg = 64 * 1024;

class NvmeTierTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(data_dir_.empty()); }

  // `namespace_toml`: more keys for the namespace's table.
  Status Start(std::vector<std::string> extra = {},
               const std::string& nvme_dir = "",
               const std::string& namespace_toml = "") {
    daemon_ = std::make_unique<DaemonProcess>();
    std::vector<std::string> args = {
        "--host-bytes",
        "8MiB",
        "--shards",
        "1",
        "--nvme-path",
        (nvme_dir.empty() ? data_dir_ : nvme_dir) + "/nvme.data",
        "--nvme-bytes",
        "64MiB"};
    args.insert(args.end(), extra.begin(), extra.end());
    // Keep the token across restarts: the daemon's temp dir is new each time.
    if (!token_.empty()) {
      std::ofstream(data_dir_ + "/default.token") << token_ << "\n";
      // tierkvd refuses a token file others may read.
      std::filesystem::permissions(data_dir_ + "/default.token",
                                   std::filesystem::perms::owner_read |
                                       std::filesystem::perms::owner_write);
    }
    std::string config =
        "[[namespace]]\nname = \"default\"\ntoken_file = \"" + data_dir_ +
        "/default.token\"\nhost_bytes = \"8MiB\"\nshards = 1\n" +
        namespace_toml;
    Status s = daemon_->Start({.config_toml = config, .extra_args = args});
    if (s.ok() && token_.empty()) {
      std::ifstream in(data_dir_ + "/default.token");
      std::getline(in, token_);
    }
    return s;
  }
  std::unique_ptr<Client> Open() {
    auto c = daemon_->Connect("default", token_);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return nullptr;
    EXPECT_OK((*c)->RegisterLayout(OnePartLayout()));
    return std::move(c).value();
  }
  nlohmann::json Stats(Client& c) {
    auto s = c.StatsJson();
    EXPECT_TRUE(s.ok());
    return nlohmann::json::parse(s.ok() ? *s : "{}");
  }
  std::vector<SegmentKey> Keys(const std::vector<PageHash>& pages) {
    std::vector<SegmentKey> keys;
    for (const auto& p : pages) keys.push_back({p, 0, 0});
    return keys;
  }

  // Disk-backed: the NVMe tier's data file needs O_DIRECT. Declared before
  // daemon_, so the daemon stops before the directory is removed.
  TempDir dir_{"/var/tmp"};
  const std::string data_dir_ = dir_.path().string();
  std::string token_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(NvmeTierTest, SegmentsSurviveACleanRestartWithTheSameHashes) {
  ASSERT_OK(Start({"--write-policy", "write_through"}));
  const auto pages = Pages(40);
  {
    auto c = Open();
    for (const PutResult& s : PutPages(*c, pages, kSeg)) ASSERT_OK(s);
    for (const Status& s : c->Flush(Keys(pages))) ASSERT_OK(s);
  }
  EXPECT_EQ(daemon_->Stop(SIGTERM), 0);
  ASSERT_OK(Start());
  auto c = Open();  // the engine registers the same layout again, nothing more
  auto stats = Stats(*c);
  EXPECT_EQ(stats["nvme"]["recovered_segments"], 40);
  EXPECT_EQ(stats["nvme"]["recovered_bytes"], 40 * kSeg);
  auto match = c->Match(pages);
  ASSERT_OK(match);
  EXPECT_EQ(match->leading_pages, 40u);
  EXPECT_EQ(match->tiers[0], Tier::kNvme);
  for (const auto& p : pages) EXPECT_TRUE(ReadsBackExact(*c, p, kSeg));
  // Read once, the pages are in DRAM again.
  auto again = c->Match(std::span(pages).first(8));
  ASSERT_OK(again);
  EXPECT_EQ(again->tiers[7], Tier::kHost);
}

TEST_F(NvmeTierTest, WriteBackDemotesEvictedSegmentsAndGetPromotesThem) {
  ASSERT_OK(Start());  // write_back is the default with an NVMe tier
  auto c = Open();
  const auto pages = Pages(400);  // 25 MiB through an 8 MiB host tier
  for (const PutResult& s : PutPages(*c, pages, kSeg)) ASSERT_OK(s);
  // Write-back persists a segment before DRAM may evict it, so every
  // evicted page is on NVMe the moment the Puts return: nothing to wait for.
  auto stats = Stats(*c);
  EXPECT_GE(stats["host"]["evictions"].get<uint64_t>(), 270u) << stats.dump();
  EXPECT_GE(stats["nvme"]["segments"].get<uint64_t>(),
            stats["host"]["evictions"].get<uint64_t>());
  EXPECT_EQ(stats["nvme"]["demotions_failed"], 0);
  auto match = c->Match(pages);
  ASSERT_OK(match);
  EXPECT_EQ(match->leading_pages, 400u) << "evicted pages are found on NVMe";
  for (int i = 0; i < 10; ++i)
    EXPECT_TRUE(ReadsBackExact(*c, pages[i], kSeg)) << i;
}

TEST_F(NvmeTierTest, FlushOfAThousandKeysIssuesOneDataSync) {
  // Nothing reaches NVMe before Flush: every key is written by it.
  ASSERT_OK(Start({"--write-policy", "none"}));
  auto connected = daemon_->Connect("default", token_);
  ASSERT_OK(connected);
  Client& c = **connected;
  constexpr size_t kSmallSeg = 4096;  // 1,000 of them fit the 8 MiB tier
  ASSERT_OK(c.RegisterLayout(OnePartLayout(kSmallSeg / 64)));
  const auto pages = Pages(1000);
  for (const PutResult& s : PutPages(c, pages, kSmallSeg)) ASSERT_OK(s);
  auto before = Stats(c);
  ASSERT_EQ(before["host"]["segments"], 1000) << before.dump();
  ASSERT_EQ(before["nvme"]["segments"], 0) << before.dump();
  const uint64_t syncs = before["nvme"]["device_syncs"].get<uint64_t>();

  for (const Status& s : c.Flush(Keys(pages))) ASSERT_OK(s);
  auto after = Stats(c);
  EXPECT_EQ(after["nvme"]["device_syncs"].get<uint64_t>() - syncs, 1u)
      << after.dump();
  EXPECT_EQ(after["nvme"]["segments"], 1000) << after.dump();
  EXPECT_EQ(after["nvme"]["writes"], 1000) << after.dump();
  auto text = HttpGet(daemon_->metrics_port(), "/metrics");
  ASSERT_OK(text);
  EXPECT_EQ(MetricValue(*text, "tierkv_nvme_device_syncs_total"),
            static_cast<double>(syncs + 1));
  // Exported under its own name (it used to be replaced by a second,
  // moved-from copy of tierkv_mover_segments_total); -1 means absent.
  EXPECT_GE(
      MetricValue(*text, R"(tierkv_mover_batches_total{kind="demotion"})"), 0)
      << *text;

  // Already durable: a second Flush writes and syncs nothing.
  for (const Status& s : c.Flush(Keys(pages))) ASSERT_OK(s);
  auto again = Stats(c);
  EXPECT_EQ(again["nvme"]["device_syncs"].get<uint64_t>() - syncs, 1u);
  EXPECT_EQ(again["nvme"]["writes"], 1000);
}

// host_alignment = 4096: Flush writes segments straight from the arena (no
// bounce copy) and a Get promotes them straight back into it; the default
// 64 B alignment bounces every segment of a size that is not whole blocks.
TEST_F(NvmeTierTest, ABlockAlignedArenaMovesSegmentsToNvmeAndBackInPlace) {
  for (const int alignment : {4096, 64}) {
    SCOPED_TRACE(alignment);
    const std::string nvme_dir = data_dir_ + "/" + std::to_string(alignment);
    std::filesystem::create_directories(nvme_dir);  // a fresh tier each
    ASSERT_OK(Start({"--write-policy", "none"}, nvme_dir,
                    "host_alignment = " + std::to_string(alignment) + "\n"));
    auto c = daemon_->Connect("default", token_);
    ASSERT_OK(c);
    constexpr size_t kOdd = 64 * 1000;  // 15.6 blocks
    ASSERT_OK((*c)->RegisterLayout(OnePartLayout(kOdd / 64)));
    const auto pages = Pages(8);
    for (const PutResult& s : PutPages(**c, pages, kOdd)) ASSERT_OK(s);
    for (const Status& s : (*c)->Flush(Keys(pages))) ASSERT_OK(s);
    auto flushed = Stats(**c);
    EXPECT_EQ(flushed["nvme"]["writes"], 8) << flushed.dump();
    EXPECT_EQ(flushed["nvme"]["bounced_writes"], alignment == 4096 ? 0 : 8)
        << flushed.dump();
    // Out of DRAM (Put past its 8 MiB), then read back through NVMe.
    for (const PutResult& s : PutPages(**c, Pages(160, 1000), kOdd)) {
      ASSERT_OK(s);
    }
    ASSERT_EQ((*c)->Match(pages)->tiers[0], Tier::kNvme);
    for (const auto& p : pages) EXPECT_TRUE(ReadsBackExact(**c, p, kOdd));
    auto read = Stats(**c);
    EXPECT_EQ(read["nvme"]["bounced_reads"], alignment == 4096 ? 0 : 8)
        << read.dump();
    // The reads ran on the tier's readers (the default 4), none sent back
    // to its caller by a full queue, and none is waiting now.
    EXPECT_EQ(read["nvme"]["readers"], 4) << read.dump();
    EXPECT_EQ(read["nvme"]["inline_reads"], 0) << read.dump();
    EXPECT_EQ(read["nvme"]["read_queue_depth"], 0) << read.dump();
    daemon_.reset();
  }
}

TEST_F(NvmeTierTest, FlippedBytesOnDiskAreAMissAndCounted) {
  ASSERT_OK(Start({"--write-policy", "none"}));
  const auto pages = Pages(1);
  {
    auto c = Open();
    ASSERT_OK(PutPages(*c, pages, kSeg)[0]);
    ASSERT_OK(c->Flush(Keys(pages))[0]);  // the only segment: at offset 0
  }
  daemon_->Stop(SIGTERM);
  {
    std::fstream f(data_dir_ + "/nvme.data",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(1000);
    char b = 0;
    f.read(&b, 1);
    b = static_cast<char>(b ^ 0x5a);
    f.seekp(1000);
    f.write(&b, 1);
  }
  ASSERT_OK(Start());
  auto c = Open();
  std::vector<std::byte> dst(kSeg);
  SegmentRead r{{pages[0], 0, 0}, dst};
  EXPECT_EQ(c->Get(std::span(&r, 1))[0].code(), StatusCode::kNotFound);
  EXPECT_EQ(Stats(*c)["nvme"]["checksum_failures"], 1);
  auto text = HttpGet(daemon_->metrics_port(), "/metrics");
  ASSERT_OK(text);
  EXPECT_EQ(MetricValue(*text, R"(tierkv_corruptions_total{tier="nvme"})"), 1);
}

TEST_F(NvmeTierTest, DamagedCatalogIsAClearErrorOrAnExplicitFreshStart) {
  ASSERT_OK(Start({"--write-policy", "write_through"}));
  {
    auto c = Open();
    ASSERT_OK(PutPages(*c, Pages(1), kSeg)[0]);
    ASSERT_OK(c->Flush(Keys(Pages(1)))[0]);
  }
  daemon_->Stop(SIGTERM);
  // Wreck every file of the RocksDB catalog.
  for (const auto& entry :
       std::filesystem::directory_iterator(data_dir_ + "/nvme.data.catalog")) {
    std::ofstream(entry.path(), std::ios::trunc) << "garbage";
  }
  Status s = Start();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("recreate_damaged_catalog"),
            std::string_view::npos)
      << s.ToString();
  // The operator opts in to starting empty.
  std::ofstream(data_dir_ + "/recreate.toml")
      << "[nvme]\npath = \"" << data_dir_
      << "/nvme.data\"\ncapacity_bytes = \"64MiB\"\n"
      << "recreate_damaged_catalog = true\n"
      << "[[namespace]]\nname = \"default\"\ntoken_file = \"" << data_dir_
      << "/default.token\"\nhost_bytes = \"8MiB\"\nshards = 1\n";
  daemon_ = std::make_unique<DaemonProcess>();
  ASSERT_OK(daemon_->Start(
      {.extra_args = {"--config", data_dir_ + "/recreate.toml"}}));
  auto c = Open();
  EXPECT_EQ(Stats(*c)["nvme"]["catalog_recreated"], true);
  auto m = c->Match(Pages(1));
  ASSERT_OK(m);
  EXPECT_EQ(m->leading_pages, 0u);
}

TEST_F(NvmeTierTest, MissingDataFileRecoversCleanly) {
  ASSERT_OK(Start({"--write-policy", "write_through"}));
  const auto pages = Pages(4);
  {
    auto c = Open();
    for (const PutResult& s : PutPages(*c, pages, kSeg)) ASSERT_OK(s);
    for (const Status& s : c->Flush(Keys(pages))) ASSERT_OK(s);
  }
  daemon_->Stop(SIGTERM);
  std::filesystem::remove(data_dir_ + "/nvme.data");
  ASSERT_OK(Start());
  auto c = Open();
  for (const auto& p : pages) {
    std::vector<std::byte> dst(kSeg);
    SegmentRead r{{p, 0, 0}, dst};
    EXPECT_EQ(c->Get(std::span(&r, 1))[0].code(), StatusCode::kNotFound)
        << "a lost data file is a miss, never zeros";
  }
  // And the tier keeps working.
  for (const PutResult& s : PutPages(*c, Pages(4, 900), kSeg)) EXPECT_OK(s);
  for (const Status& s : c->Flush(Keys(Pages(4, 900)))) EXPECT_OK(s);
}

TEST_F(NvmeTierTest, AFullDiskNeverStopsTheDaemonAndLosesNothing) {
  // Data file (64 MiB, preallocated) and catalog on a 72 MiB tmpfs.
  auto fs = SmallTmpfs::Mount(72 << 20);
  if (!fs.ok()) GTEST_SKIP() << fs.status().ToString();
  const std::string nvme_dir = (*fs)->path().string();
  ASSERT_OK(Start({"--write-policy", "write_through"}, nvme_dir));
  const auto stored = Pages(40);
  const auto later = Pages(200, 1000);
  {
    auto c = Open();
    for (const PutResult& s : PutPages(*c, stored, kSeg)) ASSERT_OK(s);
    for (const Status& s : c->Flush(Keys(stored))) ASSERT_OK(s);
    ASSERT_GT((*fs)->Fill(), 0u);
    // Puts keep landing in DRAM; their persistence fails (the catalog
    // cannot grow), and Flush says so with an error, not an abort.
    for (const PutResult& s : PutPages(*c, later, kSeg)) ASSERT_OK(s);
    bool refused = false;
    for (const Status& s : c->Flush(Keys({later.back()}))) {
      refused = s.code() == StatusCode::kIOError;
    }
    EXPECT_TRUE(refused);
    auto stats = Stats(*c);
    EXPECT_EQ(stats["nvme"]["read_only"], true) << stats.dump();
    for (const auto& p : stored) EXPECT_TRUE(ReadsBackExact(*c, p, kSeg));
    auto metrics = HttpGet(daemon_->metrics_port(), "/metrics");
    ASSERT_OK(metrics);
    EXPECT_NE(metrics->find("tierkv_nvme_read_only 1"), std::string::npos);
  }
  // Restart on the full disk (what the shutdown freed taken too): it
  // starts and serves the stored pages from NVMe (DRAM is empty now).
  EXPECT_EQ(daemon_->Stop(SIGTERM), 0) << daemon_->log();
  (*fs)->Fill();
  ASSERT_EQ((*fs)->FreeBytes(), 0u);
  ASSERT_OK(Start({}, nvme_dir));
  {
    auto c = Open();
    auto match = c->Match(stored);
    ASSERT_OK(match);
    EXPECT_EQ(match->leading_pages, stored.size());
    for (const auto& p : stored) EXPECT_TRUE(ReadsBackExact(*c, p, kSeg));
    EXPECT_EQ(Stats(*c)["nvme"]["read_only"], true);
  }
  // Space back, restarted: writable, nothing acknowledged lost.
  (*fs)->Unfill();
  EXPECT_EQ(daemon_->Stop(SIGTERM), 0) << daemon_->log();
  ASSERT_OK(Start({}, nvme_dir));
  auto c = Open();
  EXPECT_EQ(Stats(*c)["nvme"]["read_only"], false);
  for (const auto& p : stored) EXPECT_TRUE(ReadsBackExact(*c, p, kSeg));
  for (const PutResult& s : PutPages(*c, later, kSeg)) ASSERT_OK(s);
  for (const Status& s : c->Flush(Keys(later))) EXPECT_OK(s);
}

TEST_F(NvmeTierTest, ANamespacesNvmeReservationSurvivesAnotherTenantsFlood) {
  // 32 MiB of NVMe: "kept" reserves 8 MiB, "flood" shares the other 24.
  const std::string config =
      "[nvme]\npath = \"" + data_dir_ +
      "/quota.data\"\ncapacity_bytes = \"32MiB\"\n"
      "[[namespace]]\nname = \"kept\"\ntoken = \"token-of-kept\"\n"
      "host_bytes = \"4MiB\"\nshards = 1\nnvme_bytes = \"8MiB\"\n"
      "write_policy = \"write_through\"\n"
      "[[namespace]]\nname = \"flood\"\ntoken = \"token-of-flood\"\n"
      "host_bytes = \"4MiB\"\nshards = 1\nwrite_policy = \"write_through\"\n";
  daemon_ = std::make_unique<DaemonProcess>();
  ASSERT_OK(daemon_->Start({.config_toml = config}));
  auto kept = daemon_->Connect("kept", "token-of-kept");
  auto flood = daemon_->Connect("flood", "token-of-flood");
  ASSERT_OK(kept);
  ASSERT_OK(flood);
  ASSERT_OK((*kept)->RegisterLayout(OnePartLayout()));
  ASSERT_OK((*flood)->RegisterLayout(OnePartLayout()));
  const auto pages = Pages(60);  // 3.75 MiB
  for (const PutResult& s : PutPages(**kept, pages, kSeg)) ASSERT_OK(s);
  for (const Status& s : (*kept)->Flush(Keys(pages))) ASSERT_OK(s);
  // 800 pages (50 MiB) through write-through: twice the shared NVMe space.
  const auto flooded = Pages(800, 5000);
  for (size_t i = 0; i < flooded.size(); i += 100) {
    const std::vector<PageHash> batch(flooded.begin() + i,
                                      flooded.begin() + i + 100);
    for (const PutResult& s : PutPages(**flood, batch, kSeg)) ASSERT_OK(s);
    for (const Status& s : (*flood)->Flush(Keys(batch))) ASSERT_OK(s);
  }
  auto mine = Stats(**kept)["nvme"]["namespace"];
  EXPECT_EQ(mine["segments"], 60) << mine.dump();
  EXPECT_EQ(mine["evictions"], 0);
  EXPECT_EQ(mine["reserved_bytes"], 8 << 20);
  auto theirs = Stats(**flood)["nvme"]["namespace"];
  EXPECT_GT(theirs["evictions"].get<uint64_t>(), 400u) << theirs.dump();
  EXPECT_LE(theirs["allocated_bytes"].get<uint64_t>(), uint64_t{24} << 20);
  // Every page of "kept" is still on NVMe (its DRAM holds 4 MiB at most:
  // Match reports the slowest tier of each page).
  auto match = (*kept)->Match(pages);
  ASSERT_OK(match);
  EXPECT_EQ(match->leading_pages, pages.size());
  for (const auto& p : pages) EXPECT_TRUE(ReadsBackExact(**kept, p, kSeg));
  auto metrics = HttpGet(daemon_->metrics_port(), "/metrics");
  ASSERT_OK(metrics);
  EXPECT_NE(metrics->find("tierkv_evictions_total{namespace=\"kept\","
                          "tier=\"nvme\",policy=\"lru\"} 0"),
            std::string::npos);
  EXPECT_NE(metrics->find("tierkv_namespace_bytes{namespace=\"kept\","
                          "tier=\"nvme\",state=\"quota\"} 8388608"),
            std::string::npos);
}

TEST_F(NvmeTierTest, FlushWithoutNvmeTierIsRejected) {
  DaemonProcess plain;
  ASSERT_OK(plain.Start());
  auto c = plain.Connect();
  ASSERT_OK(c);
  ASSERT_OK((*c)->RegisterLayout(OnePartLayout()));
  EXPECT_EQ((*c)->Flush(Keys(Pages(1)))[0].code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tierkv::testing
