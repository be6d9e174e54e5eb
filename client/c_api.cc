// The C API (include/tierkv/c_api.h): non-throwing wrappers of
// tierkv::Client. All semantics live in the C++ client; this file only
// checks pointers, converts struct-of-arrays arguments and reports errors
// through a thread-local message.
#include "tierkv/c_api.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "client/weights_json.h"
#include "tierkv/client.h"
#include "tierkv/page_hash.h"

using tierkv::Client;
using tierkv::PageHash;
using tierkv::SegmentKey;
using tierkv::Status;
using tierkv::StatusCode;

// Handles own a shared reference to the Client, so a lease or transfer
// outlives tierkv_client_close (Client's REQUIRES: it outlives them).
struct tierkv_client {
  std::shared_ptr<Client> client;
};
struct tierkv_read_lease {
  std::shared_ptr<Client> owner;  // destroyed after `lease` (declared first)
  tierkv::ReadLease lease;
  bool released = false;
};
struct tierkv_transfer {
  std::shared_ptr<Client> owner;
  tierkv::TransferHandle handle;
  size_t pages = 0;
};
struct tierkv_weights_load {
  std::shared_ptr<Client> owner;  // destroyed after `load` (declared first)
  tierkv::WeightsLoad load;
  tierkv::PageHash version;  // of the manifest being loaded
};

namespace {

static_assert(sizeof(tierkv_page_hash) == sizeof(PageHash));
static_assert(offsetof(tierkv_page_hash, lo) == offsetof(PageHash, lo));
static_assert(offsetof(tierkv_page_hash, hi) == offsetof(PageHash, hi));
static_assert(TIERKV_UNAVAILABLE == static_cast<int>(StatusCode::kUnavailable));

thread_local std::string last_error;

tierkv_status Report(const Status& status) {
  if (status.ok()) return TIERKV_OK;
  last_error = status.ToString();
  return static_cast<tierkv_status>(status.code());
}

tierkv_status InvalidArgument(const char* what) {
  return Report(Status::InvalidArgument(what));
}

// Runs `body`, turning an escaping exception (std::bad_alloc from a vector
// of a hostile size, say) into an error instead of unwinding into C.
template <typename Body>
tierkv_status Guarded(Body&& body) noexcept {
  try {
    last_error.clear();
    return body();
  } catch (const std::bad_alloc&) {
    return Report(Status::ResourceExhausted("out of memory in the client"));
  } catch (const std::exception& e) {
    return Report(Status::Internal(e.what()));
  } catch (...) {
    return Report(Status::Internal("unknown exception in the client"));
  }
}

std::span<const PageHash> Pages(const tierkv_page_hash* pages, size_t n) {
  return {reinterpret_cast<const PageHash*>(pages), n};
}

std::vector<SegmentKey> Keys(const tierkv_page_hash* pages,
                             const uint16_t* layers, const uint8_t* parts,
                             size_t n) {
  std::vector<SegmentKey> keys(n);
  for (size_t i = 0; i < n; ++i) {
    keys[i] = {PageHash{pages[i].lo, pages[i].hi}, layers[i], parts[i]};
  }
  return keys;
}

// Writes one code per item and returns the first failure (or OK).
tierkv_status ReportEach(const std::vector<Status>& statuses, uint8_t* out) {
  const Status* first_failure = nullptr;
  for (size_t i = 0; i < statuses.size(); ++i) {
    out[i] = static_cast<uint8_t>(statuses[i].code());
    if (!statuses[i].ok() && first_failure == nullptr) {
      first_failure = &statuses[i];
    }
  }
  return first_failure ? Report(*first_failure) : TIERKV_OK;
}

tierkv_status CopyString(const std::string& s, char* buf, size_t cap,
                         size_t* len) {
  if (len == nullptr) return InvalidArgument("len must not be NULL");
  *len = s.size();
  if (buf != nullptr && cap > 0) {
    const size_t n = std::min(s.size(), cap - 1);
    std::memcpy(buf, s.data(), n);
    buf[n] = '\0';
  }
  return TIERKV_OK;
}

bool MissingArrays(size_t n, std::initializer_list<const void*> arrays) {
  if (n == 0) return false;
  return std::any_of(arrays.begin(), arrays.end(),
                     [](const void* p) { return p == nullptr; });
}

constexpr char kNullClient[] = "client is NULL (closed?)";
constexpr char kNullArrays[] = "an item array is NULL";

}  // namespace

