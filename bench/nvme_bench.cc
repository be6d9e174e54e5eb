// `tierkv-bench nvme`: the NVMe tier (NvmeStore through UringDevice,
// O_DIRECT, io_uring) against fio on the same file, in the same run.
//
// For each segment size (72 KiB = one GLM-5 bf16 latent-KV page of 64 tokens,
// and 1 MiB) it measures, with the same block size, queue depth, file and
// file size for both:
//   fio write            --rw=write, no fsync (completion = device ack);
//   tierkv write fio-sem batched NvmeStore::Write of new keys with
//                        sync_data = sync_catalog = false: the same promise
//                        as fio's (data acknowledged by the device, catalog
//                        WAL in the page cache, no fdatasync);
//   fio write+fdatasync  fdatasync after every --batch writes;
//   tierkv write durable sync_data = sync_catalog = true (the default): one
//                        fdatasync of the data file plus one synced catalog
//                        WAL write per Write batch, so acknowledged
//                        segments survive power loss (DESIGN.md §6);
//   fio randread         --rw=randread over the region tierkv filled;
//   tierkv randread      NvmeStore::ReadBatch of uniformly random stored
//                        keys, XXH3-64 verified, into block-aligned buffers.
// Pairs alternate which side runs first, --repeat times; medians are reported
// with tierkv/fio ratios (the targets: >= 0.8 at 1 MiB, >= 0.6 at
// 72 KiB). CPU figures are user+system seconds per wall second of the
// process doing the IO (fio: its job; tierkv: this process).
#include <fcntl.h>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <linux/magic.h>
#include <sys/resource.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#define XXH_INLINE_ALL  // the diagnosis recomputes NvmeStore's XXH3-64
#include <xxhash.h>

#include "bench/fio_runner.h"
#include "bench/registry.h"
#include "bench/sample_stats.h"
#include "bench/size_option.h"
#include "storage/nvme/io_buffer.h"
#include "storage/nvme/nvme_store.h"
#include "storage/nvme/uring_device.h"

