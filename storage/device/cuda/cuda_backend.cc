// CudaBackend: DeviceBackend on one CUDA device (see device_backend.h).
// Over 600 lines on purpose: one class over one device's driver state
// (context, streams, event pool, sticky-error health), whose invariants
// every call shares; it mirrors emulated_backend.cc call for call.
//
// Pools: one cudaMalloc each; the tier above carves them up. Streams:
// cudaStreamNonBlocking, so they never wait for the legacy default stream
// an engine may use in the same process.
//
// Events: per stream, a count of events recorded; RecordEvent records a
// fresh cudaEvent (timing disabled). A stream runs in order, so an event
// found complete completes every earlier one, whose cudaEvents are then
// destroyed: the backend holds only the events not yet seen done.
//
// Errors: a submission the runtime refuses (cudaMemcpyAsync, the kernel
// launch) is returned at once as IOError. A sticky error (IsStickyCudaError:
// a faulting copy or kernel, an Xid) poisons the CUDA context for the rest
// of the process, wherever it shows (usually cudaEventQuery): the backend
// marks itself failed and answers Unavailable from then on, without
// calling the runtime (device_backend.h, Errors).
//
// Threads: the runtime's current device is per thread, so every entry point
// selects the backend's device first and gives the caller's back at its end
// (EnterDevice / RestoreDevice; cudaSetDevice is cheap once the context
// exists).
//
// Host memory: RegisterHost pins a range (cudaHostRegister, portable and
// mapped) and keeps its device address (cudaHostGetDevicePointer).
// GatherRows gives the kernel device-readable addresses of rows in
// registered ranges: the device reads them across the bus, no staging copy.
// Rows outside registered ranges go by one cudaMemcpyAsync each (correct,
// slower; the tier registers its arenas).
//
// IPC: cudaIpcGetMemHandle / cudaIpcOpenMemHandle. CUDA refuses to open a
// handle in the process that exported it, so the pools this process
// exported are kept in a process-wide table and ImportPool answers those
// with the pool's own address (the same contract as the emulated backend:
// any process of the node may import, this one included). An imported
// pool gets a pool id here, so copies and gathers can target it.
#include "storage/device/cuda/cuda_backend.h"

#include <cuda.h>  // CUresult, CUdeviceptr: types only, no libcuda
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>
#include <type_traits>
#include <vector>

#include "common/mutex.h"
#include "storage/device/cuda/copy_batch.h"
#include "storage/device/cuda/cuda_arch.h"
#include "storage/device/cuda/row_gather.h"

namespace tierkv::storage {
namespace {

using HandleBytes = std::array<std::byte, 64>;
static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(HandleBytes));

// ImportedPool::token values.
constexpr uint64_t kImportedHere = 1;    // a pool this process exported
constexpr uint64_t kImportedOpened = 2;  // cudaIpcOpenMemHandle
constexpr uint64_t kImportedFd = 3;      // the fd path (cuMemMap)

// The driver's virtual memory API (the fd path), fetched through the
// runtime so that nothing links libcuda (as cuMemGetAddressRange below).
struct VmmApi {
  decltype(&::cuMemRetainAllocationHandle) retain = nullptr;
  decltype(&::cuMemExportToShareableHandle) export_fd = nullptr;
  decltype(&::cuMemImportFromShareableHandle) import_fd = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemAddressReserve) reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
  bool ok = false;
};

// Sets `fn` to the driver's entry point `name` (its CUDA 12 ABI); false
// when the driver has none.
template <typename Fn>
bool GetDriverEntry(const char* name, Fn& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault,
                                       &found) == cudaSuccess &&
      found == cudaDriverEntryPointSuccess) {
    fn = reinterpret_cast<Fn>(p);
  }
  return fn != nullptr;
}

const VmmApi& Vmm() {
  static const VmmApi api = [] {
    VmmApi a;
    bool all = true;
    auto get = [&all](const char* name, auto& fn) {
      all = GetDriverEntry(name, fn) && all;
    };
    get("cuMemRetainAllocationHandle", a.retain);
    get("cuMemExportToShareableHandle", a.export_fd);
    get("cuMemImportFromShareableHandle", a.import_fd);
    get("cuMemRelease", a.release);
    get("cuMemAddressReserve", a.reserve);
    get("cuMemAddressFree", a.address_free);
    get("cuMemMap", a.map);
    get("cuMemUnmap", a.unmap);
    get("cuMemSetAccess", a.set_access);
    a.ok = all;
    return a;
  }();
  return api;
}

// Stream memory operations (WaitValueOn, WriteValueOn), as Vmm().
struct StreamMemOpsApi {
  decltype(&::cuStreamWaitValue32) wait = nullptr;
  decltype(&::cuStreamWriteValue32) write = nullptr;
  bool ok = false;
};

const StreamMemOpsApi& StreamMemOps() {
  static const StreamMemOpsApi api = [] {
    StreamMemOpsApi a;
    const bool wait = GetDriverEntry("cuStreamWaitValue32", a.wait);
    const bool write = GetDriverEntry("cuStreamWriteValue32", a.write);
    a.ok = wait && write;
    return a;
  }();
  return api;
}

Status NoVmm() {
  return Status::Unavailable(
      "the CUDA driver lacks the virtual memory API (cuMem*) the fd path "
      "needs");
}

std::string CudaText(cudaError_t e) {
  return fmt::format("{} ({})", cudaGetErrorString(e), cudaGetErrorName(e));
}

Status CudaError(std::string_view what, cudaError_t e) {
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it for the next call
    return Status::ResourceExhausted(fmt::format("{}: {}", what, CudaText(e)));
  }
  return Status::IOError(fmt::format("{}: {}", what, CudaText(e)));
}

Result<DeviceUuid> UuidOfDevice(int ordinal) {
  cudaDeviceProp prop{};
  const cudaError_t e = cudaGetDeviceProperties(&prop, ordinal);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status::Unavailable(fmt::format(
        "CUDA device {}: properties unreadable: {}", ordinal, CudaText(e)));
  }
  DeviceUuid uuid;
  static_assert(sizeof(prop.uuid) == sizeof(uuid));
  std::memcpy(uuid.data(), &prop.uuid, sizeof(uuid));
  return uuid;
}