namespace {

tierkv::WeightsId WeightsIdOf(const char* model, const char* layout,
                              const tierkv_page_hash* version) {
  return {.model = model ? model : "",
          .layout = layout ? layout : "",
          .version = version ? PageHash{version->lo, version->hi} : PageHash{}};
}

void FillStored(const tierkv::WeightsManifest& m,
                const tierkv::WeightsPutStats& stats,
                tierkv_weights_stored* out) {
  if (out == nullptr) return;
  const PageHash version = tierkv::WeightsVersionOf(m);
  *out = {.version = {version.lo, version.hi},
          .image_bytes = m.image_bytes,
          .num_layers = m.num_layers,
          .tensors = static_cast<uint32_t>(m.tensors.size()),
          .chunks = static_cast<uint32_t>(m.chunks.size()),
          .chunks_stored = stats.chunks_stored,
          .chunks_deduplicated = stats.chunks_deduplicated,
          .bytes_stored = stats.bytes_stored,
          .bytes_deduplicated = stats.bytes_deduplicated};
}

constexpr char kNullModel[] = "model and layout must not be NULL";

}  // namespace

extern "C" {

uint32_t tierkv_abi_version(void) { return TIERKV_C_ABI_VERSION; }

const char* tierkv_last_error(void) { return last_error.c_str(); }

const char* tierkv_status_name(tierkv_status status) {
  if (!tierkv::IsKnownStatusCode(static_cast<uint8_t>(status))) {
    return "unknown";
  }
  // StatusCodeName returns views of string literals: NUL-terminated.
  return tierkv::StatusCodeName(static_cast<StatusCode>(status)).data();
}

tierkv_status tierkv_root_page_hash(const char* namespace_name,
                                    tierkv_page_hash* out) {
  return Guarded([&] {
    if (namespace_name == nullptr || out == nullptr) {
      return InvalidArgument("namespace_name and out must not be NULL");
    }
    const PageHash root = tierkv::RootPageHash(namespace_name);
    *out = {root.lo, root.hi};
    return TIERKV_OK;
  });
}

tierkv_status tierkv_page_hash_chain(const tierkv_page_hash* root,
                                     const uint32_t* tokens, size_t n_tokens,
                                     uint32_t page_tokens, const void* salt,
                                     size_t salt_len, tierkv_page_hash* out,
                                     size_t out_cap, size_t* n_out) {
  return Guarded([&] {
    if (root == nullptr || n_out == nullptr ||
        MissingArrays(n_tokens, {tokens}) || (salt_len > 0 && !salt)) {
      return InvalidArgument("root, tokens, salt and n_out must not be NULL");
    }
    if (page_tokens == 0) return InvalidArgument("page_tokens must be > 0");
    const size_t pages = n_tokens / page_tokens;
    *n_out = pages;
    if (pages > out_cap || (pages > 0 && out == nullptr)) {
      return InvalidArgument("out holds fewer hashes than there are pages");
    }
    const auto chain = tierkv::PageHashChain(
        {root->lo, root->hi}, {tokens, n_tokens}, page_tokens,
        {static_cast<const std::byte*>(salt), salt_len});
    for (size_t i = 0; i < pages; ++i) out[i] = {chain[i].lo, chain[i].hi};
    return TIERKV_OK;
  });
}

tierkv_status tierkv_client_connect(const tierkv_client_options* options,
                                    tierkv_client** out) {
  return Guarded([&] {
    if (out == nullptr) return InvalidArgument("out must not be NULL");
    *out = nullptr;
    tierkv::ClientOptions opts;
    if (options != nullptr) {
      if (options->socket_path != nullptr) {
        opts.socket_path = options->socket_path;
      }
      if (options->timeout_ms > 0) {
        opts.timeout = std::chrono::milliseconds(options->timeout_ms);
      }
      if (options->prefault_arena >= 0) {
        opts.prefault_arena = options->prefault_arena > 0;
      }
      if (options->max_transfers_in_flight > 0) {
        opts.max_transfers_in_flight = options->max_transfers_in_flight;
      }
    }
    auto client = Client::Connect(opts);
    if (!client.ok()) return Report(client.status());
    *out = new tierkv_client{std::shared_ptr<Client>(std::move(*client))};
    return TIERKV_OK;
  });
}

void tierkv_client_close(tierkv_client* client) { delete client; }

tierkv_status tierkv_open_namespace(tierkv_client* client, const char* name,
                                    const char* token) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    if (name == nullptr || token == nullptr) {
      return InvalidArgument("name and token must not be NULL");
    }
    return Report(client->client->OpenNamespace(name, token));
  });
}

