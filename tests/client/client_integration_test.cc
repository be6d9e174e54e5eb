// End-to-end behaviour of libtierkv against a real tierkvd process.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/client/client_test_util.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"
#include "transport/protocol.h"
#include "transport/uds_channel.h"

namespace tierkv::testing {
namespace {

constexpr size_t kSeg = 64 * 1024;  // OnePartLayout(1024): 64 tokens * 1 KiB

nlohmann::json Stats(Client& c) {
  auto s = c.StatsJson();
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return nlohmann::json::parse(s.ok() ? *s : "{}");
}

class ClientIntegrationTest : public ::testing::Test {
 protected:
  void StartDaemon(std::vector<std::string> args = {}) {
    ASSERT_OK(daemon_.Start({.extra_args = std::move(args)}));
  }
  std::unique_ptr<Client> Open() {
    auto c = daemon_.Connect();
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return nullptr;
    EXPECT_OK((*c)->RegisterLayout(OnePartLayout()));
    return std::move(c).value();
  }

  DaemonProcess daemon_;
};

TEST_F(ClientIntegrationTest, PagePutByOneProcessIsMatchedAndReadByAnother) {
  StartDaemon();
  const auto pages = Pages(16, 1000);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Writer process: its own connection, its own mapping of the arena.
    auto c = daemon_.Connect();
    if (!c.ok() || !(*c)->RegisterLayout(OnePartLayout()).ok()) ::_exit(2);
    for (const PutResult& s : PutPages(**c, pages, kSeg)) {
      if (!s.ok()) ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;

  auto reader = Open();
  auto match = reader->Match(pages);
  ASSERT_OK(match);
  EXPECT_EQ(match->leading_pages, 16u);
  for (Tier t : match->tiers) EXPECT_EQ(t, Tier::kHost);
  for (const auto& p : pages) EXPECT_TRUE(ReadsBackExact(*reader, p, kSeg));

  // A longer prompt matches only its stored prefix.
  auto longer = Pages(20, 1000);
  auto partial = reader->Match(longer);
  ASSERT_OK(partial);
  EXPECT_EQ(partial->leading_pages, 16u);
  EXPECT_EQ(partial->tiers[17], Tier::kMiss);
}

TEST_F(ClientIntegrationTest, SamePrefixPutTwiceIsStoredOnce) {
  StartDaemon();
  auto a = Open();
  auto b = Open();
  const auto pages = Pages(32);
  for (const PutResult& s : PutPages(*a, pages, kSeg)) EXPECT_OK(s);
  const auto before = Stats(*a);
  for (const PutResult& r : PutPages(*b, pages, kSeg)) {
    EXPECT_OK(r);  // dedup is a success
    EXPECT_TRUE(r.already_stored);
  }
  const auto after = Stats(*a);
  EXPECT_EQ(after["host"]["used_bytes"], before["host"]["used_bytes"]);
  EXPECT_EQ(after["host"]["segments"], 32);
  EXPECT_EQ(after["host"]["dedup_hits"].get<uint64_t>(),
            before["host"]["dedup_hits"].get<uint64_t>() + 32);
  // The Prometheus counter says the same (read from storage at scrape).
  auto text = HttpGet(daemon_.metrics_port(), "/metrics");
  ASSERT_OK(text);
  EXPECT_EQ(
      MetricValue(*text, R"(tierkv_dedup_hits_total{namespace="default"})"),
      32);
}

TEST_F(ClientIntegrationTest, FillingPastCapacityEvictsLruAndNeverPinned) {
  // One shard of 4 MiB holds exactly 64 segments of 64 KiB.
  StartDaemon({"--host-bytes", "4MiB", "--shards", "1"});
  auto c = Open();
  const auto pages = Pages(100);
  std::vector<PageHash> first(pages.begin(), pages.begin() + 64);
  for (const PutResult& s : PutPages(*c, first, kSeg)) ASSERT_OK(s);

  std::vector<SegmentKey> pinned_keys;
  for (int i = 0; i < 4; ++i) pinned_keys.push_back({pages[i], 0, 0});
  auto pin = c->Pin(pinned_keys, std::chrono::seconds(60));
  ASSERT_OK(pin);
  for (const Status& s : pin->statuses()) EXPECT_OK(s);
  for (int i = 4; i < 8; ++i) EXPECT_TRUE(ReadsBackExact(*c, pages[i], kSeg));

  std::vector<PageHash> more(pages.begin() + 64, pages.end());
  for (const PutResult& s : PutPages(*c, more, kSeg)) ASSERT_OK(s);

  EXPECT_EQ(Stats(*c)["host"]["evictions"], 36);
  auto present = [&](int i) {
    auto m = c->Match(std::span(&pages[i], 1));
    return m.ok() && m->leading_pages == 1;
  };
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(present(i)) << "pinned page " << i;
  for (int i = 4; i < 8; ++i)
    EXPECT_TRUE(present(i)) << "recently read page " << i;
  for (int i = 8; i < 44; ++i) EXPECT_FALSE(present(i)) << "LRU page " << i;
  for (int i = 44; i < 100; ++i) EXPECT_TRUE(present(i)) << "newer page " << i;

  // With everything but the pins gone, pinned pages still refuse eviction.
  for (const PutResult& r : PutPages(*c, Pages(100, 50000), kSeg)) {
    EXPECT_TRUE(r.ok() || r.status.code() == StatusCode::kResourceExhausted)
        << r.status.ToString();
  }
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(ReadsBackExact(*c, pages[i], kSeg));
}

TEST_F(ClientIntegrationTest, KilledClientsLeasesAndReservationsAreReclaimed) {
  StartDaemon();
  auto c = Open();
  const auto pages = Pages(4);
  for (const PutResult& s : PutPages(*c, pages, kSeg)) ASSERT_OK(s);

  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto k = daemon_.Connect();
    if (!k.ok()) ::_exit(2);
    std::vector<SegmentKey> keys = {{pages[0], 0, 0}, {pages[1], 0, 0}};
    auto read = (*k)->Acquire(keys);  // read lease
    auto pin = (*k)->Pin(std::vector<SegmentKey>{{pages[2], 0, 0}},
                         std::chrono::hours(1));  // pin
    // A put that reserves space and never commits, via the raw protocol.
    auto ch = transport::UdsChannel::Connect(daemon_.socket_path(),
                                             std::chrono::seconds(5));
    std::ifstream tf(daemon_.dir().File("default.token"));
    std::string token;
    std::getline(tf, token);
    auto open = (*ch)->Call(
        static_cast<uint16_t>(transport::Opcode::kOpenNamespace),
        transport::Encode(transport::OpenNamespaceRequest{"default", token}));
    transport::PutReserveRequest req;
    for (const auto& p : Pages(8, 777)) req.items.push_back({{p, 0, 0}, kSeg});
    auto reserved =
        (*ch)->Call(static_cast<uint16_t>(transport::Opcode::kPutReserve),
                    transport::Encode(req));
    const char ok =
        read.ok() && pin.ok() && open.ok() && reserved.ok() ? 'y' : 'n';
    (void)::write(ready[1], &ok, 1);
    ::pause();  // until SIGKILL
    ::_exit(0);
  }
  char ok = 0;
  ASSERT_EQ(::read(ready[0], &ok, 1), 1);
  ASSERT_EQ(ok, 'y');
  auto held = Stats(*c);
  EXPECT_EQ(held["host"]["referenced_segments"], 3);
  EXPECT_EQ(held["host"]["reserved_bytes"], 8 * kSeg);

  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  // The daemon reclaims on the dead connection's end, which it announces
  // to nobody: its stats show it.
  EXPECT_TRUE(PollUntil([&] {
    auto s = Stats(*c);
    return s["host"]["referenced_segments"] == 0 &&
           s["host"]["reserved_bytes"] == 0 && s["active_leases"] == 0;
  })) << Stats(*c).dump();
  // Reclaimed space is usable again, and the committed data is intact.
  for (const PutResult& s : PutPages(*c, Pages(8, 777), kSeg)) EXPECT_OK(s);
  for (const auto& p : pages) EXPECT_TRUE(ReadsBackExact(*c, p, kSeg));
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST_F(ClientIntegrationTest, LeasesOfAHungClientExpire) {
  StartDaemon({"--lease-ttl-ms", "300"});
  auto c = Open();
  const auto pages = Pages(2);
  for (const PutResult& s : PutPages(*c, pages, kSeg)) ASSERT_OK(s);
  auto hung = Open();  // stays connected but never releases
  auto lease = hung->Acquire(std::vector<SegmentKey>{{pages[0], 0, 0}});
  ASSERT_OK(lease);
  EXPECT_EQ(Stats(*c)["host"]["referenced_segments"], 1);
  // The daemon's sweeper expires it after the TTL; only stats show it.
  EXPECT_TRUE(
      PollUntil([&] { return Stats(*c)["host"]["referenced_segments"] == 0; }));
  EXPECT_EQ(lease->Release().code(), StatusCode::kNotFound)
      << "expired already";
}

TEST_F(ClientIntegrationTest, AGetOfManySubBatchesReadsAllAndHoldsNoLease) {
  // 24 MiB in one Get: twelve 2 MiB sub-batches, leased a window ahead and
  // released by later requests or one-way at the end.
  StartDaemon();
  auto c = Open();
  const auto pages = Pages(384, 5000);
  std::vector<PageHash> stored;
  for (size_t i = 0; i < pages.size(); ++i) {
    if (i % 50 != 7) stored.push_back(pages[i]);  // a few misses in between
  }
  for (const PutResult& s : PutPages(*c, stored, kSeg)) ASSERT_OK(s);
  std::vector<std::vector<std::byte>> dst(pages.size(),
                                          std::vector<std::byte>(kSeg));
  std::vector<SegmentRead> reads;
  for (size_t i = 0; i < pages.size(); ++i) {
    reads.push_back({{pages[i], 0, 0}, dst[i]});
  }
  const std::vector<Status> got = c->Get(reads);
  ASSERT_EQ(got.size(), pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    if (i % 50 == 7) {
      EXPECT_EQ(got[i].code(), StatusCode::kNotFound) << i;
    } else {
      ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].ToString();
      EXPECT_EQ(dst[i], SegmentBytes({pages[i], 0, 0}, kSeg)) << i;
    }
  }
  // The one-way releases precede this request on the connection, so the
  // daemon has run them before it answers.
  const auto s = Stats(*c);
  EXPECT_EQ(s["active_leases"], 0) << s.dump();
  EXPECT_EQ(s["host"]["referenced_segments"], 0) << s.dump();
}

TEST_F(ClientIntegrationTest, GetChecksDestinationSizeAndReportsMisses) {
  StartDaemon();
  auto c = Open();
  const auto pages = Pages(2);
  ASSERT_OK(PutPages(*c, {pages[0]}, kSeg)[0]);
  std::vector<std::byte> small(100), right(kSeg);
  std::vector<SegmentRead> reads = {{{pages[0], 0, 0}, small},
                                    {{pages[1], 0, 0}, right},
                                    {{pages[0], 0, 0}, right}};
  auto got = c->Get(reads);
  EXPECT_EQ(got[0].code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(got[1].code(), StatusCode::kNotFound);
  EXPECT_OK(got[2]);
  EXPECT_EQ(right, SegmentBytes({pages[0], 0, 0}, kSeg));
  // Sizes must match the registered layout.
  std::vector<std::byte> wrong(kSeg + 1);
  SegmentWrite w{{pages[1], 0, 0}, wrong};
  EXPECT_EQ(c->Put(std::span(&w, 1))[0].status.code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c->RegisterLayout(OnePartLayout(512)).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(ClientIntegrationTest, SigtermStopsCleanlyAndRemovesTheSocket) {
  StartDaemon();
  int status = daemon_.Stop(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_FALSE(std::filesystem::exists(daemon_.socket_path()));
  EXPECT_EQ(
      Client::Connect({.socket_path = daemon_.socket_path()}).status().code(),
      StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tierkv::testing
