// Device: the block-device seam under the NVMe tier (navy's Device, NVI).
//
// The public, non-virtual Read / Write / Flush / SubmitBatch validate every
// request (bounds and block alignment of offset, length and buffer address,
// as O_DIRECT demands), split IOs larger than max_io_bytes, resubmit short
// transfers, keep counters and a latency histogram, and only then call the
// protected virtual *Impl hooks a backend overrides. Backends: UringDevice
// (io_uring + O_DIRECT, with a pread/pwrite fallback) and, in tests only,
// tests/testing/'s MemoryDevice and FaultInjectionDevice decorator.
//
// Errors: every failure is a Status. Bad arguments are InvalidArgument; any
// device failure is IOError whose message carries the operation, offset and
// errno text (e.g. "No space left on device"). Nothing here throws.
//
// Thread safety: all public methods may be called concurrently. Concurrent
// IOs to overlapping byte ranges are a data race, as on a real device: the
// caller (NvmeStore) guarantees that a range being read is never rewritten.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>

#include "common/latency_histogram.h"
#include "storage/nvme/io_buffer.h"
#include "tierkv/status.h"

namespace tierkv::storage {

enum class IoOp : uint8_t { kRead, kWrite };

// One asynchronous-capable IO. For kRead the device fills `buffer`; for
// kWrite it only reads from it. On completion `status` is OK and `result`
// equals buffer.size(), or `status` says what failed (result then holds the
// bytes transferred before the failure).
struct IoRequest {
  IoOp op = IoOp::kRead;
  uint64_t offset = 0;          // bytes from the device start
  std::span<std::byte> buffer;  // borrowed; the caller owns it until complete
  uint64_t result = 0;          // bytes transferred
  Status status;
};

// Told the index of a request of a SubmitBatch as soon as that request is
// complete (its status and result final), on the submitting thread, while
// other requests of the batch may still be in flight: callers verify or
// post-process finished IOs there, overlapping that work with the device.
// Called exactly once per request before SubmitBatch returns. It must not
// submit IO to the same device from inside the callback.
using IoCompletion = std::function<void(size_t index)>;

// A consistent-enough copy of a device's counters (relaxed reads).
struct DeviceStats {
  uint64_t read_ops = 0;
  uint64_t read_bytes = 0;
  uint64_t write_ops = 0;
  uint64_t write_bytes = 0;
  uint64_t flush_ops = 0;
  uint64_t errors = 0;     // failed requests (any op), bad arguments excluded
  uint64_t short_ios = 0;  // partial transfers resubmitted by Device
  LatencyHistogram::Counts read_latency{};
  LatencyHistogram::Counts write_latency{};
};

// Builds an IOError naming the operation and the errno text, e.g.
// "pwrite offset=4096 length=8192: No space left on device (errno 28)".
Status IoErrorFromErrno(std::string_view what, uint64_t offset, uint64_t length,
                        int err);

class Device {
 public:
  // REQUIRES: block_size is a power of two; size_bytes a multiple of it;
  // max_io_bytes a non-zero multiple of it.
  Device(uint64_t size_bytes, uint32_t block_size, uint32_t max_io_bytes);
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // Reads exactly dst.size() bytes at `offset` into `dst`.
  // REQUIRES: offset, dst.size() and dst.data() are multiples of
  // block_size(); offset + dst.size() <= size(). Otherwise InvalidArgument.
  // IOError when the backend fails or stops making progress.
  Status Read(uint64_t offset, std::span<std::byte> dst);

  // Writes all of `src` at `offset`. Same REQUIRES and errors as Read.
  Status Write(uint64_t offset, std::span<const std::byte> src);

  // Makes completed writes durable (fdatasync or equivalent). IOError on
  // failure.
  Status Flush();