tierkv_status tierkv_register_layout(tierkv_client* client,
                                     uint32_t page_tokens, uint32_t num_layers,
                                     const uint32_t* parts_per_layer,
                                     const char* const* part_names,
                                     const uint32_t* bytes_per_token) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    if (MissingArrays(num_layers,
                      {parts_per_layer, part_names, bytes_per_token})) {
      return InvalidArgument(kNullArrays);
    }
    tierkv::LayoutSpec layout;
    layout.page_tokens = page_tokens;
    layout.layers.resize(num_layers);
    size_t next = 0;
    for (uint32_t l = 0; l < num_layers; ++l) {
      if (parts_per_layer[l] > 255) {
        return InvalidArgument("a layer has more than 255 parts");
      }
      for (uint32_t p = 0; p < parts_per_layer[l]; ++p, ++next) {
        if (part_names[next] == nullptr) {
          return InvalidArgument("a part name is NULL");
        }
        layout.layers[l].parts.push_back(
            {part_names[next], bytes_per_token[next]});
      }
    }
    return Report(client->client->RegisterLayout(layout));
  });
}

tierkv_status tierkv_layout_json(tierkv_client* client, char* buf, size_t cap,
                                 size_t* len) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    const auto layout = client->client->layout();
    if (!layout) {
      return Report(Status::NotFound("the namespace has no layout yet"));
    }
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& layer : layout->layers) {
      nlohmann::json parts = nlohmann::json::array();
      for (const auto& part : layer.parts) {
        parts.push_back({part.name, part.bytes_per_token});
      }
      layers.push_back(std::move(parts));
    }
    const nlohmann::json j = {{"page_tokens", layout->page_tokens},
                              {"layers", std::move(layers)}};
    return CopyString(j.dump(), buf, cap, len);
  });
}

tierkv_status tierkv_match(tierkv_client* client, const tierkv_page_hash* pages,
                           size_t n, uint32_t* leading_pages, uint8_t* tiers) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    if (leading_pages == nullptr || MissingArrays(n, {pages})) {
      return InvalidArgument("pages and leading_pages must not be NULL");
    }
    auto match = client->client->Match(Pages(pages, n));
    if (!match.ok()) return Report(match.status());
    *leading_pages = match->leading_pages;
    if (tiers != nullptr) {
      for (size_t i = 0; i < n; ++i) {
        tiers[i] = static_cast<uint8_t>(
            i < match->tiers.size() ? match->tiers[i] : tierkv::Tier::kMiss);
      }
    }
    return TIERKV_OK;
  });
}

