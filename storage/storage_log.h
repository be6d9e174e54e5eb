// StorageLog: the logger used by storage/ (device fallbacks, recovery
// reports, checksum failures).
//
// Returns the spdlog logger registered as "tierkv.storage" when the daemon
// registered one; otherwise a logger writing to stderr — never stdout, which
// tools and tests parse. The fallback starts at the default logger's level.
// Thread-safe.
#pragma once

#include <spdlog/logger.h>

#include <memory>

namespace tierkv::storage {

spdlog::logger& StorageLog();

}  // namespace tierkv::storage
