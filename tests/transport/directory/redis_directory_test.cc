// Tests transport/directory/redis_directory.cc against a real redis-server
// (shared/reference/scaleout.md §9 item 1): publish, prefix lookup and
// unpublish across nodes, liveness by TTL, credentials (password file,
// ACL user), a hung, absent or restarted server, the bounded publish
// queue, and lookups beside a publish backlog.
//
// Waiting: a node's liveness and a restarted server are owned by Redis's
// clock and process, so those tests poll the condition under a generous
// deadline (WaitFor); nothing sleeps to order threads.
#include "transport/directory/redis_directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/sync_points.h"
#include "tests/transport/directory/redis_server.h"

namespace tierkv::transport {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::RedisServer;

// Polls `condition` until it holds or `timeout` passes; returns whether it
// held.
bool WaitFor(const std::function<bool()>& condition,
             std::chrono::milliseconds timeout = 20s) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return condition();
}

std::vector<PageHash> Pages(uint64_t chain, size_t count) {
  std::vector<PageHash> pages;
  for (size_t i = 0; i < count; ++i) pages.push_back(PageHash{i + 1, chain});
  return pages;
}

// A generous deadline for calls that are not about the budget (the VM is
// loaded by others).
Clock::time_point Generous() { return Clock::now() + 5s; }

const DirectoryNamespace kNs{"llama-70b", 0x1234abcd5678ef00ull};

class RedisDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!RedisServer::Available()) {
      GTEST_SKIP() << "no redis-server at " << RedisServer::Binary();
    }
    ASSERT_OK(redis_.Start());
  }

  // Short timings, so that liveness and reconnects happen within a test.
  RedisDirectory::Options NodeOptions(const std::string& node_id) {
    RedisDirectory::Options options;
    options.url = redis_.url();
    options.password_file = redis_.password_file();
    options.cluster = "test";
    options.node_id = node_id;
    options.address = "127.0.0.1:4" + std::to_string(node_id.size());
    options.liveness_ttl = 1000ms;
    options.heartbeat_period = 250ms;
    options.live_refresh_period = 100ms;
    options.lookup_budget = 5s;  // tests of the budget pass their own
    options.io_timeout = 500ms;
    options.min_backoff = 20ms;
    options.max_backoff = 200ms;
    return options;
  }

  std::unique_ptr<RedisDirectory> Open(const RedisDirectory::Options& options) {
    Result<std::unique_ptr<RedisDirectory>> directory =
        RedisDirectory::Open(options);
    EXPECT_OK(directory);
    return directory.ok() ? std::move(*directory) : nullptr;
  }

  // `from` publishes `pages` of kNs and waits until they are written; `to`
  // then reloads its live set, so that its Lookup sees them.
  static void PublishAndSee(RedisDirectory& from, RedisDirectory& to,
                            std::span<const PageHash> pages) {
    ASSERT_OK(from.Publish(kNs, pages));
    ASSERT_OK(from.Flush(Generous()));
    ASSERT_OK(to.RefreshLiveNodes(Generous()));
  }

  // The holders of each page of a lookup, as node id lists.
  static std::vector<std::vector<std::string>> Holders(
      const Result<std::vector<PageHolders>>& result) {
    std::vector<std::vector<std::string>> out;
    if (!result.ok()) return out;
    for (const PageHolders& page : *result) out.push_back(page.node_ids);
    return out;
  }

  RedisServer redis_;  // declared first: outlives the directories
};

using Ids = std::vector<std::vector<std::string>>;

// A node's re-publish callback: counts its runs and publishes `pages`.
class RepublishProbe {
 public:
  explicit RepublishProbe(std::vector<PageHash> pages)
      : pages_(std::move(pages)) {}
  std::function<void(DirectoryRepublisher&)> Callback() {
    return [this](DirectoryRepublisher& sink) {
      const Status published = sink.Publish(kNs, pages_);
      MutexLock lock(&mu_);
      last_ = published;
      ++runs_;
      cv_.SignalAll();
    };
  }
  // Waits until the callback ran `runs` times; false after `timeout`.
  bool WaitForRuns(int runs, std::chrono::milliseconds timeout = 20s) {
    const auto deadline = Clock::now() + timeout;
    MutexLock lock(&mu_);
    while (runs_ < runs) {
      if (!cv_.WaitUntil(&mu_, deadline) && runs_ < runs) return false;
    }
    return true;
  }
  int runs() {
    MutexLock lock(&mu_);
    return runs_;
  }

 private:
  const std::vector<PageHash> pages_;
  Mutex mu_;
  CondVar cv_;
  int runs_ GUARDED_BY(mu_) = 0;
  Status last_ GUARDED_BY(mu_);
};

TEST_F(RedisDirectoryTest, PublishedPagesAreFoundByOtherLiveNodes) {
  auto a = Open(NodeOptions("node-a"));
  auto b = Open(NodeOptions("node-b"));
  ASSERT_TRUE(a && b);
  const auto pages = Pages(1, 4);
  ASSERT_NO_FATAL_FAILURE(PublishAndSee(*a, *b, pages));

  Result<std::vector<PageHolders>> found = b->Lookup(kNs, pages, Generous());
  ASSERT_OK(found);
  EXPECT_EQ(Holders(found), Ids(4, {"node-a"}));

  const DirectoryStats stats = a->GetStats();
  EXPECT_TRUE(stats.up);
  EXPECT_EQ(stats.published_pages, 4u);
  EXPECT_EQ(stats.queued_pages, 0u);
  EXPECT_GE(stats.heartbeats, 1u);
  const DirectoryStats b_stats = b->GetStats();
  EXPECT_EQ(b_stats.lookups, 1u);
  EXPECT_EQ(b_stats.lookup_pages, 4u);
  EXPECT_EQ(b_stats.lookup_hit_pages, 4u);
  EXPECT_GT(b_stats.last_lookup_latency.count(), 0);
}

TEST_F(RedisDirectoryTest, LookupStopsAtTheFirstPageNoLiveNodeHolds) {
  auto a = Open(NodeOptions("node-a"));
  auto b = Open(NodeOptions("node-b"));
  ASSERT_TRUE(a && b);
  const auto pages = Pages(2, 6);
  // Pages 0, 1, 3 and 4: page 2 is missing, so the prefix is 2 long.
  ASSERT_OK(a->Publish(kNs, std::span(pages).subspan(0, 2)));
  ASSERT_OK(a->Publish(kNs, std::span(pages).subspan(3, 2)));
  ASSERT_OK(a->Flush(Generous()));
  ASSERT_OK(b->RefreshLiveNodes(Generous()));

  EXPECT_EQ(Holders(b->Lookup(kNs, pages, Generous())), Ids(2, {"node-a"}));
  // The prefix ends even across lookup round trips.
  auto small_batches = NodeOptions("node-c");
  small_batches.lookup_batch_pages = 1;
  auto c = Open(small_batches);
  ASSERT_TRUE(c);
  EXPECT_EQ(Holders(c->Lookup(kNs, pages, Generous())), Ids(2, {"node-a"}));
  // A lookup starting at a missing page finds nothing.
  Result<std::vector<PageHolders>> none =
      b->Lookup(kNs, std::span(pages).subspan(2), Generous());
  ASSERT_OK(none);
  EXPECT_TRUE(none->empty());
}