tierkv_status tierkv_put(tierkv_client* client, const tierkv_page_hash* pages,
                         const uint16_t* layers, const uint8_t* parts,
                         const void* const* data, const uint64_t* sizes,
                         size_t n, uint8_t* statuses, uint8_t* already_stored) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    if (MissingArrays(n, {pages, layers, parts, data, sizes, statuses})) {
      return InvalidArgument(kNullArrays);
    }
    const auto keys = Keys(pages, layers, parts, n);
    std::vector<tierkv::SegmentWrite> writes(n);
    for (size_t i = 0; i < n; ++i) {
      if (data[i] == nullptr && sizes[i] > 0) {
        return InvalidArgument("a data pointer is NULL");
      }
      writes[i] = {keys[i],
                   {static_cast<const std::byte*>(data[i]),
                    static_cast<size_t>(sizes[i])}};
    }
    const auto results = client->client->Put(writes);
    std::vector<Status> each(n);
    for (size_t i = 0; i < n; ++i) {
      each[i] = results[i].status;
      if (already_stored != nullptr) {
        already_stored[i] = results[i].already_stored ? 1 : 0;
      }
    }
    return ReportEach(each, statuses);
  });
}

tierkv_status tierkv_get(tierkv_client* client, const tierkv_page_hash* pages,
                         const uint16_t* layers, const uint8_t* parts,
                         void* const* dst, const uint64_t* sizes, size_t n,
                         uint8_t* statuses) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    if (MissingArrays(n, {pages, layers, parts, dst, sizes, statuses})) {
      return InvalidArgument(kNullArrays);
    }
    const auto keys = Keys(pages, layers, parts, n);
    std::vector<tierkv::SegmentRead> reads(n);
    for (size_t i = 0; i < n; ++i) {
      if (dst[i] == nullptr && sizes[i] > 0) {
        return InvalidArgument("a destination pointer is NULL");
      }
      reads[i] = {
          keys[i],
          {static_cast<std::byte*>(dst[i]), static_cast<size_t>(sizes[i])}};
    }
    return ReportEach(client->client->Get(reads), statuses);
  });
}

tierkv_status tierkv_flush(tierkv_client* client, const tierkv_page_hash* pages,
                           const uint16_t* layers, const uint8_t* parts,
                           size_t n, uint8_t* statuses) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    if (MissingArrays(n, {pages, layers, parts, statuses})) {
      return InvalidArgument(kNullArrays);
    }
    const auto keys = Keys(pages, layers, parts, n);
    return ReportEach(client->client->Flush(keys), statuses);
  });
}

tierkv_status tierkv_acquire(tierkv_client* client,
                             const tierkv_page_hash* pages,
                             const uint16_t* layers, const uint8_t* parts,
                             size_t n, tierkv_read_lease** out) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    if (out == nullptr || MissingArrays(n, {pages, layers, parts})) {
      return InvalidArgument(kNullArrays);
    }
    *out = nullptr;
    auto lease = client->client->Acquire(Keys(pages, layers, parts, n));
    if (!lease.ok()) return Report(lease.status());
    *out = new tierkv_read_lease{client->client, std::move(*lease)};
    return TIERKV_OK;
  });
}

tierkv_status tierkv_read_lease_item(const tierkv_read_lease* lease, size_t i,
                                     const void** data, uint64_t* size) {
  return Guarded([&] {
    if (lease == nullptr || data == nullptr || size == nullptr) {
      return InvalidArgument("lease, data and size must not be NULL");
    }
    if (i >= lease->lease.size()) {
      return InvalidArgument("item index past the lease's keys");
    }
    const auto bytes = lease->lease.data(i);
    *data = bytes.empty() ? nullptr : bytes.data();
    *size = bytes.size();
    return Report(lease->lease.statuses()[i]);
  });
}

tierkv_status tierkv_read_lease_release(tierkv_read_lease* lease) {
  return Guarded([&] {
    if (lease == nullptr) return InvalidArgument("lease is NULL");
    if (!lease->released) {
      lease->released = true;
      Status s = lease->lease.Release();
      // NotFound: the TTL expired first; the lease is gone either way.
      if (!s.ok() && !s.IsNotFound()) return Report(s);
    }
    return TIERKV_OK;
  });
}

void tierkv_read_lease_free(tierkv_read_lease* lease) { delete lease; }

