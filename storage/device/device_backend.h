// DeviceBackend: the seam under the HBM tier (T0), as Device is under NVMe.
//
// A backend owns device memory pools (allocated once each, carved up by the
// tier), moves bytes host <-> device asynchronously on in-order streams,
// gathers scattered host rows (the sparse working set's misses) into a
// contiguous device buffer, marks progress with events, and exports a pool
// to another process of the node (CUDA IPC). Backends:
//   EmulatedBackend (storage/device/emulated_backend.cc): host memory in
//   memfds,
//     one worker thread per stream; the same asynchronous semantics and the
//     same errors, so every line of the tier runs and is tested without a
//     GPU. Its IPC handle names the memfd (pid + fd), opened through /proc.
//   CudaBackend (storage/device/cuda/cuda_backend.cc, compiled when CMake finds
//     nvcc): cudaMalloc once per pool, cudaHostRegister'ed host memory,
//     non-blocking streams, events, cudaIpc* handles and a row-gather
//     kernel (storage/device/cuda/row_gather.cu).
//
// The public methods are non-virtual: they validate every argument (pool
// ids, bounds, stream ids, sizes) and only then call the protected *Impl
// hooks, so a backend never sees a malformed request.
//
// Ordering: operations on one stream run in submission order; streams are
// independent. Host memory passed to an asynchronous call must stay valid
// and unchanged until an event recorded after the call has completed.
// Errors: a request the backend refuses at submission (a bad argument, no
// memory) fails that call only. A fault of the device work itself (CUDA:
// an illegal address, a failed launch, an uncorrectable ECC error, an Xid)
// poisons the whole backend, as it poisons the CUDA context for the rest
// of the process: the backend is failed() from then on, WaitEvent on the
// faulting work and every later call answer Unavailable naming the first
// fault, nothing more runs on the device, and EventDone says true (no copy
// will touch memory any more). The owner degrades (tierkvd turns its HBM
// tier off; device pools fail their transfers) rather than retrying; only
// a new process gets a working device. The emulated backend injects such a
// fault on request (DeviceBackendOptions), so this path runs in CI.
//
// A WaitEvent that times out does not stop the work: until EventDone, the
// copies may still read and write the memory they name, which the caller
// must keep out of reuse (storage/device/device_quarantine.h).
//
// Thread safety: thread-safe; one stream may be fed from several threads
// (their operations are ordered as the calls return).
//
// Current device: the CUDA runtime keeps one per thread, and an engine sets
// its own (cudaSetDevice, torch.cuda.set_device). Every public method makes
// the backend's device current for its work and gives the caller's back
// before it returns, so a call never switches a caller's device under it.
// The emulated backend models the per-thread current device
// (EmulatedCurrentDevice) and fails a call made without its device current,
// so tests hold both backends to this.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/mutex.h"
#include "storage/device/device_backend_kind.h"
#include "storage/device/device_uuid.h"
#include "tierkv/status.h"

