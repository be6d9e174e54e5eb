// `tierkv-bench host`: the host-DRAM tier through a real tierkvd, against
// single-thread memcpy measured in the same run (issue: Foundation, item 8).
//
// For each segment size it measures, over a working set larger than the
// last-level cache and with pre-faulted buffers:
//   memcpy  - copying the working set segment by segment with glibc's
//             memcpy, timed batch by batch interleaved with the Gets, and
//             in whole passes beside the fresh Puts;
//   put     - batched Put of new segments (reserve RPC, copy, commit RPC),
//             calls back to back, into an arena full of segments of the
//             same size (warm: each Put evicts one), and into an empty
//             arena (fresh: no eviction, every arena page written for the
//             first time; --iterations passes into one arena sized for all
//             of them);
//   get     - batched Get of stored segments (lease RPC, copy, release RPC),
//             calls back to back beside a memcpy pass, and interleaved
//             batch by batch with memcpy ("after gap": each call then
//             finds the daemon's IO thread asleep);
//   stream  - the working set copied with StreamCopy (streaming stores, as
//             Put and Get copy), in passes alternating with memcpy passes:
//             how far Put and Get are from their own copy's limit is
//             put/memcpy divided by stream/memcpy;
// and the round-trip latency of a one-segment Match. Figures are medians of
// --iterations runs; ratios are to memcpy of the same size.
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench/registry.h"
#include "bench/sample_stats.h"
#include "bench/size_option.h"
#include "common/stream_copy.h"
#include "tests/testing/daemon_process.h"
#include "tierkv/client.h"
#include "tierkv/page_hash.h"

namespace tierkv::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct HostBenchOptions {
  std::string working_set = "256MiB";  // per segment size
  // Bytes per Put/Get call. 8 MiB ~ one layer of a 7K-token prefix of
  // GLM-5 latent KV (114 pages x 72 KiB), what an engine fetches at once.
  std::string batch = "8MiB";
  int iterations = 5;
  int match_calls = 20000;
  std::string json_path;
};

struct SizeCase {
  std::string name;
  uint32_t bytes_per_token;  // x 64 tokens = segment size
};

// An anonymous, pre-faulted, page-aligned buffer.
class PageBuffer {
 public:
  explicit PageBuffer(size_t bytes) : size_(bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
  }
  ~PageBuffer() {
    if (data_) ::munmap(data_, size_);
  }
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;
  bool ok() const { return data_ != nullptr; }
  std::byte* data() { return data_; }
  size_t size() const { return size_; }
  std::byte& operator[](size_t i) { return data_[i]; }
  std::span<std::byte> span() { return {data_, size_}; }

 private:
  std::byte* data_;
  size_t size_;
};

// A forked child that echoes 64-byte messages over a Unix socket pair: the
// floor under any RPC here (two wake-ups and two socket copies), measured in
// the same run as Match, interleaved with it.
class EchoPeer {
 public:
  EchoPeer() {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return;
    child_ = ::fork();
    if (child_ == 0) {
      ::close(sv[0]);
      char msg[64];
      while (::read(sv[1], msg, sizeof(msg)) == sizeof(msg) &&
             ::write(sv[1], msg, sizeof(msg)) == sizeof(msg)) {
      }
      ::_exit(0);
    }
    ::close(sv[1]);
    fd_ = child_ > 0 ? sv[0] : -1;
  }
  ~EchoPeer() {
    if (fd_ >= 0) ::close(fd_);  // the child's read sees EOF
    if (child_ > 0) ::waitpid(child_, nullptr, 0);
  }
  bool ok() const { return fd_ >= 0; }

  // One round trip in microseconds (-1 on failure). With `spin`, polls for
  // the echo instead of sleeping in read(), as the client's Match does.
  double RoundTripMicros(bool spin) {
    char msg[64] = {};
    const auto t0 = Clock::now();
    if (::write(fd_, msg, sizeof(msg)) != sizeof(msg)) return -1;
    if (spin) {
      pollfd p{fd_, POLLIN, 0};
      while (::poll(&p, 1, 0) == 0) {
      }
    }
    if (::read(fd_, msg, sizeof(msg)) != sizeof(msg)) return -1;
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }

 private:
  pid_t child_ = -1;
  int fd_ = -1;
};