tierkv_status tierkv_register_pool(tierkv_client* client, int fd,
                                   uint64_t offset, uint64_t slot_bytes,
                                   uint32_t slot_count, uint16_t layer,
                                   uint8_t part) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    tierkv::PoolSpec spec;
    spec.fd = fd;
    spec.offset = offset;
    spec.slot_bytes = slot_bytes;
    spec.slot_count = slot_count;
    spec.layer = layer;
    spec.part = part;
    return Report(client->client->RegisterPool(spec));
  });
}

namespace {
tierkv_status StartTransfer(bool load, tierkv_client* client,
                            const tierkv_page_hash* pages,
                            const uint32_t* slots, size_t n,
                            uint16_t first_layer, uint16_t layer_count,
                            tierkv_transfer** out) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    if (out == nullptr || MissingArrays(n, {pages, slots})) {
      return InvalidArgument(kNullArrays);
    }
    *out = nullptr;
    const std::span<const uint32_t> slot_span(slots, n);
    const tierkv::LayerRange range{first_layer, layer_count};
    auto handle =
        load ? client->client->Load(Pages(pages, n), slot_span, range)
             : client->client->Store(Pages(pages, n), slot_span, range);
    if (!handle.ok()) return Report(handle.status());
    *out = new tierkv_transfer{client->client, std::move(*handle), n};
    return TIERKV_OK;
  });
}

tierkv_status ReportTransfer(const tierkv::Result<std::vector<Status>>& r,
                             size_t pages, uint8_t* statuses) {
  if (!r.ok()) return Report(r.status());
  std::vector<uint8_t> scratch;
  if (statuses == nullptr) {
    scratch.resize(pages);
    statuses = scratch.data();
  }
  return ReportEach(*r, statuses);
}
}  // namespace

tierkv_status tierkv_load(tierkv_client* client, const tierkv_page_hash* pages,
                          const uint32_t* slots, size_t n, uint16_t first_layer,
                          uint16_t layer_count, tierkv_transfer** out) {
  return StartTransfer(true, client, pages, slots, n, first_layer, layer_count,
                       out);
}

tierkv_status tierkv_store(tierkv_client* client, const tierkv_page_hash* pages,
                           const uint32_t* slots, size_t n,
                           uint16_t first_layer, uint16_t layer_count,
                           tierkv_transfer** out) {
  return StartTransfer(false, client, pages, slots, n, first_layer, layer_count,
                       out);
}

tierkv_status tierkv_transfer_wait_layer(tierkv_transfer* transfer,
                                         uint16_t layer, uint8_t* statuses) {
  return Guarded([&] {
    if (transfer == nullptr) return InvalidArgument("transfer is NULL");
    return ReportTransfer(transfer->handle.WaitLayer(layer), transfer->pages,
                          statuses);
  });
}

tierkv_status tierkv_transfer_wait(tierkv_transfer* transfer,
                                   uint8_t* statuses) {
  return Guarded([&] {
    if (transfer == nullptr) return InvalidArgument("transfer is NULL");
    return ReportTransfer(transfer->handle.Wait(), transfer->pages, statuses);
  });
}

uint16_t tierkv_transfer_layers_done(const tierkv_transfer* transfer) {
  return transfer == nullptr ? 0 : transfer->handle.LayersDone();
}

void tierkv_transfer_free(tierkv_transfer* transfer) { delete transfer; }

tierkv_status tierkv_prefetch(tierkv_client* client,
                              const tierkv_page_hash* pages, size_t n) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    if (MissingArrays(n, {pages})) return InvalidArgument(kNullArrays);
    return Report(client->client->Prefetch(Pages(pages, n)));
  });
}

tierkv_status tierkv_report_topk(tierkv_client* client,
                                 const tierkv_page_hash* pages,
                                 const uint16_t* layers, const uint32_t* counts,
                                 size_t n) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    if (MissingArrays(n, {pages, layers, counts})) {
      return InvalidArgument(kNullArrays);
    }
    std::vector<tierkv::SelectionReport> reports(n);
    for (size_t i = 0; i < n; ++i) {
      reports[i] = {PageHash{pages[i].lo, pages[i].hi}, layers[i], counts[i]};
    }
    return Report(client->client->ReportTopk(reports));
  });
}

