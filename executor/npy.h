// WriteNpy: writes a float32 array as a NumPy .npy file (format 1.0,
// little-endian '<f4', C order), readable by numpy.load.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "tierkv/status.h"

namespace tierkv::executor {

// REQUIRES: product(shape) == data.size(). Returns IOError on failure.
Status WriteNpy(const std::filesystem::path& file, std::span<const float> data,
                const std::vector<int64_t>& shape);

}  // namespace tierkv::executor