namespace tierkv::bench {
namespace {

using Clock = std::chrono::steady_clock;
using storage::IoBuffer;
using storage::NvmeReadItem;
using storage::NvmeStore;
using storage::NvmeStoreOptions;
using storage::NvmeWriteItem;

constexpr std::string_view kNamespace = "bench";
constexpr uint64_t kLayoutFingerprint = 0x6e766d65;  // any fixed value

struct NvmeBenchOptions {
  // A directory on a disk-backed file system (not tmpfs: no O_DIRECT).
  std::string dir = "/var/tmp";
  std::string file_size = "2GiB";
  std::string sizes = "72KiB,1MiB";
  uint32_t queue_depth = 32;
  // Segments per NvmeStore::Write / ReadBatch call, and fio's fdatasync
  // interval in the durable fio write. 0: 4 x queue_depth.
  uint32_t batch = 0;
  // Bytes per phase; empty: the file size (one full pass).
  std::string bytes;
  double runtime_s = 10;  // cap per phase
  int repeat = 3;
  std::string fio = "/usr/bin/fio";
  bool keep = false;
  std::string json_path;
};

// One measured phase.

std::string HumanSize(uint64_t bytes) {
  if (bytes % (1ull << 30) == 0) return fmt::format("{}GiB", bytes >> 30);
  if (bytes % (1ull << 20) == 0) return fmt::format("{}MiB", bytes >> 20);
  if (bytes % (1ull << 10) == 0) return fmt::format("{}KiB", bytes >> 10);
  return fmt::format("{}B", bytes);
}

double CpuSeconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto sec = [](const timeval& tv) { return tv.tv_sec + tv.tv_usec / 1e6; };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

// Buffers with distinct random content, block-aligned (an engine's host
// arena pages are), so NvmeStore reads and writes them in place.
std::vector<IoBuffer> AlignedPool(size_t count, size_t bytes, uint64_t seed) {
  std::vector<IoBuffer> pool;
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < count; ++i) {
    IoBuffer b = IoBuffer::AllocateAligned(bytes, 4096);
    auto* words = reinterpret_cast<uint64_t*>(b.data());
    for (size_t w = 0; w < b.size() / 8; ++w) words[w] = rng();
    pool.push_back(std::move(b));
  }
  return pool;
}

SegmentKey BenchKey(uint64_t n) {
  return SegmentKey{PageHash{n, 0x6e766d65}, 0, 0};
}

Result<std::unique_ptr<NvmeStore>> OpenStore(const std::string& file,
                                             const std::string& catalog,
                                             uint64_t capacity, uint32_t qd,
                                             bool durable) {
  std::error_code ec;
  std::filesystem::remove_all(catalog, ec);  // a fresh, empty tier
  NvmeStoreOptions so;
  so.path = file;
  so.catalog_path = catalog;
  so.capacity_bytes = capacity;
  so.queue_depth = qd;
  so.sync_data = durable;
  so.sync_catalog = durable;
  auto store = NvmeStore::Open(so);
  if (!store.ok()) return store.status();
  const storage::NvmeStoreStats st = (*store)->Stats();
  if (!st.direct_io || !st.io_uring) {
    return Status::Unavailable(fmt::format(
        "tierkv store on {} runs without {}; figures would not compare with "
        "fio --direct=1 --ioengine=io_uring",
        file, st.direct_io ? "io_uring" : "O_DIRECT"));
  }
  return store;
}

// Writes `count` new segments (keys first_key...) in batches; stops early
// after runtime_s. Returns the figures; `written` gets the count stored.
Result<Figure> TierkvWrite(NvmeStore& store, const std::vector<IoBuffer>& pool,
                           uint64_t seg, uint64_t first_key, uint64_t count,
                           size_t batch, double runtime_s, uint64_t* written) {
  std::vector<NvmeWriteItem> items;
  const double cpu0 = CpuSeconds();
  const auto t0 = Clock::now();
  uint64_t done = 0;
  while (done < count) {
    items.clear();
    for (size_t i = 0; i < batch && done + i < count; ++i) {
      items.push_back({BenchKey(first_key + done + i),
                       pool[(done + i) % pool.size()].span().first(seg)});
    }
    const std::vector<Status> results =
        store.Write(kNamespace, kLayoutFingerprint, items);
    for (const Status& s : results) {
      if (!s.ok())
        return Status::IOError("tierkv write failed: " + s.ToString());
    }
    done += items.size();
    if (std::chrono::duration<double>(Clock::now() - t0).count() > runtime_s)
      break;
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  *written = done;
  return Figure{static_cast<double>(done * seg) / wall / 1e9, done / wall,
                (CpuSeconds() - cpu0) / wall, done * seg};
}

// What the bytes of one extent are, against what the durable write stored
// there: "expected", "zeros", "tierkv data of another position" (a write
// pool buffer other than the expected one) or "foreign" (e.g. fio's).
std::string Classify(std::span<const std::byte> got,
                     const std::vector<IoBuffer>& write_pool,
                     size_t expected_buffer) {
  const uint64_t seg = got.size();
  if (std::memcmp(got.data(), write_pool[expected_buffer].data(), seg) == 0) {
    return "expected";
  }
  if (std::all_of(got.begin(), got.end(),
                  [](std::byte b) { return b == std::byte{0}; })) {
    return "zeros";
  }
  for (size_t j = 0; j < write_pool.size(); ++j) {
    if (std::memcmp(got.data(), write_pool[j].data(), seg) == 0) {
      return fmt::format("tierkv data of write buffer {} (expected {})", j,
                         expected_buffer);
    }
  }
  size_t same = 0;
  for (size_t b = 0; b < seg; ++b)
    same += got[b] == write_pool[expected_buffer].data()[b];
  return fmt::format("foreign ({} of {} bytes equal the expected ones)", same,
                     seg);
}

// Run on a failed tierkv read: tells "acknowledged write lost" (the file
// holds other bytes) from "read returned wrong bytes" (the file is right).
// For up to 8 failed items it re-reads the extent with pread through a fresh
// O_DIRECT descriptor (now, after 100 ms and after 1 s: a write landing late
// shows as healing) and through the page cache, and classifies the bytes;
// then it scans every position the durable write filled and prints the
// ranges that do not hold the expected bytes.
void DiagnoseReadFailure(
    const std::string& file, const std::vector<IoBuffer>& write_pool,
    uint64_t seg, uint64_t first_key, uint64_t stored,
    const std::vector<NvmeReadItem>& items,
    const std::vector<Result<uint64_t>>& results,
    const std::vector<std::optional<storage::CatalogEntry>>& entries) {
  auto say = [](const std::string& line) {
    fmt::print(stderr, "tierkv-bench nvme: diagnosis: {}\n", line);
  };
  const int direct_fd = ::open(file.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  const int buffered_fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (direct_fd < 0 || buffered_fd < 0) {
    say(fmt::format("cannot open {}: {}", file, std::strerror(errno)));
    if (direct_fd >= 0) ::close(direct_fd);
    if (buffered_fd >= 0) ::close(buffered_fd);
    return;
  }
  IoBuffer buf = IoBuffer::AllocateAligned(seg, 4096);
  auto read_at = [&](int fd, uint64_t offset) -> std::string {
    const ssize_t n = ::pread(fd, buf.data(), seg, static_cast<off_t>(offset));
    if (n != static_cast<ssize_t>(seg)) {
      return fmt::format("pread returned {} ({})", n,
                         n < 0 ? std::strerror(errno) : "short");
    }
    return {};
  };
  size_t failed = 0;
  size_t shown = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (results[i].ok() && *results[i] == seg) continue;
    ++failed;
    if (shown >= 8) continue;
    ++shown;
    const uint64_t key = items[i].key.page.lo;
    const uint64_t position = key - first_key;
    const size_t expected_buffer = position % write_pool.size();
    if (!entries[i]) {
      say(fmt::format(
          "key {:#x} (position {}): no catalog entry before the read; {}", key,
          position, results[i].status().ToString()));
      continue;
    }
    const storage::CatalogEntry& e = *entries[i];
    std::string line = fmt::format(
        "key {:#x} position {} offset {} (sequential: {}) length {}; {}; "
        "catalog checksum "
        "{} the written buffer",
        key, position, e.offset, position * seg, e.length,
        results[i].ok() ? fmt::format("read {} bytes", *results[i])
                        : results[i].status().ToString(),
        XXH3_64bits(write_pool[expected_buffer].data(), seg) == e.checksum
            ? "matches"
            : "DOES NOT match");
    for (const auto& [label, fd, delay_ms] :
         {std::tuple{"O_DIRECT pread", direct_fd, 0},
          std::tuple{"buffered pread", buffered_fd, 0},
          std::tuple{"O_DIRECT pread +100ms", direct_fd, 100},
          std::tuple{"O_DIRECT pread +1s", direct_fd, 900}}) {
      if (delay_ms > 0 && shown == 1) ::usleep(delay_ms * 1000);
      if (delay_ms > 0 && shown != 1) continue;  // the delays once
      const std::string err = read_at(fd, e.offset);
      line += fmt::format(
          "; {}: {}", label,
          err.empty() ? Classify({buf.data(), seg}, write_pool, expected_buffer)
                      : err);
    }
    say(line);
  }
  say(fmt::format("{} of {} items of the batch failed", failed, items.size()));

  // Which positions of the durable write hold other bytes? (Assumes the
  // sequential placement a fresh tier gives, checked above per item.)
  std::vector<std::pair<uint64_t, uint64_t>> bad;  // [first, last] positions
  uint64_t bad_count = 0;
  std::map<std::string, uint64_t> kinds;
  for (uint64_t p = 0; p < stored; ++p) {
    const std::string err = read_at(direct_fd, p * seg);
    const std::string kind =
        err.empty()
            ? Classify({buf.data(), seg}, write_pool, p % write_pool.size())
            : err;
    if (kind == "expected") continue;
    ++bad_count;
    ++kinds[kind.substr(0, kind.find(" ("))];
    if (!bad.empty() && bad.back().second + 1 == p) {
      bad.back().second = p;
    } else {
      bad.push_back({p, p});
    }
  }
  std::string ranges;
  for (size_t r = 0; r < bad.size() && r < 20; ++r) {
    ranges +=
        fmt::format("{}{}-{}", r == 0 ? "" : ", ", bad[r].first, bad[r].second);
  }
  std::string kind_list;
  for (const auto& [k, n] : kinds) kind_list += fmt::format(" {}: {};", k, n);
  say(
      fmt::format("scan of the {} positions the durable write filled "
                  "(O_DIRECT): {} hold other "
                  "bytes, in {} ranges{}{}{}",
                  stored, bad_count, bad.size(), bad.empty() ? "" : ": ",
                  ranges, bad.size() > 20 ? ", ..." : ""));
  if (!kind_list.empty()) say("kinds:" + kind_list);
  ::close(direct_fd);
  ::close(buffered_fd);
}

// ReadBatch of uniformly random keys among [first_key, first_key + stored).
// On a failed item, DiagnoseReadFailure runs before the error is returned.
Result<Figure> TierkvRandomRead(NvmeStore& store, std::vector<IoBuffer>& pool,
                                const std::vector<IoBuffer>& write_pool,
                                const std::string& file, uint64_t seg,
                                uint64_t first_key, uint64_t stored,
                                uint64_t count, double runtime_s,
                                uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<uint64_t> pick(0, stored - 1);
  std::vector<NvmeReadItem> items;
  // Each item's catalog entry as the read starts (a failed item is dropped
  // by the read, so its entry is looked up before): for the diagnosis.
  std::vector<std::optional<storage::CatalogEntry>> entries;
  const double cpu0 = CpuSeconds();
  const auto t0 = Clock::now();
  uint64_t done = 0;
  while (done < count) {
    items.clear();
    entries.clear();
    for (size_t i = 0; i < pool.size() && done + i < count; ++i) {
      items.push_back({BenchKey(first_key + pick(rng)), pool[i].span()});
      entries.push_back(store.TEST_Entry(kNamespace, items.back().key));
    }
    const auto results = store.ReadBatch(kNamespace, kLayoutFingerprint, items);
    for (const auto& r : results) {
      if (!r.ok() || *r != seg) {
        DiagnoseReadFailure(file, write_pool, seg, first_key, stored, items,
                            results, entries);
        return Status::IOError(
            fmt::format("tierkv read failed after {} items: {}", done,
                        r.ok() ? fmt::format("read {} bytes, not {}", *r, seg)
                               : r.status().ToString()));
      }
    }
    done += items.size();
    if (std::chrono::duration<double>(Clock::now() - t0).count() > runtime_s)
      break;
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  return Figure{static_cast<double>(done * seg) / wall / 1e9, done / wall,
                (CpuSeconds() - cpu0) / wall, done * seg};
}

// Refuses tmpfs and file systems without O_DIRECT: fio --direct=1 and the
// tier would silently measure the page cache (or fail) there.
Status CheckDirectIo(const std::string& dir) {
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) != 0) {
    return Status::InvalidArgument(
        fmt::format("--dir {}: {}", dir, std::strerror(errno)));
  }
  if (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC) {
    return Status::InvalidArgument(fmt::format(
        "--dir {} is tmpfs/ramfs: no O_DIRECT and no device behind it; use a "
        "directory on the disk (e.g. /var/tmp)",
        dir));
  }
  const std::string probe = dir + "/.odirect-probe";
  const int fd =
      ::open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  const int err = errno;
  if (fd >= 0) ::close(fd);
  ::unlink(probe.c_str());
  if (fd < 0) {
    return Status::InvalidArgument(fmt::format(
        "--dir {}: O_DIRECT open failed: {}", dir, std::strerror(err)));
  }
  return Status::OK();
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return fmt::format("{} {} {}", a, b, c);
}

struct Phase {
  const char* name;  // JSON key
  const char* label;
};
constexpr Phase kFioWrite{"fio_write", "fio write"};
constexpr Phase kTierkvWrite{"tierkv_write", "tierkv write (fio semantics)"};
constexpr Phase kFioWriteSync{"fio_write_fdatasync",
                              "fio write + fdatasync/batch"};
constexpr Phase kTierkvWriteDurable{"tierkv_write_durable",
                                    "tierkv write (durable)"};
constexpr Phase kFioRead{"fio_randread", "fio randread"};
constexpr Phase kTierkvRead{"tierkv_randread", "tierkv randread (ReadBatch)"};
constexpr Phase kPhases[] = {kFioWrite,           kTierkvWrite, kFioWriteSync,
                             kTierkvWriteDurable, kFioRead,     kTierkvRead};

int Run(const NvmeBenchOptions& o) {
  auto fail = [](const Status& s) {
    fmt::print(stderr, "tierkv-bench nvme: {}\n", s.ToString());
    return 1;
  };
  auto file_size = ParseSizeOption("--file-size", o.file_size);
  if (!file_size.ok()) return fail(file_size.status());
  const uint64_t capacity = *file_size & ~uint64_t{4095};
  uint64_t phase_bytes = capacity;
  if (!o.bytes.empty()) {
    auto b = ParseSizeOption("--bytes", o.bytes);
    if (!b.ok()) return fail(b.status());
    phase_bytes = std::min(*b, capacity);
  }
  std::vector<uint64_t> sizes;
  for (size_t pos = 0; pos <= o.sizes.size();) {
    size_t comma = o.sizes.find(',', pos);
    if (comma == std::string::npos) comma = o.sizes.size();
    auto s = ParseSizeOption("--sizes", o.sizes.substr(pos, comma - pos));
    if (!s.ok()) return fail(s.status());
    if (*s == 0 || *s % 4096 != 0 || *s > capacity) {
      return fail(
          Status::InvalidArgument("segment sizes must be non-zero multiples of "
                                  "4 KiB within --file-size"));
    }
    sizes.push_back(*s);
    pos = comma + 1;
  }
  if (o.queue_depth == 0 || o.repeat < 1 || o.runtime_s <= 0) {
    return fail(Status::InvalidArgument(
        "--queue-depth, --repeat, --runtime must be > 0"));
  }
  const size_t batch = o.batch != 0 ? o.batch : size_t{4} * o.queue_depth;
  if (Status s = CheckDirectIo(o.dir); !s.ok()) return fail(s);
  if (::access(o.fio.c_str(), X_OK) != 0) {
    return fail(
        Status::NotFound(fmt::format("fio not found at {} (--fio)", o.fio)));
  }

  const std::string workdir =
      fmt::format("{}/tierkv-nvme-bench.{}", o.dir, ::getpid());
  std::filesystem::create_directories(workdir);
  const std::string file = workdir + "/data";
  const std::string catalog = workdir + "/catalog";
  struct Cleanup {
    std::string dir;
    bool keep;
    ~Cleanup() {
      std::error_code ec;
      if (!keep) std::filesystem::remove_all(dir, ec);
    }
  } cleanup{workdir, o.keep};

  const std::string load_before = LoadAverage();
  fmt::print(
      "tierkv-bench nvme: file {} ({}), queue depth {}, batch {} segments, "
      "{} per phase (cap {} s), median of {}\n",
      file, HumanSize(capacity), o.queue_depth, batch, HumanSize(phase_bytes),
      o.runtime_s, o.repeat);
  fmt::print("load average before: {}\n", load_before);

  // Lay the whole file down once so every phase overwrites written blocks
  // (no unwritten-extent conversion, no file growth) for fio and tierkv alike.
  const auto t_start = Clock::now();
  {
    auto pre = RunFio(o.fio, workdir,
                      FioArgs(file, capacity, 1 << 20, o.queue_depth, capacity,
                              /*runtime_s=*/600, "write"),
                      "write");
    if (!pre.ok()) return fail(pre.status());
  }

  nlohmann::json out;
  out["date"] = fmt::format("{:%F}", fmt::localtime(std::time(nullptr)));
  out["file"] = file;
  out["file_size_bytes"] = capacity;
  out["queue_depth"] = o.queue_depth;
  out["batch_segments"] = batch;
  out["phase_bytes"] = phase_bytes;
  out["repeat"] = o.repeat;
  out["load_average_before"] = load_before;

  struct SizeResult {
    uint64_t seg;
    std::map<std::string, Figure> median;
    std::map<std::string, double> min, max;  // GB/s over the repetitions
  };
  std::vector<SizeResult> all;
  uint64_t next_key = 1;
  for (const uint64_t seg : sizes) {
    const uint64_t count = phase_bytes / seg;
    const size_t pool_count = std::min<uint64_t>(batch, count);
    std::vector<IoBuffer> write_pool = AlignedPool(pool_count, seg, seg);
    std::vector<IoBuffer> read_pool = AlignedPool(pool_count, seg, seg + 1);
    std::map<std::string, std::vector<Figure>> runs;
    for (int rep = 0; rep < o.repeat; ++rep) {
      auto record = [&](const Phase& p, Result<Figure> f) -> Status {
        if (!f.ok()) return f.status();
        runs[p.name].push_back(*f);
        return Status::OK();
      };
      // The plain write and the read pairs run fio first on even
      // repetitions and tierkv first on odd ones, so a drift of the device
      // (or of the neighbours' load) does not always favour the same side.
      // The durable pair always runs fio first: a fio write after it would
      // overwrite the segments the read pair reads (their checksums would
      // then fail, as they should).
      auto pair = [&](const std::function<Status()>& fio_phase,
                      const std::function<Status()>& tierkv_phase,
                      bool may_swap = true) {
        const bool fio_first = !may_swap || rep % 2 == 0;
        Status first = fio_first ? fio_phase() : tierkv_phase();
        if (!first.ok()) return first;
        return fio_first ? tierkv_phase() : fio_phase();
      };
      uint64_t stored = 0;
      Status s = pair(
          [&] {
            return record(kFioWrite,
                          RunFio(o.fio, workdir,
                                 FioArgs(file, capacity, seg, o.queue_depth,
                                         count * seg, o.runtime_s, "write"),
                                 "write"));
          },
          [&] {
            auto store = OpenStore(file, catalog, capacity, o.queue_depth,
                                   /*durable=*/false);
            if (!store.ok()) return store.status();
            Status st = record(kTierkvWrite,
                               TierkvWrite(**store, write_pool, seg, next_key,
                                           count, batch, o.runtime_s, &stored));
            next_key += stored;
            return st;
          });
      std::unique_ptr<NvmeStore> durable;
      uint64_t durable_first = 0;
      if (s.ok()) {
        s = pair(
            [&] {
              return record(
                  kFioWriteSync,
                  RunFio(o.fio, workdir,
                         FioArgs(file, capacity, seg, o.queue_depth,
                                 count * seg, o.runtime_s, "write",
                                 fmt::format("--fdatasync={}", batch)),
                         "write"));
            },
            [&] {
              auto store = OpenStore(file, catalog, capacity, o.queue_depth,
                                     /*durable=*/true);
              if (!store.ok()) return store.status();
              durable_first = next_key;
              Status st =
                  record(kTierkvWriteDurable,
                         TierkvWrite(**store, write_pool, seg, next_key, count,
                                     batch, o.runtime_s, &stored));
              next_key += stored;
              durable = std::move(store).value();
              return st;
            },
            /*may_swap=*/false);
      }
      // Random reads over exactly the region the durable write filled
      // (fio may run first: the durable write already laid it down).
      if (s.ok()) {
        const uint64_t region = stored * seg;
        s = pair(
            [&] {
              return record(kFioRead, RunFio(o.fio, workdir,
                                             FioArgs(file, region, seg,
                                                     o.queue_depth, count * seg,
                                                     o.runtime_s, "randread"),
                                             "read"));
            },
            [&] {
              Status st =
                  record(kTierkvRead,
                         TierkvRandomRead(*durable, read_pool, write_pool, file,
                                          seg, durable_first, stored, count,
                                          o.runtime_s, 1000 + rep));
              if (st.ok() && durable->Stats().checksum_failures != 0) {
                st = Status::Corruption(
                    "tierkv read reported checksum failures");
              }
              return st;
            });
      }
      if (!s.ok()) return fail(s);
    }

    SizeResult r{seg, {}};
    nlohmann::json& js = out["sizes"][HumanSize(seg)];
    js["segment_bytes"] = seg;
    for (const Phase& p : kPhases) {
      std::vector<double> gbps, iops, cpu;
      for (const Figure& f : runs[p.name]) {
        gbps.push_back(f.gbps), iops.push_back(f.iops), cpu.push_back(f.cpu);
      }
      Figure m{Median(gbps), Median(iops), Median(cpu), 0};
      r.median[p.name] = m;
      r.min[p.name] = *std::min_element(gbps.begin(), gbps.end());
      r.max[p.name] = *std::max_element(gbps.begin(), gbps.end());
      js[p.name] = {{"gbps_median", m.gbps},
                    {"iops_median", m.iops},
                    {"cpu_per_wall_s_median", m.cpu},
                    {"gbps_runs", gbps}};
    }
    all.push_back(std::move(r));
  }

  // The table: one row per (size, phase), ratios against the fio phase of
  // the same kind.
  const double elapsed =
      std::chrono::duration<double>(Clock::now() - t_start).count();
  fmt::print("\n{:>7}  {:<30} {:>9} {:>13} {:>8} {:>6} {:>6}\n", "segment",
             "phase", "GB/s", "runs min-max", "IOPS", "CPU", "/fio");
  for (const SizeResult& r : all) {
    const double target = r.seg >= (1u << 20) ? 0.8 : 0.6;
    auto row = [&](const Phase& p, const Phase* base) {
      const Figure& f = r.median.at(p.name);
      std::string ratio;
      if (base != nullptr) {
        ratio = fmt::format("{:.2f}", f.gbps / r.median.at(base->name).gbps);
      }
      fmt::print(
          "{:>7}  {:<30} {:>9.3f} {:>6.2f}-{:<6.2f} {:>8.0f} {:>6.2f} {:>6}\n",
          HumanSize(r.seg), p.label, f.gbps, r.min.at(p.name), r.max.at(p.name),
          f.iops, f.cpu, ratio);
    };
    row(kFioWrite, nullptr);
    row(kTierkvWrite, &kFioWrite);
    row(kFioWriteSync, nullptr);
    row(kTierkvWriteDurable, &kFioWrite);
    row(kFioRead, nullptr);
    row(kTierkvRead, &kFioRead);
    const double w =
        r.median.at(kTierkvWrite.name).gbps / r.median.at(kFioWrite.name).gbps;
    const double wd = r.median.at(kTierkvWriteDurable.name).gbps /
                      r.median.at(kFioWriteSync.name).gbps;
    const double rd =
        r.median.at(kTierkvRead.name).gbps / r.median.at(kFioRead.name).gbps;
    fmt::print(
        "{:>7}  target >= {:.1f}x fio: write {:.2f} ({}), randread {:.2f} "
        "({}); "
        "durable write vs fio+fdatasync {:.2f}\n\n",
        "", target, w, w >= target ? "met" : "MISSED", rd,
        rd >= target ? "met" : "MISSED", wd);
    nlohmann::json& js = out["sizes"][HumanSize(r.seg)];
    js["target_ratio"] = target;
    js["write_over_fio"] = w;
    js["write_durable_over_fio"] = r.median.at(kTierkvWriteDurable.name).gbps /
                                   r.median.at(kFioWrite.name).gbps;
    js["write_durable_over_fio_fdatasync"] = wd;
    js["randread_over_fio"] = rd;
  }
  const std::string load_after = LoadAverage();
  fmt::print(
      "CPU = CPU seconds per wall second of the IO process. tierkv write (fio "
      "semantics): no fdatasync, catalog WAL not synced, like fio without "
      "--fsync. durable: one fdatasync + one synced catalog write per batch "
      "of {} (its /fio ratio is against plain fio write).\n",
      batch);
  fmt::print("load average after: {}; total {:.0f} s\n", load_after, elapsed);
  out["load_average_after"] = load_after;
  out["elapsed_s"] = elapsed;
  if (!o.json_path.empty()) {
    std::ofstream(o.json_path) << out.dump(2) << "\n";
    fmt::print("wrote {}\n", o.json_path);
  }
  return 0;
}

const bool kRegistered = RegisterBench([](CLI::App& app) {
  auto opts = std::make_shared<NvmeBenchOptions>();
  auto* sub = app.add_subcommand(
      "nvme",
      "NVMe tier (NvmeStore, io_uring, O_DIRECT) write and random read vs fio "
      "on the same file");
  sub->add_option(
         "--dir", opts->dir,
         "directory on a disk-backed file system (O_DIRECT; not tmpfs)")
      ->capture_default_str();
  sub->add_option("--file-size", opts->file_size,
                  "data file size (fio and tierkv)")
      ->capture_default_str();
  sub->add_option("--sizes", opts->sizes,
                  "segment sizes = fio block sizes, comma separated")
      ->capture_default_str();
  sub->add_option("--queue-depth", opts->queue_depth,
                  "IOs in flight (fio iodepth)")
      ->capture_default_str();
  sub->add_option(
         "--batch", opts->batch,
         "segments per Write/ReadBatch call and fio fdatasync interval "
         "(0: 4 x queue depth)")
      ->capture_default_str();
  sub->add_option("--bytes", opts->bytes,
                  "bytes per phase (default: the file size)");
  sub->add_option("--runtime", opts->runtime_s, "seconds cap per phase")
      ->capture_default_str();
  sub->add_option("--repeat", opts->repeat,
                  "runs per phase; medians are reported")
      ->capture_default_str();
  sub->add_option("--fio", opts->fio, "fio binary")->capture_default_str();
  sub->add_flag("--keep", opts->keep, "keep the data file and catalog");
  sub->add_option("--json", opts->json_path, "also write the figures here");
  sub->callback([opts] { SetExitCode(Run(*opts)); });
});

}  // namespace
}  // namespace tierkv::bench
