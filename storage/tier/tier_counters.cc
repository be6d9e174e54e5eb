// TierCounterSet and TierReport: lookups and sums over reported counters
// (see tier_counters.h).
#include "storage/tier/tier_counters.h"

#include <algorithm>

namespace tierkv::storage {
namespace {

template <typename T>
auto Find(const std::vector<std::pair<std::string, T>>& values,
          std::string_view name) {
  return std::find_if(values.begin(), values.end(),
                      [name](const auto& v) { return v.first == name; });
}

template <typename T, typename Merge>
void AddInto(std::vector<std::pair<std::string, T>>& into,
             const std::vector<std::pair<std::string, T>>& from, Merge merge) {
  for (const auto& value : from) {
    auto it = std::find_if(into.begin(), into.end(), [&](const auto& v) {
      return v.first == value.first;
    });
    if (it == into.end()) {
      into.push_back(value);
    } else {
      it->second = merge(it->second, value.second);
    }
  }
}

}  // namespace

std::optional<uint64_t> TierCounterSet::FindCounter(
    std::string_view name) const {
  auto it = Find(counters_, name);
  if (it == counters_.end()) return std::nullopt;
  return it->second;
}

std::optional<double> TierCounterSet::FindGauge(std::string_view name) const {
  auto it = Find(gauges_, name);
  if (it == gauges_.end()) return std::nullopt;
  return it->second;
}

void TierCounterSet::Add(const TierCounterSet& other) {
  AddInto(counters_, other.counters_,
          [](uint64_t a, uint64_t b) { return a + b; });
  AddInto(gauges_, other.gauges_, [](double a, double b) { return a + b; });
  AddInto(flags_, other.flags_, [](bool a, bool b) { return a || b; });
}

TierCounterSet TierReport::Totals() const {
  TierCounterSet totals = shared;
  if (per_namespace) {
    for (const TierNamespaceReport& ns : namespaces) totals.Add(ns.values);
  }
  return totals;
}

}  // namespace tierkv::storage