TEST_F(RedisDirectoryTest, LookupLeavesOutTheAskingNode) {
  auto a = Open(NodeOptions("node-a"));
  auto b = Open(NodeOptions("node-b"));
  ASSERT_TRUE(a && b);
  const auto pages = Pages(3, 2);
  ASSERT_OK(a->Publish(kNs, pages));
  ASSERT_OK(a->Flush(Generous()));
  Result<std::vector<PageHolders>> own = a->Lookup(kNs, pages, Generous());
  ASSERT_OK(own);
  EXPECT_TRUE(own->empty()) << "a node's own pages are local, not peer hits";

  ASSERT_NO_FATAL_FAILURE(PublishAndSee(*b, *a, pages));
  ASSERT_OK(b->RefreshLiveNodes(Generous()));
  EXPECT_EQ(Holders(a->Lookup(kNs, pages, Generous())), Ids(2, {"node-b"}));
  EXPECT_EQ(Holders(b->Lookup(kNs, pages, Generous())), Ids(2, {"node-a"}));
}

TEST_F(RedisDirectoryTest, PagesHeldByTwoNodesListBothSorted) {
  auto b = Open(NodeOptions("node-b"));
  auto a = Open(NodeOptions("node-a"));
  auto c = Open(NodeOptions("node-c"));
  ASSERT_TRUE(a && b && c);
  const auto pages = Pages(4, 3);
  ASSERT_OK(b->Publish(kNs, pages));
  ASSERT_OK(a->Publish(kNs, pages));
  ASSERT_OK(a->Flush(Generous()));
  ASSERT_OK(b->Flush(Generous()));
  ASSERT_OK(c->RefreshLiveNodes(Generous()));
  EXPECT_EQ(Holders(c->Lookup(kNs, pages, Generous())),
            Ids(3, {"node-a", "node-b"}));
}

TEST_F(RedisDirectoryTest, UnpublishedPagesAreNoLongerFound) {
  auto a = Open(NodeOptions("node-a"));
  auto b = Open(NodeOptions("node-b"));
  ASSERT_TRUE(a && b);
  const auto pages = Pages(5, 3);
  ASSERT_OK(a->Publish(kNs, pages));
  ASSERT_OK(a->Unpublish(kNs, std::span(pages).subspan(1, 1)));
  ASSERT_OK(a->Flush(Generous()));
  ASSERT_OK(b->RefreshLiveNodes(Generous()));
  EXPECT_EQ(Holders(b->Lookup(kNs, pages, Generous())), Ids(1, {"node-a"}));
  EXPECT_EQ(a->GetStats().unpublished_pages, 1u);
  // The last holder leaving removes the page's key altogether.
  Result<RedisReply> exists = redis_.Command(
      {"EXISTS", "tkv:test:" + kNs.KeyComponent() + ":h:" + pages[1].ToHex()});
  ASSERT_OK(exists);
  EXPECT_EQ(exists->integer, 0);
}

TEST_F(RedisDirectoryTest, AStaleHolderCanBeForgottenByAnotherNode) {
  auto a = Open(NodeOptions("node-a"));
  auto b = Open(NodeOptions("node-b"));
  auto c = Open(NodeOptions("node-c"));
  ASSERT_TRUE(a && b && c);
  const auto pages = Pages(21, 3);
  ASSERT_OK(a->Publish(kNs, pages));
  ASSERT_OK(c->Publish(kNs, std::span(pages).subspan(1, 1)));
  ASSERT_OK(a->Flush(Generous()));
  ASSERT_OK(c->Flush(Generous()));
  ASSERT_OK(b->RefreshLiveNodes(Generous()));
  // node-a answered "absent" for page 1: node-b repairs the entry.
  ASSERT_OK(b->ForgetHolder(kNs, std::span(pages).subspan(1, 1), "node-a"));
  ASSERT_OK(b->Flush(Generous()));
  EXPECT_EQ(Holders(b->Lookup(kNs, pages, Generous())),
            (Ids{{"node-a"}, {"node-c"}, {"node-a"}}))
      << "only node-a's entry for page 1 is gone";
  EXPECT_EQ(b->GetStats().forgotten_holders, 1u);
  EXPECT_EQ(b->GetStats().unpublished_pages, 0u);
  EXPECT_EQ(b->ForgetHolder(kNs, pages, "not an id").code(),
            StatusCode::kInvalidArgument);
}

// Two nodes publishing the same pages at the same moment: each page's
// holder list is rewritten by both writers' scripts, which must not lose
// either id (a GET then SET from the client would).
TEST_F(RedisDirectoryTest, NodesPublishingTheSamePagesAtOnceAreAllHolders) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  auto small_batches = [&](const std::string& id) {
    auto options = NodeOptions(id);
    options.write_batch_pages = 64;
    options.write_script_pages = 8;
    return options;
  };
  auto a = Open(small_batches("node-a"));
  auto b = Open(small_batches("node-b"));
  auto c = Open(NodeOptions("node-c"));
  ASSERT_TRUE(a && b && c);
  const auto pages = Pages(40, 1024);

  // Both writers wait before their first batch until the other is there
  // too: their batches of the same pages then go out side by side.
  Mutex mu;
  CondVar cv;
  int arrived = 0;
  bool released = false;
  testing::ScopedSyncPoints sync;
  sync.SetCallback(RedisDirectory::kBeforeWriteBatch, [&](void*) {
    MutexLock lock(&mu);
    if (released) return;
    if (++arrived == 2) {
      released = true;
      cv.SignalAll();
      return;
    }
    const auto deadline = Clock::now() + 20s;
    while (!released) {
      if (!cv.WaitUntil(&mu, deadline) && !released) return;
    }
  });
  ASSERT_OK(a->Publish(kNs, pages));
  ASSERT_OK(b->Publish(kNs, pages));
  ASSERT_OK(a->Flush(Clock::now() + 30s));
  ASSERT_OK(b->Flush(Clock::now() + 30s));
  {
    MutexLock lock(&mu);
    EXPECT_TRUE(released) << "the writers did not meet";
  }
  ASSERT_OK(c->RefreshLiveNodes(Generous()));
  EXPECT_EQ(Holders(c->Lookup(kNs, pages, Clock::now() + 30s)),
            Ids(pages.size(), {"node-a", "node-b"}));
  EXPECT_EQ(a->GetStats().published_pages, pages.size());
  EXPECT_EQ(b->GetStats().published_pages, pages.size());
  EXPECT_EQ(a->GetStats().write_errors + b->GetStats().write_errors, 0u);
}

