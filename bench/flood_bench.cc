// `tierkv-bench flood`: one tenant floods tierkvd with read leases it never
// releases (issue 12's attack: pipelined Gets of the same segments, kept),
// while another tenant's one-segment Gets are timed. Reports the victim's
// Get latency before and during the flood (p50 / p99, and the p99 ratio),
// how many leases the daemon granted before refusing (its per-connection
// limits), and the daemon's RSS growth. A real tierkvd started by the bench,
// defaults for every limit.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "bench/registry.h"
#include "bench/sample_stats.h"
#include "tests/testing/daemon_process.h"
#include "tierkv/client.h"
#include "tierkv/page_hash.h"

namespace tierkv::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct FloodOptions {
  double seconds = 5;         // per phase
  uint32_t segment_kib = 64;  // victim and flood segments
  uint32_t flood_keys = 64;   // segments per flood Acquire
  uint32_t flood_connections = 1;
  std::string json_path;
};

constexpr char kConfig[] =
    "[[namespace]]\nname = \"victim\"\ntoken = \"victim-token\"\n"
    "host_bytes = \"64MiB\"\nshards = 2\n"
    "[[namespace]]\nname = \"flood\"\ntoken = \"flood-token\"\n"
    "host_bytes = \"64MiB\"\nshards = 2\n";

std::vector<SegmentKey> StoreSegments(Client& c, std::string_view ns,
                                      uint32_t count, uint32_t bytes) {
  std::vector<uint32_t> tokens(size_t{count} * 64);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint32_t(i);
  std::vector<SegmentKey> keys;
  std::vector<std::byte> data(bytes, std::byte{0x5A});
  std::vector<SegmentWrite> writes;
  for (const PageHash& p : PageHashChain(RootPageHash(ns), tokens, 64)) {
    keys.push_back({p, 0, 0});
  }
  for (const auto& k : keys) writes.push_back({k, data});
  for (const PutResult& r : c.Put(writes)) {
    if (!r.ok()) {
      fmt::print(stderr, "flood bench: put: {}\n", r.status.ToString());
    }
  }
  return keys;
}

Result<std::unique_ptr<Client>> Open(const testing::DaemonProcess& d,
                                     const std::string& ns,
                                     const std::string& token, uint32_t kib) {
  auto c = Client::Connect({.socket_path = d.socket_path()});
  if (!c.ok()) return c;
  TIERKV_RETURN_IF_ERROR((*c)->OpenNamespace(ns, token));
  TIERKV_RETURN_IF_ERROR(
      (*c)->RegisterLayout(LayoutSpec::Uniform(64, 1, {{"kv", kib * 16}})));
  return c;
}

