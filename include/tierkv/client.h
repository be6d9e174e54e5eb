// tierkv::Client: what an inference engine links to use tierkvd.
//
// A Client is one connection to the daemon, bound to one namespace. Control
// calls (Match, reserve/commit, lease/release) travel over the Unix socket;
// payload bytes never do: the namespace's arena is mapped into this process
// and Put/Get copy straight into and out of it (DESIGN.md §5, buffer mode).
//
//   auto client = tierkv::Client::Connect({.socket_path =
//   "/run/tierkv/tierkv.sock"}); ASSERT_OK(client->OpenNamespace("glm-5@bf16",
//   token)); ASSERT_OK(client->RegisterLayout(layout)); auto hit =
//   client->Match(page_hashes);        // leading pages present auto put =
//   client->Put(writes);               // one PutResult per segment auto got =
//   client->Get(reads);                // one Status per segment
//
// Thread safety: all methods are thread-safe. One Client's connection is
// multiplexed: requests from many threads are in flight at once, each call
// waits only for its own replies (matched by request id), and no lock is
// held while bytes are copied, so concurrent Put/Get calls copy in
// parallel.
//
// Failure model: every call returns Status / Result; nothing throws. If the
// daemon goes away, calls return Unavailable or IOError and the Client must
// be reconnected; the mapped arena stays valid until the Client is destroyed.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tierkv/engine_stream.h"
#include "tierkv/status.h"
#include "tierkv/types.h"
#include "tierkv/weights.h"

namespace tierkv {

struct ClientOptions {
  // Default: the daemon's default socket.
  std::string socket_path = "/run/tierkv/tierkv.sock";
  // Longest wait for one reply from the daemon. Default: 10 s.
  std::chrono::milliseconds timeout{10000};
  // Map the arena with every page faulted in, so Put/Get never fault.
  // Costs ~0.1-0.3 s per GiB at OpenNamespace. Default: true.
  bool prefault_arena = true;
  // Load/Store calls that may be in flight at once (one 4 KiB completion
  // ticket each, in shared memory). Default: 64.
  uint32_t max_transfers_in_flight = 64;
  // The device backend that orders transfers with an engine's stream
  // (the EngineStream arguments below): "cuda", "emulated" (then
  // EngineStream::handle is an emulated storage::DeviceBackend*), or
  // "auto": CUDA when built in and a GPU is present, else emulated.
  // Opened on first use on the calling thread's current device.
  std::string stream_backend = "auto";
  // Model weights (PutWeights, LoadWeights): how many chunk bytes one
  // batch moves: PutWeights hashes and Puts its chunks in batches of about
  // this size (small tensors' packs are assembled in a buffer of at most
  // this size, the only memory it allocates per byte of weights), and
  // LoadWeights reads a layer's chunks in Get calls of about this size
  // (each leases that much of the daemon's DRAM arena at most). At least
  // one chunk per batch: values below kWeightsMaxChunkBytes (64 MiB) act
  // as "one chunk at a time". Default: 128 MiB.
  uint64_t weights_batch_bytes = uint64_t{128} << 20;
  // LoadWeights hashes every chunk it copied and fails the layer with
  // Corruption when the bytes do not match the chunk's key. The daemon
  // already checks each chunk when it is stored and the NVMe tier checks
  // every read, so what this adds is a check of the DRAM copy against a
  // writer that scribbled on the arena (every client of the namespace maps
  // it writable; a stale writer whose lease expired could). It costs one
  // XXH3 pass over the bytes: about half of a warm load's speed on the
  // test VM. Default: false.
  bool weights_verify_loads = false;
};

// Result of Match: which of the asked pages are fully stored.
struct MatchResult {
  // Pages [0, leading_pages) have every segment of the layout stored: the
  // engine can skip prefill for leading_pages * page_tokens tokens.
  uint32_t leading_pages = 0;
  std::vector<Tier> tiers;  // per asked page; kMiss when not fully present
};

// One segment to store; `data.size()` is the segment's size.
struct SegmentWrite {
  SegmentKey key;
  std::span<const std::byte> data;
};

// What Put did with one segment. Dedup is success: a segment that was
// stored before is OK with already_stored set (nothing was copied), so
// callers test status.ok() alone and count already_stored if they care.
struct PutResult {
  // OK: the segment is stored (now, or before the call). Otherwise why it
  // is not: InvalidArgument (size does not fit the layout), Busy (another
  // client is writing it; retry), ResourceExhausted (no evictable space),
  // or a transport error (IOError, Unavailable, ProtocolError).
  Status status;
  // True only with an OK status: deduplicated, stored before this call.
  bool already_stored = false;

