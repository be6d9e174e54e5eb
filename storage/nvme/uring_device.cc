// UringDevice: the block device through one io_uring ring per thread,
// O_DIRECT where the file system allows (see uring_device.h).
#include "storage/nvme/uring_device.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <liburing.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdlib>
#include <deque>
#include <utility>
#include <vector>

#include "storage/storage_log.h"

namespace tierkv::storage {

// One thread's ring for one device, plus its registered arena. Created and
// used only by its thread; Close() may also run from ~UringDevice (after all
// IO has finished) or at thread exit, hence the mutex.
struct UringThreadRing {
  ~UringThreadRing() {
    Close();
    std::free(arena);
  }
  void Close() EXCLUDES(close_mu) {
    MutexLock lock(&close_mu);
    if (!closed.load(std::memory_order_relaxed)) {
      io_uring_queue_exit(&ring);
      closed.store(true, std::memory_order_release);
    }
  }

  // Used for IO by the owner thread without a lock; io_uring_queue_exit()
  // runs once, under close_mu, after the last IO.
  io_uring ring{};
  Mutex close_mu;  // serializes Close()
  // Set once the ring is gone (release), read by the owner (acquire) before
  // it reuses its cached ring.
  std::atomic<bool> closed{false};
  // Registered arena: [arena, arena + arena_size) is fixed buffer index 0.
  std::byte* arena = nullptr;
  size_t arena_size = 0;
  bool registered = false;
  size_t bump = 0;  // next free arena byte; owner thread only
  // Arena slices handed out and not yet released. Released with `release`
  // order from any thread; the owner reads it with `acquire` before
  // resetting `bump`, so a released slice's last use happens-before reuse.
  std::atomic<uint64_t> outstanding{0};
};

namespace {

std::atomic<uint64_t> next_device_id{1};

// This thread's rings, keyed by device id (ids are never reused, so a dead
// device's entry can never be mistaken for a live one's).
struct ThreadRingTable {
  std::vector<std::pair<uint64_t, std::shared_ptr<UringThreadRing>>> rings;
};
thread_local ThreadRingTable tls_rings;

Result<size_t> Pread(int fd, uint64_t offset, std::span<std::byte> dst) {
  for (;;) {
    const ssize_t n =
        ::pread(fd, dst.data(), dst.size(), static_cast<off_t>(offset));
    if (n >= 0) return static_cast<size_t>(n);
    if (errno != EINTR && errno != EAGAIN) {
      return IoErrorFromErrno("pread", offset, dst.size(), errno);
    }
  }
}

Result<size_t> Pwrite(int fd, uint64_t offset, std::span<const std::byte> src) {
  for (;;) {
    const ssize_t n =
        ::pwrite(fd, src.data(), src.size(), static_cast<off_t>(offset));
    if (n >= 0) return static_cast<size_t>(n);
    if (errno != EINTR && errno != EAGAIN) {
      return IoErrorFromErrno("pwrite", offset, src.size(), errno);
    }
  }
}

Status ErrnoStatus(std::string_view what, const std::string& path, int err) {
  return IoErrorFromErrno(fmt::format("{} {}", what, path), 0, 0, err);
}

}  // namespace

Status UringDeviceOptions::Validate() const {
  if (path.empty())
    return Status::InvalidArgument("uring device: path is empty");
  if (block_size < 512 || !std::has_single_bit(block_size)) {
    return Status::InvalidArgument(
        "uring device: block_size must be a power of two >= 512");
  }
  if (size_bytes % block_size != 0) {
    return Status::InvalidArgument(
        "uring device: size_bytes must be a multiple of block_size");
  }
  if (queue_depth == 0 || queue_depth > 4096) {
    return Status::InvalidArgument("uring device: queue_depth must be 1..4096");
  }
  if (max_io_bytes == 0 || max_io_bytes % block_size != 0) {
    return Status::InvalidArgument(
        "uring device: max_io_bytes must be a non-zero multiple of block_size");
  }
  if (registered_buffer_bytes % block_size != 0) {
    return Status::InvalidArgument(
        "uring device: registered_buffer_bytes must be a multiple of "
        "block_size");
  }
  return Status::OK();
}

Result<std::unique_ptr<UringDevice>> UringDevice::Open(
    const UringDeviceOptions& options) {
  TIERKV_RETURN_IF_ERROR(options.Validate());
  const int base_flags = O_RDWR | O_CREAT | O_CLOEXEC;
  bool direct = options.use_direct_io;
  Status direct_status;
  int fd =
      ::open(options.path.c_str(), base_flags | (direct ? O_DIRECT : 0), 0644);
  if (fd < 0 && direct && errno == EINVAL && options.allow_buffered_fallback) {
    direct_status = ErrnoStatus("O_DIRECT open", options.path, EINVAL);
    StorageLog().warn("tierkv uring device: {}; using buffered IO",
                      direct_status.ToString());
    direct = false;
    fd = ::open(options.path.c_str(), base_flags, 0644);
  }
  if (fd < 0) return ErrnoStatus("open", options.path, errno);

  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus("fstat", options.path, err);
  }
  uint64_t size = 0;
  if (S_ISBLK(st.st_mode)) {
    uint64_t dev_bytes = 0;
    if (::ioctl(fd, BLKGETSIZE64, &dev_bytes) != 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoStatus("BLKGETSIZE64", options.path, err);
    }
    if (options.size_bytes > dev_bytes) {
      ::close(fd);
      return Status::InvalidArgument(fmt::format(
          "uring device: size_bytes {} exceeds block device {} ({} bytes)",
          options.size_bytes, options.path, dev_bytes));
    }
    size = options.size_bytes != 0
               ? options.size_bytes
               : dev_bytes & ~uint64_t{options.block_size - 1};
  } else if (S_ISREG(st.st_mode)) {
    const auto current = static_cast<uint64_t>(st.st_size);
    if (options.size_bytes == 0) {
      size = current & ~uint64_t{options.block_size - 1};
    } else {
      size = options.size_bytes;
      if (current < size) {
        int rc = ::fallocate(fd, 0, 0, static_cast<off_t>(size));
        if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
          rc = ::ftruncate(fd, static_cast<off_t>(size));
        }
        if (rc != 0) {
          const int err = errno;
          ::close(fd);
          return ErrnoStatus("preallocate", options.path, err);
        }
      }
    }
  } else {
    ::close(fd);
    return Status::InvalidArgument(fmt::format(
        "uring device: {} is neither a regular file nor a block device",
        options.path));
  }
  if (size == 0) {
    ::close(fd);
    return Status::InvalidArgument(
        fmt::format("uring device: {} has size 0", options.path));
  }

  std::unique_ptr<UringDevice> device(
      new UringDevice(options, fd, size, direct, std::move(direct_status)));
  if (options.force_sync_io) {
    device->backend_ = IoBackend::kPosix;
    device->backend_status_ =
        Status::Unavailable("io_uring disabled by options (force_sync_io)");
  } else if (device->RingForThisThread() == nullptr) {
    MutexLock lock(&device->mu_);
    device->backend_ = IoBackend::kPosix;
    device->backend_status_ = device->registered_status_.ok()
                                  ? Status::Unavailable("io_uring unavailable")
                                  : device->registered_status_;
  }
  return device;
}

