#include "daemon/cache_service.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

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

// Checks a segment's size against the registered layout (if any).
Status CheckSize(const std::optional<LayoutSpec>& layout, const SegmentKey& key,
                 uint64_t size) {
  if (size == 0) return Status::InvalidArgument("segment size is 0");
  if (!layout) return Status::OK();
  const uint64_t expected = layout->SegmentBytes(key.layer, key.part);
  if (expected == 0) {
    return Status::InvalidArgument("layer/part not in the namespace layout");
  }
  if (expected != size) {
    return Status::InvalidArgument("segment size " + std::to_string(size) +
                                   " differs from the layout's " +
                                   std::to_string(expected));
  }
  return Status::OK();
}

}  // namespace

CacheService::CacheService(
    const CacheServiceOptions& options,
    const std::vector<std::unique_ptr<Namespace>>* namespaces,
    storage::LeaseTable* leases, DaemonMetrics* metrics, NvmeTier nvme)
    : options_(options),
      namespaces_(namespaces),
      leases_(leases),
      metrics_(metrics),
      nvme_(nvme),
      started_(std::chrono::steady_clock::now()) {}

void CacheService::OnConnect(uint64_t connection_id) {
  metrics_->connections().Increment();
  spdlog::debug("connection {} opened", connection_id);
}

void CacheService::OnDisconnect(uint64_t connection_id) {
  const size_t released = leases_->ReleaseOwner(connection_id);
  {
    std::lock_guard lock(mu_);
    opened_.erase(connection_id);
  }
  metrics_->connections().Decrement();
  metrics_->active_leases().Set(static_cast<double>(leases_->size()));
  spdlog::debug("connection {} closed; released {} leases", connection_id,
                released);
}

Namespace* CacheService::OpenedNamespace(uint64_t connection_id) {
  std::lock_guard lock(mu_);
  auto it = opened_.find(connection_id);
  return it == opened_.end() ? nullptr : it->second;
}

HandlerReply CacheService::Error(const Status& s) {
  if (s.code() == StatusCode::kProtocolError) {
    metrics_->protocol_errors().Increment();
  }
  return HandlerReply{EncodeError(s), -1, /*is_error=*/true};
}

HandlerReply CacheService::OnFrame(uint64_t conn, uint16_t opcode,
                                   std::span<const std::byte> in) {
  const auto op = static_cast<Opcode>(opcode);
  if (op == Opcode::kPing) return Ping();
  if (op == Opcode::kOpenNamespace) return OpenNamespace(conn, in);
  if (opcode == 0 || opcode > static_cast<uint16_t>(Opcode::kFlush)) {
    return Error(
        Status::ProtocolError("unknown opcode " + std::to_string(opcode)));
  }
  Namespace* ns = OpenedNamespace(conn);
  if (!ns) {
    return Error(Status::PermissionDenied("open a namespace first"));
  }
  switch (op) {
    case Opcode::kRegisterLayout:
      return RegisterLayout(*ns, in);
    case Opcode::kMatch:
      return Match(*ns, in);
    case Opcode::kPutReserve:
      return PutReserve(conn, *ns, in);
    case Opcode::kPutCommit:
      return PutCommit(conn, *ns, in);
    case Opcode::kGet:
      return Get(conn, *ns, in);
    case Opcode::kRelease:
      return Release(conn, in);
    case Opcode::kReleaseOneWay: {
      HandlerReply reply = Release(conn, in);
      reply.no_reply = true;
      return reply;
    }
    case Opcode::kPin:
      return Pin(conn, *ns, in);
    case Opcode::kStats:
      return Stats(*ns);
    case Opcode::kList:
      return List(*ns, in);
    case Opcode::kFlush:
      return Flush(*ns, in);
    default:
      break;
  }
  return Error(
      Status::ProtocolError("unknown opcode " + std::to_string(opcode)));
}

HandlerReply CacheService::Ping() {
  nlohmann::json info;
  info["version"] = options_.version_info;
  info["pid"] = ::getpid();
  info["uptime_s"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_)
          .count();
  info["namespaces"] = nlohmann::json::array();
  for (const auto& ns : *namespaces_) info["namespaces"].push_back(ns->name);
  return Ok(JsonResponse{Status::OK(), info.dump()});
}

