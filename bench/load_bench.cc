// `tierkv-bench load`: per-layer Load / Store between a real tierkvd and an
// engine's registered memfd pools, in GLM-5 geometry (78 layers, 64-token
// pages, `kv` 1152 B/token on every layer, `index_k` 132 B/token on the 21
// IndexShare full layers), against baselines measured in the same run:
//   host   Load of pages resident in DRAM vs single-thread memcpy of the
//          same segments into the same slots; time to WaitLayer(0) vs to
//          the last layer (layer ordering); Store of new pages vs memcpy;
//          1-segment Match latency;
//   nvme   a write_back daemon whose DRAM is overrun by a Put flood: the
//          demotion throughput (bytes the mover wrote over the flood's
//          time, and sustained: over the time the mover was writing)
//          vs fio sequential write of the same segment size to a fresh
//          file (blocks in the same state as the tier's), with the
//          demotion failure and backpressure counts; then Load of NVMe-only
//          pages vs fio random read of the same size.
// Figures are medians of --iterations runs.
#include <fcntl.h>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "bench/fio_runner.h"
#include "bench/registry.h"
#include "bench/sample_stats.h"
#include "tests/testing/daemon_process.h"
#include "tierkv/client.h"
#include "tierkv/page_hash.h"

namespace tierkv::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct LoadBenchOptions {
  uint32_t pages = 256;
  uint32_t layers = 78;
  uint32_t index_layers = 21;
  int iterations = 5;
  bool nvme = true;
  std::string nvme_dir = "/var/tmp";
  std::string fio = "/usr/bin/fio";
  std::string json_path;
};

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

LayoutSpec Glm5Layout(const LoadBenchOptions& o) {
  LayoutSpec l;
  l.page_tokens = 64;
  for (uint32_t i = 0; i < o.layers; ++i) {
    LayerSpec layer;
    layer.parts.push_back({"kv", 1152});
    // Full layers spread evenly, as GLM-5.2's IndexShare schedule does.
    if (o.index_layers && (i * o.index_layers) % o.layers < o.index_layers) {
      layer.parts.push_back({"index_k", 132});
    }
    l.layers.push_back(layer);
  }
  return l;
}

// One engine pool (memfd) per (layer, part), `slots` slots each.
struct Pools {
  struct Region {
    int fd = -1;
    std::byte* base = nullptr;
    uint64_t slot_bytes = 0;
  };
  std::vector<std::vector<Region>> by_layer;  // [layer][part]
  uint32_t slots = 0;
  ~Pools() {
    for (auto& parts : by_layer) {
      for (auto& r : parts) {
        ::munmap(r.base, r.slot_bytes * slots);
        ::close(r.fd);
      }
    }
  }
};

Status MakePools(const LayoutSpec& layout, uint32_t slots, Pools& pools) {
  pools.slots = slots;
  for (uint16_t l = 0; l < layout.num_layers(); ++l) {
    pools.by_layer.emplace_back();
    for (uint8_t p = 0; p < layout.layers[l].parts.size(); ++p) {
      Pools::Region r;
      r.slot_bytes = layout.SegmentBytes(l, p);
      const uint64_t bytes = r.slot_bytes * slots;
      r.fd = ::memfd_create("bench-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      if (r.fd < 0 || ::ftruncate(r.fd, static_cast<off_t>(bytes)) != 0) {
        return Status::IOError("pool memfd");
      }
      void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_POPULATE, r.fd, 0);
      if (base == MAP_FAILED) return Status::IOError("pool mmap");
      r.base = static_cast<std::byte*>(base);
      pools.by_layer.back().push_back(r);
    }
  }
  return Status::OK();
}

Status RegisterPools(Client& c, Pools& pools) {
  for (uint16_t l = 0; l < pools.by_layer.size(); ++l) {
    for (uint8_t p = 0; p < pools.by_layer[l].size(); ++p) {
      const auto& r = pools.by_layer[l][p];
      TIERKV_RETURN_IF_ERROR(c.RegisterPool({.fd = r.fd,
                                             .slot_bytes = r.slot_bytes,
                                             .slot_count = pools.slots,
                                             .layer = l,
                                             .part = p}));
    }
  }
  return Status::OK();
}

