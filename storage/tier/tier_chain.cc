// TierChain: read-order fall-through over the tiers below DRAM (see
// tier_chain.h).
#include "storage/tier/tier_chain.h"

#include <fmt/format.h>

#include <algorithm>

#include "storage/tier/completion.h"

namespace tierkv::storage {

Result<std::unique_ptr<TierChain>> TierChain::Create(
    std::vector<std::unique_ptr<Tier>> tiers,
    const PlacementOptions& placement) {
  if (tiers.size() >= kNowhere) {
    return Status::InvalidArgument("placement: too many tiers");
  }
  for (size_t i = 0; i < tiers.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (tiers[i]->name() == tiers[j]->name()) {
        return Status::InvalidArgument(
            fmt::format("placement: two tiers named '{}'", tiers[i]->name()));
      }
    }
  }
  auto find = [&tiers](std::string_view name) {
    return std::find_if(tiers.begin(), tiers.end(),
                        [name](const auto& t) { return t->name() == name; });
  };
  if (!placement.read_order.empty()) {
    std::vector<std::unique_ptr<Tier>> ordered;
    for (const std::string& name : placement.read_order) {
      auto it = find(name);
      if (it == tiers.end()) {
        return Status::InvalidArgument(fmt::format(
            "placement.read_order names '{}', which is not a tier here (or "
            "is named twice)",
            name));
      }
      ordered.push_back(std::move(*it));
      tiers.erase(it);
    }
    if (!tiers.empty()) {
      return Status::InvalidArgument(fmt::format(
          "placement.read_order leaves out tier '{}'", tiers.front()->name()));
    }
    tiers = std::move(ordered);
  }
  Tier* demote_to = nullptr;
  if (!placement.demote_to.empty()) {
    auto it = find(placement.demote_to);
    if (it == tiers.end()) {
      return Status::InvalidArgument(
          fmt::format("placement.demote_to names '{}', which is not a tier",
                      placement.demote_to));
    }
    demote_to = it->get();
  } else {
    for (const auto& t : tiers) {
      if (t->persistent()) {
        demote_to = t.get();
        break;
      }
    }
    if (demote_to == nullptr && !tiers.empty()) demote_to = tiers[0].get();
  }
  return std::unique_ptr<TierChain>(new TierChain(std::move(tiers), demote_to));
}

Status TierChain::OpenNamespace(const TierNamespace& ns) {
  for (const auto& t : tiers_) {
    if (Status s = t->OpenNamespace(ns); !s.ok()) {
      return Status(s.code(),
                    fmt::format("{} tier: {}", t->name(), s.message()));
    }
  }
  return Status::OK();
}

std::vector<TierChain::Location> TierChain::Locate(
    const TierNamespace& ns, uint64_t fingerprint,
    std::span<const SegmentKey> keys, TierScope scope) const {
  std::vector<Location> out(keys.size());
  std::vector<size_t> missing(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) missing[i] = i;
  std::vector<SegmentKey> probe;
  for (size_t level = 0; level < tiers_.size() && !missing.empty(); ++level) {
    if (!InScope(level, scope)) continue;
    probe.clear();
    for (size_t i : missing) probe.push_back(keys[i]);
    const std::vector<uint64_t> bytes =
        tiers_[level]->Lookup(ns, fingerprint, probe);
    size_t still = 0;
    for (size_t m = 0; m < missing.size(); ++m) {
      if (bytes[m] != 0) {
        out[missing[m]] = {static_cast<uint8_t>(level), bytes[m]};
      } else {
        missing[still++] = missing[m];
      }
    }
    missing.resize(still);
  }
  return out;
}

// A chain read in progress: shared by the tiers' completions.
struct TierChain::PendingRead {
  TierNamespace ns;
  uint64_t fingerprint = 0;
  TierScope scope = TierScope::kAll;
  std::vector<TierReadItem> items;
  ReadResult result;
  ReadDone done;
};

void TierChain::Read(const TierNamespace& ns, uint64_t fingerprint,
                     std::span<const TierReadItem> items, ReadDone done,
                     TierScope scope) const {
  auto state = std::make_shared<PendingRead>();
  state->ns = ns;
  state->fingerprint = fingerprint;
  state->scope = scope;
  state->items.assign(items.begin(), items.end());
  state->result.items.assign(items.size(),
                             Status::NotFound("segment in no tier below DRAM"));
  state->result.served_by.assign(items.size(), kNowhere);
  state->done = std::move(done);
  ReadFrom(0, std::move(state));
}

void TierChain::ReadFrom(size_t level,
                         std::shared_ptr<PendingRead> state) const {
  // The items still unread: missed so far, or failed in a way another
  // tier's copy can mend.
  std::vector<size_t> todo;
  for (size_t i = 0; i < state->items.size(); ++i) {
    const Result<uint64_t>& r = state->result.items[i];
    if (state->result.served_by[i] == kNowhere &&
        r.status().code() != StatusCode::kInvalidArgument) {
      todo.push_back(i);
    }
  }
  while (level < tiers_.size() && !InScope(level, state->scope)) ++level;
  if (level >= tiers_.size() || todo.empty()) {
    ReadDone done = std::move(state->done);
    done(std::move(state->result));
    return;
  }
  std::vector<TierReadItem> batch;
  batch.reserve(todo.size());
  for (size_t i : todo) batch.push_back(state->items[i]);
  tiers_[level]->Read(
      state->ns, state->fingerprint, batch,
      [this, level, state,
       todo = std::move(todo)](std::vector<Result<uint64_t>> got) mutable {
        for (size_t b = 0; b < todo.size(); ++b) {
          Result<uint64_t>& out = state->result.items[todo[b]];
          if (got[b].ok()) {
            out = std::move(got[b]);
            state->result.served_by[todo[b]] = static_cast<uint8_t>(level);
          } else if (out.status().IsNotFound()) {
            out = std::move(got[b]);  // the first real error is kept
          }
        }
        ReadFrom(level + 1, std::move(state));
      });
}

TierChain::ReadResult TierChain::ReadAndWait(
    const TierNamespace& ns, uint64_t fingerprint,
    std::span<const TierReadItem> items) const {
  auto c = std::make_shared<Completion<ReadResult>>();
  Read(ns, fingerprint, items, [c](ReadResult r) { c->Set(std::move(r)); });
  return c->Wait();
}

Status TierChain::Sync() const {
  Status first;
  for (const auto& t : tiers_) {
    if (!t->HasUnsyncedWrites()) continue;
    if (Status s = t->Sync(); !s.ok() && first.ok()) {
      first =
          Status(s.code(), fmt::format("{} tier: {}", t->name(), s.message()));
    }
  }
  return first;
}

bool TierChain::HasUnsyncedWrites() const {
  return std::any_of(tiers_.begin(), tiers_.end(),
                     [](const auto& t) { return t->HasUnsyncedWrites(); });
}

void TierChain::PrepareThisThread() const {
  for (const auto& t : tiers_) t->PrepareThisThread();
}

}  // namespace tierkv::storage
