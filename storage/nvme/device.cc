// Device: request validation, splitting, retries and counters around the
// backends' *Impl hooks (see device.h).
#include "storage/nvme/device.h"

#include <fmt/format.h>

#include <cstring>
#include <string>
#include <vector>

namespace tierkv::storage {

Status IoErrorFromErrno(std::string_view what, uint64_t offset, uint64_t length,
                        int err) {
  char buf[128];
  // GNU strerror_r returns the message pointer (may not use buf).
  const char* text = ::strerror_r(err, buf, sizeof(buf));
  return Status::IOError(fmt::format("{} offset={} length={}: {} (errno {})",
                                     what, offset, length, text, err));
}

Device::Device(uint64_t size_bytes, uint32_t block_size, uint32_t max_io_bytes)
    : size_(size_bytes), block_size_(block_size), max_io_bytes_(max_io_bytes) {}

Status Device::Validate(uint64_t offset, const void* data,
                        size_t length) const {
  const uint64_t mask = block_size_ - 1;
  if ((offset & mask) != 0 || (length & mask) != 0 ||
      (reinterpret_cast<uintptr_t>(data) & mask) != 0) {
    return Status::InvalidArgument(
        fmt::format("unaligned IO: offset={} length={} buffer={} block_size={}",
                    offset, length, data, block_size_));
  }
  if (length == 0) return Status::InvalidArgument("zero-length IO");
  if (offset > size_ || length > size_ - offset) {
    return Status::InvalidArgument(
        fmt::format("IO out of bounds: offset={} length={} device_size={}",
                    offset, length, size_));
  }
  return Status::OK();
}

Status Device::Read(uint64_t offset, std::span<std::byte> dst) {
  IoRequest request{IoOp::kRead, offset, dst};
  SubmitBatch({&request, 1});
  return request.status;
}

Status Device::Write(uint64_t offset, std::span<const std::byte> src) {
  // IoRequest carries one mutable span for both directions; a write only
  // reads from it, so dropping const here never leads to a store.
  IoRequest request{
      IoOp::kWrite, offset, {const_cast<std::byte*>(src.data()), src.size()}};
  SubmitBatch({&request, 1});
  return request.status;
}

Status Device::Flush() {
  Status status = FlushImpl();
  flush_ops_.fetch_add(1, std::memory_order_relaxed);
  if (!status.ok()) errors_.fetch_add(1, std::memory_order_relaxed);
  return status;
}

void Device::SubmitBatch(std::span<IoRequest> requests,
                         const IoCompletion& on_complete) {
  const auto start = std::chrono::steady_clock::now();
  // Final checks, accounting (latency = time from the batch's start to this
  // request's completion) and the caller's callback, once per valid request.
  auto finish = [&](size_t i) {
    IoRequest& r = requests[i];
    if (r.status.ok() && r.result != r.buffer.size()) {
      r.status =
          Status::IOError(fmt::format("short {} at offset={}: {} of {} bytes",
                                      r.op == IoOp::kRead ? "read" : "write",
                                      r.offset, r.result, r.buffer.size()));
    }
    Account(r.op, r.result, r.status, std::chrono::steady_clock::now() - start);
    if (on_complete) on_complete(i);
  };

  bool needs_split = false;
  std::vector<bool> valid(requests.size(), false);
  for (size_t i = 0; i < requests.size(); ++i) {
    IoRequest& r = requests[i];
    r.result = 0;
    r.status = Validate(r.offset, r.buffer.data(), r.buffer.size());
    valid[i] = r.status.ok();
    needs_split |= !valid[i] || r.buffer.size() > max_io_bytes_;
  }

  if (!needs_split) {
    SubmitBatchImpl(requests, finish);
    return;
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!valid[i] && on_complete) on_complete(i);
  }
  // Split into <= max_io_bytes chunks, submit together, fold each chunk
  // into its request as it completes.
  std::vector<IoRequest> chunks;
  std::vector<size_t> parent;
  std::vector<size_t> chunks_left(requests.size(), 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!valid[i]) continue;
    const IoRequest& r = requests[i];
    for (size_t done = 0; done < r.buffer.size(); done += max_io_bytes_) {
      const size_t len =
          std::min<size_t>(max_io_bytes_, r.buffer.size() - done);
      chunks.push_back(
          IoRequest{r.op, r.offset + done, r.buffer.subspan(done, len)});
      parent.push_back(i);
      ++chunks_left[i];
    }
  }
  SubmitBatchImpl(chunks, [&](size_t c) {
    const size_t i = parent[c];
    IoRequest& r = requests[i];
    r.result += chunks[c].result;
    if (!chunks[c].status.ok() && r.status.ok()) r.status = chunks[c].status;
    if (--chunks_left[i] == 0) finish(i);
  });
}

void Device::SubmitBatchImpl(std::span<IoRequest> requests,
                             const IoCompletion& on_complete) {
  for (size_t i = 0; i < requests.size(); ++i) {
    CompleteInline(requests[i]);
    on_complete(i);
  }
}

void Device::CompleteInline(IoRequest& r) {
  r.result = 0;
  r.status = Status::OK();
  while (r.result < r.buffer.size()) {
    const uint64_t offset = r.offset + r.result;
    std::span<std::byte> rest = r.buffer.subspan(r.result);
    Result<size_t> n =
        r.op == IoOp::kRead ? ReadImpl(offset, rest) : WriteImpl(offset, rest);
    if (!n.ok()) {
      r.status = n.status();
      return;
    }
    if (*n == 0 || *n > rest.size()) {
      r.status = Status::IOError(
          fmt::format("{} made no progress at offset={} ({} of {} bytes done)",
                      r.op == IoOp::kRead ? "read" : "write", offset, r.result,
                      r.buffer.size()));
      return;
    }
    if (*n < rest.size()) short_ios_.fetch_add(1, std::memory_order_relaxed);
    r.result += *n;
  }
}

IoBuffer Device::AllocateIoBuffer(size_t bytes) {
  return AllocateIoBufferImpl(RoundUp(bytes));
}

IoBuffer Device::AllocateRegisteredIoBuffer(size_t bytes) {
  return AllocateRegisteredIoBufferImpl(RoundUp(bytes));
}

IoBuffer Device::AllocateIoBufferImpl(size_t bytes) {
  return IoBuffer::AllocateAligned(bytes, block_size_);
}

IoBuffer Device::AllocateRegisteredIoBufferImpl(size_t) { return {}; }

void Device::Account(IoOp op, uint64_t bytes, const Status& status,
                     std::chrono::nanoseconds latency) {
  if (op == IoOp::kRead) {
    read_ops_.fetch_add(1, std::memory_order_relaxed);
    read_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    read_latency_.Record(latency);
  } else {
    write_ops_.fetch_add(1, std::memory_order_relaxed);
    write_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    write_latency_.Record(latency);
  }
  if (!status.ok()) errors_.fetch_add(1, std::memory_order_relaxed);
}

DeviceStats Device::Stats() const {
  DeviceStats s;
  s.read_ops = read_ops_.load(std::memory_order_relaxed);
  s.read_bytes = read_bytes_.load(std::memory_order_relaxed);
  s.write_ops = write_ops_.load(std::memory_order_relaxed);
  s.write_bytes = write_bytes_.load(std::memory_order_relaxed);
  s.flush_ops = flush_ops_.load(std::memory_order_relaxed);
  s.errors = errors_.load(std::memory_order_relaxed);
  s.short_ios = short_ios_.load(std::memory_order_relaxed);
  s.read_latency = read_latency_.Snapshot();
  s.write_latency = write_latency_.Snapshot();
  return s;
}

}  // namespace tierkv::storage
