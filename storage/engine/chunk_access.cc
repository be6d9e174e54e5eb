// CacheEngine's calls for content-addressed namespaces (weights chunks,
// NamespaceOptions::weights): the chunk rules, the check of a chunk's bytes
// against its key at commit, and where chunks are, their promotion in a
// given order and their removal, for storage/weights/ (see cache_engine.h).
#include <fmt/format.h>

#include "storage/engine/cache_engine.h"
#include "tierkv/weights.h"

namespace tierkv::storage {

Status CacheEngine::CheckChunk(const SegmentKey& key, uint64_t size) {
  if (key.layer != 0 || key.part != 0) {
    return Status::InvalidArgument(
        "a weights chunk's key has layer 0 and part 0 (its page is the "
        "chunk's WeightsChunkKey)");
  }
  if (size == 0 || size > kWeightsMaxChunkBytes) {
    return Status::InvalidArgument(
        fmt::format("a weights chunk has 1..{} bytes, not {}",
                    kWeightsMaxChunkBytes, size));
  }
  return Status::OK();
}

std::vector<Status> CacheEngine::VerifyChunks(
    EngineNamespace& ns, std::span<const SegmentKey> keys) const {
  std::vector<Status> out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    Result<SegmentLocation> at = ns.host_->Reserved(keys[i]);
    if (!at.ok()) continue;  // Commit answers NotFound for it
    // The reservation cannot move while its lease lives; should the lease
    // expire meanwhile, these are still arena bytes and the commit fails.
    const std::span<const std::byte> bytes = ns.host_->HostBytes(*at);
    if (bytes.size() != at->size || WeightsChunkKey(bytes) != keys[i].page) {
      out[i] = Status::Corruption(fmt::format(
          "chunk bytes do not match their key {}", keys[i].page.ToHex()));
    }
  }
  return out;
}

void CacheEngine::CommitAsync(uint64_t owner, EngineNamespace& ns,
                              uint64_t lease_id, std::vector<SegmentKey> keys,
                              std::function<void(std::vector<Status>)> done) {
  if (!ns.weights_) {
    done(Commit(owner, ns, lease_id, keys));
    return;
  }
  auto state =
      std::make_shared<std::pair<std::vector<SegmentKey>,
                                 std::function<void(std::vector<Status>)>>>(
          std::move(keys), std::move(done));
  const bool queued = Submit([this, owner, &ns, lease_id, state] {
    state->second(Commit(owner, ns, lease_id, state->first));
  });
  if (!queued) {
    // Dropped, not left reserved: a Put of the same chunks again (the
    // client's answer to Busy) would otherwise find them "being written"
    // by this lease until it expired.
    leases_->Abort(owner, lease_id, state->first);
    state->second(std::vector<Status>(
        state->first.size(),
        Status::Busy("daemon workers are saturated; put the chunks again")));
  }
}

std::vector<bool> CacheEngine::ChunksHeldBelow(
    EngineNamespace& ns, std::span<const SegmentSize> items) const {
  std::vector<bool> out(items.size(), false);
  if (chain_->empty()) return out;
  std::vector<SegmentKey> below;
  std::vector<size_t> below_at;
  for (size_t i = 0; i < items.size(); ++i) {
    // In DRAM: the host tier's own dedup answers (and counts a use).
    if (ns.host_->SizeOf(items[i].key) > 0) continue;
    below.push_back(items[i].key);
    below_at.push_back(i);
  }
  if (below.empty()) return out;
  const auto where =
      chain_->Locate(ns.tiers_.ns, ns.fingerprint(), below, TierScope::kLocal);
  for (size_t b = 0; b < below.size(); ++b) {
    const size_t i = below_at[b];
    // A size that differs is not this chunk (CheckChunk refuses it anyway).
    out[i] =
        where[b].tier != TierChain::kNowhere && where[b].bytes == items[i].size;
  }
  return out;
}

