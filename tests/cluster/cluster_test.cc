// A cluster of real tierkvd processes, each on its own loopback port, a real
// redis-server as the directory, UCX forced to tcp (shared/reference/
// scaleout.md §9.3): pages flow from the node that stored
// them to the nodes that ask, bit-identical, and every failure of a peer or
// the directory is a miss or a per-segment error, never wrong bytes and
// never a hang.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "daemon/cluster/fetch_protocol.h"
#include "storage/engine/engine_options.h"
#include "tests/client/client_test_util.h"
#include "tests/client/engine_pools.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/peer_serve_stall_fifo.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/sync_points.h"
#include "tests/testing/temp_dir.h"
#include "tests/transport/directory/redis_server.h"
#include "transport/directory/redis_directory.h"
#include "transport/peer/peer_transport.h"

namespace tierkv::testing {
namespace {

using daemon::cluster::DecodeFetchReplyHead;
using daemon::cluster::EncodeFetchRequest;
using daemon::cluster::FetchRequest;
using daemon::cluster::kFetchOpcode;
using daemon::cluster::SegmentChecksum;
using Clock = std::chrono::steady_clock;

constexpr char kToken[] = "cluster-test-token-0123456789abcdef";

// 4 layers of latent KV, indexer keys on layers 0 and 2: 6 segments a page.
LayoutSpec TestLayout() { return IndexShareLayout(4, 2); }

struct NodeSpec {
  std::string id;  // node-a, ...
  bool shared = true;
  std::string host_bytes = "16MiB";
  // A requester's deadline for every FETCH.
  int fetch_deadline_ms = 1000;
  // A requester's budget for one directory lookup (Match, and Get or Load
  // locating pages). Far above the 2 ms default, so that a lookup slowed by
  // a loaded test machine is not a miss (a Get answering "segment in no
  // tier below DRAM"); the test of the budget itself sets its own.
  int lookup_budget_us = 1000000;
  // Loads on one lane (server.load_workers = 1), so a Load's FETCHes leave
  // in layer order.
  bool one_load_lane = false;
  // On top of UCX_TLS=tcp, e.g. a PeerServeStallFifo's Env().
  std::vector<std::pair<std::string, std::string>> env;
};

// The FETCHes a one-lane Load of `pages` pages sends for each layer: the
// engine cuts a layer into min(transfer_lanes, pages) units, and the peer
// tier reads a unit's segments with one FETCH (they fit one here).
uint32_t FetchesPerLayer(size_t pages) {
  return std::clamp<uint32_t>(storage::CacheEngineOptions{}.transfer_lanes, 1,
                              static_cast<uint32_t>(pages));
}

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!RedisServer::Available()) GTEST_SKIP() << "no redis-server";
    ASSERT_OK(redis_.Start());
    secret_file_ = WriteSecret("cluster.key");
  }

  std::string WriteSecret(const std::string& name) {
    std::vector<char> bytes(32);
    std::random_device rd;
    for (char& b : bytes) b = static_cast<char>(rd());
    const std::string path = dir_.File(name);
    std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
    ::chmod(path.c_str(), 0600);
    return path;
  }

  // A lookup budget of 100 ms, not 2: on a loaded 2-core CI runner a
  // Redis round trip can take milliseconds, and a lookup past its budget
  // is a miss (correct, but not what these tests look at).
  std::string Config(const NodeSpec& n) const {
    return fmt::format(R"({}[cluster]
name = "test"
node_id = "{}"
secret_file = "{}"
directory = "{}"
directory_password_file = "{}"
peer_listen = "127.0.0.1:0"
liveness_ttl_ms = 2000
lookup_budget_us = {}
fetch_deadline_ms = {}
[[namespace]]
name = "default"
token = "{}"
host_bytes = "{}"
shards = 1
shared = {}
)",
                       n.one_load_lane ? "[server]\nload_workers = 1\n" : "",
                       n.id, secret_file_, redis_.url(), redis_.password_file(),
                       n.lookup_budget_us, n.fetch_deadline_ms, kToken,
                       n.host_bytes, n.shared ? "true" : "false");
  }

  std::unique_ptr<DaemonProcess> StartNode(const NodeSpec& n) {
    auto d = std::make_unique<DaemonProcess>();
    DaemonSpec spec{
        .config_toml = Config(n),
        .env = {{"UCX_TLS", "tcp"}, {"UCX_WARN_UNUSED_ENV_VARS", "n"}}};
    spec.env.insert(spec.env.end(), n.env.begin(), n.env.end());
    const Status s = d->Start(spec);
    EXPECT_OK(s);
    if (!s.ok()) return nullptr;
    return d;
  }

  std::unique_ptr<Client> Open(const DaemonProcess& d,
                               const LayoutSpec& layout = TestLayout()) {
    auto c = d.Connect("default", kToken);
    EXPECT_OK(c);
    if (!c.ok()) return nullptr;
    EXPECT_OK((*c)->RegisterLayout(layout));
    return std::move(c).value();
  }

  static nlohmann::json PeerStats(Client& c) {
    auto s = c.StatsJson();
    EXPECT_OK(s);
    const auto j = nlohmann::json::parse(s.ok() ? *s : "{}");
    return j.contains("peer") ? j["peer"] : nlohmann::json::object();
  }

  // Every segment of `pages` read back through `c` as PutLayoutPages wrote
  // it; per segment, the Get's Status (OK only with exact bytes).
  static std::vector<Status> GetPages(Client& c,
                                      const std::vector<PageHash>& pages) {
    const LayoutSpec layout = TestLayout();
    std::vector<SegmentKey> keys;
    for (const auto& p : pages) {
      for (const auto& k : LayoutKeys(layout, p)) keys.push_back(k);
    }
    std::vector<std::vector<std::byte>> dst;
    std::vector<SegmentRead> reads;
    for (const auto& k : keys) {
      dst.emplace_back(layout.SegmentBytes(k.layer, k.part));
    }
    for (size_t i = 0; i < keys.size(); ++i) reads.push_back({keys[i], dst[i]});
    std::vector<Status> out = c.Get(reads);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (out[i].ok() && dst[i] != SegmentBytes(keys[i], dst[i].size())) {
        out[i] = Status::Corruption("wrong bytes for " + keys[i].ToString());
      }
    }
    return out;
  }

  // Waits until `c`'s Match of `pages` reports `n` leading pages: what a
  // node published reaches the directory in the background.
  static bool MatchReaches(Client& c, const std::vector<PageHash>& pages,
                           uint32_t n) {
    return PollUntil([&] {
      auto m = c.Match(pages, {.prefetch = false});
      return m.ok() && m->leading_pages == n;
    });
  }

  // The directory's key of a page of the test namespace.
  static std::string PageKey(const PageHash& page) {
    return transport::RedisDirectory::PageKeyPrefix(
               "test",
               transport::DirectoryNamespace{"default",
                                             TestLayout().Fingerprint()}) +
           page.ToHex();
  }

  // Whether the directory names `node_id` a holder of every page.
  bool AllHeldBy(const std::vector<PageHash>& pages,
                 const std::string& node_id) {
    transport::RedisCommand mget = {"MGET"};
    for (const PageHash& page : pages) mget.push_back(PageKey(page));
    auto values = redis_.Command(mget);
    if (!values.ok() || values->elements.size() != pages.size()) return false;
    for (const transport::RedisReply& value : values->elements) {
      auto holders = transport::RedisDirectory::ParseHolderList(value.str);
      if (!holders.ok() || std::find(holders->begin(), holders->end(),
                                     node_id) == holders->end()) {
        return false;
      }
    }
    return true;
  }

  // The node's registered peer address, from the directory.
  std::string PeerAddress(const std::string& node_id) {
    auto addr = redis_.Command({"HGET", "tkv:test:node:" + node_id, "addr"});
    EXPECT_OK(addr);
    return addr.ok() ? addr->str : "";
  }

  TempDir dir_;
  RedisServer redis_;
  std::string secret_file_;
};