// One-segment Gets for `seconds`; the latency of each, in microseconds.
std::vector<double> TimeGets(Client& c, const std::vector<SegmentKey>& keys,
                             uint32_t bytes, double seconds, uint64_t* errors) {
  std::vector<double> us;
  std::vector<std::byte> dst(bytes);
  const auto until = Clock::now() + std::chrono::duration<double>(seconds);
  for (size_t i = 0; Clock::now() < until; ++i) {
    SegmentRead r{keys[i % keys.size()], dst};
    const auto t0 = Clock::now();
    const Status s = c.Get(std::span(&r, 1))[0];
    us.push_back(
        std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    *errors += !s.ok();
  }
  return us;
}

int Run(const FloodOptions& o) {
  testing::DaemonProcess daemon;
  if (Status s = daemon.Start({.config_toml = kConfig}); !s.ok()) {
    fmt::print(stderr, "flood bench: {}\n", s.ToString());
    return 1;
  }
  const uint32_t bytes = o.segment_kib << 10;
  auto victim = Open(daemon, "victim", "victim-token", o.segment_kib);
  if (!victim.ok()) {
    fmt::print(stderr, "flood bench: {}\n", victim.status().ToString());
    return 1;
  }
  const auto victim_keys = StoreSegments(**victim, "victim", 256, bytes);
  uint64_t victim_errors = 0;
  TimeGets(**victim, victim_keys, bytes, 1, &victim_errors);  // warm up
  const uint64_t rss_before = daemon.RssBytes();
  const auto baseline =
      TimeGets(**victim, victim_keys, bytes, o.seconds, &victim_errors);

  // The flood: Acquire the same segments again and again, keep every lease.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> granted{0}, refused{0}, flood_errors{0};
  std::vector<std::thread> flooders;
  for (uint32_t f = 0; f < o.flood_connections; ++f) {
    flooders.emplace_back([&] {
      auto c = Open(daemon, "flood", "flood-token", o.segment_kib);
      if (!c.ok()) {
        flood_errors.fetch_add(1);
        return;
      }
      const auto keys = StoreSegments(**c, "flood", o.flood_keys, bytes);
      std::vector<ReadLease> kept;
      while (!stop.load(std::memory_order_relaxed)) {
        auto lease = (*c)->Acquire(keys);
        if (!lease.ok()) {
          (lease.status().code() == StatusCode::kResourceExhausted
               ? refused
               : flood_errors)
              .fetch_add(1);
          continue;
        }
        uint64_t ok = 0, no = 0;
        for (const Status& s : lease->statuses()) {
          (s.ok() ? ok : no) += 1;
        }
        granted.fetch_add(ok);
        refused.fetch_add(no);
        if (ok > 0) kept.push_back(std::move(lease).value());
      }
    });
  }
  // Measure once the flood has reached the daemon's limits.
  const auto saturated_by = Clock::now() + std::chrono::seconds(30);
  while (refused.load() == 0 && flood_errors.load() == 0 &&
         Clock::now() < saturated_by) {
    std::this_thread::yield();
  }
  const auto during =
      TimeGets(**victim, victim_keys, bytes, o.seconds, &victim_errors);
  const uint64_t rss_during = daemon.RssBytes();
  stop = true;
  for (auto& t : flooders) t.join();

  const double p50_base = Median(baseline);
  const double p99_base = Percentile(baseline, 0.99);
  const double p50_flood = Median(during);
  const double p99_flood = Percentile(during, 0.99);
  fmt::print(
      "flood bench: {} flood connection(s) leasing {} x {} KiB segments per "
      "call, never releasing; victim: one-segment Gets of another "
      "namespace, {} s per phase\n",
      o.flood_connections, o.flood_keys, o.segment_kib, o.seconds);
  fmt::print("  {:<10} {:>9} {:>10} {:>10}\n", "victim", "gets", "p50 us",
             "p99 us");
  fmt::print("  {:<10} {:>9} {:>10.1f} {:>10.1f}\n", "baseline",
             baseline.size(), p50_base, p99_base);
  fmt::print("  {:<10} {:>9} {:>10.1f} {:>10.1f}\n", "flood", during.size(),
             p50_flood, p99_flood);
  fmt::print(
      "  p99 during / baseline: {:.2f}x; victim errors {}\n"
      "  flood: {} segment leases granted, {} refused (ResourceExhausted), "
      "{} other errors\n"
      "  daemon RSS {:.1f} MiB -> {:.1f} MiB ({:+.1f} MiB)\n",
      p99_flood / p99_base, victim_errors, granted.load(), refused.load(),
      flood_errors.load(), rss_before / 1048576.0, rss_during / 1048576.0,
      (double(rss_during) - double(rss_before)) / 1048576.0);
  if (!o.json_path.empty()) {
    const nlohmann::json j = {
        {"flood_connections", o.flood_connections},
        {"segment_kib", o.segment_kib},
        {"victim_p50_us", {{"baseline", p50_base}, {"flood", p50_flood}}},
        {"victim_p99_us", {{"baseline", p99_base}, {"flood", p99_flood}}},
        {"p99_ratio", p99_flood / p99_base},
        {"victim_errors", victim_errors},
        {"leases_granted", granted.load()},
        {"leases_refused", refused.load()},
        {"flood_errors", flood_errors.load()},
        {"rss_bytes", {{"before", rss_before}, {"during", rss_during}}}};
    std::ofstream(o.json_path) << j.dump(2) << "\n";
  }
  return victim_errors == 0 && flood_errors.load() == 0 ? 0 : 1;
}

const bool kRegistered = RegisterBench([](CLI::App& app) {
  auto o = std::make_shared<FloodOptions>();
  auto* sub = app.add_subcommand(
      "flood",
      "Another tenant's Get latency while one floods tierkvd with leases");
  sub->add_option("--seconds", o->seconds, "per phase")->capture_default_str();
  sub->add_option("--segment-kib", o->segment_kib)->capture_default_str();
  sub->add_option("--flood-keys", o->flood_keys, "segments per Acquire")
      ->capture_default_str();
  sub->add_option("--flood-connections", o->flood_connections)
      ->capture_default_str();
  sub->add_option("--json", o->json_path, "write the figures as JSON");
  sub->callback([o] { SetExitCode(Run(*o)); });
});

}  // namespace
}  // namespace tierkv::bench
