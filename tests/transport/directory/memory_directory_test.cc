// Tests transport/directory/memory_directory.cc: the in-process Directory
// keeps the contract RedisDirectory keeps (prefix lookup, own node left
// out, live filter, outages answered at once).
#include "transport/directory/memory_directory.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace tierkv::transport {
namespace {

using Ids = std::vector<std::vector<std::string>>;
const DirectoryNamespace kNs{"ns", 42};

std::vector<PageHash> Pages(size_t count) {
  std::vector<PageHash> pages;
  for (size_t i = 0; i < count; ++i) pages.push_back(PageHash{i + 1, 7});
  return pages;
}

Ids Holders(const Result<std::vector<PageHolders>>& result) {
  Ids out;
  if (result.ok()) {
    for (const PageHolders& page : *result) out.push_back(page.node_ids);
  }
  return out;
}

TEST(MemoryDirectory, LookupIsAPrefixOfPagesOtherLiveNodesHold) {
  MemoryDirectoryCluster cluster;
  MemoryDirectory a(&cluster, {"a", "addr-a", 1});
  MemoryDirectory b(&cluster, {"b", "addr-b", 1});
  MemoryDirectory c(&cluster, {"c", "addr-c", 1});
  const auto pages = Pages(4);
  ASSERT_OK(a.Publish(kNs, std::span(pages).subspan(0, 2)));
  ASSERT_OK(b.Publish(kNs, pages));
  ASSERT_OK(a.Publish(kNs, std::span(pages).subspan(3, 1)));
  EXPECT_EQ(Holders(c.Lookup(kNs, pages)),
            (Ids{{"a", "b"}, {"a", "b"}, {"b"}, {"a", "b"}}));
  EXPECT_EQ(Holders(b.Lookup(kNs, pages)), (Ids{{"a"}, {"a"}}))
      << "own node left out; the prefix ends at page 2";
  ASSERT_OK(b.Unpublish(kNs, pages));
  EXPECT_EQ(Holders(c.Lookup(kNs, pages)), (Ids{{"a"}, {"a"}}));
  ASSERT_OK(c.ForgetHolder(kNs, std::span(pages).subspan(1, 1), "a"));
  EXPECT_EQ(Holders(c.Lookup(kNs, pages)), (Ids{{"a"}}));
  EXPECT_EQ(cluster.EntryCount(), 2u);  // a: pages 0 and 3
}

TEST(MemoryDirectory, DeadAndDepartedNodesAreNotHolders) {
  MemoryDirectoryCluster cluster;
  MemoryDirectory a(&cluster, {"a", "addr-a", 1});
  const auto pages = Pages(2);
  {
    MemoryDirectory b(&cluster, {"b", "addr-b", 9});
    ASSERT_OK(b.Publish(kNs, pages));
    EXPECT_EQ(a.LiveNodes().size(), 2u);
    cluster.SetLive("b", false);
    EXPECT_TRUE(Holders(a.Lookup(kNs, pages)).empty());
    EXPECT_EQ(a.LiveNodes(), (std::vector<DirectoryNode>{a.self()}));
    cluster.SetLive("b", true);
    EXPECT_EQ(Holders(a.Lookup(kNs, pages)), (Ids{{"b"}, {"b"}}));
  }
  EXPECT_TRUE(Holders(a.Lookup(kNs, pages)).empty()) << "b left";
}

TEST(MemoryDirectory, DownClusterAnswersAtOnceAndDropsWrites) {
  MemoryDirectoryCluster cluster;
  MemoryDirectory a(&cluster, {"a", "addr-a", 1});
  cluster.SetDown(true);
  EXPECT_EQ(a.Lookup(kNs, Pages(1)).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(a.Publish(kNs, Pages(3)).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(a.GetStats().dropped_pages, 3u);
  EXPECT_FALSE(a.GetStats().up);
  cluster.SetDown(false);
  ASSERT_OK(a.Publish(kNs, Pages(3)));
  EXPECT_EQ(cluster.EntryCount(), 3u);
  cluster.Clear();
  EXPECT_EQ(cluster.EntryCount(), 0u);
  EXPECT_EQ(
      a.Lookup(kNs, Pages(1), std::chrono::steady_clock::now()).status().code(),
      StatusCode::kUnavailable)
      << "a spent deadline";
}

}  // namespace
}  // namespace tierkv::transport