TEST_F(ClusterTest, PagesFlowFromTheStoringNodeToAskingNodesBitIdentical) {
  auto a = StartNode({"node-a"});
  auto b = StartNode({"node-b"});
  auto c = StartNode({"node-c"});
  ASSERT_TRUE(a && b && c);
  const auto pages = Pages(8);
  auto ca = Open(*a);
  for (const PutResult& r : PutLayoutPages(*ca, TestLayout(), pages)) {
    ASSERT_OK(r);
  }
  auto cb = Open(*b);
  ASSERT_TRUE(MatchReaches(*cb, pages, 8)) << a->log();
  auto m = cb->Match(pages, {.prefetch = false});
  ASSERT_OK(m);
  for (Tier t : m->tiers) EXPECT_EQ(t, Tier::kPeer);

  for (const Status& s : GetPages(*cb, pages)) EXPECT_OK(s);
  const auto fetched = PeerStats(*cb);
  EXPECT_EQ(fetched["fetch_segments"], 48) << fetched.dump();
  EXPECT_EQ(fetched["errors_checksum"], 0);
  EXPECT_GE(PeerStats(*ca)["served_segments"], 48);
  // Fetched once, the pages are B's own now.
  auto again = cb->Match(pages, {.prefetch = false});
  ASSERT_OK(again);
  EXPECT_EQ(again->leading_pages, 8u);
  EXPECT_EQ(again->tiers[0], Tier::kHost);

  // Dedup: storing what B now holds copies nothing.
  for (const PutResult& r : PutLayoutPages(*cb, TestLayout(), pages)) {
    EXPECT_OK(r);
    EXPECT_TRUE(r.already_stored);
  }
  // B publishes what it fetched, in the background.
  ASSERT_TRUE(PollUntil([&] { return AllHeldBy(pages, "node-b"); }));
  // A leaves (deregistering); C finds B's copy, which B published.
  EXPECT_EQ(a->Stop(SIGTERM), 0);
  auto cc = Open(*c);
  ASSERT_TRUE(MatchReaches(*cc, pages, 8)) << b->log();
  for (const Status& s : GetPages(*cc, pages)) EXPECT_OK(s);
  EXPECT_EQ(PeerStats(*cc)["fetch_segments"], 48) << PeerStats(*cc).dump();
  EXPECT_GE(PeerStats(*cb)["served_segments"], 48);
}

