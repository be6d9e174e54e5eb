// `tierkv-bench hbm`: the HBM tier's data movement through DeviceBackend
// (storage/device/device_backend.h), each figure a ratio to a contiguous copy
// of the same bytes measured in the same run.
//
//   pages   host -> device and device -> host copies of whole pages (one
//           call per page, pages in random order from an arena twice the
//           size), from pinned (RegisterHost) and pageable host memory;
//           host -> device also as one CopyToDeviceBatch (the daemon's
//           path into device pools).
//   gather  per layer, `--rows` rows of `--row-bytes` picked at random from
//           a pinned (or pageable) arena of 64K rows, packed into a device
//           buffer by GatherRows (the sparse working set's miss path), for
//           `--layers` layers back to back.
//   device->device
//           the same pages copied pool to pool, one CopyOnDevice per page
//           and as one CopyOnDeviceBatch (the daemon's path for HBM-tier
//           hits into an engine's pool and admissions from it), against one
//           contiguous device-to-device copy of the same bytes.
//   wait    latency of a 4 KiB copy plus WaitEvent, against the same copy
//           detected by spinning on EventDone (the floor of completion
//           detection), median of --waits.
//   register
//           RegisterHost (CUDA: cudaHostRegister, pinning) of a fresh
//           --register-mib MiB buffer, per GiB, against a memset of the
//           same bytes (faulting them in).
//   reference
//           on CUDA: one CopyToDevice / CopyToHost of a contiguous pinned
//           buffer (cudaMemcpyAsync) of the same bytes per page set or
//           layer; on the emulated backend: std::memcpy on the calling
//           thread of the same bytes (pages: one contiguous copy; gather:
//           the same rows), i.e. what the emulation does minus its queue.
//
// Each figure is the median over `--rounds` rounds; a round submits every
// call of the case, records an event and waits for it.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/registry.h"
#include "bench/sample_stats.h"
#include "storage/device/device_backend.h"

namespace tierkv::bench {
namespace {

using storage::DeviceBackend;
using storage::DeviceRegion;

struct HbmBenchOptions {
  std::string backend = "auto";
  uint64_t page_bytes = 41984;  // 64 tokens x 656 B: a GLM-5 fp8 kv page
  uint32_t pages = 1024;
  uint32_t rows = 2048;  // DSA's top-k
  std::vector<uint32_t> row_bytes = {656, 1152};
  uint32_t layers = 78;  // GLM-5.2
  uint32_t rounds = 7;
  uint32_t waits = 2000;
  uint32_t register_mib = 1024;
  std::string json_path;
};

using Clock = std::chrono::steady_clock;

class HbmBench {
 public:
  HbmBench(DeviceBackend& b, const HbmBenchOptions& o) : b_(b), o_(o) {}