namespace tierkv::storage {

struct DeviceBackendOptions {
  DeviceBackendKind kind = DeviceBackendKind::kAuto;
  // The device ordinal, or kCurrentDevice: the one current on the calling
  // thread at Open (cudaGetDevice; EmulatedCurrentDevice), which is where
  // an engine that called cudaSetDevice / torch.cuda.set_device works.
  static constexpr int kCurrentDevice = -1;
  int device = 0;
  // When set, the device with this UUID instead (`device` is ignored):
  // ordinals depend on CUDA_VISIBLE_DEVICES, UUIDs do not.
  std::optional<DeviceUuid> device_uuid;
  uint32_t streams = 2;  // in-order queues; 1..64
  // Emulated only: total bytes its pools may hold (an allocation past it
  // is ResourceExhausted, as cudaMalloc's cudaErrorMemoryAllocation is).
  // Default: 1 GiB.
  uint64_t emulated_capacity_bytes = uint64_t{1} << 30;
  // Emulated only, fault injection for tests: the copy or gather after the
  // first `emulated_fault_after_copies` faults the way device work faults
  // on CUDA, failing the whole backend (see Errors above; 0: never).
  uint64_t emulated_fault_after_copies = 0;
  // Emulated only, a stall for tests: called on a stream's worker thread
  // before each operation runs, so a test can hold device work in flight
  // (past a WaitEvent's timeout, say) and let it go.
  std::function<void()> emulated_before_op;
};

// A pool of device memory, allocated once.
struct DevicePool {
  uint32_t id = 0;
  uint64_t bytes = 0;
};

// Bytes [offset, offset + bytes) of a pool.
struct DeviceRegion {
  uint32_t pool = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

using StreamId = uint32_t;

class DeviceBackend;

// Another owner's stream in this process (an engine's), for device work
// that must be ordered with the owner's own work. CUDA: `cuda`, a
// cudaStream_t on the backend's device (nullptr is the legacy default
// stream). Emulated: stream `emulated_stream` of another emulated backend
// (`emulated`), the engine's stand-in where there is no GPU.
struct ForeignStream {
  void* cuda = nullptr;
  DeviceBackend* emulated = nullptr;
  StreamId emulated_stream = 0;
};

// A point in a stream: done once every operation submitted to the stream
// before it is done.
struct DeviceEvent {
  StreamId stream = 0;
  uint64_t sequence = 0;
};

// An exported pool, as 64 opaque bytes any process of the node may import
// (CUDA: cudaIpcMemHandle_t, 64 bytes), and the pool's size (a CUDA handle
// does not carry it).
struct IpcHandle {
  std::array<std::byte, 64> bytes{};
  uint64_t pool_bytes = 0;
};

// Device memory of this process named for another process: the handle of
// the whole allocation holding it, and where in that allocation it starts.
struct ExportedRange {
  IpcHandle handle;
  uint64_t offset = 0;
  DeviceUuid device_uuid{};  // the GPU holding the memory
};

// The fd path's export: a descriptor of the physical allocation holding a
// range (the caller owns it), the allocation's size and the range's offset.
struct ExportedFd {
  int fd = -1;
  uint64_t pool_bytes = 0;
  uint64_t offset = 0;
  DeviceUuid device_uuid{};  // the GPU holding the memory
};

// An imported pool in this process: `base` addresses its bytes (host memory
// for the emulated backend, a device pointer for CUDA), and the importing
// backend addresses it as DeviceRegion pool `pool` (copies and gathers into
// another process's pool, e.g. an engine's KV pool) until CloseImported.
struct ImportedPool {
  void* base = nullptr;
  uint64_t bytes = 0;
  uint32_t pool = 0;
  uint64_t token = 0;  // backend bookkeeping
};

class DeviceBackend {
 public:
  // The backend `options.kind` names. kAuto: CUDA when it was compiled in
  // and a device is present, else emulated (`fell_back` says why, for the
  // caller's log line). kCuda without a usable device: Unavailable.
  static Result<std::unique_ptr<DeviceBackend>> Open(
      const DeviceBackendOptions& options, std::string* fell_back = nullptr);

  virtual ~DeviceBackend() = default;
  DeviceBackend(const DeviceBackend&) = delete;
  DeviceBackend& operator=(const DeviceBackend&) = delete;

  // True when this build has the CUDA backend (nvcc was found), whether or
  // not this machine has a device.
  static bool CudaBuiltIn();

  std::string_view name() const { return name_; }
  uint32_t streams() const { return streams_; }
  // The device ordinal the backend works on (kCurrentDevice resolved), in
  // this process's numbering, and the device's UUID (the same everywhere).
  virtual int device() const = 0;
  virtual DeviceUuid uuid() const = 0;

  // True once a device fault failed the backend (see Errors above); cheap.
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // OK while healthy; once failed, the Unavailable every call answers,
  // naming the first fault.
  Status health() const EXCLUDES(failure_mu_);

