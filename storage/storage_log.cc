// StorageLog: the storage layer's named logger (see storage_log.h).
#include "storage/storage_log.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace tierkv::storage {

spdlog::logger& StorageLog() {
  if (auto registered = spdlog::get("tierkv.storage")) return *registered;
  static const std::shared_ptr<spdlog::logger> fallback = [] {
    auto logger = std::make_shared<spdlog::logger>(
        "tierkv.storage", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    logger->set_level(spdlog::default_logger()->level());
    return logger;
  }();
  return *fallback;
}

}  // namespace tierkv::storage
