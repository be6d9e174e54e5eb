// ReadAndWait / WriteAndWait: the blocking forms of Tier::Read and Write.
#include "storage/tier/tier.h"

#include <memory>

#include "storage/tier/completion.h"

namespace tierkv::storage {

std::vector<Result<uint64_t>> ReadAndWait(Tier& tier, const TierNamespace& ns,
                                          uint64_t fingerprint,
                                          std::span<const TierReadItem> items) {
  auto c = std::make_shared<Completion<std::vector<Result<uint64_t>>>>();
  tier.Read(ns, fingerprint, items,
            [c](std::vector<Result<uint64_t>> r) { c->Set(std::move(r)); });
  return c->Wait();
}

std::vector<Status> WriteAndWait(Tier& tier, const TierNamespace& ns,
                                 uint64_t fingerprint,
                                 std::span<const TierWriteItem> items,
                                 Durability durability) {
  auto c = std::make_shared<Completion<std::vector<Status>>>();
  tier.Write(ns, fingerprint, items, durability,
             [c](std::vector<Status> r) { c->Set(std::move(r)); });
  return c->Wait();
}

}  // namespace tierkv::storage
