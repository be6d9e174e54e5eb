// PagePublisher over a real CacheEngine and an in-process directory: only
// pages held whole are published, the sweep unpublishes what eviction took,
// and a re-publish writes what is held.
#include "daemon/cluster/page_publisher.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "storage/engine/cache_engine.h"
#include "tests/testing/status_matchers.h"
#include "transport/directory/memory_directory.h"

namespace tierkv::daemon::cluster {
namespace {

using storage::CacheEngine;
using storage::EngineReservation;
using storage::SegmentSize;
using transport::DirectoryNamespace;
using transport::MemoryDirectory;
using transport::MemoryDirectoryCluster;

constexpr uint64_t kOwner = 7;

// 2 layers, an indexer key on layer 0: 3 segments a page of 4 KiB or so.
LayoutSpec TestLayout() {
  LayoutSpec l;
  l.page_tokens = 16;
  for (int i = 0; i < 2; ++i) {
    LayerSpec layer;
    layer.parts.push_back({"kv", 256});
    if (i == 0) layer.parts.push_back({"index_k", 33});
    l.layers.push_back(layer);
  }
  return l;
}

PageHash Page(uint64_t n) { return PageHash{n, n * 977 + 1}; }

// Records what a re-publish writes.
class RecordingSink : public transport::DirectoryRepublisher {
 public:
  Status Publish(const DirectoryNamespace& ns,
                 std::span<const PageHash> pages) override {
    namespaces.push_back(ns);
    written.insert(written.end(), pages.begin(), pages.end());
    return Status::OK();
  }
  std::vector<DirectoryNamespace> namespaces;
  std::vector<PageHash> written;
};

class PagePublisherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<storage::NamespaceOptions> spaces;
    spaces.push_back(
        {.host = {.name = "ns", .capacity_bytes = 1 << 20, .shards = 1}});
    auto engine =
        CacheEngine::Open({.workers = 1}, std::move(spaces),
                          std::vector<std::unique_ptr<storage::Tier>>{});
    ASSERT_OK(engine);
    engine_ = std::move(engine).value();
    ns_ = engine_->Find("ns");
    ASSERT_OK(engine_->RegisterLayout(*ns_, TestLayout()));
    publisher_ = std::make_unique<PagePublisher>(
        // A period long enough that only TEST_RunOnce runs a sweep here.
        PagePublisherOptions{.period = std::chrono::hours(1)}, engine_.get(),
        self_, std::vector<storage::EngineNamespace*>{ns_});
  }
  void TearDown() override {
    if (publisher_) publisher_->Stop();
  }

  // Stores the segments of page n of layers [0, layers) as a client does.
  void PutPage(uint64_t n, uint16_t layers = 2) {
    const LayoutSpec layout = TestLayout();
    std::vector<SegmentSize> items;
    for (uint16_t l = 0; l < layers; ++l) {
      for (uint8_t p = 0; p < layout.layers[l].parts.size(); ++p) {
        items.push_back({{Page(n), l, p}, layout.SegmentBytes(l, p)});
      }
    }
    EngineReservation r;
    engine_->Reserve(kOwner, *ns_, items,
                     [&r](EngineReservation got) { r = std::move(got); });
    std::vector<SegmentKey> keys;
    for (size_t i = 0; i < items.size(); ++i) {
      ASSERT_OK(r.items[i]);
      if (!r.items[i]->already_stored) keys.push_back(items[i].key);
    }
    for (const Status& s : engine_->Commit(kOwner, *ns_, r.lease_id, keys)) {
      ASSERT_OK(s);
    }
  }

  // The pages of `pages` node "observer" finds held by a peer (the prefix).
  size_t Visible(const std::vector<PageHash>& pages) {
    auto found = observer_->Lookup(Namespace(), pages);
    EXPECT_OK(found);
    return found.ok() ? found->size() : 0;
  }
  DirectoryNamespace Namespace() const {
    return {"ns", TestLayout().Fingerprint()};
  }

  MemoryDirectoryCluster cluster_;
  std::shared_ptr<MemoryDirectory> self_ = std::make_shared<MemoryDirectory>(
      &cluster_, transport::DirectoryNode{"node-a", "a:1", 1});
  std::unique_ptr<MemoryDirectory> observer_ =
      std::make_unique<MemoryDirectory>(
          &cluster_, transport::DirectoryNode{"node-b", "b:1", 1});
  std::unique_ptr<CacheEngine> engine_;
  storage::EngineNamespace* ns_ = nullptr;
  std::unique_ptr<PagePublisher> publisher_;
};

TEST_F(PagePublisherTest, OnlyPagesHeldWholeArePublished) {
  PutPage(0);
  PutPage(1, /*layers=*/1);  // layer 1 missing
  PutPage(2);
  const std::vector<PageHash> pages = {Page(0), Page(1), Page(2)};
  publisher_->Stored(ns_, pages);
  publisher_->TEST_RunOnce();
  EXPECT_EQ(Visible({Page(0)}), 1u);
  EXPECT_EQ(Visible({Page(1)}), 0u);
  EXPECT_EQ(Visible({Page(2)}), 1u);
  EXPECT_EQ(publisher_->Stats().published, 2u);
  // The rest of page 1 arrives (a later layer's Store): the retried
  // candidate is published then, without being announced again.
  PutPage(1);
  publisher_->TEST_RunOnce();
  EXPECT_EQ(Visible(pages), 3u);
  EXPECT_EQ(publisher_->Stats().tracked, 3u);
  // Announced again (stored again, fetched again), the pages are written
  // again, as a peer may have removed the entries meanwhile, and tracked
  // once.
  publisher_->Stored(ns_, pages);
  publisher_->TEST_RunOnce();
  EXPECT_EQ(publisher_->Stats().published, 6u);
  EXPECT_EQ(publisher_->Stats().tracked, 3u);
}

TEST_F(PagePublisherTest, TheSweepUnpublishesWhatEvictionTook) {
  PutPage(0);
  publisher_->Stored(ns_, std::vector<PageHash>{Page(0)});
  publisher_->TEST_RunOnce();
  ASSERT_EQ(Visible({Page(0)}), 1u);
  // 1 MiB of other pages evicts page 0 from the only tier.
  for (uint64_t n = 100; n < 400; ++n) PutPage(n);
  publisher_->TEST_RunOnce();
  EXPECT_EQ(Visible({Page(0)}), 0u);
  EXPECT_EQ(publisher_->Stats().unpublished, 1u);
  EXPECT_EQ(publisher_->Stats().tracked, 0u);
}

TEST_F(PagePublisherTest, ARepublishWritesEveryTrackedPage) {
  for (uint64_t n = 0; n < 5; ++n) PutPage(n);
  std::vector<PageHash> pages;
  for (uint64_t n = 0; n < 5; ++n) pages.push_back(Page(n));
  publisher_->Stored(ns_, pages);
  publisher_->TEST_RunOnce();
  RecordingSink sink;
  publisher_->Republish(sink);
  ASSERT_EQ(sink.namespaces.size(), 1u);
  EXPECT_EQ(sink.namespaces[0], Namespace());
  std::sort(sink.written.begin(), sink.written.end());
  std::sort(pages.begin(), pages.end());
  EXPECT_EQ(sink.written, pages);
}

}  // namespace
}  // namespace tierkv::daemon::cluster
