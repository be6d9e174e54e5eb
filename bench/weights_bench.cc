// `tierkv-bench weights`: model weights through a real tierkvd (issue 28,
// item 6), every figure a ratio to a peer measured in the same run:
//   import - ImportSafetensors of checkpoint A (chunking, hashing, the Put
//            into DRAM and the write-through to NVMe) against fio writing
//            the same bytes (O_DIRECT, 1 MiB, QD 32);
//   cold   - a load of A right after a daemon restart (every chunk on NVMe
//            only) into the engine's image (--target) against fio reading
//            the same bytes (A's extents of the daemon's NVMe file, while no
//            daemon runs; O_DIRECT, 1 MiB, QD 32);
//   warm   - a load of A from DRAM against one memcpy of the same image
//            (the physical peer) and against the naive loader:
//            safetensors.numpy.load_file of A's files from a cold page cache
//            (--python; skipped when it cannot import safetensors) or, as a
//            stand-in, pread() of the files plus a copy into the pool;
//   switch - a teacher-switching loop A, B, A, ... with a paced per-layer
//            "forward" that reads each layer once it is in place: the stall a
//            switch adds with no hints (load, then run), with hints
//            (HintWeights: the next model's next use is when this forward
//            ends, the running one's after that, so the daemon promotes the
//            next one while the current one runs)
//            and with hints in layer order (the forward starts each layer
//            when its WaitLayer returns), against the warm load time; and
//            when layer 0 of the next model was usable.
// Where the loads land (--target): "device", an emulated device pool (the
// [hbm] backend "emulated": device memory is this process's host memory)
// registered as the connection's image pool and filled by the daemon
// (LoadWeightsToPool: its Load machinery, its device copies); "memfd", the
// same with a memfd image pool; "buffer", a host buffer this process fills
// with Gets (LoadWeights).
// Checkpoints are synthetic (seeded bytes stored as F16, which numpy can
// load, unlike BF16; GLM-like names, `--layers` layers); B shares every even
// layer's tensors with A byte for byte. The weights namespace's DRAM
// (--dram-bytes) is smaller than A and B together, so switching really goes to
// NVMe when not prefetched. CPU seconds per GB count this process and the
// daemon.
#include <fcntl.h>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/fio_runner.h"
#include "bench/registry.h"
#include "bench/sample_stats.h"
#include "bench/size_option.h"
#include "common/safetensors.h"
#include "storage/device/device_backend.h"
#include "storage/nvme/nvme_catalog.h"
#include "tests/testing/daemon_process.h"
#include "tierkv/client.h"
#include "tierkv/weights.h"

namespace tierkv::bench {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string GiB(uint64_t bytes) {
  return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1ull << 30));
}

struct WeightsBenchOptions {
  std::string model_bytes = "1GiB";  // per checkpoint
  int layers = 32;
  std::string dram_bytes;  // the weights namespace's DRAM; default 1.25x model
  int iterations = 3;
  int switches = 6;
  double forward_s = 0;  // paced forward per model; default 1.5x warm load
  std::string fio = "/usr/bin/fio";
  std::string python = "/usr/bin/python3";
  std::string dir;                // default: a temp dir
  std::string target = "device";  // where loads land: device, memfd, buffer
  std::string staging_bytes;      // the daemon's [hbm] staging_bytes
  // Which figures after the import (always run: it makes the checkpoints).
  std::string cases = "cold,warm,switch";
  std::string json;
};

