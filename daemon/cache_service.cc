// CacheService: decode -> storage engine -> encode (see cache_service.h).
#include "daemon/cache_service.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "daemon/tier_stats_json.h"

namespace tierkv::daemon {

using namespace transport;  // NOLINT: protocol message types

namespace {

// Compares secrets in time independent of where they differ.
bool TokensEqual(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

template <typename Message>
HandlerReply Ok(const Message& m) {
  return HandlerReply{Encode(m), -1, false};
}

}  // namespace

CacheService::CacheService(
    const CacheServiceOptions& options, storage::CacheEngine* engine,
    const std::vector<std::unique_ptr<Namespace>>* namespaces,
    DaemonMetrics* metrics)
    : options_(options),
      engine_(engine),
      namespaces_(namespaces),
      metrics_(metrics),
      started_(std::chrono::steady_clock::now()),
      throttle_(options.auth_failure_delay),
      lease_throttle_(options.lease_refusal_delay) {}

void CacheService::OnConnect(uint64_t connection_id) {
  metrics_->connections().Increment();
  spdlog::debug("connection {} opened", connection_id);
}

void CacheService::OnDisconnect(uint64_t connection_id) {
  const size_t released = engine_->ReleaseOwner(connection_id);
  {
    MutexLock lock(&mu_);
    if (auto it = opened_.find(connection_id); it != opened_.end()) {
      --open_connections_[it->second];
      opened_.erase(it);
    }
  }
  metrics_->connections().Decrement();
  UpdateLeaseGauge();
  spdlog::debug("connection {} closed; released {} leases", connection_id,
                released);
}

void CacheService::UpdateLeaseGauge() {
  metrics_->active_leases().Set(static_cast<double>(engine_->active_leases()));
}

Namespace* CacheService::OpenedNamespace(uint64_t connection_id) {
  MutexLock lock(&mu_);
  auto it = opened_.find(connection_id);
  return it == opened_.end() ? nullptr : it->second;
}

HandlerReply CacheService::Error(const Status& s) {
  if (s.code() == StatusCode::kProtocolError) {
    metrics_->protocol_errors().Increment();
  }
  return HandlerReply{EncodeError(s), -1, /*is_error=*/true};
}

void CacheService::OnFrame(uint64_t conn, uint16_t opcode, In in, int fd,
                           Responder responder) {
  responder.Observe(metrics_->requests(), std::chrono::steady_clock::now());
  const auto op = static_cast<Opcode>(opcode);
  if (op == Opcode::kPing) return responder.Send(Ping());
  if (op == Opcode::kOpenNamespace) {
    return OpenNamespace(conn, in, std::move(responder));
  }
  if (opcode == 0 || opcode > static_cast<uint16_t>(Opcode::kLastOpcode)) {
    return responder.Send(Error(
        Status::ProtocolError("unknown opcode " + std::to_string(opcode))));
  }
  Namespace* ns = OpenedNamespace(conn);
  if (!ns) {
    return responder.Send(
        Error(Status::PermissionDenied("open a namespace first")));
  }
  switch (op) {
    case Opcode::kGet:
      return Get(conn, *ns, in, std::move(responder));
    case Opcode::kFlush:
      return Flush(*ns, in, std::move(responder));
    case Opcode::kRegisterLayout:
      return responder.Send(RegisterLayout(*ns, in));
    case Opcode::kMatch:
      return responder.Send(Match(conn, *ns, in));
    case Opcode::kPutReserve:
      return PutReserve(conn, *ns, in, std::move(responder));
    case Opcode::kPutCommit:
      return PutCommit(conn, *ns, in, std::move(responder));
    case Opcode::kRelease:
      return responder.Send(Release(conn, in));
    case Opcode::kReleaseOneWay: {
      HandlerReply reply = Release(conn, in);
      reply.no_reply = true;
      return responder.Send(std::move(reply));
    }
    case Opcode::kPin:
      return responder.Send(Pin(conn, *ns, in));
    case Opcode::kStats:
      return responder.Send(Stats(*ns));
    case Opcode::kList:
      return responder.Send(List(*ns, in));
    case Opcode::kRegisterPool:
      return responder.Send(RegisterPool(conn, *ns, in, fd));
    case Opcode::kRegisterTickets:
      return responder.Send(RegisterTickets(conn, in, fd));
    case Opcode::kLoad:
    case Opcode::kStore:
      return responder.Send(Transfer(conn, *ns, op, in));
    case Opcode::kPrefetch:
      return responder.Send(Prefetch(*ns, in));
    case Opcode::kReportTopk:
      return responder.Send(ReportTopk(*ns, in));
    case Opcode::kWeightsSeal:
      return WeightsSeal(*ns, in, std::move(responder));
    case Opcode::kWeightsManifest:
      return responder.Send(WeightsManifest(*ns, in));
    case Opcode::kWeightsList:
      return responder.Send(WeightsList(*ns, in));
    case Opcode::kWeightsDrop:
      return responder.Send(WeightsDrop(*ns, in));
    case Opcode::kWeightsPrefetch:
      return responder.Send(WeightsPrefetch(*ns, in));
    case Opcode::kWeightsHint:
      return responder.Send(WeightsHint(*ns, in));
    case Opcode::kWeightsPin:
      return responder.Send(WeightsPin(*ns, in));
    case Opcode::kWeightsLoad:
      return responder.Send(WeightsLoadToPool(conn, *ns, in));
    case Opcode::kWeightsStage:
      return WeightsStage(conn, *ns, in, std::move(responder));
    default:
      break;
  }
  responder.Send(
      Error(Status::ProtocolError("unknown opcode " + std::to_string(opcode))));
}

HandlerReply CacheService::Ping() {
  nlohmann::json info;
  info["version"] = options_.version_info;
  info["pid"] = ::getpid();
  info["uptime_s"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_)
          .count();
  info["namespaces"] = nlohmann::json::array();
  for (const auto& ns : *namespaces_) info["namespaces"].push_back(ns->name());
  return Ok(JsonResponse{Status::OK(), info.dump()});
}

void CacheService::OpenNamespace(uint64_t conn, In in, Responder responder) {
  OpenNamespaceRequest req;
  if (Status s = Decode(in, req); !s.ok()) return responder.Send(Error(s));
  Namespace* found = nullptr;
  for (const auto& ns : *namespaces_) {
    if (ns->name() == req.name) found = ns.get();
  }
  // One answer for "no such namespace" and "wrong token": a client without
  // the token learns nothing.
  if (!found || !TokensEqual(found->token, req.token)) {
    metrics_->auth_failures().Increment();
    LogRefusal(conn, req.name);
    // Answered late and followed by a hang-up (AuthThrottle).
    return throttle_.Refuse(
        std::move(responder),
        Ok(OpenNamespaceResponse{
            Status::PermissionDenied("unknown namespace or wrong token"),
            0,
            false,
            {}}));
  }
  {
    MutexLock lock(&mu_);
    auto it = opened_.find(conn);
    if (it != opened_.end() && it->second != found) {
      return responder.Send(Ok(OpenNamespaceResponse{
          Status::InvalidArgument(
              "this connection already opened another namespace"),
          0,
          false,
          {}}));
    }
    if (it == opened_.end()) {
      uint32_t& open = open_connections_[found];
      if (open >= found->max_connections) {
        HandlerReply refused = Ok(OpenNamespaceResponse{
            Status::ResourceExhausted(
                fmt::format("namespace '{}' has its max_connections ({}) open",
                            found->name(), found->max_connections)),
            0,
            false,
            {}});
        refused.close_after = true;
        return responder.Send(std::move(refused));
      }
      ++open;
      opened_.emplace(conn, found);
    }
  }
  const storage::HostTier& host = found->engine->host();
  OpenNamespaceResponse resp;
  resp.arena_bytes = host.arena().size();
  if (auto layout = found->engine->layout()) {
    resp.has_layout = true;
    resp.layout = *layout;
  }
  HandlerReply reply{Encode(resp), host.arena().fd(), false};
  reply.admit = true;  // past the handshake (UdsServerOptions)
  responder.Send(std::move(reply));
}

void CacheService::LogRefusal(uint64_t conn, const std::string& name) {
  // One line per second at most: a guesser must not flood the log.
  const int64_t now_s = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::steady_clock::now() - started_)
                            .count();
  int64_t last = last_refusal_log_s_.load(std::memory_order_relaxed);
  if (now_s == last || !last_refusal_log_s_.compare_exchange_strong(
                           last, now_s, std::memory_order_relaxed)) {
    refusals_unlogged_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const uint64_t more = refusals_unlogged_.exchange(0);
  spdlog::warn(
      "connection {}: refused namespace '{}' (unknown or bad token){}", conn,
      name,
      more ? fmt::format("; {} more refusals since the last such line", more)
           : std::string());
}

HandlerReply CacheService::RegisterLayout(Namespace& ns, In in) {
  RegisterLayoutRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  return Ok(StatusResponse{engine_->RegisterLayout(*ns.engine, req.layout)});
}

void CacheService::RecordWaits(Namespace& ns,
                               const std::optional<WaitReport>& waits) {
  static_assert(kWaitReportBuckets == LatencyHistogram::kBuckets);
  if (!waits) return;
  metrics_->RecordLayerWaits(*ns.metrics, waits->counts, waits->total_nanos);
}

HandlerReply CacheService::Match(uint64_t conn, Namespace& ns, In in) {
  MatchRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  // A client with registered pools reads through Load, which promotes what
  // it reads once it has it (CacheEngine::Match); one that asked for no
  // prefetch promotes on its Get.
  LayerRange layers;
  bool prefetch = !engine_->HasPools(conn);
  if (req.prefetch) {
    prefetch = prefetch && req.prefetch->enabled;
    layers = {req.prefetch->first, req.prefetch->count};
  }
  auto match =
      engine_->Match(*ns.engine, req.pages,
                     prefetch ? storage::CacheEngine::NvmePromotion::kQueue
                              : storage::CacheEngine::NvmePromotion::kNone,
                     layers);
  if (!match.ok()) return Ok(MatchResponse{match.status(), 0, {}});
  const double page_tokens = ns.engine->layout()->page_tokens;
  ns.metrics->lookups->Increment();
  ns.metrics->lookup_tokens_host->Increment(
      (match->leading_pages - match->leading_nvme_pages -
       match->leading_peer_pages - match->leading_hbm_pages) *
      page_tokens);
  ns.metrics->lookup_tokens_peer->Increment(match->leading_peer_pages *
                                            page_tokens);
  ns.metrics->lookup_tokens_hbm->Increment(match->leading_hbm_pages *
                                           page_tokens);
  ns.metrics->lookup_tokens_nvme->Increment(match->leading_nvme_pages *
                                            page_tokens);
  ns.metrics->lookup_tokens_miss->Increment(
      (req.pages.size() - match->leading_pages) * page_tokens);
  return Ok(MatchResponse{Status::OK(), match->leading_pages,
                          std::move(match->tiers)});
}

void CacheService::PutReserve(uint64_t conn, Namespace& ns, In in,
                              Responder responder) {
  PutReserveRequest req;
  if (Status s = Decode(in, req); !s.ok()) return responder.Send(Error(s));
  std::vector<storage::SegmentSize> items;
  items.reserve(req.items.size());
  for (const PutItem& item : req.items) items.push_back({item.key, item.size});
  engine_->Reserve(
      conn, *ns.engine, std::move(items),
      [this, &ns, r = std::make_shared<Responder>(std::move(responder))](
          storage::EngineReservation reservation) {
        PutReserveResponse resp;
        resp.lease_id = reservation.lease_id;
        resp.items.reserve(reservation.items.size());
        for (auto& item : reservation.items) {
          Placement placement;
          if (!item.ok()) {
            placement.status = item.status();
            ns.metrics->put_failed->Increment();
          } else if (item->already_stored) {
            placement.already_stored = true;  // a success: nothing to write
            ns.metrics->put_dedup->Increment();
          } else {
            placement.offset = item->location.offset;
          }
          resp.items.push_back(std::move(placement));
        }
        UpdateLeaseGauge();
        HandlerReply reply = Ok(resp);
        reply.expect_followup = resp.lease_id != 0;  // the commit
        r->Send(std::move(reply));
      });
}

void CacheService::PutCommit(uint64_t conn, Namespace& ns, In in,
                             Responder responder) {
  auto req = std::make_shared<KeysRequest>();
  if (Status s = Decode(in, *req); !s.ok()) return responder.Send(Error(s));
  const uint64_t lease_id = req->lease_id;
  std::vector<SegmentKey> keys = req->keys;
  engine_->CommitAsync(
      conn, *ns.engine, lease_id, std::move(keys),
      [this, &ns, req, r = std::make_shared<Responder>(std::move(responder))](
          std::vector<Status> items) {
        ItemStatusResponse resp;
        resp.items = std::move(items);
        std::vector<PageHash> stored;
        for (size_t i = 0; i < resp.items.size(); ++i) {
          const bool ok = resp.items[i].ok();
          (ok ? ns.metrics->put_stored : ns.metrics->put_failed)->Increment();
          if (ok && options_.on_stored && i < req->keys.size() &&
              (stored.empty() || stored.back() != req->keys[i].page)) {
            stored.push_back(req->keys[i].page);
          }
        }
        if (!stored.empty()) options_.on_stored(ns.engine, stored);
        UpdateLeaseGauge();
        r->Send(Ok(resp));
      });
}

void CacheService::Get(uint64_t conn, Namespace& ns, In in,
                       Responder responder) {
  KeysRequest req;
  if (Status s = Decode(in, req); !s.ok()) return responder.Send(Error(s));
  if (req.lease_id != 0) {
    // Piggybacked release of the previous read; it may have expired.
    engine_->Release(conn, req.lease_id).PermitUncheckedError();
  }
  engine_->Acquire(
      conn, *ns.engine, std::move(req.keys),
      // std::function needs a copyable callable: share the move-only
      // Responder.
      [this, &ns, r = std::make_shared<Responder>(std::move(responder))](
          storage::EngineRead read) {
        GetResponse resp;
        resp.lease_id = read.lease_id;
        resp.items.reserve(read.items.size());
        uint64_t hits = 0, from_nvme = 0;
        for (size_t i = 0; i < read.items.size(); ++i) {
          Location loc;
          if (read.items[i].ok()) {
            loc.tier = read.source[i];
            loc.offset = read.items[i]->offset;
            loc.size = read.items[i]->size;
            hits++;
            from_nvme += read.source[i] == Tier::kNvme;
          } else {
            loc.status = read.items[i].status();
          }
          resp.items.push_back(std::move(loc));
        }
        ns.metrics->get_hits->Increment(static_cast<double>(hits - from_nvme));
        ns.metrics->get_hits_nvme->Increment(static_cast<double>(from_nvme));
        ns.metrics->get_misses->Increment(
            static_cast<double>(read.items.size() - hits));
        const bool all_refused =
            !read.items.empty() &&
            std::all_of(read.items.begin(), read.items.end(), [](auto& item) {
              return item.status().code() == StatusCode::kResourceExhausted;
            });
        if (all_refused) {
          // Past a lease limit: answered late (AuthThrottle, no hang-up).
          return lease_throttle_.Refuse(std::move(*r), Ok(resp),
                                        /*hang_up=*/false);
        }
        HandlerReply reply = Ok(resp);
        reply.expect_followup = resp.lease_id != 0;  // the release
        r->Send(std::move(reply));
      });
}

HandlerReply CacheService::Release(uint64_t conn, In in) {
  ReleaseRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  Status s = engine_->Release(conn, req.lease_id);
  UpdateLeaseGauge();
  return Ok(StatusResponse{s});
}

HandlerReply CacheService::Pin(uint64_t conn, Namespace& ns, In in) {
  KeysRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  ItemStatusResponse resp;
  auto pin = engine_->Pin(conn, *ns.engine, req.keys,
                          std::chrono::milliseconds(req.ttl_ms));
  if (!pin.ok()) {
    resp.status = pin.status();
    return Ok(resp);
  }
  resp.lease_id = pin->lease_id;
  resp.items = std::move(pin->items);
  UpdateLeaseGauge();
  return Ok(resp);
}

void CacheService::Flush(Namespace& ns, In in, Responder responder) {
  KeysRequest req;
  if (Status s = Decode(in, req); !s.ok()) return responder.Send(Error(s));
  if (!engine_->can_persist()) {
    ItemStatusResponse resp;
    resp.status = Status::InvalidArgument("this daemon has no NVMe tier");
    return responder.Send(Ok(resp));
  }
  engine_->Flush(*ns.engine, std::move(req.keys),
                 [r = std::make_shared<Responder>(std::move(responder))](
                     std::vector<Status> items) {
                   ItemStatusResponse resp;
                   resp.items = std::move(items);
                   r->Send(Ok(resp));
                 });
}

HandlerReply CacheService::RegisterPool(uint64_t conn, Namespace& ns, In in,
                                        int fd) {
  RegisterPoolRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  const storage::PoolLayout layout{.layer = req.layer,
                                   .part = req.part,
                                   .offset = req.offset,
                                   .slot_bytes = req.slot_bytes,
                                   .slot_count = req.slot_count};
  if (req.kind == RegisterPoolRequest::kDeviceIpc) {
    if (fd >= 0) {
      return Ok(StatusResponse{Status::InvalidArgument(
          "a device pool travels as an IPC handle, not a descriptor")});
    }
    storage::IpcHandle handle;
    handle.bytes = req.device_handle;
    handle.pool_bytes = req.device_pool_bytes;
    return Ok(StatusResponse{engine_->RegisterDevicePool(
        conn, *ns.engine, handle, req.device_uuid, layout)});
  }
  if (req.kind == RegisterPoolRequest::kDeviceFd) {
    if (fd < 0) {
      return Ok(StatusResponse{Status::InvalidArgument(
          "a device pool exported as a descriptor needs that descriptor")});
    }
    return Ok(StatusResponse{engine_->RegisterDevicePoolFd(
        conn, *ns.engine, fd, req.device_pool_bytes, req.device_uuid, layout)});
  }
  if (req.kind != RegisterPoolRequest::kMemfd) {
    return Ok(StatusResponse{Status::InvalidArgument(fmt::format(
        "unknown pool kind {} (0: memfd, 1: device IPC handle, 2: device "
        "allocation descriptor)",
        req.kind))});
  }
  if (fd < 0) {
    return Ok(StatusResponse{
        Status::InvalidArgument("RegisterPool needs the pool's memfd")});
  }
  return Ok(
      StatusResponse{engine_->RegisterPool(conn, *ns.engine, fd, layout)});
}

HandlerReply CacheService::RegisterTickets(uint64_t conn, In in, int fd) {
  RegisterTicketsRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  if (fd < 0) {
    return Ok(StatusResponse{
        Status::InvalidArgument("RegisterTickets needs the tickets' memfd")});
  }
  return Ok(StatusResponse{engine_->RegisterTickets(conn, fd, req.count)});
}

HandlerReply CacheService::Transfer(uint64_t conn, Namespace& ns, Opcode op,
                                    In in) {
  TransferRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  RecordWaits(ns, req.waits);
  if (op == Opcode::kStore && options_.on_stored) {
    // Queued before the Store lands: the publisher re-checks a while.
    options_.on_stored(ns.engine, req.pages);
  }
  storage::PoolTransfer t{.pages = std::move(req.pages),
                          .slots = std::move(req.slots),
                          .first_layer = req.first_layer,
                          .num_layers = req.num_layers,
                          .ticket = req.ticket};
  return Ok(StatusResponse{
      op == Opcode::kLoad ? engine_->Load(conn, *ns.engine, std::move(t))
                          : engine_->Store(conn, *ns.engine, std::move(t))});
}

HandlerReply CacheService::ReportTopk(Namespace& ns, In in) {
  TopkReportRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  return Ok(StatusResponse{engine_->ReportTopk(*ns.engine, req.items)});
}

HandlerReply CacheService::Prefetch(Namespace& ns, In in) {
  PrefetchRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  RecordWaits(ns, req.waits);
  return Ok(StatusResponse{engine_->Prefetch(*ns.engine, req.pages)});
}

HandlerReply CacheService::List(Namespace& ns, In in) {
  ListRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  ListResponse resp;
  const size_t limit = std::min<size_t>(req.limit, kMaxBatchItems);
  for (const auto& info : engine_->List(*ns.engine, limit)) {
    resp.segments.push_back({info.key, info.size, info.refs, Tier::kHost});
  }
  return Ok(resp);
}

HandlerReply CacheService::Stats(Namespace& ns) {
  const storage::EngineStats es = engine_->Stats(*ns.engine);
  nlohmann::json j;
  j["namespace"] = ns.name();
  // Every tier, from the engine's walk (tier_stats_json.h): "tiers", and
  // each tier's object by name ("host", "hbm", "nvme", ...).
  nlohmann::json tiers = TiersJson(engine_->TierReports(ns.engine));
  if (engine_->mover() != nullptr) {
    // The mover's demotions go to the write-back target: they show there.
    const storage::TierMoverStats& mv = es.mover;
    storage::TierCounterSet moved;
    moved.Counter("demotions_done", mv.demotions_done);
    moved.Counter("demotions_retried", mv.demotions_retried);
    moved.Counter("demotions_failed", mv.demotions_failed);
    moved.Counter("demotion_batches", mv.demotion_batches);
    moved.Counter("demotion_syncs", mv.syncs);
    moved.Counter("demotion_sync_failures", mv.sync_failures);
    moved.Counter("promotions_done", mv.promotions_done);
    moved.Counter("promotions_failed", mv.promotions_failed);
    moved.Counter("prefetch_batches", mv.prefetch_batches);
    moved.Counter("prefetch_dropped", mv.prefetch_dropped);
    // Background (weights) prefetches: batches, slices promoted, dropped.
    moved.Counter("background_prefetch_batches", mv.background_batches);
    moved.Counter("background_prefetch_slices", mv.background_slices);
    moved.Counter("background_prefetch_dropped", mv.background_dropped);
    moved.Gauge("prefetch_queue_depth",
                static_cast<double>(mv.prefetch_queue_depth));
    if (const storage::Tier* target = engine_->chain().demotion_target()) {
      AddTierCounters(tiers, target->name(), moved);
    }
  }
  auto& m = *ns.metrics;
  j["lookups"] = m.lookups->Value();
  j["lookup_tokens"] = {{"host", m.lookup_tokens_host->Value()},
                        {"miss", m.lookup_tokens_miss->Value()}};
  j["get_segments"] = {{"hit", m.get_hits->Value()},
                       {"miss", m.get_misses->Value()}};
  j["put_segments"] = {{"stored", m.put_stored->Value()},
                       {"dedup", m.put_dedup->Value()},
                       {"failed", m.put_failed->Value()}};
  j["active_leases"] = es.active_leases;
  // Daemon-wide: the workers and the mover serve every namespace.
  const prometheus::ClientMetric waits = m.layer_wait->Collect();
  j["transfers"] = {
      {"calls", es.transfers},
      {"loads", es.loads},
      {"stores", es.stores},
      {"weights_loads", es.weights_loads},
      {"prefetches", es.prefetches},
      {"topk_reports", es.topk_reports},
      // Transfers ordered after an engine's stream (Client::Load/Store with
      // `after`): waiting for it now, ever, and given up on.
      {"stream_gate",
       {{"waiting", es.stream_gate_waiting},
        {"waits", es.stream_gate_waits},
        {"timeouts", es.stream_gate_timeouts}}},
      {"load_seconds",
       {{"count", LatencyHistogram::SampleCount(es.load_latency)},
        {"sum", static_cast<double>(es.load_latency_nanos) * 1e-9}}},
      {"store_seconds",
       {{"count", LatencyHistogram::SampleCount(es.store_latency)},
        {"sum", static_cast<double>(es.store_latency_nanos) * 1e-9}}},
      {"weights_load_seconds",
       {{"count", LatencyHistogram::SampleCount(es.weights_load_latency)},
        {"sum", static_cast<double>(es.weights_load_latency_nanos) * 1e-9}}},
      // This namespace's engines, as their clients reported; "blocked":
      // calls that waited 1 us or more.
      {"layer_waits",
       {{"count", waits.histogram.sample_count},
        {"blocked",
         waits.histogram.sample_count -
             (waits.histogram.bucket.empty()
                  ? 0
                  : waits.histogram.bucket.front().cumulative_count)},
        {"seconds", waits.histogram.sample_sum}}},
      {"registered_pools", es.registered_pools},
      {"load_segments",
       {{"host", es.load_segments_host},
        {"nvme", es.load_segments_nvme},
        {"miss", es.load_misses}}},
      {"load_bytes",
       {{"host", es.load_bytes_host}, {"nvme", es.load_bytes_nvme}}},
      {"store_segments", es.store_segments},
      {"store_bytes", es.store_bytes},
      {"store_dedup", es.store_dedup}};
  j["workers"] = {{"queue_depth", es.worker_queue_depth},
                  {"rejections", es.worker_rejections}};
  j["write_policy"] = storage::WritePolicyName(ns.engine->write_policy());
  j["lookup_tokens"]["nvme"] = m.lookup_tokens_nvme->Value();
  j["lookup_tokens"]["hbm"] = m.lookup_tokens_hbm->Value();
  j["lookup_tokens"]["peer"] = m.lookup_tokens_peer->Value();
  j["transfers"]["load_segments"]["hbm"] = es.load_segments_hbm;
  j["transfers"]["load_bytes"]["hbm"] = es.load_bytes_hbm;
  if (es.has_device) {
    j["device"] = {{"failed", es.device_failed},
                   {"error", es.device_error},
                   {"quarantined_units", es.device_quarantined},
                   {"quarantined_units_total", es.device_quarantined_total},
                   // NVMe reads into device pools: pinned bounce buffers.
                   {"staging",
                    {{"capacity_bytes", es.device_staging.capacity_bytes},
                     {"in_use_bytes", es.device_staging.in_use_bytes},
                     {"pinned_borrows", es.device_staging.pinned_borrows},
                     {"heap_borrows", es.device_staging.heap_borrows}}}};
  }
  j["get_segments"]["hit_nvme"] = m.get_hits_nvme->Value();
  if (engine_->mover() != nullptr) {
    const storage::TierMoverStats& mv = es.mover;
    j["transfers"]["promoted"] = {{"segments", mv.promotions_done},
                                  {"bytes", mv.promoted_bytes}};
    j["transfers"]["written_to_nvme"] = {{"segments", mv.written_segments},
                                         {"bytes", mv.written_bytes}};
  }
  if (auto layout = ns.engine->layout()) {
    j["layout"] = {{"page_tokens", layout->page_tokens},
                   {"num_layers", layout->num_layers()}};
  }
  if (ns.weights != nullptr) {
    // Sealed shards, the chunk bytes they name (a chunk once per shard)
    // and the bytes of their distinct chunks (what storing them takes).
    const storage::WeightsCatalog::Totals w = ns.weights->totals();
    // Shards with a schedule hint or a pin, and the distinct chunk bytes
    // pinned in DRAM.
    const storage::WeightsCatalog::ScheduleTotals sched =
        ns.weights->schedule_totals();
    j["weights"] = {{"shards", w.shards},
                    {"referenced_bytes", w.referenced_bytes},
                    {"unique_bytes", w.unique_bytes},
                    {"hinted_shards", sched.hinted_shards},
                    {"pinned_shards", sched.pinned_shards},
                    {"pinned_bytes", sched.pinned_bytes}};
  }
  AddFlatTierObjects(tiers, j);
  j["tiers"] = std::move(tiers);
  return Ok(JsonResponse{Status::OK(), j.dump()});
}

}  // namespace tierkv::daemon
