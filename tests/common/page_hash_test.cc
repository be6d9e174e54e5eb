// Freezes the prefix-hash chain (tierkv/page_hash.h) with test vectors.
#include "tierkv/page_hash.h"

#include <gtest/gtest.h>

#include <numeric>

namespace tierkv {
namespace {

TEST(PageHashTest, ChainHashesOnlyFullPages) {
  std::vector<uint32_t> tokens(130);
  std::iota(tokens.begin(), tokens.end(), 0u);
  auto chain = PageHashChain(RootPageHash("ns"), tokens, 64);
  ASSERT_EQ(chain.size(), 2u);
  EXPECT_EQ(chain[0],
            NextPageHash(RootPageHash("ns"), std::span(tokens).subspan(0, 64)));
  EXPECT_EQ(chain[1],
            NextPageHash(chain[0], std::span(tokens).subspan(64, 64)));
}

TEST(PageHashTest, EqualPrefixesShareHashesAndDivergeAfter) {
  std::vector<uint32_t> a(256, 7), b(256, 7);
  b[200] = 8;  // differs in page 3
  auto ha = PageHashChain(RootPageHash("ns"), a, 64);
  auto hb = PageHashChain(RootPageHash("ns"), b, 64);
  EXPECT_EQ(ha[0], hb[0]);
  EXPECT_EQ(ha[2], hb[2]);
  EXPECT_NE(ha[3], hb[3]);
}

TEST(PageHashTest, NamespaceAndSaltSeparateChains) {
  std::vector<uint32_t> t(64, 1);
  const std::byte salt[] = {std::byte{1}};
  EXPECT_NE(PageHashChain(RootPageHash("a"), t, 64)[0],
            PageHashChain(RootPageHash("b"), t, 64)[0]);
  EXPECT_NE(PageHashChain(RootPageHash("a"), t, 64)[0],
            PageHashChain(RootPageHash("a"), t, 64, salt)[0]);
}

// Frozen vectors, cross-checked with the Python xxhash package (xxh3_128 over
// the same bytes). If these change, every persisted cache is invalidated.
TEST(PageHashTest, FrozenVectors) {
  EXPECT_EQ(RootPageHash("default").ToHex(),
            "12a03b47514c9b7dd69c36821acea183");
  std::vector<uint32_t> tokens(64);
  std::iota(tokens.begin(), tokens.end(), 1u);
  EXPECT_EQ(NextPageHash(RootPageHash("default"), tokens).ToHex(),
            "eaae000cecf2fc67f46506c014bbc5c0");
  const std::byte salt[] = {std::byte{'x'}};
  EXPECT_EQ(
      NextPageHash(PageHash{}, std::span(tokens).subspan(0, 4), salt).ToHex(),
      "dfed77c69c84eb5533db2eeddfad8f25");
}

TEST(PageHashTest, HexRoundTrips) {
  PageHash h{0x0123456789abcdefull, 0xfedcba9876543210ull};
  EXPECT_EQ(h.ToHex(), "fedcba98765432100123456789abcdef");
  auto back = PageHash::FromHex(h.ToHex());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, h);
  EXPECT_FALSE(PageHash::FromHex("xyz").ok());
  EXPECT_FALSE(PageHash::FromHex(std::string(32, 'g')).ok());
}

TEST(LayoutSpecTest, ValidatesAndSizesSegments) {
  LayoutSpec glm = LayoutSpec::Uniform(64, 3, {{"kv", 1152}, {"index_k", 132}});
  glm.layers[1].parts.pop_back();  // a shared IndexShare layer
  ASSERT_TRUE(glm.Validate().ok());
  EXPECT_EQ(glm.SegmentBytes(0, 0), 64u * 1152);
  EXPECT_EQ(glm.SegmentBytes(0, 1), 64u * 132);
  EXPECT_EQ(glm.SegmentBytes(1, 1), 0u);
  EXPECT_EQ(glm.FindPart(2, "index_k"), 1);
  EXPECT_EQ(glm.FindPart(1, "index_k"), -1);

  LayoutSpec bad = glm;
  bad.layers[0].parts[0].bytes_per_token = 0;
  EXPECT_EQ(bad.Validate().code(), StatusCode::kInvalidArgument);
  bad = glm;
  bad.layers[2].parts.push_back({"kv", 4});
  EXPECT_EQ(bad.Validate().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(glm.Fingerprint(),
            LayoutSpec::Uniform(64, 3, {{"kv", 1152}}).Fingerprint());
}

}  // namespace
}  // namespace tierkv
