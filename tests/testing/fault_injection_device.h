// FaultInjectionDevice: a Device decorator that injects failures into IO
// sent to a target device (leveldb's fault_injection_test, navy's
// MockDevice). Tests use it to prove that callers turn every device failure
// into a Status and lose nothing already stored. A test double: it lives in
// tests/testing/, never in tierkvd.
//
// Faults, all configurable at runtime and cleared by ClearFaults():
//   * FailNthIo(n, err): the n-th IO from now (1-based; reads and writes
//     counted together, or only `only` ops) fails with errno `err` (e.g. EIO).
//   * FailWrites(err) / FailReads(err): every write (read) fails with `err`
//     until cleared; FailWrites(ENOSPC) models a full device.
//   * ShortIo(count): the next `count` IOs transfer only half their length
//     (rounded down to a block, at least one block), as a kernel may.
//   * StallIo(count): the next `count` IOs transfer 0 bytes (no progress).
//   * CorruptReads(bool): flip one byte in every buffer returned by a read;
//     the backing store is untouched.
//   * CorruptStoredBytes(offset, length): flip every byte of that range in
//     the target device (read-modify-write of the covering blocks).
// Flush is forwarded; FailWrites also fails Flush.
//
// Thread safety: fully thread-safe; configuration may change while IO runs.
// Ownership: shares ownership of the target.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "storage/nvme/device.h"

namespace tierkv::testing {

class FaultInjectionDevice final : public storage::Device {
 public:
  // REQUIRES: target != nullptr.
  explicit FaultInjectionDevice(std::shared_ptr<storage::Device> target);

  void FailNthIo(uint64_t n, int err,
                 std::optional<storage::IoOp> only = std::nullopt);
  void FailWrites(int err);
  void FailReads(int err);
  void ShortIo(uint64_t count);
  void StallIo(uint64_t count);
  void CorruptReads(bool enable);
  void ClearFaults();

  // Flips (XOR 0xFF) every byte of [offset, offset + length) in the target.
  // InvalidArgument when out of bounds; IOError when the target fails.
  Status CorruptStoredBytes(uint64_t offset, uint64_t length);

  // Number of IOs that had a fault injected so far.
  uint64_t injected_faults() const {
    return injected_.load(std::memory_order_relaxed);
  }
  storage::Device& target() { return *target_; }

 protected:
  Result<size_t> ReadImpl(uint64_t offset, std::span<std::byte> dst) override;
  Result<size_t> WriteImpl(uint64_t offset,
                           std::span<const std::byte> src) override;
  Status FlushImpl() override;

 private:
  enum class Action { kNone, kFail, kShort, kStall };
  // Decides the fault for one IO of kind `op`; sets *err for kFail.
  Action NextAction(storage::IoOp op, int* err) EXCLUDES(mu_);
  size_t ShortLength(size_t length) const;

  const std::shared_ptr<storage::Device> target_;
  mutable Mutex mu_;  // guards the fault configuration below
  uint64_t fail_countdown_ GUARDED_BY(mu_) = 0;  // 0: disarmed
  int fail_nth_errno_ GUARDED_BY(mu_) = 0;
  std::optional<storage::IoOp> fail_nth_only_ GUARDED_BY(mu_);
  int write_errno_ GUARDED_BY(mu_) = 0;  // 0: writes succeed
  int read_errno_ GUARDED_BY(mu_) = 0;
  uint64_t short_remaining_ GUARDED_BY(mu_) = 0;
  uint64_t stall_remaining_ GUARDED_BY(mu_) = 0;
  bool corrupt_reads_ GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> injected_{0};  // statistics only (relaxed)
};

}  // namespace tierkv::testing