  int Run() {
    const uint64_t total = o_.page_bytes * o_.pages;
    auto pool = b_.AllocatePool(total);
    if (!pool.ok()) return Fail("pool", pool.status());
    pool_ = pool->id;
    // Arenas: pages at random slots of an arena twice the size.
    pinned_.assign(2 * total, std::byte{1});
    pageable_.assign(2 * total, std::byte{2});
    if (Status s = b_.RegisterHost(pinned_); !s.ok()) return Fail("pin", s);
    std::vector<uint32_t> slot(2 * o_.pages);
    std::iota(slot.begin(), slot.end(), 0u);
    std::shuffle(slot.begin(), slot.end(), std::mt19937(1));
    slot.resize(o_.pages);

    fmt::print(
        "hbm: backend {}, pages {} x {} B ({:.1f} MB), gather {} rows x {} "
        "layers, {} rounds (median)\n",
        b_.name(), o_.pages, o_.page_bytes, total / 1e6, o_.rows, o_.layers,
        o_.rounds);
    fmt::print("  {:<36} {:>10} {:>12} {:>10} {:>8}\n", "case", "MB", "GB/s",
               "ref GB/s", "ratio");

    const bool emulated = b_.name() == "emulated";
    auto contiguous = [&](bool to_device) {
      return Time(total, [&] {
        if (emulated) {
          if (to_device) {
            std::memcpy(scratch_.data(), pinned_.data(), total);
          } else {
            std::memcpy(pinned_.data(), scratch_.data(), total);
          }
          return Status::OK();
        }
        const DeviceRegion all{pool_, 0, total};
        return to_device
                   ? b_.CopyToDevice(0, all, std::span(pinned_).first(total))
                   : b_.CopyToHost(0, std::span(pinned_).first(total), all);
      });
    };
    if (emulated) scratch_.assign(total, std::byte{3});
    const double ref_h2d = contiguous(true), ref_d2h = contiguous(false);
    Report("reference host->device contiguous", total, ref_h2d, ref_h2d);
    Report("reference device->host contiguous", total, ref_d2h, ref_d2h);
    for (bool pin : {true, false}) {
      auto& arena = pin ? pinned_ : pageable_;
      const double h2d = Time(total, [&] {
        for (uint32_t i = 0; i < o_.pages; ++i) {
          TIERKV_RETURN_IF_ERROR(
              b_.CopyToDevice(0, {pool_, i * o_.page_bytes, o_.page_bytes},
                              std::span(arena).subspan(slot[i] * o_.page_bytes,
                                                       o_.page_bytes)));
        }
        return Status::OK();
      });
      Report(fmt::format("pages host->device {}", pin ? "pinned" : "pageable"),
             total, h2d, ref_h2d);
      // The daemon's path: a unit's pages as one CopyToDeviceBatch.
      std::vector<DeviceRegion> dsts;
      std::vector<std::span<const std::byte>> srcs;
      for (uint32_t i = 0; i < o_.pages; ++i) {
        dsts.push_back({pool_, i * o_.page_bytes, o_.page_bytes});
        srcs.push_back(
            std::span(arena).subspan(slot[i] * o_.page_bytes, o_.page_bytes));
      }
      const double batched =
          Time(total, [&] { return b_.CopyToDeviceBatch(0, dsts, srcs); });
      Report(fmt::format("pages host->device {} batched",
                         pin ? "pinned" : "pageable"),
             total, batched, ref_h2d);
      const double d2h = Time(total, [&] {
        for (uint32_t i = 0; i < o_.pages; ++i) {
          TIERKV_RETURN_IF_ERROR(b_.CopyToHost(
              0,
              std::span(arena).subspan(slot[i] * o_.page_bytes, o_.page_bytes),
              {pool_, i * o_.page_bytes, o_.page_bytes}));
        }
        return Status::OK();
      });
      Report(fmt::format("pages device->host {}", pin ? "pinned" : "pageable"),
             total, d2h, ref_d2h);
    }
    DeviceToDevice(total, slot);
    for (uint32_t row_bytes : o_.row_bytes) Gather(row_bytes);
    WaitLatency();
    Registration();
    if (Status s = b_.UnregisterHost(pinned_.data()); !s.ok()) {
      return Fail("unpin", s);
    }
    if (Status s = b_.FreePool(pool_); !s.ok()) return Fail("free", s);
    if (!o_.json_path.empty()) {
      nlohmann::json out = {{"bench", "hbm"},
                            {"backend", b_.name()},
                            {"page_bytes", o_.page_bytes},
                            {"pages", o_.pages},
                            {"rows", o_.rows},
                            {"layers", o_.layers},
                            {"rounds", o_.rounds},
                            {"cases", cases_}};
      std::ofstream(o_.json_path) << out.dump(2) << "\n";
      fmt::print("wrote {}\n", o_.json_path);
    }
    return failed_ ? 1 : 0;
  }

