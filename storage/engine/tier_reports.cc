// CacheEngine::TierReports: the walk over every tier of the daemon that
// stats, metrics and the status views read (see cache_engine.h and
// storage/tier/tier_counters.h).
#include <algorithm>

#include "storage/engine/cache_engine.h"

namespace tierkv::storage {

std::vector<TierReport> CacheEngine::TierReports(
    const EngineNamespace* ns) const {
  std::vector<const EngineNamespace*> spaces;
  if (ns != nullptr) {
    spaces.push_back(ns);
  } else {
    for (const auto& space : spaces_) spaces.push_back(space.get());
  }
  std::vector<TierReport> out;
  out.reserve(2 + chain_->size());

  if (hbm_) {
    TierReport& r = out.emplace_back();
    r.name = HbmTier::name();
    r.policy = hbm_->policy();
    r.kind = tierkv::Tier::kHbm;
    hbm_->VisitCounters(r.shared);
    for (const EngineNamespace* space : spaces) {
      TierNamespaceReport& n = r.namespaces.emplace_back();
      n.name = space->name();
      n.policy = r.policy;
      space->hbm_->VisitCounters(n.values);
    }
  }

  // Host DRAM: one HostTier per namespace, each with its own policy.
  TierReport& host = out.emplace_back();
  host.name = HostTier::kName;
  host.kind = tierkv::Tier::kHost;
  host.per_namespace = true;
  host.shared.Counter("backpressure_waits",
                      backpressure_waits_.load(std::memory_order_relaxed));
  host.shared.Counter("lower_tier_dedup_hits",
                      lower_tier_dedup_hits_.load(std::memory_order_relaxed));
  host.shared.Counter("backpressure_busy",
                      backpressure_busy_.load(std::memory_order_relaxed));
  for (const EngineNamespace* space : spaces) {
    TierNamespaceReport& n = host.namespaces.emplace_back();
    n.name = space->name();
    n.policy = space->host_->policy();
    space->host_->VisitCounters(n.values);
  }
  const bool one_policy = std::all_of(
      host.namespaces.begin(), host.namespaces.end(),
      [&](const auto& n) { return n.policy == host.namespaces[0].policy; });
  host.policy = host.namespaces.empty() ? ""
                : one_policy            ? host.namespaces[0].policy
                                        : "mixed";

  for (size_t i = 0; i < chain_->size(); ++i) {
    const Tier& tier = chain_->at(i);
    TierReport& r = out.emplace_back();
    r.name = tier.name();
    r.policy = tier.policy();
    r.kind = tier.kind();
    r.persistent = tier.persistent();
    tier.VisitCounters(r.shared);
    for (const EngineNamespace* space : spaces) {
      TierNamespaceReport n{.name = space->name(), .policy = r.policy};
      tier.VisitNamespaceCounters(space->tiers_.ns, n.values);
      if (!n.values.empty()) r.namespaces.push_back(std::move(n));
    }
  }
  return out;
}

}  // namespace tierkv::storage
