// NvmeCatalog on a real RocksDB in a temp dir: encoding, batches,
// namespaces, reopen, and damaged / missing databases.
#include "storage/nvme/nvme_catalog.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace tierkv::storage {
namespace {

SegmentKey Key(uint64_t n, uint16_t layer = 0, uint8_t part = 0) {
  return SegmentKey{PageHash{n, ~n}, layer, part};
}

CatalogEntry Entry(uint64_t n) {
  return CatalogEntry{n * 4096, n * 100 + 3, n * 0x9E37, 0xF00D, n};
}

class NvmeCatalogTest : public ::testing::Test {
 protected:
  NvmeCatalogOptions Options() {
    NvmeCatalogOptions o;
    o.path = dir_.File("catalog");
    return o;
  }
  std::unique_ptr<NvmeCatalog> OpenOrDie() {
    auto c = NvmeCatalog::Open(Options());
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  testing::TempDir dir_;
};

TEST(CatalogEntryEncoding, RoundTripsAndRejectsBadValues) {
  const CatalogEntry e{1, 2, 3, 4, 5};
  const std::string v = EncodeCatalogEntry(e);
  EXPECT_EQ(v.size(), 41u);
  auto back = DecodeCatalogEntry(v);
  ASSERT_OK(back);
  EXPECT_EQ(*back, e);
  EXPECT_OK(DecodeCatalogEntry(v + "future"));  // appended fields tolerated
  EXPECT_EQ(DecodeCatalogEntry(v.substr(0, 40)).status().code(),
            StatusCode::kCorruption);
  std::string v2 = v;
  v2[0] = 2;
  EXPECT_EQ(DecodeCatalogEntry(v2).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(DecodeCatalogEntry("").status().code(), StatusCode::kCorruption);
}

TEST_F(NvmeCatalogTest, BatchedEntriesSurviveReopen) {
  uint32_t ns = 0;
  {
    auto cat = OpenOrDie();
    ASSERT_NE(cat, nullptr);
    auto id = cat->GetOrCreateNamespace("glm-5@bf16");
    ASSERT_OK(id);
    ns = *id;
    NvmeCatalog::Batch batch;
    for (uint64_t i = 1; i <= 10; ++i) batch.Put(ns, Key(i), Entry(i));
    batch.Delete(ns, Key(4));
    ASSERT_OK(cat->Write(batch));
  }
  auto cat = OpenOrDie();
  ASSERT_NE(cat, nullptr);
  auto id = cat->FindNamespace("glm-5@bf16");
  ASSERT_OK(id);
  EXPECT_EQ(*id, ns);
  std::vector<SegmentKey> seen;
  auto stats =
      cat->ForEach([&](uint32_t n, const SegmentKey& k, const CatalogEntry& e) {
        EXPECT_EQ(n, ns);
        EXPECT_EQ(e, Entry(k.page.lo));
        seen.push_back(k);
      });
  ASSERT_OK(stats);
  EXPECT_EQ(stats->entries, 9u);
  EXPECT_EQ(stats->malformed, 0u);
  EXPECT_EQ(seen.size(), 9u);
  EXPECT_EQ(cat->Get(ns, Key(4)).status().code(), StatusCode::kNotFound);
  auto e7 = cat->Get(ns, Key(7));
  ASSERT_OK(e7);
  EXPECT_EQ(*e7, Entry(7));
}

TEST_F(NvmeCatalogTest, WeightsRecordsSurviveReopenPerNamespace) {
  const NvmeCatalog::WeightsRecord a{.ns_id = 1,
                                     .model = "glm-5",
                                     .layout = "run/bf16/rank0-of-1",
                                     .version = PageHash{3, 4},
                                     .sealed_unix_ms = 1234,
                                     .manifest = std::string("m\0a", 3)};
  NvmeCatalog::WeightsRecord b = a;
  b.version = PageHash{5, 6};
  b.manifest = "second";
  NvmeCatalog::WeightsRecord other_ns = a;
  other_ns.ns_id = 2;
  {
    auto cat = OpenOrDie();
    ASSERT_NE(cat, nullptr);
    for (const NvmeCatalog::WeightsRecord* r :
         {&a, static_cast<const NvmeCatalog::WeightsRecord*>(&b),
          static_cast<const NvmeCatalog::WeightsRecord*>(&other_ns)}) {
      ASSERT_OK(cat->PutWeights(*r));
    }
    NvmeCatalog::WeightsRecord bad = a;
    bad.model = std::string("x\0y", 3);
    EXPECT_EQ(cat->PutWeights(bad).code(), StatusCode::kInvalidArgument);
    NvmeCatalog::Batch batch;  // a segment beside them is unaffected
    batch.Put(1, Key(1), Entry(1));
    ASSERT_OK(cat->Write(batch));
  }
  auto cat = OpenOrDie();
  ASSERT_NE(cat, nullptr);
  std::vector<NvmeCatalog::WeightsRecord> seen;
  auto stats = cat->ForEachWeights(
      1, [&](const NvmeCatalog::WeightsRecord& r) { seen.push_back(r); });
  ASSERT_OK(stats);
  EXPECT_EQ(stats->entries, 2u);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].model, a.model);
  EXPECT_EQ(seen[0].layout, a.layout);
  EXPECT_EQ(seen[0].version, a.version);
  EXPECT_EQ(seen[0].sealed_unix_ms, 1234u);
  EXPECT_EQ(seen[0].manifest, a.manifest);
  EXPECT_EQ(seen[1].manifest, "second");
  EXPECT_EQ(*cat->CountEntries(), 1u);  // segments only
  ASSERT_OK(cat->DeleteWeights(1, a.model, a.layout, a.version));
  seen.clear();
  ASSERT_OK(cat->ForEachWeights(
      1, [&](const NvmeCatalog::WeightsRecord& r) { seen.push_back(r); }));
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].version, b.version);
  seen.clear();
  ASSERT_OK(cat->ForEachWeights(
      2, [&](const NvmeCatalog::WeightsRecord& r) { seen.push_back(r); }));
  EXPECT_EQ(seen.size(), 1u);
}