namespace {

// Why `tensors` cannot be read (a NULL where a pointer is needed), or null.
const char* BadTensor(const tierkv_weights_tensor* tensors, size_t n,
                      bool need_data) {
  for (size_t i = 0; i < n; ++i) {
    const tierkv_weights_tensor& t = tensors[i];
    if (t.name == nullptr || t.dtype == nullptr ||
        (t.ndim > 0 && t.shape == nullptr) ||
        (need_data && t.bytes > 0 && t.data == nullptr)) {
      return "a tensor's name, dtype, shape or data pointer is NULL";
    }
  }
  return nullptr;
}

// The description of `t` (its data pointer is not read).
tierkv::WeightsTensor TensorOf(const tierkv_weights_tensor& t) {
  tierkv::WeightsTensor out;
  out.name = t.name;
  out.dtype = t.dtype;
  out.shape.assign(t.shape, t.shape + t.ndim);
  out.layer = t.layer;
  out.bytes = t.bytes;
  return out;
}

// PlanWeightsImage of `tensors`, checked as the C calls check them.
tierkv::Result<tierkv::WeightsManifest> PlanOf(
    const char* model, const char* layout, const tierkv_weights_tensor* tensors,
    size_t n) {
  if (model == nullptr || layout == nullptr) {
    return tierkv::Status::InvalidArgument(kNullModel);
  }
  if (MissingArrays(n, {tensors})) {
    return tierkv::Status::InvalidArgument(kNullArrays);
  }
  if (const char* bad = BadTensor(tensors, n, /*need_data=*/false)) {
    return tierkv::Status::InvalidArgument(bad);
  }
  std::vector<tierkv::WeightsTensor> described;
  described.reserve(n);
  for (size_t i = 0; i < n; ++i) described.push_back(TensorOf(tensors[i]));
  return tierkv::PlanWeightsImage(model, layout, std::move(described));
}

}  // namespace

tierkv_status tierkv_weights_put(tierkv_client* client, const char* model,
                                 const char* layout,
                                 const tierkv_weights_tensor* tensors, size_t n,
                                 tierkv_weights_stored* out) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    if (model == nullptr || layout == nullptr) {
      return InvalidArgument(kNullModel);
    }
    if (MissingArrays(n, {tensors})) return InvalidArgument(kNullArrays);
    if (const char* bad = BadTensor(tensors, n, /*need_data=*/true)) {
      return InvalidArgument(bad);
    }
    std::vector<tierkv::WeightsTensorData> data(n);
    for (size_t i = 0; i < n; ++i) {
      data[i].tensor = TensorOf(tensors[i]);
      data[i].data = {static_cast<const std::byte*>(tensors[i].data),
                      static_cast<size_t>(tensors[i].bytes)};
    }
    tierkv::WeightsPutStats stats;
    auto m = client->client->PutWeights(model, layout, data, &stats);
    if (!m.ok()) return Report(m.status());
    FillStored(*m, stats, out);
    return TIERKV_OK;
  });
}

tierkv_status tierkv_weights_plan_json(const char* model, const char* layout,
                                       const tierkv_weights_tensor* tensors,
                                       size_t n, char* buf, size_t cap,
                                       size_t* len) {
  return Guarded([&] {
    auto plan = PlanOf(model, layout, tensors, n);
    if (!plan.ok()) return Report(plan.status());
    return CopyString(tierkv::client_internal::WeightsManifestJson(*plan), buf,
                      cap, len);
  });
}

