// The tierkv request/response messages (DESIGN.md §7) and their encodings.
//
// Each request type has Encode() (client side) and Decode() (daemon side);
// each response likewise. Decode() never trusts the peer: it returns
// ProtocolError on truncation, trailing bytes, hostile counts or lengths.
// Batched requests carry one result per item in the response (STYLE #12).
// Every response begins with an overall Status; per-item Statuses follow.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tierkv/status.h"
#include "tierkv/types.h"
#include "tierkv/weights.h"
#include "transport/wire.h"

namespace tierkv::transport {

enum class Opcode : uint16_t {
  kPing = 1,           // daemon info (JSON); needs no namespace
  kOpenNamespace = 2,  // name + token -> arena memfd (SCM_RIGHTS)
  kRegisterLayout = 3,
  kMatch = 4,             // page hashes -> leading fully-present pages
  kPutReserve = 5,        // keys + sizes -> write lease + arena offsets
  kPutCommit = 6,         // write lease + keys -> per-key status
  kGet = 7,               // keys -> read lease + arena offsets
  kRelease = 8,           // ends a read, pin or write lease
  kPin = 9,               // keys + ttl -> pin lease
  kStats = 10,            // namespace stats (JSON)
  kList = 11,             // segments of the namespace
  kReleaseOneWay = 12,    // like kRelease, but the daemon sends no reply
  kFlush = 13,            // keys -> per-key status once durable on NVMe
  kRegisterPool = 14,     // pool spec + memfd (SCM_RIGHTS) -> status
  kRegisterTickets = 15,  // ticket count + memfd (SCM_RIGHTS) -> status
  kLoad = 16,             // pages -> slots, layers, ticket -> status (queued)
  kStore = 17,            // slots -> pages, layers, ticket -> status (queued)
  kPrefetch = 18,         // pages -> status (NVMe -> DRAM queued)
  kReportTopk = 19,       // (page, full layer, count)s -> status
  // Weights (issue 28; a namespace with `weights = true` only; its chunks
  // are stored with kPutReserve / kPutCommit and read with kGet).
  kWeightsSeal = 20,      // manifest -> version (every chunk stored)
  kWeightsManifest = 21,  // (model, layout, version) -> manifest
  kWeightsList = 22,      // (model filter) -> one WeightsInfo per shard
  kWeightsDrop = 23,      // (model, layout, version) -> dropped, bytes freed
  kWeightsPrefetch = 24,  // (model, layout, version, layers) -> queued
  kWeightsHint = 25,      // (shard, next use in ms)s -> per-item status
  kWeightsPin = 26,       // (shard, ttl in ms; 0 unpins) -> status
  kWeightsLoad = 27,      // (shard, layers, ticket) -> status (queued)
  kWeightsStage = 28,     // image pool extents -> their chunk keys (stored)
  kLastOpcode = kWeightsStage,
};

// Requests that carry a file descriptor (SCM_RIGHTS) on the first byte of
// their payload: the client sends the header and the payload separately,
// and the server reads such a payload with recvmsg.
constexpr bool OpcodeCarriesDescriptor(uint16_t opcode) {
  return opcode == static_cast<uint16_t>(Opcode::kRegisterPool) ||
         opcode == static_cast<uint16_t>(Opcode::kRegisterTickets);
}

// Largest number of items in one batched request.
inline constexpr uint32_t kMaxBatchItems = 1u << 16;

// kPing (daemon info) and kStats (namespace statistics): a JSON document.
struct JsonResponse {
  Status status;
  std::string json;
};

struct OpenNamespaceRequest {
  std::string name;
  std::string token;
};
struct OpenNamespaceResponse {
  Status status;
  uint64_t arena_bytes = 0;
  bool has_layout = false;
  LayoutSpec layout;  // valid iff has_layout
};

struct RegisterLayoutRequest {
  LayoutSpec layout;
};

// Buckets of a WaitReport: the log2-microsecond buckets of
// common/latency_histogram.h (bucket 0: < 1 us, bucket i: [2^(i-1), 2^i) us,
// the last one open-ended). Fixed: a report with another count is malformed.
inline constexpr uint8_t kWaitReportBuckets = 21;

// How long the client's engine threads were blocked in
// TransferHandle::WaitLayer / Wait since its previous report: one sample per
// call (0 when the layer was already there), as bucket counts plus the
// summed nanoseconds. Piggybacked on the client's next kLoad, kStore or
// kPrefetch (never a message of its own), so the waits after a client's last
// transfer request are never reported.
struct WaitReport {
  std::array<uint64_t, kWaitReportBuckets> counts{};
  uint64_t total_nanos = 0;

