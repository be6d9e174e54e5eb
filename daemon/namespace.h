// Namespace: what the daemon adds to an engine namespace (DESIGN.md §3, §8):
// the secret token that opens it and its Prometheus metrics. Tiers, layout
// and policy live in the storage engine.
#pragma once

#include <string>

#include "daemon/metrics.h"
#include "storage/engine/cache_engine.h"
#include "storage/weights/weights_catalog.h"

namespace tierkv::daemon {

struct Namespace {
  std::string token;
  // Connections that may have it open at once; more are refused
  // (ResourceExhausted) so one tenant cannot take every connection.
  uint32_t max_connections = 1024;
  storage::EngineNamespace* engine = nullptr;  // owned by the CacheEngine
  NamespaceMetrics* metrics = nullptr;         // owned by DaemonMetrics
  // Its sealed weights shards: set iff it is a weights namespace (owned by
  // the Daemon).
  storage::WeightsCatalog* weights = nullptr;

  const std::string& name() const { return engine->name(); }
};

}  // namespace tierkv::daemon