HandlerReply CacheService::OpenNamespace(uint64_t conn,
                                         std::span<const std::byte> in) {
  OpenNamespaceRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  Namespace* found = nullptr;
  for (const auto& ns : *namespaces_) {
    if (ns->name == req.name) found = ns.get();
  }
  // One answer for "no such namespace" and "wrong token": a client without
  // the token learns nothing.
  if (!found || !TokensEqual(found->token, req.token)) {
    metrics_->auth_failures().Increment();
    spdlog::warn("connection {}: refused namespace '{}' (unknown or bad token)",
                 conn, req.name);
    return Ok(OpenNamespaceResponse{
        Status::PermissionDenied("unknown namespace or wrong token"),
        0,
        false,
        {}});
  }
  {
    std::lock_guard lock(mu_);
    auto [it, inserted] = opened_.emplace(conn, found);
    if (!inserted && it->second != found) {
      return Ok(OpenNamespaceResponse{
          Status::InvalidArgument(
              "this connection already opened another namespace"),
          0,
          false,
          {}});
    }
  }
  OpenNamespaceResponse resp;
  resp.arena_bytes = found->host->arena().size();
  if (auto layout = found->layout()) {
    resp.has_layout = true;
    resp.layout = *layout;
  }
  return HandlerReply{Encode(resp), found->host->arena().fd(), false};
}

HandlerReply CacheService::RegisterLayout(Namespace& ns,
                                          std::span<const std::byte> in) {
  RegisterLayoutRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  return Ok(StatusResponse{ns.RegisterLayout(req.layout)});
}

HandlerReply CacheService::Match(Namespace& ns, std::span<const std::byte> in) {
  MatchRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  auto layout = ns.layout();
  if (!layout) {
    return Ok(MatchResponse{
        Status::InvalidArgument("register a layout before Match"), 0, {}});
  }
  const uint64_t fingerprint = ns.fingerprint();
  MatchResponse resp;
  resp.tiers.reserve(req.pages.size());
  bool leading = true;
  std::vector<SegmentKey> on_nvme_only;  // of leading pages: promote them
  uint64_t nvme_pages = 0;
  for (const PageHash& page : req.pages) {
    Tier tier = Tier::kHost;
    const size_t promote_mark = on_nvme_only.size();
    for (uint16_t l = 0; tier != Tier::kMiss && l < layout->num_layers(); ++l) {
      const auto parts = layout->layers[l].parts.size();
      for (uint8_t p = 0; tier != Tier::kMiss && p < parts; ++p) {
        const SegmentKey key{page, l, p};
        if (ns.host->Touch(key)) continue;
        if (ns.nvme && ns.nvme->Contains(ns.name, key, fingerprint)) {
          tier = Tier::kNvme;
          on_nvme_only.push_back(key);
        } else {
          tier = Tier::kMiss;
        }
      }
    }
    if (tier == Tier::kMiss) on_nvme_only.resize(promote_mark);
    resp.tiers.push_back(tier);
    leading = leading && tier != Tier::kMiss;
    if (leading) {
      resp.leading_pages++;
      if (tier == Tier::kNvme) nvme_pages++;
    } else {
      on_nvme_only.resize(std::min(on_nvme_only.size(), promote_mark));
    }
  }
  // Prefetch what the engine will Get next: NVMe -> host, asynchronously.
  if (nvme_.mover) {
    for (const auto& key : on_nvme_only) {
      nvme_.mover->EnqueuePromotion(ns.tiers(), fingerprint, key);
    }
  }
  const double page_tokens = layout->page_tokens;
  ns.metrics->lookups->Increment();
  ns.metrics->lookup_tokens_host->Increment((resp.leading_pages - nvme_pages) *
                                            page_tokens);
  ns.metrics->lookup_tokens_nvme->Increment(nvme_pages * page_tokens);
  ns.metrics->lookup_tokens_miss->Increment(
      (req.pages.size() - resp.leading_pages) * page_tokens);
  return Ok(resp);
}

HandlerReply CacheService::PutReserve(uint64_t conn, Namespace& ns,
                                      std::span<const std::byte> in) {
  PutReserveRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  const auto layout = ns.layout();
  PutReserveResponse resp;
  resp.items.reserve(req.items.size());
  std::vector<SegmentKey> reserved;
  for (const auto& item : req.items) {
    Placement placement;
    placement.status = CheckSize(layout, item.key, item.size);
    if (placement.status.ok()) {
      auto loc = ns.host->Reserve(item.key, item.size);
      if (loc.ok()) {
        placement.offset = loc->offset;
        reserved.push_back(item.key);
      } else {
        placement.status = loc.status();
      }
    }
    if (placement.status.IsAlreadyExists()) {
      ns.metrics->put_dedup->Increment();
    } else if (!placement.status.ok()) {
      ns.metrics->put_failed->Increment();
    }
    resp.items.push_back(std::move(placement));
  }
  if (!reserved.empty()) {
    resp.lease_id =
        leases_->Add(conn, storage::LeaseKind::kWrite, ns.host.get(),
                     std::move(reserved), options_.lease_ttl);
  }
  metrics_->active_leases().Set(static_cast<double>(leases_->size()));
  return Ok(resp);
}

