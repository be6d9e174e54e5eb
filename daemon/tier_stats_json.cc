// TierStatsJson: the stats JSON's tiers from the tier walk (see
// tier_stats_json.h).
#include "daemon/tier_stats_json.h"

#include <cmath>
#include <string>

namespace tierkv::daemon {
namespace {

using nlohmann::json;

// An integral gauge as an integer (as the stats JSON always wrote bytes
// and segments), anything else as a double.
json GaugeJson(double v) {
  constexpr double kExact = 9007199254740992.0;  // 2^53
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < kExact) {
    if (v >= 0) return static_cast<uint64_t>(v);
    return static_cast<int64_t>(v);
  }
  return v;
}

void AddValues(json& entry, const storage::TierCounterSet& values) {
  json& counters = entry["counters"];
  json& gauges = entry["gauges"];
  json& flags = entry["flags"];
  for (const auto& [name, v] : values.counters()) counters[name] = v;
  for (const auto& [name, v] : values.gauges()) gauges[name] = GaugeJson(v);
  for (const auto& [name, v] : values.flags()) flags[name] = v;
}

json ValuesJson(const storage::TierCounterSet& values) {
  json entry = json::object();
  entry["counters"] = json::object();
  entry["gauges"] = json::object();
  entry["flags"] = json::object();
  AddValues(entry, values);
  return entry;
}

// counters, gauges and flags of an entry in one object.
json Flat(const json& entry) {
  json out = json::object();
  for (const char* kind : {"counters", "gauges", "flags"}) {
    if (!entry.contains(kind)) continue;
    for (const auto& [name, v] : entry[kind].items()) out[name] = v;
  }
  return out;
}

}  // namespace

json TiersJson(const std::vector<storage::TierReport>& reports) {
  json tiers = json::array();
  for (const storage::TierReport& r : reports) {
    json entry = ValuesJson(r.Totals());
    entry["name"] = r.name;
    entry["policy"] = r.policy;
    entry["kind"] = std::string(tierkv::TierName(r.kind));
    entry["persistent"] = r.persistent;
    if (!r.per_namespace && !r.namespaces.empty()) {
      const storage::TierNamespaceReport& mine = r.namespaces.front();
      entry["namespace"] = ValuesJson(mine.values);
      entry["namespace"]["policy"] = mine.policy;
    }
    tiers.push_back(std::move(entry));
  }
  return tiers;
}

void AddTierCounters(json& tiers, std::string_view tier,
                     const storage::TierCounterSet& values) {
  for (json& entry : tiers) {
    if (entry.value("name", std::string()) == tier) {
      AddValues(entry, values);
      return;
    }
  }
}

void AddFlatTierObjects(const json& tiers, json& j) {
  for (const json& entry : tiers) {
    const std::string name = entry.value("name", std::string());
    if (name.empty() || j.contains(name)) continue;
    json flat = Flat(entry);
    flat["eviction_policy"] = entry.value("policy", std::string());
    if (entry.contains("namespace")) {
      json mine = Flat(entry["namespace"]);
      if (mine.contains("quota_bytes") && !mine.contains("reserved_bytes")) {
        mine["reserved_bytes"] = mine["quota_bytes"];
      }
      flat["namespace"] = std::move(mine);
    }
    j[name] = std::move(flat);
  }
}

}  // namespace tierkv::daemon
