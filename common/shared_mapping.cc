// MapShared: see shared_mapping.h.
#include "common/shared_mapping.h"

#include <sys/mman.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack it
#endif

namespace tierkv {

void* MapShared(int fd, size_t bytes, bool prefault) {
  void* base =
      ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED || !prefault) return base;
  if (::madvise(base, bytes, MADV_POPULATE_WRITE) == 0) return base;
  // An older kernel (EINVAL), or no memory to fill it in now: populate as
  // before, best effort (MAP_POPULATE ignores what it cannot fault in).
  ::munmap(base, bytes);
  return ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                MAP_SHARED | MAP_POPULATE, fd, 0);
}

}  // namespace tierkv