TEST_F(ClusterTest,
       HoldersServeOnlyAuthenticatedPeersSharedPagesOfTheirLayout) {
  auto a = StartNode({"node-a"});
  ASSERT_TRUE(a);
  const auto pages = Pages(2);
  auto ca = Open(*a);
  for (const PutResult& r : PutLayoutPages(*ca, TestLayout(), pages)) {
    ASSERT_OK(r);
  }
  const std::string address = PeerAddress("node-a");
  ASSERT_FALSE(address.empty());
  FetchRequest fetch{.ns = "default",
                     .fingerprint = TestLayout().Fingerprint(),
                     .keys = LayoutKeys(TestLayout(), pages[0])};

  auto secret = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::vector<std::byte> out;
    char ch;
    while (in.get(ch)) out.push_back(static_cast<std::byte>(ch));
    return out;
  };
  auto open = [&](std::vector<std::byte> key) {
    transport::peer::PeerTransportOptions o;
    o.listen_address = "127.0.0.1:0";
    o.cluster_name = "test";
    o.node_id = "tester";
    o.cluster_secret = std::move(key);
    o.ucx_settings.push_back({"TLS", "tcp"});
    auto t = transport::peer::PeerTransport::Open(o, nullptr);
    EXPECT_OK(t);
    return t.ok() ? std::move(t).value() : nullptr;
  };

  // A wrong secret: the handshake fails, nothing is served.
  {
    auto intruder = open(secret(WriteSecret("wrong.key")));
    ASSERT_TRUE(intruder);
    auto reply =
        intruder->CallAndWait(address, kFetchOpcode, EncodeFetchRequest(fetch));
    EXPECT_EQ(reply.status().code(), StatusCode::kPermissionDenied)
        << reply.status().ToString();
  }
  const auto after_intruder = PeerStats(*ca);
  EXPECT_EQ(after_intruder["served_segments"], 0) << after_intruder.dump();
  EXPECT_EQ(after_intruder["served_bytes"], 0);

  auto member = open(secret(secret_file_));
  ASSERT_TRUE(member);
  // Another layout: refused.
  FetchRequest other_layout = fetch;
  other_layout.fingerprint ^= 1;
  auto refused = member->CallAndWait(address, kFetchOpcode,
                                     EncodeFetchRequest(other_layout));
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument)
      << refused.status().ToString();
  // A namespace the holder does not share (or have): refused.
  FetchRequest other_ns = fetch;
  other_ns.ns = "private";
  auto unshared =
      member->CallAndWait(address, kFetchOpcode, EncodeFetchRequest(other_ns));
  EXPECT_EQ(unshared.status().code(), StatusCode::kPermissionDenied)
      << unshared.status().ToString();
  EXPECT_EQ(PeerStats(*ca)["served_segments"], 0);

  // A member asking properly gets every segment, checksummed; one page it
  // does not hold is answered "absent" (length 0), not refused.
  fetch.keys.push_back({Pages(1, 9999)[0], 0, 0});
  auto served =
      member->CallAndWait(address, kFetchOpcode, EncodeFetchRequest(fetch));
  ASSERT_OK(served);
  auto head = DecodeFetchReplyHead(served->head, fetch.keys.size());
  ASSERT_OK(head);
  size_t at = 0;
  for (size_t i = 0; i + 1 < fetch.keys.size(); ++i) {
    const SegmentKey& k = fetch.keys[i];
    const uint32_t bytes = (*head)[i].bytes;
    ASSERT_EQ(bytes, TestLayout().SegmentBytes(k.layer, k.part));
    const std::span<const std::byte> got(served->data.data() + at, bytes);
    EXPECT_TRUE(std::ranges::equal(got, SegmentBytes(k, bytes)))
        << k.ToString();
    EXPECT_EQ((*head)[i].checksum, SegmentChecksum(got));
    at += bytes;
  }
  EXPECT_EQ((*head).back().state,
            daemon::cluster::FetchedSegment::State::kAbsent);
  EXPECT_EQ(at, served->data.size());
  EXPECT_EQ(PeerStats(*ca)["served_segments"], 6);
}

