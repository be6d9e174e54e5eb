// StreamCopy: memcpy for bulk copies whose destination the copying thread
// does not read back soon: the stores bypass the CPU caches (non-temporal).
//
// Who uses it and why:
// - The daemon's Load into engine pools copies hundreds of MB while the
//   engine computes on the same CPU (DESIGN.md §5: layer l computes while
//   l + 1 loads). Ordinary stores pull every destination line into the
//   shared L3 and evict the engine's working set (weights, indexer keys): on
//   the 2-core VM a 318 MB Load slowed the concurrent prefill by ~8%.
// - The client's Put into the arena: the writer never reads a stored
//   segment back; the daemon's demotion and other clients' Gets read it
//   later, from memory either way.
// - The client's Get into engine buffers: as with Load, the engine reads
//   them later (or a device DMA does), not right away.
// Streaming stores also skip the read of each destination line an ordinary
// store makes first, a third of a copy's memory traffic: on the Zen 4 VM,
// Put and Get of 1 MiB segments went from 0.89x to 1.2x memcpy, 72 KiB from
// 0.84-0.86x to 0.90-0.91x (bench/RESULTS.md, "streaming copies in the
// client"). glibc's memcpy streams only copies larger than a fraction of
// L3, far above one segment.
#pragma once

#include <cstddef>

namespace tierkv {

// Copies n bytes; src and dst must not overlap. Non-temporal stores for
// large copies (>= kStreamCopyMinBytes), a plain memcpy otherwise. The
// copied bytes are visible to other threads on return (a store fence):
// callers publish them with a release store or a message.
void StreamCopy(std::byte* dst, const std::byte* src, size_t n);

inline constexpr size_t kStreamCopyMinBytes = 32 * 1024;

// The instruction set StreamCopy uses, picked once at start-up (kAvx2 where
// the CPU has it). Tests run each one this CPU has through
// StreamCopyWith.
enum class StreamCopyIsa { kMemcpy, kSse2, kAvx2 };
StreamCopyIsa StreamCopyDefaultIsa();
bool StreamCopyIsaSupported(StreamCopyIsa isa);
void StreamCopyWith(StreamCopyIsa isa, std::byte* dst, const std::byte* src,
                    size_t n);

}  // namespace tierkv