Result<std::unique_ptr<Device>> NewUringDevice(
    const UringDeviceOptions& options) {
  auto device = UringDevice::Open(options);
  if (!device.ok()) return device.status();
  return std::unique_ptr<Device>(std::move(device).value());
}

UringDevice::UringDevice(const UringDeviceOptions& options, int fd,
                         uint64_t size, bool direct_io, Status direct_io_status)
    : Device(size, options.block_size, options.max_io_bytes),
      options_(options),
      fd_(fd),
      id_(next_device_id.fetch_add(1, std::memory_order_relaxed)),
      direct_io_(direct_io),
      direct_io_status_(std::move(direct_io_status)) {}

UringDevice::~UringDevice() {
  std::vector<std::weak_ptr<UringThreadRing>> rings;
  {
    MutexLock lock(&mu_);
    rings.swap(rings_);
  }
  for (auto& weak : rings) {
    if (auto ring = weak.lock()) ring->Close();
  }
  ::close(fd_);
}

Status UringDevice::registered_buffer_status() const {
  MutexLock lock(&mu_);
  return registered_status_;
}

std::shared_ptr<UringThreadRing> UringDevice::RingForThisThread() {
  if (options_.force_sync_io) return nullptr;
  auto& table = tls_rings.rings;
  for (auto& [id, ring] : table) {
    if (id == id_)
      return ring->closed.load(std::memory_order_acquire) ? nullptr : ring;
  }
  {
    MutexLock lock(&mu_);
    if (rings_failed_) return nullptr;
  }
  // Drop entries of devices that are gone (their rings are closed).
  std::erase_if(table, [](const auto& entry) {
    return entry.second->closed.load(std::memory_order_acquire);
  });

  auto ring = std::make_shared<UringThreadRing>();
  // The ring is only ever used by this thread, so let the kernel skip
  // cross-thread bookkeeping when it supports that; else plain setup.
  int rc = io_uring_queue_init(
      options_.queue_depth, &ring->ring,
      IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN);
  if (rc == -EINVAL)
    rc = io_uring_queue_init(options_.queue_depth, &ring->ring, 0);
  if (rc < 0) {
    ring->closed.store(true, std::memory_order_release);  // nothing to exit
    Status why = IoErrorFromErrno("io_uring_queue_init", 0, 0, -rc);
    StorageLog().warn(
        "tierkv uring device {}: {}; falling back to pread/pwrite",
        options_.path, why.ToString());
    MutexLock lock(&mu_);
    rings_failed_ = true;
    registered_status_ = why;
    return nullptr;
  }

  Status registered;
  if (options_.registered_buffer_bytes > 0) {
    ring->arena_size = options_.registered_buffer_bytes;
    ring->arena = static_cast<std::byte*>(
        std::aligned_alloc(block_size(), ring->arena_size));
    if (ring->arena == nullptr) {
      registered =
          Status::ResourceExhausted("cannot allocate fixed buffer arena");
    } else {
      iovec iov{ring->arena, ring->arena_size};
      const int reg = io_uring_register_buffers(&ring->ring, &iov, 1);
      if (reg == 0) {
        ring->registered = true;
      } else {
        registered = IoErrorFromErrno("io_uring_register_buffers", 0,
                                      ring->arena_size, -reg);
        StorageLog().info(
            "tierkv uring device {}: {} (RLIMIT_MEMLOCK?); using unregistered "
            "buffers",
            options_.path, registered.ToString());
      }
    }
  } else {
    registered = Status::Unavailable("registered_buffer_bytes is 0");
  }

  {
    MutexLock lock(&mu_);
    std::erase_if(rings_, [](const auto& weak) { return weak.expired(); });
    rings_.push_back(ring);
    registered_status_ = registered;
  }
  table.emplace_back(id_, ring);
  return ring;
}

