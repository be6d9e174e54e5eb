/* tierkv C API: libtierkv_c.so, the stable ABI over tierkv::Client.
 *
 * For engines and languages that cannot link C++ (the Python package
 * `tierkv` binds exactly this file with ctypes). Every function is a thin,
 * non-throwing wrapper of the tierkv::Client call of the same name
 * (include/tierkv/client.h documents the semantics; this file documents
 * only what the C shape adds).
 *
 * Conventions
 *  - Every call returns a tierkv_status (0 = TIERKV_OK). On any other value
 *    tierkv_last_error() returns "<code>: <message>" with the daemon's own
 *    words; it is thread-local and valid until this thread's next tierkv_*
 *    call.
 *  - Batch calls take struct-of-arrays inputs of `n` items and write one
 *    status per item into `statuses` (n bytes, tierkv_status values). Such a
 *    call returns TIERKV_OK when every item is OK, otherwise the first
 *    failing item's status, with its message in tierkv_last_error().
 *  - Handles are opaque. A lease or transfer keeps its client alive, so
 *    tierkv_client_close may be called at any time: the connection closes
 *    when the last handle made from it is freed. Every pointer argument is
 *    checked (NULL with n > 0 is TIERKV_INVALID_ARGUMENT, never a crash);
 *    sizes are checked against the registered layout.
 *  - Strings out: (buf, cap, *len): up to cap - 1 bytes and a NUL are
 *    written, *len gets the full length; call again with a larger buffer
 *    when *len >= cap.
 *  - Thread safety: as tierkv::Client (all calls thread-safe); a lease or
 *    transfer handle must not be used after it is freed.
 */
#ifndef TIERKV_C_API_H_
#define TIERKV_C_API_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define TIERKV_C_EXPORT __attribute__((visibility("default")))
#else
#define TIERKV_C_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Same values as tierkv::StatusCode (include/tierkv/status.h). */
typedef enum tierkv_status {
  TIERKV_OK = 0,
  TIERKV_NOT_FOUND = 1,
  TIERKV_ALREADY_EXISTS = 2,
  TIERKV_INVALID_ARGUMENT = 3,
  TIERKV_PERMISSION_DENIED = 4,
  TIERKV_RESOURCE_EXHAUSTED = 5,
  TIERKV_BUSY = 6,
  TIERKV_IO_ERROR = 7,
  TIERKV_CORRUPTION = 8,
  TIERKV_SHUTDOWN = 9,
  TIERKV_PROTOCOL_ERROR = 10,
  TIERKV_INTERNAL = 11,
  TIERKV_UNAVAILABLE = 12
} tierkv_status;

/* Same values as tierkv::Tier. */
enum {
  TIERKV_TIER_HBM = 0,
  TIERKV_TIER_HOST = 1,
  TIERKV_TIER_NVME = 2,
  TIERKV_TIER_PEER = 3,
  TIERKV_TIER_MISS = 255
};

typedef struct tierkv_page_hash {
  uint64_t lo;
  uint64_t hi;
} tierkv_page_hash;

typedef struct tierkv_client tierkv_client;
typedef struct tierkv_read_lease tierkv_read_lease;
typedef struct tierkv_transfer tierkv_transfer;
typedef struct tierkv_weights_load tierkv_weights_load;

/* Version of this header's ABI; bumped on any incompatible change. */
#define TIERKV_C_ABI_VERSION 1
TIERKV_C_EXPORT uint32_t tierkv_abi_version(void);

/* "<code>: <message>" of this thread's last failed call ("" if none). */
TIERKV_C_EXPORT const char* tierkv_last_error(void);
/* Stable lowercase name of a status, e.g. "not_found". */
TIERKV_C_EXPORT const char* tierkv_status_name(tierkv_status status);

/* ---- Page hashes (include/tierkv/page_hash.h) -------------------------- */

TIERKV_C_EXPORT tierkv_status tierkv_root_page_hash(const char* namespace_name,
                                                    tierkv_page_hash* out);
/* Hashes of the floor(n_tokens / page_tokens) full pages of `tokens`,
 * chained from `root`, into out[0 .. out_cap); *n_out gets the count (an
 * out_cap smaller than the count is TIERKV_INVALID_ARGUMENT). */
TIERKV_C_EXPORT tierkv_status tierkv_page_hash_chain(
    const tierkv_page_hash* root, const uint32_t* tokens, size_t n_tokens,
    uint32_t page_tokens, const void* salt, size_t salt_len,
    tierkv_page_hash* out, size_t out_cap, size_t* n_out);

/* ---- Connection --------------------------------------------------------- */

typedef struct tierkv_client_options {
  const char* socket_path;          /* NULL: "/run/tierkv/tierkv.sock" */
  uint32_t timeout_ms;              /* 0: 10000 */
  int32_t prefault_arena;           /* <0: default (yes); 0 no; >0 yes */
  uint32_t max_transfers_in_flight; /* 0: 64 */
} tierkv_client_options;