TEST_F(RedisDirectoryTest, UnpublishLeavesOtherHoldersAndTheLastDeletesTheKey) {
  auto a = Open(NodeOptions("node-a"));
  auto b = Open(NodeOptions("node-b"));
  auto c = Open(NodeOptions("node-c"));
  ASSERT_TRUE(a && b && c);
  const auto pages = Pages(41, 3);
  const auto key = [&](size_t i) {
    return "tkv:test:" + kNs.KeyComponent() + ":h:" + pages[i].ToHex();
  };
  ASSERT_OK(a->Publish(kNs, pages));
  ASSERT_OK(a->Flush(Generous()));
  ASSERT_OK(b->Publish(kNs, pages));
  ASSERT_OK(b->Flush(Generous()));
  ASSERT_OK(c->RefreshLiveNodes(Generous()));
  ASSERT_EQ(Holders(c->Lookup(kNs, pages, Generous())),
            Ids(3, {"node-a", "node-b"}));
  Result<RedisReply> both = redis_.Command({"GET", key(0)});
  ASSERT_OK(both);
  EXPECT_EQ(both->str, "node-a,node-b,") << "appended in publish order";

  ASSERT_OK(a->Unpublish(kNs, pages));
  ASSERT_OK(a->Flush(Generous()));
  EXPECT_EQ(Holders(c->Lookup(kNs, pages, Generous())), Ids(3, {"node-b"}));
  Result<RedisReply> left = redis_.Command({"GET", key(0)});
  ASSERT_OK(left);
  EXPECT_EQ(left->str, "node-b,");
  Result<RedisReply> ttl = redis_.Command({"TTL", key(0)});
  ASSERT_OK(ttl);
  EXPECT_GT(ttl->integer, 23 * 3600) << "a removal keeps the page's TTL";

  // The last holder leaving, by its own unpublish or by another node's
  // ForgetHolder, deletes the key.
  ASSERT_OK(b->Unpublish(kNs, std::span(pages).subspan(0, 2)));
  ASSERT_OK(b->Flush(Generous()));
  ASSERT_OK(c->ForgetHolder(kNs, std::span(pages).subspan(2, 1), "node-b"));
  ASSERT_OK(c->Flush(Generous()));
  for (size_t i = 0; i < pages.size(); ++i) {
    Result<RedisReply> exists = redis_.Command({"EXISTS", key(i)});
    ASSERT_OK(exists);
    EXPECT_EQ(exists->integer, 0) << "page " << i;
  }
  Result<std::vector<PageHolders>> none = c->Lookup(kNs, pages, Generous());
  ASSERT_OK(none);
  EXPECT_TRUE(none->empty());
  EXPECT_EQ(c->GetStats().forgotten_holders, 1u);
}

// An entry no node wrote (garbage bytes, a broken list, a key of another
// type) is no holder: the lookup's prefix ends there, nothing crashes, and
// a node's publish of the page replaces it while an unpublish leaves it.
// A well-formed list naming unknown nodes is kept and appended to.
TEST_F(RedisDirectoryTest, GarbageEntriesAreNoHolderAndAPublishRepairsThem) {
  auto a = Open(NodeOptions("node-a"));
  auto b = Open(NodeOptions("node-b"));
  ASSERT_TRUE(a && b);
  const std::vector<std::string> garbage = {
      std::string("\xff\x00\x01garbage\n", 11),
      "node-a",  // no separator after the id
      ",",
      "node-a,,",
      "",
      std::string(65, 'n') + ",",  // an id longer than 64 bytes
      "node-a,bad id,",
      "node-a;node-b;",
  };
  const auto pages = Pages(42, 1 + garbage.size() + 2);
  const auto key = [&](size_t i) {
    return "tkv:test:" + kNs.KeyComponent() + ":h:" + pages[i].ToHex();
  };
  ASSERT_NO_FATAL_FAILURE(
      PublishAndSee(*a, *b, std::span(pages).subspan(0, 1)));
  for (size_t g = 0; g < garbage.size(); ++g) {
    ASSERT_OK(redis_.Command({"SET", key(1 + g), garbage[g]}));
  }
  const size_t set_page = 1 + garbage.size();  // a SET, as version 1 wrote
  ASSERT_OK(redis_.Command({"SADD", key(set_page), "node-a"}));
  const size_t foreign_page = set_page + 1;
  ASSERT_OK(redis_.Command({"SET", key(foreign_page), "ghost,"}));

  for (size_t i = 1; i < pages.size(); ++i) {
    const std::vector<PageHash> asked = {pages[0], pages[i]};
    EXPECT_EQ(Holders(b->Lookup(kNs, asked, Generous())), Ids(1, {"node-a"}))
        << "page " << i;
  }
  EXPECT_EQ(b->GetStats().lookup_malformed_pages, garbage.size())
      << "the SET reads as nil (no entry), ghost is no live node";

  const auto rest = std::span(pages).subspan(1);
  ASSERT_OK(a->Unpublish(kNs, rest));
  ASSERT_OK(a->Flush(Generous()));
  for (size_t g = 0; g < garbage.size(); ++g) {
    Result<RedisReply> value = redis_.Command({"GET", key(1 + g)});
    ASSERT_OK(value);
    EXPECT_EQ(value->str, garbage[g]) << "an unpublish leaves garbage alone";
  }
  ASSERT_OK(a->Publish(kNs, rest));
  ASSERT_OK(a->Flush(Generous()));
  EXPECT_EQ(a->GetStats().write_errors, 0u);
  EXPECT_EQ(Holders(b->Lookup(kNs, pages, Generous())),
            Ids(pages.size(), {"node-a"}));
  for (size_t i = 1; i < pages.size(); ++i) {
    Result<RedisReply> value = redis_.Command({"GET", key(i)});
    ASSERT_OK(value);
    EXPECT_EQ(value->str, i == foreign_page ? "ghost,node-a," : "node-a,")
        << "page " << i;
  }
}

// The server's script cache can be emptied under a node (SCRIPT FLUSH; a
// restart): the writer loads its script again and nothing is lost.
TEST_F(RedisDirectoryTest, WritesSurviveAnEmptiedScriptCache) {
  auto options = NodeOptions("node-a");
  options.write_script_pages = 4;  // several calls per round trip
  auto a = Open(options);
  auto b = Open(NodeOptions("node-b"));
  ASSERT_TRUE(a && b);
  const auto cached_scripts = [&] {
    Result<RedisReply> info = redis_.Command({"INFO", "memory"});
    EXPECT_OK(info);
    const std::string field = "number_of_cached_scripts:";
    const size_t at = info.ok() ? info->str.find(field) : std::string::npos;
    return at == std::string::npos
               ? -1
               : std::atoi(info->str.c_str() + at + field.size());
  };
  EXPECT_EQ(cached_scripts(), 1) << "loaded by Open";
  const auto pages = Pages(43, 40);
  ASSERT_NO_FATAL_FAILURE(
      PublishAndSee(*a, *b, std::span(pages).subspan(0, 20)));

  ASSERT_OK(redis_.Command({"SCRIPT", "FLUSH"}));
  ASSERT_EQ(cached_scripts(), 0);
  // One batch: removals of written pages, then adds of new ones.
  ASSERT_OK(a->Unpublish(kNs, std::span(pages).subspan(10, 10)));
  ASSERT_OK(a->Publish(kNs, std::span(pages).subspan(20, 20)));
  ASSERT_OK(a->Flush(Generous()));
  EXPECT_EQ(cached_scripts(), 1) << "loaded again";
  const DirectoryStats stats = a->GetStats();
  EXPECT_EQ(stats.write_errors, 0u);
  EXPECT_EQ(stats.published_pages, 40u);
  EXPECT_EQ(stats.unpublished_pages, 10u);
  EXPECT_EQ(Holders(b->Lookup(kNs, pages, Generous())), Ids(10, {"node-a"}));
  EXPECT_EQ(Holders(b->Lookup(kNs, std::span(pages).subspan(20), Generous())),
            Ids(20, {"node-a"}));
}

