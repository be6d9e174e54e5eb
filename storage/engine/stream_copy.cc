// StreamCopy (see stream_copy.h). SSE2 only (x86-64 baseline), so no CPU
// dispatch is needed; other architectures use memcpy.
#include "storage/engine/stream_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace tierkv::storage {

void StreamCopy(std::byte* dst, const std::byte* src, size_t n) {
#if defined(__x86_64__)
  if (n >= kStreamCopyMinBytes) {
    // Head up to 16-byte alignment of dst, then 64 bytes per step.
    const size_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
    std::memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
      const __m128i a =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i b =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
      const __m128i c =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
      const __m128i d =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
    std::memcpy(dst + i, src + i, n - i);
    // Streaming stores are weakly ordered: make them visible before the
    // caller publishes the layer (a release store follows).
    _mm_sfence();
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

}  // namespace tierkv::storage