  bool ok() const { return status.ok(); }
};

// One segment to fetch into `dst`, whose size must equal the segment's.
struct SegmentRead {
  SegmentKey key;
  std::span<std::byte> dst;
};

// Zero-copy read access to segments, valid while the lease is held. The
// destructor releases the lease (RAII); the daemon also drops it after the
// lease TTL, after which the bytes may be reused: finish reading before.
// REQUIRES: the Client that made the lease outlives it.
class ReadLease {
 public:
  ReadLease() = default;
  ReadLease(ReadLease&&) noexcept;
  ReadLease& operator=(ReadLease&&) noexcept;
  ~ReadLease();

  // Per requested key: NotFound (miss) or OK with data() valid.
  const std::vector<Status>& statuses() const { return statuses_; }
  // The segment's bytes in the shared arena; empty for a miss.
  std::span<const std::byte> data(size_t i) const { return views_[i]; }
  size_t size() const { return views_.size(); }

  // Releases now. Returns the daemon's answer (NotFound if it expired).
  Status Release();

 private:
  friend class Client;
  class Client* client_ = nullptr;
  uint64_t lease_id_ = 0;
  std::vector<Status> statuses_;
  std::vector<std::span<const std::byte>> views_;
};

// Segments protected from eviction until Unpin, destruction, the TTL or
// the Client's disconnect. REQUIRES: the Client outlives the PinLease.
class PinLease {
 public:
  PinLease() = default;
  PinLease(PinLease&&) noexcept;
  PinLease& operator=(PinLease&&) noexcept;
  ~PinLease();

  const std::vector<Status>& statuses() const { return statuses_; }
  Status Unpin();

 private:
  friend class Client;
  class Client* client_ = nullptr;
  uint64_t lease_id_ = 0;
  std::vector<Status> statuses_;
};

// An engine-owned KV pool registered with the daemon (registered-pool
// mode, DESIGN.md §5): `slot_count` slots of `slot_bytes` bytes starting at
// `offset` of the pool's memory, holding segments of one (layer, part).
// slot_bytes must equal the layout's segment size. Two kinds of memory:
//   kMemfd: host memory in a memfd, which must allow sealing (memfd_create
//     with MFD_ALLOW_SEALING): RegisterPool seals it against shrinking, so
//     the daemon can never fault on a truncated pool.
//   kDeviceIpc: device memory (HBM) the engine exported: `device_handle`
//     is a cudaIpcMemHandle_t's 64 bytes (or, on a machine without a GPU,
//     the handle of tierkvd's emulated device backend), `device_pool_bytes`
//     the exported allocation's size. The daemon imports it into its [hbm]
//     device backend (which must be the same kind) and moves bytes with
//     device copies; per-layer completion waits for the device's events.
//     The engine keeps the allocation alive while the pool is registered.
//     A handle names a whole allocation, and a tensor of PyTorch's caching
//     allocator is usually a block inside a larger one: pass the handle
//     of the allocation holding it (cuMemGetAddressRange finds its base)
//     and `offset` = the tensor's address - that base
//     (storage::DeviceBackend::ExportRange computes both). Memory from
//     cudaMallocAsync pools or PyTorch's expandable segments has no such
//     handle (ExportRange says so): use kDeviceFd.
//   kDeviceFd: device memory exported as a file descriptor of its physical
//     allocation (the CUDA virtual memory API: cuMemExportToShareableHandle,
//     storage::DeviceBackend::ExportRangeFd), for the memory kDeviceIpc
//     cannot name (cudaMallocAsync pools, PyTorch's expandable segments).
//     `fd` travels over the socket; `device_pool_bytes` is the allocation's
//     size and `offset` where the slots begin in it. The daemon's mapping
//     holds the allocation, so it stays valid even if the engine frees it
//     or exits while a transfer runs (a kDeviceIpc import does not).
struct PoolSpec {
  enum class Kind : uint8_t {
    kMemfd = 0,
    kDeviceIpc = 1,
    kDeviceFd = 2,
  };
  Kind kind = Kind::kMemfd;
  int fd = -1;  // kMemfd, kDeviceFd: borrowed; the daemon keeps a duplicate
  std::array<std::byte, 64> device_handle{};  // kDeviceIpc
  uint64_t device_pool_bytes = 0;             // kDeviceIpc, kDeviceFd
  // kDeviceIpc, kDeviceFd: the UUID of the GPU holding the memory
  // (cudaDeviceProp::uuid; ExportRange and ExportRangeFd give it). Device
  // ordinals differ between processes (CUDA_VISIBLE_DEVICES), UUIDs do
  // not: tierkvd moves a pool's bytes with a backend on that GPU (one
  // tierkvd serves every GPU of the node; its HBM tier serves the pools on
  // its [hbm] device only), and refuses a GPU it cannot open, by name. All
  // zero: not said (taken as the [hbm] device).
  std::array<std::byte, 16> device_uuid{};
  uint64_t offset = 0;
  uint64_t slot_bytes = 0;
  uint32_t slot_count = 0;
  uint16_t layer = 0;
  uint8_t part = 0;
};

struct MatchOptions {
  // Whether the daemon prefetches the leading pages' segments below DRAM
  // into DRAM for the reads that follow (a prefix lookup's Get of every
  // layer). A reader whose Get follows at once and reads only some layers
  // (a sparse decode step) should say false: its Get promotes exactly what
  // it reads, and a prefetch would race it and move segments it never
  // reads. Default: true.
  bool prefetch = true;
  // Of the prefetch, only these layers. Default: every layer.
  LayerRange prefetch_layers;
};

// A Load or Store in flight. The daemon moves bytes layer by layer and
// publishes progress in shared memory, so waiting costs no round trip.
// Move-only; the destructor waits (up to the client timeout) until the
// daemon is done with the transfer, so the pools may be reused afterwards.
// REQUIRES: the Client that made it outlives it.
class TransferHandle {
 public:
  TransferHandle() = default;
  TransferHandle(TransferHandle&&) noexcept;
  TransferHandle& operator=(TransferHandle&&) noexcept;
  ~TransferHandle();