tierkv_status tierkv_weights_put_from_pool(tierkv_client* client,
                                           const char* model,
                                           const char* layout,
                                           const tierkv_weights_tensor* tensors,
                                           size_t n,
                                           tierkv_weights_stored* out) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    auto plan = PlanOf(model, layout, tensors, n);
    if (!plan.ok()) return Report(plan.status());
    tierkv::WeightsPutStats stats;
    auto m = client->client->PutWeightsFromPool(*plan, &stats);
    if (!m.ok()) return Report(m.status());
    FillStored(*m, stats, out);
    return TIERKV_OK;
  });
}

tierkv_status tierkv_weights_import_safetensors(tierkv_client* client,
                                                const char* model,
                                                const char* layout,
                                                const char* path,
                                                tierkv_weights_stored* out) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    if (model == nullptr || layout == nullptr || path == nullptr) {
      return InvalidArgument("model, layout and path must not be NULL");
    }
    tierkv::WeightsPutStats stats;
    auto m =
        tierkv::ImportSafetensors(*client->client, model, layout, path, &stats);
    if (!m.ok()) return Report(m.status());
    FillStored(*m, stats, out);
    return TIERKV_OK;
  });
}

tierkv_status tierkv_weights_manifest_json(tierkv_client* client,
                                           const char* model,
                                           const char* layout,
                                           const tierkv_page_hash* version,
                                           char* buf, size_t cap, size_t* len) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    if (model == nullptr || layout == nullptr) {
      return InvalidArgument(kNullModel);
    }
    auto m =
        client->client->GetWeightsManifest(WeightsIdOf(model, layout, version));
    if (!m.ok()) return Report(m.status());
    return CopyString(tierkv::client_internal::WeightsManifestJson(*m), buf,
                      cap, len);
  });
}

tierkv_status tierkv_weights_load_start(
    tierkv_client* client, const char* model, const char* layout,
    const tierkv_page_hash* version, void* image, uint64_t image_bytes,
    uint16_t first_layer, uint16_t layer_count, tierkv_weights_load** out) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    if (model == nullptr || layout == nullptr || out == nullptr ||
        (image == nullptr && image_bytes > 0)) {
      return InvalidArgument("model, layout, image and out must not be NULL");
    }
    *out = nullptr;
    auto m =
        client->client->GetWeightsManifest(WeightsIdOf(model, layout, version));
    if (!m.ok()) return Report(m.status());
    auto load = client->client->LoadWeights(
        *m, {static_cast<std::byte*>(image), static_cast<size_t>(image_bytes)},
        {first_layer, layer_count});
    if (!load.ok()) return Report(load.status());
    *out = new tierkv_weights_load{client->client, std::move(*load),
                                   tierkv::WeightsVersionOf(*m)};
    return TIERKV_OK;
  });
}

tierkv_status tierkv_weights_load_to_pool_start(
    tierkv_client* client, const char* model, const char* layout,
    const tierkv_page_hash* version, uint16_t first_layer, uint16_t layer_count,
    tierkv_weights_load** out) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    if (model == nullptr || layout == nullptr || out == nullptr) {
      return InvalidArgument("model, layout and out must not be NULL");
    }
    *out = nullptr;
    auto m =
        client->client->GetWeightsManifest(WeightsIdOf(model, layout, version));
    if (!m.ok()) return Report(m.status());
    auto load =
        client->client->LoadWeightsToPool(*m, {first_layer, layer_count});
    if (!load.ok()) return Report(load.status());
    *out = new tierkv_weights_load{client->client, std::move(*load),
                                   tierkv::WeightsVersionOf(*m)};
    return TIERKV_OK;
  });
}

tierkv_status tierkv_weights_load_version(const tierkv_weights_load* load,
                                          tierkv_page_hash* out) {
  return Guarded([&] {
    if (load == nullptr || out == nullptr) {
      return InvalidArgument("load and out must not be NULL");
    }
    *out = tierkv_page_hash{load->version.lo, load->version.hi};
    return TIERKV_OK;
  });
}

tierkv_status tierkv_weights_load_wait_layer(tierkv_weights_load* load,
                                             uint32_t layer) {
  return Guarded([&] {
    if (load == nullptr) return InvalidArgument("load is NULL");
    return Report(load->load.WaitLayer(layer));
  });
}

