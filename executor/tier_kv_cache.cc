// TierKvCache: pages in daemon-registered pools (see tier_kv_cache.h).
#include "executor/tier_kv_cache.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/shared_mapping.h"
#include "executor/model.h"
#include "tierkv/page_hash.h"

namespace tierkv::executor {

namespace {

constexpr uint64_t kPageAlign = 4096;  // O_DIRECT loads land in place

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Transport failures: the daemon is gone or the connection broke. Other
// errors (a page NotFound) concern one request only.
bool IsTransportFailure(const Status& s) {
  return s.code() == StatusCode::kUnavailable ||
         s.code() == StatusCode::kIOError ||
         s.code() == StatusCode::kProtocolError ||
         s.code() == StatusCode::kShutdown;
}

void HashTensor(XXH3_state_t* state, const Tensor& t) {
  const int64_t rank = static_cast<int64_t>(t.shape.size());
  XXH3_128bits_update(state, &rank, sizeof(rank));
  XXH3_128bits_update(state, t.shape.data(), t.shape.size() * sizeof(int64_t));
  XXH3_128bits_update(state, t.ptr(), static_cast<size_t>(t.numel()) * 4);
}

}  // namespace

// Pool of (layer, part): max_pages slots of slot_bytes at `offset`, rows
// stored in `format`. Attention reads fp32 rows: the pool itself for fp32,
// else `decoded`, kept in step with the pool (Write decodes what it
// encodes; a Load's pages are decoded once their layer arrives).
struct TierKvCache::Region {
  int64_t layer = 0;
  KvPart part = KvPart::kLatent;
  uint8_t part_index = 0;  // in the layout's part list of the layer
  KvRowFormat format;
  uint64_t offset = 0;
  uint64_t slot_bytes = 0;
  int64_t num_tokens = 0;
  std::vector<float> decoded;  // [max tokens, dim]; empty for fp32
};

LayoutSpec TierKvCache::LayoutFor(const KvCacheGeometry& g) {
  LayoutSpec layout;
  layout.page_tokens = static_cast<uint32_t>(g.page_tokens);
  for (int64_t l = 0; l < g.num_layers; ++l) {
    LayerSpec spec;
    spec.parts.push_back(
        {"kv", static_cast<uint32_t>(g.Format(KvPart::kLatent).RowBytes())});
    if (g.has_index_keys[l]) {
      spec.parts.push_back(
          {"index_k",
           static_cast<uint32_t>(g.Format(KvPart::kIndexKey).RowBytes())});
    }
    layout.layers.push_back(std::move(spec));
  }
  return layout;
}

TierKvCache::TierKvCache(KvCacheGeometry geometry, TierKvCacheOptions options)
    : KvCache(std::move(geometry)),
      options_(std::move(options)),
      max_pages_(
          (this->geometry().max_tokens + this->geometry().page_tokens - 1) /
          this->geometry().page_tokens) {}

Result<std::unique_ptr<TierKvCache>> TierKvCache::Create(
    KvCacheGeometry geometry, const TierKvCacheOptions& options) {
  TIERKV_RETURN_IF_ERROR(geometry.Validate());
  if (options.namespace_name.empty()) {
    return Status::InvalidArgument("TierKvCache: namespace name is empty");
  }
  std::unique_ptr<TierKvCache> cache(
      new TierKvCache(std::move(geometry), options));
  TIERKV_RETURN_IF_ERROR(cache->Init());
  return cache;
}

Status TierKvCache::Init() {
  const KvCacheGeometry& g = geometry();
  // The pools, each slot 4 KiB aligned.
  uint64_t bytes = 0;
  for (int64_t l = 0; l < g.num_layers; ++l) {
    uint8_t index = 0;
    for (KvPart part : {KvPart::kLatent, KvPart::kIndexKey}) {
      if (part == KvPart::kIndexKey && !g.has_index_keys[l]) continue;
      Region r;
      r.layer = l;
      r.part = part;
      r.part_index = index++;
      r.format = g.Format(part);
      r.slot_bytes = static_cast<uint64_t>(g.page_tokens) * r.format.RowBytes();
      if (g.dtype != KvDtype::kF32) {
        r.decoded.resize(
            static_cast<size_t>(max_pages_ * g.page_tokens * g.RowDim(part)));
      }
      r.offset = bytes;
      bytes = AlignUp(bytes + r.slot_bytes * max_pages_, kPageAlign);
      regions_.push_back(r);
    }
  }
  memfd_ =
      ::memfd_create("tierkv-executor-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (memfd_ < 0 || ::ftruncate(memfd_, static_cast<off_t>(bytes)) != 0) {
    return Status::ResourceExhausted(
        fmt::format("TierKvCache: cannot create a {} B memfd: {}", bytes,
                    std::strerror(errno)));
  }
  // Every page is allocated now, as an engine allocates its KV pool up
  // front: the daemon's Loads then land in existing pages and take no
  // allocating page faults on the request's critical path (318 MB of fresh
  // pages cost the daemon ~0.2 s of faults and zeroing per request on this
  // VM, which it would spend while the layers load); and mapped as written
  // (common/shared_mapping.h), as the executor writes its KV.
  void* p = MapShared(memfd_, bytes, /*prefault=*/true);
  if (p == MAP_FAILED) {
    return Status::ResourceExhausted(fmt::format(
        "TierKvCache: cannot map {} B: {}", bytes, std::strerror(errno)));
  }
  base_ = static_cast<std::byte*>(p);
  mapped_bytes_ = bytes;

  auto client = Client::Connect(options_.client);
  if (!client.ok()) return Degrade(client.status());
  Status s = (*client)->OpenNamespace(options_.namespace_name, options_.token);
  if (s.ok()) {
    s = (*client)->RegisterLayout(LayoutFor(g));
    if (s.code() == StatusCode::kInvalidArgument) {
      s = Status::InvalidArgument(
          fmt::format("namespace '{}' holds KV of another layout: {}",
                      options_.namespace_name, s.message()));
    }
  }
  for (const Region& r : regions_) {
    if (!s.ok()) break;
    s = (*client)->RegisterPool(
        {.fd = memfd_,
         .offset = r.offset,
         .slot_bytes = r.slot_bytes,
         .slot_count = static_cast<uint32_t>(max_pages_),
         .layer = static_cast<uint16_t>(r.layer),
         .part = r.part_index});
  }
  if (!s.ok()) {
    // A wrong token or layout is a configuration error, never degraded.
    if (!IsTransportFailure(s) || options_.required) return s;
    return Degrade(s);
  }
  client_ = std::move(client).value();
  return Status::OK();
}

TierKvCache::~TierKvCache() {
  // Handles wait for the daemon to finish with the pools before unmapping.
  load_ = TransferHandle();
  stores_.clear();
  client_.reset();
  if (base_) ::munmap(base_, mapped_bytes_);
  if (memfd_ >= 0) ::close(memfd_);
}

Status TierKvCache::Degrade(const Status& why) {
  if (options_.required) return why;
  if (!stats_.degraded) {
    stats_.degraded = true;
    if (options_.on_degraded) options_.on_degraded(why);
  }
  load_ = TransferHandle();
  stores_.clear();
  client_.reset();
  return Status::OK();
}

const TierKvCache::Region* TierKvCache::FindRegion(int64_t layer,
                                                   KvPart part) const {
  for (const Region& r : regions_) {
    if (r.layer == layer && r.part == part) return &r;
  }
  return nullptr;
}

TierKvCache::Region* TierKvCache::FindRegion(int64_t layer, KvPart part) {
  return const_cast<Region*>(std::as_const(*this).FindRegion(layer, part));
}

const float* TierKvCache::Rows(const Region& r) const {
  return r.decoded.empty() ? reinterpret_cast<const float*>(base_ + r.offset)
                           : r.decoded.data();
}

void TierKvCache::DecodeLoaded(int64_t layer, int64_t pages) {
  const int64_t tokens = pages * geometry().page_tokens;
  for (Region& r : regions_) {
    if (r.layer != layer || r.decoded.empty()) continue;
    const size_t row_bytes = r.format.RowBytes();
    const int64_t dim = r.format.dim;
    for (int64_t t = 0; t < tokens; ++t) {
      r.format.Decode({base_ + r.offset + t * row_bytes, row_bytes},
                      {r.decoded.data() + t * dim, static_cast<size_t>(dim)});
    }
  }
}

Status TierKvCache::Write(int64_t layer, KvPart part, int64_t first_token,
                          std::span<const float> rows) {
  TIERKV_RETURN_IF_ERROR(CheckPart(layer, part));
  Region& r = *FindRegion(layer, part);
  auto rows_n = CheckWrite(layer, part, first_token, rows.size(), r.num_tokens);
  if (!rows_n.ok()) return rows_n.status();
  const int64_t n = *rows_n;
  const KvCacheGeometry& g = geometry();
  const int64_t dim = g.RowDim(part);
  if (first_token < stored_pages_ * g.page_tokens) {
    // Rewriting a stored page (a recompute): its Store must be done.
    WaitForStores();
  }
  // Slots are consecutive within a region, so rows are contiguous.
  const size_t row_bytes = r.format.RowBytes();
  std::byte* stored = base_ + r.offset + first_token * row_bytes;
  if (r.decoded.empty()) {
    std::memcpy(stored, rows.data(), rows.size() * 4);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const auto row =
          rows.subspan(static_cast<size_t>(i * dim), static_cast<size_t>(dim));
      const std::span<std::byte> bytes(stored + i * row_bytes, row_bytes);
      r.format.Encode(row, bytes);
      r.format.Decode(bytes, {r.decoded.data() + (first_token + i) * dim,
                              static_cast<size_t>(dim)});
    }
  }
  r.num_tokens = std::max(r.num_tokens, first_token + n);
  return Status::OK();
}