 private:
  void Gather(uint32_t row_bytes) {
    constexpr uint32_t kArenaRows = 65536;
    const uint64_t layer_bytes = uint64_t{row_bytes} * o_.rows;
    if (layer_bytes > o_.page_bytes * o_.pages) {
      fmt::print("  gather of {} B rows skipped: {} B > the pool\n", row_bytes,
                 layer_bytes);
      return;
    }
    std::vector<std::byte> pinned(uint64_t{row_bytes} * kArenaRows,
                                  std::byte{4});
    std::vector<std::byte> pageable(pinned.size(), std::byte{5});
    if (Status s = b_.RegisterHost(pinned); !s.ok()) {
      Fail("pin rows", s);
      return;
    }
    // A fresh random pick per layer, as every layer's selection differs.
    std::mt19937 rng(row_bytes);
    std::vector<std::vector<uint32_t>> picks(o_.layers);
    for (auto& pick : picks) {
      pick.resize(kArenaRows);
      std::iota(pick.begin(), pick.end(), 0u);
      std::shuffle(pick.begin(), pick.end(), rng);
      pick.resize(o_.rows);
    }
    const uint64_t bytes = layer_bytes * o_.layers;
    const DeviceRegion dst{pool_, 0, layer_bytes};
    const bool emulated = b_.name() == "emulated";
    // Emulated: the same rows memcpy'd on this thread (a contiguous copy
    // of 1-2 MB from one place would run from the CPU cache).
    const double ref = Time(bytes, [&] {
      for (uint32_t l = 0; l < o_.layers; ++l) {
        if (emulated) {
          std::byte* out = scratch_.data();
          for (uint32_t r : picks[l]) {
            std::memcpy(out, pinned.data() + uint64_t{r} * row_bytes,
                        row_bytes);
            out += row_bytes;
          }
        } else {
          TIERKV_RETURN_IF_ERROR(
              b_.CopyToDevice(0, dst, std::span(pinned).first(layer_bytes)));
        }
      }
      return Status::OK();
    });
    Report(fmt::format("reference {}-B rows {}", row_bytes,
                       emulated ? "memcpy'd" : "contiguous"),
           bytes, ref, ref);
    for (bool pin : {true, false}) {
      const auto& arena = pin ? pinned : pageable;
      std::vector<std::vector<const std::byte*>> rows(o_.layers);
      for (uint32_t l = 0; l < o_.layers; ++l) {
        for (uint32_t r : picks[l]) {
          rows[l].push_back(arena.data() + uint64_t{r} * row_bytes);
        }
      }
      const double t = Time(bytes, [&] {
        for (uint32_t l = 0; l < o_.layers; ++l) {
          TIERKV_RETURN_IF_ERROR(b_.GatherRows(0, dst, rows[l], row_bytes));
        }
        return Status::OK();
      });
      Report(fmt::format("gather {}-B rows {}", row_bytes,
                         pin ? "pinned" : "pageable"),
             bytes, t, ref);
    }
    if (Status s = b_.UnregisterHost(pinned.data()); !s.ok()) {
      Fail("unpin rows", s);
    }
  }

  // Pages pool to pool, as the HBM tier serves a hit into an engine's
  // pool, against one contiguous device-to-device copy.
  void DeviceToDevice(uint64_t total, const std::vector<uint32_t>& slot) {
    auto from = b_.AllocatePool(2 * total);
    if (!from.ok()) {
      Fail("device->device pool", from.status());
      return;
    }
    const double ref = Time(total, [&] {
      return b_.CopyOnDevice(0, {pool_, 0, total}, {from->id, 0, total});
    });
    Report("reference device->device contiguous", total, ref, ref);
    const double t = Time(total, [&] {
      for (uint32_t i = 0; i < o_.pages; ++i) {
        TIERKV_RETURN_IF_ERROR(b_.CopyOnDevice(
            0, {pool_, i * o_.page_bytes, o_.page_bytes},
            {from->id, slot[i] * o_.page_bytes, o_.page_bytes}));
      }
      return Status::OK();
    });
    Report("pages device->device", total, t, ref);
    // The daemon's path for HBM hits and admissions: one CopyOnDeviceBatch.
    std::vector<DeviceRegion> dsts, srcs;
    for (uint32_t i = 0; i < o_.pages; ++i) {
      dsts.push_back({pool_, i * o_.page_bytes, o_.page_bytes});
      srcs.push_back({from->id, slot[i] * o_.page_bytes, o_.page_bytes});
    }
    const double batched =
        Time(total, [&] { return b_.CopyOnDeviceBatch(0, dsts, srcs); });
    Report("pages device->device batched", total, batched, ref);
    if (Status s = b_.FreePool(from->id); !s.ok()) Fail("free", s);
  }