/* Connects; `options` may be NULL (every default). */
TIERKV_C_EXPORT tierkv_status tierkv_client_connect(
    const tierkv_client_options* options, tierkv_client** out);
/* Drops this reference; NULL is a no-op. */
TIERKV_C_EXPORT void tierkv_client_close(tierkv_client* client);

TIERKV_C_EXPORT tierkv_status tierkv_open_namespace(tierkv_client* client,
                                                    const char* name,
                                                    const char* token);

/* Layout: `num_layers` layers; layer l has parts_per_layer[l] parts, taken
 * in order from the flat arrays part_names / bytes_per_token. */
TIERKV_C_EXPORT tierkv_status tierkv_register_layout(
    tierkv_client* client, uint32_t page_tokens, uint32_t num_layers,
    const uint32_t* parts_per_layer, const char* const* part_names,
    const uint32_t* bytes_per_token);
/* The namespace's layout as JSON: {"page_tokens":64,"layers":[[["kv",656],
 * ["index_k",132]],...]}; TIERKV_NOT_FOUND when none is registered. */
TIERKV_C_EXPORT tierkv_status tierkv_layout_json(tierkv_client* client,
                                                 char* buf, size_t cap,
                                                 size_t* len);

/* leading_pages: pages [0, *leading_pages) are fully stored. tiers (may be
 * NULL): n bytes, each a TIERKV_TIER_* value. */
TIERKV_C_EXPORT tierkv_status tierkv_match(tierkv_client* client,
                                           const tierkv_page_hash* pages,
                                           size_t n, uint32_t* leading_pages,
                                           uint8_t* tiers);

/* Segments (pages[i], layers[i], parts[i]). already_stored (may be NULL): n
 * bytes, 1 where an OK item was deduplicated. */
TIERKV_C_EXPORT tierkv_status
tierkv_put(tierkv_client* client, const tierkv_page_hash* pages,
           const uint16_t* layers, const uint8_t* parts,
           const void* const* data, const uint64_t* sizes, size_t n,
           uint8_t* statuses, uint8_t* already_stored);
TIERKV_C_EXPORT tierkv_status tierkv_get(tierkv_client* client,
                                         const tierkv_page_hash* pages,
                                         const uint16_t* layers,
                                         const uint8_t* parts, void* const* dst,
                                         const uint64_t* sizes, size_t n,
                                         uint8_t* statuses);
TIERKV_C_EXPORT tierkv_status tierkv_flush(tierkv_client* client,
                                           const tierkv_page_hash* pages,
                                           const uint16_t* layers,
                                           const uint8_t* parts, size_t n,
                                           uint8_t* statuses);

/* Zero-copy reads: a lease on n segments of the mapped arena. */
TIERKV_C_EXPORT tierkv_status tierkv_acquire(tierkv_client* client,
                                             const tierkv_page_hash* pages,
                                             const uint16_t* layers,
                                             const uint8_t* parts, size_t n,
                                             tierkv_read_lease** out);
/* Item i: its status, and its bytes (NULL, 0 for a miss). */
TIERKV_C_EXPORT tierkv_status
tierkv_read_lease_item(const tierkv_read_lease* lease, size_t i,
                       const void** data, uint64_t* size);
/* Releases the lease now (the daemon may reuse the bytes); the handle, and
 * the arena mapping its views point into, stay valid until freed.
 * Releasing twice is OK. */
TIERKV_C_EXPORT tierkv_status
tierkv_read_lease_release(tierkv_read_lease* lease);
/* Releases the lease if still held and frees the handle; NULL is a no-op. */
TIERKV_C_EXPORT void tierkv_read_lease_free(tierkv_read_lease* lease);

/* ---- Registered pools and per-layer transfers -------------------------- */

/* A memfd pool (tierkv::PoolSpec, kind memfd). */
TIERKV_C_EXPORT tierkv_status tierkv_register_pool(
    tierkv_client* client, int fd, uint64_t offset, uint64_t slot_bytes,
    uint32_t slot_count, uint16_t layer, uint8_t part);

/* Load / Store of pages[i] <-> slot slots[i] for layers
 * [first_layer, first_layer + layer_count) (count 0: through the last). */
TIERKV_C_EXPORT tierkv_status tierkv_load(tierkv_client* client,
                                          const tierkv_page_hash* pages,
                                          const uint32_t* slots, size_t n,
                                          uint16_t first_layer,
                                          uint16_t layer_count,
                                          tierkv_transfer** out);
TIERKV_C_EXPORT tierkv_status tierkv_store(tierkv_client* client,
                                           const tierkv_page_hash* pages,
                                           const uint32_t* slots, size_t n,
                                           uint16_t first_layer,
                                           uint16_t layer_count,
                                           tierkv_transfer** out);