Status TierKvCache::Gather(int64_t layer, KvPart part,
                           std::span<const int32_t> token_ids,
                           std::span<float> out) const {
  TIERKV_RETURN_IF_ERROR(CheckPart(layer, part));
  const int64_t dim = geometry().RowDim(part);
  if (out.size() != token_ids.size() * static_cast<size_t>(dim)) {
    return Status::InvalidArgument("KvCache::Gather: output size mismatch");
  }
  const Region& r = *FindRegion(layer, part);
  const float* rows = Rows(r);  // [max_tokens, dim]
  for (size_t i = 0; i < token_ids.size(); ++i) {
    const int64_t t = token_ids[i];
    if (t < 0 || t >= r.num_tokens) {
      return Status::InvalidArgument(fmt::format(
          "KvCache::Gather: token {} not written in layer {} ({} tokens)", t,
          layer, r.num_tokens));
    }
    std::memcpy(out.data() + i * dim, rows + t * dim,
                static_cast<size_t>(dim) * 4);
  }
  return Status::OK();
}

Result<std::span<const float>> TierKvCache::PageView(int64_t layer, KvPart part,
                                                     int64_t page) const {
  TIERKV_RETURN_IF_ERROR(CheckPart(layer, part));
  const KvCacheGeometry& g = geometry();
  const Region& r = *FindRegion(layer, part);
  if (page < 0 || page * g.page_tokens >= r.num_tokens) {
    return Status::InvalidArgument(
        fmt::format("KvCache::PageView: page {} of layer {} was never written",
                    page, layer));
  }
  const size_t page_floats =
      static_cast<size_t>(g.page_tokens * g.RowDim(part));
  return std::span<const float>(Rows(r) + page * page_floats, page_floats);
}

