// DeviceBackend's validating public methods and Open (see device_backend.h).
#include "storage/device/device_backend.h"

#include <fmt/format.h>

#include <iterator>
#include <vector>

#if TIERKV_WITH_CUDA
#include "storage/device/cuda/cuda_backend.h"
#endif

namespace tierkv::storage {

Result<std::unique_ptr<DeviceBackend>> DeviceBackend::Open(
    const DeviceBackendOptions& options, std::string* fell_back) {
  if (options.streams == 0 || options.streams > 64) {
    return Status::InvalidArgument("device streams must be in [1, 64]");
  }
  switch (options.kind) {
    case DeviceBackendKind::kEmulated:
      return OpenEmulatedBackend(options);
    case DeviceBackendKind::kCuda:
#if TIERKV_WITH_CUDA
      return OpenCudaBackend(options);
#else
      return Status::Unavailable(
          "the CUDA device backend is not in this build (no nvcc "
          "at build time); use backend \"emulated\" or \"auto\"");
#endif
    case DeviceBackendKind::kAuto: {
#if TIERKV_WITH_CUDA
      auto cuda = OpenCudaBackend(options);
      if (cuda.ok() || cuda.status().code() != StatusCode::kUnavailable) {
        return cuda;
      }
      if (fell_back != nullptr) {
        *fell_back = fmt::format("{}: HBM is emulated in host memory",
                                 cuda.status().message());
      }
#else
      if (fell_back != nullptr) {
        *fell_back =
            "no CUDA backend in this build: HBM is emulated in host "
            "memory";
      }
#endif
      return OpenEmulatedBackend(options);
    }
  }
  return Status::InvalidArgument("unknown device backend kind");
}

bool DeviceBackend::CudaBuiltIn() { return TIERKV_WITH_CUDA != 0; }

DeviceBackend::DeviceBackend(std::string name, uint32_t streams)
    : name_(std::move(name)), streams_(streams) {}

Status DeviceBackend::health() const {
  if (!failed()) return Status::OK();
  MutexLock lock(&failure_mu_);
  return failure_;
}

Status DeviceBackend::MarkFailed(const Status& cause) {
  MutexLock lock(&failure_mu_);
  if (!failed_.load(std::memory_order_relaxed)) {
    failure_ = Status::Unavailable(fmt::format(
        "the {} device backend failed and stays failed until tierkvd "
        "restarts (a device fault poisons the whole context): {}",
        name_, cause.ToString()));
    failed_.store(true, std::memory_order_release);
  }
  return failure_;
}

// The backend's device current for one public method, the caller's given
// back at its end (see "Current device" in device_backend.h).
class DeviceBackend::DeviceScope {
 public:
  explicit DeviceScope(DeviceBackend* backend)
      : backend_(backend), previous_(backend->EnterDevice()) {}
  ~DeviceScope() { backend_->RestoreDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  DeviceBackend* const backend_;
  const int previous_;
};

Status DeviceBackend::CheckStream(StreamId stream) const {
  if (stream >= streams_) {
    return Status::InvalidArgument(fmt::format(
        "stream {} of a backend with {} streams", stream, streams_));
  }
  return Status::OK();
}

Status DeviceBackend::CheckRegion(const DeviceRegion& region) const {
  const uint64_t pool_bytes = PoolBytes(region.pool);
  if (pool_bytes == 0) {
    return Status::InvalidArgument(
        fmt::format("no device pool {}", region.pool));
  }
  if (region.offset > pool_bytes || region.bytes > pool_bytes - region.offset) {
    return Status::InvalidArgument(
        fmt::format("device region [{}, +{}) outside pool {} of {} bytes",
                    region.offset, region.bytes, region.pool, pool_bytes));
  }
  return Status::OK();
}

Result<DevicePool> DeviceBackend::AllocatePool(uint64_t bytes) {
  if (failed()) return health();
  DeviceScope scope(this);
  if (bytes == 0) return Status::InvalidArgument("a device pool of 0 bytes");
  return AllocatePoolImpl(bytes);
}

Status DeviceBackend::FreePool(uint32_t pool) {
  if (failed()) return health();
  DeviceScope scope(this);
  if (PoolBytes(pool) == 0) {
    return Status::InvalidArgument(fmt::format("no device pool {}", pool));
  }
  return FreePoolImpl(pool);
}

Status DeviceBackend::CopyToDevice(StreamId stream, DeviceRegion dst,
                                   std::span<const std::byte> src) {
  if (failed()) return health();
  DeviceScope scope(this);
  TIERKV_RETURN_IF_ERROR(CheckStream(stream));
  TIERKV_RETURN_IF_ERROR(CheckRegion(dst));
  if (src.size() != dst.bytes || (src.data() == nullptr && !src.empty())) {
    return Status::InvalidArgument(
        fmt::format("copy of {} host bytes into a {}-byte device region",
                    src.size(), dst.bytes));
  }
  return CopyToDeviceImpl(stream, dst, src);
}

Status DeviceBackend::CopyToDeviceBatch(
    StreamId stream, std::span<const DeviceRegion> dsts,
    std::span<const std::span<const std::byte>> srcs) {
  if (failed()) return health();
  DeviceScope scope(this);
  TIERKV_RETURN_IF_ERROR(CheckStream(stream));
  if (dsts.size() != srcs.size()) {
    return Status::InvalidArgument(
        fmt::format("a batch of {} device regions for {} host ranges",
                    dsts.size(), srcs.size()));
  }
  for (size_t i = 0; i < dsts.size(); ++i) {
    TIERKV_RETURN_IF_ERROR(CheckRegion(dsts[i]));
    if (srcs[i].size() != dsts[i].bytes ||
        (srcs[i].data() == nullptr && !srcs[i].empty())) {
      return Status::InvalidArgument(fmt::format(
          "batch item {}: copy of {} host bytes into a {}-byte device region",
          i, srcs[i].size(), dsts[i].bytes));
    }
  }
  if (dsts.empty()) return Status::OK();
  return CopyToDeviceBatchImpl(stream, dsts, srcs);
}

Status DeviceBackend::CopyOnDevice(StreamId stream, DeviceRegion dst,
                                   DeviceRegion src) {
  if (failed()) return health();
  DeviceScope scope(this);
  TIERKV_RETURN_IF_ERROR(CheckStream(stream));
  TIERKV_RETURN_IF_ERROR(CheckRegion(dst));
  TIERKV_RETURN_IF_ERROR(CheckRegion(src));
  if (dst.bytes != src.bytes) {
    return Status::InvalidArgument(fmt::format(
        "device copy of {} bytes into a {}-byte region", src.bytes, dst.bytes));
  }
  return CopyOnDeviceImpl(stream, dst, src);
}

Status DeviceBackend::CopyOnDeviceBatch(StreamId stream,
                                        std::span<const DeviceRegion> dsts,
                                        std::span<const DeviceRegion> srcs) {
  if (failed()) return health();
  DeviceScope scope(this);
  TIERKV_RETURN_IF_ERROR(CheckStream(stream));
  if (dsts.size() != srcs.size()) {
    return Status::InvalidArgument(
        fmt::format("a batch of {} device regions for {} sources", dsts.size(),
                    srcs.size()));
  }
  for (size_t i = 0; i < dsts.size(); ++i) {
    TIERKV_RETURN_IF_ERROR(CheckRegion(dsts[i]));
    TIERKV_RETURN_IF_ERROR(CheckRegion(srcs[i]));
    if (dsts[i].bytes != srcs[i].bytes) {
      return Status::InvalidArgument(fmt::format(
          "batch item {}: device copy of {} bytes into a {}-byte region", i,
          srcs[i].bytes, dsts[i].bytes));
    }
  }
  if (dsts.empty()) return Status::OK();
  return CopyOnDeviceBatchImpl(stream, dsts, srcs);
}

Status DeviceBackend::CopyToHost(StreamId stream, std::span<std::byte> dst,
                                 DeviceRegion src) {
  if (failed()) return health();
  DeviceScope scope(this);
  TIERKV_RETURN_IF_ERROR(CheckStream(stream));
  TIERKV_RETURN_IF_ERROR(CheckRegion(src));
  if (dst.size() != src.bytes || (dst.data() == nullptr && !dst.empty())) {
    return Status::InvalidArgument(
        fmt::format("copy of a {}-byte device region into {} host bytes",
                    src.bytes, dst.size()));
  }
  return CopyToHostImpl(stream, dst, src);
}

Status DeviceBackend::CheckGather(const DeviceRegion& dst,
                                  std::span<const std::byte* const> rows,
                                  uint32_t row_bytes,
                                  std::span<const uint32_t> dst_rows) const {
  TIERKV_RETURN_IF_ERROR(CheckRegion(dst));
  if (row_bytes == 0) {
    return Status::InvalidArgument("gather of rows of 0 bytes");
  }
  if (dst_rows.empty()) {
    if (dst.bytes != rows.size() * uint64_t{row_bytes}) {
      return Status::InvalidArgument(fmt::format(
          "gather of {} rows of {} bytes into a {}-byte device region",
          rows.size(), row_bytes, dst.bytes));
    }
  } else {
    if (dst_rows.size() != rows.size() || dst.bytes % row_bytes != 0) {
      return Status::InvalidArgument(fmt::format(
          "gather of {} rows into {} row slots of a {}-byte device region "
          "of {}-byte rows",
          rows.size(), dst_rows.size(), dst.bytes, row_bytes));
    }
    const uint64_t slots = dst.bytes / row_bytes;
    std::vector<bool> taken(slots, false);
    for (uint32_t slot : dst_rows) {
      if (slot >= slots || taken[slot]) {
        return Status::InvalidArgument(
            fmt::format("gather into row slot {} of {} ({})", slot, slots,
                        slot >= slots ? "outside the region" : "named twice"));
      }
      taken[slot] = true;
    }
  }
  for (const std::byte* row : rows) {
    if (row == nullptr)
      return Status::InvalidArgument("a gathered row is NULL");
  }
  return Status::OK();
}

Status DeviceBackend::GatherRows(StreamId stream, DeviceRegion dst,
                                 std::span<const std::byte* const> rows,
                                 uint32_t row_bytes,
                                 std::span<const uint32_t> dst_rows) {
  if (failed()) return health();
  DeviceScope scope(this);
  TIERKV_RETURN_IF_ERROR(CheckStream(stream));
  TIERKV_RETURN_IF_ERROR(CheckGather(dst, rows, row_bytes, dst_rows));
  return GatherRowsImpl(stream, dst, rows, row_bytes, dst_rows);
}

Status DeviceBackend::PackRows(StreamId stream, DeviceRegion dst,
                               DeviceRegion src, uint32_t row_bytes,
                               std::span<const uint32_t> src_rows) {
  if (failed()) return health();
  DeviceScope scope(this);
  TIERKV_RETURN_IF_ERROR(CheckStream(stream));
  TIERKV_RETURN_IF_ERROR(CheckRegion(dst));
  TIERKV_RETURN_IF_ERROR(CheckRegion(src));
  if (row_bytes == 0 || src.bytes % row_bytes != 0 ||
      dst.bytes != src_rows.size() * uint64_t{row_bytes}) {
    return Status::InvalidArgument(fmt::format(
        "pack of {} rows of {} bytes from a {}-byte region into a {}-byte one",
        src_rows.size(), row_bytes, src.bytes, dst.bytes));
  }
  const uint64_t rows = src.bytes / row_bytes;
  for (uint32_t row : src_rows) {
    if (row >= rows) {
      return Status::InvalidArgument(
          fmt::format("pack of row {} of a region of {} rows", row, rows));
    }
  }
  if (dst.pool == src.pool && dst.offset < src.offset + src.bytes &&
      src.offset < dst.offset + dst.bytes) {
    return Status::InvalidArgument("pack into the region it reads");
  }
  if (src_rows.empty()) return Status::OK();
  return PackRowsImpl(stream, dst, src, row_bytes, src_rows);
}

Status DeviceBackend::GatherRowsOn(const ForeignStream& stream,
                                   DeviceRegion dst,
                                   std::span<const std::byte* const> rows,
                                   uint32_t row_bytes,
                                   std::span<const uint32_t> dst_rows) {
  if (failed()) return health();
  DeviceScope scope(this);
  TIERKV_RETURN_IF_ERROR(CheckGather(dst, rows, row_bytes, dst_rows));
  if (rows.empty()) return Status::OK();
  return GatherRowsOnImpl(stream, dst, rows, row_bytes, dst_rows);
}

Status DeviceBackend::StreamWaitForeign(StreamId stream,
                                        const ForeignStream& foreign) {
  if (failed()) return health();
  DeviceScope scope(this);
  TIERKV_RETURN_IF_ERROR(CheckStream(stream));
  return StreamWaitForeignImpl(stream, foreign);
}

Status DeviceBackend::LaunchHostFunction(StreamId stream,
                                         std::function<void()> fn) {
  if (failed()) return health();
  DeviceScope scope(this);
  TIERKV_RETURN_IF_ERROR(CheckStream(stream));
  if (!fn) return Status::InvalidArgument("an empty host function");
  return LaunchHostFunctionImpl(stream, std::move(fn));
}

Status DeviceBackend::CheckHostWord(const void* word) {
  const auto address = reinterpret_cast<uintptr_t>(word);
  if (word == nullptr || address % alignof(std::atomic<uint32_t>) != 0) {
    return Status::InvalidArgument(
        fmt::format("a stream memory word at {} is not 4-byte aligned", word));
  }
  MutexLock lock(&host_mu_);
  auto after = host_ranges_.upper_bound(address);
  if (after == host_ranges_.begin() ||
      std::prev(after)->first + std::prev(after)->second <
          address + sizeof(uint32_t)) {
    return Status::InvalidArgument(fmt::format(
        "the stream memory word at {} is not in host memory registered with "
        "the device backend (RegisterHost)",
        word));
  }
  return Status::OK();
}

Status DeviceBackend::WaitValueOn(const ForeignStream& stream,
                                  const std::atomic<uint32_t>* word,
                                  uint32_t value) {
  if (failed()) return health();
  DeviceScope scope(this);
  TIERKV_RETURN_IF_ERROR(CheckHostWord(word));
  return WaitValueOnImpl(stream, word, value);
}

Status DeviceBackend::WriteValueOn(const ForeignStream& stream,
                                   std::atomic<uint32_t>* word,
                                   uint32_t value) {
  if (failed()) return health();
  DeviceScope scope(this);
  TIERKV_RETURN_IF_ERROR(CheckHostWord(word));
  return WriteValueOnImpl(stream, word, value);
}

Result<std::byte*> DeviceBackend::PoolBase(uint32_t pool) {
  if (failed()) return health();
  DeviceScope scope(this);
  if (PoolBytes(pool) == 0) {
    return Status::NotFound(fmt::format("no device pool {}", pool));
  }
  return PoolBaseImpl(pool);
}

Status DeviceBackend::RegisterHost(std::span<std::byte> memory) {
  if (failed()) return health();
  DeviceScope scope(this);
  if (memory.empty() || memory.data() == nullptr) {
    return Status::InvalidArgument("registering an empty host range");
  }
  const auto begin = reinterpret_cast<uintptr_t>(memory.data());
  MutexLock lock(&host_mu_);
  // The first range at or after `begin`, and the one before it.
  auto next = host_ranges_.lower_bound(begin);
  const bool overlaps_next =
      next != host_ranges_.end() && next->first < begin + memory.size();
  const bool overlaps_prev =
      next != host_ranges_.begin() &&
      std::prev(next)->first + std::prev(next)->second > begin;
  if (overlaps_next || overlaps_prev) {
    return Status::AlreadyExists(
        fmt::format("host range [{}, +{}) overlaps a registered one",
                    static_cast<const void*>(memory.data()), memory.size()));
  }
  TIERKV_RETURN_IF_ERROR(RegisterHostImpl(memory));
  host_ranges_.emplace(begin, memory.size());
  return Status::OK();
}

Status DeviceBackend::UnregisterHost(std::byte* data) {
  if (failed()) return health();
  DeviceScope scope(this);
  MutexLock lock(&host_mu_);
  auto it = host_ranges_.find(reinterpret_cast<uintptr_t>(data));
  if (it == host_ranges_.end()) {
    return Status::NotFound(fmt::format("no registered host range begins at {}",
                                        static_cast<void*>(data)));
  }
  TIERKV_RETURN_IF_ERROR(UnregisterHostImpl({data, it->second}));
  host_ranges_.erase(it);
  return Status::OK();
}

Result<DeviceEvent> DeviceBackend::RecordEvent(StreamId stream) {
  if (failed()) return health();
  DeviceScope scope(this);
  TIERKV_RETURN_IF_ERROR(CheckStream(stream));
  return RecordEventImpl(stream);
}

Status DeviceBackend::WaitEvent(DeviceEvent event,
                                std::chrono::milliseconds timeout) {
  if (failed()) return health();
  DeviceScope scope(this);
  TIERKV_RETURN_IF_ERROR(CheckStream(event.stream));
  return WaitEventImpl(event, timeout);
}

bool DeviceBackend::EventDone(DeviceEvent event) {
  if (failed()) return true;  // nothing runs on a failed device any more
  DeviceScope scope(this);
  return event.stream < streams_ && EventDoneImpl(event);
}

Result<IpcHandle> DeviceBackend::ExportPool(uint32_t pool) {
  if (failed()) return health();
  DeviceScope scope(this);
  if (PoolBytes(pool) == 0) {
    return Status::InvalidArgument(fmt::format("no device pool {}", pool));
  }
  return ExportPoolImpl(pool);
}

Status DeviceBackend::CheckExportRange(const std::byte* data, uint64_t bytes) {
  if (data == nullptr || bytes == 0 ||
      bytes > UINTPTR_MAX - reinterpret_cast<uintptr_t>(data)) {
    return Status::InvalidArgument(
        fmt::format("exporting device range [{}, +{})",
                    static_cast<const void*>(data), bytes));
  }
  return Status::OK();
}

Result<ExportedRange> DeviceBackend::ExportRange(const std::byte* data,
                                                 uint64_t bytes) {
  if (failed()) return health();
  DeviceScope scope(this);
  TIERKV_RETURN_IF_ERROR(CheckExportRange(data, bytes));
  return ExportRangeImpl(data, bytes);
}

Result<ExportedFd> DeviceBackend::ExportRangeFd(const std::byte* data,
                                                uint64_t bytes) {
  if (failed()) return health();
  DeviceScope scope(this);
  TIERKV_RETURN_IF_ERROR(CheckExportRange(data, bytes));
  return ExportRangeFdImpl(data, bytes);
}

Result<ImportedPool> DeviceBackend::ImportPoolFd(int fd, uint64_t pool_bytes) {
  if (failed()) return health();
  DeviceScope scope(this);
  if (fd < 0) return Status::InvalidArgument("a device pool fd of -1");
  if (pool_bytes == 0) {
    return Status::InvalidArgument("a device pool of 0 bytes");
  }
  return ImportPoolFdImpl(fd, pool_bytes);
}

Result<ImportedPool> DeviceBackend::ImportPool(const IpcHandle& handle) {
  if (failed()) return health();
  DeviceScope scope(this);
  return ImportPoolImpl(handle);
}

Status DeviceBackend::CloseImported(ImportedPool& imported) {
  if (failed()) return health();
  DeviceScope scope(this);
  if (imported.base == nullptr) {
    return Status::InvalidArgument("the imported pool is closed");
  }
  return CloseImportedImpl(imported);
}

}  // namespace tierkv::storage