std::vector<CacheEngine::SegmentWhere> CacheEngine::Where(
    EngineNamespace& ns, std::span<const SegmentKey> keys) const {
  std::vector<SegmentWhere> out(keys.size());
  std::vector<SegmentKey> below;
  std::vector<size_t> below_at;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (const uint64_t bytes = ns.host_->SizeOf(keys[i]); bytes > 0) {
      out[i] = {tierkv::Tier::kHost, bytes};
    } else if (!chain_->empty()) {
      below.push_back(keys[i]);
      below_at.push_back(i);
    }
  }
  if (below.empty()) return out;
  const auto where =
      chain_->Locate(ns.tiers_.ns, ns.fingerprint(), below, TierScope::kLocal);
  for (size_t b = 0; b < below.size(); ++b) {
    if (where[b].tier == TierChain::kNowhere) continue;
    out[below_at[b]] = {chain_->at(where[b].tier).kind(), where[b].bytes};
  }
  return out;
}

std::vector<uint64_t> CacheEngine::PersistedBytes(
    EngineNamespace& ns, std::span<const SegmentKey> keys) const {
  std::vector<uint64_t> out(keys.size(), 0);
  if (chain_->empty() || keys.empty()) return out;
  const auto where =
      chain_->Locate(ns.tiers_.ns, ns.fingerprint(), keys, TierScope::kLocal);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (where[i].tier == TierChain::kNowhere) continue;
    if (chain_->at(where[i].tier).persistent()) out[i] = where[i].bytes;
  }
  return out;
}

size_t CacheEngine::PromoteInOrder(EngineNamespace& ns,
                                   std::span<const SegmentKey> keys) {
  if (!mover_) return 0;
  std::vector<SegmentKey> below;
  for (const SegmentKey& key : keys) {
    if (!ns.host_->Contains(key)) below.push_back(key);
  }
  if (below.empty()) return 0;
  const auto where =
      chain_->Locate(ns.tiers_.ns, ns.fingerprint(), below, TierScope::kLocal);
  const uint64_t budget = ns.host_->capacity_bytes() / 2;
  uint64_t bytes = 0;
  std::vector<SegmentKey> promote;
  std::vector<uint64_t> sizes;
  for (size_t i = 0; i < below.size(); ++i) {
    if (where[i].tier == TierChain::kNowhere) continue;
    if (bytes + where[i].bytes > budget) break;  // keep the given order
    bytes += where[i].bytes;
    promote.push_back(below[i]);
    sizes.push_back(where[i].bytes);
  }
  const size_t queued = promote.size();
  // Background class: KV promotions go first, within the namespace's cap.
  if (queued > 0) {
    mover_->Prefetch(&ns.tiers_, std::move(promote), IoClass::kBackground,
                     std::move(sizes));
  }
  return queued;
}

void CacheEngine::SetSchedule(EngineNamespace& ns, ScheduleTable table) {
  for (size_t t = 0; t < chain_->size(); ++t) {
    Tier& tier = chain_->at(t);
    if (!tier.remote()) tier.SetSchedule(ns.tiers_.ns, table);
  }
  ns.host_->SetSchedule(std::move(table));
}

uint64_t CacheEngine::HostCapacity(const EngineNamespace& ns) const {
  return ns.host_->capacity_bytes();
}

void CacheEngine::Erase(EngineNamespace& ns, std::span<const SegmentKey> keys) {
  for (const SegmentKey& key : keys) (void)ns.host_->Drop(key);
  for (size_t t = 0; t < chain_->size(); ++t) {
    Tier& tier = chain_->at(t);
    if (tier.remote()) continue;  // a peer's copy is its own
    // NotFound for keys a tier never had is expected; nothing to report.
    for (Status& s : tier.Evict(ns.tiers_.ns, keys)) s.PermitUncheckedError();
  }
}

}  // namespace tierkv::storage
