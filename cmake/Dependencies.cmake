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
# The cluster (transport/peer, transport/directory): UCX between daemons,
# hiredis for the directory on Redis (shared/reference/scaleout.md).
pkg_check_modules(UCX REQUIRED IMPORTED_TARGET ucx)
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)
# HMAC-SHA256 for the peers' mutual challenge-response (OpenSSL's libcrypto).
pkg_check_modules(LIBCRYPTO REQUIRED IMPORTED_TARGET libcrypto)
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