  // ResourceExhausted when the device has no room; InvalidArgument for 0.
  Result<DevicePool> AllocatePool(uint64_t bytes);
  // REQUIRES: no operation on the pool is in flight (wait for its events).
  // InvalidArgument for an imported pool (CloseImported ends those).
  Status FreePool(uint32_t pool);

  // Asynchronous copies and gathers (see Ordering above).
  Status CopyToDevice(StreamId stream, DeviceRegion dst,
                      std::span<const std::byte> src);
  Status CopyToHost(StreamId stream, std::span<std::byte> dst,
                    DeviceRegion src);
  // CopyToDevice of srcs[i] into dsts[i] for every i as one submission.
  // CUDA: copies of up to ~128 KiB on average from registered host memory
  // go through one batch-copy kernel (the copy engines' per-copy cost
  // held 41 KiB pages to 0.64x of bus speed, cuda/copy_batch.h); others
  // through cudaMemcpyBatchAsync (one cudaMemcpyAsync each on a runtime
  // without it). Every item is checked before any is queued. The items'
  // destinations must not overlap (they may be copied concurrently).
  Status CopyToDeviceBatch(StreamId stream, std::span<const DeviceRegion> dsts,
                           std::span<const std::span<const std::byte>> srcs);
  // Device to device, within a pool or across pools (imported ones too);
  // the regions must be the same size.
  Status CopyOnDevice(StreamId stream, DeviceRegion dst, DeviceRegion src);
  // CopyOnDevice of srcs[i] into dsts[i] for every i as one submission
  // (CUDA: one batch-copy kernel; a page-sized cudaMemcpyAsync each ran at
  // 0.01x of one contiguous device copy on an H200). Every item is checked
  // before any is queued. REQUIRES: no item's destination overlaps another
  // item's source or destination (they are copied concurrently).
  Status CopyOnDeviceBatch(StreamId stream, std::span<const DeviceRegion> dsts,
                           std::span<const DeviceRegion> srcs);
  // rows[i] (row_bytes of host memory each) -> row i of dst, whose bytes
  // must then be rows.size() * row_bytes; or, with `dst_rows`, -> row
  // dst_rows[i] of dst, a buffer of whole rows (dst.bytes a multiple of
  // row_bytes, every dst_rows[i] inside it, none twice): the sparse working
  // set's misses going into their slots. Rows in registered host memory are
  // read by the device directly (CUDA: one kernel); others are copied one
  // by one.
  Status GatherRows(StreamId stream, DeviceRegion dst,
                    std::span<const std::byte* const> rows, uint32_t row_bytes,
                    std::span<const uint32_t> dst_rows = {});

  // The device-side pack of rows already on the device: row src_rows[i]
  // of `src` (a buffer of whole rows of row_bytes) -> row i of `dst`,
  // whose bytes must be src_rows.size() * row_bytes (CUDA: the gather
  // kernel, one launch): the working set's Gather packs the selection
  // there and copies it to the host in one piece, not row by row. Rows may
  // repeat; `src` and `dst` must not overlap.
  Status PackRows(StreamId stream, DeviceRegion dst, DeviceRegion src,
                  uint32_t row_bytes, std::span<const uint32_t> src_rows);