TEST(RedisDirectoryParseTest, HolderListsParseAndGarbageIsRefused) {
  Result<std::vector<std::string>> two =
      RedisDirectory::ParseHolderList("node-b,node_a.1,");
  ASSERT_OK(two);
  EXPECT_EQ(*two, (std::vector<std::string>{"node-b", "node_a.1"}));
  for (const std::string& bad :
       {std::string(), std::string(","), std::string("a"), std::string("a,,b,"),
        std::string("a b,"), std::string(65, 'x') + ",", std::string("a\0,", 3),
        std::string("\xff,")}) {
    EXPECT_EQ(RedisDirectory::ParseHolderList(bad).status().code(),
              StatusCode::kCorruption)
        << bad;
  }
  EXPECT_EQ(RedisDirectory::PageKeyPrefix("prod", kNs),
            "tkv:prod:llama-70b@1234abcd5678ef00:h:");
}

TEST_F(RedisDirectoryTest, NamespacesAndLayoutFingerprintsDoNotShare) {
  auto a = Open(NodeOptions("node-a"));
  auto b = Open(NodeOptions("node-b"));
  ASSERT_TRUE(a && b);
  const auto pages = Pages(6, 2);
  ASSERT_NO_FATAL_FAILURE(PublishAndSee(*a, *b, pages));
  DirectoryNamespace other_layout = kNs;
  other_layout.layout_fingerprint ^= 1;
  DirectoryNamespace other_name = kNs;
  other_name.name = "llama-8b";
  for (const DirectoryNamespace& ns : {other_layout, other_name}) {
    Result<std::vector<PageHolders>> found = b->Lookup(ns, pages, Generous());
    ASSERT_OK(found);
    EXPECT_TRUE(found->empty()) << ns.KeyComponent();
  }
  EXPECT_EQ(b->Lookup(DirectoryNamespace{"", 1}, pages).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Publish(DirectoryNamespace{"", 1}, pages).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(RedisDirectoryTest, RegistrationFollowsTheSchema) {
  auto options = NodeOptions("node-a");
  options.address = "127.0.0.11:40123";
  options.epoch = 77;
  auto a = Open(options);
  ASSERT_TRUE(a);
  ASSERT_OK(a->Publish(kNs, Pages(7, 1)));
  ASSERT_OK(a->Flush(Generous()));

  Result<RedisReply> addr =
      redis_.Command({"HGET", "tkv:test:node:node-a", "addr"});
  ASSERT_OK(addr);
  EXPECT_EQ(addr->str, "127.0.0.11:40123");
  Result<RedisReply> version =
      redis_.Command({"HGET", "tkv:test:node:node-a", "version"});
  ASSERT_OK(version);
  EXPECT_EQ(version->str, "2") << "page entries are holder lists under :h:";
  Result<RedisReply> ttl = redis_.Command({"PTTL", "tkv:test:node:node-a"});
  ASSERT_OK(ttl);
  EXPECT_GT(ttl->integer, 0);
  EXPECT_LE(ttl->integer, 1000);
  const std::string page_key =
      "tkv:test:llama-70b@1234abcd5678ef00:h:" + Pages(7, 1)[0].ToHex();
  EXPECT_EQ(page_key, RedisDirectory::PageKeyPrefix("test", kNs) +
                          Pages(7, 1)[0].ToHex());
  Result<RedisReply> holders = redis_.Command({"GET", page_key});
  ASSERT_OK(holders);
  EXPECT_EQ(holders->type, RedisReply::Type::kString);
  EXPECT_EQ(holders->str, "node-a,") << "each id followed by ','";
  Result<RedisReply> page_ttl = redis_.Command({"TTL", page_key});
  ASSERT_OK(page_ttl);
  EXPECT_GT(page_ttl->integer, 23 * 3600) << "EXPIRE page_ttl on publish";
  Result<RedisReply> epoch = redis_.Command({"GET", "tkv:test:dir_epoch"});
  ASSERT_OK(epoch);
  EXPECT_EQ(epoch->str.size(), 32u);
}

TEST_F(RedisDirectoryTest, LiveNodesListAddressesAndEpochs) {
  auto options = NodeOptions("node-a");
  options.address = "127.0.0.11:40123";
  options.epoch = 77;
  auto a = Open(options);
  auto b = Open(NodeOptions("node-b"));
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->self().epoch, 77u);
  EXPECT_NE(b->self().epoch, 0u) << "epoch 0 picks a random one";
  ASSERT_OK(b->RefreshLiveNodes(Generous()));
  const std::vector<DirectoryNode> live = b->LiveNodes();
  ASSERT_EQ(live.size(), 2u);
  EXPECT_EQ(live[0], (DirectoryNode{"node-a", "127.0.0.11:40123", 77}));
  EXPECT_EQ(live[1], b->self());
  EXPECT_EQ(b->GetStats().live_nodes, 2u);
}

TEST_F(RedisDirectoryTest, ClosingANodeRemovesItsRegistrationAtOnce) {
  auto a = Open(NodeOptions("node-a"));
  auto b = Open(NodeOptions("node-b"));
  ASSERT_TRUE(a && b);
  const auto pages = Pages(8, 2);
  ASSERT_OK(a->Publish(kNs, pages));
  ASSERT_OK(a->Flush(Generous()));
  a.reset();
  ASSERT_OK(b->RefreshLiveNodes(Generous()));
  ASSERT_EQ(b->LiveNodes().size(), 1u);
  Result<std::vector<PageHolders>> found = b->Lookup(kNs, pages, Generous());
  ASSERT_OK(found);
  EXPECT_TRUE(found->empty()) << "a departed node's pages are not offered";
}

TEST_F(RedisDirectoryTest, ANodeWhoseLivenessExpiresIsNoLongerAHolder) {
  auto crashing = NodeOptions("node-a");
  crashing.deregister_on_close = false;  // plays a crash: no goodbye
  auto a = Open(crashing);
  auto b = Open(NodeOptions("node-b"));
  ASSERT_TRUE(a && b);
  const auto pages = Pages(9, 2);
  ASSERT_NO_FATAL_FAILURE(PublishAndSee(*a, *b, pages));
  ASSERT_EQ(Holders(b->Lookup(kNs, pages, Generous())), Ids(2, {"node-a"}));

  const auto crashed_at = Clock::now();
  a.reset();  // heartbeats stop; the registration expires after 1 s
  EXPECT_TRUE(WaitFor([&] {
    Result<std::vector<PageHolders>> found = b->Lookup(kNs, pages, Generous());
    return found.ok() && found->empty();
  })) << "node-a still listed after its liveness TTL";
  EXPECT_GE(Clock::now() - crashed_at, 500ms)
      << "dropped before its TTL could have run out";
  // Its page entries remain (they age out with page_ttl): only liveness
  // filtered them.
  Result<RedisReply> holders = redis_.Command(
      {"GET", "tkv:test:" + kNs.KeyComponent() + ":h:" + pages[0].ToHex()});
  ASSERT_OK(holders);
  EXPECT_EQ(holders->str, "node-a,");
}

TEST_F(RedisDirectoryTest, WrongPasswordIsRefusedAtOpen) {
  auto options = NodeOptions("node-a");
  options.password_file = redis_.dir().File("wrong.pass");
  std::ofstream(options.password_file) << "not-the-password\n";
  ASSERT_EQ(::chmod(options.password_file.c_str(), 0600), 0);
  Result<std::unique_ptr<RedisDirectory>> directory =
      RedisDirectory::Open(options);
  ASSERT_FALSE(directory.ok());
  EXPECT_EQ(directory.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(directory.status().message().find("refused the password"),
            std::string::npos)
      << directory.status().ToString();
  EXPECT_EQ(directory.status().message().find("not-the-password"),
            std::string::npos)
      << "the password must not appear in errors";
}

TEST_F(RedisDirectoryTest, MissingPasswordIsRefusedAtOpen) {
  auto options = NodeOptions("node-a");
  options.password_file.clear();
  Result<std::unique_ptr<RedisDirectory>> directory =
      RedisDirectory::Open(options);
  ASSERT_FALSE(directory.ok());
  EXPECT_EQ(directory.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(directory.status().message().find("requires a password"),
            std::string::npos)
      << directory.status().ToString();
}

TEST_F(RedisDirectoryTest, PasswordFileOthersCanReadIsRefused) {
  auto options = NodeOptions("node-a");
  ASSERT_EQ(::chmod(options.password_file.c_str(), 0640), 0);
  Result<std::unique_ptr<RedisDirectory>> directory =
      RedisDirectory::Open(options);
  ASSERT_FALSE(directory.ok());
  EXPECT_EQ(directory.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(directory.status().message().find("chmod 600"), std::string::npos)
      << directory.status().ToString();

  options.password_file = redis_.dir().File("absent.pass");
  EXPECT_EQ(RedisDirectory::Open(options).status().code(),
            StatusCode::kNotFound);
}

TEST_F(RedisDirectoryTest, MalformedUrlIsRefusedAtOpen) {
  for (const char* url : {"", "http://127.0.0.1:6379", "redis://:6379",
                          "redis://127.0.0.1:99999", "unix://redis.sock"}) {
    auto options = NodeOptions("node-a");
    options.url = url;
    EXPECT_EQ(RedisDirectory::Open(options).status().code(),
              StatusCode::kInvalidArgument)
        << url;
  }
}

TEST_F(RedisDirectoryTest, InvalidOptionsAreRefusedAtOpen) {
  const std::vector<std::function<void(RedisDirectory::Options&)>> breakers = {
      [](auto& o) { o.cluster = ""; },
      [](auto& o) { o.cluster = "prod:a"; },
      [](auto& o) { o.node_id = "gpu 07"; },
      [](auto& o) { o.node_id = std::string(65, 'n'); },
      [](auto& o) { o.heartbeat_period = 600ms; },  // > ttl / 2
      [](auto& o) { o.liveness_ttl = 50ms; },
      [](auto& o) { o.lookup_budget = 0us; },
      [](auto& o) { o.max_queued_pages = 0; },
      [](auto& o) { o.write_batch_pages = 0; },
      [](auto& o) { o.write_script_pages = 0; },
      [](auto& o) { o.max_backoff = 1ms; },
      [](auto& o) { o.address = std::string(2000, 'x'); },
      // Durations that would overflow now + duration.
      [](auto& o) { o.io_timeout = std::chrono::milliseconds::max(); },
      [](auto& o) { o.lookup_budget = std::chrono::microseconds::max(); },
      [](auto& o) {
        o.liveness_ttl = std::chrono::milliseconds::max();
        o.heartbeat_period = 2h;
      },
      [](auto& o) { o.max_backoff = 2h; },
  };
  for (size_t i = 0; i < breakers.size(); ++i) {
    auto options = NodeOptions("node-a");
    breakers[i](options);
    EXPECT_EQ(RedisDirectory::Open(options).status().code(),
              StatusCode::kInvalidArgument)
        << "breaker " << i;
  }
}

TEST_F(RedisDirectoryTest, UnixSocketUrlWorks) {
  RedisServer::Spec spec;
  spec.unix_socket = true;
  RedisServer local(spec);
  ASSERT_OK(local.Start());
  auto options = NodeOptions("node-a");
  options.url = local.unix_url();
  options.password_file = local.password_file();
  auto a = Open(options);
  options.node_id = "node-b";
  auto b = Open(options);
  ASSERT_TRUE(a && b);
  const auto pages = Pages(10, 3);
  ASSERT_NO_FATAL_FAILURE(PublishAndSee(*a, *b, pages));
  EXPECT_EQ(Holders(b->Lookup(kNs, pages, Generous())), Ids(3, {"node-a"}));
}

TEST_F(RedisDirectoryTest, HungRedisCostsOneBudgetThenShortCircuits) {
  auto a = Open(NodeOptions("node-a"));
  auto options = NodeOptions("node-b");
  options.lookup_budget = 50ms;
  // The breaker stays open across the next call even if this thread is
  // descheduled for seconds on a loaded machine.
  options.min_backoff = 10s;
  options.max_backoff = 20s;
  auto b = Open(options);
  ASSERT_TRUE(a && b);
  const auto pages = Pages(11, 4);
  ASSERT_OK(a->Publish(kNs, pages));
  ASSERT_OK(a->Flush(Generous()));
  // The live set comes through the writer (no lookup budget involved); the
  // lookup connection was made by Open.
  ASSERT_OK(b->RefreshLiveNodes(Generous()));
  ASSERT_EQ(Holders(b->Lookup(kNs, pages)), Ids(4, {"node-a"}))
      << "warm: the lookup connection is open before the hang";
  ASSERT_EQ(b->GetStats().lookups_short_circuited, 0u);

  redis_.Pause();
  auto start = Clock::now();
  Result<std::vector<PageHolders>> hung = b->Lookup(kNs, pages);
  const auto first_call = Clock::now() - start;
  ASSERT_FALSE(hung.ok());
  EXPECT_EQ(hung.status().code(), StatusCode::kUnavailable);
  EXPECT_LT(first_call, 50ms + 200ms)
      << "the 50 ms budget bounds a hung server";

  const DirectoryStats before = b->GetStats();
  Result<std::vector<PageHolders>> again = b->Lookup(kNs, pages, Generous());
  EXPECT_EQ(again.status().code(), StatusCode::kUnavailable);
  const DirectoryStats after = b->GetStats();
  EXPECT_EQ(after.lookups, before.lookups)
      << "the open breaker answers without a round trip";
  EXPECT_EQ(after.lookups_short_circuited, before.lookups_short_circuited + 1);
  EXPECT_FALSE(after.up);

  redis_.Resume();
  // The breaker waits out min_backoff (10 s) before the next probe.
  EXPECT_TRUE(WaitFor(
      [&] {
        return Holders(b->Lookup(kNs, pages, Generous())) == Ids(4, {"node-a"});
      },
      60s))
      << "lookups work again once the server answers";
  EXPECT_TRUE(b->GetStats().up);
}

TEST_F(RedisDirectoryTest, ExpiredDeadlineFailsThatCallOnly) {
  auto a = Open(NodeOptions("node-a"));
  auto b = Open(NodeOptions("node-b"));
  ASSERT_TRUE(a && b);
  const auto pages = Pages(22, 2);
  ASSERT_NO_FATAL_FAILURE(PublishAndSee(*a, *b, pages));
  EXPECT_EQ(b->Lookup(kNs, pages, Clock::now() - 1ms).status().code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(Holders(b->Lookup(kNs, pages, Generous())), Ids(2, {"node-a"}))
      << "a caller's spent deadline must not open the circuit breaker";
  EXPECT_EQ(b->GetStats().lookups_short_circuited, 0u);
}

TEST_F(RedisDirectoryTest, UnreachableRedisOpensDownAndAnswersAtOnce) {
  auto options = NodeOptions("node-a");
  options.url = "redis://127.0.0.1:1";  // privileged, nothing listens
  options.lookup_budget = 50ms;
  auto a = Open(options);
  ASSERT_TRUE(a);
  EXPECT_FALSE(a->GetStats().up);
  const auto start = Clock::now();
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(a->Lookup(kNs, Pages(12, 2)).status().code(),
              StatusCode::kUnavailable);
  }
  EXPECT_LT(Clock::now() - start, 2s);
  // Publishes queue while the directory is down.
  EXPECT_OK(a->Publish(kNs, Pages(12, 2)));
}

TEST_F(RedisDirectoryTest, FullPublishQueueDropsAndCountsInsteadOfBlocking) {
  RepublishProbe probe(Pages(99, 1));
  auto options = NodeOptions("node-a");
  options.republish = probe.Callback();
  options.max_queued_pages = 100;
  options.write_batch_pages = 10;
  options.io_timeout = 2s;  // the writer stays stuck on the hung server
  auto a = Open(options);
  ASSERT_TRUE(a);
  redis_.Pause();

  uint64_t accepted = 0;
  uint64_t dropped = 0;
  auto slowest = Clock::duration::zero();
  for (uint64_t call = 0; call < 100; ++call) {
    const auto pages = Pages(100 + call, 10);
    const auto start = Clock::now();
    const Status status = a->Publish(kNs, pages);
    slowest = std::max(slowest, Clock::now() - start);
    if (status.ok()) {
      accepted += pages.size();
    } else {
      EXPECT_EQ(status.code(), StatusCode::kResourceExhausted);
      dropped += pages.size();
    }
  }
  EXPECT_LT(slowest, 500ms) << "Publish never waits for the directory";
  // The queue plus at most one batch in flight.
  EXPECT_LE(accepted, 110u);
  EXPECT_GE(accepted, 100u);
  EXPECT_EQ(a->GetStats().dropped_pages, dropped);
  EXPECT_EQ(accepted + dropped, 1000u);

  const Status late = a->Flush(Clock::now() + 100ms);
  EXPECT_EQ(late.code(), StatusCode::kUnavailable) << late.ToString();

  redis_.Resume();
  ASSERT_OK(a->Flush(Clock::now() + 20s));
  EXPECT_GE(a->GetStats().published_pages, accepted);
  EXPECT_EQ(a->GetStats().queued_pages, 0u);
  EXPECT_TRUE(probe.WaitForRuns(1))
      << "dropped publishes are made good by a re-publish";
}

TEST_F(RedisDirectoryTest, ConcurrentLookupsShareTheConnectionWithinDeadline) {
  auto a = Open(NodeOptions("node-a"));
  auto b = Open(NodeOptions("node-b"));
  ASSERT_TRUE(a && b);
  const auto pages = Pages(16, 64);
  ASSERT_NO_FATAL_FAILURE(PublishAndSee(*a, *b, pages));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        Result<std::vector<PageHolders>> found =
            b->Lookup(kNs, pages, Generous());
        if (!found.ok() || found->size() != pages.size()) {
          failures.fetch_add(1, std::memory_order_relaxed);
        }
      }
    });
  }
  // Meanwhile node-b publishes and node-a unpublishes other pages.
  for (int i = 0; i < 50; ++i) {
    ASSERT_OK(b->Publish(kNs, Pages(17 + i, 16)));
    ASSERT_OK(a->Unpublish(kNs, Pages(17 + i, 16)));
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(b->GetStats().lookups, 200u);
}

TEST_F(RedisDirectoryTest, LookupIsNotQueuedBehindAPublishBacklog) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  auto a = Open(NodeOptions("node-a"));
  auto b = Open(NodeOptions("node-b"));
  ASSERT_TRUE(a && b);
  const auto pages = Pages(18, 8);
  ASSERT_NO_FATAL_FAILURE(PublishAndSee(*a, *b, pages));

  // Hold node-b's writer in front of a backlog of its own publishes.
  Mutex mu;
  CondVar cv;
  bool writer_held = false;
  bool release = false;
  testing::ScopedSyncPoints sync;
  sync.SetCallback(RedisDirectory::kBeforeWriteBatch, [&](void*) {
    MutexLock lock(&mu);
    writer_held = true;
    cv.SignalAll();
    while (!release) cv.Wait(&mu);
  });
  ASSERT_OK(b->Publish(kNs, Pages(19, 5000)));
  {
    MutexLock lock(&mu);
    while (!writer_held) cv.Wait(&mu);
  }
  EXPECT_GT(b->GetStats().queued_pages, 0u);
  EXPECT_EQ(Holders(b->Lookup(kNs, pages, Generous())), Ids(8, {"node-a"}))
      << "lookups use their own connection";
  {
    MutexLock lock(&mu);
    release = true;
    cv.SignalAll();
  }
  sync.SetCallback(RedisDirectory::kBeforeWriteBatch, [](void*) {});
  ASSERT_OK(b->Flush(Clock::now() + 20s));
}

