// Implements the frozen prefix-hash chain declared in tierkv/page_hash.h.
#include "tierkv/page_hash.h"

#define XXH_INLINE_ALL  // header-only: lets the compiler inline XXH3
#include <xxhash.h>

#include <bit>
#include <cstring>

namespace tierkv {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the wire format and hash chain assume a little-endian host");

PageHash FromXxh(XXH128_hash_t h) { return PageHash{h.low64, h.high64}; }

}  // namespace

PageHash RootPageHash(std::string_view namespace_name) {
  constexpr std::string_view kDomain = "tierkv/v1/";
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  XXH3_128bits_update(&state, kDomain.data(), kDomain.size());
  XXH3_128bits_update(&state, namespace_name.data(), namespace_name.size());
  return FromXxh(XXH3_128bits_digest(&state));
}

PageHash NextPageHash(const PageHash& parent,
                      std::span<const uint32_t> page_tokens,
                      std::span<const std::byte> salt) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  const uint64_t words[2] = {parent.lo, parent.hi};
  XXH3_128bits_update(&state, words, sizeof(words));
  XXH3_128bits_update(&state, page_tokens.data(), page_tokens.size_bytes());
  if (!salt.empty()) XXH3_128bits_update(&state, salt.data(), salt.size());
  return FromXxh(XXH3_128bits_digest(&state));
}

std::vector<PageHash> PageHashChain(const PageHash& root,
                                    std::span<const uint32_t> tokens,
                                    uint32_t page_tokens,
                                    std::span<const std::byte> salt) {
  std::vector<PageHash> out;
  if (page_tokens == 0) return out;
  out.reserve(tokens.size() / page_tokens);
  PageHash parent = root;
  for (size_t start = 0; start + page_tokens <= tokens.size();
       start += page_tokens) {
    parent = NextPageHash(parent, tokens.subspan(start, page_tokens), salt);
    out.push_back(parent);
  }
  return out;
}

}  // namespace tierkv
