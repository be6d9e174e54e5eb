// DeviceBackendKind: the device backends the HBM tier may name (`[hbm]
// backend` in tierkvd's config; device_backend.h has the backends).
#pragma once

#include <cstdint>
#include <string_view>

#include "tierkv/status.h"

namespace tierkv::storage {

enum class DeviceBackendKind : uint8_t { kAuto, kCuda, kEmulated };

// "auto", "cuda" or "emulated"; InvalidArgument otherwise.
Result<DeviceBackendKind> ParseDeviceBackendKind(std::string_view name);

}  // namespace tierkv::storage