int64_t TierKvCache::num_tokens(int64_t layer, KvPart part) const {
  if (!CheckPart(layer, part).ok()) return 0;
  return FindRegion(layer, part)->num_tokens;
}

Status TierKvCache::Truncate(int64_t num_tokens) {
  if (num_tokens < 0) {
    return Status::InvalidArgument("KvCache::Truncate: negative length");
  }
  if (load_pages_ > 0 && next_wait_layer_ < geometry().num_layers) {
    // A Load still in flight must be done with the slots before they are
    // written again, and its pages checked before anyone reads them: the
    // ones that did not arrive go too.
    TIERKV_RETURN_IF_ERROR(FinishLoad().status());
    load_failed_ = false;
    load_error_ = Status::OK();
  }
  const int64_t keep_pages = num_tokens / geometry().page_tokens;
  load_pages_ = std::min(load_pages_, keep_pages);
  if (keep_pages < stored_pages_) {
    WaitForStores();
    stored_pages_ = keep_pages;
  }
  hashes_.resize(std::min<size_t>(hashes_.size(), keep_pages));
  for (Region& r : regions_) r.num_tokens = std::min(r.num_tokens, num_tokens);
  return Status::OK();
}

std::vector<PageHash> TierKvCache::PageNames(const KvCacheGeometry& geometry,
                                             const TierKvCacheOptions& options,
                                             std::span<const int32_t> tokens) {
  static_assert(sizeof(int32_t) == sizeof(uint32_t));
  const std::span<const uint32_t> ids(
      reinterpret_cast<const uint32_t*>(tokens.data()), tokens.size());
  // The format is part of a page's name: rows of another --kv-dtype are
  // other bytes (and another layout, which the daemon refuses anyway).
  const std::string salted =
      options.salt + "/kv:" + std::string(KvDtypeName(geometry.dtype));
  const auto salt = std::as_bytes(std::span(salted));
  return PageHashChain(RootPageHash(options.namespace_name), ids,
                       static_cast<uint32_t>(geometry.page_tokens), salt);
}