TEST_F(ClusterTest, UnsharedNamespacesAndOtherLayoutsNeverReachPeers) {
  auto a = StartNode({"node-a"});
  auto b = StartNode({"node-b", /*shared=*/false});
  auto c = StartNode({"node-c"});
  ASSERT_TRUE(a && b && c);
  const auto pages = Pages(4);
  auto ca = Open(*a);
  for (const PutResult& r : PutLayoutPages(*ca, TestLayout(), pages)) {
    ASSERT_OK(r);
  }
  // C, shared with A's layout, sees them: they are published.
  auto cc = Open(*c);
  ASSERT_TRUE(MatchReaches(*cc, pages, 4));
  // B does not share the namespace: local only.
  auto cb = Open(*b);
  auto m = cb->Match(pages, {.prefetch = false});
  ASSERT_OK(m);
  EXPECT_EQ(m->leading_pages, 0u);
  for (const Status& s : GetPages(*cb, pages)) {
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  }
  // A node of another layout (a restarted C) finds nothing either.
  cc.reset();
  EXPECT_EQ(c->Stop(SIGTERM), 0);
  c = StartNode({"node-c"});
  ASSERT_TRUE(c);
  cc = Open(*c, OnePartLayout());
  auto other = cc->Match(pages, {.prefetch = false});
  ASSERT_OK(other);
  EXPECT_EQ(other->leading_pages, 0u);
  EXPECT_EQ(PeerStats(*ca)["served_segments"], 0);
}