// The errors after which "the process must be terminated and relaunched"
// (CUDA's driver_types.h): every later call of the process returns them.
bool IsStickyCudaError(cudaError_t e) {
  switch (e) {
    case cudaErrorContained:
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorMpsClientTerminated:
    case cudaErrorExternalDevice:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

// The pools this process exported, by handle (see IPC above).
struct LocalExports {
  Mutex mu;
  std::map<HandleBytes, ImportedPool> pools GUARDED_BY(mu);
};

LocalExports& Exports() {
  static LocalExports* exports = new LocalExports;  // never destroyed
  return *exports;
}

// A gather's row list (the rows' device-readable addresses, then the
// target slots), or a batch copy's items, in pinned host memory mapped for
// the device: the kernel reads it across the bus, as it reads the rows, so
// a launch needs no stream-ordered allocation and no staging copy. `used` is
// recorded after the kernel that read it last; the buffer is rewritten only
// once it is done.
struct RowList {
  std::byte* host = nullptr;    // cudaHostAlloc, mapped
  std::byte* device = nullptr;  // the same bytes' device address
  size_t bytes = 0;
  cudaEvent_t used = nullptr;
  bool in_use = false;  // `used` was recorded since the last rewrite
};

// Two row lists taken in turn: a gather writes one while the previous
// gather's kernel may still read the other.
struct RowLists {
  Mutex mu;
  RowList list[2] GUARDED_BY(mu);
  uint32_t next GUARDED_BY(mu) = 0;
};

struct Stream {
  cudaStream_t handle = nullptr;
  Mutex mu;
  uint64_t recorded GUARDED_BY(mu) = 0;      // events recorded so far
  uint64_t done_through GUARDED_BY(mu) = 0;  // every event <= it is done
  std::map<uint64_t, cudaEvent_t> pending GUARDED_BY(mu);
  std::vector<cudaEvent_t> spare GUARDED_BY(mu);  // done, kept for reuse
  Status error GUARDED_BY(mu);
  RowLists lists;
};

// Done events kept per stream for reuse (cudaEventCreate costs more than a
// record); more are destroyed.
constexpr size_t kSpareEvents = 64;

// A host -> device batch whose copies average at most this many bytes goes
// through the batch-copy kernel when its sources are mapped. Measured on an
// H200: a copy-engine call costs about as much as 24 KiB of transfer, so at
// 128 KiB per copy the engines would still lose ~16% to it.
constexpr uint64_t kKernelCopyMaxMeanBytes = 128 << 10;

class CudaBackend final : public DeviceBackend {
 public:
  // REQUIRES: o.device is an ordinal (OpenCudaBackend resolved it), whose
  // UUID is `uuid`.
  CudaBackend(const DeviceBackendOptions& o, const DeviceUuid& uuid)
      : DeviceBackend("cuda", o.streams), device_(o.device), uuid_(uuid) {}

  ~CudaBackend() override {
    if (cudaSetDevice(device_) != cudaSuccess) return;
    for (auto& s : streams_) {
      cudaStreamSynchronize(s->handle);
      {
        MutexLock lock(&s->mu);
        for (auto& [seq, event] : s->pending) cudaEventDestroy(event);
        for (cudaEvent_t event : s->spare) cudaEventDestroy(event);
      }
      FreeRowLists(s->lists);
      cudaStreamDestroy(s->handle);
    }
    // Foreign streams' gathers: their owners synchronized them before
    // this backend ends (GatherRowsOn's contract).
    FreeRowLists(foreign_lists_);
    MutexLock lock(&mu_);
    for (auto& [handle, open] : opened_) cudaIpcCloseMemHandle(open.base);
    for (auto& [id, pool] : pools_) {
      if (pool.fd_mapped) UnmapFdImport(pool.base, pool.bytes, pool.vmm);
      if (pool.imported) continue;
      ForgetExportLocked(pool);
      cudaFree(pool.base);
    }
    for (auto& [begin, range] : host_) {
      cudaHostUnregister(reinterpret_cast<void*>(begin));
    }
  }

  Status Init() {
    TIERKV_RETURN_IF_ERROR(Use());
    for (uint32_t i = 0; i < streams(); ++i) {
      auto s = std::make_unique<Stream>();
      const cudaError_t e =
          cudaStreamCreateWithFlags(&s->handle, cudaStreamNonBlocking);
      if (e != cudaSuccess) return Fail("cudaStreamCreate", e);
      streams_.push_back(std::move(s));
    }
    int sms = 0;
    const cudaError_t e =
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_);
    if (e != cudaSuccess) return Fail("cudaDeviceGetAttribute (SMs)", e);
    // Two blocks of the batch copy per SM: 32 KiB in flight per SM, enough
    // for bus speed from host memory (0.96x on an H200), while most of each
    // SM's threads stay the engine's. Device to device it reached 0.36x of
    // one contiguous copy, and 0.36x too with eight blocks per SM.
    copy_blocks_ = 2 * static_cast<uint32_t>(std::max(sms, 1));
    return Status::OK();
  }

 protected:
  uint64_t PoolBytes(uint32_t id) const override {
    MutexLock lock(&mu_);
    auto it = pools_.find(id);
    return it == pools_.end() ? 0 : it->second.bytes;
  }

  Result<DevicePool> AllocatePoolImpl(uint64_t bytes) override {
    TIERKV_RETURN_IF_ERROR(Use());
    void* base = nullptr;
    const cudaError_t e = cudaMalloc(&base, bytes);
    if (e != cudaSuccess) {
      return Fail(fmt::format("cudaMalloc of {} bytes", bytes), e);
    }
    MutexLock lock(&mu_);
    const uint32_t id = next_id_++;
    pools_[id] = Pool{.base = static_cast<std::byte*>(base), .bytes = bytes};
    return DevicePool{id, bytes};
  }

  Status FreePoolImpl(uint32_t id) override {
    TIERKV_RETURN_IF_ERROR(Use());
    MutexLock lock(&mu_);
    auto it = pools_.find(id);
    if (it->second.imported) {
      return Status::InvalidArgument(
          fmt::format("device pool {} is imported: close it instead", id));
    }
    ForgetExportLocked(it->second);
    const cudaError_t e = cudaFree(it->second.base);
    pools_.erase(it);
    return e == cudaSuccess ? Status::OK() : Fail("cudaFree", e);
  }

  Status CopyToDeviceImpl(StreamId stream, DeviceRegion dst,
                          std::span<const std::byte> src) override {
    TIERKV_RETURN_IF_ERROR(Use());
    const cudaError_t e =
        cudaMemcpyAsync(Address(dst), src.data(), src.size(),
                        cudaMemcpyHostToDevice, streams_[stream]->handle);
    return e == cudaSuccess ? Status::OK()
                            : Fail("cudaMemcpyAsync host to device", e);
  }

  // Copies small enough that the copy engines' per-copy cost dominates
  // (pages; see copy_batch.h), from registered (mapped) host memory, go
  // through the batch-copy kernel. Otherwise cudaMemcpyBatchAsync (CUDA
  // 12.8+): the sources are read in stream order (they are tierkv's DRAM or
  // bounce buffers, valid until the stream's event). A runtime or driver
  // without it (cudaErrorNotSupported, cudaErrorCallRequiresNewerDriver)
  // gets one cudaMemcpyAsync per copy, decided once.
  Status CopyToDeviceBatchImpl(
      StreamId stream, std::span<const DeviceRegion> dsts,
      std::span<const std::span<const std::byte>> srcs) override {
    TIERKV_RETURN_IF_ERROR(Use());
    Stream& st = *streams_[stream];
    cudaStream_t s = st.handle;
    uint64_t total = 0;
    for (const auto& src : srcs) total += src.size();
    if (total <= kKernelCopyMaxMeanBytes * srcs.size()) {
      std::vector<cuda::CopyItem> items;
      items.reserve(srcs.size());
      bool all_mapped = true;
      {
        MutexLock lock(&mu_);
        for (size_t i = 0; i < srcs.size() && all_mapped; ++i) {
          const std::byte* from =
              DeviceAddressLocked(srcs[i].data(), srcs[i].size());
          all_mapped = from != nullptr;
          if (all_mapped) {
            AddCopyItems(from, AddressLocked(dsts[i]), srcs[i].size(), items);
          }
        }
      }
      if (all_mapped) return LaunchCopyList(s, st.lists, items);
    }
    if (batch_copies_.load(std::memory_order_relaxed)) {
      std::vector<void*> to(dsts.size());
      std::vector<const void*> from(dsts.size());
      std::vector<size_t> sizes(dsts.size());
      for (size_t i = 0; i < dsts.size(); ++i) {
        to[i] = Address(dsts[i]);
        from[i] = srcs[i].data();
        sizes[i] = srcs[i].size();
      }
      cudaMemcpyAttributes attributes{};
      attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t first = 0;
      const cudaError_t e =
          cudaMemcpyBatchAsync(to.data(), from.data(), sizes.data(), to.size(),
                               &attributes, &first, 1, s);
      if (e == cudaSuccess) return Status::OK();
      if (e != cudaErrorNotSupported && e != cudaErrorCallRequiresNewerDriver) {
        return Fail("cudaMemcpyBatchAsync host to device", e);
      }
      cudaGetLastError();  // not sticky: clear it
      batch_copies_.store(false, std::memory_order_relaxed);
    }
    for (size_t i = 0; i < dsts.size(); ++i) {
      const cudaError_t e =
          cudaMemcpyAsync(Address(dsts[i]), srcs[i].data(), srcs[i].size(),
                          cudaMemcpyHostToDevice, s);
      if (e != cudaSuccess) return Fail("cudaMemcpyAsync host to device", e);
    }
    return Status::OK();
  }

  Status CopyToHostImpl(StreamId stream, std::span<std::byte> dst,
                        DeviceRegion src) override {
    TIERKV_RETURN_IF_ERROR(Use());
    const cudaError_t e =
        cudaMemcpyAsync(dst.data(), Address(src), dst.size(),
                        cudaMemcpyDeviceToHost, streams_[stream]->handle);
    return e == cudaSuccess ? Status::OK()
                            : Fail("cudaMemcpyAsync device to host", e);
  }

  Status CopyOnDeviceImpl(StreamId stream, DeviceRegion dst,
                          DeviceRegion src) override {
    TIERKV_RETURN_IF_ERROR(Use());
    const cudaError_t e =
        cudaMemcpyAsync(Address(dst), Address(src), src.bytes,
                        cudaMemcpyDeviceToDevice, streams_[stream]->handle);
    return e == cudaSuccess ? Status::OK()
                            : Fail("cudaMemcpyAsync device to device", e);
  }

  // Always the batch-copy kernel: one copy-engine call per page reached
  // 0.01x of one contiguous copy on an H200 (copy_batch.h).
  Status CopyOnDeviceBatchImpl(StreamId stream,
                               std::span<const DeviceRegion> dsts,
                               std::span<const DeviceRegion> srcs) override {
    TIERKV_RETURN_IF_ERROR(Use());
    std::vector<cuda::CopyItem> items;
    items.reserve(srcs.size());
    {
      MutexLock lock(&mu_);
      for (size_t i = 0; i < srcs.size(); ++i) {
        AddCopyItems(AddressLocked(srcs[i]), AddressLocked(dsts[i]),
                     srcs[i].bytes, items);
      }
    }
    Stream& st = *streams_[stream];
    return LaunchCopyList(st.handle, st.lists, items);
  }

  Status GatherRowsImpl(StreamId stream, DeviceRegion dst,
                        std::span<const std::byte* const> rows,
                        uint32_t row_bytes,
                        std::span<const uint32_t> dst_rows) override {
    Stream& st = *streams_[stream];
    return GatherOn(st.handle, st.lists, dst, rows, row_bytes, dst_rows);
  }

  // An engine's stream: the kernel goes on it directly, so it is ordered
  // with the engine's work both ways.
  Status GatherRowsOnImpl(const ForeignStream& foreign, DeviceRegion dst,
                          std::span<const std::byte* const> rows,
                          uint32_t row_bytes,
                          std::span<const uint32_t> dst_rows) override {
    if (foreign.emulated != nullptr) {
      return Status::InvalidArgument(
          "a CUDA backend orders work on a cudaStream_t "
          "(ForeignStream::cuda), not on an emulated backend's stream");
    }
    return GatherOn(static_cast<cudaStream_t>(foreign.cuda), foreign_lists_,
                    dst, rows, row_bytes, dst_rows);
  }

  Status StreamWaitForeignImpl(StreamId stream,
                               const ForeignStream& foreign) override {
    if (foreign.emulated != nullptr) {
      return Status::InvalidArgument(
          "a CUDA backend waits on a cudaStream_t (ForeignStream::cuda)");
    }
    TIERKV_RETURN_IF_ERROR(Use());
    Stream& s = *streams_[stream];
    MutexLock lock(&s.mu);
    auto taken = TakeEventLocked(s);
    if (!taken.ok()) return taken.status();
    cudaEvent_t event = *taken;
    cudaError_t e =
        cudaEventRecord(event, static_cast<cudaStream_t>(foreign.cuda));
    if (e == cudaSuccess) e = cudaStreamWaitEvent(s.handle, event, 0);
    // The wait is queued: the event may be reused (a record replaces what
    // a later wait sees, not what this one captured).
    s.spare.push_back(event);
    return e == cudaSuccess ? Status::OK() : Fail("cudaStreamWaitEvent", e);
  }

  Status WaitValueOnImpl(const ForeignStream& foreign,
                         const std::atomic<uint32_t>* word,
                         uint32_t value) override {
    return StreamMemOp(foreign, word, value, /*write=*/false);
  }
  Status WriteValueOnImpl(const ForeignStream& foreign,
                          std::atomic<uint32_t>* word,
                          uint32_t value) override {
    return StreamMemOp(foreign, word, value, /*write=*/true);
  }

  // cuStreamWaitValue32 (GEQ) or cuStreamWriteValue32 on the device
  // address of a registered host word. A write is ordered after the
  // stream's earlier work by the stream itself; a wait makes later work
  // wait, and the engine's kernels then read what the daemon's copies
  // wrote (complete before the daemon's host raised the word).
  Status StreamMemOp(const ForeignStream& foreign, const void* word,
                     uint32_t value, bool write) {
    if (foreign.emulated != nullptr) {
      return Status::InvalidArgument(
          "a CUDA backend orders work on a cudaStream_t (ForeignStream::cuda)");
    }
    const StreamMemOpsApi& api = StreamMemOps();
    if (!api.ok) {
      return Status::Unavailable(
          "the CUDA driver lacks stream memory operations "
          "(cuStreamWaitValue32)");
    }
    TIERKV_RETURN_IF_ERROR(Use());
    const std::byte* device = nullptr;
    {
      MutexLock lock(&mu_);
      device = DeviceAddressLocked(static_cast<const std::byte*>(word),
                                   sizeof(uint32_t));
    }
    if (device == nullptr) {
      return Status::InvalidArgument("the word is not registered host memory");
    }
    auto stream = static_cast<CUstream>(foreign.cuda);
    const auto address = reinterpret_cast<CUdeviceptr>(device);
    const CUresult r =
        write ? api.write(stream, address, value, CU_STREAM_WRITE_VALUE_DEFAULT)
              : api.wait(stream, address, value, CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS) {
      return Status::IOError(
          fmt::format("{} on the engine's stream: error {}",
                      write ? "cuStreamWriteValue32" : "cuStreamWaitValue32",
                      static_cast<int>(r)));
    }
    return Status::OK();
  }

  Status LaunchHostFunctionImpl(StreamId stream,
                                std::function<void()> fn) override {
    TIERKV_RETURN_IF_ERROR(Use());
    auto* heap = new std::function<void()>(std::move(fn));
    const cudaError_t e = cudaLaunchHostFunc(
        streams_[stream]->handle,
        [](void* p) {
          auto* f = static_cast<std::function<void()>*>(p);
          (*f)();
          delete f;
        },
        heap);
    if (e != cudaSuccess) {
      delete heap;
      return Fail("cudaLaunchHostFunc", e);
    }
    return Status::OK();
  }

  // One gather on `s`, its row list in one of `lists`.
  Status GatherOn(cudaStream_t s, RowLists& lists, DeviceRegion dst,
                  std::span<const std::byte* const> rows, uint32_t row_bytes,
                  std::span<const uint32_t> dst_rows) {
    if (rows.empty()) return Status::OK();
    TIERKV_RETURN_IF_ERROR(Use());
    std::byte* out = Address(dst);
    auto target = [&](size_t i) {
      return out + uint64_t{dst_rows.empty() ? static_cast<uint32_t>(i)
                                             : dst_rows[i]} *
                       row_bytes;
    };
    std::vector<const std::byte*> mapped(rows.size());
    bool all_mapped = true;
    {
      MutexLock lock(&mu_);
      for (size_t i = 0; i < rows.size() && all_mapped; ++i) {
        mapped[i] = DeviceAddressLocked(rows[i], row_bytes);
        all_mapped = mapped[i] != nullptr;
      }
    }
    if (!all_mapped) {
      for (size_t i = 0; i < rows.size(); ++i) {
        const cudaError_t e = cudaMemcpyAsync(target(i), rows[i], row_bytes,
                                              cudaMemcpyHostToDevice, s);
        if (e != cudaSuccess) return Fail("cudaMemcpyAsync (row)", e);
      }
      return Status::OK();
    }
    return LaunchRowList(s, lists, out, mapped, row_bytes, dst_rows);
  }

  // Rows already on the device: their device addresses are the row list.
  Status PackRowsImpl(StreamId stream, DeviceRegion dst, DeviceRegion src,
                      uint32_t row_bytes,
                      std::span<const uint32_t> src_rows) override {
    TIERKV_RETURN_IF_ERROR(Use());
    const std::byte* from = Address(src);
    std::vector<const std::byte*> rows(src_rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      rows[i] = from + uint64_t{src_rows[i]} * row_bytes;
    }
    Stream& st = *streams_[stream];
    return LaunchRowList(st.handle, st.lists, Address(dst), rows, row_bytes,
                         {});
  }

  // The gather kernel over `device_rows` (addresses the device reads) into
  // `out`, row i to row dst_rows[i] (or i). The row list goes to the kernel
  // through a mapped pinned buffer (see RowList): no allocation, no copy
  // on the stream.
  Status LaunchRowList(cudaStream_t s, RowLists& lists, std::byte* out,
                       std::span<const std::byte* const> device_rows,
                       uint32_t row_bytes, std::span<const uint32_t> dst_rows) {
    const size_t list_bytes = device_rows.size() * sizeof(const std::byte*);
    const size_t slot_bytes = dst_rows.size() * sizeof(uint32_t);
    MutexLock lists_lock(&lists.mu);
    auto list = TakeListLocked(lists, list_bytes + slot_bytes);
    if (!list.ok()) return list.status();
    std::memcpy((*list)->host, device_rows.data(), list_bytes);
    if (slot_bytes != 0) {
      std::memcpy((*list)->host + list_bytes, dst_rows.data(), slot_bytes);
    }
    const auto* slots_on_device =
        dst_rows.empty()
            ? nullptr
            : reinterpret_cast<const uint32_t*>((*list)->device + list_bytes);
    const cudaError_t e = cuda::LaunchGatherRows(
        out, slots_on_device,
        reinterpret_cast<const std::byte* const*>((*list)->device),
        static_cast<uint32_t>(device_rows.size()), row_bytes, s);
    if (e != cudaSuccess) return Fail("row gather", e);
    return MarkListUsed(**list, s);
  }

  // The batch-copy kernel over `items` (device addresses), its list passed
  // as LaunchRowList passes rows.
  Status LaunchCopyList(cudaStream_t s, RowLists& lists,
                        std::span<const cuda::CopyItem> items) {
    if (items.empty()) return Status::OK();
    const size_t list_bytes = items.size_bytes();
    MutexLock lists_lock(&lists.mu);
    auto list = TakeListLocked(lists, list_bytes);
    if (!list.ok()) return list.status();
    std::memcpy((*list)->host, items.data(), list_bytes);
    const cudaError_t e = cuda::LaunchCopyBatch(
        reinterpret_cast<const cuda::CopyItem*>((*list)->device),
        static_cast<uint32_t>(items.size()), copy_blocks_, s);
    if (e != cudaSuccess) return Fail("batch copy", e);
    return MarkListUsed(**list, s);
  }

  // The next of the stream's two lists, grown to `bytes`, once the kernel
  // that last read it (two launches ago on this stream: normally long
  // done) is over.
  Result<RowList*> TakeListLocked(RowLists& lists, size_t bytes)
      REQUIRES(lists.mu) {
    RowList& list = lists.list[lists.next];
    lists.next ^= 1;
    if (list.in_use) {
      const cudaError_t e = cudaEventSynchronize(list.used);
      if (e != cudaSuccess) return Fail("row list reuse", e);
      list.in_use = false;
    }
    TIERKV_RETURN_IF_ERROR(FitRowList(list, bytes));
    return &list;
  }

  // After the launch that reads `list` on `s`.
  Status MarkListUsed(RowList& list, cudaStream_t s) {
    const cudaError_t e = cudaEventRecord(list.used, s);
    if (e != cudaSuccess) return Fail("cudaEventRecord (row list)", e);
    list.in_use = true;
    return Status::OK();
  }

  std::byte* PoolBaseImpl(uint32_t pool) override {
    return Address(DeviceRegion{pool, 0, 0});
  }
  bool host_addressable() const override { return false; }
  int device() const override { return device_; }
  DeviceUuid uuid() const override { return uuid_; }

  Status RegisterHostImpl(std::span<std::byte> memory) override {
    TIERKV_RETURN_IF_ERROR(Use());
    cudaError_t e =
        cudaHostRegister(memory.data(), memory.size(),
                         cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (e != cudaSuccess) return Fail("cudaHostRegister", e);
    void* device = nullptr;
    e = cudaHostGetDevicePointer(&device, memory.data(), 0);
    if (e != cudaSuccess) {
      cudaHostUnregister(memory.data());
      return Fail("cudaHostGetDevicePointer", e);
    }
    MutexLock lock(&mu_);
    host_[reinterpret_cast<uintptr_t>(memory.data())] =
        HostRange{memory.size(), static_cast<std::byte*>(device)};
    return Status::OK();
  }

  Status UnregisterHostImpl(std::span<std::byte> memory) override {
    TIERKV_RETURN_IF_ERROR(Use());
    {
      MutexLock lock(&mu_);
      host_.erase(reinterpret_cast<uintptr_t>(memory.data()));
    }
    const cudaError_t e = cudaHostUnregister(memory.data());
    return e == cudaSuccess ? Status::OK() : Fail("cudaHostUnregister", e);
  }

  // An event from the stream's pool, or a new one.
  Result<cudaEvent_t> TakeEventLocked(Stream& s) REQUIRES(s.mu) {
    if (!s.spare.empty()) {
      cudaEvent_t event = s.spare.back();
      s.spare.pop_back();
      return event;
    }
    cudaEvent_t event = nullptr;
    const cudaError_t made =
        cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (made != cudaSuccess) return Fail("cudaEventCreate", made);
    return event;
  }

  Result<DeviceEvent> RecordEventImpl(StreamId stream) override {
    TIERKV_RETURN_IF_ERROR(Use());
    Stream& s = *streams_[stream];
    MutexLock lock(&s.mu);
    auto taken = TakeEventLocked(s);
    if (!taken.ok()) return taken.status();
    cudaEvent_t event = *taken;
    const cudaError_t e = cudaEventRecord(event, s.handle);
    if (e != cudaSuccess) {
      cudaEventDestroy(event);
      return Fail("cudaEventRecord", e);
    }
    const uint64_t seq = ++s.recorded;
    s.pending.emplace(seq, event);
    return DeviceEvent{stream, seq};
  }

  Status WaitEventImpl(DeviceEvent event,
                       std::chrono::milliseconds timeout) override {
    TIERKV_RETURN_IF_ERROR(Use());
    Stream& s = *streams_[event.stream];
    using std::chrono::microseconds;
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + timeout;
    // Polls rather than cudaEventSynchronize, which has no timeout. A
    // layer's copies often finish within microseconds of the wait: the
    // first 20 µs spin on cudaEventQuery (a sleep costs >= 50 µs with the
    // default timer slack), the next 200 µs yield the core, and only then
    // does the wait sleep, 10 µs doubling to 100 µs between polls.
    constexpr microseconds kSpin{20}, kYield{200}, kLongestSleep{100};
    auto pause = microseconds(10);
    MutexLock lock(&s.mu);
    if (event.sequence > s.recorded) {
      return Status::InvalidArgument(
          fmt::format("event {} of stream {} was never recorded",
                      event.sequence, event.stream));
    }
    while (!PollLocked(s, event.sequence)) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        return Status::IOError(
            fmt::format("device event {} of stream {} not done after {} ms",
                        event.sequence, event.stream, timeout.count()));
      }
      lock.Unlock();
      if (now - start < kSpin) {
        // poll again at once
      } else if (now - start < kYield) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, kLongestSleep);
      }
      lock.Lock();
    }
    Status error = std::move(s.error);
    s.error = Status::OK();
    return error;
  }

  bool EventDoneImpl(DeviceEvent event) override {
    if (!Use().ok()) return false;
    Stream& s = *streams_[event.stream];
    MutexLock lock(&s.mu);
    return event.sequence <= s.recorded && PollLocked(s, event.sequence);
  }

  Result<IpcHandle> ExportPoolImpl(uint32_t id) override {
    TIERKV_RETURN_IF_ERROR(Use());
    MutexLock lock(&mu_);
    Pool& pool = pools_.at(id);
    if (pool.imported) {
      return Status::InvalidArgument(fmt::format(
          "device pool {} is imported: export it from its owner", id));
    }
    if (!pool.exported) {
      cudaIpcMemHandle_t h;
      const cudaError_t e = cudaIpcGetMemHandle(&h, pool.base);
      if (e != cudaSuccess) return Fail("cudaIpcGetMemHandle", e);
      std::memcpy(pool.handle.data(), &h, sizeof(h));
      pool.exported = true;
      LocalExports& exports = Exports();
      MutexLock exports_lock(&exports.mu);
      exports.pools[pool.handle] =
          ImportedPool{pool.base, pool.bytes, kImportedHere};
    }
    IpcHandle handle;
    handle.bytes = pool.handle;
    handle.pool_bytes = pool.bytes;
    return handle;
  }

  Result<ExportedRange> ExportRangeImpl(const std::byte* data,
                                        uint64_t bytes) override {
    TIERKV_RETURN_IF_ERROR(Use());
    uint32_t own = 0;  // pool ids start at 1
    uint64_t offset = 0;
    {
      MutexLock lock(&mu_);
      for (const auto& [id, pool] : pools_) {
        if (!pool.imported && data >= pool.base &&
            data < pool.base + pool.bytes) {
          own = id;
          offset = static_cast<uint64_t>(data - pool.base);
          if (bytes > pool.bytes - offset)
            return PastAllocation(offset, bytes, pool.bytes);
          break;
        }
      }
    }
    if (own != 0) {
      auto handle = ExportPoolImpl(own);
      if (!handle.ok()) return handle.status();
      return ExportedRange{*handle, offset, uuid_};
    }
    // Another allocator's memory (PyTorch's caching allocator): the
    // driver knows the allocation around it.
    auto range = AllocationRange(data);
    if (!range.ok()) {
      return Status::InvalidArgument(fmt::format(
          "{} is not device memory of this process ({})",
          static_cast<const void*>(data), range.status().message()));
    }
    offset = static_cast<uint64_t>(data - range->base);
    if (bytes > range->bytes - offset) {
      return PastAllocation(offset, bytes, range->bytes);
    }
    cudaIpcMemHandle_t h;
    const cudaError_t e = cudaIpcGetMemHandle(&h, range->base);
    if (e != cudaSuccess) {
      if (IsStickyCudaError(e)) return Fail("cudaIpcGetMemHandle", e);
      cudaGetLastError();
      return Status::InvalidArgument(fmt::format(
          "the allocation holding {} cannot be exported: "
          "cudaIpcGetMemHandle: {}. Memory of cudaMallocAsync pools and of "
          "PyTorch's expandable segments has no legacy IPC handle; allocate "
          "the KV cache with cudaMalloc (PYTORCH_CUDA_ALLOC_CONF="
          "expandable_segments:False)",
          static_cast<const void*>(data), CudaText(e)));
    }
    ExportedRange out;
    std::memcpy(out.handle.bytes.data(), &h, sizeof(h));
    out.handle.pool_bytes = range->bytes;
    out.offset = offset;
    auto holder = UuidOfMemory(data);
    if (!holder.ok()) return holder.status();
    out.device_uuid = *holder;
    return out;
  }

  // Memory of the virtual memory API (cuMemCreate + cuMemMap: cudaMallocAsync
  // pools, PyTorch's expandable segments), which has no legacy IPC handle.
  Result<ExportedFd> ExportRangeFdImpl(const std::byte* data,
                                       uint64_t bytes) override {
    TIERKV_RETURN_IF_ERROR(Use());
    const VmmApi& vmm = Vmm();
    if (!vmm.ok) return NoVmm();
    auto range = AllocationRange(data);
    if (!range.ok()) {
      return Status::InvalidArgument(fmt::format(
          "{} is not device memory of this process ({})",
          static_cast<const void*>(data), range.status().message()));
    }
    const uint64_t offset = static_cast<uint64_t>(data - range->base);
    if (bytes > range->bytes - offset) {
      return PastAllocation(offset, bytes, range->bytes);
    }
    CUmemGenericAllocationHandle h = 0;
    if (vmm.retain(&h, const_cast<std::byte*>(data)) != CUDA_SUCCESS) {
      return Status::InvalidArgument(fmt::format(
          "{} is not memory of the CUDA virtual memory API (cuMemCreate); "
          "cudaMalloc'd memory is exported by ExportRange",
          static_cast<const void*>(data)));
    }
    int fd = -1;
    const CUresult r =
        vmm.export_fd(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    vmm.release(h);  // the retain's reference; the fd holds its own
    if (r != CUDA_SUCCESS) {
      return Status::InvalidArgument(fmt::format(
          "the allocation holding {} cannot be exported as a file "
          "descriptor (cuMemExportToShareableHandle: error {}): it must be "
          "created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR among its "
          "requested handle types",
          static_cast<const void*>(data), static_cast<int>(r)));
    }
    auto holder = UuidOfMemory(data);
    if (!holder.ok()) {
      ::close(fd);
      return holder.status();
    }
    return ExportedFd{fd, range->bytes, offset, *holder};
  }

  // Maps the exported allocation into a reserved address range of this
  // process; the mapping holds the physical memory until CloseImported,
  // whatever its exporter does.
  Result<ImportedPool> ImportPoolFdImpl(int fd, uint64_t pool_bytes) override {
    TIERKV_RETURN_IF_ERROR(Use());
    const VmmApi& vmm = Vmm();
    if (!vmm.ok) return NoVmm();
    MutexLock open_lock(&open_mu_);  // mapping: see ImportPoolImpl
    CUmemGenericAllocationHandle h = 0;
    if (vmm.import_fd(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) !=
        CUDA_SUCCESS) {
      return Status::InvalidArgument(
          "the fd is not an exported CUDA allocation "
          "(cuMemImportFromShareableHandle refused it)");
    }
    CUdeviceptr va = 0;
    if (vmm.reserve(&va, pool_bytes, 0, 0, 0) != CUDA_SUCCESS) {
      vmm.release(h);
      return Status::ResourceExhausted(fmt::format(
          "cuMemAddressReserve of {} bytes for a device pool", pool_bytes));
    }
    // A size past the allocation, or not a multiple of its granularity,
    // fails here: a lying client cannot make copies run past the mapping.
    if (vmm.map(va, pool_bytes, 0, h, 0) != CUDA_SUCCESS) {
      vmm.address_free(va, pool_bytes);
      vmm.release(h);
      return Status::InvalidArgument(fmt::format(
          "cannot map {} bytes of the exported allocation (more than it "
          "holds, or not a multiple of its granularity)",
          pool_bytes));
    }
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (vmm.set_access(va, pool_bytes, &access, 1) != CUDA_SUCCESS) {
      UnmapFdImport(reinterpret_cast<std::byte*>(va), pool_bytes, h);
      return Status::IOError(fmt::format(
          "cuMemSetAccess for device {} on an imported pool", device_));
    }
    auto* base = reinterpret_cast<std::byte*>(va);
    MutexLock lock(&mu_);
    const uint32_t id = next_id_++;
    pools_[id] = Pool{.base = base,
                      .bytes = pool_bytes,
                      .imported = true,
                      .fd_mapped = true,
                      .vmm = h};
    return ImportedPool{base, pool_bytes, id, kImportedFd};
  }

  Result<ImportedPool> ImportPoolImpl(const IpcHandle& handle) override {
    if (handle.pool_bytes == 0) {
      return Status::InvalidArgument("a device pool handle of 0 bytes");
    }
    std::byte* local = nullptr;
    {
      LocalExports& exports = Exports();
      MutexLock lock(&exports.mu);
      auto it = exports.pools.find(handle.bytes);
      if (it != exports.pools.end()) {
        if (it->second.bytes != handle.pool_bytes) {
          return Status::InvalidArgument(
              "the device pool handle's size does not match the pool");
        }
        local = static_cast<std::byte*>(it->second.base);
      }
    }
    if (local != nullptr) {
      MutexLock lock(&mu_);
      return AddImportedLocked(local, handle, /*opened=*/false);
    }
    TIERKV_RETURN_IF_ERROR(Use());
    // Opening a handle maps memory (milliseconds): it holds open_mu_, which
    // only imports and closes take, never mu_, which every copy takes to
    // find its pool; so an engine registering never stalls others' copies.
    MutexLock open_lock(&open_mu_);
    {
      // A handle already open here (an engine registering one allocation
      // for several layers) is shared: CUDA maps a handle once per process.
      MutexLock lock(&mu_);
      if (auto it = opened_.find(handle.bytes); it != opened_.end()) {
        if (handle.pool_bytes > it->second.bytes) {
          return Status::InvalidArgument(fmt::format(
              "the device pool handle says {} bytes; the allocation has {}",
              handle.pool_bytes, it->second.bytes));
        }
        ++it->second.refs;
        return AddImportedLocked(it->second.base, handle, /*opened=*/true);
      }
    }
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.bytes.data(), sizeof(h));
    void* base = nullptr;
    const cudaError_t e =
        cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return Status::NotFound(fmt::format(
          "cannot open the device pool handle (its pool or process may be "
          "gone): cudaIpcOpenMemHandle: {}",
          CudaText(e)));
    }
    // The handle's size comes from the client: check it against the
    // allocation, or a lying client would make this process's copies run
    // past the mapping (a device fault poisons the whole context).
    auto actual = AllocationBytes(base);
    if (!actual.ok() || *actual < handle.pool_bytes) {
      cudaIpcCloseMemHandle(base);
      if (!actual.ok()) return actual.status();
      return Status::InvalidArgument(fmt::format(
          "the device pool handle says {} bytes; the allocation has {}",
          handle.pool_bytes, *actual));
    }
    MutexLock lock(&mu_);
    opened_[handle.bytes] = Opened{static_cast<std::byte*>(base), *actual, 1};
    return AddImportedLocked(static_cast<std::byte*>(base), handle,
                             /*opened=*/true);
  }

  Status CloseImportedImpl(ImportedPool& imported) override {
    TIERKV_RETURN_IF_ERROR(Use());
    MutexLock open_lock(&open_mu_);  // unmapping, like mapping: see Import
    Pool closed;
    std::byte* ipc_unmap = nullptr;  // a legacy handle's last import
    {
      MutexLock lock(&mu_);
      auto it = pools_.find(imported.pool);
      if (it == pools_.end() || !it->second.imported ||
          it->second.base != imported.base) {
        return Status::InvalidArgument("not a pool this backend imported");
      }
      closed = it->second;
      pools_.erase(it);
      imported = {};
      if (closed.opened) {
        auto open = opened_.find(closed.handle);
        if (open != opened_.end() && --open->second.refs == 0) {
          ipc_unmap = open->second.base;
          opened_.erase(open);
        }
      }
    }
    // Unmapping outside mu_, which every copy takes.
    if (closed.fd_mapped) UnmapFdImport(closed.base, closed.bytes, closed.vmm);
    if (ipc_unmap == nullptr) return Status::OK();
    const cudaError_t e = cudaIpcCloseMemHandle(ipc_unmap);
    return e == cudaSuccess ? Status::OK() : Fail("cudaIpcCloseMemHandle", e);
  }

 private:
  struct Pool {
    std::byte* base = nullptr;
    uint64_t bytes = 0;
    HandleBytes handle{};
    bool exported = false;
    bool imported = false;   // another pool's memory, addressed here
    bool opened = false;     // by cudaIpcOpenMemHandle (closed with it)
    bool fd_mapped = false;  // by the fd path (ImportPoolFd)
    CUmemGenericAllocationHandle vmm{};  // fd_mapped: the imported handle
  };

  // Undoes ImportPoolFd's mapping; the physical memory goes once its last
  // holder (the exporter, another importer) lets go.
  static void UnmapFdImport(std::byte* base, uint64_t bytes,
                            CUmemGenericAllocationHandle h) {
    const VmmApi& vmm = Vmm();
    const auto va = reinterpret_cast<CUdeviceptr>(base);
    vmm.unmap(va, bytes);
    vmm.address_free(va, bytes);
    vmm.release(h);
  }

  // A handle opened by cudaIpcOpenMemHandle, shared by its imports.
  struct Opened {
    std::byte* base = nullptr;
    uint64_t bytes = 0;  // the allocation's, from the driver
    uint32_t refs = 0;
  };

  // An imported pool becomes addressable as a DeviceRegion pool.
  ImportedPool AddImportedLocked(std::byte* base, const IpcHandle& handle,
                                 bool opened) REQUIRES(mu_) {
    const uint32_t id = next_id_++;
    pools_[id] = Pool{.base = base,
                      .bytes = handle.pool_bytes,
                      .handle = handle.bytes,
                      .imported = true,
                      .opened = opened};
    return ImportedPool{base, handle.pool_bytes, id,
                        opened ? kImportedOpened : kImportedHere};
  }
  struct HostRange {
    uint64_t bytes = 0;
    std::byte* device = nullptr;  // the range's address on the device
  };

  // The UUID of the device whose memory `p` is.
  static Result<DeviceUuid> UuidOfMemory(const void* p) {
    cudaPointerAttributes attr{};
    const cudaError_t e = cudaPointerGetAttributes(&attr, p);
    if (e != cudaSuccess || attr.type != cudaMemoryTypeDevice) {
      cudaGetLastError();
      return Status::InvalidArgument(
          fmt::format("{} is not device memory (cudaPointerGetAttributes)", p));
    }
    return UuidOfDevice(attr.device);
  }

  static Status PastAllocation(uint64_t offset, uint64_t bytes,
                               uint64_t allocation) {
    return Status::InvalidArgument(
        fmt::format("device range [+{}, +{}) runs past its {}-byte allocation",
                    offset, bytes, allocation));
  }

  struct AllocationSpan {
    std::byte* base = nullptr;
    uint64_t bytes = 0;
  };
  // The allocation holding device address `p` (cuMemGetAddressRange; the
  // runtime API has no equivalent, so the driver's entry point is fetched
  // through the runtime, without linking libcuda).
  static Result<AllocationSpan> AllocationRange(const void* p) {
    using GetRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
    static GetRange get_range = [] {
      void* fn = nullptr;
      cudaDriverEntryPointQueryResult found{};
      if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                           cudaEnableDefault,
                                           &found) != cudaSuccess ||
          found != cudaDriverEntryPointSuccess) {
        fn = nullptr;
      }
      return reinterpret_cast<GetRange>(fn);
    }();
    if (get_range == nullptr) {
      return Status::Unavailable(
          "cannot check an imported pool's size: the driver has no "
          "cuMemGetAddressRange");
    }
    CUdeviceptr start = 0;
    size_t bytes = 0;
    if (get_range(&start, &bytes, reinterpret_cast<CUdeviceptr>(p)) !=
        CUDA_SUCCESS) {
      return Status::IOError("cuMemGetAddressRange found no allocation there");
    }
    return AllocationSpan{reinterpret_cast<std::byte*>(start),
                          static_cast<uint64_t>(bytes)};
  }

  // The bytes of the allocation from `base` on (an imported pool's).
  static Result<uint64_t> AllocationBytes(void* base) {
    auto range = AllocationRange(base);
    if (!range.ok()) return range.status();
    return range->bytes -
           static_cast<uint64_t>(static_cast<std::byte*>(base) - range->base);
  }

  Status Use() {
    const cudaError_t e = cudaSetDevice(device_);
    return e == cudaSuccess ? Status::OK() : Fail("cudaSetDevice", e);
  }

  // The Status of a failed runtime call; a sticky error (the context is
  // poisoned) fails the backend (see Errors in device_backend.h).
  Status Fail(std::string_view what, cudaError_t e) {
    if (IsStickyCudaError(e)) {
      return MarkFailed(
          Status::IOError(fmt::format("{}: {}", what, CudaText(e))));
    }
    return CudaError(what, e);
  }

  // The caller's current device, saved around every public method (see
  // device_backend.h); Use() inside the methods then finds it set.
  int EnterDevice() override {
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess) {
      cudaGetLastError();  // no context yet on this thread: nothing to keep
      return -1;
    }
    if (previous == device_) return -1;
    cudaSetDevice(device_);  // a failure shows in the method's own Use()
    return previous;
  }
  void RestoreDevice(int previous) override {
    if (previous >= 0) cudaSetDevice(previous);
  }

  // REQUIRES: the region was checked (the public method did).
  std::byte* Address(const DeviceRegion& region) const {
    MutexLock lock(&mu_);
    return AddressLocked(region);
  }
  std::byte* AddressLocked(const DeviceRegion& region) const REQUIRES(mu_) {
    return pools_.at(region.pool).base + region.offset;
  }

  // Appends the copy of `bytes` from `src` to `dst` (device addresses) to
  // `items`, in pieces of at most kCopyItemMaxBytes so that the kernel's
  // blocks share a batch of large copies evenly.
  static void AddCopyItems(const std::byte* src, std::byte* dst, uint64_t bytes,
                           std::vector<cuda::CopyItem>& items) {
    for (uint64_t at = 0; at < bytes; at += cuda::kCopyItemMaxBytes) {
      items.push_back(
          {src + at, dst + at, std::min(cuda::kCopyItemMaxBytes, bytes - at)});
    }
  }

  // The device address of [p, p + bytes) when it lies in one registered
  // host range, else nullptr.
  const std::byte* DeviceAddressLocked(const std::byte* p, uint64_t bytes) const
      REQUIRES(mu_) {
    const auto address = reinterpret_cast<uintptr_t>(p);
    auto it = host_.upper_bound(address);
    if (it == host_.begin()) return nullptr;
    --it;
    const uint64_t offset = address - it->first;
    if (offset > it->second.bytes || bytes > it->second.bytes - offset) {
      return nullptr;
    }
    return it->second.device + offset;
  }

  void ForgetExportLocked(const Pool& pool) REQUIRES(mu_) {
    if (!pool.exported) return;
    LocalExports& exports = Exports();
    MutexLock lock(&exports.mu);
    exports.pools.erase(pool.handle);
  }

  // An event is done once cudaEventQuery says so; events before it on the
  // stream are then done too (in-order streams) and are destroyed.
  bool PollLocked(Stream& s, uint64_t sequence) REQUIRES(s.mu) {
    if (sequence <= s.done_through) return true;
    const cudaError_t e = cudaEventQuery(s.pending.at(sequence));
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess && s.error.ok()) {
      s.error = Fail("device work on the stream", e);
    }
    for (auto it = s.pending.begin();
         it != s.pending.end() && it->first <= sequence;) {
      if (s.spare.size() < kSpareEvents) {
        s.spare.push_back(it->second);
      } else {
        cudaEventDestroy(it->second);
      }
      it = s.pending.erase(it);
    }
    s.done_through = sequence;
    return true;
  }

  // Grows `list` to hold `bytes` (pinned, mapped; at least 64 KiB, doubling
  // so a long run of gathers allocates a few times at most).
  // REQUIRES: the list is not in use.
  Status FitRowList(RowList& list, size_t bytes) {
    if (list.used == nullptr) {
      const cudaError_t e =
          cudaEventCreateWithFlags(&list.used, cudaEventDisableTiming);
      if (e != cudaSuccess) return Fail("cudaEventCreate (row list)", e);
    }
    if (list.bytes >= bytes) return Status::OK();
    const size_t size = std::max({bytes, 2 * list.bytes, size_t{64} << 10});
    if (list.host != nullptr) cudaFreeHost(list.host);
    list = RowList{.used = list.used};
    void* host = nullptr;
    cudaError_t e =
        cudaHostAlloc(&host, size, cudaHostAllocMapped | cudaHostAllocPortable);
    if (e != cudaSuccess) return Fail("cudaHostAlloc (row list)", e);
    void* device = nullptr;
    e = cudaHostGetDevicePointer(&device, host, 0);
    if (e != cudaSuccess) {
      cudaFreeHost(host);
      return Fail("cudaHostGetDevicePointer (row list)", e);
    }
    list.host = static_cast<std::byte*>(host);
    list.device = static_cast<std::byte*>(device);
    list.bytes = size;
    return Status::OK();
  }

  static void FreeRowLists(RowLists& lists) {
    MutexLock lock(&lists.mu);
    for (RowList& list : lists.list) {
      if (list.host != nullptr) cudaFreeHost(list.host);
      if (list.used != nullptr) cudaEventDestroy(list.used);
    }
  }

  const int device_;
  const DeviceUuid uuid_;
  RowLists foreign_lists_;  // GatherRowsOn's
  // Serializes mapping and unmapping imported handles (taken before mu_).
  Mutex open_mu_;
  mutable Mutex mu_;
  std::map<uint32_t, Pool> pools_ GUARDED_BY(mu_);
  uint32_t next_id_ GUARDED_BY(mu_) = 1;
  std::map<uintptr_t, HostRange> host_ GUARDED_BY(mu_);
  // False once the runtime or driver said it has no cudaMemcpyBatchAsync.
  std::atomic<bool> batch_copies_{true};
  uint32_t copy_blocks_ = 1;  // the batch-copy kernel's most blocks (Init)
  std::map<HandleBytes, Opened> opened_ GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Stream>> streams_;  // fixed after Init
};

}  // namespace