// The engine's weights buffer the loads fill (--target; see the top).
class ImageTarget {
 public:
  static Result<std::unique_ptr<ImageTarget>> Create(const std::string& kind,
                                                     uint64_t bytes) {
    auto t = std::unique_ptr<ImageTarget>(new ImageTarget(kind, bytes));
    if (kind == "buffer") {
      t->buffer_.resize(bytes);
      t->base_ = t->buffer_.data();
    } else if (kind == "memfd") {
      t->fd_ = ::memfd_create("image", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      if (t->fd_ < 0 || ::ftruncate(t->fd_, static_cast<off_t>(bytes)) != 0) {
        return Status::IOError("memfd for the image");
      }
      void* base =
          ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, t->fd_, 0);
      if (base == MAP_FAILED) return Status::IOError("mmap of the image");
      t->base_ = static_cast<std::byte*>(base);
    } else if (kind == "device") {
      auto backend = storage::DeviceBackend::Open(
          {.kind = storage::DeviceBackendKind::kEmulated,
           .emulated_capacity_bytes = bytes});
      if (!backend.ok()) return backend.status();
      t->device_ = std::move(backend).value();
      auto pool = t->device_->AllocatePool(bytes);
      if (!pool.ok()) return pool.status();
      t->pool_ = pool->id;
      auto base = t->device_->PoolBase(t->pool_);
      if (!base.ok()) return base.status();
      t->base_ = *base;
    } else {
      return Status::InvalidArgument(fmt::format(
          "--target must be device, memfd or buffer, not '{}'", kind));
    }
    std::memset(t->base_, 1, bytes);  // prefault, as an engine's buffer is
    return t;
  }
  ~ImageTarget() {
    if (fd_ >= 0) {
      ::munmap(base_, bytes_);
      ::close(fd_);
    }
  }

  // What a forward reads.
  std::span<std::byte> bytes() const { return {base_, bytes_}; }
  // Registers the image pool on `c` (pools are per connection: again after
  // every restart); nothing for a buffer.
  Status Register(Client& c) const {
    if (kind_ == "memfd") {
      return c.RegisterPool({.kind = PoolSpec::Kind::kMemfd,
                             .fd = fd_,
                             .slot_bytes = bytes_,
                             .slot_count = 1});
    }
    if (kind_ == "device") {
      auto handle = device_->ExportPool(pool_);
      if (!handle.ok()) return handle.status();
      return c.RegisterPool({.kind = PoolSpec::Kind::kDeviceIpc,
                             .device_handle = handle->bytes,
                             .device_pool_bytes = handle->pool_bytes,
                             .device_uuid = device_->uuid(),
                             .slot_bytes = bytes_,
                             .slot_count = 1});
    }
    return Status::OK();
  }
  Result<WeightsLoad> Load(Client& c, const WeightsManifest& m) const {
    if (kind_ == "buffer") return c.LoadWeights(m, bytes());
    return c.LoadWeightsToPool(m);
  }
  bool device() const { return kind_ == "device"; }

 private:
  ImageTarget(std::string kind, uint64_t bytes)
      : kind_(std::move(kind)), bytes_(bytes) {}
  const std::string kind_;
  const uint64_t bytes_;
  std::byte* base_ = nullptr;
  std::vector<std::byte> buffer_;                   // buffer
  int fd_ = -1;                                     // memfd
  std::unique_ptr<storage::DeviceBackend> device_;  // device
  uint32_t pool_ = 0;
};

// One synthetic checkpoint's tensors: per layer two large matrices and
// three small vectors, named as GLM's; layer 0 also holds the embedding
// and the last layer the head.
std::vector<TensorSpec> CheckpointTensors(uint64_t model_bytes, int layers) {
  const uint64_t per_layer = model_bytes / static_cast<uint64_t>(layers);
  const uint64_t small = 16 << 10;  // norms: 16 KiB each
  const uint64_t large = (per_layer - 3 * small) / 2 / 4096 * 4096;
  std::vector<TensorSpec> t;
  for (int l = 0; l < layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    for (const char* n :
         {"input_layernorm.weight", "post_attention_layernorm.weight",
          "self_attn.kv_a_layernorm.weight"}) {
      t.push_back({p + n, "F16", {static_cast<int64_t>(small / 2)}, small});
    }
    for (const char* n :
         {"self_attn.q_b_proj.weight", "mlp.down_proj.weight"}) {
      t.push_back({p + n,
                   "F16",
                   {static_cast<int64_t>(large / 2 / 4096), 4096},
                   large});
    }
  }
  return t;
}

// Seeded bytes of tensor `index` of model `which` (0: A, 1: B); B's even
// layers equal A's (5 tensors per layer).
void FillTensor(int which, size_t index, std::span<std::byte> out) {
  const int layer = static_cast<int>(index / 5);
  const int source = (which == 1 && layer % 2 == 0) ? 0 : which;
  std::mt19937_64 rng(0x7e5f0000ull + 1000003ull * index + 7ull * source);
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(out.data() + i, &v, 8);
  }
  for (; i < out.size(); ++i) out[i] = static_cast<std::byte>(rng());
}

