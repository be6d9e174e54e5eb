// .npy writer (see npy.h).
#include "executor/npy.h"

#include <fmt/format.h>

#include <fstream>
#include <string>

namespace tierkv::executor {

Status WriteNpy(const std::filesystem::path& file, std::span<const float> data,
                const std::vector<int64_t>& shape) {
  std::string dims;
  for (int64_t d : shape) dims += fmt::format("{}, ", d);
  if (shape.size() > 1) dims.resize(dims.size() - 1);  // "(a, b)" / "(a,)"
  if (!dims.empty() && shape.size() > 1) dims.pop_back();
  std::string header = fmt::format(
      "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}", dims);
  // Magic (6) + version (2) + length (2) + header + '\n' is a multiple of 64.
  while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  if (!out)
    return Status::IOError(fmt::format("cannot create {}", file.string()));
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  const char len_bytes[2] = {static_cast<char>(len & 0xff),
                             static_cast<char>(len >> 8)};
  out.write(len_bytes, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data.data()),
            static_cast<std::streamsize>(data.size() * sizeof(float)));
  if (!out)
    return Status::IOError(fmt::format("write to {} failed", file.string()));
  return Status::OK();
}

}  // namespace tierkv::executor