/* Blocks until `layer` is done; statuses: one per page (the n given). */
TIERKV_C_EXPORT tierkv_status tierkv_transfer_wait_layer(
    tierkv_transfer* transfer, uint16_t layer, uint8_t* statuses);
/* Blocks until every layer is done. */
TIERKV_C_EXPORT tierkv_status tierkv_transfer_wait(tierkv_transfer* transfer,
                                                   uint8_t* statuses);
/* Layers complete now (never blocks). */
TIERKV_C_EXPORT uint16_t
tierkv_transfer_layers_done(const tierkv_transfer* transfer);
/* Waits (up to the client timeout) until the daemon is done with the
 * transfer, then frees the handle; NULL is a no-op. */
TIERKV_C_EXPORT void tierkv_transfer_free(tierkv_transfer* transfer);

TIERKV_C_EXPORT tierkv_status tierkv_prefetch(tierkv_client* client,
                                              const tierkv_page_hash* pages,
                                              size_t n);
/* Selection counts per (page, full layer); see Client::ReportTopk. */
TIERKV_C_EXPORT tierkv_status tierkv_report_topk(tierkv_client* client,
                                                 const tierkv_page_hash* pages,
                                                 const uint16_t* layers,
                                                 const uint32_t* counts,
                                                 size_t n);

/* ---- Model weights (include/tierkv/weights.h; Client::PutWeights ...) --- */
/* On a client opened on a namespace marked `weights = true`. A shard is
 * named by (model, layout, version); `version` arguments may be NULL or all
 * zero where the C++ call accepts a zero version ("the newest"). */

/* One tensor of tierkv_weights_put, in load order (WeightsTensorData). */
typedef struct tierkv_weights_tensor {
  const char* name;
  const char* dtype; /* safetensors dtype string, e.g. "BF16" */
  const int64_t* shape;
  uint32_t ndim;
  uint32_t layer; /* layer group, nondecreasing */
  const void* data;
  uint64_t bytes;
} tierkv_weights_tensor;

/* What a put or an import sealed (the manifest's figures and
 * WeightsPutStats). */
typedef struct tierkv_weights_stored {
  tierkv_page_hash version;
  uint64_t image_bytes;
  uint32_t num_layers;
  uint32_t tensors;
  uint32_t chunks;
  uint32_t chunks_stored;
  uint32_t chunks_deduplicated;
  uint64_t bytes_stored;
  uint64_t bytes_deduplicated;
} tierkv_weights_stored;

/* Client::PutWeights of n tensors; `out` may be NULL. */
TIERKV_C_EXPORT tierkv_status tierkv_weights_put(
    tierkv_client* client, const char* model, const char* layout,
    const tierkv_weights_tensor* tensors, size_t n, tierkv_weights_stored* out);
/* tierkv::PlanWeightsImage of `tensors` (their data pointers are not
 * read) as the manifest JSON below (chunk keys all zero): where an engine
 * lays each tensor out in its image pool before
 * tierkv_weights_put_from_pool. Needs no client. */
TIERKV_C_EXPORT tierkv_status tierkv_weights_plan_json(
    const char* model, const char* layout, const tierkv_weights_tensor* tensors,
    size_t n, char* buf, size_t cap, size_t* len);
/* Client::PutWeightsFromPool: the tensors (data pointers not read) are in
 * the connection's registered image pool at their planned offsets; the
 * daemon hashes, stores and seals them. `out` may be NULL. */
TIERKV_C_EXPORT tierkv_status tierkv_weights_put_from_pool(
    tierkv_client* client, const char* model, const char* layout,
    const tierkv_weights_tensor* tensors, size_t n, tierkv_weights_stored* out);
/* tierkv::ImportSafetensors of a .safetensors file or directory; `out` may
 * be NULL. */
TIERKV_C_EXPORT tierkv_status tierkv_weights_import_safetensors(
    tierkv_client* client, const char* model, const char* layout,
    const char* path, tierkv_weights_stored* out);
/* The sealed manifest as JSON: {"model","layout","version" (32 hex),
 * "num_layers","image_bytes","tensors":[{"name","dtype","shape","layer",
 * "offset","bytes"}],"chunks":[{"key","offset","bytes","layer"}]}. */
TIERKV_C_EXPORT tierkv_status tierkv_weights_manifest_json(
    tierkv_client* client, const char* model, const char* layout,
    const tierkv_page_hash* version, char* buf, size_t cap, size_t* len);
/* Fetches the manifest and starts Client::LoadWeights of layers
 * [first_layer, first_layer + layer_count) (count 0: through the last) into
 * image[0 .. image_bytes), which must hold the manifest's image_bytes. The
 * handle keeps the client alive; the image must stay valid until the handle
 * is freed. With a NULL version the newest sealed version is loaded: read
 * tensors at the offsets of the version tierkv_weights_load_version
 * reports, since another version may be sealed between two calls. */