// Every segment of `pages`, with bytes from `src` (one page's worth per
// (layer, part), distinct per page by a stamp in the first word).
Status PutPages(Client& c, const LayoutSpec& layout,
                const std::vector<PageHash>& pages, std::vector<std::byte>& src,
                bool allow_busy_retry) {
  const uint64_t batch_bytes = 64ull << 20;
  std::vector<SegmentWrite> writes;
  uint64_t bytes = 0;
  auto flush = [&]() -> Status {
    for (int attempt = 0; attempt < 100 && !writes.empty(); ++attempt) {
      std::vector<PutResult> st = c.Put(writes);
      std::vector<SegmentWrite> again;
      for (size_t i = 0; i < st.size(); ++i) {
        if (st[i].ok()) continue;  // stored now or before
        if (allow_busy_retry && st[i].status.code() == StatusCode::kBusy) {
          again.push_back(writes[i]);
          continue;
        }
        return st[i].status;
      }
      writes = std::move(again);
    }
    if (!writes.empty()) return Status::Busy("put kept getting Busy");
    bytes = 0;
    return Status::OK();
  };
  uint64_t offset = 0;
  for (const PageHash& page : pages) {
    for (uint16_t l = 0; l < layout.num_layers(); ++l) {
      for (uint8_t p = 0; p < layout.layers[l].parts.size(); ++p) {
        const uint64_t seg = layout.SegmentBytes(l, p);
        writes.push_back({{page, l, p}, {src.data() + offset, seg}});
        offset = (offset + seg) % (src.size() - (2u << 20));
        bytes += seg;
        if (bytes >= batch_bytes) TIERKV_RETURN_IF_ERROR(flush());
      }
    }
  }
  return flush();
}

std::vector<PageHash> PageSet(uint32_t n, uint32_t first_token) {
  std::vector<uint32_t> tokens(size_t{n} * 64);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = first_token + static_cast<uint32_t>(i);
  }
  return PageHashChain(RootPageHash("bench"), tokens, 64);
}

size_t PageSegments(const LayoutSpec& layout) {
  size_t n = 0;
  for (const auto& l : layout.layers) n += l.parts.size();
  return n;
}

uint64_t PageBytes(const LayoutSpec& layout) {
  uint64_t b = 0;
  for (uint16_t l = 0; l < layout.num_layers(); ++l) {
    for (uint8_t p = 0; p < layout.layers[l].parts.size(); ++p) {
      b += layout.SegmentBytes(l, p);
    }
  }
  return b;
}

// memcpy of `pages` segments from `src` into the pools' slots, layer by
// layer as Load does: the single-thread ceiling for the same bytes.
double MemcpyIntoPools(const LayoutSpec& layout, Pools& pools, uint32_t pages,
                       const std::vector<std::byte>& src) {
  const auto t0 = Clock::now();
  uint64_t offset = 0;
  for (uint16_t l = 0; l < layout.num_layers(); ++l) {
    for (auto& r : pools.by_layer[l]) {
      for (uint32_t i = 0; i < pages; ++i) {
        std::memcpy(r.base + i * r.slot_bytes, src.data() + offset,
                    r.slot_bytes);
        offset = (offset + r.slot_bytes) % (src.size() - (2u << 20));
      }
    }
  }
  return Seconds(t0, Clock::now());
}

struct LoadTiming {
  double total_s = 0;
  double first_layer_s = 0;
  bool ok = true;
};

LoadTiming TimeTransfer(Client& c, bool load,
                        const std::vector<PageHash>& pages, uint32_t layers) {
  std::vector<uint32_t> slots(pages.size());
  for (uint32_t i = 0; i < slots.size(); ++i) slots[i] = i;
  LoadTiming t;
  const auto t0 = Clock::now();
  auto h = load ? c.Load(pages, slots) : c.Store(pages, slots);
  if (!h.ok()) {
    fmt::print(stderr, "transfer: {}\n", h.status().ToString());
    t.ok = false;
    return t;
  }
  auto first = h->WaitLayer(0);
  t.first_layer_s = Seconds(t0, Clock::now());
  auto last = h->WaitLayer(static_cast<uint16_t>(layers - 1));
  t.total_s = Seconds(t0, Clock::now());
  auto all = h->Wait();
  if (!first.ok() || !last.ok() || !all.ok()) {
    t.ok = false;
    return t;
  }
  for (const Status& s : *all) t.ok = t.ok && s.ok();
  return t;
}

// Starts `daemon` with `config` (one namespace "bench", token
// "bench-token") and returns a client bound to it with `layout` registered.
Result<std::unique_ptr<Client>> StartAndConnect(testing::DaemonProcess& daemon,
                                                const LayoutSpec& layout,
                                                const std::string& config) {
  TIERKV_RETURN_IF_ERROR(daemon.Start(
      {.config_toml = config, .extra_args = {"--io-threads", "2"}}));
  auto client = daemon.Connect("bench", "bench-token");
  if (!client.ok()) return client.status();
  TIERKV_RETURN_IF_ERROR((*client)->RegisterLayout(layout));
  return client;
}