  // Blocks until layer `layer` is in place (Load) or saved (Store), and
  // returns one Status per page: OK, or NotFound (a Load page in no tier,
  // or failing its checksum: its slot was not written), Busy (no DRAM room
  // for a Store). IOError when the daemon does not finish the layer within
  // the client timeout; InvalidArgument for a layer outside the transfer.
  Result<std::vector<Status>> WaitLayer(uint16_t layer);
  // Waits for every layer; the per-page Status is the first failure of any
  // layer (for a Store: WaitForSave).
  Result<std::vector<Status>> Wait();
  // Queues on the engine's `stream` a device-side wait for layer `layer`:
  // work queued there afterwards runs once the layer is in place (Load) or
  // saved (Store: its slots may be overwritten), and no host thread waits
  // (CUDA: cuStreamWaitValue32 on the ticket, host memory mapped for the
  // device; LoadTicket::device_layers). The per-page statuses still come
  // from WaitLayer / Wait, called later, off the hot path: a page that
  // failed leaves its slot unwritten while the stream goes on, and the
  // engine must not trust that slot. No stream waits for ever: when
  // WaitLayer or Wait gives up (the client timeout) or the handle is
  // destroyed before the daemon finished, every wait queued on this
  // transfer is released (the slots then hold what they held). Errors:
  // InvalidArgument for a layer outside the transfer or a stream of
  // another kind than ClientOptions::stream_backend; the stream backend's
  // own (Unavailable: "cuda" without a GPU).
  // REQUIRES: the engine's stream outlives the wait (it synchronizes the
  // stream before destroying it).
  Status StreamWaitLayer(uint16_t layer, const EngineStream& stream);

  // Both record how long they blocked (0 when the layers were already
  // there) in the Client, which reports it to the daemon with its next
  // Load, Store or Prefetch (tierkv_layer_wait_seconds): the waits after a
  // client's last transfer request are not counted.

  // How many layers of the transfer are complete right now: layers
  // [first, first + LayersDone()) are in place (Load) or saved (Store).
  // Never blocks and makes no round trip (it reads the shared ticket); the
  // value only grows, up to the transfer's layer count. 0 for an empty
  // handle.
  uint16_t LayersDone() const;

