// OpenCudaBackend: DeviceBackend on a CUDA device (cuda_backend.cc). Only
// in builds with TIERKV_WITH_CUDA; DeviceBackend::Open calls it.
#pragma once

#include <memory>

#include "storage/device/device_backend.h"

namespace tierkv::storage {

// Unavailable when this machine has no usable device or driver (the
// message says which, from cudaGetDeviceCount: cudaErrorInsufficientDriver
// means no driver), InvalidArgument for a device ordinal it does not have.
Result<std::unique_ptr<DeviceBackend>> OpenCudaBackend(
    const DeviceBackendOptions& options);

}  // namespace tierkv::storage