// CPU seconds (user + system) of this process and of `pid` so far.
double CpuSeconds(pid_t pid) {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto tv = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  double s = tv(u.ru_utime) + tv(u.ru_stime);
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  std::getline(stat, line);
  const size_t close = line.rfind(')');
  if (close != std::string::npos) {
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    uint64_t utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) utime = std::stoull(field);
      if (i == 15) stime = std::stoull(field);
    }
    s += static_cast<double>(utime + stime) /
         static_cast<double>(::sysconf(_SC_CLK_TCK));
  }
  return s;
}

// Drops `path`'s pages from the page cache (so a "cold" read is one).
void DropCache(const fs::path& path) {
  for (const auto& e : fs::is_directory(path)
                           ? std::vector<fs::path>{fs::directory_iterator(path),
                                                   fs::directory_iterator()}
                           : std::vector<fs::path>{path}) {
    const int fd = ::open(e.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// The naive loader's time for `file`: safetensors.numpy.load_file with a
// cold page cache, or -1 when `python` cannot import it.
double SafetensorsPythonSeconds(const std::string& python,
                                const fs::path& file) {
  DropCache(file);
  const std::string cmd = fmt::format(
      "{} -c 'import time, safetensors.numpy as s; t = time.perf_counter(); "
      "d = s.load_file(\"{}\"); print(time.perf_counter() - t)' 2>/dev/null",
      python, file.string());
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[128] = {};
  const bool got = std::fgets(buf, sizeof(buf), p) != nullptr;
  const int rc = ::pclose(p);
  if (!got || rc != 0) return -1;
  return std::atof(buf);
}

// The stand-in naive loader: read() the whole file (cold), then copy every
// tensor into the pool.
Result<double> PreadLoadSeconds(const fs::path& file,
                                std::span<std::byte> pool) {
  DropCache(file);
  const auto t0 = Clock::now();
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IOError("open " + file.string());
  std::vector<std::byte> buf(fs::file_size(file));
  size_t done = 0;
  while (done < buf.size()) {
    const ssize_t n = ::read(fd, buf.data() + done, buf.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  std::memcpy(pool.data(), buf.data(), std::min(pool.size(), buf.size()));
  return Seconds(t0, Clock::now());
}

// One memcpy of `src` into `dst`, timed after an untimed one (so neither
// buffer's first touch or a cold TLB is in the figure).
double MemcpySeconds(std::span<std::byte> dst, std::span<const std::byte> src) {
  const size_t n = std::min(dst.size(), src.size());
  std::memcpy(dst.data(), src.data(), n);
  const auto t0 = Clock::now();
  std::memcpy(dst.data(), src.data(), n);
  return Seconds(t0, Clock::now());
}

// Reads every byte of layer `layer` of the image once (the paced forward's
// use of a layer), returning a value so the reads are not optimized away.
uint64_t TouchLayer(const WeightsManifest& m, std::span<const std::byte> image,
                    uint32_t layer) {
  uint64_t sum = 0;
  const auto [first, last] = m.ChunksOfLayer(layer);
  for (size_t c = first; c < last; ++c) {
    const auto& chunk = m.chunks[c];
    for (uint64_t i = 0; i < chunk.bytes; i += 64) {
      uint64_t v;
      std::memcpy(&v, image.data() + chunk.offset + i, sizeof(v));
      sum += v;
    }
  }
  return sum;
}

// Runs `seconds` of the paced forward over every layer, calling
// `before_layer(l)` first (the layer-ordered mode waits there); returns
// the seconds spent inside before_layer.
template <typename BeforeLayer>
double PacedForward(const WeightsManifest& m, std::span<const std::byte> image,
                    double seconds, BeforeLayer before_layer, uint64_t* sink) {
  double waited = 0;
  const double per_layer = seconds / m.num_layers;
  for (uint32_t l = 0; l < m.num_layers; ++l) {
    const auto w0 = Clock::now();
    before_layer(l);
    const auto w1 = Clock::now();
    waited += Seconds(w0, w1);
    *sink += TouchLayer(m, image, l);
    while (Seconds(w1, Clock::now()) < per_layer) {
    }
  }
  return waited;
}

// Brings `m` whole into DRAM: one client-side load into `scratch` (its
// Gets promote every chunk they read from NVMe before they answer), then
// checks that every chunk is in DRAM.
Status WarmInDram(Client& c, const WeightsManifest& m,
                  std::span<std::byte> scratch) {
  auto load = c.LoadWeights(m, scratch);
  if (!load.ok()) return load.status();
  TIERKV_RETURN_IF_ERROR(load->Wait());
  auto list = c.ListWeights(m.model);
  if (!list.ok()) return list.status();
  for (const WeightsInfo& info : *list) {
    if (info.id.version != WeightsVersionOf(m)) continue;
    if (info.chunks_in_dram == info.chunks) return Status::OK();
    return Status::ResourceExhausted(
        fmt::format("{} has {} of {} chunks in DRAM after a load: DRAM is "
                    "too small for a warm load",
                    m.model, info.chunks_in_dram, info.chunks));
  }
  return Status::NotFound(m.model + " is not sealed");
}

// Where shard `m`'s chunks lie in the daemon's NVMe file (its catalog,
// read while the daemon is stopped), as [offset, end) ranges in file order,
// adjacent extents merged. The cold load's fio peer reads exactly these
// bytes: this VM's virtual disk reads some regions of a file at twice the
// speed of others, so fio over another file measures another disk.
Result<std::vector<std::pair<uint64_t, uint64_t>>> ShardExtents(
    const fs::path& nvme_file, const WeightsManifest& m) {
  auto catalog =
      storage::NvmeCatalog::Open({.path = nvme_file.string() + ".catalog"});
  if (!catalog.ok()) return catalog.status();
  auto ns = (*catalog)->FindNamespace("weights");
  if (!ns.ok()) return ns.status();
  std::map<SegmentKey, uint64_t> wanted;
  for (const WeightsChunk& c : m.chunks) wanted[WeightsChunkSegment(c.key)] = 0;
  std::vector<std::pair<uint64_t, uint64_t>> extents;
  auto scan = (*catalog)->ForEach(
      [&](uint32_t id, const SegmentKey& key, const storage::CatalogEntry& e) {
        if (id == *ns && wanted.contains(key)) {
          extents.emplace_back(e.offset, e.offset + e.length);
        }
      });
  if (!scan.ok()) return scan.status();
  if (extents.size() != wanted.size()) {
    return Status::Internal(
        fmt::format("{} of {} distinct chunks of {} are on NVMe",
                    extents.size(), wanted.size(), m.model));
  }
  std::sort(extents.begin(), extents.end());
  std::vector<std::pair<uint64_t, uint64_t>> merged;
  for (const auto& [a, b] : extents) {
    // Block-rounded: extents start on blocks, lengths are exact.
    if (!merged.empty() && a <= (merged.back().second + 4095) / 4096 * 4096) {
      merged.back().second = std::max(merged.back().second, b);
    } else {
      merged.emplace_back(a, b);
    }
  }
  return merged;
}

int Run(const WeightsBenchOptions& o) {
  auto fail = [](const Status& s) {
    fmt::print(stderr, "tierkv-bench weights: {}\n", s.ToString());
    return 1;
  };
  auto model_bytes = ParseSizeOption("--model-bytes", o.model_bytes);
  if (!model_bytes.ok()) return fail(model_bytes.status());
  if (o.layers < 2 || o.layers > 1024) {
    return fail(Status::InvalidArgument("--layers must be in [2, 1024]"));
  }
  // 1.25x a checkpoint, and at least what a weights namespace needs to
  // promote its largest chunks (the daemon refuses less).
  uint64_t dram =
      std::max(*model_bytes + *model_bytes / 4, uint64_t{256} << 20);
  if (!o.dram_bytes.empty()) {
    auto d = ParseSizeOption("--dram-bytes", o.dram_bytes);
    if (!d.ok()) return fail(d.status());
    dram = *d;
  }
  testing::DaemonProcess daemon;
  const fs::path dir = o.dir.empty() ? daemon.dir().path() : fs::path(o.dir);
  fs::create_directories(dir / "a");
  fs::create_directories(dir / "b");

  // Fixtures.
  const auto tensors = CheckpointTensors(*model_bytes, o.layers);
  for (int which = 0; which < 2; ++which) {
    const fs::path file = dir / (which == 0 ? "a" : "b") / "model.safetensors";
    Status s = WriteSafetensors(file, tensors,
                                [which](size_t i, std::span<std::byte> out) {
                                  FillTensor(which, i, out);
                                  return Status::OK();
                                });
    if (!s.ok()) return fail(s);
  }
  uint64_t image_estimate = 0;
  for (const auto& t : tensors) image_estimate += t.nbytes;

  if (o.target != "device" && o.target != "memfd" && o.target != "buffer") {
    return fail(Status::InvalidArgument(fmt::format(
        "--target must be device, memfd or buffer, not '{}'", o.target)));
  }
  bool run_cold = false, run_warm = false, run_switch = false;
  {
    std::stringstream list(o.cases);
    for (std::string c; std::getline(list, c, ',');) {
      bool* flag = c == "cold"     ? &run_cold
                   : c == "warm"   ? &run_warm
                   : c == "switch" ? &run_switch
                                   : nullptr;
      if (flag == nullptr) {
        return fail(Status::InvalidArgument(
            fmt::format("--cases takes cold, warm and switch, not '{}'", c)));
      }
      *flag = true;
    }
    // A switch's stall is a ratio to the warm load.
    if (run_switch && !run_warm) {
      return fail(Status::InvalidArgument("--cases switch needs warm"));
    }
  }
  std::string config = fmt::format(
      "[[namespace]]\nname = \"weights\"\ntoken = \"bench-token\"\n"
      "weights = true\nhost_bytes = {}\nshards = 8\n"
      "[nvme]\npath = \"{}/nvme.data\"\ncapacity_bytes = {}\n",
      dram, dir.string(), 4 * *model_bytes);
  // The daemon imports device pools with its [hbm] backend (its HBM tier
  // holds KV only; weights go to the engine's image).
  if (o.target == "device") {
    config += "[hbm]\nbackend = \"emulated\"\ncapacity_bytes = \"64MiB\"\n";
    if (!o.staging_bytes.empty()) {
      auto staging = ParseSizeOption("--staging-bytes", o.staging_bytes);
      if (!staging.ok()) return fail(staging.status());
      config += fmt::format("staging_bytes = {}\n", *staging);
    }
  }
  std::unique_ptr<ImageTarget> target;
  auto start = [&]() -> Result<std::unique_ptr<Client>> {
    TIERKV_RETURN_IF_ERROR(
        daemon.Start({.config_toml = config,
                      .extra_args = {"--io-threads", "2"},
                      .ready_timeout = std::chrono::milliseconds(120000)}));
    auto c = daemon.Connect("weights", "bench-token");
    if (c.ok() && target) TIERKV_RETURN_IF_ERROR(target->Register(**c));
    return c;
  };
  auto client = start();
  if (!client.ok()) return fail(client.status());

  nlohmann::json out;
  auto finish = [&] {
    if (!o.json.empty()) {
      std::ofstream(o.json) << out.dump(2) << "\n";
      fmt::print("wrote {}\n", o.json);
    }
    return 0;
  };
  out["date"] = fmt::format("{:%F %T}", fmt::gmtime(std::time(nullptr)));
  out["model_bytes"] = *model_bytes;
  out["layers"] = o.layers;
  out["dram_bytes"] = dram;
  fmt::print(
      "tierkv-bench weights: 2 checkpoints of {} ({} layers; B shares the "
      "even layers with A), weights DRAM {}, NVMe file in {}; loads into {}\n",
      GiB(*model_bytes), o.layers, GiB(dram), dir.string(),
      o.target == "device" ? "an emulated device image pool (the daemon copies)"
      : o.target == "memfd" ? "a memfd image pool (the daemon copies)"
                            : "a host buffer (this process copies)");

  // 1. Import, against fio writing the same bytes.
  const double cpu0 = CpuSeconds(daemon.pid());
  const auto i0 = Clock::now();
  auto a = ImportSafetensors(**client, "bench-a", "bench/bf16/rank0-of-1",
                             dir / "a" / "model.safetensors");
  const double import_s = Seconds(i0, Clock::now());
  const double import_cpu = CpuSeconds(daemon.pid()) - cpu0;
  if (!a.ok()) return fail(a.status());
  auto b = ImportSafetensors(**client, "bench-b", "bench/bf16/rank0-of-1",
                             dir / "b" / "model.safetensors");
  if (!b.ok()) return fail(b.status());
  const uint64_t image = a->image_bytes;
  auto fio_write = RunFio(o.fio, dir.string(),
                          FioArgs((dir / "fio.data").string(), image, 1 << 20,
                                  32, image, 600, "write"),
                          "write");
  if (!fio_write.ok()) return fail(fio_write.status());
  const double import_gbps = image / import_s / 1e9;
  fmt::print(
      "import A: {:.2f} GB/s ({:.2f} CPU-s/GB); fio write {:.2f} GB/s; "
      "ratio {:.2f}\n",
      import_gbps, import_cpu / (image / 1e9), fio_write->gbps,
      import_gbps / fio_write->gbps);
  out["import"] = {{"gbps", import_gbps},
                   {"cpu_s_per_gb", import_cpu / (image / 1e9)},
                   {"fio_write_gbps", fio_write->gbps},
                   {"ratio", import_gbps / fio_write->gbps}};

  // Dedup: stored bytes = unique chunk bytes of A and B.
  {
    auto list = (*client)->ListWeights();
    if (!list.ok()) return fail(list.status());
    std::map<PageHash, uint64_t> unique;
    for (const auto* m : {&*a, &*b}) {
      for (const auto& c : m->chunks) unique[c.key] = c.bytes;
    }
    uint64_t unique_bytes = 0;
    for (const auto& [k, v] : unique) unique_bytes += v;
    fmt::print("dedup: A {} + B {} image bytes; {} unique chunk bytes\n",
               GiB(a->image_bytes), GiB(b->image_bytes), GiB(unique_bytes));
    out["dedup_unique_bytes"] = unique_bytes;
  }

  auto made = ImageTarget::Create(o.target, image);
  if (!made.ok()) return fail(made.status());
  target = std::move(made).value();
  if (Status s = target->Register(**client); !s.ok()) return fail(s);
  out["target"] = o.target;
  const std::span<std::byte> pool = target->bytes();
  std::vector<std::byte> pool2(image);
  std::fill(pool2.begin(), pool2.end(), std::byte{2});  // prefault

  auto timed_load = [&](const WeightsManifest& m,
                        double* cpu) -> Result<double> {
    const double c0 = CpuSeconds(daemon.pid());
    const auto t0 = Clock::now();
    auto load = target->Load(**client, m);
    if (!load.ok()) return load.status();
    TIERKV_RETURN_IF_ERROR(load->Wait());
    const double s = Seconds(t0, Clock::now());
    if (cpu) *cpu = CpuSeconds(daemon.pid()) - c0;
    return s;
  };

  // 2. Cold: after a restart every chunk is on NVMe only.
  std::vector<double> cold_gbps, cold_ratio, cold_cpu, fio_gbps;
  std::string fio_extents;  // fio's arguments for the bytes of A
  for (int it = 0; run_cold && it < o.iterations; ++it) {
    // fio first, while no daemon runs (the load below promotes what it
    // read afterwards, reading NVMe again).
    daemon.Stop();
    if (fio_extents.empty()) {
      auto extents = ShardExtents(dir / "nvme.data", *a);
      if (!extents.ok()) return fail(extents.status());
      if (extents->size() != 1) {
        return fail(Status::Internal(fmt::format(
            "A's chunks lie in {} ranges of the NVMe file, not one (start "
            "with an empty --dir)",
            extents->size())));
      }
      const auto [begin, end] = extents->front();
      fio_extents =
          FioArgs((dir / "nvme.data").string(), end - begin, 1 << 20, 32,
                  end - begin, 600, "read",
                  // Into shared memory, as the daemon's staging and memfd
                  // pools: on this VM O_DIRECT reads into it ran up to 1.8x
                  // faster than into fio's default heap buffers.
                  fmt::format("--offset={} --iomem=mmapshared", begin));
    }
    auto fio_read = RunFio(o.fio, dir.string(), fio_extents, "read");
    if (!fio_read.ok()) return fail(fio_read.status());
    client = start();
    if (!client.ok()) return fail(client.status());
    double cpu = 0;
    auto s = timed_load(*a, &cpu);
    if (!s.ok()) return fail(s.status());
    cold_gbps.push_back(image / *s / 1e9);
    cold_ratio.push_back(cold_gbps.back() / fio_read->gbps);
    fio_gbps.push_back(fio_read->gbps);
    cold_cpu.push_back(cpu / (image / 1e9));
  }
  if (run_cold) {
    fmt::print(
        "cold load NVMe -> image: {:.2f} GB/s, {:.2f}x fio read ({:.2f} GB/s; "
        "per round {:.2f}), {:.2f} CPU-s/GB\n",
        Median(cold_gbps), Median(cold_ratio), Median(fio_gbps),
        fmt::join(cold_ratio, " "), Median(cold_cpu));
    out["cold"] = {{"gbps", Median(cold_gbps)},
                   {"fio_read_gbps", Median(fio_gbps)},
                   {"ratio_fio", Median(cold_ratio)},
                   {"cpu_s_per_gb", Median(cold_cpu)}};
  }
  if (!run_warm && !run_switch) return finish();

  // 3. Warm: A in DRAM. A load into an image pool promotes what it read
  // from NVMe afterwards, in the background (capped, at most half of
  // DRAM per load): bring A whole into DRAM first, so that every round
  // below is a warm one.
  if (Status s = WarmInDram(**client, *a, pool2); !s.ok()) return fail(s);
  std::vector<double> warm_s, warm_ratio, naive_ratio, warm_cpu, memcpy_gbps;
  std::string naive = "safetensors.numpy.load_file";
  for (int it = 0; it < o.iterations; ++it) {
    double cpu = 0;
    auto s = timed_load(*a, &cpu);
    if (!s.ok()) return fail(s.status());
    const double m = MemcpySeconds(pool2, pool);
    double n =
        SafetensorsPythonSeconds(o.python, dir / "a" / "model.safetensors");
    if (n < 0) {
      naive = "read() + copy";
      auto p = PreadLoadSeconds(dir / "a" / "model.safetensors", pool2);
      if (!p.ok()) return fail(p.status());
      n = *p;
    }
    warm_s.push_back(*s);
    warm_ratio.push_back(m / *s);
    memcpy_gbps.push_back(image / m / 1e9);
    naive_ratio.push_back(n / *s);
    warm_cpu.push_back(cpu / (image / 1e9));
  }
  const double warm = Median(warm_s);
  fmt::print(
      "warm load DRAM -> image: {:.2f} GB/s, {:.2f}x memcpy ({:.2f} GB/s; per "
      "round {:.2f}), {:.1f}x {} (cold page cache), {:.2f} CPU-s/GB\n",
      image / warm / 1e9, Median(warm_ratio), Median(memcpy_gbps),
      fmt::join(warm_ratio, " "), Median(naive_ratio), naive, Median(warm_cpu));
  out["warm"] = {{"gbps", image / warm / 1e9},
                 {"memcpy_gbps", Median(memcpy_gbps)},
                 {"ratio_memcpy", Median(warm_ratio)},
                 {"ratio_naive", Median(naive_ratio)},
                 {"naive", naive},
                 {"cpu_s_per_gb", Median(warm_cpu)}};

  if (!run_switch) return finish();

  // 4. Teacher switching.
  // Long enough for a hint given when a forward starts to bring the next
  // model's bytes from NVMe before it ends (a teacher's forward in
  // distillation takes seconds; a shard's cold load here, a fraction).
  const double forward = o.forward_s > 0 ? o.forward_s
                         : cold_gbps.empty()
                             ? 2.0 * image / 1e9  // as if 1 GB/s
                             : 2.0 * image / (Median(cold_gbps) * 1e9);
  uint64_t sink = 0;
  const WeightsManifest* models[2] = {&*a, &*b};
  out["switch"] = nlohmann::json::array();
  fmt::print("switch loop A, B, ... ({} switches, forward {:.2f} s):\n",
             o.switches, forward);
  // The schedule a distillation loop knows: `after` runs once this
  // forward ends, `running` again after that (kWeightsHint; the daemon
  // promotes what is due within its horizon and evicts the farthest first).
  const auto forward_ms = std::chrono::milliseconds(
      static_cast<int64_t>(std::ceil(forward * 1000)));
  auto hint = [&](const WeightsManifest& running,
                  const WeightsManifest& after) {
    const WeightsHint hints[] = {
        {{after.model, after.layout, WeightsVersionOf(after)}, forward_ms},
        {{running.model, running.layout, WeightsVersionOf(running)},
         2 * forward_ms}};
    if (Status s = (*client)->HintWeights(hints); !s.ok()) {
      fmt::print(stderr, "hint: {}\n", s.ToString());
    }
  };
  for (const char* mode : {"no hints", "hints", "hints + layer order"}) {
    const bool hints = std::string(mode) != "no hints";
    const bool ordered = std::string(mode) == "hints + layer order";
    std::vector<double> stalls, layer0;
    for (int sw = 0; sw < o.switches; ++sw) {
      const WeightsManifest& next = *models[(sw + 1) % 2];
      const WeightsManifest& after = *models[sw % 2];
      const auto t0 = Clock::now();
      auto load = target->Load(**client, next);
      if (!load.ok()) return fail(load.status());
      double stall = 0;
      if (ordered) {
        stall = PacedForward(
            next, pool, forward,
            [&](uint32_t l) {
              (void)load->WaitLayer(l);
              if (l == 0) layer0.push_back(Seconds(t0, Clock::now()));
            },
            &sink);
      } else {
        if (Status s = load->Wait(); !s.ok()) return fail(s);
        stall = Seconds(t0, Clock::now());
        layer0.push_back(stall);
        if (hints) hint(next, after);
        PacedForward(
            next, pool, forward, [](uint32_t) {}, &sink);
      }
      if (ordered) {
        if (Status s = load->Wait(); !s.ok()) return fail(s);
        hint(next, after);
      }
      if (sw > 0) stalls.push_back(stall);  // the first switch warms up
    }
    fmt::print(
        "  {:>20}: stall per switch p50 {:.3f} s, p90 {:.3f} s = {:.2f}x the "
        "warm load; layer 0 usable after p50 {:.3f} s\n",
        mode, Median(stalls), Percentile(stalls, 0.9), Median(stalls) / warm,
        Median(layer0));
    out["switch"].push_back({{"mode", mode},
                             {"stall_p50_s", Median(stalls)},
                             {"stall_p90_s", Percentile(stalls, 0.9)},
                             {"stall_over_warm_load", Median(stalls) / warm},
                             {"layer0_p50_s", Median(layer0)}});
  }
  out["sink"] = sink;
  (void)image_estimate;
  return finish();
}

const bool kRegistered = RegisterBench([](CLI::App& app) {
  auto opts = std::make_shared<WeightsBenchOptions>();
  auto* sub = app.add_subcommand(
      "weights",
      "Weights import/cold/warm load and teacher switching vs fio, memcpy, "
      "safetensors");
  sub->add_option("--model-bytes", opts->model_bytes, "bytes per checkpoint")
      ->capture_default_str();
  sub->add_option("--layers", opts->layers)->capture_default_str();
  sub->add_option(
      "--dram-bytes", opts->dram_bytes,
      "the weights namespace's DRAM (default 1.25x a checkpoint, at least "
      "256 MiB)");
  sub->add_option("--iterations", opts->iterations, "rounds per figure")
      ->capture_default_str();
  sub->add_option("--switches", opts->switches, "per switching mode")
      ->capture_default_str();
  sub->add_option("--forward-seconds", opts->forward_s,
                  "paced forward per model (default 2x the cold load)");
  sub->add_option("--fio", opts->fio, "fio binary")->capture_default_str();
  sub->add_option("--python", opts->python,
                  "python with safetensors + numpy (the naive baseline)")
      ->capture_default_str();
  sub->add_option("--dir", opts->dir, "where checkpoints and the NVMe file go");
  sub->add_option("--target", opts->target,
                  "where loads land: device (an emulated device image pool "
                  "the daemon fills), memfd (a memfd image pool the daemon "
                  "fills) or buffer (a host buffer this process fills)")
      ->capture_default_str();
  sub->add_option("--staging-bytes", opts->staging_bytes,
                  "--target device: the daemon's pinned staging ([hbm] "
                  "staging_bytes; default the daemon's)");
  sub->add_option("--cases", opts->cases,
                  "figures after the import, comma-separated: cold, warm, "
                  "switch (needs warm)")
      ->capture_default_str();
  sub->add_option("--json", opts->json, "also write the figures here");
  sub->callback([opts] { SetExitCode(Run(*opts)); });
});

}  // namespace
}  // namespace tierkv::bench