  // GatherRows queued on another owner's stream instead of one of this
  // backend's: it starts after the work queued there before it, and what
  // is queued there after it starts after it is done, with no host wait
  // (the engine's attention reads what the gather wrote; the next step's
  // gather overwrites slots only after the engine's previous readers).
  // Errors of the gather's own work fail the backend (device faults are
  // sticky, see Errors) and show at the next call.
  // REQUIRES: the stream, this backend and `dst` outlive the queued work
  // (the engine synchronizes its stream before ending either).
  Status GatherRowsOn(const ForeignStream& stream, DeviceRegion dst,
                      std::span<const std::byte* const> rows,
                      uint32_t row_bytes,
                      std::span<const uint32_t> dst_rows = {});
  // Work submitted to `stream` after this call starts once the work queued
  // on `foreign` before it is done: an event to wait on, on the device, not
  // the host (CUDA: cudaEventRecord + cudaStreamWaitEvent).
  Status StreamWaitForeign(StreamId stream, const ForeignStream& foreign);
  // Runs `fn` on a host thread once the work queued on `stream` before it
  // is done; work queued after it waits for it (CUDA: cudaLaunchHostFunc).
  // `fn` must not call this backend (CUDA forbids runtime calls there).
  Status LaunchHostFunction(StreamId stream, std::function<void()> fn);

  // Device-side synchronisation through a 32-bit word of host memory,
  // which may be shared with another process: an engine's stream and
  // tierkvd order their device work through a LoadTicket's words this way,
  // with no host thread waiting (CUDA: cuStreamWaitValue32 and
  // cuStreamWriteValue32, stream memory operations; emulated: the stream's
  // worker polls or stores the word). The word must lie in host memory
  // registered with this backend (RegisterHost: CUDA maps it for the
  // device) and be 4-byte aligned; InvalidArgument otherwise.
  // Work queued on `stream` after WaitValueOn starts once *word >= value,
  // compared cyclically as CUDA's GEQ does ((int32_t)(*word - value) >= 0,
  // so a counter may wrap around). Nothing times it out: whoever owns the word
  // must raise it eventually, or the stream waits for ever
  // (LoadTicket::device_layers says how tierkv guarantees that).
  Status WaitValueOn(const ForeignStream& stream,
                     const std::atomic<uint32_t>* word, uint32_t value);
  // Stores `value` to *word once the work queued on `stream` before this
  // call is done (a release store: what that work wrote is visible first).
  Status WriteValueOn(const ForeignStream& stream, std::atomic<uint32_t>* word,
                      uint32_t value);

  // The address of a pool's first byte in this process: host memory on the
  // emulated backend (host_addressable() is true), a device pointer on CUDA
  // (for kernels; the host must not dereference it). NotFound for an
  // unknown pool.
  Result<std::byte*> PoolBase(uint32_t pool);
  virtual bool host_addressable() const = 0;

  // Pins host memory for DMA (CUDA: cudaHostRegister, mapped into the
  // device's address space), so copies from and to it run at bus speed and
  // GatherRows reads rows in it from the device without a staging copy.
  // Host memory that is not registered still works, through the driver's
  // staging buffers. AlreadyExists when the range overlaps a registered
  // one; InvalidArgument for an empty range.
  Status RegisterHost(std::span<std::byte> memory);
  // NotFound unless `data` begins a registered range.
  // REQUIRES: no operation on the range is in flight.
  Status UnregisterHost(std::byte* data);

  Result<DeviceEvent> RecordEvent(StreamId stream);
  // Blocks until `event` is done; returns the stream's first error since
  // its previous event (then cleared), or IOError after `timeout`.
  Status WaitEvent(DeviceEvent event, std::chrono::milliseconds timeout);
  // True once `event` is done, and always on a failed backend.
  bool EventDone(DeviceEvent event);