  // When the daemon accepted the transfer, completed its first layer and
  // completed its last, as it stamped them (steady_clock: CLOCK_MONOTONIC,
  // one clock for the daemon and this process). Nullopt until the last
  // layer is complete, and for an empty handle. Never blocks. What a
  // layer-ordered engine overlaps is last_layer - accepted; its own waits
  // (tierkv_layer_wait_seconds) are the part it did not.
  struct Times {
    std::chrono::steady_clock::time_point accepted;
    std::chrono::steady_clock::time_point first_layer;
    std::chrono::steady_clock::time_point last_layer;
  };
  std::optional<Times> times() const;

 private:
  friend class Client;
  bool LayerReady(uint16_t layer) const;
  // Lets every stream wait on this transfer go (see StreamWaitLayer).
  void ReleaseStreamWaits();
  Result<std::vector<Status>> AwaitLayer(uint16_t layer);  // not recorded
  Result<std::vector<Status>> AwaitAll();
  class Client* client_ = nullptr;
  uint32_t ticket_ = 0;
  uint16_t first_ = 0;
  uint16_t count_ = 0;
  uint32_t pages_ = 0;
  uint32_t device_base_ = 0;  // LoadTicket::device_layers at submission
};

// One tensor of a shard to store (Client::PutWeights): its description, in
// load order, and its bytes, borrowed for the call. tensor.offset is
// ignored (PutWeights plans the image); tensor.bytes may be 0, meaning
// data.size(), and otherwise must equal it.
struct WeightsTensorData {
  WeightsTensor tensor;
  std::span<const std::byte> data;
};

// What PutWeights moved: chunks copied into the daemon, and chunks it held
// already (from an earlier version, another model, or earlier in this
// shard), which cost no copy: the dedup.
struct WeightsPutStats {
  uint32_t chunks_stored = 0;
  uint64_t bytes_stored = 0;
  uint32_t chunks_deduplicated = 0;
  uint64_t bytes_deduplicated = 0;
};

// What DropWeights did.
struct WeightsDropped {
  uint32_t shards = 0;       // sealed shards (versions) removed
  uint64_t freed_bytes = 0;  // chunk bytes no sealed shard references now
};

// When a sealed shard is next used (Client::HintWeights): `id` as for
// PrefetchWeights (zero version: the newest sealed now), `next_use` from
// now; negative: no known next use (clears the shard's hint).
struct WeightsHint {
  WeightsId id;
  std::chrono::milliseconds next_use{-1};
};

// A shard loading into a caller's image buffer (Client::LoadWeights), layer
// by layer in order, on a loader thread of its own, so the engine computes
// layer l while l + 1 loads.
//
// Move-only. The destructor stops the loader after the Get call in flight
// and waits for it, since it writes into the caller's buffer: once the
// handle is gone (or Wait returned) nothing writes the image any more. A
// load into an image pool (LoadWeightsToPool) is the daemon's: its
// destructor, and each WaitLayer, wait up to ClientOptions::timeout for
// the daemon (as TransferHandle's do; past it, StreamWaitLayer's device
// waits are released and Wait stops with IOError).
// Thread-safe: WaitLayer, Wait and LayersDone may be called from any
// threads at once (not while the handle is moved or destroyed).
// REQUIRES: the Client and the image buffer outlive the handle.
class WeightsLoad {
 public:
  WeightsLoad();
  WeightsLoad(WeightsLoad&&) noexcept;
  WeightsLoad& operator=(WeightsLoad&&) noexcept;
  ~WeightsLoad();

