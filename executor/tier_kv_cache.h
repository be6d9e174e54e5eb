// TierKvCache: a KvCache whose pages live in pools registered with tierkvd,
// so a prompt's stored prefix is loaded from the daemon (host DRAM or NVMe)
// layer by layer instead of recomputed, and every full page computed here
// is stored for the next request.
//
// It is a client of libtierkv like any engine (no storage/ or daemon/ code):
//   * Rows are stored in the geometry's KV format (fp32, bf16 or fp8:
//     kv_format.h) in one memfd, mapped here and registered with the daemon
//     as one pool per (layer, part): slot p holds page p of the sequence,
//     so loads land in place and stores copy from there (no staging buffer
//     on either side). fp32 rows are read in place; bf16 and fp8 rows are
//     decoded once, on Write or when their layer's Load arrives.
//   * Pages are named by the prefix-hash chain of their token ids
//     (tierkv/page_hash.h), salted with the model's identity: two sequences
//     sharing a prompt prefix share its pages, two models never do.
//   * The layout registered with the daemon has a "kv" part (the latent
//     row) on every layer and an "index_k" part (the indexer key) on full
//     layers only: IndexShare layers store no indexer keys.
//   * AttachPrefix matches the prompt's full pages and issues one Load of
//     every layer; the daemon fills layer l before l + 1 and WaitForLayer(l)
//     waits for layer l alone, so layer l computes while later ones load.
//   * CommitTokens stores each newly full page with one Store of every
//     layer (dedup: a page the daemon has costs no copy).
//
// Failures never give wrong rows. A page that does not arrive (evicted
// meanwhile, failed checksum, IO error) makes WaitForLayer fail, and
// RecoverPrefix then keeps only the leading pages that arrived in every
// layer; the caller recomputes the rest. When the daemon cannot be reached
// (at Create, or later: a transport error), the cache works on as an
// in-process cache and says so once through `on_degraded`, unless
// `required` is set, in which case the error is returned.
//
// Thread safety: as KvCache (one thread).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "executor/kv_cache.h"
#include "tierkv/client.h"
#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv::executor {

struct TierKvCacheOptions {
  ClientOptions client;        // socket path, reply timeout
  std::string namespace_name;  // REQUIRES: non-empty
  std::string token;           // the namespace's token
  // Appended to every page hash: the model's identity (see ModelIdentity),
  // so KV of another checkpoint is never matched. Default: empty.
  std::string salt;
  // Return daemon failures instead of degrading to in-process. Default:
  // false.
  bool required = false;
  // Told once, with the reason, when the cache stops using the daemon.
  // Default: none.
  std::function<void(const Status&)> on_degraded;
};

// What the cache did with the daemon so far (counters only grow).
struct TierKvCacheStats {
  int64_t prefix_tokens_loaded = 0;  // tokens not prefilled thanks to tierkv
  int64_t pages_loaded = 0;          // per page, all layers
  int64_t pages_from_hbm = 0;        // the tier Match reported per loaded page
  int64_t pages_from_host = 0;
  int64_t pages_from_nvme = 0;
  int64_t pages_from_peer = 0;   // fetched from another node ([cluster])
  int64_t pages_recomputed = 0;  // matched but not arrived: recomputed
  int64_t pages_stored = 0;      // sent with Store (dedup included)
  // Of those, pages the daemon could not store (e.g. Busy: no DRAM even
  // after waiting for write-back); a later request recomputes them.
  int64_t pages_store_failed = 0;
  // Selection counts sent to tierkvd (ReportSelections), items.
  int64_t selections_reported = 0;
  uint64_t bytes_loaded = 0;
  uint64_t bytes_stored = 0;
  // Time WaitForLayer spent blocked on a Load: the part of the loads the
  // computation did not hide.
  double layer_wait_seconds = 0;
  // The Loads as the daemon timed them (TransferHandle::times): from
  // accepting each Load to its first layer in place, and to its last.
  // layer_wait_seconds / load_seconds is the share of the loads' time the
  // computation did not run over.
  double load_first_layer_seconds = 0;
  double load_seconds = 0;
  bool degraded = false;  // the daemon is no longer used
};