  Result<IpcHandle> ExportPool(uint32_t pool);
  // Device memory [data, data + bytes) of this process that lies inside
  // one allocation, exported as that allocation's handle and the offset of
  // `data` in it: an IPC handle names a whole allocation, and tensors of
  // PyTorch's caching allocator are blocks inside larger cudaMalloc
  // segments (their data_ptr is not an allocation's base). CUDA: any
  // cudaMalloc'd memory of the process (cuMemGetAddressRange finds the
  // allocation); emulated: this backend's pools. An importer addresses
  // the bytes at `offset` of the imported pool (PoolSpec::offset).
  // InvalidArgument when the range is not device memory of one allocation,
  // or its allocation cannot be exported by cudaIpcGetMemHandle
  // (cudaMallocAsync pools, PyTorch's expandable segments).
  Result<ExportedRange> ExportRange(const std::byte* data, uint64_t bytes);
  // The fd path, for memory cudaIpcGetMemHandle cannot export (CUDA's
  // virtual memory API: cudaMallocAsync pools, PyTorch's expandable
  // segments): [data, data + bytes) inside one physical allocation, as a
  // file descriptor of that allocation (CUDA: cuMemExportToShareableHandle,
  // a POSIX fd; emulated: the pool's memfd), which travels over a Unix
  // socket (SCM_RIGHTS). An importer's mapping holds the allocation: it
  // stays valid after the exporter frees it or exits, unlike a legacy IPC
  // handle's. InvalidArgument when the range is not in one such allocation.
  Result<ExportedFd> ExportRangeFd(const std::byte* data, uint64_t bytes);
  // Imports what ExportRangeFd exported (the fd is borrowed; the mapping
  // keeps its own reference). InvalidArgument when `pool_bytes` is 0 or
  // more than the allocation holds, or the fd is not such an allocation.
  Result<ImportedPool> ImportPoolFd(int fd, uint64_t pool_bytes);
  // In any process of the node, including another backend instance.
  // InvalidArgument for a malformed handle, NotFound when its pool (or
  // process) is gone.
  Result<ImportedPool> ImportPool(const IpcHandle& handle);
  // REQUIRES: no operation on imported.pool is in flight.
  Status CloseImported(ImportedPool& imported);

 protected:
  DeviceBackend(std::string name, uint32_t streams);

  // A backend calls this on a fault that poisons the device (see Errors
  // above): the first cause is kept, later calls change nothing. Returns
  // health(). The owner logs it (this library links no logger: engines
  // link it too).
  Status MarkFailed(const Status& cause) EXCLUDES(failure_mu_);

  // The pool's size, or 0 when no such pool exists.
  virtual uint64_t PoolBytes(uint32_t pool) const = 0;