// SIGTERM of a node serving a fetch, then of a node fetching: both stop
// cleanly (exit status 0; under ASan, no use of freed memory at shutdown)
// whatever point the transfers had reached, and a read either returns the
// stored bytes or fails; never other bytes.
TEST_F(ClusterTest, NodesStopCleanlyWithFetchesInFlight) {
  auto a = StartNode({"node-a"});
  auto b = StartNode({"node-b"});
  auto c = StartNode({"node-c"});
  ASSERT_TRUE(a && b && c);
  const auto first = Pages(16);
  const auto second = Pages(16, 1 << 20);
  auto ca = Open(*a);
  auto cc = Open(*c);
  for (const PutResult& r : PutLayoutPages(*ca, TestLayout(), first)) {
    ASSERT_OK(r);
  }
  for (const PutResult& r : PutLayoutPages(*cc, TestLayout(), second)) {
    ASSERT_OK(r);
  }
  ASSERT_TRUE(PollUntil([&] { return AllHeldBy(first, "node-a"); }));
  ASSERT_TRUE(PollUntil([&] { return AllHeldBy(second, "node-c"); }));
  auto cb = Open(*b);
  auto no_wrong_bytes = [](const std::vector<Status>& got) {
    for (const Status& s : got) {
      EXPECT_NE(s.code(), StatusCode::kCorruption) << s.ToString();
    }
  };

  // The holder stops while B reads 5 MB from it.
  std::vector<Status> got;
  std::thread reader([&] { got = GetPages(*cb, first); });
  ca.reset();
  EXPECT_EQ(a->Stop(SIGTERM), 0) << a->log();
  reader.join();
  no_wrong_bytes(got);

  // The reader stops while it reads 5 MB from C.
  auto cb2 = Open(*b);
  std::thread stopping_reader([&] { got = GetPages(*cb2, second); });
  EXPECT_EQ(b->Stop(SIGTERM), 0) << b->log();
  stopping_reader.join();
  no_wrong_bytes(got);
  // C, which served, is unaffected.
  for (const Status& s : GetPages(*cc, second)) EXPECT_OK(s);
}

TEST_F(ClusterTest, AKilledHolderIsAPerSegmentErrorWithinHalfASecond) {
  auto a = StartNode({"node-a"});
  auto b = StartNode({"node-b"});
  ASSERT_TRUE(a && b);
  const auto pages = Pages(4);
  auto ca = Open(*a);
  for (const PutResult& r : PutLayoutPages(*ca, TestLayout(), pages)) {
    ASSERT_OK(r);
  }
  auto cb = Open(*b);
  ASSERT_TRUE(MatchReaches(*cb, pages, 4));
  // A connection to A exists and works (one page fetched).
  for (const Status& s : GetPages(*cb, {pages[0]})) ASSERT_OK(s);

  ca.reset();
  a->Stop(SIGKILL);
  const auto t0 = Clock::now();
  const std::vector<Status> got = GetPages(*cb, {pages[1], pages[2]});
  const auto took = Clock::now() - t0;
  for (const Status& s : got) {
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.code(), StatusCode::kCorruption) << s.ToString();
  }
  EXPECT_LT(took, std::chrono::milliseconds(500));
  // The daemon itself is fine: its own page reads back.
  for (const Status& s : GetPages(*cb, {pages[0]})) EXPECT_OK(s);
}

TEST_F(ClusterTest, AHungHolderFailsItsFetchesByTheDeadline) {
  auto a = StartNode({"node-a"});
  auto b = StartNode({"node-b"});
  ASSERT_TRUE(a && b);
  const auto pages = Pages(4);
  auto ca = Open(*a);
  for (const PutResult& r : PutLayoutPages(*ca, TestLayout(), pages)) {
    ASSERT_OK(r);
  }
  auto cb = Open(*b);
  ASSERT_TRUE(MatchReaches(*cb, pages, 4));
  for (const Status& s : GetPages(*cb, {pages[0]})) ASSERT_OK(s);

  ASSERT_EQ(::kill(a->pid(), SIGSTOP), 0);
  const auto t0 = Clock::now();
  const std::vector<Status> got = GetPages(*cb, {pages[1]});
  const auto took = Clock::now() - t0;
  ::kill(a->pid(), SIGCONT);
  for (const Status& s : got) EXPECT_FALSE(s.ok());
  // fetch_deadline_ms = 1000, plus the transport's stalled-receive grace.
  EXPECT_LT(took, std::chrono::milliseconds(1500));
  EXPECT_GE(PeerStats(*cb)["errors_timeout"], 1);
}