class TierKvCache final : public KvCache {
 public:
  // Connects, opens the namespace, registers the layout and the pools.
  // With options.required unset, an unreachable daemon gives a working
  // in-process cache (stats().degraded) and on_degraded is told;
  // otherwise Unavailable / PermissionDenied / InvalidArgument (the
  // namespace holds another layout) are returned.
  static Result<std::unique_ptr<TierKvCache>> Create(
      KvCacheGeometry geometry, const TierKvCacheOptions& options);
  ~TierKvCache() override;  // waits for transfers in flight

  Status Write(int64_t layer, KvPart part, int64_t first_token,
               std::span<const float> rows) override;
  Status Gather(int64_t layer, KvPart part, std::span<const int32_t> token_ids,
                std::span<float> out) const override;
  Result<std::span<const float>> PageView(int64_t layer, KvPart part,
                                          int64_t page) const override;
  int64_t num_tokens(int64_t layer, KvPart part) const override;
  Status Truncate(int64_t num_tokens) override;

  Status ReportSelections(std::span<const SelectionCount> counts) override;
  Status WaitForLayer(int64_t layer, int64_t num_tokens) override;
  Result<int64_t> AttachPrefix(std::span<const int32_t> prompt) override;
  Result<int64_t> RecoverPrefix(const Status& forward_error) override;
  Status CommitTokens(std::span<const int32_t> tokens) override;

  const TierKvCacheStats& stats() const { return stats_; }
  // The layout this cache registers for `geometry` (its format's row
  // sizes: e.g. 656 B "kv" and 132 B "index_k" per token for GLM-5 fp8).
  static LayoutSpec LayoutFor(const KvCacheGeometry& geometry);
  // The names this cache gives the full pages of `tokens` (a prefix-hash
  // chain from the namespace's root, salted with options.salt and the KV
  // format): what it Matches, Loads and Stores. A partial last page is
  // not named.
  static std::vector<PageHash> PageNames(const KvCacheGeometry& geometry,
                                         const TierKvCacheOptions& options,
                                         std::span<const int32_t> tokens);

 private:
  struct Region;  // one (layer, part) pool within the memfd
  TierKvCache(KvCacheGeometry geometry, TierKvCacheOptions options);
  Status Init();
  // Stops using the daemon after `why` (or returns it when required).
  Status Degrade(const Status& why);
  // Waits for every Store in flight (their slots are about to change).
  void WaitForStores();
  // Waits for `store` and counts its pages that were not stored; false
  // when the daemon is gone (the cache has degraded).
  bool CountStoreFailures(TransferHandle& store);
  // Waits for the attached prefix's whole Load and keeps its leading
  // pages that arrived in every layer; their token count.
  Result<int64_t> FinishLoad();
  const Region* FindRegion(int64_t layer, KvPart part) const;
  // The fp32 rows attention reads: [max tokens, dim].
  const float* Rows(const Region& r) const;
  // Decodes tokens of the first `pages` pages of `layer` from the pool into
  // the fp32 rows (nothing to do for fp32).
  void DecodeLoaded(int64_t layer, int64_t pages);
  Region* FindRegion(int64_t layer, KvPart part);
  std::vector<PageHash> HashPages(std::span<const int32_t> tokens) const;

  const TierKvCacheOptions options_;
  const int64_t max_pages_;
  std::unique_ptr<Client> client_;  // null once degraded
  int memfd_ = -1;
  std::byte* base_ = nullptr;
  uint64_t mapped_bytes_ = 0;
  std::vector<Region> regions_;   // [layer][part present]
  std::vector<PageHash> hashes_;  // of the sequence's full pages so far

  // The attached prefix's Load, until every layer has been waited for.
  TransferHandle load_;
  int64_t load_pages_ = 0;
  int64_t next_wait_layer_ = 0;  // layers below were waited for, all OK
  bool load_failed_ = false;
  Status load_error_;

  std::vector<TransferHandle> stores_;  // in flight
  int64_t stored_pages_ = 0;            // pages [0, this) are stored
  TierKvCacheStats stats_;
};

// A salt naming a model's weights for TierKvCacheOptions::salt: XXH3-128 of
// the config and of every weight tensor's bytes (so two random checkpoints
// of one preset and different seeds differ).
std::string ModelIdentity(const class Model& model);

}  // namespace tierkv::executor
