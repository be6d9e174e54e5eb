// PopulatedMemory: chunks populated ahead of use, free lists, then the heap
// (see populated_memory.h).
#include "storage/host/populated_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <new>
#include <utility>

// Blocks handed out are addressable, freed and not yet bumped ones are not:
// under AddressSanitizer, a use of an index node after its erase is caught
// as it would be with malloc (no-ops otherwise).
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define TIERKV_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define TIERKV_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define TIERKV_POISON(p, n) ((void)(p), (void)(n))
#define TIERKV_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace tierkv::storage {

PopulatedChunk PopulatedChunk::Map(size_t bytes, bool populate) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t size = (bytes + page - 1) / page * page;
  PopulatedChunk chunk;
  if (size == 0) return chunk;
  // A private writable mapping is populated with write faults: every page
  // is allocated now, not shared with the zero page.
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | (populate ? MAP_POPULATE : 0),
                   -1, 0);
  if (p == MAP_FAILED) return chunk;
  chunk.base_ = static_cast<std::byte*>(p);
  chunk.size_ = size;
  TIERKV_POISON(chunk.base_, chunk.size_);
  return chunk;
}

PopulatedChunk::~PopulatedChunk() {
  if (!base_) return;
  TIERKV_UNPOISON(base_, size_);  // the address range may be mapped again
  ::munmap(base_, size_);
}

PopulatedChunk::PopulatedChunk(PopulatedChunk&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

PopulatedChunk& PopulatedChunk::operator=(PopulatedChunk&& other) noexcept {
  if (this != &other) {
    if (base_) {
      TIERKV_UNPOISON(base_, size_);
      ::munmap(base_, size_);
    }
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

void* PopulatedMemory::Bump(size_t bytes) {
  for (; current_ < chunks_.size(); ++current_, used_ = 0) {
    if (used_ + bytes <= chunks_[current_].size()) {
      void* p = chunks_[current_].base() + used_;
      used_ += bytes;
      TIERKV_UNPOISON(p, bytes);
      return p;
    }
  }
  PopulatedChunk grown = PopulatedChunk::Map(kGrowChunkBytes, false);
  if (!grown.ok()) throw std::bad_alloc();
  heap_bytes_ += grown.size();
  chunks_.push_back(std::move(grown));
  used_ = bytes;
  TIERKV_UNPOISON(chunks_[current_].base(), bytes);
  return chunks_[current_].base();
}

void* PopulatedMemory::do_allocate(size_t bytes, size_t alignment) {
  if (!Small(bytes, alignment)) {
    void* p = ::operator new (bytes, std::align_val_t{alignment});
    heap_bytes_ += bytes;
    return p;
  }
  const size_t cls = (bytes + kBlockAlign - 1) / kBlockAlign;
  if (FreeBlock* b = free_[cls]) {
    TIERKV_UNPOISON(b, cls * kBlockAlign);
    free_[cls] = b->next;
    return b;
  }
  return Bump(cls * kBlockAlign);
}

void PopulatedMemory::do_deallocate(void* p, size_t bytes, size_t alignment) {
  if (!Small(bytes, alignment)) {
    ::operator delete (p, std::align_val_t{alignment});
    heap_bytes_ -= bytes;
    return;
  }
  const size_t cls = (bytes + kBlockAlign - 1) / kBlockAlign;
  free_[cls] = new (p) FreeBlock{free_[cls]};
  TIERKV_POISON(p, cls * kBlockAlign);
}

}  // namespace tierkv::storage
