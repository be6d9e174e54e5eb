// EmulatedBackend: DeviceBackend in host memory (see device_backend.h).
// Over 600 lines on purpose: it mirrors cuda_backend.cc call for call (the
// tests hold both to one contract), so the two read side by side.
//
// A pool is a memfd mapped into this process (MappedRegion), so it can be
// exported to another process of the node as CUDA IPC exports device
// memory; it is sealed against resizing, so no importer can shrink it under
// this process (whose next copy would then fault). Each stream
// is a worker thread running its operations in order; an event is the
// stream's count of submitted operations at the time it was recorded, done
// once that many have completed. Errors follow CUDA's model
// (device_backend.h): a fault of the work fails the whole backend.
//
// IPC handle (64 bytes): magic "TKVHBM01", the exporting pid, the memfd's
// descriptor number in it, the pool size and a random nonce that is also in
// the memfd's name. An importer opens /proc/<pid>/fd/<fd> (same user, as
// CUDA IPC is same node) and refuses a descriptor whose name lacks the
// nonce, so a reused descriptor number can never map another file.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/stream_copy.h"
#include "storage/device/device_backend.h"
#include "storage/device/mapped_region.h"

namespace tierkv::storage {
namespace {

constexpr char kMagic[8] = {'T', 'K', 'V', 'H', 'B', 'M', '0', '1'};

struct HandleFields {
  char magic[8];
  int32_t pid;
  int32_t fd;
  uint64_t bytes;
  uint64_t nonce;
  uint32_t pool;
  uint8_t reserved[28];
};
static_assert(sizeof(HandleFields) == sizeof(IpcHandle::bytes));

std::string MemfdName(uint64_t nonce) {
  return fmt::format("tierkv-hbm-{:016x}", nonce);
}

Status Errno(std::string_view what) {
  return Status::IOError(fmt::format("{}: {}", what, std::strerror(errno)));
}

// One in-order queue with its worker thread, started by the first
// operation: a backend that only imports pools (an engine process) starts
// no threads, which also keeps it usable in a child after fork().
class Stream {
 public:
  Stream() = default;
  ~Stream() {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
      cv_.SignalAll();
    }
    if (worker_.joinable()) worker_.join();
  }

  void Submit(std::function<Status()> op) {
    MutexLock lock(&mu_);
    if (!worker_.joinable()) worker_ = std::thread([this] { Run(); });
    ops_.push_back(std::move(op));
    ++submitted_;
    cv_.SignalAll();
  }

  uint64_t Record() {
    MutexLock lock(&mu_);
    return submitted_;
  }

  bool Done(uint64_t sequence) {
    MutexLock lock(&mu_);
    return completed_ >= sequence;
  }

  // Blocks until `sequence` operations completed; leaves the stream's
  // error for its own WaitEvent (another stream waiting on this one).
  void WaitDone(uint64_t sequence) {
    MutexLock lock(&mu_);
    while (completed_ < sequence) cv_.Wait(&mu_);
  }

  Status Wait(uint64_t sequence, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    MutexLock lock(&mu_);
    while (completed_ < sequence) {
      if (!cv_.WaitUntil(&mu_, deadline) && completed_ < sequence) {
        return Status::IOError(
            fmt::format("device event not done after {} ms", timeout.count()));
      }
    }
    Status error = error_;
    error_ = Status::OK();
    return error;
  }

 private:
  void Run() {
    while (true) {
      std::function<Status()> op;
      {
        MutexLock lock(&mu_);
        while (ops_.empty() && !stopping_) cv_.Wait(&mu_);
        if (ops_.empty()) return;  // stopping, and everything ran
        op = std::move(ops_.front());
        ops_.pop_front();
      }
      Status s = op();
      MutexLock lock(&mu_);
      if (!s.ok() && error_.ok()) error_ = s;
      ++completed_;
      cv_.SignalAll();
    }
  }

  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<Status()>> ops_ GUARDED_BY(mu_);
  uint64_t submitted_ GUARDED_BY(mu_) = 0;
  uint64_t completed_ GUARDED_BY(mu_) = 0;
  Status error_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread worker_ GUARDED_BY(mu_);
};

// The emulated per-thread current device (cudaGetDevice/cudaSetDevice's).
thread_local int t_current_device = 0;

class EmulatedBackend final : public DeviceBackend {
 public:
  explicit EmulatedBackend(const DeviceBackendOptions& o)
      : DeviceBackend("emulated", o.streams),
        device_(o.device_uuid ? EmulatedDeviceOrdinal(*o.device_uuid)
                : o.device == DeviceBackendOptions::kCurrentDevice
                    ? t_current_device
                    : o.device),
        capacity_(o.emulated_capacity_bytes),
        fault_after_(o.emulated_fault_after_copies),
        before_op_(o.emulated_before_op) {
    for (uint32_t i = 0; i < o.streams; ++i) {
      streams_.push_back(std::make_unique<Stream>());
    }
  }