TEST_F(ClusterTest, ADirectoryOutageIsLocalOnlyAndARestartRepublishes) {
  auto a = StartNode({"node-a"});
  // A budget below the 200 ms the outage's Match is allowed, yet ample for
  // a live directory on a loaded test machine (the Get at the end).
  auto b = StartNode({.id = "node-b", .lookup_budget_us = 100000});
  ASSERT_TRUE(a && b);
  const auto pages = Pages(8);
  auto ca = Open(*a);
  for (const PutResult& r : PutLayoutPages(*ca, TestLayout(), pages)) {
    ASSERT_OK(r);
  }
  auto cb = Open(*b);
  ASSERT_TRUE(PollUntil([&] { return AllHeldBy(pages, "node-a"); }));
  // B has looked up the first half: its holders are cached for a second.
  const std::vector<PageHash> seen(pages.begin(), pages.begin() + 4);
  const std::vector<PageHash> unseen(pages.begin() + 4, pages.end());
  ASSERT_TRUE(MatchReaches(*cb, seen, 4));

  redis_.Kill();
  const auto t0 = Clock::now();
  auto m = cb->Match(unseen, {.prefetch = false});
  const auto took = Clock::now() - t0;
  ASSERT_OK(m);
  EXPECT_EQ(m->leading_pages, 0u) << "no directory: local only";
  EXPECT_LT(took, std::chrono::milliseconds(200));
  // Pages looked up a moment ago still come from the cached hints.
  auto cached = cb->Match(pages, {.prefetch = false});
  ASSERT_OK(cached);
  EXPECT_EQ(cached->leading_pages, 4u);
  // A's own pages are unaffected.
  auto own = ca->Match(pages, {.prefetch = false});
  ASSERT_OK(own);
  EXPECT_EQ(own->leading_pages, 8u);

  // Back, empty: the nodes register again and A re-publishes what it holds.
  ASSERT_OK(redis_.Start());
  ASSERT_TRUE(PollUntil([&] { return AllHeldBy(pages, "node-a"); }))
      << a->log();
  ASSERT_TRUE(MatchReaches(*cb, pages, 8));
  for (const Status& s : GetPages(*cb, pages)) EXPECT_OK(s);
}

TEST_F(ClusterTest, PagesAHolderEvictedAreMissesNeverWrongBytes) {
  auto a = StartNode({"node-a", true, "4MiB"});
  auto b = StartNode({"node-b"});
  ASSERT_TRUE(a && b);
  const auto first = Pages(4);
  auto ca = Open(*a);
  for (const PutResult& r : PutLayoutPages(*ca, TestLayout(), first)) {
    ASSERT_OK(r);
  }
  auto cb = Open(*b);
  ASSERT_TRUE(MatchReaches(*cb, first, 4));
  // 24 more pages (7.5 MB) through A's 4 MiB: the first ones are evicted.
  for (const PutResult& r :
       PutLayoutPages(*ca, TestLayout(), Pages(24, 1 << 20))) {
    ASSERT_OK(r);
  }
  size_t misses = 0;
  for (const Status& s : GetPages(*cb, first)) {
    if (!s.ok()) {
      EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
      ++misses;
    }
  }
  EXPECT_GT(misses, 0u);
  // The directory learns it (A's sweep, or B's repair of a stale entry).
  EXPECT_TRUE(MatchReaches(*cb, first, 0));
}