  // A 4 KiB copy and WaitEvent, against the same copy detected by spinning
  // on EventDone: what the wait's sleeping adds to a layer's latency.
  void WaitLatency() {
    const uint64_t bytes = 4096;
    auto one = [&](bool spin) -> double {
      const auto t0 = Clock::now();
      Status s = b_.CopyToDevice(0, {pool_, 0, bytes},
                                 std::span(pinned_).first(bytes));
      auto e = s.ok() ? b_.RecordEvent(0) : Result<storage::DeviceEvent>(s);
      if (!e.ok()) return -1;
      if (spin) {
        while (!b_.EventDone(*e)) {
        }
      } else if (!b_.WaitEvent(*e, std::chrono::seconds(10)).ok()) {
        return -1;
      }
      return std::chrono::duration<double, std::micro>(Clock::now() - t0)
          .count();
    };
    std::vector<double> waited, spun;
    for (uint32_t i = 0; i < o_.waits; ++i) {
      const double w = one(false), p = one(true);
      if (w < 0 || p < 0) {
        Fail("wait latency", Status::IOError("a 4 KiB copy failed"));
        return;
      }
      waited.push_back(w);
      spun.push_back(p);
    }
    ReportLatency("wait 4 KiB copy + WaitEvent, us", Median(waited),
                  Median(spun));
  }

  // Pinning a fresh buffer, per GiB, against faulting it in with memset.
  void Registration() {
    const uint64_t bytes = uint64_t{o_.register_mib} << 20;
    // Not yet touched, so both the pinning and the memset fault them in.
    auto first = std::make_unique_for_overwrite<std::byte[]>(bytes);
    auto second = std::make_unique_for_overwrite<std::byte[]>(bytes);
    const auto t0 = Clock::now();
    std::memset(second.get(), 7, bytes);
    const double touch =
        std::chrono::duration<double>(Clock::now() - t0).count();
    const auto t1 = Clock::now();
    Status s = b_.RegisterHost({first.get(), bytes});
    const double pin = std::chrono::duration<double>(Clock::now() - t1).count();
    if (!s.ok()) {
      Fail("register", s);
      return;
    }
    if (Status u = b_.UnregisterHost(first.get()); !u.ok()) {
      Fail("unregister", u);
    }
    const double gib = static_cast<double>(bytes) / (1 << 30);
    ReportLatency(fmt::format("register {} MiB, ms per GiB", o_.register_mib),
                  pin / gib * 1e3, touch / gib * 1e3);
  }

  // A latency case: `value` against `reference` (same unit; lower is
  // better), ratio = reference / value as for bandwidths (1 is the floor).
  void ReportLatency(const std::string& name, double value, double reference) {
    if (value <= 0 || reference <= 0) return;
    fmt::print("  {:<36} {:>10} {:>12.2f} {:>10.2f} {:>7.2f}x\n", name, "",
               value, reference, reference / value);
    cases_.push_back({{"case", name},
                      {"value", value},
                      {"reference", reference},
                      {"ratio", reference / value}});
  }