std::vector<PageHash> TierKvCache::HashPages(
    std::span<const int32_t> tokens) const {
  return PageNames(geometry(), options_, tokens);
}

Result<int64_t> TierKvCache::AttachPrefix(std::span<const int32_t> prompt) {
  for (const Region& r : regions_) {
    if (r.num_tokens != 0) {
      return Status::InvalidArgument(
          "TierKvCache::AttachPrefix: the cache is not empty");
    }
  }
  WaitForStores();  // the slots are about to be loaded into
  load_ = TransferHandle();
  load_pages_ = 0;
  next_wait_layer_ = 0;
  load_failed_ = false;
  load_error_ = Status::OK();
  stored_pages_ = 0;
  hashes_.clear();
  if (!client_ || prompt.size() < 2) return int64_t{0};
  const int64_t page_tokens = geometry().page_tokens;
  // The last prompt token is always computed: its logits are the output.
  const int64_t usable =
      std::min<int64_t>(static_cast<int64_t>(prompt.size()) - 1,
                        max_pages_ * page_tokens) /
      page_tokens;
  if (usable == 0) return int64_t{0};
  std::vector<PageHash> pages =
      HashPages(prompt.first(static_cast<size_t>(usable * page_tokens)));
  auto match = client_->Match(pages);
  if (!match.ok()) {
    TIERKV_RETURN_IF_ERROR(Degrade(match.status()));
    return int64_t{0};
  }
  const int64_t hit = match->leading_pages;
  if (hit == 0) return int64_t{0};
  pages.resize(static_cast<size_t>(hit));
  std::vector<uint32_t> slots(static_cast<size_t>(hit));
  for (int64_t p = 0; p < hit; ++p) slots[p] = static_cast<uint32_t>(p);
  auto load = client_->Load(pages, slots);
  if (!load.ok()) {
    if (IsTransportFailure(load.status())) {
      TIERKV_RETURN_IF_ERROR(Degrade(load.status()));
    }
    return int64_t{0};  // e.g. Busy: prefill it all
  }
  load_ = std::move(load).value();
  load_pages_ = hit;
  stored_pages_ = hit;  // they are in the daemon already
  hashes_ = std::move(pages);
  for (int64_t p = 0; p < hit; ++p) {
    switch (match->tiers[p]) {
      case Tier::kHbm:
        stats_.pages_from_hbm++;
        break;
      case Tier::kHost:
        stats_.pages_from_host++;
        break;
      case Tier::kPeer:
        stats_.pages_from_peer++;
        break;
      default:
        stats_.pages_from_nvme++;
        break;
    }
  }
  const int64_t tokens = hit * page_tokens;
  for (Region& r : regions_) r.num_tokens = tokens;
  stats_.prefix_tokens_loaded += tokens;
  stats_.pages_loaded += hit;
  for (const Region& r : regions_) {
    stats_.bytes_loaded += r.slot_bytes * static_cast<uint64_t>(hit);
  }
  return tokens;
}