int Run(const HostBenchOptions& o) {
  const auto parsed_working_set =
      ParseSizeOption("--working-set", o.working_set);
  const auto parsed_batch = ParseSizeOption("--batch", o.batch);
  for (const Status& s : {parsed_working_set.status(), parsed_batch.status()}) {
    if (!s.ok()) {
      fmt::print(stderr, "tierkv-bench host: {}\n", s.ToString());
      return 1;
    }
  }
  const uint64_t working_set = *parsed_working_set;
  const uint64_t batch_bytes = *parsed_batch;
  if (working_set == 0 || batch_bytes == 0) {
    fmt::print(stderr,
               "tierkv-bench host: --working-set and --batch must be > 0\n");
    return 1;
  }
  const std::vector<SizeCase> cases = {
      {"8KiB", 128}, {"72KiB", 1152}, {"1MiB", 16384}};
  // Each size has namespaces of its own, so that no size's Puts evict
  // another's segments (a 72 KiB Put evicting nine 8 KiB segments measured
  // the eviction, not the steady state): `warm-<size>` holds two working
  // sets and is filled before it is timed; `fresh-<size>` holds one per
  // iteration, is written once, and is never full.
  const uint64_t slack = uint64_t{16} << 20;
  std::string config = R"(
[[namespace]]
name = "match"
token = "match-token"
host_bytes = "16MiB"
shards = 1
)";
  for (const auto& sc : cases) {
    for (const auto& [kind, bytes] :
         {std::pair{"warm", 2 * working_set + slack},
          std::pair{"fresh", o.iterations * working_set + slack}}) {
      config += fmt::format(
          "[[namespace]]\nname = \"{}-{}\"\ntoken = \"bench-token\"\n"
          "host_bytes = {}\nshards = 8\n",
          kind, sc.name, bytes);
    }
  }
  testing::DaemonProcess daemon;
  // Populating GiBs of arenas takes the daemon ~10 s on the 2-core VM.
  Status started = daemon.Start({.config_toml = config,
                                 .extra_args = {"--io-threads", "2"},
                                 .ready_timeout = std::chrono::minutes(2)});
  if (!started.ok()) {
    fmt::print(stderr, "cannot start tierkvd: {}\n", started.ToString());
    return 1;
  }
  // Each size's namespaces hold one layer of segments of that size, as an
  // engine's namespace holds its model's pages: the daemon sizes a
  // namespace's index from its layout (HostTier::ReserveIndex).
  auto connect = [&](const std::string& ns,
                     const LayoutSpec& layout) -> std::unique_ptr<Client> {
    auto client = daemon.Connect(ns, "bench-token");
    Status s =
        client.ok() ? (*client)->RegisterLayout(layout) : client.status();
    if (!s.ok()) {
      fmt::print(stderr, "{}: {}\n", ns, s.ToString());
      return nullptr;
    }
    return std::move(client).value();
  };

  // Get copies arena -> dst; the memcpy baseline copies src -> copy_dst.
  // Page-aligned, as engines' KV buffers are: glibc copies 4 KiB..L3-sized
  // blocks with `rep movsb`, which on AMD Zen runs at about a third of its
  // speed when source and destination differ modulo 64 B (a malloc'd
  // vector sits 16 B past a page; arena segments are 64 B aligned).
  PageBuffer src(working_set), dst(working_set), copy_dst(working_set);
  if (!src.ok() || !dst.ok() || !copy_dst.ok()) {
    fmt::print(stderr, "cannot map {} x 3\n", o.working_set);
    return 1;
  }
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = static_cast<std::byte>(i * 131);
  std::memset(dst.data(), 1, dst.size());
  std::memset(copy_dst.data(), 1, copy_dst.size());

  nlohmann::json out;
  out["date"] = fmt::format("{:%F}", fmt::localtime(std::time(nullptr)));
  out["working_set_bytes"] = working_set;
  out["batch_bytes"] = batch_bytes;
  out["iterations"] = o.iterations;
  fmt::print(
      "tierkv-bench host: working set {} per size, batches of {}, median of "
      "{}\n\n",
      o.working_set, o.batch, o.iterations);
  fmt::print("{:>8} {:>12} {:>12} {:>12} {:>10} {:>10} {:>16} {:>14} {:>18}\n",
             "segment", "memcpy GB/s", "put GB/s", "get GB/s", "put/memcpy",
             "get/memcpy", "fresh put/memcpy", "stream/memcpy",
             "get after gap/mem");

  uint32_t page_counter = 0;
  // Every namespace is opened before anything is timed, as an engine opens
  // its namespaces before serving: the daemon populates a namespace's index
  // on a worker once its layout is registered, and the client maps each
  // arena as it opens it.
  std::vector<LayoutSpec> layouts;
  std::vector<std::unique_ptr<Client>> warm_clients, fresh_clients;
  for (const SizeCase& sc : cases) {
    layouts.push_back(LayoutSpec::Uniform(64, 1, {{"kv", sc.bytes_per_token}}));
    warm_clients.push_back(connect("warm-" + sc.name, layouts.back()));
    fresh_clients.push_back(connect("fresh-" + sc.name, layouts.back()));
    if (!warm_clients.back() || !fresh_clients.back()) return 1;
  }
  for (size_t size_case = 0; size_case < cases.size(); ++size_case) {
    const size_t seg = layouts[size_case].SegmentBytes(0, 0);
    const size_t count = working_set / seg;
    const size_t per_batch = std::max<size_t>(1, batch_bytes / seg);
    Client* warm = warm_clients[size_case].get();
    Client* fresh = fresh_clients[size_case].get();
    std::vector<SegmentKey> keys;
    auto new_keys = [&] {
      keys.clear();
      for (size_t i = 0; i < count; ++i) {
        keys.push_back({PageHash{++page_counter, 0xbe9c4}, 0, 0});
      }
    };
    // Puts the working set under `keys`, batch by batch, back to back,
    // adding the time to *put_time.
    auto put_all = [&](Client& to, double* put_time) -> bool {
      std::vector<SegmentWrite> writes;
      for (size_t b = 0; b < count; b += per_batch) {
        const size_t end = std::min(count, b + per_batch);
        writes.clear();
        for (size_t i = b; i < end; ++i) {
          writes.push_back({keys[i], src.span().subspan(i * seg, seg)});
        }
        auto p0 = Clock::now();
        for (const PutResult& r : to.Put(writes)) {
          if (!r.ok()) {
            fmt::print(stderr, "put failed: {}\n", r.status.ToString());
            return false;
          }
        }
        *put_time += std::chrono::duration<double>(Clock::now() - p0).count();
      }
      return true;
    };
    // Seconds to copy segments [begin, end) one by one from src to
    // copy_dst; a whole pass is far larger than L3, so its source is cold.
    auto copy_range = [&](size_t begin, size_t end, bool stream) {
      auto c0 = Clock::now();
      for (size_t i = begin; i < end; ++i) {
        if (stream) {
          StreamCopy(copy_dst.data() + i * seg, src.data() + i * seg, seg);
        } else {
          std::memcpy(copy_dst.data() + i * seg, src.data() + i * seg, seg);
        }
      }
      return std::chrono::duration<double>(Clock::now() - c0).count();
    };
    auto copy_pass = [&](bool stream) { return copy_range(0, count, stream); };
    // Seconds one Get of segments [begin, end) into dst takes; -1 when a
    // segment fails.
    std::vector<SegmentRead> reads;
    auto get_range = [&](Client& from, size_t begin, size_t end) -> double {
      reads.clear();
      for (size_t i = begin; i < end; ++i) {
        reads.push_back({keys[i], dst.span().subspan(i * seg, seg)});
      }
      auto g0 = Clock::now();
      const std::vector<Status> statuses = from.Get(reads);
      const double t = std::chrono::duration<double>(Clock::now() - g0).count();
      for (const Status& st : statuses) {
        if (!st.ok()) {
          fmt::print(stderr, "get failed: {}\n", st.ToString());
          return -1;
        }
      }
      return t;
    };
    // Fresh: each pass writes arena pages no earlier pass wrote, Puts back
    // to back as in the warm case (so the arena's state is the only
    // difference), beside a memcpy pass (alternating which goes first).
    // A median of passes, as every other figure: one pass is ~15 ms at
    // 256 MiB, and one preemption (a kernel thread holding a core for ~2 ms
    // on the 2-core VM) moved a single pass's ratio by 0.15.
    std::vector<double> fresh_ratios, fresh_put_s;
    for (int it = 0; it < o.iterations; ++it) {
      double put_s = 0, memcpy_s = 0;
      new_keys();
      if (it % 2) memcpy_s = copy_pass(/*stream=*/false);
      if (!put_all(*fresh, &put_s)) return 1;
      if (it % 2 == 0) memcpy_s = copy_pass(/*stream=*/false);
      fresh_ratios.push_back(memcpy_s / put_s);
      fresh_put_s.push_back(put_s);
    }
    // Warm: two passes fill the arena; from then on every Put evicts one.
    for (int fill = 0; fill < 2; ++fill) {
      double untimed = 0;
      new_keys();
      if (!put_all(*warm, &untimed)) return 1;
    }
    Client& c = *warm;
    std::vector<double> memcpy_s, put_s, get_s;
    std::vector<double> get_pass_s, get_ratios;   // back to back
    for (int it = 0; it <= o.iterations; ++it) {  // iteration 0 warms up
      new_keys();
      double put_time = 0;
      if (!put_all(c, &put_time)) return 1;
      put_s.push_back(put_time);
      // memcpy and Get alternate batch by batch (and which goes first), so a
      // noisy moment on this machine hits both alike.
      double memcpy_time = 0, get_time = 0;
      for (size_t b = 0, n = 0; b < count; b += per_batch, ++n) {
        const size_t end = std::min(count, b + per_batch);
        if (n % 2) memcpy_time += copy_range(b, end, /*stream=*/false);
        const double t = get_range(c, b, end);
        if (t < 0) return 1;
        get_time += t;
        if (n % 2 == 0) memcpy_time += copy_range(b, end, /*stream=*/false);
      }
      memcpy_s.push_back(memcpy_time);
      get_s.push_back(get_time);
      if (std::memcmp(dst.data(), src.data(), count * seg) != 0) {
        fmt::print(stderr, "get returned different bytes\n");
        return 1;
      }
      // The same Gets back to back, as Puts run, beside a memcpy pass
      // (alternating which goes first). Interleaved with memcpy above,
      // each Get finds the daemon's IO thread asleep after ~0.35 ms of
      // copying: a cost of the gap, reported apart.
      std::memset(dst.data(), 0, count * seg);
      double pass_memcpy = 0, pass_get = 0;
      if (it % 2) pass_memcpy = copy_pass(/*stream=*/false);
      for (size_t b = 0; b < count; b += per_batch) {
        const double t = get_range(c, b, std::min(count, b + per_batch));
        if (t < 0) return 1;
        pass_get += t;
      }
      if (it % 2 == 0) pass_memcpy = copy_pass(/*stream=*/false);
      if (std::memcmp(dst.data(), src.data(), count * seg) != 0) {
        fmt::print(stderr, "get returned different bytes\n");
        return 1;
      }
      get_pass_s.push_back(pass_get);
      get_ratios.push_back(pass_memcpy / pass_get);
      if (it == 0) {
        memcpy_s.clear(), put_s.clear(), get_s.clear();
        get_pass_s.clear(), get_ratios.clear();
      }
    }
    // The streaming copy against memcpy, whole passes alternating which
    // goes first.
    std::vector<double> stream_ratios;
    for (int it = 0; it < o.iterations; ++it) {
      const bool stream_first = it % 2;
      const double first = copy_pass(stream_first);
      const double second = copy_pass(!stream_first);
      stream_ratios.push_back(stream_first ? second / first : first / second);
    }
    const double bytes = static_cast<double>(count * seg);
    const double mem = bytes / Median(memcpy_s) / 1e9;
    const double put = bytes / Median(put_s) / 1e9;
    const double get = bytes / Median(get_pass_s) / 1e9;
    const double get_ratio = Median(get_ratios);
    const double get_interleaved = bytes / Median(get_s) / 1e9;
    const double fresh_ratio = Median(fresh_ratios);
    const double stream_ratio = Median(stream_ratios);
    fmt::print(
        "{:>8} {:>12.2f} {:>12.2f} {:>12.2f} {:>10.2f} {:>10.2f} {:>16.2f} "
        "{:>14.2f} {:>18.2f}\n",
        cases[size_case].name, mem, put, get, put / mem, get_ratio, fresh_ratio,
        stream_ratio, get_interleaved / mem);
    out["sizes"][cases[size_case].name] = {
        {"segment_bytes", seg},
        {"segments_per_batch", per_batch},
        {"memcpy_gbps", mem},
        {"put_gbps", put},
        {"get_gbps", get},
        {"put_over_memcpy", put / mem},
        {"put_fresh_gbps", bytes / Median(fresh_put_s) / 1e9},
        {"put_fresh_over_memcpy", fresh_ratio},
        {"put_fresh_over_memcpy_passes", fresh_ratios},
        {"stream_over_memcpy", stream_ratio},
        {"get_over_memcpy", get_ratio},
        {"get_interleaved_gbps", get_interleaved},
        {"get_interleaved_over_memcpy", get_interleaved / mem}};
  }

  // Round-trip latency of Match for a page of one segment.
  auto mc = daemon.Connect("match", "match-token");
  if (!mc.ok() ||
      !(*mc)->RegisterLayout(LayoutSpec::Uniform(64, 1, {{"kv", 64}})).ok()) {
    fmt::print(stderr, "match namespace unavailable\n");
    return 1;
  }
  PageHash page{42, 42};
  std::vector<std::byte> tiny(64 * 64);
  SegmentWrite w{{page, 0, 0}, tiny};
  (void)(*mc)->Put(std::span(&w, 1));
  // Blocks of Match calls alternate with blocks of bare round trips
  // (blocking and polling), so a noisy minute of the VM hits all three.
  EchoPeer echo;
  if (!echo.ok()) {
    fmt::print(stderr, "cannot start the echo peer\n");
    return 1;
  }
  constexpr int kBlock = 500;
  std::vector<double> lat_us, socket_us, socket_spin_us;
  for (int done = -1000; done < o.match_calls; done += kBlock) {
    const bool warm_up = done < 0;  // the first 1000 of each are dropped
    for (int i = 0; i < kBlock; ++i) {
      auto t0 = Clock::now();
      auto m = (*mc)->Match(std::span(&page, 1));
      const double us =
          std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      if (!m.ok() || m->leading_pages != 1) {
        fmt::print(stderr, "match failed\n");
        return 1;
      }
      if (!warm_up) lat_us.push_back(us);
    }
    for (bool spin : {false, true}) {
      for (int i = 0; i < kBlock; ++i) {
        const double us = echo.RoundTripMicros(spin);
        if (us < 0) {
          fmt::print(stderr, "echo peer failed\n");
          return 1;
        }
        if (!warm_up) (spin ? socket_spin_us : socket_us).push_back(us);
      }
    }
  }
  const double p50 = Median(lat_us), p99 = Percentile(lat_us, 0.99);
  const double socket_p50 = Median(socket_us);
  const double socket_spin_p50 = Median(socket_spin_us);
  fmt::print(
      "\nmatch (1 segment, {} calls): p50 {:.1f} us, p99 {:.1f} us; bare Unix "
      "socket round trip p50 {:.1f} us blocking, {:.1f} us polling "
      "(match/socket {:.2f}, match/polling socket {:.2f})\n",
      lat_us.size(), p50, p99, socket_p50, socket_spin_p50, p50 / socket_p50,
      p50 / socket_spin_p50);
  out["match_latency_us"] = {
      {"calls", o.match_calls},
      {"p50", p50},
      {"p99", p99},
      {"socket_round_trip_p50", socket_p50},
      {"polling_socket_round_trip_p50", socket_spin_p50}};
  if (!o.json_path.empty()) {
    std::ofstream(o.json_path) << out.dump(2) << "\n";
    fmt::print("wrote {}\n", o.json_path);
  }
  return 0;
}

const bool kRegistered = RegisterBench([](CLI::App& app) {
  auto opts = std::make_shared<HostBenchOptions>();
  auto* sub = app.add_subcommand(
      "host", "Host-DRAM tier Put/Get throughput vs memcpy, and Match latency");
  sub->add_option("--working-set", opts->working_set, "bytes per segment size")
      ->capture_default_str();
  sub->add_option("--batch", opts->batch, "bytes per Put/Get call")
      ->capture_default_str();
  sub->add_option("--iterations", opts->iterations)->capture_default_str();
  sub->add_option("--match-calls", opts->match_calls)->capture_default_str();
  sub->add_option("--json", opts->json_path, "also write the figures here");
  sub->callback([opts] { SetExitCode(Run(*opts)); });
});

}  // namespace
}  // namespace tierkv::bench