TIERKV_C_EXPORT tierkv_status tierkv_weights_load_start(
    tierkv_client* client, const char* model, const char* layout,
    const tierkv_page_hash* version, void* image, uint64_t image_bytes,
    uint16_t first_layer, uint16_t layer_count, tierkv_weights_load** out);
/* The same into the connection's registered image pool
 * (Client::LoadWeightsToPool): register the engine's weights buffer first
 * with tierkv_register_pool(client, fd, offset, bytes >= the manifest's
 * image_bytes, 1, 0, 0); the daemon moves the bytes (its Load machinery),
 * this process copies nothing. The wait, version and free calls below
 * apply as for tierkv_weights_load_start; freeing waits until the daemon
 * is done with the pool. */
TIERKV_C_EXPORT tierkv_status tierkv_weights_load_to_pool_start(
    tierkv_client* client, const char* model, const char* layout,
    const tierkv_page_hash* version, uint16_t first_layer, uint16_t layer_count,
    tierkv_weights_load** out);
/* WeightsLoad::WaitLayer / Wait: TIERKV_OK once the layer (every layer) is
 * in place, else its first failure. */
TIERKV_C_EXPORT tierkv_status
tierkv_weights_load_wait_layer(tierkv_weights_load* load, uint32_t layer);
TIERKV_C_EXPORT tierkv_status
tierkv_weights_load_wait(tierkv_weights_load* load);
/* The version being loaded (the one a NULL version resolved to). */
TIERKV_C_EXPORT tierkv_status tierkv_weights_load_version(
    const tierkv_weights_load* load, tierkv_page_hash* out);
/* Layers of the load finished now (never blocks). */
TIERKV_C_EXPORT uint32_t
tierkv_weights_load_layers_done(const tierkv_weights_load* load);
/* Stops the loader after its Get in flight, waits for it (nothing writes
 * the image afterwards) and frees the handle; NULL is a no-op. */
TIERKV_C_EXPORT void tierkv_weights_load_free(tierkv_weights_load* load);
/* Client::PrefetchWeights of layers [first_layer, +layer_count). */
TIERKV_C_EXPORT tierkv_status
tierkv_weights_prefetch(tierkv_client* client, const char* model,
                        const char* layout, const tierkv_page_hash* version,
                        uint16_t first_layer, uint16_t layer_count);
/* One item of tierkv_weights_hint (WeightsHint): version NULL or zero =
 * the newest sealed now; next_use_ms from now, negative = no known next use
 * (clears the shard's hint). */
typedef struct tierkv_weights_hint_item {
  const char* model;
  const char* layout;
  const tierkv_page_hash* version;
  int64_t next_use_ms;
} tierkv_weights_hint_item;
/* Client::HintWeights: when the shards are next used (the daemon's DRAM
 * eviction order and prefetch). OK when every hint applied, else the first
 * failure, naming its item. */
TIERKV_C_EXPORT tierkv_status tierkv_weights_hint(
    tierkv_client* client, const tierkv_weights_hint_item* hints, size_t n);
/* Client::PinWeights: keeps the shard in DRAM for ttl_ms; 0 unpins it.
 * version NULL or zero = the newest. */
TIERKV_C_EXPORT tierkv_status
tierkv_weights_pin(tierkv_client* client, const char* model, const char* layout,
                   const tierkv_page_hash* version, uint64_t ttl_ms);
/* Client::ListWeights as JSON: [{"model","layout","version","image_bytes",
 * "tensors","chunks","num_layers","sealed_unix_ms","chunks_in_dram",
 * "chunks_on_nvme","chunks_missing","unique_bytes"}]; model NULL or "":
 * every model. */
TIERKV_C_EXPORT tierkv_status tierkv_weights_list_json(tierkv_client* client,
                                                       const char* model,
                                                       char* buf, size_t cap,
                                                       size_t* len);
/* Client::DropWeights: layout NULL or "" = every layout, version NULL or
 * zero = every version. shards, freed_bytes may be NULL. */
TIERKV_C_EXPORT tierkv_status tierkv_weights_drop(
    tierkv_client* client, const char* model, const char* layout,
    const tierkv_page_hash* version, uint32_t* shards, uint64_t* freed_bytes);

/* ---- Introspection ------------------------------------------------------ */

TIERKV_C_EXPORT tierkv_status tierkv_ping(tierkv_client* client, char* buf,
                                          size_t cap, size_t* len);
TIERKV_C_EXPORT tierkv_status tierkv_stats_json(tierkv_client* client,
                                                char* buf, size_t cap,
                                                size_t* len);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TIERKV_C_API_H_ */