Result<size_t> UringDevice::ReadImpl(uint64_t offset,
                                     std::span<std::byte> dst) {
  return Pread(fd_, offset, dst);
}

Result<size_t> UringDevice::WriteImpl(uint64_t offset,
                                      std::span<const std::byte> src) {
  return Pwrite(fd_, offset, src);
}

Status UringDevice::FlushImpl() {
  if (::fdatasync(fd_) != 0) return IoErrorFromErrno("fdatasync", 0, 0, errno);
  return Status::OK();
}

IoBuffer UringDevice::AllocateIoBufferImpl(size_t bytes) {
  IoBuffer registered = AllocateRegisteredIoBufferImpl(bytes);
  if (!registered.empty()) return registered;
  return Device::AllocateIoBufferImpl(bytes);
}

IoBuffer UringDevice::AllocateRegisteredIoBufferImpl(size_t bytes) {
  std::shared_ptr<UringThreadRing> ring = RingForThisThread();
  if (ring != nullptr && ring->registered && bytes <= ring->arena_size) {
    if (ring->outstanding.load(std::memory_order_acquire) == 0) ring->bump = 0;
    if (ring->arena_size - ring->bump >= bytes) {
      std::byte* slice = ring->arena + ring->bump;
      ring->bump += bytes;
      ring->outstanding.fetch_add(1, std::memory_order_relaxed);
      // The owner handle keeps the arena alive and returns the slice.
      std::shared_ptr<void> owner(slice, [ring](void*) {
        ring->outstanding.fetch_sub(1, std::memory_order_release);
      });
      return IoBuffer(slice, bytes, std::move(owner));
    }
  }
  return {};
}

