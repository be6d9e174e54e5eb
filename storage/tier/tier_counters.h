// TierReport: one tier's name, policy and counters as a tier walk
// (CacheEngine::TierReports) hands them to readers, so the stats JSON, the
// metrics, `tierkv stats --watch` and the status page show every tier,
// including one added later, without naming any.
//
// Scopes: `shared` holds what a tier counts over every namespace (the
// whole tier); `namespaces` each namespace's own share, for tiers that
// keep namespaces apart (Tier::VisitNamespaceCounters). A tier that is one
// instance per namespace (host DRAM: `per_namespace`) reports everything
// per namespace; its `shared` then holds only what the engine counts about
// the tier across them, and Totals() sums its namespaces.
//
// Vocabulary: counter names are free (snake_case, no tier name), but
// readers map these onto their own families, so a tier using them shows up
// in the existing dashboards:
//   gauges    capacity_bytes, used_bytes, reserved_bytes, dirty_bytes,
//             allocated_bytes, quota_bytes (bytes by state); segments
//   counters  evictions, evicted_bytes (for space); hits / read_hits,
//             misses / read_misses, read_errors (reads by result);
//             admissions, admission_failures (copies offered to a copy
//             tier); dedup_hits (writes of segments already stored);
//             checksum_failures (corruptions served as misses)
//
// Thread safety: plain values (a snapshot); TierCounterSet is not
// thread-safe while it is being filled.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "storage/tier/tier.h"
#include "tierkv/types.h"

namespace tierkv::storage {

// The values one TierCounterVisitor pass reported, in the order reported.
class TierCounterSet final : public TierCounterVisitor {
 public:
  void Counter(std::string_view name, uint64_t value) override {
    counters_.emplace_back(name, value);
  }
  void Gauge(std::string_view name, double value) override {
    gauges_.emplace_back(name, value);
  }
  void Flag(std::string_view name, bool value) override {
    flags_.emplace_back(name, value);
  }

  const std::vector<std::pair<std::string, uint64_t>>& counters() const {
    return counters_;
  }
  const std::vector<std::pair<std::string, double>>& gauges() const {
    return gauges_;
  }
  const std::vector<std::pair<std::string, bool>>& flags() const {
    return flags_;
  }
  bool empty() const {
    return counters_.empty() && gauges_.empty() && flags_.empty();
  }
  // The value reported under `name`, or nullopt (the first when reported
  // twice).
  std::optional<uint64_t> FindCounter(std::string_view name) const;
  std::optional<double> FindGauge(std::string_view name) const;
  // Adds `other` in: counters and gauges of the same name are summed,
  // flags or-ed, new names appended.
  void Add(const TierCounterSet& other);

 private:
  std::vector<std::pair<std::string, uint64_t>> counters_;
  std::vector<std::pair<std::string, double>> gauges_;
  std::vector<std::pair<std::string, bool>> flags_;
};

// One namespace's share of a tier.
struct TierNamespaceReport {
  std::string name;    // the namespace's
  std::string policy;  // the eviction policy ordering this share
  TierCounterSet values;
};

struct TierReport {
  std::string name;    // Tier::name(): "hbm", "host", "nvme", ...
  std::string policy;  // the tier's eviction policy (the `policy` label)
  tierkv::Tier kind = tierkv::Tier::kMiss;  // how Match reports its pages
  bool persistent = false;
  // One instance per namespace (see the top): everything is in
  // `namespaces`.
  bool per_namespace = false;
  TierCounterSet shared;
  std::vector<TierNamespaceReport> namespaces;  // in engine order

  // The tier as a whole: `shared`, plus for a per_namespace tier the sum
  // of its namespaces' values.
  TierCounterSet Totals() const;
};

}  // namespace tierkv::storage