HandlerReply CacheService::PutCommit(uint64_t conn, Namespace& ns,
                                     std::span<const std::byte> in) {
  KeysRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  ItemStatusResponse resp;
  resp.items = leases_->Commit(conn, req.lease_id, req.keys);
  const bool write_through =
      nvme_.mover && ns.write_policy == WritePolicy::kWriteThrough;
  for (size_t i = 0; i < resp.items.size(); ++i) {
    const bool ok = resp.items[i].ok();
    (ok ? ns.metrics->put_stored : ns.metrics->put_failed)->Increment();
    if (ok && write_through) {
      nvme_.mover->EnqueueCommitted(ns.tiers(), ns.fingerprint(), req.keys[i]);
    }
  }
  metrics_->active_leases().Set(static_cast<double>(leases_->size()));
  return Ok(resp);
}

HandlerReply CacheService::Get(uint64_t conn, Namespace& ns,
                               std::span<const std::byte> in) {
  KeysRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  if (req.lease_id != 0) {
    // Piggybacked release of the previous read; it may have expired.
    leases_->Release(conn, req.lease_id).PermitUncheckedError();
  }
  GetResponse resp;
  resp.items.reserve(req.keys.size());
  std::vector<SegmentKey> acquired;
  uint64_t from_nvme = 0;
  for (const auto& key : req.keys) {
    Location loc;
    auto found = ns.host->Acquire(key);
    Tier tier = Tier::kHost;
    if (!found.ok() && found.status().IsNotFound() && ns.nvme) {
      // On-demand promotion: the engine is waiting for these bytes. A
      // segment that fails its checksum on NVMe is a miss, never bad bytes.
      if (storage::TierMover::PromoteNow(ns.tiers(), ns.fingerprint(), key)
              .ok()) {
        found = ns.host->Acquire(key);
        tier = Tier::kNvme;
      }
    }
    if (found.ok()) {
      from_nvme += tier == Tier::kNvme;
      loc.tier = tier;
      loc.offset = found->offset;
      loc.size = found->size;
      acquired.push_back(key);
    } else {
      loc.status = found.status();
    }
    resp.items.push_back(std::move(loc));
  }
  ns.metrics->get_hits->Increment(
      static_cast<double>(acquired.size() - from_nvme));
  ns.metrics->get_hits_nvme->Increment(static_cast<double>(from_nvme));
  ns.metrics->get_misses->Increment(
      static_cast<double>(req.keys.size() - acquired.size()));
  if (!acquired.empty()) {
    resp.lease_id = leases_->Add(conn, storage::LeaseKind::kRead, ns.host.get(),
                                 std::move(acquired), options_.lease_ttl);
  }
  metrics_->active_leases().Set(static_cast<double>(leases_->size()));
  return Ok(resp);
}

HandlerReply CacheService::Release(uint64_t conn,
                                   std::span<const std::byte> in) {
  ReleaseRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  Status s = leases_->Release(conn, req.lease_id);
  metrics_->active_leases().Set(static_cast<double>(leases_->size()));
  return Ok(StatusResponse{s});
}

HandlerReply CacheService::Pin(uint64_t conn, Namespace& ns,
                               std::span<const std::byte> in) {
  KeysRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  ItemStatusResponse resp;
  const auto ttl = std::chrono::milliseconds(req.ttl_ms);
  if (req.ttl_ms == 0 || ttl > options_.max_pin_ttl) {
    resp.status = Status::InvalidArgument(
        "pin ttl must be in [1, " +
        std::to_string(options_.max_pin_ttl.count()) + "] ms");
    return Ok(resp);
  }
  std::vector<SegmentKey> pinned;
  for (const auto& key : req.keys) {
    auto found = ns.host->Acquire(key);
    resp.items.push_back(found.status());
    if (found.ok()) pinned.push_back(key);
  }
  if (!pinned.empty()) {
    resp.lease_id = leases_->Add(conn, storage::LeaseKind::kPin, ns.host.get(),
                                 std::move(pinned), ttl);
  }
  metrics_->active_leases().Set(static_cast<double>(leases_->size()));
  return Ok(resp);
}