Status TierKvCache::WaitForLayer(int64_t layer, int64_t num_tokens) {
  (void)num_tokens;  // the Load covers every attached token
  if (load_pages_ == 0 || layer < next_wait_layer_) return Status::OK();
  if (load_failed_) return load_error_;
  for (; next_wait_layer_ <= layer; ++next_wait_layer_) {
    const auto wait_start = std::chrono::steady_clock::now();
    auto pages = load_.WaitLayer(static_cast<uint16_t>(next_wait_layer_));
    stats_.layer_wait_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                      wait_start)
            .count();
    Status failed;
    if (!pages.ok()) {
      failed = pages.status();
    } else {
      for (size_t p = 0; p < pages->size(); ++p) {
        if (!(*pages)[p].ok()) {
          failed =
              Status((*pages)[p].code(),
                     fmt::format("tierkv: page {} of layer {} did not "
                                 "load: {}",
                                 p, next_wait_layer_, (*pages)[p].message()));
          break;
        }
      }
    }
    if (!failed.ok()) {
      load_failed_ = true;
      load_error_ = failed;
      return failed;
    }
    DecodeLoaded(next_wait_layer_, load_pages_);
  }
  if (next_wait_layer_ == geometry().num_layers) {
    if (auto t = load_.times()) {
      using Seconds = std::chrono::duration<double>;
      stats_.load_first_layer_seconds +=
          Seconds(t->first_layer - t->accepted).count();
      stats_.load_seconds += Seconds(t->last_layer - t->accepted).count();
    }
    load_ = TransferHandle();  // every layer is in place
  }
  return Status::OK();
}

Result<int64_t> TierKvCache::RecoverPrefix(const Status& forward_error) {
  if (!load_failed_) return forward_error;
  auto tokens = FinishLoad();
  if (!tokens.ok()) return tokens.status();
  load_failed_ = false;
  load_error_ = Status::OK();
  return tokens;
}

Result<int64_t> TierKvCache::FinishLoad() {
  // The pages that arrived in every layer: the first failure of each page
  // over the whole transfer.
  int64_t intact = 0;
  Status transport;
  auto all = load_.Wait();
  if (!all.ok()) {
    transport = all.status();
  } else {
    while (intact < static_cast<int64_t>(all->size()) && (*all)[intact].ok()) {
      ++intact;
    }
  }
  load_ = TransferHandle();
  if (!transport.ok() && IsTransportFailure(transport)) {
    TIERKV_RETURN_IF_ERROR(Degrade(transport));
  }
  // Layers not waited for yet arrived meanwhile (for the intact pages).
  for (int64_t l = next_wait_layer_; l < geometry().num_layers; ++l) {
    DecodeLoaded(l, intact);
  }
  if (intact == load_pages_) {
    next_wait_layer_ = geometry().num_layers;  // every page is in place
    return load_pages_ * geometry().page_tokens;
  }
  stats_.pages_recomputed += load_pages_ - intact;
  stats_.prefix_tokens_loaded -=
      (load_pages_ - intact) * geometry().page_tokens;
  stats_.pages_loaded -= load_pages_ - intact;
  load_pages_ = intact;
  next_wait_layer_ = geometry().num_layers;  // what is left is in place
  const int64_t tokens = intact * geometry().page_tokens;
  stored_pages_ = std::min(stored_pages_, intact);
  hashes_.resize(static_cast<size_t>(intact));
  for (Region& r : regions_) r.num_tokens = std::min(r.num_tokens, tokens);
  return tokens;
}