TEST_F(ClusterTest, AStaleEntryIsReadAtThePagesNextHolder) {
  auto a = StartNode({"node-a"});
  auto b = StartNode({"node-b"});
  auto c = StartNode({"node-c"});
  ASSERT_TRUE(a && b && c);
  auto ca = Open(*a);  // A knows the layout: it answers "absent", not refused
  // Pages whose holder list [node-a, node-b] is tried from node-a first
  // (PeerTier picks the first by the page's hash).
  std::vector<PageHash> pages;
  for (const PageHash& page : Pages(64)) {
    if (std::hash<PageHash>()(page) % 2 == 0 && pages.size() < 4) {
      pages.push_back(page);
    }
  }
  ASSERT_EQ(pages.size(), 4u);
  auto cb = Open(*b);
  for (const PutResult& r : PutLayoutPages(*cb, TestLayout(), pages)) {
    ASSERT_OK(r);
  }
  ASSERT_TRUE(PollUntil([&] { return AllHeldBy(pages, "node-b"); }));
  // A stale entry: the directory names A, which never held the pages (as
  // after an eviction its sweep has not unpublished yet).
  for (const PageHash& page : pages) {
    ASSERT_OK(redis_.Command({"APPEND", PageKey(page), "node-a,"}));
  }
  auto cc = Open(*c);
  ASSERT_TRUE(MatchReaches(*cc, pages, 4));
  for (const Status& s : GetPages(*cc, pages)) EXPECT_OK(s);
  const auto stats = PeerStats(*cc);
  EXPECT_EQ(stats["fetch_segments"], 24) << stats.dump();
  EXPECT_GE(stats["errors_stale"], 1) << stats.dump();
  EXPECT_EQ(stats["failovers"], stats["errors_stale"]) << stats.dump();
  EXPECT_GE(PeerStats(*ca)["served_absent"], 1);
}

// B Loads A's pages into its registered pools: the peer tier fetches them
// layer by layer, so WaitLayer(l) returns once layer l arrived while A
// still holds the FETCHes of the layers after it
// (TIERKV_TEST_STALL_PEER_SERVE), and every byte lands exact.
TEST_F(ClusterTest, LoadsOfPeerPagesCompleteLayerByLayer) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  constexpr uint16_t kHeldLayer = 2;  // of 4
  const auto pages = Pages(8, 3000);
  PeerServeStallFifo fifo(dir_.File("serve.fifo"));
  auto a = StartNode(
      {.id = "node-a",
       .env = {fifo.Env(FetchesPerLayer(pages.size()) * kHeldLayer + 1)}});
  auto b = StartNode(
      {.id = "node-b", .fetch_deadline_ms = 30000, .one_load_lane = true});
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->log().find("TEST-ONLY FAULT INJECTION"), std::string::npos)
      << a->log();
  auto ca = Open(*a);
  for (const PutResult& r : PutLayoutPages(*ca, TestLayout(), pages)) {
    ASSERT_OK(r);
  }
  auto cb = Open(*b);
  ASSERT_TRUE(MatchReaches(*cb, pages, 8));
  EnginePools pools(TestLayout(), 8);
  ASSERT_OK(pools.RegisterAll(*cb));
  const std::vector<uint32_t> slots = {7, 6, 5, 4, 3, 2, 1, 0};
  auto load = cb->Load(pages, slots);
  ASSERT_OK(load);

  ASSERT_TRUE(fifo.AwaitHeld()) << a->log();
  auto early = load->WaitLayer(kHeldLayer - 1);
  ASSERT_OK(early);
  for (const Status& s : *early) EXPECT_OK(s);
  EXPECT_EQ(load->LayersDone(), kHeldLayer);
  for (size_t i = 0; i < pages.size(); ++i) {
    EXPECT_TRUE(pools.Holds(TestLayout(), pages[i], slots[i], kHeldLayer));
  }

  fifo.Release();
  auto all = load->Wait();
  ASSERT_OK(all);
  for (const Status& s : *all) EXPECT_OK(s);
  for (size_t i = 0; i < pages.size(); ++i) {
    EXPECT_TRUE(pools.Holds(TestLayout(), pages[i], slots[i], 4));
  }
  // At least once: the engine then promotes what a Load read from below
  // DRAM by reading it again, in the background (PromoteLoaded).
  const auto fetched = PeerStats(*cb);
  EXPECT_GE(fetched["fetch_segments"], 48) << fetched.dump();
  EXPECT_EQ(fetched["errors_checksum"], 0);
  EXPECT_EQ(fetched["errors_timeout"], 0);
}

