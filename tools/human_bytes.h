// HumanBytes: a byte count for people ("7.9 MiB"), as the CLI prints it.
#pragma once

#include <fmt/format.h>

#include <string>

namespace tierkv::tools {

inline std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", bytes, units[u]);
}

}  // namespace tierkv::tools
