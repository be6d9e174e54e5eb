// ParseDeviceBackendKind (see device_backend_kind.h).
#include "storage/device/device_backend_kind.h"

#include <fmt/format.h>

namespace tierkv::storage {

Result<DeviceBackendKind> ParseDeviceBackendKind(std::string_view name) {
  if (name == "auto") return DeviceBackendKind::kAuto;
  if (name == "cuda") return DeviceBackendKind::kCuda;
  if (name == "emulated") return DeviceBackendKind::kEmulated;
  return Status::InvalidArgument(fmt::format(
      "device backend '{}': expected auto, cuda or emulated", name));
}

}  // namespace tierkv::storage
