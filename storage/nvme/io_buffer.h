// IoBuffer: a move-only, block-aligned byte buffer for direct IO.
//
// O_DIRECT needs the buffer address, file offset and length aligned to the
// device's block size; segments have arbitrary sizes, so readers and writers
// stage them in an IoBuffer rounded up to whole blocks ("bounce buffer").
// The memory is either plain heap memory (AllocateAligned) or a slice of a
// backend-owned arena registered with the kernel (see
// Device::AllocateIoBuffer); `owner_` keeps whichever alive and releases it
// on destruction.
//
// Thread safety: an IoBuffer is a value; it may be handed to and destroyed on
// any thread, but one buffer must not be written by two threads at once.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <span>
#include <utility>

namespace tierkv::storage {

class IoBuffer {
 public:
  IoBuffer() = default;
  // Adopts `size` bytes at `data`, kept alive (and released) by `owner`.
  IoBuffer(std::byte* data, size_t size, std::shared_ptr<void> owner)
      : data_(data), size_(size), owner_(std::move(owner)) {}

  // Heap memory aligned to `alignment` (a power of two), `size` rounded up to
  // it; contents are zeroed. Returns an empty buffer when size is 0 or the
  // allocation fails.
  static IoBuffer AllocateAligned(size_t size, size_t alignment) {
    if (size == 0) return {};
    const size_t rounded = (size + alignment - 1) & ~(alignment - 1);
    void* raw = std::aligned_alloc(alignment, rounded);
    if (raw == nullptr) return {};
    std::shared_ptr<void> owner(raw, [](void* p) { std::free(p); });
    auto* bytes = static_cast<std::byte*>(raw);
    std::fill(bytes, bytes + rounded, std::byte{0});
    return IoBuffer(bytes, rounded, std::move(owner));
  }

  IoBuffer(IoBuffer&& other) noexcept { *this = std::move(other); }
  IoBuffer& operator=(IoBuffer&& other) noexcept {
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    owner_ = std::move(other.owner_);
    return *this;
  }
  IoBuffer(const IoBuffer&) = delete;
  IoBuffer& operator=(const IoBuffer&) = delete;

  bool empty() const { return size_ == 0; }
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<std::byte> span() const { return {data_, size_}; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  std::shared_ptr<void> owner_;  // frees or returns the memory
};

}  // namespace tierkv::storage