void UringDevice::SubmitBatchImpl(std::span<IoRequest> requests,
                                  const IoCompletion& on_complete) {
  std::shared_ptr<UringThreadRing> ring = RingForThisThread();
  if (ring == nullptr) {
    Device::SubmitBatchImpl(requests, on_complete);  // pread / pwrite
    return;
  }
  io_uring* uring = &ring->ring;
  std::deque<size_t> queued;
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].result = 0;
    requests[i].status = Status::OK();
    queued.push_back(i);
  }
  const std::byte* arena_begin = ring->arena;
  const std::byte* arena_end = ring->arena + ring->arena_size;
  uint32_t in_flight = 0;
  std::vector<size_t> completed;  // final since the last callbacks ran

  // Moves queued requests into the submission queue, up to the depth.
  auto fill = [&] {
    while (!queued.empty() && in_flight < options_.queue_depth) {
      io_uring_sqe* sqe = io_uring_get_sqe(uring);
      if (sqe == nullptr) break;  // SQ full: submit what we have first
      const size_t index = queued.front();
      queued.pop_front();
      IoRequest& r = requests[index];
      std::byte* data = r.buffer.data() + r.result;
      const auto length = static_cast<unsigned>(r.buffer.size() - r.result);
      const uint64_t offset = r.offset + r.result;
      const bool fixed =
          ring->registered && data >= arena_begin && data + length <= arena_end;
      if (r.op == IoOp::kRead) {
        if (fixed) {
          io_uring_prep_read_fixed(sqe, fd_, data, length, offset, 0);
        } else {
          io_uring_prep_read(sqe, fd_, data, length, offset);
        }
      } else {
        if (fixed) {
          io_uring_prep_write_fixed(sqe, fd_, data, length, offset, 0);
        } else {
          io_uring_prep_write(sqe, fd_, data, length, offset);
        }
      }
      (fixed ? fixed_ios_ : plain_ios_).fetch_add(1, std::memory_order_relaxed);
      io_uring_sqe_set_data64(sqe, index);
      ++in_flight;
    }
  };
  // Enters the kernel (waiting for `wait_for` completions); false when the
  // ring failed, in which case every unfinished request has failed.
  auto submit = [&](unsigned wait_for) {
    const int rc = wait_for > 0 ? io_uring_submit_and_wait(uring, wait_for)
                                : io_uring_submit(uring);
    if (rc >= 0 || rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) return true;
    // The ring is unusable. Prepared SQEs may still sit in the SQ, so this
    // ring is retired (never entered again) and everything still pending
    // fails; later IO on this thread uses pread/pwrite.
    const Status failed = IoErrorFromErrno("io_uring_submit", 0, 0, -rc);
    StorageLog().error(
        "tierkv uring device {}: {}; retiring this thread's ring",
        options_.path, failed.ToString());
    ring->Close();
    for (size_t index : completed) on_complete(index);
    for (size_t i = 0; i < requests.size(); ++i) {
      IoRequest& r = requests[i];
      if (r.status.ok() && r.result < r.buffer.size()) {
        r.status = failed;
        on_complete(i);
      }
    }
    return false;
  };

  while (!queued.empty() || in_flight > 0) {
    fill();
    if (!submit(/*wait_for=*/1)) return;

    io_uring_cqe* cqe = nullptr;
    unsigned head = 0;
    unsigned seen = 0;
    io_uring_for_each_cqe(uring, head, cqe) {
      ++seen;
      --in_flight;
      const auto index = static_cast<size_t>(io_uring_cqe_get_data64(cqe));
      IoRequest& r = requests[index];
      const int res = cqe->res;
      if (res == -EAGAIN || res == -EINTR) {
        resubmits_.fetch_add(1, std::memory_order_relaxed);
        queued.push_back(index);
      } else if (res < 0) {
        r.status = IoErrorFromErrno(
            r.op == IoOp::kRead ? "io_uring read" : "io_uring write",
            r.offset + r.result, r.buffer.size() - r.result, -res);
        completed.push_back(index);
      } else if (res == 0) {
        r.status = Status::IOError(fmt::format(
            "io_uring {} made no progress at offset={} ({} of {} bytes done)",
            r.op == IoOp::kRead ? "read" : "write", r.offset + r.result,
            r.result, r.buffer.size()));
        completed.push_back(index);
      } else {
        r.result += static_cast<uint64_t>(res);
        if (r.result < r.buffer.size()) {
          CountShortIo();
          resubmits_.fetch_add(1, std::memory_order_relaxed);
          queued.push_back(index);
        } else {
          completed.push_back(index);
        }
      }
    }
    io_uring_cq_advance(uring, seen);

    if (!completed.empty()) {
      // Keep the device busy while the caller works on what finished.
      if (!queued.empty()) {
        fill();
        if (!submit(/*wait_for=*/0)) return;
      }
      for (size_t index : completed) on_complete(index);
      completed.clear();
    }
  }
}

}  // namespace tierkv::storage