Status TierKvCache::CommitTokens(std::span<const int32_t> tokens) {
  if (!client_) return Status::OK();
  const int64_t page_tokens = geometry().page_tokens;
  int64_t written = static_cast<int64_t>(tokens.size());
  for (const Region& r : regions_) written = std::min(written, r.num_tokens);
  const int64_t full = written / page_tokens;
  if (full <= stored_pages_) return Status::OK();
  if (static_cast<int64_t>(hashes_.size()) < full) {
    hashes_ = HashPages(tokens.first(static_cast<size_t>(full * page_tokens)));
  }
  // Reap finished stores (their errors are not fatal: a page that did not
  // store is just recomputed by the next request that wants it).
  std::erase_if(stores_, [&](TransferHandle& h) {
    if (h.LayersDone() != geometry().num_layers) return false;
    CountStoreFailures(h);  // done: does not block
    return true;
  });
  std::vector<PageHash> pages(hashes_.begin() + stored_pages_,
                              hashes_.begin() + full);
  std::vector<uint32_t> slots;
  for (int64_t p = stored_pages_; p < full; ++p) {
    slots.push_back(static_cast<uint32_t>(p));
  }
  auto store = client_->Store(pages, slots);
  if (!store.ok()) {
    if (IsTransportFailure(store.status())) return Degrade(store.status());
    return Status::OK();  // e.g. Busy: these pages stay unstored
  }
  stores_.push_back(std::move(store).value());
  stats_.pages_stored += full - stored_pages_;
  for (const Region& r : regions_) {
    stats_.bytes_stored +=
        r.slot_bytes * static_cast<uint64_t>(full - stored_pages_);
  }
  stored_pages_ = full;
  return Status::OK();
}

Status TierKvCache::ReportSelections(std::span<const SelectionCount> counts) {
  if (!client_) return Status::OK();
  std::vector<SelectionReport> reports;
  reports.reserve(counts.size());
  for (const SelectionCount& c : counts) {
    // Only pages the daemon was given have a name there.
    if (static_cast<int64_t>(c.page) >= stored_pages_) continue;
    reports.push_back({hashes_[c.page], c.layer, c.count});
  }
  if (reports.empty()) return Status::OK();
  if (Status s = client_->ReportTopk(reports); !s.ok()) {
    if (IsTransportFailure(s)) return Degrade(s);
    return s;
  }
  stats_.selections_reported += static_cast<int64_t>(reports.size());
  return Status::OK();
}

void TierKvCache::WaitForStores() {
  for (TransferHandle& h : stores_) {
    if (!CountStoreFailures(h)) {
      // Nothing to return to: the next call that needs the daemon fails.
      break;
    }
  }
  stores_.clear();
}

bool TierKvCache::CountStoreFailures(TransferHandle& store) {
  auto done = store.Wait();
  if (!done.ok()) {
    if (IsTransportFailure(done.status())) {
      (void)Degrade(done.status());
      return false;
    }
    return true;
  }
  for (const Status& page : *done) stats_.pages_store_failed += !page.ok();
  return true;
}

std::string ModelIdentity(const Model& model) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  const std::string config = ModelConfigToJson(model.config()).dump();
  XXH3_128bits_update(&state, config.data(), config.size());
  const ModelWeights& w = model.weights();
  HashTensor(&state, w.embed_tokens);
  for (const LayerWeights& l : w.layers) {
    for (const Tensor* t :
         {&l.input_layernorm, &l.post_attention_layernorm, &l.attn.q_a_proj,
          &l.attn.q_a_layernorm, &l.attn.q_b_proj, &l.attn.kv_a_proj,
          &l.attn.kv_a_layernorm, &l.attn.kv_b_proj, &l.attn.o_proj}) {
      HashTensor(&state, *t);
    }
    if (l.attn.indexer) {
      const IndexerWeights& i = *l.attn.indexer;
      for (const Tensor* t : {&i.wq_b, &i.wk, &i.k_norm_weight, &i.k_norm_bias,
                              &i.weights_proj}) {
        HashTensor(&state, *t);
      }
    }
    auto mlp = [&](const MlpWeights& m) {
      HashTensor(&state, m.gate_proj);
      HashTensor(&state, m.up_proj);
      HashTensor(&state, m.down_proj);
    };
    if (l.dense_mlp) mlp(*l.dense_mlp);
    if (l.moe) {
      HashTensor(&state, l.moe->gate);
      HashTensor(&state, l.moe->e_score_correction_bias);
      for (const MlpWeights& e : l.moe->experts) mlp(e);
      if (l.moe->shared_experts) mlp(*l.moe->shared_experts);
    }
  }
  HashTensor(&state, w.norm);
  HashTensor(&state, w.lm_head);
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return fmt::format("model:{:016x}{:016x}", h.high64, h.low64);
}

}  // namespace tierkv::executor