TEST_F(NvmeCatalogTest, NamespacesKeepEqualKeysApart) {
  auto cat = OpenOrDie();
  ASSERT_NE(cat, nullptr);
  auto a = cat->GetOrCreateNamespace("a");
  auto b = cat->GetOrCreateNamespace("b");
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(*cat->GetOrCreateNamespace("a"), *a);
  NvmeCatalog::Batch batch;
  batch.Put(*a, Key(1, 5, 1), Entry(1));
  batch.Put(*b, Key(1, 5, 1), Entry(2));
  ASSERT_OK(cat->Write(batch));
  EXPECT_EQ(*cat->Get(*a, Key(1, 5, 1)), Entry(1));
  EXPECT_EQ(*cat->Get(*b, Key(1, 5, 1)), Entry(2));
  EXPECT_EQ(cat->Get(*a, Key(1, 5, 0)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(cat->FindNamespace("c").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(cat->Namespaces().size(), 2u);
}

TEST_F(NvmeCatalogTest, MissingCatalogIsNotFoundWhenNotCreating) {
  NvmeCatalogOptions o = Options();
  o.create_if_missing = false;
  EXPECT_EQ(NvmeCatalog::Open(o).status().code(), StatusCode::kNotFound);
}

void Scribble(const std::filesystem::path& file) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out << "garbage, not a manifest name";
}

TEST_F(NvmeCatalogTest, DamagedCatalogIsAClearErrorNotACrash) {
  {
    auto cat = OpenOrDie();
    ASSERT_NE(cat, nullptr);
    ASSERT_OK(cat->GetOrCreateNamespace("ns"));
  }
  Scribble(std::filesystem::path(Options().path) / "CURRENT");
  auto reopened = NvmeCatalog::Open(Options());
  ASSERT_FALSE(reopened.ok());
  EXPECT_EQ(reopened.status().code(), StatusCode::kCorruption)
      << reopened.status().ToString();
}

TEST_F(NvmeCatalogTest, DamagedCatalogIsRecreatedWhenAsked) {
  {
    auto cat = OpenOrDie();
    ASSERT_NE(cat, nullptr);
    ASSERT_OK(cat->GetOrCreateNamespace("ns"));
  }
  Scribble(std::filesystem::path(Options().path) / "CURRENT");
  NvmeCatalogOptions o = Options();
  o.recreate_if_damaged = true;
  auto cat = NvmeCatalog::Open(o);
  ASSERT_OK(cat);
  EXPECT_TRUE((*cat)->recreated());
  EXPECT_EQ((*cat)->recreate_reason().code(), StatusCode::kCorruption);
  EXPECT_TRUE((*cat)->Namespaces().empty());
  EXPECT_EQ(*(*cat)->CountEntries(), 0u);
}

TEST_F(NvmeCatalogTest, DirectoryThatIsAFileIsAnError) {
  std::ofstream(Options().path) << "x";
  Status s = NvmeCatalog::Open(Options()).status();
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.code() == StatusCode::kIOError ||
              s.code() == StatusCode::kCorruption)
      << s.ToString();
}

}  // namespace
}  // namespace tierkv::storage
