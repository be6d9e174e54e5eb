// DaemonMetrics: the Prometheus registry, its families and the /metrics
// listener (see metrics.h).
#include "daemon/metrics.h"

#include <CivetServer.h>
#include <netdb.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <thread>

#include "common/latency_histogram.h"
#include "daemon/cluster_metrics.h"
#include "daemon/metric_families.h"
#include "daemon/nvme_metrics.h"
#include "daemon/status_page.h"
#include "daemon/tier_metrics.h"
#include "daemon/transfer_metrics.h"
#include "daemon/weights_metrics.h"
#include "transport/protocol.h"

namespace tierkv::daemon {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

namespace {

// The `op` label of a request (snake_case of its opcode), or nullptr.
const char* OpName(uint16_t opcode) {
  using transport::Opcode;
  switch (static_cast<Opcode>(opcode)) {
    case Opcode::kPing:
      return "ping";
    case Opcode::kOpenNamespace:
      return "open_namespace";
    case Opcode::kRegisterLayout:
      return "register_layout";
    case Opcode::kMatch:
      return "match";
    case Opcode::kPutReserve:
      return "put_reserve";
    case Opcode::kPutCommit:
      return "put_commit";
    case Opcode::kGet:
      return "get";
    case Opcode::kRelease:
      return "release";
    case Opcode::kPin:
      return "pin";
    case Opcode::kStats:
      return "stats";
    case Opcode::kList:
      return "list";
    case Opcode::kReleaseOneWay:
      return "release_one_way";
    case Opcode::kFlush:
      return "flush";
    case Opcode::kRegisterPool:
      return "register_pool";
    case Opcode::kRegisterTickets:
      return "register_tickets";
    case Opcode::kLoad:
      return "load";
    case Opcode::kStore:
      return "store";
    case Opcode::kPrefetch:
      return "prefetch";
    case Opcode::kReportTopk:
      return "report_topk";
    case Opcode::kWeightsSeal:
      return "weights_seal";
    case Opcode::kWeightsManifest:
      return "weights_manifest";
    case Opcode::kWeightsList:
      return "weights_list";
    case Opcode::kWeightsDrop:
      return "weights_drop";
    case Opcode::kWeightsPrefetch:
      return "weights_prefetch";
    case Opcode::kWeightsHint:
      return "weights_hint";
    case Opcode::kWeightsPin:
      return "weights_pin";
    case Opcode::kWeightsLoad:
      return "weights_load";
    case Opcode::kWeightsStage:
      return "weights_stage";
  }
  return nullptr;
}

}  // namespace

RequestMetrics::RequestMetrics(prometheus::Registry& registry) {
  auto& seconds =
      BuildHistogram()
          .Name("tierkv_request_seconds")
          .Help(
              "Requests from arrival to reply, by operation (Load and "
              "Store reply once queued; their layers' time is "
              "tierkv_transfer_seconds)")
          .Register(registry);
  auto& errors =
      BuildCounter()
          .Name("tierkv_request_errors_total")
          .Help(
              "Requests answered with an error reply (malformed, not "
              "allowed, failed), by operation; refused "
              "OpenNamespace calls are "
              "tierkv_auth_failures_total")
          .Register(registry);
  const auto last = static_cast<uint16_t>(transport::Opcode::kLastOpcode);
  ops_.resize(last + 1u);
  for (uint16_t opcode = 1; opcode <= last; ++opcode) {
    const char* name = OpName(opcode);
    if (name == nullptr) continue;
    ops_[opcode].seconds =
        &seconds.Add({{"op", name}}, LatencyBucketBoundaries());
    ops_[opcode].errors = &errors.Add({{"op", name}});
  }
}

void RequestMetrics::OnReply(uint16_t opcode, bool is_error,
                             std::chrono::steady_clock::time_point received) {
  if (opcode >= ops_.size() || ops_[opcode].seconds == nullptr) return;
  ops_[opcode].seconds->Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - received)
          .count());
  if (is_error) ops_[opcode].errors->Increment();
}

DaemonMetrics::DaemonMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      requests_(std::make_unique<RequestMetrics>(*registry_)) {
  auth_failures_ = &BuildCounter()
                        .Name("tierkv_auth_failures_total")
                        .Help("OpenNamespace calls with a wrong name or token")
                        .Register(*registry_)
                        .Add({});
  protocol_errors_ = &BuildCounter()
                          .Name("tierkv_protocol_errors_total")
                          .Help("Requests rejected as malformed")
                          .Register(*registry_)
                          .Add({});
  active_leases_ = &BuildGauge()
                        .Name("tierkv_active_leases")
                        .Help("Read, pin and write leases held by clients")
                        .Register(*registry_)
                        .Add({});
  connections_ = &BuildGauge()
                      .Name("tierkv_connections")
                      .Help("Connected clients")
                      .Register(*registry_)
                      .Add({});
}

DaemonMetrics::~DaemonMetrics() = default;

Status DaemonMetrics::Serve(const std::string& listen) {
  listen_ = listen;
  try {
    // The status page (status_page.h) answers "/" and "/status" before
    // civetweb routes the request; everything else is prometheus-cpp's.
    CivetCallbacks callbacks;
    callbacks.begin_request = &ServeStatusPage;
    exposer_ = std::make_unique<prometheus::Exposer>(listen, 1, &callbacks);
  } catch (const std::exception& e) {
    return Status::IOError("metrics listener " + listen + ": " + e.what());
  }
  exposer_->RegisterCollectable(registry_);
  if (tiers_) exposer_->RegisterCollectable(tiers_);
  if (nvme_) exposer_->RegisterCollectable(nvme_);
  if (engine_) exposer_->RegisterCollectable(engine_);
  if (cluster_) exposer_->RegisterCollectable(cluster_);
  if (weights_) exposer_->RegisterCollectable(weights_);
  return Status::OK();
}