  // Blocks until the loader has finished layer `layer`. OK means every
  // byte of every chunk of that layer is in place in the image (and so
  // every tensor of the layer). Otherwise the layer's first failure, its
  // bytes partly unwritten: NotFound "chunk <hex> of layer 3 is in no
  // tier" when the daemon no longer holds a chunk (the shard must be
  // stored again), or the error of the Get that failed (IOError,
  // Unavailable, ...; every later layer then fails with it too).
  // InvalidArgument for a layer outside the load, or an empty handle.
  Status WaitLayer(uint32_t layer);
  // Waits for every layer; the first layer's failure, if any.
  Status Wait();
  // How many layers of the load are finished right now: layers [first,
  // first + LayersDone()) are done (WaitLayer returns at once for them,
  // OK or not). Never blocks; only grows. 0 for an empty handle.
  uint32_t LayersDone() const;
  // The layers this load covers: [first, first + count).
  uint32_t first_layer() const;
  uint32_t layer_count() const;
  // A load into a registered image pool (Client::LoadWeightsToPool) only:
  // queues on the engine's `stream` a device-side wait for layer `layer`,
  // as TransferHandle::StreamWaitLayer does (the layer's status still comes
  // from WaitLayer, off the hot path). InvalidArgument for a load into a
  // caller's buffer (Client::LoadWeights) or a layer outside the load.
  Status StreamWaitLayer(uint32_t layer, const EngineStream& stream);

 private:
  friend class Client;
  class Loader;       // what a load does: one of the two below
  class ImageLoader;  // LoadWeights: Gets into the caller's buffer
  class PoolLoader;   // LoadWeightsToPool: the daemon's Load machinery
  std::unique_ptr<Loader> loader_;
};

class Client {
 public:
  // Unavailable when no daemon listens at options.socket_path.
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Binds this client to namespace `name` and maps its arena. Returns
  // PermissionDenied for an unknown namespace or a wrong token.
  // REQUIRES: not called before on this Client with another namespace, and
  // complete before other threads use the Client (it sets up the arena
  // mapping every later call reads).
  Status OpenNamespace(const std::string& name, const std::string& token);

  // Registers the namespace's KV layout (once per namespace; identical
  // re-registration is OK, a different layout is InvalidArgument).
  Status RegisterLayout(const LayoutSpec& layout);
  // The layout known to the daemon, if any (fetched at OpenNamespace or
  // set by RegisterLayout). A copy: safe against a concurrent
  // RegisterLayout.
  std::optional<LayoutSpec> layout() const;

  // Which leading pages are fully present (all layers and parts); with
  // options.prefetch, the daemon also prefetches the leading pages'
  // segments below DRAM (NVMe) into DRAM for the reads that follow.
  // REQUIRES: a registered layout.
  Result<MatchResult> Match(std::span<const PageHash> pages,
                            const MatchOptions& options = {});

  // Stores segments: one PutResult per item, in order (see PutResult; a
  // deduplicated segment is OK with already_stored). Never fails as a
  // whole: a transport failure is reported in every affected item.
  std::vector<PutResult> Put(std::span<const SegmentWrite> writes);

  // Copies segments into caller buffers: one Status per item. NotFound =
  // miss; InvalidArgument = dst size differs from the segment's size.
  std::vector<Status> Get(std::span<const SegmentRead> reads);

  // Makes stored segments durable on the daemon's NVMe tier before
  // returning: one Status per key. OK = on NVMe (now or before); NotFound =
  // in neither tier; IOError = the device failed (the segment stays in
  // DRAM). The whole call fails with InvalidArgument when the daemon has no
  // NVMe tier. A segment acknowledged here survives a daemon crash.
  std::vector<Status> Flush(std::span<const SegmentKey> keys);

  // Leases segments for zero-copy reads from the mapped arena.
  Result<ReadLease> Acquire(std::span<const SegmentKey> keys);

  // Protects stored segments from eviction for up to `ttl`.
  Result<PinLease> Pin(std::span<const SegmentKey> keys,
                       std::chrono::milliseconds ttl);

  // Registers an engine pool (see PoolSpec). It belongs to this connection
  // and is unmapped by the daemon when the connection closes. Errors:
  // InvalidArgument (no layout, unknown layer/part, slot size differs, a
  // pool exists already for (layer, part), memfd too small, unsealable or
  // sealed read-only).
  Status RegisterPool(const PoolSpec& pool);