  bool empty() const {
    for (uint64_t c : counts) {
      if (c != 0) return false;
    }
    return true;
  }
};

// What Match prefetches into DRAM of the leading pages' segments below it:
// nothing, or layers [first, first + count) (count 0: through the last).
struct MatchPrefetch {
  bool enabled = true;
  uint16_t first = 0;
  uint16_t count = 0;
  bool empty() const { return false; }  // a set trailer is always encoded
};
struct MatchRequest {  // kMatch
  std::vector<PageHash> pages;
  // Optional trailer. Absent: every layer is prefetched.
  std::optional<MatchPrefetch> prefetch;
};
struct PrefetchRequest {  // kPrefetch
  std::vector<PageHash> pages;
  // Optional trailer: encoded only when set and non-empty.
  std::optional<WaitReport> waits;
};
struct MatchResponse {
  Status status;
  // Pages [0, leading_pages) have every segment of the layout stored.
  uint32_t leading_pages = 0;
  // Per page: the slowest tier holding one of its segments, or kMiss when
  // the page is not fully present.
  std::vector<Tier> tiers;
};

struct PutItem {
  SegmentKey key;
  uint64_t size = 0;
};
struct PutReserveRequest {
  std::vector<PutItem> items;
};
struct Placement {
  // OK and !already_stored: write `size` bytes at `offset`, then commit.
  // OK and already_stored: deduplicated, nothing to write or commit.
  // Not OK: the item failed. Dedup is never an error status.
  Status status;
  uint64_t offset = 0;          // 0 unless the item is to be written
  bool already_stored = false;  // only with an OK status (decoder checks)
};
struct PutReserveResponse {
  Status status;
  uint64_t lease_id = 0;  // 0 when nothing was reserved
  std::vector<Placement> items;
};

struct KeysRequest {  // kPutCommit (with lease), kGet, kPin (ttl), kFlush
  // kPutCommit: the write lease. kGet: a read lease of this connection to
  // release before leasing (0 = none), so pipelined readers need no
  // separate release round trip.
  uint64_t lease_id = 0;
  uint32_t ttl_ms = 0;
  std::vector<SegmentKey> keys;
};

struct ItemStatusResponse {  // kPutCommit, kPin, kFlush
  Status status;
  uint64_t lease_id = 0;
  std::vector<Status> items;
};

struct Location {
  Status status;
  Tier tier = Tier::kMiss;
  uint64_t offset = 0;
  uint64_t size = 0;
};
struct GetResponse {
  Status status;
  uint64_t lease_id = 0;  // 0 when nothing was leased
  std::vector<Location> items;
};

struct ReleaseRequest {
  uint64_t lease_id = 0;
};

// kRegisterPool: a memfd pool's descriptor travels with the request; a
// device pool's IPC handle is in it; a device allocation exported as a
// descriptor (kDeviceFd) travels with it, its size in the request.
struct RegisterPoolRequest {
  static constexpr uint8_t kMemfd = 0;
  static constexpr uint8_t kDeviceIpc = 1;
  static constexpr uint8_t kDeviceFd = 2;
  uint16_t layer = 0;
  uint8_t part = 0;
  uint8_t kind = kMemfd;
  uint64_t offset = 0;
  uint64_t slot_bytes = 0;
  uint32_t slot_count = 0;
  // kDeviceIpc only (on the wire only for it).
  std::array<std::byte, 64> device_handle{};
  // kDeviceIpc and kDeviceFd (on the wire only for them): the allocation's
  // size, and the UUID of the GPU holding it (all zero: not said).
  uint64_t device_pool_bytes = 0;
  std::array<std::byte, 16> device_uuid{};
};

// kRegisterTickets: the tickets' memfd travels with the request.
struct RegisterTicketsRequest {
  uint32_t count = 0;
};

// kLoad and kStore: page i <-> slot slots[i] of every layer's pools.
struct TransferRequest {
  uint32_t ticket = 0;
  uint16_t first_layer = 0;
  uint16_t num_layers = 0;
  std::vector<PageHash> pages;
  std::vector<uint32_t> slots;
  // Optional trailer: encoded only when set and non-empty.
  std::optional<WaitReport> waits;
};

// kReportTopk: selection counts per page and full layer.
struct TopkReportRequest {
  std::vector<SelectionReport> items;
};

struct StatusResponse {  // kRegisterLayout, kRelease, pools, transfers
  Status status;
};

struct ListRequest {
  uint32_t limit = 1000;
};

// kWeightsSeal: an EncodeWeightsManifest() whose chunks the connection's
// weights namespace holds (each verified against its key when committed).
// Sealing a version sealed before is OK with already_sealed.
struct WeightsSealRequest {
  std::vector<std::byte> manifest;
};
struct WeightsSealResponse {
  Status status;
  PageHash version;  // WeightsVersionOf the manifest, when OK
  bool already_sealed = false;
};
// Selects sealed shards. kWeightsManifest and kWeightsPrefetch: one shard,
// the newest sealed version of (model, layout) when version is zero.
// kWeightsDrop: model required; an empty layout means every layout, a
// zero version every version. kWeightsList: only `model` is read (empty:
// every model). kWeightsPrefetch alone reads `layers`.
struct WeightsSelectRequest {
  std::string model;
  std::string layout;
  PageHash version;
  LayerRange layers;
};
struct WeightsManifestResponse {
  Status status;
  std::vector<std::byte> manifest;  // EncodeWeightsManifest, when OK
};
struct WeightsListResponse {
  Status status;
  std::vector<WeightsInfo> shards;
};
struct WeightsDropResponse {
  Status status;
  uint32_t dropped = 0;      // shards unsealed
  uint64_t freed_bytes = 0;  // chunk bytes no sealed shard references now
};
// kWeightsHint: when a sealed shard (newest version of (model, layout) for
// a zero version) is next used, in ms from the daemon's receipt; a negative
// value clears its hint. Replied with ItemStatusResponse: one Status per
// item (NotFound: no such shard; the other items still apply).
struct WeightsHintItem {
  WeightsId id;
  int64_t next_use_ms = -1;
};
struct WeightsHintRequest {
  std::vector<WeightsHintItem> items;
};
// kWeightsPin: keeps one sealed shard's chunks in DRAM for ttl_ms (0:
// unpin). Replied with StatusResponse.
struct WeightsPinRequest {
  WeightsId id;
  uint64_t ttl_ms = 0;
};
// kWeightsLoad: loads layers [first_layer, first_layer + num_layers) of one
// sealed shard (the newest version of (model, layout) for a zero version)
// into the connection's registered image pool, publishing each layer on
// ticket `ticket` as kLoad does. Replied with StatusResponse once queued.
struct WeightsLoadRequest {
  uint32_t ticket = 0;
  WeightsId id;
  uint16_t first_layer = 0;
  uint16_t num_layers = 0;
  // Optional trailer: encoded only when set and non-empty (as kLoad's).
  std::optional<WaitReport> waits;
};
// kWeightsStage: stores chunks from the connection's image pool: each
// extent (image offset, bytes: one chunk of the shard's plan) is hashed
// and stored by the daemon. Replied with WeightsStageResponse: per extent
// its key and whether it was held already; or the first failure.
struct WeightsStageExtent {
  uint64_t offset = 0;
  uint64_t bytes = 0;
};
struct WeightsStageRequest {
  std::vector<WeightsStageExtent> extents;
};
struct WeightsStageResponse {
  Status status;
  std::vector<PageHash> keys;
  std::vector<uint8_t> already_stored;  // 0 or 1 per extent
};
struct ListedSegment {
  SegmentKey key;
  uint64_t size = 0;
  uint32_t refs = 0;
  Tier tier = Tier::kHost;
};
struct ListResponse {
  Status status;
  std::vector<ListedSegment> segments;
};

// Encoders.
std::vector<std::byte> Encode(const JsonResponse& m);
std::vector<std::byte> Encode(const OpenNamespaceRequest& m);
std::vector<std::byte> Encode(const OpenNamespaceResponse& m);
std::vector<std::byte> Encode(const RegisterLayoutRequest& m);
std::vector<std::byte> Encode(const MatchRequest& m);
std::vector<std::byte> Encode(const PrefetchRequest& m);
std::vector<std::byte> Encode(const MatchResponse& m);
std::vector<std::byte> Encode(const PutReserveRequest& m);
std::vector<std::byte> Encode(const PutReserveResponse& m);
std::vector<std::byte> Encode(const KeysRequest& m);
std::vector<std::byte> Encode(const ItemStatusResponse& m);
std::vector<std::byte> Encode(const GetResponse& m);
std::vector<std::byte> Encode(const ReleaseRequest& m);
std::vector<std::byte> Encode(const StatusResponse& m);
std::vector<std::byte> Encode(const ListRequest& m);
std::vector<std::byte> Encode(const ListResponse& m);
std::vector<std::byte> Encode(const RegisterPoolRequest& m);
std::vector<std::byte> Encode(const RegisterTicketsRequest& m);
std::vector<std::byte> Encode(const TransferRequest& m);
std::vector<std::byte> Encode(const WeightsSealRequest& m);
std::vector<std::byte> Encode(const WeightsSealResponse& m);
std::vector<std::byte> Encode(const WeightsSelectRequest& m);
std::vector<std::byte> Encode(const WeightsManifestResponse& m);
std::vector<std::byte> Encode(const WeightsListResponse& m);
std::vector<std::byte> Encode(const WeightsDropResponse& m);
std::vector<std::byte> Encode(const WeightsHintRequest& m);
std::vector<std::byte> Encode(const WeightsPinRequest& m);
std::vector<std::byte> Encode(const WeightsLoadRequest& m);
std::vector<std::byte> Encode(const WeightsStageRequest& m);
std::vector<std::byte> Encode(const WeightsStageResponse& m);

// Decoders: `out` is valid only when OK is returned.
Status Decode(std::span<const std::byte> in, JsonResponse& out);
Status Decode(std::span<const std::byte> in, OpenNamespaceRequest& out);
Status Decode(std::span<const std::byte> in, OpenNamespaceResponse& out);
Status Decode(std::span<const std::byte> in, RegisterLayoutRequest& out);
Status Decode(std::span<const std::byte> in, MatchRequest& out);
Status Decode(std::span<const std::byte> in, PrefetchRequest& out);
Status Decode(std::span<const std::byte> in, MatchResponse& out);
Status Decode(std::span<const std::byte> in, PutReserveRequest& out);
Status Decode(std::span<const std::byte> in, PutReserveResponse& out);
Status Decode(std::span<const std::byte> in, KeysRequest& out);
Status Decode(std::span<const std::byte> in, ItemStatusResponse& out);
Status Decode(std::span<const std::byte> in, GetResponse& out);
Status Decode(std::span<const std::byte> in, ReleaseRequest& out);
Status Decode(std::span<const std::byte> in, StatusResponse& out);
Status Decode(std::span<const std::byte> in, ListRequest& out);
Status Decode(std::span<const std::byte> in, ListResponse& out);
Status Decode(std::span<const std::byte> in, RegisterPoolRequest& out);
Status Decode(std::span<const std::byte> in, RegisterTicketsRequest& out);
Status Decode(std::span<const std::byte> in, TransferRequest& out);
std::vector<std::byte> Encode(const TopkReportRequest& m);
Status Decode(std::span<const std::byte> in, TopkReportRequest& out);
Status Decode(std::span<const std::byte> in, WeightsSealRequest& out);
Status Decode(std::span<const std::byte> in, WeightsSealResponse& out);
Status Decode(std::span<const std::byte> in, WeightsSelectRequest& out);
Status Decode(std::span<const std::byte> in, WeightsManifestResponse& out);
Status Decode(std::span<const std::byte> in, WeightsListResponse& out);
Status Decode(std::span<const std::byte> in, WeightsDropResponse& out);
Status Decode(std::span<const std::byte> in, WeightsHintRequest& out);
Status Decode(std::span<const std::byte> in, WeightsPinRequest& out);
Status Decode(std::span<const std::byte> in, WeightsLoadRequest& out);
Status Decode(std::span<const std::byte> in, WeightsStageRequest& out);
Status Decode(std::span<const std::byte> in, WeightsStageResponse& out);

// The payload of a kErrorOpcode frame: just a Status.
std::vector<std::byte> EncodeError(const Status& s);
Status DecodeError(std::span<const std::byte> in);

}  // namespace tierkv::transport