TEST_F(RedisDirectoryTest, AclUserLimitedToTheClusterKeysWorks) {
  ASSERT_OK(redis_.Command({"ACL", "SETUSER", "tierkv", "on", ">user-secret",
                            "~tkv:test:*", "+@all"}));
  ASSERT_OK(redis_.Command({"ACL", "SETUSER", "other", "on", ">other-secret",
                            "~elsewhere:*", "+@all"}));
  const auto write_password = [&](const std::string& name,
                                  const std::string& password) {
    const std::string path = redis_.dir().File(name);
    std::ofstream(path) << password << "\n";
    ::chmod(path.c_str(), 0600);
    return path;
  };
  auto options = NodeOptions("node-a");
  options.url = "redis://tierkv@127.0.0.1:" + std::to_string(redis_.port());
  options.password_file = write_password("tierkv.pass", "user-secret");
  auto a = Open(options);
  ASSERT_TRUE(a);
  ASSERT_OK(a->Publish(kNs, Pages(20, 2)));
  ASSERT_OK(a->Flush(Generous()));
  EXPECT_EQ(a->GetStats().published_pages, 2u);

  options.url = "redis://other@127.0.0.1:" + std::to_string(redis_.port());
  options.password_file = write_password("other.pass", "other-secret");
  Result<std::unique_ptr<RedisDirectory>> refused =
      RedisDirectory::Open(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied)
      << refused.status().ToString();
}