  // Copies the stored segments of `pages` into slot slots[i] of every
  // layer's pools, layer by layer in order (host DRAM or NVMe straight into
  // the slots). Returns at once; WaitLayer(l) blocks until layer l is in
  // place, so an engine computes layer l while l+1 loads. Errors:
  // InvalidArgument (sizes differ, a layer without a pool, a slot out of
  // range), Busy (daemon saturated or every transfer ticket in use).
  Result<TransferHandle> Load(std::span<const PageHash> pages,
                              std::span<const uint32_t> slots,
                              LayerRange layers = {});
  // Load ordered after the engine's stream, for device pools: the daemon
  // writes the slots only once the work the engine queued on `after`
  // before this call is done (the previous step's kernels may still read
  // the slots), and no host thread waits for it: the client queues a
  // write of the ticket's gate word on the stream (CUDA:
  // cuStreamWriteValue32) and the daemon starts when it sees it. Pair with
  // TransferHandle::StreamWaitLayer, so the engine's kernels wait for the
  // daemon on the device in turn. If the stream does not reach the write
  // within the daemon's device_copy_timeout (30 s), nothing is moved and
  // every page is Busy. Errors as Load's, and the stream backend's (see
  // StreamWaitLayer).
  Result<TransferHandle> Load(std::span<const PageHash> pages,
                              std::span<const uint32_t> slots,
                              LayerRange layers, const EngineStream& after);
  // Saves slot slots[i] of every layer's pools as the segments of pages[i]
  // (dedup: stored segments copy nothing); the namespace's write policy
  // then applies as for Put. Errors as for Load.
  Result<TransferHandle> Store(std::span<const PageHash> pages,
                               std::span<const uint32_t> slots,
                               LayerRange layers = {});
  // Store ordered after the engine's stream: the daemon reads the slots
  // only once the work queued on `after` before this call (the kernels
  // writing them) is done, with no host wait; otherwise as Load with
  // `after`.
  Result<TransferHandle> Store(std::span<const PageHash> pages,
                               std::span<const uint32_t> slots,
                               LayerRange layers, const EngineStream& after);
  // Queues promotion NVMe -> DRAM of the leading stored pages of `pages`
  // (asynchronous; Match keeps reporting each page's tier).
  Status Prefetch(std::span<const PageHash> pages);
  // Tells the daemon how often the engine's sparse attention selected
  // tokens of each page per full layer (SparseWorkingSet's counts, mapped
  // to page hashes), so a namespace with eviction_policy "topk" keeps the
  // pages selected most often in DRAM; other policies ignore it. The
  // counts apply to every layer sharing that full layer's selection
  // (IndexShare) and, with a larger weight, to its index keys. Send them
  // every few decode steps, not every step. Pages the daemon does not
  // hold are ignored. InvalidArgument for a layer outside the layout.
  Status ReportTopk(std::span<const SelectionReport> reports);

  // Daemon information (JSON: version, pid, uptime, namespaces). Works
  // without an opened namespace.
  Result<std::string> Ping();
  // This namespace's statistics as JSON (see README "tierkv stats").
  Result<std::string> StatsJson();

  struct ListedSegment {
    SegmentKey key;
    uint64_t size = 0;
    uint32_t refs = 0;
    Tier tier = Tier::kMiss;
  };
  // Up to `limit` stored segments of this namespace (for debugging).
  Result<std::vector<ListedSegment>> List(uint32_t limit);

  // ---- Model weights (include/tierkv/weights.h; issue 28) -----------------
  // On a Client opened on a namespace marked `weights = true` (any other
  // namespace answers InvalidArgument). The client plans and hashes; the
  // daemon stores chunks with the ordinary Put path (keyed
  // SegmentKey{chunk key, 0, 0} and verified against the key at commit),
  // so a chunk stored before copies nothing.

  // Stores one shard: plans `tensors` (in load order) into an image
  // (PlanWeightsImage), hashes every chunk, Puts the chunks in batches of
  // about ClientOptions::weights_batch_bytes (a large tensor's chunks
  // straight from the caller's memory; packs of small tensors assembled,
  // zero-padded, in a buffer of at most that size; with an NVMe tier each
  // batch is made durable there (Flush) before the next, as Seal needs),
  // then seals the manifest. Returns the sealed manifest (chunk keys set; its
  // version is WeightsVersionOf(manifest)). Sealing the same bytes again is OK.
  // `stats` (may be null) gets what was copied and what was deduplicated.
  // A chunk another client is storing at the same moment (Busy: ranks
  // backing up the same replicated tensors at once) is put again, with a
  // short backoff, for up to ClientOptions::timeout; then it is found
  // stored and copies nothing. Errors: InvalidArgument (a tensor's bytes
  // differ from data.size(), or what PlanWeightsImage refuses), and any
  // chunk's Put failure, naming the chunk and the tensors in it (Busy past
  // the timeout; ResourceExhausted: the namespace's DRAM has no room).
  // Nothing is sealed unless every chunk is stored; calling again after a
  // failure copies only the chunks not stored yet.
  Result<WeightsManifest> PutWeights(std::string model, std::string layout,
                                     std::span<const WeightsTensorData> tensors,
                                     WeightsPutStats* stats = nullptr);

