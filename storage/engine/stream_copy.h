// StreamCopy: memcpy for bulk copies into an engine's memory that bypasses
// the CPU caches on the store side (non-temporal stores).
//
// Why: a Load copies hundreds of MB from the arena into engine pools while
// the engine computes on the same CPU (DESIGN.md §5: layer l computes while
// l + 1 loads). Ordinary stores pull every destination line into the
// shared L3 and evict the engine's working set (weights, indexer keys): on
// the 2-core VM a 318 MB Load slowed the concurrent prefill by ~8%. The
// engine reads a loaded row later, not right away, so caching it gains
// nothing. glibc's memcpy switches to non-temporal stores only for copies
// larger than a fraction of L3, far above one segment (e.g. 147 KB).
#pragma once

#include <cstddef>

namespace tierkv::storage {

// Copies n bytes; src and dst must not overlap. Non-temporal stores for
// large copies (>= kStreamCopyMinBytes), a plain memcpy otherwise.
void StreamCopy(std::byte* dst, const std::byte* src, size_t n);

inline constexpr size_t kStreamCopyMinBytes = 32 * 1024;

}  // namespace tierkv::storage
