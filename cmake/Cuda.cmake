# The CUDA device backend (storage/device/cuda/): compiled when nvcc is found.
#   -DTIERKV_CUDA=AUTO (default): when nvcc is on PATH, in $CUDACXX or at
#     /usr/local/cuda/bin/nvcc; ON: required (configure fails without it);
#     OFF: never.
# Sanitizer builds leave it out (nvcc takes no -fsanitize, and the CUDA
# runtime and ASan's shadow memory do not mix); the client-only build has
# no storage at all. tierkvd without a device or driver falls back to the
# emulated backend at run time either way (storage/device/device_backend.h).
#
# CMake 3.25 does not know CUDA C++20 (CMAKE_CUDA_STANDARD 20 silently
# compiles C++17, and a CUDA source in a cxx_std_20 target is an error):
# below it is told the flag by hand. CMAKE_CUDA_ARCHITECTURES defaults to
# sm_80, sm_89 and sm_90 ("native" fails on a machine without a GPU).
set(TIERKV_CUDA AUTO CACHE STRING "CUDA backend: AUTO, ON or OFF")
set_property(CACHE TIERKV_CUDA PROPERTY STRINGS AUTO ON OFF)
set(TIERKV_WITH_CUDA OFF)
if(NOT TIERKV_CUDA STREQUAL "OFF" AND NOT TIERKV_CLIENT_ONLY AND NOT TIERKV_SANITIZE)
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX}
     AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Machine code for A100/A10 (8.0, runs on 8.6), L4/L40 (8.9) and
      # H100/H200 (9.0); no PTX, so any other GPU is refused at start with
      # the architecture to build for (storage/device/cuda/cuda_arch.h) instead of
      # failing at its first kernel launch.
      set(CMAKE_CUDA_ARCHITECTURES 80-real 89-real 90-real)
    endif()
    foreach(arch IN LISTS CMAKE_CUDA_ARCHITECTURES)
      if(NOT arch MATCHES "^[0-9][0-9]+(-real|-virtual)?$")
        message(FATAL_ERROR "CMAKE_CUDA_ARCHITECTURES: name architectures "
                            "like 90, 90-real or 90-virtual, not '${arch}'")
      endif()
    endforeach()
    if(CCACHE_PROGRAM)
      set(CMAKE_CUDA_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
    endif()
    enable_language(CUDA)
    # CMake 3.25 knows nvcc only up to C++17; tell it C++20's flag, so the
    # CUDA sources build as C++20 like the rest (CMAKE_CXX_STANDARD).
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    find_package(CUDAToolkit REQUIRED)
    set(TIERKV_WITH_CUDA ON)
  endif()
endif()
if(TIERKV_CUDA STREQUAL "ON" AND NOT TIERKV_WITH_CUDA)
  message(FATAL_ERROR "TIERKV_CUDA=ON but no usable nvcc was found "
                      "(set CUDACXX or -DCMAKE_CUDA_COMPILER)")
endif()
message(STATUS "tierkv: CUDA backend: ${TIERKV_WITH_CUDA} "
               "(TIERKV_CUDA=${TIERKV_CUDA}, architectures ${CMAKE_CUDA_ARCHITECTURES})")
