#include "tests/testing/fault_injection_device.h"

#include <fmt/format.h>

namespace tierkv::testing {

using storage::IoBuffer;
using storage::IoErrorFromErrno;
using storage::IoOp;

FaultInjectionDevice::FaultInjectionDevice(
    std::shared_ptr<storage::Device> target)
    : Device(target->size(), target->block_size(), target->max_io_bytes()),
      target_(std::move(target)) {}

void FaultInjectionDevice::FailNthIo(uint64_t n, int err,
                                     std::optional<IoOp> only) {
  MutexLock lock(&mu_);
  fail_countdown_ = n;
  fail_nth_errno_ = err;
  fail_nth_only_ = only;
}

void FaultInjectionDevice::FailWrites(int err) {
  MutexLock lock(&mu_);
  write_errno_ = err;
}

void FaultInjectionDevice::FailReads(int err) {
  MutexLock lock(&mu_);
  read_errno_ = err;
}

void FaultInjectionDevice::ShortIo(uint64_t count) {
  MutexLock lock(&mu_);
  short_remaining_ = count;
}

void FaultInjectionDevice::StallIo(uint64_t count) {
  MutexLock lock(&mu_);
  stall_remaining_ = count;
}

void FaultInjectionDevice::CorruptReads(bool enable) {
  MutexLock lock(&mu_);
  corrupt_reads_ = enable;
}

void FaultInjectionDevice::ClearFaults() {
  MutexLock lock(&mu_);
  fail_countdown_ = 0;
  write_errno_ = read_errno_ = 0;
  short_remaining_ = stall_remaining_ = 0;
  corrupt_reads_ = false;
}

FaultInjectionDevice::Action FaultInjectionDevice::NextAction(IoOp op,
                                                              int* err) {
  MutexLock lock(&mu_);
  if (fail_countdown_ > 0 && (!fail_nth_only_ || *fail_nth_only_ == op)) {
    if (--fail_countdown_ == 0) {
      *err = fail_nth_errno_;
      return Action::kFail;
    }
  }
  const int sticky = op == IoOp::kRead ? read_errno_ : write_errno_;
  if (sticky != 0) {
    *err = sticky;
    return Action::kFail;
  }
  if (stall_remaining_ > 0) {
    --stall_remaining_;
    return Action::kStall;
  }
  if (short_remaining_ > 0) {
    --short_remaining_;
    return Action::kShort;
  }
  return Action::kNone;
}

size_t FaultInjectionDevice::ShortLength(size_t length) const {
  const size_t half = (length / 2) & ~size_t{block_size() - 1};
  return half == 0 ? std::min<size_t>(length, block_size()) : half;
}

Result<size_t> FaultInjectionDevice::ReadImpl(uint64_t offset,
                                              std::span<std::byte> dst) {
  int err = 0;
  const Action action = NextAction(IoOp::kRead, &err);
  if (action != Action::kNone)
    injected_.fetch_add(1, std::memory_order_relaxed);
  switch (action) {
    case Action::kFail:
      return IoErrorFromErrno("read", offset, dst.size(), err);
    case Action::kStall:
      return size_t{0};
    case Action::kShort:
      dst = dst.first(ShortLength(dst.size()));
      break;
    case Action::kNone:
      break;
  }
  TIERKV_RETURN_IF_ERROR(target_->Read(offset, dst));
  bool corrupt;
  {
    MutexLock lock(&mu_);
    corrupt = corrupt_reads_;
  }
  if (corrupt) {
    injected_.fetch_add(1, std::memory_order_relaxed);
    dst[dst.size() / 2] ^= std::byte{0x5A};
  }
  return dst.size();
}

Result<size_t> FaultInjectionDevice::WriteImpl(uint64_t offset,
                                               std::span<const std::byte> src) {
  int err = 0;
  const Action action = NextAction(IoOp::kWrite, &err);
  if (action != Action::kNone)
    injected_.fetch_add(1, std::memory_order_relaxed);
  switch (action) {
    case Action::kFail:
      return IoErrorFromErrno("write", offset, src.size(), err);
    case Action::kStall:
      return size_t{0};
    case Action::kShort:
      src = src.first(ShortLength(src.size()));
      break;
    case Action::kNone:
      break;
  }
  TIERKV_RETURN_IF_ERROR(target_->Write(offset, src));
  return src.size();
}

Status FaultInjectionDevice::FlushImpl() {
  int err;
  {
    MutexLock lock(&mu_);
    err = write_errno_;
  }
  if (err != 0) {
    injected_.fetch_add(1, std::memory_order_relaxed);
    return IoErrorFromErrno("flush", 0, 0, err);
  }
  return target_->Flush();
}

Status FaultInjectionDevice::CorruptStoredBytes(uint64_t offset,
                                                uint64_t length) {
  if (offset > size() || length > size() - offset || length == 0) {
    return Status::InvalidArgument(fmt::format(
        "corrupt range out of bounds: offset={} length={}", offset, length));
  }
  const uint64_t first = offset & ~uint64_t{block_size() - 1};
  const uint64_t end = RoundUp(offset + length);
  IoBuffer buf = IoBuffer::AllocateAligned(end - first, block_size());
  std::span<std::byte> blocks = buf.span().first(end - first);
  TIERKV_RETURN_IF_ERROR(target_->Read(first, blocks));
  for (uint64_t i = offset - first; i < offset - first + length; ++i) {
    blocks[i] ^= std::byte{0xFF};
  }
  return target_->Write(first, blocks);
}

}  // namespace tierkv::testing