  // Stores and seals a shard the engine laid out in this connection's
  // registered image pool (see LoadWeightsToPool for registering it) at
  // the offsets of `plan` (PlanWeightsImage of its tensors; chunk keys
  // ignored), with the bytes between tensors inside a pack zero (as a
  // zeroed buffer has them; other bytes there give other chunk keys than
  // PutWeights of the same tensors, so no dedup with its chunks and another
  // version): the daemon copies each chunk out of the pool (a device pool
  // by device copies) into private memory, hashes it there and stores it,
  // in requests of about ClientOptions::weights_batch_bytes, each made
  // durable on NVMe (when the daemon has an NVMe tier) before the next;
  // then the manifest is sealed. This process reads no byte of the pool.
  // Returns the sealed manifest (keys set); `stats` as for PutWeights.
  // Errors: InvalidArgument (a plan failing Validate() or too large to
  // seal, no image pool, a chunk outside it, not a weights namespace),
  // the failure of the first chunk that could not be stored (naming it),
  // Busy past the client timeout. Chunks stored before a failure stay.
  Result<WeightsManifest> PutWeightsFromPool(const WeightsManifest& plan,
                                             WeightsPutStats* stats = nullptr);

  // The sealed manifest of `id` (a zero version: the newest sealed version
  // of (model, layout)). NotFound when no such shard is sealed; Corruption
  // when what the daemon sent is not that shard's manifest (its version,
  // model or layout differ from the ones asked).
  Result<WeightsManifest> GetWeightsManifest(const WeightsId& id);

  // Starts loading layers `layers` of shard `manifest` into `image` (tensor
  // i lands at image[manifest.tensors[i].offset]); returns at once. A
  // loader thread Gets each layer's chunks (promoted from NVMe into the
  // daemon's DRAM where needed) in layer order and copies them to their
  // offsets; bytes between tensors outside packs are left untouched. See
  // WeightsLoad for the per-layer waits. Errors (nothing started):
  // InvalidArgument when image.size() < manifest.image_bytes, `layers`
  // lies outside [0, num_layers), or the manifest fails Validate().
  // REQUIRES: `image` and this Client outlive the returned handle.
  Result<WeightsLoad> LoadWeights(const WeightsManifest& manifest,
                                  std::span<std::byte> image,
                                  LayerRange layers = {});

  // Starts loading layers `layers` of shard `manifest` into this
  // connection's registered image pool, with the daemon's per-layer Load
  // machinery (the KV Load's lanes, tickets and waits): the engine's
  // weights buffer, registered once with RegisterPool({.kind = kMemfd,
  // kDeviceIpc or kDeviceFd, .layer = 0, .part = 0, .offset = where the
  // image starts, .slot_bytes = the buffer's bytes (>= image_bytes),
  // .slot_count = 1}) on a weights namespace. Tensor i lands at
  // pool[offset + manifest.tensors[i].offset]; the daemon moves the bytes
  // (DRAM: copies; NVMe: O_DIRECT reads verified by their checksums,
  // straight into a memfd image, through pinned staging into a device
  // one, pipelined; device pools by device copies), so this process
  // spends no CPU on them. A chunk that fails its checksum fails its layer
  // and its bytes are not left in the pool. With `after`, the daemon
  // starts once the engine's stream reaches this point (as Load's).
  // Returns at once; see WeightsLoad (WaitLayer, StreamWaitLayer). The
  // daemon loads exactly WeightsVersionOf(manifest). Errors (nothing
  // started): InvalidArgument (a manifest failing Validate(), layers
  // outside it, no image pool or one smaller than manifest.image_bytes,
  // not a weights namespace); NotFound when the daemon has no such sealed
  // shard; Busy when its workers are saturated.
  // REQUIRES: this Client outlives the returned handle; the pool stays
  // registered (and its memory alive) until the handle is gone.
  Result<WeightsLoad> LoadWeightsToPool(const WeightsManifest& manifest,
                                        LayerRange layers = {},
                                        const EngineStream* after = nullptr);