  // Runs every request in `requests` to completion (or failure) before
  // returning; each request gets its own status. Backends with an async
  // engine keep many in flight; the default completes them inline, one by
  // one. Invalid requests fail with InvalidArgument and are not submitted.
  // `on_complete`, when set, is told each request's index as it completes
  // (see IoCompletion); invalid requests are reported first.
  void SubmitBatch(std::span<IoRequest> requests,
                   const IoCompletion& on_complete = {});

  // A buffer of at least `bytes` bytes (rounded up to block_size()) suitable
  // for IO on this device. Backends may return memory registered with the
  // kernel for faster IO from the calling thread. Empty when out of memory.
  IoBuffer AllocateIoBuffer(size_t bytes);
  // Only memory registered with the kernel for the calling thread (rounded
  // up as above), or an empty buffer when the backend has none left (or
  // none at all): callers stage the rest their own way.
  IoBuffer AllocateRegisteredIoBuffer(size_t bytes);

  // Sets up now, on the calling thread, the per-thread state its IO needs
  // (UringDevice: the thread's ring and registered buffers), so that the
  // first request a thread serves does not wait for it. Optional: IO sets
  // it up on first use anyway.
  void PrepareThisThread() { PrepareThisThreadImpl(); }

  uint64_t size() const { return size_; }
  uint32_t block_size() const { return block_size_; }
  uint32_t max_io_bytes() const { return max_io_bytes_; }
  uint64_t RoundUp(uint64_t bytes) const {
    return (bytes + block_size_ - 1) & ~uint64_t{block_size_ - 1};
  }
  DeviceStats Stats() const;

 protected:
  // Transfers up to dst.size() bytes; returns how many (a short count makes
  // Device resubmit the rest; 0 is treated as an error). Called only with
  // validated, in-bounds, block-aligned arguments of at most max_io_bytes.
  virtual Result<size_t> ReadImpl(uint64_t offset,
                                  std::span<std::byte> dst) = 0;
  virtual Result<size_t> WriteImpl(uint64_t offset,
                                   std::span<const std::byte> src) = 0;
  virtual Status FlushImpl() = 0;

  // Completes every request (validated and split as above). The default
  // calls ReadImpl / WriteImpl inline and resubmits short transfers.
  // Overrides must leave each request with status OK and result ==
  // buffer.size(), or a non-OK status, and call on_complete(i) (never
  // empty here) exactly once per request as soon as request i is final.
  virtual void SubmitBatchImpl(std::span<IoRequest> requests,
                               const IoCompletion& on_complete);

  // Default: heap memory aligned to block_size().
  virtual IoBuffer AllocateIoBufferImpl(size_t bytes);
  // Default: none (empty).
  virtual IoBuffer AllocateRegisteredIoBufferImpl(size_t bytes);

  // Default: nothing to set up.
  virtual void PrepareThisThreadImpl() {}

  // Runs one request synchronously through ReadImpl / WriteImpl, looping on
  // short transfers. For backends that complete some requests inline.
  void CompleteInline(IoRequest& request);

  // For backends that resubmit partial transfers themselves.
  void CountShortIo() { short_ios_.fetch_add(1, std::memory_order_relaxed); }

 private:
  Status Validate(uint64_t offset, const void* data, size_t length) const;
  void Account(IoOp op, uint64_t bytes, const Status& status,
               std::chrono::nanoseconds latency);

  const uint64_t size_;
  const uint32_t block_size_;
  const uint32_t max_io_bytes_;

  // Statistics only; relaxed ordering, nothing is published through them.
  std::atomic<uint64_t> read_ops_{0};
  std::atomic<uint64_t> read_bytes_{0};
  std::atomic<uint64_t> write_ops_{0};
  std::atomic<uint64_t> write_bytes_{0};
  std::atomic<uint64_t> flush_ops_{0};
  std::atomic<uint64_t> errors_{0};
  std::atomic<uint64_t> short_ios_{0};
  LatencyHistogram read_latency_;
  LatencyHistogram write_latency_;
};

}  // namespace tierkv::storage