TEST_F(RedisDirectoryTest, RedisRestartedEmptyMakesNodesRepublish) {
  const auto pages = Pages(13, 4);
  RepublishProbe probe(pages);
  auto options = NodeOptions("node-a");
  options.republish = probe.Callback();
  auto a = Open(options);
  auto b = Open(NodeOptions("node-b"));
  ASSERT_TRUE(a && b);
  ASSERT_NO_FATAL_FAILURE(PublishAndSee(*a, *b, pages));
  ASSERT_EQ(Holders(b->Lookup(kNs, pages, Generous())), Ids(4, {"node-a"}));
  EXPECT_EQ(probe.runs(), 0) << "no re-publish while nothing was lost";

  redis_.Kill();
  ASSERT_OK(redis_.Start());  // same port, empty
  ASSERT_TRUE(probe.WaitForRuns(1)) << "dir_epoch loss not noticed";
  EXPECT_TRUE(WaitFor([&] {
    return Holders(b->Lookup(kNs, pages, Generous())) == Ids(4, {"node-a"});
  })) << "re-published pages not found again";
  // Counted when the callback has returned, after the probe saw it run.
  EXPECT_TRUE(WaitFor([&] { return a->GetStats().republishes >= 1; }));
  EXPECT_GE(a->GetStats().reconnects, 1u);
}

