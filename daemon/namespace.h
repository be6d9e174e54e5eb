// Namespace: one model + KV format served by the daemon (DESIGN.md §3): its
// token, its host tier (an arena of its own, so tenants never share or evict
// each other's memory), its registered layout and its metrics.
//
// Thread safety: `host` is thread-safe; the layout is guarded by layout_mu.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "daemon/metrics.h"
#include "storage/host_tier.h"
#include "tierkv/types.h"

namespace tierkv::daemon {

struct Namespace {
  std::string name;
  std::string token;
  std::unique_ptr<storage::HostTier> host;
  NamespaceMetrics* metrics = nullptr;  // owned by DaemonMetrics

  std::optional<LayoutSpec> layout() const {
    std::lock_guard lock(layout_mu);
    return layout_;
  }
  // Registers `spec` the first time; later calls must pass the same layout.
  Status RegisterLayout(const LayoutSpec& spec) {
    TIERKV_RETURN_IF_ERROR(spec.Validate());
    std::lock_guard lock(layout_mu);
    if (!layout_) {
      layout_ = spec;
      return Status::OK();
    }
    if (*layout_ == spec) return Status::OK();
    return Status::InvalidArgument("namespace '" + name +
                                   "' already has a different layout");
  }

 private:
  mutable std::mutex layout_mu;
  std::optional<LayoutSpec> layout_;
};

}  // namespace tierkv::daemon
