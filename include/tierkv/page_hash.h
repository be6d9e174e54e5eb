// The prefix-hash chain that names pages (DESIGN.md §3).
//
//   root  = XXH3_128("tierkv/v1/" ‖ namespace)
//   h_i   = XXH3_128(h_{i-1}.lo ‖ h_{i-1}.hi ‖ tokens of page i ‖ salt)
//
// All integers are little-endian: the parent hash as two uint64 words (lo
// first), each token id as a uint32. The salt (e.g. a LoRA id or model
// revision) is appended verbatim; an empty salt adds nothing. Only full pages
// are hashed: a trailing partial page is not cacheable. The chain is frozen by
// test vectors in tests/common/page_hash_test.cc; changing it invalidates
// every persisted cache.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "tierkv/types.h"

namespace tierkv {

// h_{-1} for a namespace.
PageHash RootPageHash(std::string_view namespace_name);

// One link of the chain.
PageHash NextPageHash(const PageHash& parent,
                      std::span<const uint32_t> page_tokens,
                      std::span<const std::byte> salt = {});

// Hashes of every full page of `tokens`, starting from `root`.
// Returns floor(tokens.size() / page_tokens) hashes.
// REQUIRES: page_tokens > 0
std::vector<PageHash> PageHashChain(const PageHash& root,
                                    std::span<const uint32_t> tokens,
                                    uint32_t page_tokens,
                                    std::span<const std::byte> salt = {});

}  // namespace tierkv
