// Namespace: one model + KV format served by the daemon (DESIGN.md §3): its
// token, its host tier (an arena of its own, so tenants never share or evict
// each other's memory), its write policy toward the shared NVMe tier, its
// registered layout and its metrics.
//
// Thread safety: `host` is thread-safe; the layout is guarded by layout_mu_
// and its fingerprint is published atomically for the data path.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "daemon/config.h"
#include "daemon/metrics.h"
#include "storage/host_tier.h"
#include "storage/tier_mover.h"
#include "tierkv/types.h"

namespace tierkv::daemon {

struct Namespace {
  std::string name;
  std::string token;
  WritePolicy write_policy = WritePolicy::kNone;
  std::unique_ptr<storage::HostTier> host;
  storage::NvmeStore* nvme = nullptr;   // shared; null without an NVMe tier
  NamespaceMetrics* metrics = nullptr;  // owned by DaemonMetrics

  storage::TierPair tiers() const { return {name, host.get(), nvme}; }

  std::optional<LayoutSpec> layout() const {
    std::lock_guard lock(layout_mu_);
    return layout_;
  }
  // The registered layout's fingerprint (stored with NVMe data), 0 before.
  uint64_t fingerprint() const {
    return fingerprint_.load(std::memory_order_acquire);
  }
  // Registers `spec` the first time; later calls must pass the same layout.
  Status RegisterLayout(const LayoutSpec& spec) {
    TIERKV_RETURN_IF_ERROR(spec.Validate());
    std::lock_guard lock(layout_mu_);
    if (!layout_) {
      layout_ = spec;
      fingerprint_.store(spec.Fingerprint(), std::memory_order_release);
      return Status::OK();
    }
    if (*layout_ == spec) return Status::OK();
    return Status::InvalidArgument("namespace '" + name +
                                   "' already has a different layout");
  }

 private:
  mutable std::mutex layout_mu_;
  std::optional<LayoutSpec> layout_;  // guarded by layout_mu_
  std::atomic<uint64_t> fingerprint_{0};
};

}  // namespace tierkv::daemon
