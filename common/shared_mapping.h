// MapShared: maps a shared memory file (an arena memfd) read/write, its
// page tables filled in as if every page had been written.
//
// Why not MAP_POPULATE: on a MAP_SHARED mapping it populates as if each
// page were read, leaving clean page-table entries, and the first write to
// each 4 KiB page then pays for the CPU setting the entry's dirty bit. On
// the 2-core VM the first memcpy pass into such a mapping ran at 12.5 GB/s
// against 19.4 GB/s for later passes, and a Put into a fresh arena at 0.52x
// memcpy against 0.75x once warm (bench/RESULTS.md, "fresh arena").
// MADV_POPULATE_WRITE (Linux 5.14) populates as if written, without
// writing a byte (nothing a concurrent writer stored is touched).
#pragma once

#include <cstddef>

namespace tierkv {

// mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0); with
// `prefault`, every page is then present, writable and dirty in this
// mapping (MADV_POPULATE_WRITE), or, on a kernel without it, populated as
// MAP_POPULATE would. Returns MAP_FAILED with errno set, as mmap does.
void* MapShared(int fd, size_t bytes, bool prefault);

}  // namespace tierkv
