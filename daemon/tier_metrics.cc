// TierMetrics: the tier-labelled families (see tier_metrics.h).
#include "daemon/tier_metrics.h"

#include <prometheus/metric_family.h>

#include "daemon/metric_families.h"

namespace tierkv::daemon {

using prometheus::MetricFamily;
using prometheus::MetricType;

std::vector<MetricFamily> TierMetrics::Collect() const {
  auto d = [](uint64_t v) { return static_cast<double>(v); };
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
  auto dedup = Family("tierkv_dedup_hits_total",
                      "Puts of segments already stored (nothing copied)",
                      MetricType::Counter);

  // Host DRAM: one arena per namespace.
  storage::HostTierStats total;
  const auto& namespaces = engine_->namespaces();
  for (size_t i = 0; i < namespaces.size(); ++i) {
    const std::string& name = namespaces[i]->name();
    const storage::HostTierStats h = namespaces[i]->host().Stats();
    total.used_bytes += h.used_bytes;
    total.reserved_bytes += h.reserved_bytes;
    total.capacity_bytes += h.capacity_bytes;
    total.dirty_bytes += h.dirty_bytes;
    total.segments += h.segments;
    const std::string policy =
        i < host_policies_.size() ? host_policies_[i] : "";
    for (auto [state, v] : {std::pair{"used", h.used_bytes},
                            std::pair{"reserved", h.reserved_bytes},
                            std::pair{"capacity", h.capacity_bytes}}) {
      AddValue(ns_bytes,
               {{"namespace", name}, {"tier", "host"}, {"state", state}}, d(v));
    }
    AddValue(ns_segments, {{"namespace", name}, {"tier", "host"}},
             d(h.segments));
    AddValue(evictions,
             {{"namespace", name}, {"tier", "host"}, {"policy", policy}},
             d(h.evictions));
    AddValue(evicted_bytes, {{"namespace", name}, {"tier", "host"}},
             d(h.evicted_bytes));
    AddValue(dedup, {{"namespace", name}}, d(h.dedup_hits));
  }
  AddValue(bytes, {{"tier", "host"}, {"state", "used"}}, d(total.used_bytes));
  AddValue(bytes, {{"tier", "host"}, {"state", "reserved"}},
           d(total.reserved_bytes));
  AddValue(bytes, {{"tier", "host"}, {"state", "dirty"}}, d(total.dirty_bytes));
  AddValue(bytes, {{"tier", "host"}, {"state", "capacity"}},
           d(total.capacity_bytes));
  AddValue(segments, {{"tier", "host"}}, d(total.segments));

  // HBM: one device pool for every namespace, a copy cache (LRU).
  const storage::EngineStats shared = engine_->SharedStats();
  if (shared.has_hbm) {
    const storage::HbmTierStats& h = shared.hbm;
    AddValue(bytes, {{"tier", "hbm"}, {"state", "used"}}, d(h.used_bytes));
    AddValue(bytes, {{"tier", "hbm"}, {"state", "capacity"}},
             d(h.capacity_bytes));
    AddValue(segments, {{"tier", "hbm"}}, d(h.segments));
    for (size_t i = 0; i < h.namespaces.size() && i < namespaces.size(); ++i) {
      const std::string& name = namespaces[i]->name();
      const auto& n = h.namespaces[i];
      AddValue(ns_bytes,
               {{"namespace", name}, {"tier", "hbm"}, {"state", "used"}},
               d(n.used_bytes));
      AddValue(ns_bytes,
               {{"namespace", name}, {"tier", "hbm"}, {"state", "quota"}},
               d(n.quota_bytes));
      AddValue(ns_segments, {{"namespace", name}, {"tier", "hbm"}},
               d(n.segments));
    }
    AddValue(evictions, {{"tier", "hbm"}, {"policy", "lru"}}, d(h.evictions));
    AddValue(evicted_bytes, {{"tier", "hbm"}}, d(h.evicted_bytes));
    AddValue(reads, {{"tier", "hbm"}, {"result", "hit"}}, d(h.hits));
    AddValue(reads, {{"tier", "hbm"}, {"result", "miss"}}, d(h.misses));
    AddValue(admissions, {{"tier", "hbm"}, {"result", "admitted"}},
             d(h.admissions));
    AddValue(admissions, {{"tier", "hbm"}, {"result", "no_room"}},
             d(h.admission_failures));
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
  if (shared.has_device) {
    AddValue(device_up, {}, shared.device_failed ? 0.0 : 1.0);
    AddValue(quarantined, {}, d(shared.device_quarantined));
    AddValue(quarantined_total, {}, d(shared.device_quarantined_total));
  }

  // NVMe: one file or device for every namespace (LRU within each share).
  if (shared.has_nvme && nvme_ != nullptr) {
    const storage::NvmeStoreStats& n = shared.nvme;  // read once above
    AddValue(bytes, {{"tier", "nvme"}, {"state", "used"}}, d(n.bytes_used));
    AddValue(bytes, {{"tier", "nvme"}, {"state", "allocated"}},
             d(n.bytes_allocated));
    AddValue(bytes, {{"tier", "nvme"}, {"state", "capacity"}},
             d(n.capacity_bytes));
    AddValue(segments, {{"tier", "nvme"}}, d(n.segments));
    for (const auto& [name, s] : nvme_->NamespaceStats()) {
      for (auto [state, v] : {std::pair{"used", s.bytes_used},
                              std::pair{"allocated", s.bytes_allocated},
                              std::pair{"quota", s.quota_bytes}}) {
        AddValue(ns_bytes,
                 {{"namespace", name}, {"tier", "nvme"}, {"state", state}},
                 d(v));
      }
      AddValue(ns_segments, {{"namespace", name}, {"tier", "nvme"}},
               d(s.segments));
      AddValue(evictions,
               {{"namespace", name}, {"tier", "nvme"}, {"policy", "lru"}},
               d(s.evictions));
    }
    AddValue(reads, {{"tier", "nvme"}, {"result", "hit"}}, d(n.read_hits));
    AddValue(reads, {{"tier", "nvme"}, {"result", "miss"}}, d(n.read_misses));
    AddValue(reads, {{"tier", "nvme"}, {"result", "error"}}, d(n.read_errors));
  }

  std::vector<MetricFamily> out;
  for (MetricFamily* f :
       {&bytes, &segments, &ns_bytes, &ns_segments, &evictions, &evicted_bytes,
        &reads, &admissions, &dedup, &device_up, &quarantined,
        &quarantined_total}) {
    if (!f->metric.empty()) out.push_back(std::move(*f));
  }
  return out;
}

}  // namespace tierkv::daemon
