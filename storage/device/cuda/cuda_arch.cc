// Matching a device's compute capability against the built architectures
// (cuda_arch.h). Plain C++: compiled and tested without nvcc.
#include "storage/device/cuda/cuda_arch.h"

#include <fmt/format.h>

#include <charconv>

namespace tierkv::storage {

Result<CudaArchitectures> ParseCudaArchitectures(std::string_view list) {
  CudaArchitectures out;
  while (!list.empty()) {
    const size_t end = list.find_first_of(",;");
    std::string_view entry = list.substr(0, end);
    list = end == std::string_view::npos ? "" : list.substr(end + 1);
    if (entry.empty()) continue;
    bool real = true, virt = true;
    if (entry.ends_with("-real")) {
      virt = false;
      entry.remove_suffix(5);
    } else if (entry.ends_with("-virtual")) {
      real = false;
      entry.remove_suffix(8);
    }
    int arch = 0;
    const auto [rest, ec] =
        std::from_chars(entry.data(), entry.data() + entry.size(), arch);
    if (ec != std::errc() || rest != entry.data() + entry.size() || arch < 10) {
      return Status::InvalidArgument(fmt::format(
          "CUDA architecture '{}' is not a number like 90, 90-real or "
          "90-virtual",
          entry));
    }
    if (real) out.sass.push_back(arch);
    if (virt) out.ptx.push_back(arch);
  }
  return out;
}

bool KernelsRunOn(const CudaArchitectures& built, int major, int minor) {
  for (const int arch : built.sass) {
    if (arch / 10 == major && arch % 10 <= minor) return true;
  }
  for (const int arch : built.ptx) {
    if (arch <= major * 10 + minor) return true;  // PTX compiles forward
  }
  return false;
}

std::string DescribeArchitectures(const CudaArchitectures& built) {
  std::string out;
  for (const int arch : built.sass) {
    out += fmt::format("{}sm_{}", out.empty() ? "" : ", ", arch);
  }
  for (const int arch : built.ptx) {
    out += fmt::format("{}PTX compute_{}", out.empty() ? "" : ", ", arch);
  }
  return out.empty() ? "no architecture" : out;
}

}  // namespace tierkv::storage