tierkv_status tierkv_weights_load_wait(tierkv_weights_load* load) {
  return Guarded([&] {
    if (load == nullptr) return InvalidArgument("load is NULL");
    return Report(load->load.Wait());
  });
}

uint32_t tierkv_weights_load_layers_done(const tierkv_weights_load* load) {
  return load == nullptr ? 0 : load->load.LayersDone();
}

void tierkv_weights_load_free(tierkv_weights_load* load) { delete load; }

tierkv_status tierkv_weights_prefetch(tierkv_client* client, const char* model,
                                      const char* layout,
                                      const tierkv_page_hash* version,
                                      uint16_t first_layer,
                                      uint16_t layer_count) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    if (model == nullptr || layout == nullptr) {
      return InvalidArgument(kNullModel);
    }
    return Report(client->client->PrefetchWeights(
        WeightsIdOf(model, layout, version), {first_layer, layer_count}));
  });
}

tierkv_status tierkv_weights_hint(tierkv_client* client,
                                  const tierkv_weights_hint_item* hints,
                                  size_t n) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    if (hints == nullptr && n > 0) {
      return InvalidArgument("hints must not be NULL");
    }
    std::vector<tierkv::WeightsHint> items;
    for (size_t i = 0; i < n; ++i) {
      if (hints[i].model == nullptr || hints[i].layout == nullptr) {
        return InvalidArgument(kNullModel);
      }
      items.push_back(
          {WeightsIdOf(hints[i].model, hints[i].layout, hints[i].version),
           std::chrono::milliseconds(hints[i].next_use_ms)});
    }
    return Report(client->client->HintWeights(items));
  });
}

tierkv_status tierkv_weights_pin(tierkv_client* client, const char* model,
                                 const char* layout,
                                 const tierkv_page_hash* version,
                                 uint64_t ttl_ms) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    if (model == nullptr || layout == nullptr) {
      return InvalidArgument(kNullModel);
    }
    // Past INT64_MAX ms is forever in practice: clamp, never wrap negative
    // (which would unpin).
    const auto ttl = std::chrono::milliseconds(
        static_cast<int64_t>(std::min<uint64_t>(ttl_ms, uint64_t{INT64_MAX})));
    return Report(
        client->client->PinWeights(WeightsIdOf(model, layout, version), ttl));
  });
}

tierkv_status tierkv_weights_list_json(tierkv_client* client, const char* model,
                                       char* buf, size_t cap, size_t* len) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    auto shards = client->client->ListWeights(model ? model : "");
    if (!shards.ok()) return Report(shards.status());
    return CopyString(tierkv::client_internal::WeightsListJson(*shards), buf,
                      cap, len);
  });
}

tierkv_status tierkv_weights_drop(tierkv_client* client, const char* model,
                                  const char* layout,
                                  const tierkv_page_hash* version,
                                  uint32_t* shards, uint64_t* freed_bytes) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    if (model == nullptr) return InvalidArgument("model must not be NULL");
    auto dropped =
        client->client->DropWeights(WeightsIdOf(model, layout, version));
    if (!dropped.ok()) return Report(dropped.status());
    if (shards != nullptr) *shards = dropped->shards;
    if (freed_bytes != nullptr) *freed_bytes = dropped->freed_bytes;
    return TIERKV_OK;
  });
}

tierkv_status tierkv_ping(tierkv_client* client, char* buf, size_t cap,
                          size_t* len) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    auto info = client->client->Ping();
    if (!info.ok()) return Report(info.status());
    return CopyString(*info, buf, cap, len);
  });
}

tierkv_status tierkv_stats_json(tierkv_client* client, char* buf, size_t cap,
                                size_t* len) {
  return Guarded([&] {
    if (client == nullptr) return InvalidArgument(kNullClient);
    auto stats = client->client->StatsJson();
    if (!stats.ok()) return Report(stats.status());
    return CopyString(*stats, buf, cap, len);
  });
}

}  // extern "C"