  // Median seconds of `rounds` rounds of `submit` + an event wait; -1 on
  // an error (reported).
  template <typename Submit>
  double Time(uint64_t bytes, Submit submit) {
    std::vector<double> seconds;
    for (uint32_t r = 0; r < o_.rounds + 1; ++r) {  // round 0 warms up
      const auto t0 = Clock::now();
      Status s = submit();
      if (s.ok()) {
        auto e = b_.RecordEvent(0);
        s = e.ok() ? b_.WaitEvent(*e, std::chrono::minutes(1)) : e.status();
      }
      if (!s.ok()) {
        Fail(fmt::format("a round of {} bytes", bytes), s);
        return -1;
      }
      if (r > 0) {
        seconds.push_back(
            std::chrono::duration<double>(Clock::now() - t0).count());
      }
    }
    return Median(seconds);
  }

  void Report(const std::string& name, uint64_t bytes, double seconds,
              double ref_seconds) {
    if (seconds <= 0 || ref_seconds <= 0) return;
    const double gbps = bytes / seconds / 1e9;
    const double ref_gbps = bytes / ref_seconds / 1e9;
    fmt::print("  {:<36} {:>10.1f} {:>12.2f} {:>10.2f} {:>7.2f}x\n", name,
               bytes / 1e6, gbps, ref_gbps, gbps / ref_gbps);
    cases_.push_back({{"case", name},
                      {"bytes", bytes},
                      {"seconds", seconds},
                      {"gbps", gbps},
                      {"reference_gbps", ref_gbps},
                      {"ratio", gbps / ref_gbps}});
  }

  int Fail(const std::string& what, const Status& s) {
    fmt::print(stderr, "hbm bench: {}: {}\n", what, s.ToString());
    failed_ = true;
    return 1;
  }

  DeviceBackend& b_;
  const HbmBenchOptions& o_;
  uint32_t pool_ = 0;
  std::vector<std::byte> pinned_, pageable_, scratch_;
  nlohmann::json cases_ = nlohmann::json::array();
  bool failed_ = false;
};

int Run(const HbmBenchOptions& o) {
  auto kind = storage::ParseDeviceBackendKind(o.backend);
  if (!kind.ok()) {
    fmt::print(stderr, "hbm bench: {}\n", kind.status().ToString());
    return 2;
  }
  std::string fell_back;
  storage::DeviceBackendOptions options{.kind = *kind, .streams = 1};
  options.emulated_capacity_bytes = uint64_t{4} << 30;
  auto backend = DeviceBackend::Open(options, &fell_back);
  if (!backend.ok()) {
    fmt::print(stderr, "hbm bench: {}\n", backend.status().ToString());
    return 1;
  }
  if (!fell_back.empty()) fmt::print("hbm: {}\n", fell_back);
  return HbmBench(**backend, o).Run();
}

const bool kRegistered = RegisterBench([](CLI::App& app) {
  auto opts = std::make_shared<HbmBenchOptions>();
  auto* sub = app.add_subcommand(
      "hbm",
      "HBM tier copies and row gather through DeviceBackend, as ratios to a "
      "contiguous pinned copy (CUDA) or memcpy (emulated)");
  sub->add_option("--backend", opts->backend, "auto | cuda | emulated")
      ->capture_default_str();
  sub->add_option("--page-bytes", opts->page_bytes)->capture_default_str();
  sub->add_option("--pages", opts->pages)->capture_default_str();
  sub->add_option("--rows", opts->rows, "rows gathered per layer")
      ->capture_default_str();
  sub->add_option("--row-bytes", opts->row_bytes)->capture_default_str();
  sub->add_option("--layers", opts->layers)->capture_default_str();
  sub->add_option("--rounds", opts->rounds)->capture_default_str();
  sub->add_option("--waits", opts->waits, "4 KiB copies timed for WaitEvent")
      ->capture_default_str();
  sub->add_option("--register-mib", opts->register_mib,
                  "host buffer pinned for the registration time")
      ->capture_default_str();
  sub->add_option("--json", opts->json_path, "also write the figures here");
  sub->callback([opts] { SetExitCode(Run(*opts)); });
});

}  // namespace
}  // namespace tierkv::bench