// The same Load, with A killed while it holds the FETCHes of layers 2 and
// 3: the layers that arrived stay exact, the rest fail per page at once
// (a reset, long before B's fetch deadline), never with wrong bytes.
TEST_F(ClusterTest, AHolderKilledMidLoadFailsTheLayersItHadNotSent) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  constexpr uint16_t kHeldLayer = 2;  // of 4
  const auto pages = Pages(8, 4000);
  PeerServeStallFifo fifo(dir_.File("serve.fifo"));
  auto a = StartNode(
      {.id = "node-a",
       .env = {fifo.Env(FetchesPerLayer(pages.size()) * kHeldLayer + 1)}});
  auto b = StartNode(
      {.id = "node-b", .fetch_deadline_ms = 30000, .one_load_lane = true});
  ASSERT_TRUE(a && b);
  auto ca = Open(*a);
  for (const PutResult& r : PutLayoutPages(*ca, TestLayout(), pages)) {
    ASSERT_OK(r);
  }
  auto cb = Open(*b);
  ASSERT_TRUE(MatchReaches(*cb, pages, 8));
  EnginePools pools(TestLayout(), 8);
  ASSERT_OK(pools.RegisterAll(*cb));
  const std::vector<uint32_t> slots = {0, 1, 2, 3, 4, 5, 6, 7};
  auto load = cb->Load(pages, slots);
  ASSERT_OK(load);
  ASSERT_TRUE(fifo.AwaitHeld()) << a->log();
  auto early = load->WaitLayer(kHeldLayer - 1);
  ASSERT_OK(early);
  for (const Status& s : *early) EXPECT_OK(s);

  ca.reset();
  a->Stop(SIGKILL);
  const auto t0 = Clock::now();
  auto rest = load->WaitLayer(kHeldLayer);
  const auto took = Clock::now() - t0;
  ASSERT_OK(rest);
  for (const Status& s : *rest) {
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.code(), StatusCode::kCorruption) << s.ToString();
  }
  EXPECT_LT(took, std::chrono::seconds(2));
  auto all = load->Wait();
  ASSERT_OK(all);
  for (const Status& s : *all) EXPECT_FALSE(s.ok());
  for (size_t i = 0; i < pages.size(); ++i) {
    EXPECT_TRUE(pools.Holds(TestLayout(), pages[i], slots[i], kHeldLayer));
  }
  const auto stats = PeerStats(*cb);
  EXPECT_EQ(stats["errors_timeout"], 0) << stats.dump();
  EXPECT_GE(stats["errors_unavailable"], 1) << stats.dump();
  EXPECT_EQ(stats["fetch_segments"], 8 * 3) << stats.dump();  // layers 0, 1
}

// A holder stopped (SIGTERM) while it holds a peer's FETCH exits at once,
// cleanly, and the requester's segments fail then, not at its deadline: the
// held request never blocks the transport or the shutdown.
TEST_F(ClusterTest, AHolderStoppedWhileHoldingAFetchExitsCleanlyAtOnce) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  PeerServeStallFifo fifo(dir_.File("serve.fifo"));
  auto a = StartNode({.id = "node-a", .env = {fifo.Env(1)}});
  auto b = StartNode({.id = "node-b", .fetch_deadline_ms = 30000});
  ASSERT_TRUE(a && b);
  const auto pages = Pages(2, 5000);
  auto ca = Open(*a);
  for (const PutResult& r : PutLayoutPages(*ca, TestLayout(), pages)) {
    ASSERT_OK(r);
  }
  auto cb = Open(*b);
  ASSERT_TRUE(MatchReaches(*cb, pages, 2));
  auto got =
      std::async(std::launch::async, [&] { return GetPages(*cb, pages); });
  ASSERT_TRUE(fifo.AwaitHeld()) << a->log();

  ca.reset();
  const auto t0 = Clock::now();
  EXPECT_EQ(a->Stop(SIGTERM), 0) << a->log();
  const std::vector<Status> statuses = got.get();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  for (const Status& s : statuses) {
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.code(), StatusCode::kCorruption) << s.ToString();
  }
  EXPECT_EQ(PeerStats(*cb)["errors_timeout"], 0);
}

}  // namespace
}  // namespace tierkv::testing
