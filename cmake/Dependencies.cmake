# Third-party packages, as found on Debian 12 (DESIGN.md §12).
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
# What the client library and its C API need (TIERKV_CLIENT_ONLY stops here).
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
find_package(Boost 1.74 REQUIRED)  # header-only Asio; no COMPONENTS (see §12)
find_package(fmt CONFIG REQUIRED)
find_package(nlohmann_json 3 CONFIG REQUIRED)
if(TIERKV_CLIENT_ONLY)
  return()
endif()
pkg_check_modules(URING REQUIRED IMPORTED_TARGET liburing)
find_package(RocksDB CONFIG REQUIRED)
find_package(prometheus-cpp CONFIG REQUIRED)
# civetweb: prometheus-cpp's HTTP server (its config finds the package);
# tierkvd hooks its status page into the same listener (daemon/status_page.h).
find_package(civetweb CONFIG REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)
find_package(tomlplusplus CONFIG REQUIRED)
if(TIERKV_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
endif()
