// ParseByteSize: the one reader of byte sizes people write ("64MiB",
// "1 GiB", "4096") in tierkvd's config and flags and tierkv-bench's options,
// so a size means the same everywhere.
#pragma once

#include <cstdint>
#include <string_view>

#include "tierkv/status.h"

namespace tierkv {

// Parses a byte size. The grammar (ASCII, units case-insensitive):
//
//   size   := space* digits space* [unit] space*
//   digits := [0-9]+                            a whole number, base 10
//   unit   := B                                 x 1
//           | KiB | K | KB                      x 2^10
//           | MiB | M | MB                      x 2^20
//           | GiB | G | GB                      x 2^30
//           | TiB | T | TB                      x 2^40
//
// Every unit is binary: "1GB" is 2^30 bytes, as tierkvd has always read it
// (README and deploy/ configs write "16MiB", "64GiB"; "64k" and "1gb" are
// read the same way). No fractions ("1.5GiB": write "1536MiB"), no sign, no
// digit separators. Zero is a size ("0", "0GiB"): whether a key may be 0 is
// that key's rule, checked by its caller.
//
// Returns the bytes, or InvalidArgument that quotes `text` and says what
// is wrong with it (no number, an unknown unit, a fraction, more than
// 2^64 - 1 bytes). Callers prefix the key or flag it came from.
Result<uint64_t> ParseByteSize(std::string_view text);

}  // namespace tierkv
