// PopulatedMemory: chunks populated ahead of use, then the heap (see
// populated_memory.h).
#include "storage/host/populated_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <new>
#include <utility>

namespace tierkv::storage {

PopulatedChunk PopulatedChunk::Map(size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t size = (bytes + page - 1) / page * page;
  PopulatedChunk chunk;
  if (size == 0) return chunk;
  // A private writable mapping is populated with write faults: every page
  // is allocated now, not shared with the zero page.
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) return chunk;
  chunk.base_ = static_cast<std::byte*>(p);
  chunk.size_ = size;
  return chunk;
}

PopulatedChunk::~PopulatedChunk() {
  if (base_) ::munmap(base_, size_);
}

PopulatedChunk::PopulatedChunk(PopulatedChunk&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

PopulatedChunk& PopulatedChunk::operator=(PopulatedChunk&& other) noexcept {
  if (this != &other) {
    if (base_) ::munmap(base_, size_);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void PopulatedMemory::Add(PopulatedChunk chunk) {
  if (!chunk.ok()) return;
  populated_bytes_ += chunk.size();
  chunks_.push_back(std::move(chunk));
}

void* PopulatedMemory::do_allocate(size_t bytes, size_t alignment) {
  if (bytes <= kMaxChunkAllocation) {
    for (; current_ < chunks_.size(); ++current_, used_ = 0) {
      const PopulatedChunk& c = chunks_[current_];
      const size_t start = (used_ + alignment - 1) / alignment * alignment;
      if (start + bytes <= c.size()) {
        used_ = start + bytes;
        return c.base() + start;
      }
    }
  }
  void* p = ::operator new (bytes, std::align_val_t{alignment});
  heap_bytes_ += bytes;
  return p;
}

void PopulatedMemory::do_deallocate(void* p, size_t bytes, size_t alignment) {
  if (InChunk(p)) return;  // reclaimed with the chunk
  ::operator delete (p, std::align_val_t{alignment});
  heap_bytes_ -= bytes;
}

bool PopulatedMemory::InChunk(const void* p) const {
  const auto at = reinterpret_cast<uintptr_t>(p);
  for (const PopulatedChunk& c : chunks_) {
    const auto base = reinterpret_cast<uintptr_t>(c.base());
    if (at >= base && at - base < c.size()) return true;
  }
  return false;
}

}  // namespace tierkv::storage