  // Asks the daemon to promote the chunks of layers `layers` of shard `id`
  // (zero version: the newest) from NVMe into DRAM, in layer order, ahead
  // of a LoadWeights; returns once queued. NotFound for an unknown shard.
  Status PrefetchWeights(const WeightsId& id, LayerRange layers = {});

  // Every sealed shard of `model` (empty: of every model), with where its
  // chunks are now (WeightsInfo), in (model, layout, sealed) order: at most
  // 8192 per call, what one reply carries (ask per model past that).
  Result<std::vector<WeightsInfo>> ListWeights(const std::string& model = "");

  // Unseals shards of id.model: of id.layout only (empty: every layout),
  // of id.version only (zero: every version). A chunk no sealed shard
  // references any more is freed. NotFound when nothing matched;
  // InvalidArgument without a model.
  Result<WeightsDropped> DropWeights(const WeightsId& id);

  // Tells the daemon when shards are next used (a schedule: MOPD teachers
  // in turn). Its DRAM then evicts the chunks of unhinted shards first,
  // then those whose next use is farthest, so a version leaves whole; a
  // shard needed within the namespace's prefetch_horizon_ms is promoted
  // from NVMe ahead of its load. Every hint applies alone: OK when all
  // did, else the first failure, naming its item (NotFound: no such
  // shard). Hints live in the daemon's memory (a restart clears them).
  Status HintWeights(std::span<const WeightsHint> hints);
  // Keeps shard `id` (zero version: the newest) in DRAM for `ttl`: its
  // chunks are promoted and not evicted until the ttl passes or a
  // PinWeights with ttl 0 (or less) unpins it. NotFound for an unknown shard;
  // ResourceExhausted when the pinned shards' chunks would pass half the
  // namespace's DRAM. A later pin of a pinned shard sets its new ttl.
  Status PinWeights(const WeightsId& id, std::chrono::milliseconds ttl);

 private:
  friend class ReadLease;
  friend class PinLease;
  friend class TransferHandle;
  Result<TransferHandle> Transfer(bool load, std::span<const PageHash> pages,
                                  std::span<const uint32_t> slots,
                                  LayerRange layers, const EngineStream* after);
  // Seals `manifest` (every chunk stored); ProtocolError when the daemon
  // sealed another version.
  Status SealWeights(const WeightsManifest& manifest);
  // Takes a ticket, arms its stream gate (`after`), sends request `opcode`
  // encoded by `encode(ticket)`, and hands back the transfer of layers
  // [first, first + count) over `pages` pages (the ticket's error index).
  Result<TransferHandle> SubmitTransfer(
      uint16_t opcode,
      const std::function<std::vector<std::byte>(uint32_t ticket)>& encode,
      uint16_t first, uint16_t count, uint32_t pages,
      const EngineStream* after);
  class Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  Status ReleaseLease(uint64_t lease_id);

  std::unique_ptr<Impl> impl_;
};

// Stores a safetensors checkpoint (a .safetensors file, or a directory as
// SafetensorsReader opens it: model.safetensors.index.json's shards, else
// every *.safetensors in it) as shard (model, layout) through
// client.PutWeights, straight from the file mapping. Layer groups come
// from the names: a tensor whose name has a component `layers.N` (HF
// `model.layers.3.mlp...`, Megatron `decoder.layers.3...`) is in group N;
// tensors before the first such tensor in file order (embeddings) go with
// the lowest N, and the others (final norm, lm_head, and anything else
// without a layer) with the highest. Groups are renumbered densely from 0
// in ascending N (so layers 3, 5 become groups 0, 1); a checkpoint with no
// layers is one group 0. Tensors are stored ordered by (group, file
// order). Errors: those of SafetensorsReader::Open (NotFound, Corruption)
// and of PutWeights; InvalidArgument for an empty checkpoint or a tensor
// of 0 bytes (the image has no room for empty tensors).
Result<WeightsManifest> ImportSafetensors(Client& client, std::string model,
                                          std::string layout,
                                          const std::filesystem::path& path,
                                          WeightsPutStats* stats = nullptr);

}  // namespace tierkv
