// CacheService's kWeights* requests (issue 28): decode, call the
// namespace's WeightsCatalog (storage/weights/weights_catalog.h), encode.
// Only a namespace configured with `weights = true` has one; every other
// namespace answers InvalidArgument. The chunks themselves travel with
// kPutReserve / kPutCommit and kGet, as any segment does.
#include <fmt/format.h>

#include "daemon/cache_service.h"

namespace tierkv::daemon {

using namespace transport;  // NOLINT: protocol message types

namespace {

template <typename Message>
HandlerReply Ok(const Message& m) {
  return HandlerReply{Encode(m), -1, false};
}

Status NotWeights(const Namespace& ns) {
  return Status::InvalidArgument(fmt::format(
      "namespace '{}' is not a weights namespace (configure it with "
      "weights = true)",
      ns.name()));
}

// Bytes of a List reply's shards, at most: far below the frame limit,
// whatever the names' lengths (each WeightsInfo encodes to < 500 bytes).
constexpr size_t kMaxListedShards = 8192;

}  // namespace

void CacheService::WeightsSeal(Namespace& ns, In in, Responder responder) {
  WeightsSealRequest req;
  if (Status s = Decode(in, req); !s.ok()) return responder.Send(Error(s));
  if (ns.weights == nullptr) {
    return responder.Send(Ok(WeightsSealResponse{NotWeights(ns), {}, false}));
  }
  ns.weights->Seal(req.manifest,
                   [r = std::make_shared<Responder>(std::move(responder))](
                       Result<storage::WeightsCatalog::Sealed> sealed) {
                     WeightsSealResponse resp;
                     if (sealed.ok()) {
                       resp.version = sealed->version;
                       resp.already_sealed = sealed->already_sealed;
                     } else {
                       resp.status = sealed.status();
                     }
                     r->Send(Ok(resp));
                   });
}

HandlerReply CacheService::WeightsManifest(Namespace& ns, In in) {
  WeightsSelectRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  WeightsManifestResponse resp;
  if (ns.weights == nullptr) {
    resp.status = NotWeights(ns);
    return Ok(resp);
  }
  auto manifest = ns.weights->Manifest(
      WeightsId{std::move(req.model), std::move(req.layout), req.version});
  if (!manifest.ok()) {
    resp.status = manifest.status();
    return Ok(resp);
  }
  resp.manifest = std::move(manifest).value();
  return Ok(resp);
}

HandlerReply CacheService::WeightsList(Namespace& ns, In in) {
  WeightsSelectRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  WeightsListResponse resp;
  if (ns.weights == nullptr) {
    resp.status = NotWeights(ns);
    return Ok(resp);
  }
  resp.shards = ns.weights->List(req.model, kMaxListedShards);
  return Ok(resp);
}

HandlerReply CacheService::WeightsDrop(Namespace& ns, In in) {
  WeightsSelectRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  WeightsDropResponse resp;
  if (ns.weights == nullptr) {
    resp.status = NotWeights(ns);
    return Ok(resp);
  }
  auto dropped = ns.weights->Drop(req.model, req.layout, req.version);
  if (!dropped.ok()) {
    resp.status = dropped.status();
    return Ok(resp);
  }
  resp.dropped = dropped->shards;
  resp.freed_bytes = dropped->freed_bytes;
  return Ok(resp);
}

HandlerReply CacheService::WeightsPrefetch(Namespace& ns, In in) {
  WeightsSelectRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  if (ns.weights == nullptr) return Ok(StatusResponse{NotWeights(ns)});
  auto queued = ns.weights->Prefetch(
      WeightsId{std::move(req.model), std::move(req.layout), req.version},
      req.layers);
  return Ok(StatusResponse{queued.status()});
}

HandlerReply CacheService::WeightsHint(Namespace& ns, In in) {
  WeightsHintRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  ItemStatusResponse resp;
  if (ns.weights == nullptr) {
    resp.status = NotWeights(ns);
    return Ok(resp);
  }
  std::vector<storage::WeightsCatalog::ShardHint> hints;
  hints.reserve(req.items.size());
  for (WeightsHintItem& item : req.items) {
    hints.push_back(
        {std::move(item.id), std::chrono::milliseconds(item.next_use_ms)});
  }
  resp.items = ns.weights->Hint(hints);
  return Ok(resp);
}

HandlerReply CacheService::WeightsPin(Namespace& ns, In in) {
  WeightsPinRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  if (ns.weights == nullptr) return Ok(StatusResponse{NotWeights(ns)});
  // A ttl past int64 ms is forever in practice: clamp, never wrap.
  const auto ttl = std::chrono::milliseconds(static_cast<int64_t>(
      std::min<uint64_t>(req.ttl_ms, uint64_t{INT64_MAX} / 2)));
  return Ok(StatusResponse{ns.weights->Pin(req.id, ttl)});
}

HandlerReply CacheService::WeightsLoadToPool(uint64_t conn, Namespace& ns,
                                             In in) {
  WeightsLoadRequest req;
  if (Status s = Decode(in, req); !s.ok()) return Error(s);
  RecordWaits(ns, req.waits);
  if (ns.weights == nullptr) return Ok(StatusResponse{NotWeights(ns)});
  auto manifest = ns.weights->Decoded(req.id);
  if (!manifest.ok()) return Ok(StatusResponse{manifest.status()});
  return Ok(StatusResponse{engine_->LoadWeights(
      conn, *ns.engine,
      storage::WeightsTransfer{.manifest = std::move(manifest).value(),
                               .first_layer = req.first_layer,
                               .num_layers = req.num_layers,
                               .ticket = req.ticket})});
}

void CacheService::WeightsStage(uint64_t conn, Namespace& ns, In in,
                                Responder responder) {
  WeightsStageRequest req;
  if (Status s = Decode(in, req); !s.ok()) return responder.Send(Error(s));
  if (ns.weights == nullptr) {
    return responder.Send(Ok(WeightsStageResponse{NotWeights(ns), {}, {}}));
  }
  if (req.extents.size() > transport::kMaxBatchItems) {
    return responder.Send(Ok(WeightsStageResponse{
        Status::InvalidArgument("too many chunks for one request"), {}, {}}));
  }
  std::vector<storage::WeightsExtent> extents;
  extents.reserve(req.extents.size());
  for (const WeightsStageExtent& e : req.extents) {
    extents.push_back({e.offset, e.bytes});
  }
  engine_->StageWeights(conn, *ns.engine, std::move(extents),
                        [r = std::make_shared<Responder>(std::move(responder))](
                            Result<storage::WeightsStaged> staged) {
                          WeightsStageResponse resp;
                          if (staged.ok()) {
                            resp.keys = std::move(staged->keys);
                            resp.already_stored.assign(
                                staged->already_stored.begin(),
                                staged->already_stored.end());
                          } else {
                            resp.status = staged.status();
                          }
                          r->Send(Ok(resp));
                        });
}

}  // namespace tierkv::daemon
