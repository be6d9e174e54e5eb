// Which GPUs a build's CUDA kernels run on.
//
// CMAKE_CUDA_ARCHITECTURES (cmake/Cuda.cmake; by default 80-real, 89-real
// and 90-real: A100/A10/L4/L40/H100/H200) makes nvcc embed machine code
// (SASS) for each "-real" entry, PTX for each "-virtual" one, both for a
// bare number. SASS for sm_Xy runs on a device of compute capability X.z
// for z >= y (binary compatible within a major version); PTX for compute_Xy
// is compiled by the driver for any device of capability >= X.y. A device
// neither covers would fail its first kernel launch with "no kernel image";
// the backend refuses it up front and names the architectures to build.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tierkv/status.h"

namespace tierkv::storage {

// Architectures as CMake writes them: 90 for sm_90.
struct CudaArchitectures {
  std::vector<int> sass;  // machine code embedded for these
  std::vector<int> ptx;   // PTX embedded for these
};

// Parses CMAKE_CUDA_ARCHITECTURES, entries separated by ',' or ';':
// "80-real,90" -> sass {80, 90}, ptx {90}. InvalidArgument for anything
// else ("native", "all", "90a" are not accepted: name the architectures).
Result<CudaArchitectures> ParseCudaArchitectures(std::string_view list);

// Whether a kernel of this build runs on a device of compute capability
// major.minor.
bool KernelsRunOn(const CudaArchitectures& built, int major, int minor);

// "sm_80, sm_89, sm_90" (", PTX compute_90" for PTX).
std::string DescribeArchitectures(const CudaArchitectures& built);

}  // namespace tierkv::storage