int RunHost(const LoadBenchOptions& o, const LayoutSpec& layout,
            std::vector<std::byte>& src, nlohmann::json& out) {
  const uint64_t data = PageBytes(layout) * o.pages;
  testing::DaemonProcess daemon;
  auto client = StartAndConnect(
      daemon, layout,
      fmt::format("[[namespace]]\nname = \"bench\"\ntoken = \"bench-token\"\n"
                  "host_bytes = {}\nshards = 8\n",
                  2 * data + (256ull << 20)));
  if (!client.ok()) {
    fmt::print(stderr, "tierkvd: {}\n", client.status().ToString());
    return 1;
  }
  Client& c = **client;
  const auto pages = PageSet(o.pages, 0);
  if (Status p = PutPages(c, layout, pages, src, false); !p.ok()) {
    fmt::print(stderr, "put: {}\n", p.ToString());
    return 1;
  }
  Pools pools;
  Status made = MakePools(layout, o.pages, pools);
  if (made.ok()) made = RegisterPools(c, pools);
  if (!made.ok()) {
    fmt::print(stderr, "pools: {}\n", made.ToString());
    return 1;
  }
  std::vector<double> load_s, first_s, memcpy_s, store_s, store_memcpy_s;
  for (int it = 0; it <= o.iterations; ++it) {  // iteration 0 warms up
    const double m = MemcpyIntoPools(layout, pools, o.pages, src);
    LoadTiming t = TimeTransfer(c, true, pages, o.layers);
    if (!t.ok) return 1;
    // Store of pages not stored yet (new hashes each iteration).
    const auto fresh = PageSet(o.pages, 1000000 * (it + 1));
    LoadTiming st = TimeTransfer(c, false, fresh, o.layers);
    if (!st.ok) return 1;
    const double sm = MemcpyIntoPools(layout, pools, o.pages, src);
    if (it == 0) continue;
    memcpy_s.push_back(m);
    load_s.push_back(t.total_s);
    first_s.push_back(t.first_layer_s);
    store_s.push_back(st.total_s);
    store_memcpy_s.push_back(sm);
  }
  // 1-segment Match round trips.
  std::vector<double> match_us;
  const std::vector<PageHash> one = {pages[0]};
  for (int i = 0; i < 5000; ++i) {
    const auto t0 = Clock::now();
    auto m = c.Match(one);
    match_us.push_back(Seconds(t0, Clock::now()) * 1e6);
    if (!m.ok()) return 1;
  }
  const double gb = data / 1e9;
  const double memcpy_gbps = gb / Median(memcpy_s);
  const double load_gbps = gb / Median(load_s);
  const double store_gbps = gb / Median(store_s);
  const double store_memcpy_gbps = gb / Median(store_memcpy_s);
  fmt::print(
      "host   {} pages x {} layers = {:.2f} GB per Load\n"
      "       memcpy {:.2f} GB/s  Load {:.2f} GB/s  ratio {:.2f}\n"
      "       first layer {:.2f} ms of {:.2f} ms ({:.3f} of the Load)\n"
      "       Store {:.2f} GB/s  memcpy {:.2f} GB/s  ratio {:.2f}\n",
      o.pages, o.layers, gb, memcpy_gbps, load_gbps, load_gbps / memcpy_gbps,
      Median(first_s) * 1e3, Median(load_s) * 1e3,
      Median(first_s) / Median(load_s), store_gbps, store_memcpy_gbps,
      store_gbps / store_memcpy_gbps);
  const double p50 = Median(match_us);
  const double p99 = Percentile(match_us, 0.99);
  fmt::print(
      "       match (1 page = {} segments, 5000 calls): p50 {:.1f} us, p99 "
      "{:.1f} us\n",
      PageSegments(layout), p50, p99);
  out["host"] = {{"bytes_per_load", data},
                 {"memcpy_gbps", memcpy_gbps},
                 {"load_gbps", load_gbps},
                 {"load_vs_memcpy", load_gbps / memcpy_gbps},
                 {"first_layer_ms", Median(first_s) * 1e3},
                 {"load_ms", Median(load_s) * 1e3},
                 {"first_layer_fraction", Median(first_s) / Median(load_s)},
                 {"store_gbps", store_gbps},
                 {"store_memcpy_gbps", store_memcpy_gbps},
                 {"store_vs_memcpy", store_gbps / store_memcpy_gbps},
                 {"match_page_segments", PageSegments(layout)},
                 {"match_p50_us", p50},
                 {"match_p99_us", p99}};
  return 0;
}