TEST_F(RedisDirectoryTest, ChangedDirectoryEpochMakesNodesRepublish) {
  const auto pages = Pages(14, 2);
  RepublishProbe probe(pages);
  auto options = NodeOptions("node-a");
  options.republish = probe.Callback();
  auto a = Open(options);
  ASSERT_TRUE(a);
  ASSERT_OK(redis_.Command({"FLUSHALL"}));  // an operator wiped the server
  ASSERT_TRUE(probe.WaitForRuns(1));
  auto b = Open(NodeOptions("node-b"));
  ASSERT_TRUE(b);
  EXPECT_TRUE(WaitFor([&] {
    return Holders(b->Lookup(kNs, pages, Generous())) == Ids(2, {"node-a"});
  }));
  ASSERT_OK(redis_.Command({"SET", "tkv:test:dir_epoch", "replaced"}));
  EXPECT_TRUE(probe.WaitForRuns(2));
}

TEST_F(RedisDirectoryTest, LargeBatchesArePipelined) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  auto a = Open(NodeOptions("node-a"));
  auto b = Open(NodeOptions("node-b"));
  ASSERT_TRUE(a && b);
  const auto pages = Pages(15, 20000);
  auto start = Clock::now();
  ASSERT_OK(a->Publish(kNs, pages));
  ASSERT_OK(a->Flush(Clock::now() + 30s));
  const auto publish_time = Clock::now() - start;
  ASSERT_OK(b->RefreshLiveNodes(Generous()));
  std::atomic<int> lookup_trips{0};
  testing::ScopedSyncPoints sync;
  sync.SetCallback(RedisDirectory::kBeforeLookupTrip, [&](void*) {
    lookup_trips.fetch_add(1, std::memory_order_relaxed);
  });
  start = Clock::now();
  Result<std::vector<PageHolders>> found =
      b->Lookup(kNs, pages, Clock::now() + 30s);
  const auto lookup_time = Clock::now() - start;
  ASSERT_OK(found);
  EXPECT_EQ(found->size(), pages.size());
  const int batch = static_cast<int>(NodeOptions("x").lookup_batch_pages);
  EXPECT_EQ(lookup_trips.load(),
            (static_cast<int>(pages.size()) + batch - 1) / batch)
      << "one round trip per lookup_batch_pages pages";
  EXPECT_EQ(a->GetStats().published_pages, pages.size());
  // Informational (the VM is shared): pipelining keeps these to well under
  // a second, where one round trip per page would take several.
  std::printf(
      "20000 pages: publish+flush %lld ms, lookup %lld ms\n",
      static_cast<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(publish_time)
              .count()),
      static_cast<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(lookup_time)
              .count()));
  Result<RedisReply> memory = redis_.Command(
      {"MEMORY", "USAGE",
       "tkv:test:" + kNs.KeyComponent() + ":h:" + pages[0].ToHex()});
  ASSERT_OK(memory);
  std::printf("bytes per page entry (MEMORY USAGE): %lld\n",
              static_cast<long long>(memory->integer));
}

// B1: a lookup longer than the budget returns the prefix its round trips
// found in time, and leaves the breaker closed for everyone else.
TEST_F(RedisDirectoryTest, LookupLongerThanTheBudgetReturnsAPrefix) {
  auto a = Open(NodeOptions("node-a"));
  auto options = NodeOptions("node-b");
  // One page per trip: 5000 trips cannot fit 20 ms, one trip easily does.
  options.lookup_budget = 20ms;
  options.lookup_batch_pages = 1;
  options.min_backoff = 10s;
  options.max_backoff = 20s;
  auto b = Open(options);
  ASSERT_TRUE(a && b);
  const auto pages = Pages(30, 5000);
  ASSERT_OK(a->Publish(kNs, pages));
  ASSERT_OK(a->Flush(Clock::now() + 30s));
  ASSERT_OK(b->RefreshLiveNodes(Generous()));

  const auto start = Clock::now();
  Result<std::vector<PageHolders>> long_lookup = b->Lookup(kNs, pages);
  EXPECT_LT(Clock::now() - start, 20ms + 200ms);
  ASSERT_OK(long_lookup);
  EXPECT_LT(long_lookup->size(), pages.size()) << "5000 trips fit 20 ms?";
  for (const PageHolders& page : *long_lookup) {
    EXPECT_EQ(page.node_ids, std::vector<std::string>{"node-a"});
  }
  // A later trip that ran out of time may have cost the connection (the
  // background thread replaces it), never the breaker.
  const auto small = Pages(30, 4);
  EXPECT_TRUE(WaitFor(
      [&] { return Holders(b->Lookup(kNs, small)) == Ids(4, {"node-a"}); }));
  EXPECT_EQ(b->GetStats().lookups_short_circuited, 0u);
  EXPECT_TRUE(b->GetStats().up);
}