  virtual Result<DevicePool> AllocatePoolImpl(uint64_t bytes) = 0;
  virtual Status FreePoolImpl(uint32_t pool) = 0;
  virtual Status CopyToDeviceImpl(StreamId stream, DeviceRegion dst,
                                  std::span<const std::byte> src) = 0;
  virtual Status CopyToHostImpl(StreamId stream, std::span<std::byte> dst,
                                DeviceRegion src) = 0;
  // REQUIRES: as many dsts as srcs, each pair checked.
  virtual Status CopyToDeviceBatchImpl(
      StreamId stream, std::span<const DeviceRegion> dsts,
      std::span<const std::span<const std::byte>> srcs) = 0;
  virtual Status CopyOnDeviceBatchImpl(StreamId stream,
                                       std::span<const DeviceRegion> dsts,
                                       std::span<const DeviceRegion> srcs) = 0;
  virtual Status CopyOnDeviceImpl(StreamId stream, DeviceRegion dst,
                                  DeviceRegion src) = 0;
  // dst_rows: empty (contiguous) or one row index per row, checked.
  virtual Status GatherRowsImpl(StreamId stream, DeviceRegion dst,
                                std::span<const std::byte* const> rows,
                                uint32_t row_bytes,
                                std::span<const uint32_t> dst_rows) = 0;
  // REQUIRES: arguments checked (PackRows).
  virtual Status PackRowsImpl(StreamId stream, DeviceRegion dst,
                              DeviceRegion src, uint32_t row_bytes,
                              std::span<const uint32_t> src_rows) = 0;
  // As GatherRowsImpl; `stream` is as the caller gave it.
  virtual Status GatherRowsOnImpl(const ForeignStream& stream, DeviceRegion dst,
                                  std::span<const std::byte* const> rows,
                                  uint32_t row_bytes,
                                  std::span<const uint32_t> dst_rows) = 0;
  virtual Status StreamWaitForeignImpl(StreamId stream,
                                       const ForeignStream& foreign) = 0;
  virtual Status LaunchHostFunctionImpl(StreamId stream,
                                        std::function<void()> fn) = 0;
  // REQUIRES: `word` is aligned and in a registered host range.
  virtual Status WaitValueOnImpl(const ForeignStream& stream,
                                 const std::atomic<uint32_t>* word,
                                 uint32_t value) = 0;
  virtual Status WriteValueOnImpl(const ForeignStream& stream,
                                  std::atomic<uint32_t>* word,
                                  uint32_t value) = 0;
  // REQUIRES: the pool exists.
  virtual std::byte* PoolBaseImpl(uint32_t pool) = 0;
  virtual Status RegisterHostImpl(std::span<std::byte> memory) = 0;
  virtual Status UnregisterHostImpl(std::span<std::byte> memory) = 0;
  virtual Result<DeviceEvent> RecordEventImpl(StreamId stream) = 0;
  virtual Status WaitEventImpl(DeviceEvent event,
                               std::chrono::milliseconds timeout) = 0;
  virtual bool EventDoneImpl(DeviceEvent event) = 0;
  virtual Result<IpcHandle> ExportPoolImpl(uint32_t pool) = 0;
  // REQUIRES: data != nullptr, bytes > 0, no overflow.
  virtual Result<ExportedRange> ExportRangeImpl(const std::byte* data,
                                                uint64_t bytes) = 0;
  // As ExportRangeImpl.
  virtual Result<ExportedFd> ExportRangeFdImpl(const std::byte* data,
                                               uint64_t bytes) = 0;
  // REQUIRES: fd >= 0, pool_bytes > 0.
  virtual Result<ImportedPool> ImportPoolFdImpl(int fd,
                                                uint64_t pool_bytes) = 0;
  virtual Result<ImportedPool> ImportPoolImpl(const IpcHandle& handle) = 0;
  virtual Status CloseImportedImpl(ImportedPool& imported) = 0;

  // Makes the backend's device current on the calling thread; returns the
  // device that was current, or -1 when nothing needs giving back.
  virtual int EnterDevice() = 0;
  // Gives `previous` (EnterDevice's answer) back; nothing for -1.
  virtual void RestoreDevice(int previous) = 0;

 private:
  class DeviceScope;

  Status CheckStream(StreamId stream) const;
  Status CheckRegion(const DeviceRegion& region) const;
  // ExportRange's and ExportRangeFd's: non-null, non-empty, no overflow.
  static Status CheckExportRange(const std::byte* data, uint64_t bytes);
  // WaitValueOn's and WriteValueOn's: aligned, inside a registered range.
  Status CheckHostWord(const void* word) EXCLUDES(host_mu_);
  // GatherRows' and GatherRowsOn's argument checks.
  Status CheckGather(const DeviceRegion& dst,
                     std::span<const std::byte* const> rows, uint32_t row_bytes,
                     std::span<const uint32_t> dst_rows) const;

  const std::string name_;
  const uint32_t streams_;
  std::atomic<bool> failed_{false};
  mutable Mutex failure_mu_;
  Status failure_ GUARDED_BY(failure_mu_);
  Mutex host_mu_;
  // Registered host ranges: first byte's address -> bytes.
  std::map<uintptr_t, uint64_t> host_ranges_ GUARDED_BY(host_mu_);
};

// The emulated backend, directly (tests and the "emulated" config value).
Result<std::unique_ptr<DeviceBackend>> OpenEmulatedBackend(
    const DeviceBackendOptions& options);

// The emulated stand-in for the CUDA runtime's per-thread current device
// (cudaGetDevice / cudaSetDevice): 0 until set on a thread.
int EmulatedCurrentDevice();
void SetEmulatedCurrentDevice(int device);

}  // namespace tierkv::storage
