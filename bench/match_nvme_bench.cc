// `tierkv-bench match-nvme`: the latency of one Match of many pages whose
// segments live below DRAM (issue 26: "Match of 1,000 pages with an NVMe
// tier faster than before"), next to the same Match answered from DRAM,
// measured in the same run.
//
// Two namespaces of one tierkvd hold the same pages: `cold` has 1 MiB of
// DRAM and writes through to NVMe, so after the Puts (and a Flush) nearly
// every segment is on NVMe only; `hot` has DRAM for all of them and no
// NVMe. Matches of all the pages alternate between the two. Match asks
// the daemon's defaults (it prefetches what DRAM lacks), which old and new
// daemons answer alike, so an old tierkvd can be measured with the same
// client (TIERKV_BIN_DIR).
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench/registry.h"
#include "bench/sample_stats.h"
#include "tests/testing/daemon_process.h"
#include "tierkv/client.h"

namespace tierkv::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct MatchNvmeOptions {
  uint32_t pages = 1000;
  int calls = 300;
  std::string nvme_dir = "/var/tmp";
  std::string json_path;
};

// Six segments a page (three layers of two parts), 4 KiB and 1 KiB.
LayoutSpec SmallLayout() {
  LayoutSpec layout;
  layout.page_tokens = 64;
  for (int l = 0; l < 3; ++l)
    layout.layers.push_back({{{"kv", 64}, {"idx", 16}}});
  return layout;
}

// Puts every segment of `pages`; with `flush`, makes them durable on NVMe.
Status PutAll(Client& c, const LayoutSpec& layout,
              const std::vector<PageHash>& pages, bool flush) {
  std::vector<std::byte> data(64 * 64, std::byte{0x5a});
  std::vector<SegmentWrite> writes;
  std::vector<SegmentKey> keys;
  for (const PageHash& page : pages) {
    for (uint16_t l = 0; l < layout.layers.size(); ++l) {
      for (uint8_t p = 0; p < layout.layers[l].parts.size(); ++p) {
        const SegmentKey key{page, l, p};
        keys.push_back(key);
        writes.push_back(
            {key, std::span(data).first(layout.SegmentBytes(l, p))});
      }
    }
  }
  for (const PutResult& r : c.Put(writes)) {
    if (!r.ok()) return r.status;
  }
  if (!flush) return Status::OK();
  for (const Status& s : c.Flush(keys)) {
    if (!s.ok()) return s;
  }
  return Status::OK();
}

int Run(const MatchNvmeOptions& o) {
  namespace fs = std::filesystem;
  const std::string dir = o.nvme_dir + "/tierkv-match-nvme-bench";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const LayoutSpec layout = SmallLayout();
  testing::DaemonProcess daemon;
  Status started = daemon.Start(
      {.config_toml = fmt::format(
           "[[namespace]]\nname = \"cold\"\ntoken = \"cold-token\"\n"
           "host_bytes = \"1MiB\"\nshards = 1\n"
           "write_policy = \"write_through\"\n"
           "[[namespace]]\nname = \"hot\"\ntoken = \"hot-token\"\n"
           "host_bytes = \"64MiB\"\n"
           "[nvme]\npath = \"{}/nvme.data\"\ncapacity_bytes = \"256MiB\"\n",
           dir),
       .extra_args = {"--io-threads", "2"}});
  if (!started.ok()) {
    fmt::print(stderr, "tierkvd: {}\n", started.ToString());
    return 1;
  }
  auto cold = daemon.Connect("cold", "cold-token");
  auto hot = daemon.Connect("hot", "hot-token");
  if (!cold.ok() || !hot.ok()) {
    fmt::print(stderr, "connect: {} {}\n", cold.status().ToString(),
               hot.status().ToString());
    return 1;
  }
  std::vector<PageHash> pages;
  for (uint32_t i = 0; i < o.pages; ++i) pages.push_back({i + 1, 0x6d61746368});
  for (Client* c : {cold->get(), hot->get()}) {
    Status s = c->RegisterLayout(layout);
    if (s.ok()) s = PutAll(*c, layout, pages, /*flush=*/c == cold->get());
    if (!s.ok()) {
      fmt::print(stderr, "put: {}\n", s.ToString());
      return 1;
    }
  }

  std::vector<double> cold_us, hot_us;
  uint64_t cold_nvme_pages = 0, cold_leading = 0;
  for (int call = -10; call < o.calls; ++call) {  // 10 warm-up calls
    for (Client* c : {cold->get(), hot->get()}) {
      const auto t0 = Clock::now();
      auto m = c->Match(pages);
      const double us =
          std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      if (!m.ok()) {
        fmt::print(stderr, "match: {}\n", m.status().ToString());
        return 1;
      }
      if (call < 0) continue;
      if (c == cold->get()) {
        cold_us.push_back(us);
        cold_leading += m->leading_pages;
        for (tierkv::Tier t : m->tiers) cold_nvme_pages += t == Tier::kNvme;
      } else {
        hot_us.push_back(us);
      }
    }
  }
  const double cold_p50 = Percentile(cold_us, 0.5),
               cold_p99 = Percentile(cold_us, 0.99),
               hot_p50 = Percentile(hot_us, 0.5),
               hot_p99 = Percentile(hot_us, 0.99);
  const double nvme_share =
      static_cast<double>(cold_nvme_pages) / (double(o.pages) * o.calls);
  fmt::print(
      "tierkv-bench match-nvme: Match of {} pages x 6 segments, {} calls "
      "each\n"
      "  below DRAM ({:.1f}% of pages answered from NVMe, {:.1f} leading): "
      "p50 {:.1f} us, p99 {:.1f} us\n"
      "  in DRAM:  p50 {:.1f} us, p99 {:.1f} us  (below/DRAM p50 {:.2f})\n",
      o.pages, o.calls, 100 * nvme_share,
      static_cast<double>(cold_leading) / o.calls, cold_p50, cold_p99, hot_p50,
      hot_p99, cold_p50 / hot_p50);
  if (!o.json_path.empty()) {
    nlohmann::json j = {{"pages", o.pages},
                        {"calls", o.calls},
                        {"nvme_page_share", nvme_share},
                        {"below_dram_p50_us", cold_p50},
                        {"below_dram_p99_us", cold_p99},
                        {"dram_p50_us", hot_p50},
                        {"dram_p99_us", hot_p99},
                        {"below_over_dram_p50", cold_p50 / hot_p50}};
    std::ofstream(o.json_path) << j.dump(2) << "\n";
  }
  fs::remove_all(dir);
  return 0;
}

const bool kRegistered = RegisterBench([](CLI::App& app) {
  auto o = std::make_shared<MatchNvmeOptions>();
  auto* sub = app.add_subcommand(
      "match-nvme", "Match latency of many pages below DRAM vs in DRAM");
  sub->add_option("--pages", o->pages, "pages per Match")
      ->capture_default_str();
  sub->add_option("--calls", o->calls, "timed Matches per namespace")
      ->capture_default_str();
  sub->add_option("--nvme-dir", o->nvme_dir, "disk-backed directory")
      ->capture_default_str();
  sub->add_option("--json", o->json_path, "write the figures as JSON");
  sub->callback([o] { SetExitCode(Run(*o)); });
});

}  // namespace
}  // namespace tierkv::bench