// Waits (up to 30 s) until the daemon's NVMe write counter has not moved
// for 200 ms: the demotions the last Puts started are done. A benchmark may
// poll; a test would wait on a sync point.
void WaitForIdleMover(Client& c) {
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  double last = -1;
  int quiet = 0;
  while (quiet < 4 && Clock::now() < deadline) {
    auto stats = c.StatsJson();
    if (!stats.ok()) return;
    const double written =
        nlohmann::json::parse(*stats)["nvme"]["written_bytes"].get<double>();
    quiet = written == last ? quiet + 1 : 0;
    last = written;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Samples the daemon's NVMe written-bytes counter every 5 ms on its own
// connection while a flood runs, for the mover's sustained demotion rate:
// the flood's first ~256 MiB only fill DRAM (nothing is due for write-back
// yet), and its last Puts leave write-back running, so bytes written over
// the flood's time understate what the mover does while it works.
class WrittenBytesSampler {
 public:
  explicit WrittenBytesSampler(std::unique_ptr<Client> client)
      : client_(std::move(client)), thread_([this] { Run(); }) {}
  ~WrittenBytesSampler() { Stop(); }

  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  // After Stop: bytes written from the last sample before the counter
  // first moved to the first sample at its final value, over that time;
  // 0 when it never moved.
  double SustainedGbps() const {
    if (samples_.size() < 2) return 0;
    const double last = samples_.back().second;
    size_t begin = 0, end = samples_.size() - 1;
    while (begin + 1 < samples_.size() && samples_[begin + 1].second == 0) {
      ++begin;
    }
    while (end > 0 && samples_[end - 1].second == last) --end;
    if (end <= begin || last == 0) return 0;
    return (last - samples_[begin].second) / 1e9 /
           Seconds(samples_[begin].first, samples_[end].first);
  }

 private:
  void Run() {
    while (!stop_.load()) {
      auto stats = client_->StatsJson();
      if (!stats.ok()) return;
      samples_.emplace_back(
          Clock::now(),
          nlohmann::json::parse(*stats)["nvme"]["written_bytes"].get<double>());
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  std::unique_ptr<Client> client_;
  std::atomic<bool> stop_{false};
  std::vector<std::pair<Clock::time_point, double>> samples_;  // Run's
  std::thread thread_;  // last: starts once the rest is built
};

int RunNvme(const LoadBenchOptions& o, const LayoutSpec& layout,
            std::vector<std::byte>& src, nlohmann::json& out) {
  namespace fs = std::filesystem;
  const std::string dir = o.nvme_dir + "/tierkv-load-bench";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const uint64_t page_bytes = PageBytes(layout);
  const uint64_t data = page_bytes * o.pages;
  const uint64_t nvme_bytes = ((data * 5 / 4) / (1u << 20) + 64) << 20;
  const uint64_t host_bytes = 256ull << 20;
  testing::DaemonProcess daemon;
  auto client = StartAndConnect(
      daemon, layout,
      fmt::format("[[namespace]]\nname = \"bench\"\ntoken = \"bench-token\"\n"
                  "host_bytes = {}\nshards = 4\nwrite_policy = \"write_back\"\n"
                  "[nvme]\npath = \"{}/nvme.data\"\ncapacity_bytes = {}\n",
                  host_bytes, dir, nvme_bytes));
  if (!client.ok()) {
    fmt::print(stderr, "tierkvd: {}\n", client.status().ToString());
    return 1;
  }
  Client& c = **client;
  const auto pages = PageSet(o.pages, 0);
  // The virtual disks this runs on change speed by several times within
  // minutes, so each fio peer runs right before and right after what it is
  // compared with, and the ratio is to their mean.
  const std::string fio_file = dir + "/fio.data";
  // fio writes a fresh file each time: the flood's demotions land on
  // blocks of the tier's data file never written before (fallocated,
  // unwritten extents, which ext4 converts on each write), and so must its
  // peer. Overwriting blocks fio wrote a minute earlier ran 0.58-0.65 GB/s
  // on this disk against 0.43-0.47 GB/s for a fresh file (three runs each,
  // alternating); the peer used to be one of each.
  auto fio_write = [&]() {
    fs::remove(fio_file);
    return RunFio(o.fio, dir,
                  FioArgs(fio_file, data, layout.SegmentBytes(0, 0), 64, data,
                          30, "write"),
                  "write");
  };
  auto fio_read = [&]() {
    return RunFio(o.fio, dir,
                  FioArgs(fio_file, data, layout.SegmentBytes(0, 0), 64,
                          data / 2, 30, "randread"),
                  "read");
  };
  auto write_before = fio_write();
  if (!write_before.ok()) {
    fmt::print(stderr, "{}\n", write_before.status().ToString());
    return 1;
  }
  auto sampler_client = daemon.Connect("bench", "bench-token");
  if (!sampler_client.ok()) {
    fmt::print(stderr, "sampler: {}\n", sampler_client.status().ToString());
    return 1;
  }
  WrittenBytesSampler sampler(std::move(sampler_client).value());
  // The flood: every page as fast as the client can Put; DRAM holds
  // ~host_bytes of it, so nearly everything is written back on the way.
  const auto t0 = Clock::now();
  if (Status p = PutPages(c, layout, pages, src, true); !p.ok()) {
    fmt::print(stderr, "flood: {}\n", p.ToString());
    return 1;
  }
  const double flood_s = Seconds(t0, Clock::now());
  auto stats = nlohmann::json::parse(*c.StatsJson());
  const double written = stats["nvme"]["written_bytes"].get<double>();
  const double demote_gbps = written / 1e9 / flood_s;
  const uint64_t failed = stats["nvme"]["demotions_failed"].get<uint64_t>();
  const uint64_t busy = stats["host"]["backpressure_busy"].get<uint64_t>();
  const uint64_t waits = stats["host"]["backpressure_waits"].get<uint64_t>();
  const uint64_t syncs = stats["nvme"]["demotion_syncs"].get<uint64_t>();
  // The last Puts leave demotions in flight; fio must not race them.
  WaitForIdleMover(c);
  sampler.Stop();
  const double sustained_gbps = sampler.SustainedGbps();
  // fio sequential write of 72 KiB blocks to a fresh file, same disk.
  auto write_after = fio_write();
  if (!write_after.ok()) {
    fmt::print(stderr, "{}\n", write_after.status().ToString());
    return 1;
  }
  const double fio_write_gbps = (write_before->gbps + write_after->gbps) / 2;
  fmt::print(
      "nvme   write_back flood of {:.2f} GB through {} MiB of DRAM: {:.2f} s\n"
      "       demoted {:.2f} GB/s over the flood, {:.2f} GB/s sustained (while "
      "the mover wrote)  fio write 72KiB {:.2f} GB/s (before {:.2f}, after "
      "{:.2f})  ratio {:.2f} over the flood, {:.2f} sustained; {} demotions "
      "failed, {} Put waits, {} items Busy after waiting, {} group syncs\n",
      data / 1e9, host_bytes >> 20, flood_s, demote_gbps, sustained_gbps,
      fio_write_gbps, write_before->gbps, write_after->gbps,
      demote_gbps / fio_write_gbps, sustained_gbps / fio_write_gbps, failed,
      waits, busy, syncs);
  // Load pages long evicted from DRAM (the first half): NVMe-only.
  const uint32_t cold = std::min<uint32_t>(
      o.pages / 2,
      o.pages - static_cast<uint32_t>(host_bytes / page_bytes) - 1);
  const std::vector<PageHash> cold_pages(pages.begin(), pages.begin() + cold);
  Pools pools;
  Status made = MakePools(layout, cold, pools);
  if (made.ok()) made = RegisterPools(c, pools);
  if (!made.ok()) {
    fmt::print(stderr, "pools: {}\n", made.ToString());
    return 1;
  }
  auto read_before = fio_read();
  if (!read_before.ok()) {
    fmt::print(stderr, "{}\n", read_before.status().ToString());
    return 1;
  }
  std::vector<double> load_s;
  uint64_t nvme_loaded = 0;
  for (int it = 0; it < std::max(1, o.iterations / 2); ++it) {
    auto before = nlohmann::json::parse(*c.StatsJson())["transfers"];
    LoadTiming t = TimeTransfer(c, true, cold_pages, o.layers);
    if (!t.ok) return 1;
    auto after = nlohmann::json::parse(*c.StatsJson())["transfers"];
    nvme_loaded = after["load_bytes"]["nvme"].get<uint64_t>() -
                  before["load_bytes"]["nvme"].get<uint64_t>();
    load_s.push_back(t.total_s);
  }
  auto read_after = fio_read();
  if (!read_after.ok()) {
    fmt::print(stderr, "{}\n", read_after.status().ToString());
    return 1;
  }
  const double fio_read_gbps = (read_before->gbps + read_after->gbps) / 2;
  const double cold_gb = page_bytes * cold / 1e9;
  const double load_gbps = cold_gb / Median(load_s);
  fmt::print(
      "       Load of {} NVMe-only pages ({:.2f} GB, {:.0f}% read from NVMe): "
      "{:.2f} GB/s  fio randread 72KiB {:.2f} GB/s (before {:.2f}, after "
      "{:.2f})  ratio {:.2f}\n",
      cold, cold_gb, 100.0 * nvme_loaded / (cold_gb * 1e9), load_gbps,
      fio_read_gbps, read_before->gbps, read_after->gbps,
      load_gbps / fio_read_gbps);
  out["nvme"] = {
      {"flood_bytes", data},
      {"flood_s", flood_s},
      {"demote_gbps", demote_gbps},
      {"fio_write_gbps", fio_write_gbps},
      {"fio_write_before_gbps", write_before->gbps},
      {"fio_write_after_gbps", write_after->gbps},
      {"demote_vs_fio_write", demote_gbps / fio_write_gbps},
      {"demote_sustained_gbps", sustained_gbps},
      {"demote_sustained_vs_fio_write", sustained_gbps / fio_write_gbps},
      {"demotion_syncs", syncs},
      {"demotions_failed", failed},
      {"backpressure_waits", waits},
      {"backpressure_busy", busy},
      {"load_pages", cold},
      {"load_gbps", load_gbps},
      {"load_nvme_bytes", nvme_loaded},
      {"fio_randread_gbps", fio_read_gbps},
      {"fio_randread_before_gbps", read_before->gbps},
      {"fio_randread_after_gbps", read_after->gbps},
      {"load_vs_fio_randread", load_gbps / fio_read_gbps}};
  daemon.Stop();
  fs::remove_all(dir);
  return 0;
}

int Run(const LoadBenchOptions& o) {
  const LayoutSpec layout = Glm5Layout(o);
  if (Status s = layout.Validate(); !s.ok()) {
    fmt::print(stderr, "layout: {}\n", s.ToString());
    return 1;
  }
  // Source bytes for Puts and the memcpy baselines (larger than the LLC).
  std::vector<std::byte> src(512ull << 20);
  for (size_t i = 0; i < src.size(); i += 8) {
    const uint64_t v = i * 0x9E3779B97F4A7C15ull;
    std::memcpy(&src[i], &v, 8);
  }
  nlohmann::json out;
  out["date"] = fmt::format("{:%F %R}", fmt::gmtime(std::time(nullptr)));
  out["pages"] = o.pages;
  out["layers"] = o.layers;
  out["index_layers"] = o.index_layers;
  out["iterations"] = o.iterations;
  fmt::print(
      "tierkv-bench load: GLM-5 geometry, {} layers ({} with index_k), "
      "64-token pages, median of {}\n",
      o.layers, o.index_layers, o.iterations);
  if (int rc = RunHost(o, layout, src, out); rc != 0) return rc;
  if (o.nvme) {
    if (int rc = RunNvme(o, layout, src, out); rc != 0) return rc;
  }
  if (!o.json_path.empty()) {
    std::ofstream(o.json_path) << out.dump(2) << "\n";
    fmt::print("wrote {}\n", o.json_path);
  }
  return 0;
}

const bool kRegistered = RegisterBench([](CLI::App& app) {
  auto o = std::make_shared<LoadBenchOptions>();
  auto* sub = app.add_subcommand(
      "load", "per-layer Load/Store into registered pools vs memcpy and fio");
  sub->add_option("--pages", o->pages, "pages per Load (default 256)");
  sub->add_option("--layers", o->layers, "layers (default 78)");
  sub->add_option("--index-layers", o->index_layers,
                  "layers with index_k (default 21)");
  sub->add_option("--iterations", o->iterations, "median of (default 5)");
  sub->add_flag("!--no-nvme", o->nvme, "skip the NVMe part");
  sub->add_option(
      "--nvme-dir", o->nvme_dir,
      "disk-backed directory for the NVMe files (default /var/tmp)");
  sub->add_option("--fio", o->fio, "fio binary");
  sub->add_option("--json", o->json_path, "write the figures as JSON");
  sub->callback([o] { SetExitCode(Run(*o)); });
});

}  // namespace
}  // namespace tierkv::bench
