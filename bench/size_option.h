// ParseSizeOption: a tierkv-bench option that is a byte size ("--file-size
// 2GiB"), read by the one size parser tierkvd reads its config with.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string_view>

#include "common/byte_size.h"
#include "tierkv/status.h"

namespace tierkv::bench {

// `text` in ParseByteSize's grammar (common/byte_size.h: "72KiB", "2 GiB",
// "4096"). InvalidArgument naming `option` and saying what is wrong.
inline Result<uint64_t> ParseSizeOption(std::string_view option,
                                        std::string_view text) {
  auto bytes = ParseByteSize(text);
  if (bytes.ok()) return bytes;
  return Status::InvalidArgument(
      fmt::format("{}: {}", option, bytes.status().message()));
}

}  // namespace tierkv::bench
