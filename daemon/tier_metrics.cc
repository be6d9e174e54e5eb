// TierMetrics: the tier-labelled families from the tier walk (see
// tier_metrics.h).
#include "daemon/tier_metrics.h"

#include <prometheus/metric_family.h>

#include <map>
#include <string>
#include <string_view>
#include <utility>

#include "daemon/metric_families.h"

namespace tierkv::daemon {
namespace {

using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<prometheus::ClientMetric::Label>;

// `<state>_bytes` gauges that are bytes by state (not every *_bytes gauge
// is: largest_free_bytes is not a share of the tier).
const char* ByteState(std::string_view gauge) {
  static constexpr std::pair<std::string_view, const char*> kStates[] = {
      {"used_bytes", "used"},           {"capacity_bytes", "capacity"},
      {"reserved_bytes", "reserved"},   {"dirty_bytes", "dirty"},
      {"allocated_bytes", "allocated"}, {"quota_bytes", "quota"}};
  for (const auto& [name, state] : kStates) {
    if (name == gauge) return state;
  }
  return nullptr;
}

// Reads by result: the counter names tiers use for them.
const char* ReadResult(std::string_view counter) {
  if (counter == "hits" || counter == "read_hits") return "hit";
  if (counter == "misses" || counter == "read_misses") return "miss";
  if (counter == "read_errors") return "error";
  return nullptr;
}

const char* AdmissionResult(std::string_view counter) {
  if (counter == "admissions") return "admitted";
  if (counter == "admission_failures") return "no_room";
  return nullptr;
}

Labels With(Labels labels, std::string key, std::string value) {
  labels.push_back({std::move(key), std::move(value)});
  return labels;
}

}  // namespace

std::vector<MetricFamily> TierMetrics::Collect() const {
  auto info =
      Family("tierkv_tier_info",
             "Every tier with its eviction policy and kind; the value is its "
             "place in cost order (0: the cheapest)",
             MetricType::Gauge);
  auto bytes = Family("tierkv_tier_bytes", "Bytes per tier and state",
                      MetricType::Gauge);
  auto segments = Family("tierkv_tier_segments", "Committed segments per tier",
                         MetricType::Gauge);
  auto ns_bytes =
      Family("tierkv_namespace_bytes",
             "Bytes of one namespace per tier and state (quota 0: it shares "
             "the tier's unreserved rest)",
             MetricType::Gauge);
  auto ns_segments =
      Family("tierkv_namespace_segments",
             "Committed segments of one namespace per tier", MetricType::Gauge);
  auto evictions = Family("tierkv_evictions_total",
                          "Segments evicted for space, per tier and policy",
                          MetricType::Counter);
  auto evicted_bytes = Family("tierkv_evicted_bytes_total",
                              "Bytes evicted for space", MetricType::Counter);
  auto reads =
      Family("tierkv_tier_reads_total",
             "Segment reads a tier served, by result", MetricType::Counter);
  auto admissions = Family("tierkv_tier_admissions_total",
                           "Copies offered to a copy tier (hbm), by result",
                           MetricType::Counter);
  auto corruptions =
      Family("tierkv_corruptions_total",
             "Segments that failed their checksum (served as misses)",
             MetricType::Counter);
  auto dedup = Family("tierkv_dedup_hits_total",
                      "Puts of segments already stored (nothing copied)",
                      MetricType::Counter);
  auto any_counter =
      Family("tierkv_tier_counter_total",
             "Every counter a tier reports, by name (per namespace where "
             "`namespace` is set)",
             MetricType::Counter);
  auto any_gauge = Family("tierkv_tier_gauge",
                          "Every gauge and flag (0/1) a tier reports, by name "
                          "(per namespace where `namespace` is set)",
                          MetricType::Gauge);

  std::map<std::string, double> dedup_by_namespace;
  const std::vector<storage::TierReport> reports = engine_->TierReports();
  for (size_t place = 0; place < reports.size(); ++place) {
    const storage::TierReport& r = reports[place];
    AddValue(info,
             {{"tier", r.name},
              {"policy", r.policy},
              {"kind", std::string(tierkv::TierName(r.kind))}},
             static_cast<double>(place));
    const Labels tier{{"tier", r.name}};
    const storage::TierCounterSet totals = r.Totals();
    for (const auto& [name, v] : totals.gauges()) {
      if (const char* state = ByteState(name)) {
        AddValue(bytes, With(tier, "state", state), v);
      } else if (name == "segments") {
        AddValue(segments, tier, v);
      }
    }
    for (const auto& [name, v] : totals.counters()) {
      const double value = static_cast<double>(v);
      if (const char* result = ReadResult(name)) {
        AddValue(reads, With(tier, "result", result), value);
      } else if (const char* admitted = AdmissionResult(name)) {
        AddValue(admissions, With(tier, "result", admitted), value);
      } else if (name == "checksum_failures") {
        AddValue(corruptions, tier, value);
      }
    }

    // Evictions per namespace where the tier counts them so, else per
    // tier (never both: a sum by tier counts each once).
    for (const char* counter : {"evictions", "evicted_bytes"}) {
      MetricFamily& family =
          std::string_view(counter) == "evictions" ? evictions : evicted_bytes;
      const bool policy_label = &family == &evictions;
      bool per_namespace = false;
      for (const storage::TierNamespaceReport& n : r.namespaces) {
        const auto v = n.values.FindCounter(counter);
        if (!v) continue;
        per_namespace = true;
        Labels labels{{"namespace", n.name}, {"tier", r.name}};
        if (policy_label) labels.push_back({"policy", n.policy});
        AddValue(family, labels, static_cast<double>(*v));
      }
      const auto v = r.shared.FindCounter(counter);
      if (!per_namespace && v) {
        AddValue(family, policy_label ? With(tier, "policy", r.policy) : tier,
                 static_cast<double>(*v));
      }
    }

    const Labels generic{{"tier", r.name}, {"policy", r.policy}};
    auto add_generic = [&](const Labels& labels,
                           const storage::TierCounterSet& values) {
      for (const auto& [name, v] : values.counters()) {
        AddValue(any_counter, With(labels, "name", name),
                 static_cast<double>(v));
      }
      for (const auto& [name, v] : values.gauges()) {
        AddValue(any_gauge, With(labels, "name", name), v);
      }
      for (const auto& [name, v] : values.flags()) {
        AddValue(any_gauge, With(labels, "name", name), v ? 1.0 : 0.0);
      }
    };
    add_generic(generic, r.shared);

    for (const storage::TierNamespaceReport& n : r.namespaces) {
      const Labels mine{{"namespace", n.name}, {"tier", r.name}};
      for (const auto& [name, v] : n.values.gauges()) {
        if (const char* state = ByteState(name)) {
          AddValue(ns_bytes, With(mine, "state", state), v);
        } else if (name == "segments") {
          AddValue(ns_segments, mine, v);
        }
      }
      if (const auto d = n.values.FindCounter("dedup_hits")) {
        dedup_by_namespace[n.name] += static_cast<double>(*d);
      }
      add_generic(
          {{"namespace", n.name}, {"tier", r.name}, {"policy", n.policy}},
          n.values);
    }
  }
  for (const auto& [name, v] : dedup_by_namespace) {
    AddValue(dedup, {{"namespace", name}}, v);
  }

  // The device backend under HBM and engines' device pools: a device fault
  // fails it for the rest of the process (device_backend.h, Errors).
  auto device_up = Family(
      "tierkv_device_up",
      "1 while the device backend works; 0 once a device fault failed it "
      "(HBM tier off, device-pool transfers fail) until tierkvd restarts",
      MetricType::Gauge);
  auto quarantined = Family(
      "tierkv_device_quarantined_units",
      "Transfer units whose memory waits for device copies that outlived "
      "their wait's timeout (not reused until the copies are over)",
      MetricType::Gauge);
  auto quarantined_total =
      Family("tierkv_device_quarantined_units_total",
             "Transfer units ever quarantined behind a timed-out device wait",
             MetricType::Counter);
  const storage::EngineStats shared = engine_->SharedStats();
  if (shared.has_device) {
    AddValue(device_up, {}, shared.device_failed ? 0.0 : 1.0);
    AddValue(quarantined, {}, static_cast<double>(shared.device_quarantined));
    AddValue(quarantined_total, {},
             static_cast<double>(shared.device_quarantined_total));
  }

  std::vector<MetricFamily> out;
  for (MetricFamily* f :
       {&info, &bytes, &segments, &ns_bytes, &ns_segments, &evictions,
        &evicted_bytes, &reads, &admissions, &corruptions, &dedup, &any_counter,
        &any_gauge, &device_up, &quarantined, &quarantined_total}) {
    if (!f->metric.empty()) out.push_back(std::move(*f));
  }
  return out;
}

}  // namespace tierkv::daemon