  ~EmulatedBackend() override {
    streams_.clear();  // joins the workers: nothing touches a pool after
    MutexLock lock(&mu_);
    for (auto& [id, pool] : pools_) {
      if (pool.fd >= 0) ::close(pool.fd);
    }
  }

 protected:
  struct Pool {
    int fd = -1;  // kept open: the IPC handle names it; -1 when imported
    std::shared_ptr<MappedRegion> region;
    uint64_t bytes = 0;
    uint64_t nonce = 0;
    bool imported = false;  // another backend's pool, mapped here
  };

  uint64_t PoolBytes(uint32_t pool) const override {
    MutexLock lock(&mu_);
    auto it = pools_.find(pool);
    return it == pools_.end() ? 0 : it->second.bytes;
  }

  Result<DevicePool> AllocatePoolImpl(uint64_t bytes) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    MutexLock lock(&mu_);
    if (bytes > capacity_ - used_) {
      return Status::ResourceExhausted(
          fmt::format("device out of memory: {} bytes asked, {} of {} free",
                      bytes, capacity_ - used_, capacity_));
    }
    Pool pool;
    pool.nonce = rng_();
    pool.fd = ::memfd_create(MemfdName(pool.nonce).c_str(),
                             MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (pool.fd < 0) return Errno("memfd_create (device pool)");
    Status made;
    if (::ftruncate(pool.fd, static_cast<off_t>(bytes)) != 0) {
      made = Errno("ftruncate (device pool)");
    } else if (::fcntl(pool.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) !=
               0) {
      made = Errno("seal (device pool)");
    } else {
      auto region = MappedRegion::Map(pool.fd, bytes);
      if (region.ok())
        pool.region = std::move(region).value();
      else
        made = region.status();
    }
    if (!made.ok()) {
      ::close(pool.fd);
      return made;
    }
    pool.bytes = bytes;
    const uint32_t id = next_id_++;
    pools_.emplace(id, pool);
    used_ += bytes;
    return DevicePool{id, bytes};
  }

  Status FreePoolImpl(uint32_t id) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    MutexLock lock(&mu_);
    auto it = pools_.find(id);
    if (it == pools_.end()) return Status::InvalidArgument("no such pool");
    if (it->second.imported) {
      return Status::InvalidArgument(
          fmt::format("device pool {} is imported: close it instead", id));
    }
    used_ -= it->second.bytes;
    ::close(it->second.fd);
    pools_.erase(it);  // unmaps
    return Status::OK();
  }