// B3: when the lookup holding the connection fails and opens the breaker,
// every waiting lookup answers at once rather than at its deadline.
TEST_F(RedisDirectoryTest, WaitingLookupsAllWakeWhenTheHolderFails) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  auto options = NodeOptions("node-b");
  options.min_backoff = 10s;
  options.max_backoff = 20s;
  options.lookup_budget = 20s;  // a stranded waiter would sleep this long
  auto b = Open(options);
  ASSERT_TRUE(b);
  const auto pages = Pages(31, 4);
  constexpr int kWaiters = 3;

  Mutex mu;
  CondVar cv;
  bool holder_in = false;
  bool release = false;
  int waiting = 0;
  testing::ScopedSyncPoints sync;
  sync.SetCallback(RedisDirectory::kBeforeLookupTrip, [&](void*) {
    MutexLock lock(&mu);
    if (holder_in) return;  // only the first lookup is held
    holder_in = true;
    cv.SignalAll();
    while (!release) cv.Wait(&mu);
  });
  sync.SetCallback(RedisDirectory::kWaitingForLookupConnection, [&](void*) {
    MutexLock lock(&mu);
    ++waiting;
    cv.SignalAll();
  });
  std::thread holder([&] { (void)b->Lookup(kNs, pages); });
  {
    MutexLock lock(&mu);
    while (!holder_in) cv.Wait(&mu);
  }
  std::vector<std::thread> waiters;
  std::atomic<int> answered{0};
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&] {
      EXPECT_FALSE(b->Lookup(kNs, pages).ok());
      answered.fetch_add(1, std::memory_order_relaxed);
    });
  }
  {
    MutexLock lock(&mu);
    while (waiting < kWaiters) cv.Wait(&mu);
  }
  redis_.Kill();  // the held trip fails with an IO error: breaker opens
  const auto released = Clock::now();
  {
    MutexLock lock(&mu);
    release = true;
    cv.SignalAll();
  }
  holder.join();
  for (std::thread& waiter : waiters) waiter.join();
  EXPECT_EQ(answered.load(), kWaiters);
  EXPECT_LT(Clock::now() - released, 5s)
      << "a waiter slept towards its 20 s deadline: missed wake-up";
}

// B4: a re-publish in progress does not hold up destruction.
TEST_F(RedisDirectoryTest, DestructionStopsARepublishInProgress) {
  Mutex mu;
  CondVar cv;
  int batches = 0;
  Status last;
  auto options = NodeOptions("node-a");
  options.write_batch_pages = 16;
  // An endless catalog: only Shutdown (or a failure) ends the callback.
  options.republish = [&](DirectoryRepublisher& sink) {
    for (uint64_t chain = 1000;; ++chain) {
      const Status published = sink.Publish(kNs, Pages(chain, 16));
      MutexLock lock(&mu);
      ++batches;
      last = published;
      cv.SignalAll();
      if (!published.ok()) return;
    }
  };
  auto a = Open(options);
  ASSERT_TRUE(a);
  ASSERT_OK(redis_.Command({"FLUSHALL"}));  // dir_epoch lost: re-publish
  {
    MutexLock lock(&mu);
    while (batches < 3) {
      ASSERT_TRUE(cv.WaitUntil(&mu, Clock::now() + 20s) || batches >= 3);
    }
  }
  const auto start = Clock::now();
  a.reset();
  EXPECT_LT(Clock::now() - start, 3 * options.io_timeout + 1s);
  MutexLock lock(&mu);
  EXPECT_EQ(last.code(), StatusCode::kShutdown) << last.ToString();
}

// R5: with the server stopped, destruction still returns within about two
// io_timeouts (one round trip in flight, one goodbye).
TEST_F(RedisDirectoryTest, DestructionWhileRedisIsStoppedIsBounded) {
  auto a = Open(NodeOptions("node-a"));
  ASSERT_TRUE(a);
  ASSERT_OK(a->Publish(kNs, Pages(32, 100)));
  ASSERT_OK(a->Flush(Generous()));
  redis_.Pause();
  ASSERT_OK(a->Publish(kNs, Pages(33, 100)));  // a write in flight, maybe
  std::this_thread::sleep_for(300ms);  // let a heartbeat start (not order)
  const auto start = Clock::now();
  a.reset();
  const auto took = Clock::now() - start;
  redis_.Resume();
  EXPECT_LT(took, 2 * NodeOptions("x").io_timeout + 500ms);
}

// R7: a server refusing the heartbeat (here an ACL without HSET) is up:
// the writer keeps its connection and lookups keep working.
TEST_F(RedisDirectoryTest, RefusedHeartbeatIsCountedNotTreatedAsAnOutage) {
  ASSERT_OK(redis_.Command({"ACL", "SETUSER", "tierkv", "on", ">user-secret",
                            "~tkv:test:*", "+@all"}));
  const std::string path = redis_.dir().File("tierkv.pass");
  std::ofstream(path) << "user-secret\n";
  ::chmod(path.c_str(), 0600);
  auto a = Open(NodeOptions("node-a"));
  auto options = NodeOptions("node-b");
  options.url = "redis://tierkv@127.0.0.1:" + std::to_string(redis_.port());
  options.password_file = path;
  options.liveness_ttl = 20s;  // node-b stays live while refused
  options.heartbeat_period = 50ms;
  auto b = Open(options);
  ASSERT_TRUE(a && b);
  const auto pages = Pages(34, 2);
  ASSERT_OK(a->Publish(kNs, pages));
  ASSERT_OK(a->Flush(Generous()));
  ASSERT_OK(redis_.Command({"ACL", "SETUSER", "tierkv", "-hset"}));
  EXPECT_TRUE(WaitFor([&] { return b->GetStats().heartbeat_errors >= 3; }));
  const DirectoryStats stats = b->GetStats();
  EXPECT_EQ(stats.reconnects, 0u) << "the connection is kept";
  EXPECT_TRUE(stats.up);
  ASSERT_OK(b->RefreshLiveNodes(Generous()));
  EXPECT_EQ(Holders(b->Lookup(kNs, pages, Generous())), Ids(2, {"node-a"}));
  EXPECT_EQ(b->GetStats().lookups_short_circuited, 0u);
}

// R10: a child process the daemon spawns must not inherit the sockets.
TEST_F(RedisDirectoryTest, SocketsAreCloseOnExec) {
  auto a = Open(NodeOptions("node-a"));
  ASSERT_TRUE(a);
  ASSERT_OK(a->RefreshLiveNodes(Generous()));
  DIR* fds = ::opendir("/proc/self/fd");
  ASSERT_NE(fds, nullptr);
  int sockets = 0;
  while (const dirent* entry = ::readdir(fds)) {
    const std::string link = std::string("/proc/self/fd/") + entry->d_name;
    char target[256] = {};
    if (::readlink(link.c_str(), target, sizeof(target) - 1) <= 0) continue;
    if (!std::string_view(target).starts_with("socket:")) continue;
    const int fd = std::atoi(entry->d_name);
    ++sockets;
    EXPECT_NE(::fcntl(fd, F_GETFD) & FD_CLOEXEC, 0) << "fd " << fd;
  }
  ::closedir(fds);
  EXPECT_GE(sockets, 2) << "the writer's and the lookup connection";
}

}  // namespace
}  // namespace tierkv::transport
