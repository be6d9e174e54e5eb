// Client::ReportTopk against real tierkvd processes: a namespace with
// eviction_policy "topk" keeps the pages an engine reports as selected
// when DRAM fills, where "lru" keeps the newest; reports are validated.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/client/client_test_util.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"
#include "tierkv/client.h"

namespace tierkv::testing {
namespace {

// GLM-5-like: layer 0 is a full layer (latent + index key), layer 1 shares
// its selection (latent only). 64 KiB + 4 KiB + 64 KiB per page.
LayoutSpec TwoLayerLayout() {
  LayoutSpec l;
  l.page_tokens = 64;
  l.layers.push_back({{{"kv", 1024}, {"index_k", 64}}});
  l.layers.push_back({{{"kv", 1024}}});
  return l;
}

std::string Config(const std::string& policy) {
  return "[[namespace]]\nname = \"a\"\ntoken = \"token-of-a\"\n"
         "host_bytes = \"8MiB\"\nshards = 1\neviction_policy = \"" +
         policy + "\"\n";
}

// Stores every segment of `pages`.
void PutAll(Client& c, const std::vector<PageHash>& pages) {
  const LayoutSpec layout = TwoLayerLayout();
  std::vector<std::vector<std::byte>> data;
  std::vector<SegmentWrite> writes;
  for (const PageHash& p : pages) {
    for (uint16_t l = 0; l < 2; ++l) {
      for (uint8_t part = 0; part < layout.layers[l].parts.size(); ++part) {
        const SegmentKey k{p, l, part};
        data.push_back(SegmentBytes(k, layout.SegmentBytes(l, part)));
      }
    }
  }
  size_t i = 0;
  for (const PageHash& p : pages) {
    for (uint16_t l = 0; l < 2; ++l) {
      for (uint8_t part = 0; part < layout.layers[l].parts.size(); ++part) {
        writes.push_back({{p, l, part}, data[i++]});
      }
    }
  }
  for (const PutResult& r : c.Put(writes)) ASSERT_OK(r.status);
}

// Pages of `pages` that are wholly in DRAM.
int Resident(Client& c, const std::vector<PageHash>& pages) {
  int n = 0;
  for (const PageHash& p : pages) {
    auto m = c.Match(std::span(&p, 1));
    EXPECT_OK(m);
    if (m.ok() && m->leading_pages == 1) ++n;
  }
  return n;
}

// 40 pages fill 5.2 of 8 MiB; the engine reports 10 of them selected; 40
// more pages need room. topk evicts the 30 unreported pages first (and
// some new ones), lru the oldest pages, the reported ones among them.
TEST(TopkReportTest, ReportedPagesStayInDramUnderTopkNotUnderLru) {
  for (const std::string policy : {"topk", "lru"}) {
    DaemonProcess d;
    ASSERT_OK(d.Start({.config_toml = Config(policy)}));
    auto c = d.Connect("a", "token-of-a");
    ASSERT_OK(c);
    ASSERT_OK((*c)->RegisterLayout(TwoLayerLayout()));
    const auto first = Pages(40, 0, "a");
    PutAll(**c, first);
    const std::vector<PageHash> selected(first.begin(), first.begin() + 10);
    std::vector<SelectionReport> reports;
    for (const PageHash& p : selected) reports.push_back({p, 0, 50});
    ASSERT_OK((*c)->ReportTopk(reports));
    PutAll(**c, Pages(40, 100000, "a"));
    const int kept = Resident(**c, selected);
    if (policy == "topk") {
      EXPECT_EQ(kept, 10) << "every reported page stays";
    } else {
      EXPECT_EQ(kept, 0) << "lru evicts the oldest pages";
    }
    auto stats = (*c)->StatsJson();
    ASSERT_OK(stats);
    const auto j = nlohmann::json::parse(*stats);
    EXPECT_EQ(j["transfers"]["topk_reports"].get<int>(), 10);
    EXPECT_EQ(j["host"]["eviction_policy"].get<std::string>(), policy);
    EXPECT_GT(j["host"]["evictions"].get<int>(), 0);
  }
}

TEST(TopkReportTest, ReportsAreValidatedAndUnknownPagesIgnored) {
  DaemonProcess d;
  ASSERT_OK(d.Start({.config_toml = Config("topk")}));
  auto c = d.Connect("a", "token-of-a");
  ASSERT_OK(c);
  const std::vector<SelectionReport> one = {{Pages(1, 5, "a")[0], 0, 3}};
  EXPECT_EQ((*c)->ReportTopk(one).code(), StatusCode::kInvalidArgument)
      << "no layout yet";
  ASSERT_OK((*c)->RegisterLayout(TwoLayerLayout()));
  // A page the daemon lacks is skipped.
  EXPECT_OK((*c)->ReportTopk(one));
  const std::vector<SelectionReport> bad = {{Pages(1, 5, "a")[0], 2, 3}};
  EXPECT_EQ((*c)->ReportTopk(bad).code(), StatusCode::kInvalidArgument);
  // More items than one request carries are split by the client.
  std::vector<SelectionReport> many(70000, {Pages(1, 9, "a")[0], 1, 1});
  EXPECT_OK((*c)->ReportTopk(many));
}

}  // namespace
}  // namespace tierkv::testing