Result<std::unique_ptr<DeviceBackend>> OpenCudaBackend(
    const DeviceBackendOptions& requested) {
  DeviceBackendOptions options = requested;
  if (options.streams == 0 || options.streams > 64) {
    return Status::InvalidArgument("device streams must be in [1, 64]");
  }
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    // cudaErrorInsufficientDriver (35) is what a machine without the
    // driver answers: no device, as far as tierkv is concerned.
    return Status::Unavailable(
        fmt::format("no CUDA device: cudaGetDeviceCount: {}", CudaText(e)));
  }
  if (count == 0) {
    return Status::Unavailable("no CUDA device: cudaGetDeviceCount found 0");
  }
  if (options.device_uuid) {
    // CUDA_VISIBLE_DEVICES renumbers devices; the UUID finds the one meant.
    std::string seen;
    options.device = -1;
    for (int i = 0; i < count && options.device < 0; ++i) {
      auto uuid = UuidOfDevice(i);
      if (!uuid.ok()) return uuid.status();
      if (*uuid == *options.device_uuid) options.device = i;
      seen += fmt::format("{}{} ({})", seen.empty() ? "" : ", ",
                          FormatDeviceUuid(*uuid), i);
    }
    if (options.device < 0) {
      return Status::InvalidArgument(
          fmt::format("no CUDA device of this process has UUID {} (it sees "
                      "{}; check CUDA_VISIBLE_DEVICES)",
                      FormatDeviceUuid(*options.device_uuid), seen));
    }
  }
  if (options.device == DeviceBackendOptions::kCurrentDevice &&
      cudaGetDevice(&options.device) != cudaSuccess) {
    return Status::Unavailable(
        fmt::format("no current CUDA device on this thread: {}",
                    CudaText(cudaGetLastError())));
  }
  if (options.device < 0 || options.device >= count) {
    return Status::InvalidArgument(
        fmt::format("CUDA device {} does not exist (this machine has {})",
                    options.device, count));
  }
  // A GPU this build has no kernels for would fail at its first launch
  // ("no kernel image"): refuse it now, saying what to build.
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                             options.device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor,
                             options.device) != cudaSuccess) {
    return Status::Unavailable(
        fmt::format("CUDA device {}: compute capability unreadable: {}",
                    options.device, CudaText(cudaGetLastError())));
  }
  auto built = ParseCudaArchitectures(TIERKV_CUDA_ARCHITECTURES);
  if (!built.ok()) return built.status();
  if (!KernelsRunOn(*built, major, minor)) {
    return Status::Unavailable(fmt::format(
        "CUDA device {} has compute capability {}.{}, which this build's "
        "kernels ({}) do not run on; rebuild with "
        "-DCMAKE_CUDA_ARCHITECTURES={}{}-real",
        options.device, major, minor, DescribeArchitectures(*built), major,
        minor));
  }
  auto uuid = UuidOfDevice(options.device);
  if (!uuid.ok()) return uuid.status();
  auto backend = std::make_unique<CudaBackend>(options, *uuid);
  TIERKV_RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<DeviceBackend>(std::move(backend));
}

}  // namespace tierkv::storage
