// tierkv::EngineStream: an inference engine's GPU stream, named for tierkv
// work that must be ordered with the engine's own without a host wait
// (SparseWorkingSet::Rows, Client::Load / Client::Store with `after`,
// TransferHandle::StreamWaitLayer).
#pragma once

#include <cstdint>

namespace tierkv {

// CUDA: `handle` is a cudaStream_t of this process on the device the
// memory involved lives on (nullptr: the legacy default stream). On the
// emulated device (no GPU): `handle` is the tierkv::storage::DeviceBackend*
// standing in for the engine's device, `emulated_stream` one of its
// streams (tests).
struct EngineStream {
  void* handle = nullptr;
  uint32_t emulated_stream = 0;
};

}  // namespace tierkv
