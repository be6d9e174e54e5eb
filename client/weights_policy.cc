// Client's weights schedule calls (client.h, "Model weights"): HintWeights
// (kWeightsHint) and PinWeights (kWeightsPin), one request each; the
// daemon's WeightsCatalog turns them into DRAM eviction order, prefetches
// and pins (README "Weights namespaces").
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "client/client_impl.h"
#include "tierkv/client.h"

namespace tierkv {

using transport::Opcode;

Status Client::HintWeights(std::span<const WeightsHint> hints) {
  if (hints.empty()) return Status::OK();
  if (hints.size() > transport::kMaxBatchItems) {
    return Status::InvalidArgument(
        fmt::format("at most {} hints per call, not {}",
                    transport::kMaxBatchItems, hints.size()));
  }
  transport::WeightsHintRequest req;
  req.items.reserve(hints.size());
  for (const WeightsHint& h : hints) {
    // Negative means "no known next use" on the wire, whatever its size.
    req.items.push_back({h.id, h.next_use.count() < 0
                                   ? int64_t{-1}
                                   : static_cast<int64_t>(h.next_use.count())});
  }
  transport::ItemStatusResponse resp;
  TIERKV_RETURN_IF_ERROR(
      impl_->Call(Opcode::kWeightsHint, transport::Encode(req), resp));
  if (resp.items.size() != hints.size()) {
    return Status::ProtocolError(
        fmt::format("the daemon answered {} hint statuses for {} hints",
                    resp.items.size(), hints.size()));
  }
  for (size_t i = 0; i < resp.items.size(); ++i) {
    if (resp.items[i].ok()) continue;
    return Status(resp.items[i].code(),
                  fmt::format("hint {} ('{}' '{}'): {}", i, hints[i].id.model,
                              hints[i].id.layout, resp.items[i].message()));
  }
  return Status::OK();
}

Status Client::PinWeights(const WeightsId& id, std::chrono::milliseconds ttl) {
  const uint64_t ttl_ms =
      ttl.count() <= 0 ? 0 : static_cast<uint64_t>(ttl.count());
  transport::StatusResponse resp;
  return impl_->Call(
      Opcode::kWeightsPin,
      transport::Encode(transport::WeightsPinRequest{id, ttl_ms}), resp);
}

}  // namespace tierkv