void DaemonMetrics::AddWeights(
    std::vector<std::pair<std::string, const storage::WeightsCatalog*>>
        catalogs) {
  weights_ = std::make_shared<WeightsMetrics>(std::move(catalogs));
  if (exposer_) exposer_->RegisterCollectable(weights_);
}

void DaemonMetrics::AddEngine(const storage::CacheEngine* engine) {
  engine_ = std::make_shared<TransferMetrics>(engine);
  if (exposer_) exposer_->RegisterCollectable(engine_);
}

void DaemonMetrics::AddTiers(const storage::CacheEngine* engine) {
  tiers_ = std::make_shared<TierMetrics>(engine);
  if (exposer_) exposer_->RegisterCollectable(tiers_);
}

void DaemonMetrics::AddNvmeTier(const storage::NvmeStore* store,
                                const storage::TierMover* mover) {
  nvme_ = std::make_shared<NvmeMetrics>(store, mover);
  if (exposer_) exposer_->RegisterCollectable(nvme_);
}

void DaemonMetrics::AddCluster(const transport::Directory* directory,
                               const transport::peer::PeerTransport* peers) {
  cluster_ = std::make_shared<ClusterMetrics>(directory, peers);
  if (exposer_) exposer_->RegisterCollectable(cluster_);
}

namespace {

// Opens and closes one TCP connection to `host`:`port` (a wildcard host
// means this machine).
void Knock(std::string host, int port) {
  if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
  if (host == "[::]" || host == "::") host = "::1";
  if (host.size() > 2 && host.front() == '[')
    host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints,
                    &found) != 0) {
    return;
  }
  const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    (void)::connect(fd, found->ai_addr, found->ai_addrlen);
    ::close(fd);
  }
  ::freeaddrinfo(found);
}

}  // namespace

void DaemonMetrics::StopServing() {
  if (!exposer_) return;
  // civetweb's listener thread notices a stop only when its poll returns,
  // every 2 s (SOCKET_TIMEOUT_QUANTUM) without traffic: every tierkvd stop
  // took ~2 s. Connections to the port, until the exposer is gone, wake it.
  const int port = this->port();
  const std::string host = listen_.substr(0, listen_.rfind(':'));
  std::atomic<bool> stopped{false};
  std::thread knocker([&] {
    while (!stopped.load(std::memory_order_acquire)) {
      Knock(host, port);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  exposer_.reset();
  stopped.store(true, std::memory_order_release);
  knocker.join();
}

int DaemonMetrics::port() const {
  if (!exposer_) return 0;
  auto ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

NamespaceMetrics* DaemonMetrics::AddNamespace(const std::string& ns) {
  auto m = std::make_unique<NamespaceMetrics>();
  auto& lookups = BuildCounter()
                      .Name("tierkv_lookups_total")
                      .Help("Match requests")
                      .Register(*registry_);
  auto& tokens =
      BuildCounter()
          .Name("tierkv_lookup_tokens_total")
          .Help(
              "Tokens of looked-up pages, by the tier that held them "
              "(miss: none)")
          .Register(*registry_);
  auto& gets = BuildCounter()
                   .Name("tierkv_get_segments_total")
                   .Help("Segments requested by Get, by result")
                   .Register(*registry_);
  auto& puts = BuildCounter()
                   .Name("tierkv_put_segments_total")
                   .Help("Segments offered by Put, by result")
                   .Register(*registry_);
  auto& layer_wait =
      BuildHistogram()
          .Name("tierkv_layer_wait_seconds")
          .Help(
              "Time engines spent blocked in WaitLayer/Wait (0 when the "
              "layer was there), reported by clients with their next "
              "transfer request")
          .Register(*registry_);
  m->layer_wait =
      &layer_wait.Add({{"namespace", ns}}, LatencyBucketBoundaries());
  m->lookups = &lookups.Add({{"namespace", ns}});
  m->lookup_tokens_host = &tokens.Add({{"namespace", ns}, {"tier", "host"}});
  m->lookup_tokens_nvme = &tokens.Add({{"namespace", ns}, {"tier", "nvme"}});
  m->lookup_tokens_hbm = &tokens.Add({{"namespace", ns}, {"tier", "hbm"}});
  m->lookup_tokens_peer = &tokens.Add({{"namespace", ns}, {"tier", "peer"}});
  m->lookup_tokens_miss = &tokens.Add({{"namespace", ns}, {"tier", "miss"}});
  m->get_hits = &gets.Add({{"namespace", ns}, {"result", "hit"}});
  m->get_hits_nvme = &gets.Add({{"namespace", ns}, {"result", "hit_nvme"}});
  m->get_misses = &gets.Add({{"namespace", ns}, {"result", "miss"}});
  m->put_stored = &puts.Add({{"namespace", ns}, {"result", "stored"}});
  m->put_dedup = &puts.Add({{"namespace", ns}, {"result", "dedup"}});
  m->put_failed = &puts.Add({{"namespace", ns}, {"result", "failed"}});
  namespaces_.push_back(std::move(m));
  return namespaces_.back().get();
}

}  // namespace tierkv::daemon

namespace tierkv::daemon {

void DaemonMetrics::RecordLayerWaits(NamespaceMetrics& m,
                                     std::span<const uint64_t> counts,
                                     uint64_t total_nanos) {
  if (counts.size() != LatencyHistogram::kBuckets) return;
  // One increment per bucket: LatencyBucketBoundaries() has the finite
  // bounds, so the last count lands in +Inf.
  std::vector<double> increments(counts.begin(), counts.end());
  m.layer_wait->ObserveMultiple(increments,
                                static_cast<double>(total_nanos) * 1e-9);
}

}  // namespace tierkv::daemon
