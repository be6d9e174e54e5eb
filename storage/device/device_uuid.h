// DeviceUuid: a GPU's identity across processes.
//
// CUDA device ordinals are per process: CUDA_VISIBLE_DEVICES renumbers
// them, so an engine's device 0 may be tierkvd's device 3. A device's UUID
// (cudaDeviceProp::uuid; what `nvidia-smi -L` prints as GPU-8-4-4-4-12 hex)
// is the same in every process, so device pools and the daemon's [hbm]
// device are matched by it. The emulated backend gives device n the UUID
// GPU-eeeeeeee-eeee-eeee-eeee-eeeeeeeeNNNN (n in the last 4 hex digits).
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include "tierkv/status.h"

namespace tierkv::storage {

using DeviceUuid = std::array<std::byte, 16>;

// True for the all-zero UUID, which means "not said".
bool IsUnsetDeviceUuid(const DeviceUuid& uuid);

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it.
std::string FormatDeviceUuid(const DeviceUuid& uuid);
// The reverse (the "GPU-" prefix optional, hex of either case);
// InvalidArgument naming the expected form otherwise.
Result<DeviceUuid> ParseDeviceUuid(std::string_view text);

// The emulated backend's UUID of device `ordinal`, and the ordinal of an
// emulated UUID (-1 for any other).
DeviceUuid EmulatedDeviceUuid(int ordinal);
int EmulatedDeviceOrdinal(const DeviceUuid& uuid);

}  // namespace tierkv::storage
