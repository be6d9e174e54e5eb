// UringDevice: a Device on a regular file or raw block device, driven by
// io_uring with O_DIRECT (DESIGN.md §4, T2).
//
// * One io_uring ring per (thread, device), created lazily on a thread's
//   first IO and never shared between threads (STYLE habit 7). A batch from
//   SubmitBatch keeps up to queue_depth IOs in flight on the calling thread's
//   ring; short transfers and -EAGAIN / -EINTR completions are resubmitted.
// * Each ring registers a per-thread arena of registered_buffer_bytes as a
//   fixed buffer; AllocateIoBuffer() hands out slices of it and IOs from
//   those slices use READ_FIXED / WRITE_FIXED. When registration fails (e.g.
//   RLIMIT_MEMLOCK for non-root users) IO falls back to plain buffers and
//   registered_buffer_status() says why.
// * When io_uring itself is unavailable (seccomp, io_uring_disabled, old
//   kernel) or disabled by options, IO falls back to pread/pwrite;
//   backend() and backend_status() report it. Nothing is printed.
// * When the file system rejects O_DIRECT (EINVAL, e.g. some tmpfs) and
//   allow_buffered_fallback is set, the file is opened buffered instead;
//   direct_io() reports which.
//
// A regular file is created if missing and preallocated with fallocate (or
// extended with ftruncate where fallocate is unsupported) to size_bytes.
//
// Thread safety: as Device. The destructor requires that no IO is in flight
// and closes every thread's ring for this device.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "storage/nvme/device.h"

namespace tierkv::storage {

struct UringDeviceOptions {
  // File or block device path. Required.
  std::string path;
  // Device size in bytes; a multiple of block_size. Regular file: created or
  // extended (never shrunk) to this size; 0 uses the existing file size.
  // Block device: 0 uses the whole device. Default: 0.
  uint64_t size_bytes = 0;
  // Open with O_DIRECT (bypass the page cache). Default: true.
  bool use_direct_io = true;
  // When O_DIRECT is rejected by the file system, open buffered instead of
  // failing. Default: true.
  bool allow_buffered_fallback = true;
  // Most IOs in flight per ring (io_uring entries), 1..4096. Default: 64.
  uint32_t queue_depth = 64;
  // Alignment unit for offsets, lengths and buffers, a power of two >= 512.
  // Default: 4096.
  uint32_t block_size = 4096;
  // Largest single IO; larger requests are split. Multiple of block_size.
  // Default: 1 MiB.
  uint32_t max_io_bytes = 1 << 20;
  // Bytes of registered (fixed) buffer arena per thread ring; 0 disables
  // registration. Default: 4 MiB.
  uint64_t registered_buffer_bytes = 4 << 20;
  // Skip io_uring and use pread/pwrite (tests, or hosts that forbid
  // io_uring). Default: false.
  bool force_sync_io = false;

  // InvalidArgument naming the first bad field.
  Status Validate() const;
};

enum class IoBackend : uint8_t { kIoUring, kPosix };

struct UringThreadRing;  // one thread's ring and arena (uring_device.cc)

class UringDevice final : public Device {
 public:
  // Opens (creating if needed) the file or block device. InvalidArgument for
  // bad options or an unusable path type; IOError (with errno text) when
  // open, fallocate or sizing fails.
  static Result<std::unique_ptr<UringDevice>> Open(
      const UringDeviceOptions& options);
  ~UringDevice() override;

  // kIoUring when the opening thread could set up a ring, else kPosix.
  IoBackend backend() const { return backend_; }
  // Why the backend is kPosix; OK when io_uring is in use.
  Status backend_status() const { return backend_status_; }
  bool direct_io() const { return direct_io_; }
  // Why O_DIRECT is off; OK when it is on or was not requested.
  Status direct_io_status() const { return direct_io_status_; }
  // OK when the last ring set up registered its arena, else why not.
  Status registered_buffer_status() const;

  // IOs submitted through io_uring with / without a fixed buffer, and
  // completions resubmitted after -EAGAIN / -EINTR / a short transfer.
  uint64_t fixed_buffer_ios() const {
    return fixed_ios_.load(std::memory_order_relaxed);
  }
  uint64_t plain_buffer_ios() const {
    return plain_ios_.load(std::memory_order_relaxed);
  }
  uint64_t resubmitted_ios() const {
    return resubmits_.load(std::memory_order_relaxed);
  }
  const UringDeviceOptions& options() const { return options_; }

 protected:
  Result<size_t> ReadImpl(uint64_t offset, std::span<std::byte> dst) override;
  Result<size_t> WriteImpl(uint64_t offset,
                           std::span<const std::byte> src) override;
  Status FlushImpl() override;
  void SubmitBatchImpl(std::span<IoRequest> requests,
                       const IoCompletion& on_complete) override;
  IoBuffer AllocateIoBufferImpl(size_t bytes) override;
  IoBuffer AllocateRegisteredIoBufferImpl(size_t bytes) override;
  void PrepareThisThreadImpl() override { RingForThisThread(); }

 private:
  UringDevice(const UringDeviceOptions& options, int fd, uint64_t size,
              bool direct_io, Status direct_io_status);
  // This thread's ring for this device, created on first use; nullptr when
  // io_uring is unavailable or disabled (use pread/pwrite).
  std::shared_ptr<UringThreadRing> RingForThisThread() EXCLUDES(mu_);

  const UringDeviceOptions options_;
  const int fd_;
  const uint64_t id_;  // process-unique; keys the thread-local ring table
  const bool direct_io_;
  const Status direct_io_status_;
  IoBackend backend_ = IoBackend::kIoUring;  // set once in Open
  Status backend_status_;                    // set once in Open

  mutable Mutex mu_;  // guards the members below
  std::vector<std::weak_ptr<UringThreadRing>> rings_ GUARDED_BY(mu_);
  Status registered_status_ GUARDED_BY(mu_);
  // A ring setup failed: stop retrying.
  bool rings_failed_ GUARDED_BY(mu_) = false;

  // Statistics only (relaxed).
  std::atomic<uint64_t> fixed_ios_{0};
  std::atomic<uint64_t> plain_ios_{0};
  std::atomic<uint64_t> resubmits_{0};
};

// Factory returning the generic Device interface.
Result<std::unique_ptr<Device>> NewUringDevice(
    const UringDeviceOptions& options);

}  // namespace tierkv::storage