HandlerReply CacheService::Stats(Namespace& ns) {
  const auto s = ns.host->Stats();
  nlohmann::json j;
  j["namespace"] = ns.name;
  j["host"] = {{"capacity_bytes", s.capacity_bytes},
               {"used_bytes", s.used_bytes},
               {"reserved_bytes", s.reserved_bytes},
               {"segments", s.segments},
               {"referenced_segments", s.referenced_segments},
               {"inserts", s.inserts},
               {"dedup_hits", s.dedup_hits},
               {"evictions", s.evictions},
               {"evicted_bytes", s.evicted_bytes},
               {"aborts", s.aborts},
               {"largest_free_bytes", s.largest_free_bytes},
               {"hugepages", s.hugepages}};
  auto& m = *ns.metrics;
  j["lookups"] = m.lookups->Value();
  j["lookup_tokens"] = {{"host", m.lookup_tokens_host->Value()},
                        {"miss", m.lookup_tokens_miss->Value()}};
  j["get_segments"] = {{"hit", m.get_hits->Value()},
                       {"miss", m.get_misses->Value()}};
  j["put_segments"] = {{"stored", m.put_stored->Value()},
                       {"dedup", m.put_dedup->Value()},
                       {"failed", m.put_failed->Value()}};
  j["active_leases"] = leases_->size();
  j["write_policy"] = WritePolicyName(ns.write_policy);
  j["lookup_tokens"]["nvme"] = m.lookup_tokens_nvme->Value();
  j["get_segments"]["hit_nvme"] = m.get_hits_nvme->Value();
  if (nvme_.store) {
    const auto n = nvme_.store->Stats();
    const auto mv = nvme_.mover->Stats();
    j["nvme"] = {{"capacity_bytes", n.capacity_bytes},
                 {"used_bytes", n.bytes_used},
                 {"allocated_bytes", n.bytes_allocated},
                 {"segments", n.segments},
                 {"fragmentation", n.fragmentation},
                 {"evictions", n.evictions},
                 {"checksum_failures", n.checksum_failures},
                 {"checksum_reread_ok", n.checksum_reread_ok},
                 {"reads", n.reads},
                 {"read_hits", n.read_hits},
                 {"writes", n.writes},
                 {"write_errors", n.write_errors},
                 {"read_bytes", n.device.read_bytes},
                 {"written_bytes", n.device.write_bytes},
                 {"recovered_segments", n.recovery.recovered_segments},
                 {"recovered_bytes", n.recovery.recovered_bytes},
                 {"dropped_segments", n.recovery.dropped_segments},
                 {"catalog_recreated", n.recovery.catalog_recreated},
                 {"direct_io", n.direct_io},
                 {"io_uring", n.io_uring},
                 {"demotions_done", mv.demotions_done},
                 {"demotions_dropped", mv.demotions_dropped},
                 {"demotions_failed", mv.demotions_failed},
                 {"promotions_done", mv.promotions_done},
                 {"promotions_dropped", mv.promotions_dropped},
                 {"demotion_queue_depth", mv.demotion_queue_depth},
                 {"promotion_queue_depth", mv.promotion_queue_depth}};
  }
  if (auto layout = ns.layout()) {
    j["layout"] = {{"page_tokens", layout->page_tokens},
                   {"num_layers", layout->num_layers()}};
  }
  return Ok(JsonResponse{Status::OK(), j.dump()});
}

HandlerReply CacheService::Flush(Namespace& ns, std::span<const std::byte> in) {
  KeysRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  ItemStatusResponse resp;
  if (!nvme_.store) {
    resp.status = Status::InvalidArgument("this daemon has no NVMe tier");
    return Ok(resp);
  }
  // Synchronous on this connection: the caller asked for durability.
  resp.items.reserve(req.keys.size());
  for (const auto& key : req.keys) {
    resp.items.push_back(
        storage::TierMover::PersistNow(ns.tiers(), ns.fingerprint(), key));
  }
  return Ok(resp);
}

HandlerReply CacheService::List(Namespace& ns, std::span<const std::byte> in) {
  ListRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  ListResponse resp;
  const size_t limit = std::min<size_t>(req.limit, kMaxBatchItems);
  for (const auto& info : ns.host->List(limit)) {
    resp.segments.push_back({info.key, info.size, info.refs, Tier::kHost});
  }
  return Ok(resp);
}

}  // namespace tierkv::daemon