  Status CopyToDeviceImpl(StreamId stream, DeviceRegion dst,
                          std::span<const std::byte> src) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    std::byte* to = Address(dst);
    streams_[stream]->Submit([this, to, src] {
      TIERKV_RETURN_IF_ERROR(BeforeWork());
      StreamCopy(to, src.data(), src.size());
      return Status::OK();
    });
    return Status::OK();
  }

  // One operation on the stream; each copy counts for fault injection as
  // a copy of its own would.
  Status CopyToDeviceBatchImpl(
      StreamId stream, std::span<const DeviceRegion> dsts,
      std::span<const std::span<const std::byte>> srcs) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    std::vector<Copy> copies;
    copies.reserve(dsts.size());
    for (size_t i = 0; i < dsts.size(); ++i) {
      copies.push_back({Address(dsts[i]), srcs[i]});
    }
    SubmitCopies(stream, std::move(copies));
    return Status::OK();
  }

  Status CopyToHostImpl(StreamId stream, std::span<std::byte> dst,
                        DeviceRegion src) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    const std::byte* from = Address(src);
    streams_[stream]->Submit([this, from, dst] {
      TIERKV_RETURN_IF_ERROR(BeforeWork());
      std::memcpy(dst.data(), from, dst.size());
      return Status::OK();
    });
    return Status::OK();
  }

  Status CopyOnDeviceImpl(StreamId stream, DeviceRegion dst,
                          DeviceRegion src) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    std::byte* to = Address(dst);
    const std::byte* from = Address(src);
    const uint64_t n = src.bytes;
    streams_[stream]->Submit([this, to, from, n] {
      TIERKV_RETURN_IF_ERROR(BeforeWork());
      std::memmove(to, from, n);
      return Status::OK();
    });
    return Status::OK();
  }

  Status CopyOnDeviceBatchImpl(StreamId stream,
                               std::span<const DeviceRegion> dsts,
                               std::span<const DeviceRegion> srcs) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    std::vector<Copy> copies;
    copies.reserve(dsts.size());
    for (size_t i = 0; i < dsts.size(); ++i) {
      copies.push_back({Address(dsts[i]), {Address(srcs[i]), srcs[i].bytes}});
    }
    SubmitCopies(stream, std::move(copies));
    return Status::OK();
  }

  // A batch's copies, one after another on the stream's worker. Into
  // "device" memory, which no host thread reads soon: large copies with
  // non-temporal stores (StreamCopy), as DMA would not pass through the
  // host's caches either.
  struct Copy {
    std::byte* to;
    std::span<const std::byte> from;
  };
  void SubmitCopies(StreamId stream, std::vector<Copy> copies) {
    streams_[stream]->Submit([this, copies = std::move(copies)] {
      for (const Copy& copy : copies) {
        TIERKV_RETURN_IF_ERROR(BeforeWork());
        StreamCopy(copy.to, copy.from.data(), copy.from.size());
      }
      return Status::OK();
    });
  }

  Status GatherRowsImpl(StreamId stream, DeviceRegion dst,
                        std::span<const std::byte* const> rows,
                        uint32_t row_bytes,
                        std::span<const uint32_t> dst_rows) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    std::byte* to = Address(dst);
    // The lists are the caller's and may go away: copy them (as the CUDA
    // backend copies them to the device).
    std::vector<const std::byte*> list(rows.begin(), rows.end());
    std::vector<uint32_t> slots(dst_rows.begin(), dst_rows.end());
    streams_[stream]->Submit([this, to, list = std::move(list),
                              slots = std::move(slots), row_bytes] {
      TIERKV_RETURN_IF_ERROR(BeforeWork());
      for (size_t i = 0; i < list.size(); ++i) {
        const size_t row = slots.empty() ? i : slots[i];
        std::memcpy(to + row * row_bytes, list[i], row_bytes);
      }
      return Status::OK();
    });
    return Status::OK();
  }

  Status PackRowsImpl(StreamId stream, DeviceRegion dst, DeviceRegion src,
                      uint32_t row_bytes,
                      std::span<const uint32_t> src_rows) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    std::byte* to = Address(dst);
    const std::byte* from = Address(src);
    std::vector<uint32_t> rows(src_rows.begin(), src_rows.end());
    streams_[stream]->Submit(
        [this, to, from, rows = std::move(rows), row_bytes] {
          TIERKV_RETURN_IF_ERROR(BeforeWork());
          for (size_t i = 0; i < rows.size(); ++i) {
            std::memcpy(to + i * row_bytes,
                        from + uint64_t{rows[i]} * row_bytes, row_bytes);
          }
          return Status::OK();
        });
    return Status::OK();
  }

  // The engine's stand-in stream is another emulated backend's: the gather
  // runs in its order, on its worker thread.
  Status GatherRowsOnImpl(const ForeignStream& foreign, DeviceRegion dst,
                          std::span<const std::byte* const> rows,
                          uint32_t row_bytes,
                          std::span<const uint32_t> dst_rows) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    auto theirs = ForeignQueue(foreign);
    if (!theirs.ok()) return theirs.status();
    std::byte* to = Address(dst);
    std::vector<const std::byte*> list(rows.begin(), rows.end());
    std::vector<uint32_t> slots(dst_rows.begin(), dst_rows.end());
    (*theirs)->Submit([this, to, list = std::move(list),
                       slots = std::move(slots), row_bytes] {
      // A fault fails this backend (its next call says so); the engine's
      // stream itself goes on, as a CUDA stream would not, but nothing of
      // this backend runs any more.
      if (!BeforeWork().ok()) return Status::OK();
      for (size_t i = 0; i < list.size(); ++i) {
        const size_t row = slots.empty() ? i : slots[i];
        std::memcpy(to + row * row_bytes, list[i], row_bytes);
      }
      return Status::OK();
    });
    return Status::OK();
  }

  Status StreamWaitForeignImpl(StreamId stream,
                               const ForeignStream& foreign) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    auto theirs = ForeignQueue(foreign);
    if (!theirs.ok()) return theirs.status();
    Stream* other = *theirs;
    const uint64_t sequence = other->Record();
    streams_[stream]->Submit([other, sequence] {
      other->WaitDone(sequence);
      return Status::OK();
    });
    return Status::OK();
  }

  // The engine's stream stand-in polls the word: the other side of it is
  // another process's store, which wakes no condition variable here.
  Status WaitValueOnImpl(const ForeignStream& foreign,
                         const std::atomic<uint32_t>* word,
                         uint32_t value) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    auto theirs = ForeignQueue(foreign);
    if (!theirs.ok()) return theirs.status();
    (*theirs)->Submit([word, value] {
      auto pause = std::chrono::microseconds(1);
      // Cyclic, as CUDA's GEQ (device_backend.h).
      while (static_cast<int32_t>(word->load(std::memory_order_acquire) -
                                  value) < 0) {
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(200));
      }
      return Status::OK();
    });
    return Status::OK();
  }

  Status WriteValueOnImpl(const ForeignStream& foreign,
                          std::atomic<uint32_t>* word,
                          uint32_t value) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    auto theirs = ForeignQueue(foreign);
    if (!theirs.ok()) return theirs.status();
    (*theirs)->Submit([word, value] {
      word->store(value, std::memory_order_release);
      return Status::OK();
    });
    return Status::OK();
  }

  Status LaunchHostFunctionImpl(StreamId stream,
                                std::function<void()> fn) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    streams_[stream]->Submit([fn = std::move(fn)] {
      fn();
      return Status::OK();
    });
    return Status::OK();
  }

  std::byte* PoolBaseImpl(uint32_t pool) override {
    return Address(DeviceRegion{pool, 0, 0});
  }
  bool host_addressable() const override { return true; }
  int device() const override { return device_; }
  DeviceUuid uuid() const override { return EmulatedDeviceUuid(device_); }

  Result<DeviceEvent> RecordEventImpl(StreamId stream) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    return DeviceEvent{stream, streams_[stream]->Record()};
  }

  Status WaitEventImpl(DeviceEvent event,
                       std::chrono::milliseconds timeout) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    return streams_[event.stream]->Wait(event.sequence, timeout);
  }

  // Host memory needs no pinning here; the base class keeps the ranges (so
  // the same overlaps and unknown ranges are refused as on CUDA).
  Status RegisterHostImpl(std::span<std::byte>) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    return Status::OK();
  }
  Status UnregisterHostImpl(std::span<std::byte>) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    return Status::OK();
  }

  bool EventDoneImpl(DeviceEvent event) override {
    return streams_[event.stream]->Done(event.sequence);
  }

  Result<IpcHandle> ExportPoolImpl(uint32_t id) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    MutexLock lock(&mu_);
    const Pool& pool = pools_.at(id);
    if (pool.imported) {
      return Status::InvalidArgument(fmt::format(
          "device pool {} is imported: export it from its owner", id));
    }
    HandleFields f{};
    std::memcpy(f.magic, kMagic, sizeof(kMagic));
    f.pid = static_cast<int32_t>(::getpid());
    f.fd = pool.fd;
    f.bytes = pool.bytes;
    f.nonce = pool.nonce;
    f.pool = id;
    IpcHandle handle;
    std::memcpy(handle.bytes.data(), &f, sizeof(f));
    handle.pool_bytes = pool.bytes;
    return handle;
  }

  Result<ExportedRange> ExportRangeImpl(const std::byte* data,
                                        uint64_t bytes) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    uint32_t id = 0;
    uint64_t offset = 0;
    {
      MutexLock lock(&mu_);
      for (const auto& [pool_id, pool] : pools_) {
        const std::byte* base = pool.region->bytes().data();
        if (pool.imported || data < base || data >= base + pool.bytes) {
          continue;
        }
        offset = static_cast<uint64_t>(data - base);
        if (bytes > pool.bytes - offset) {
          return Status::InvalidArgument(fmt::format(
              "device range [+{}, +{}) runs past its {}-byte allocation",
              offset, bytes, pool.bytes));
        }
        id = pool_id;
        break;
      }
    }
    if (id == 0) {
      return Status::InvalidArgument(
          fmt::format("{} is not in a device pool of this backend",
                      static_cast<const void*>(data)));
    }
    auto handle = ExportPoolImpl(id);
    if (!handle.ok()) return handle.status();
    return ExportedRange{*handle, offset, uuid()};
  }

  Result<ImportedPool> ImportPoolImpl(const IpcHandle& handle) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    HandleFields f;
    std::memcpy(&f, handle.bytes.data(), sizeof(f));
    if (std::memcmp(f.magic, kMagic, sizeof(kMagic)) != 0 || f.pid <= 0 ||
        f.fd < 0 || f.bytes == 0 || f.bytes != handle.pool_bytes) {
      return Status::InvalidArgument("not an emulated device pool handle");
    }
    const std::string path = fmt::format("/proc/{}/fd/{}", f.pid, f.fd);
    char target[256] = {};
    const ssize_t n = ::readlink(path.c_str(), target, sizeof(target) - 1);
    if (n < 0 || std::string_view(target, static_cast<size_t>(n))
                         .find(MemfdName(f.nonce)) == std::string_view::npos) {
      return Status::NotFound(
          fmt::format("device pool {} of process {} is gone", f.pool, f.pid));
    }
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return Errno("open " + path);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != f.bytes) {
      ::close(fd);
      return Status::NotFound("the device pool changed size");
    }
    auto imported = MapImported(fd, f.bytes, f.nonce);
    ::close(fd);  // the mapping keeps the memory
    return imported;
  }

  // The pool's memfd itself is the fd: an importer's mapping holds the
  // memory, as a CUDA importer's cuMemMap holds the physical allocation.
  Result<ExportedFd> ExportRangeFdImpl(const std::byte* data,
                                       uint64_t bytes) override {
    auto range = ExportRangeImpl(data, bytes);
    if (!range.ok()) return range.status();
    HandleFields f;
    std::memcpy(&f, range->handle.bytes.data(), sizeof(f));
    int fd = -1;
    {
      MutexLock lock(&mu_);
      fd = ::fcntl(pools_.at(f.pool).fd, F_DUPFD_CLOEXEC, 0);
    }
    if (fd < 0) return Errno("dup (device pool fd)");
    return ExportedFd{fd, range->handle.pool_bytes, range->offset, uuid()};
  }

  Result<ImportedPool> ImportPoolFdImpl(int fd, uint64_t pool_bytes) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    // Only an emulated device pool's memfd (its name carries the nonce).
    char target[256] = {};
    const std::string path = fmt::format("/proc/self/fd/{}", fd);
    const ssize_t n = ::readlink(path.c_str(), target, sizeof(target) - 1);
    const std::string_view name(target, n < 0 ? 0 : static_cast<size_t>(n));
    const size_t at = name.find("tierkv-hbm-");
    uint64_t nonce = 0;
    if (at == std::string_view::npos ||
        std::sscanf(name.data() + at, "tierkv-hbm-%16" SCNx64, &nonce) != 1) {
      return Status::InvalidArgument(
          "the fd is not an emulated device pool's (a tierkv-hbm memfd)");
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 ||
        static_cast<uint64_t>(st.st_size) < pool_bytes) {
      return Status::InvalidArgument(
          fmt::format("the device pool fd says {} bytes; the allocation has {}",
                      pool_bytes, st.st_size));
    }
    return MapImported(fd, pool_bytes, nonce);
  }

  Status CloseImportedImpl(ImportedPool& imported) override {
    TIERKV_RETURN_IF_ERROR(CheckCurrentDevice());
    MutexLock lock(&mu_);
    auto it = pools_.find(imported.pool);
    if (it == pools_.end() || !it->second.imported ||
        it->second.nonce != imported.token) {
      return Status::InvalidArgument("not a pool this backend imported");
    }
    pools_.erase(it);  // unmaps
    imported = {};
    return Status::OK();
  }

 private:
  // REQUIRES: the region was checked (the public method did).
  std::byte* Address(const DeviceRegion& region) const {
    MutexLock lock(&mu_);
    return pools_.at(region.pool).region->bytes().data() + region.offset;
  }

  // Maps `bytes` of an exported pool's memfd and adds it as an imported
  // pool. MappedRegion checks the seals, so the exporter cannot shrink it.
  Result<ImportedPool> MapImported(int fd, uint64_t bytes, uint64_t nonce) {
    // Page tables filled now: device memory is resident, and a CUDA import
    // costs no fault per page on its first copies either.
    auto region = MappedRegion::Map(fd, 0, bytes, /*prefault=*/true);
    if (!region.ok()) return region.status();
    MutexLock lock(&mu_);
    const uint32_t id = next_id_++;
    Pool pool;
    pool.region = std::move(region).value();
    pool.bytes = bytes;
    pool.nonce = nonce;
    pool.imported = true;
    void* base = pool.region->bytes().data();
    pools_.emplace(id, std::move(pool));
    return ImportedPool{base, bytes, id, nonce};
  }

  // The queue of a foreign stream: on this backend, another emulated
  // backend's stream.
  static Result<Stream*> ForeignQueue(const ForeignStream& foreign) {
    auto* other = dynamic_cast<EmulatedBackend*>(foreign.emulated);
    if (other == nullptr) {
      return Status::InvalidArgument(
          "an emulated device orders work on another emulated backend's "
          "stream (ForeignStream::emulated), not a CUDA stream");
    }
    if (foreign.emulated_stream >= other->streams_.size()) {
      return Status::InvalidArgument(
          fmt::format("stream {} of an emulated backend with {} streams",
                      foreign.emulated_stream, other->streams_.size()));
    }
    return other->streams_[foreign.emulated_stream].get();
  }

  // Run by every copy and gather on its stream's worker, before the work:
  // the test stall, then CUDA's error model (see device_backend.h): work
  // queued behind a fault does not run, and the injected fault fails the
  // whole backend.
  Status BeforeWork() {
    if (before_op_) before_op_();
    if (failed()) return health();
    if (fault_after_ != 0 &&
        copies_.fetch_add(1, std::memory_order_relaxed) + 1 > fault_after_) {
      return MarkFailed(Status::IOError(
          "device copy faulted (injected: an illegal address)"));
    }
    return Status::OK();
  }

  int EnterDevice() override {
    const int previous = t_current_device;
    t_current_device = device_;
    return previous == device_ ? -1 : previous;
  }
  void RestoreDevice(int previous) override {
    if (previous >= 0) t_current_device = previous;
  }
  // What the CUDA runtime would do to work submitted with another device
  // current (run it there): here a loud error, so a public method that
  // skipped the device scope fails its tests.
  Status CheckCurrentDevice() const {
    if (t_current_device == device_) return Status::OK();
    return Status::Internal(
        fmt::format("emulated device {} used while device {} is current",
                    device_, t_current_device));
  }

  const int device_;
  const uint64_t capacity_;
  const uint64_t fault_after_;
  const std::function<void()> before_op_;
  std::atomic<uint64_t> copies_{0};
  mutable Mutex mu_;
  std::map<uint32_t, Pool> pools_ GUARDED_BY(mu_);
  uint64_t used_ GUARDED_BY(mu_) = 0;
  uint32_t next_id_ GUARDED_BY(mu_) = 1;
  std::mt19937_64 rng_ GUARDED_BY(mu_){std::random_device{}()};
  std::vector<std::unique_ptr<Stream>> streams_;
};

}  // namespace

int EmulatedCurrentDevice() { return t_current_device; }
void SetEmulatedCurrentDevice(int device) { t_current_device = device; }

Result<std::unique_ptr<DeviceBackend>> OpenEmulatedBackend(
    const DeviceBackendOptions& options) {
  if (options.streams == 0 || options.streams > 64) {
    return Status::InvalidArgument("device streams must be in [1, 64]");
  }
  if (options.device < DeviceBackendOptions::kCurrentDevice) {
    return Status::InvalidArgument(
        fmt::format("device ordinal {} is negative", options.device));
  }
  if (options.device_uuid && EmulatedDeviceOrdinal(*options.device_uuid) < 0) {
    return Status::InvalidArgument(fmt::format(
        "{} is not an emulated device's UUID (emulated device n is {})",
        FormatDeviceUuid(*options.device_uuid),
        FormatDeviceUuid(EmulatedDeviceUuid(0)).replace(36, 4, "nnnn")));
  }
  return std::unique_ptr<DeviceBackend>(new EmulatedBackend(options));
}

}  // namespace tierkv::storage
