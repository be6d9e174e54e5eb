// SparseWorkingSet: the rows a sparse-attention decode reads, kept close
// (DESIGN.md §5, data path 3: HiSparse's per-request buffer, with tierkv's
// prefix cache behind it).
//
// DeepSeek Sparse Attention reads, per decode step and layer, the rows of
// the k tokens its lightning indexer selected (k = 2048 for GLM-5) out of a
// context of up to 200K tokens. The whole context stays where it already is
// in this process: the engine's registered pool that tierkvd loaded, or the
// daemon's host arena mapped here (RowSource says where a token's row is).
// A working set keeps a fixed number of token slots per IndexShare group in
// its own buffer and, each step, serves the selected tokens from its slots,
// copies the missed ones in from the source row by row (page + offset,
// never a whole page), and replaces victims chosen by its policy. There is
// no RPC per step.
//
// The buffer is host memory, or device memory (WorkingSetMemory::kDevice:
// one HBM pool for every layer's slots, allocated once). On the device a
// layer's misses go in by one row gather per layer and step (the device
// reads the source rows where they lie when that memory is registered,
// RegisterSourceMemory), hits are never copied, and attention reads the
// slots in place (Rows: the buffer and each selected token's slot, what a
// sparse attention kernel taking a KV buffer and per-token indices, as
// FlashMLA's sparse decode does, consumes). Without a GPU the device is
// emulated in host memory by the same code path.
//
// IndexShare: the layers that reuse a full layer's selection form one
// group with one slot map (one set of decisions per step), while every
// layer keeps its own rows: a group's row buffer is [layers][slots][row].
// A layer's missed rows are copied when that layer asks for them
// (Gather), so each copy happens at its layer's turn, as a device buffer
// would be filled before that layer's attention.
//
// Policies (WorkingSetPolicy):
//   lru   the least recently selected resident token goes first (HiSparse's
//         exact LRU);
//   topk  how often a token comes back into the selection, with
//         exponential decay: a token's score is Σ decay^(steps since each
//         return), a run of consecutive selections counting once, so a
//         token the indexer keeps choosing again outranks one it chose
//         once, and an old favourite fades; ties go to recency. Attention sinks
//         (the first sink_tokens) and the recent window (the last recent_tokens
//         of the context) go last: DSA selects them nearly every step. Eviction
//         is O(log slots) amortized (a lazily updated heap).
//
// Selection counts: per (page, full layer), accumulated across steps and
// taken by TakeSelectionCounts(); an engine hands them to tierkvd
// (Client::ReportTopk) every few steps, so the daemon keeps the pages the
// indexer keeps choosing in DRAM.
//
// Thread safety: not thread-safe (one decode loop per working set).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tierkv/engine_stream.h"
#include "tierkv/status.h"

namespace tierkv {

enum class WorkingSetPolicy : uint8_t { kLru = 0, kTopk = 1 };

// Where the working set keeps its slots.
enum class WorkingSetMemory : uint8_t { kHost = 0, kDevice = 1 };

// "lru" | "topk"; InvalidArgument otherwise.
Result<WorkingSetPolicy> ParseWorkingSetPolicy(std::string_view name);
const char* WorkingSetPolicyName(WorkingSetPolicy policy);

struct WorkingSetOptions {
  // Token slots per group. REQUIRES: >= every selection's size (k).
  // Default: 4096 (HiSparse's device_buffer_size is 4096-6144 for k 2048).
  uint32_t slots = 4096;
  WorkingSetPolicy policy = WorkingSetPolicy::kLru;  // Default: lru
  // topk: a score's factor per step, in (0, 1). Default: 0.99 (a return
  // weighs half after ~69 steps).
  double decay = 0.99;
  // topk: tokens [0, sink_tokens) go only when every other resident token
  // is selected. Default: 4.
  uint32_t sink_tokens = 4;
  // topk: the same for the last recent_tokens of the context.
  // Default: 64.
  uint32_t recent_tokens = 64;
  // Tokens per page, for selection counts. Default: 64.
  uint32_t page_tokens = 64;
  // Default: kHost.
  WorkingSetMemory memory = WorkingSetMemory::kHost;
  // kDevice: "auto" (CUDA when this build has it and a device is present,
  // else a device emulated in host memory; buffer_fallback() says why),
  // "cuda" (Unavailable without a device) or "emulated". Default: auto.
  std::string device_backend = "auto";
  // kDevice: the CUDA device ordinal, or -1: the device current on the
  // calling thread at Create (cudaSetDevice / torch.cuda.set_device), so
  // an engine on GPU k gets its slots on GPU k. Every call gives the
  // caller's current device back as it found it. Default: -1.
  int device = -1;
};

// Where token `token`'s row of layer `layer` is now, in this process's
// memory: exactly the layer's row_bytes. An empty span means the row does
// not exist (a bug in the caller: Select fails with NotFound).
using RowSource =
    std::function<std::span<const std::byte>(uint16_t layer, int32_t token)>;

struct WorkingSetLayout {
  // For each layer, the full layer whose selection it reads (a full layer
  // maps to itself; an IndexShare layer to the last full layer before it).
  std::vector<uint16_t> group_of_layer;
  // Bytes of one row of each layer (its KV format's latent row).
  std::vector<uint32_t> row_bytes;
};

struct WorkingSetStats {
  uint64_t steps = 0;      // Select calls
  uint64_t selected = 0;   // ids over all Select calls
  uint64_t hits = 0;       // of those, already resident
  uint64_t misses = 0;     // copied in (each for every layer of the group)
  uint64_t bytes_in = 0;   // row bytes copied from the source
  uint64_t evictions = 0;  // resident tokens replaced
  uint64_t gathers = 0;    // device row gathers (one per layer and step
                           // with misses); 0 for a host buffer
};

// One layer's rows of its group's last selection, in place: row i of the
// selection is the row_bytes at base + slots[i] * row_bytes. `base` is
// host memory when host_addressable, else device memory (CUDA), for a
// kernel. Valid until the group's next Select, Reset or the working set's
// end.
struct WorkingSetRows {
  const std::byte* base = nullptr;
  uint32_t row_bytes = 0;
  std::span<const uint32_t> slots;
  bool host_addressable = true;
};

// Selected-token counts of one page on one full layer.
struct SelectionCount {
  uint32_t page = 0;   // token / page_tokens
  uint16_t layer = 0;  // a full layer
  uint32_t count = 0;
};

class SparseWorkingSet {
 public:
  // InvalidArgument for an empty layout, mismatched vectors, a group
  // layer that is not a full layer, slots == 0, decay outside (0, 1), an
  // unknown device backend; kDevice: the device's error when it has no
  // room for the slots (ResourceExhausted) or "cuda" finds no device
  // (Unavailable). `source` must outlive the working set.
  static Result<std::unique_ptr<SparseWorkingSet>> Create(
      const WorkingSetLayout& layout, const WorkingSetOptions& options,
      RowSource source);
  ~SparseWorkingSet();

  SparseWorkingSet(const SparseWorkingSet&) = delete;
  SparseWorkingSet& operator=(const SparseWorkingSet&) = delete;

  // One step of full layer `group`: makes `ids` (its selection, unique,
  // each < context_tokens) resident for every layer of the group, evicting
  // by the policy. `context_tokens` is the number of tokens visible now
  // (for the recent window). InvalidArgument for a layer that is not a
  // full layer, duplicate or out-of-range ids, or more ids than slots;
  // NotFound when the source has no row of the full layer for a missed id
  // (nothing changes).
  Status Select(uint16_t group, std::span<const int32_t> ids,
                int64_t context_tokens);

  // Copies the rows of `layer`'s group's last selection, in selection
  // order, into `out` (ids × row_bytes), first copying in the rows that
  // selection missed for this layer. InvalidArgument when `out` has the
  // wrong size or the group has no selection; NotFound when the source
  // has no row of a missed id in this layer (that id leaves the slots).
  // On a device buffer that the host cannot address (CUDA), the rows are
  // packed on the device (one kernel, into a buffer of the largest
  // selection's size allocated at the first such Gather) and copied back
  // in one piece: a host consumer's convenience; a device consumer uses
  // Rows.
  Status Gather(uint16_t layer, std::span<std::byte> out);

  // The same rows in place, after copying in the ones that selection missed
  // for this layer (as Gather). Errors as Gather's.
  Result<WorkingSetRows> Rows(uint16_t layer);

  // Rows, stream-ordered: the decode hot path on a device buffer. The rows
  // the selection missed for this layer are gathered on the engine's
  // `stream`, after the work queued there before (the previous step's
  // attention, which may still read the slots the gather overwrites) and
  // before what the engine queues after (this layer's attention), and the
  // call returns without waiting on the host. Later fills (Select's rows
  // owed by the previous selection) follow on the same stream; Gather and
  // Rows without a stream order themselves after it on the device. A fault
  // of the gather fails the device (sticky, as CUDA's) and the next call
  // says so. InvalidArgument on a host buffer or a stream of another kind
  // than the buffer's device; else errors as Rows'.
  // REQUIRES: the engine synchronizes `stream` before the working set ends.
  Result<WorkingSetRows> Rows(uint16_t layer, const EngineStream& stream);

  // kDevice: registers host memory the sources' rows lie in (the mapped
  // host arena, the engine's registered pool) with the device, so misses
  // are read from it by the device directly (CUDA: pinned and mapped;
  // without it each missed row is a copy of its own). Unregistered when the
  // working set ends. AlreadyExists for a range overlapping a registered
  // one; a host buffer needs nothing (OK).
  Status RegisterSourceMemory(std::span<std::byte> memory);

  // Forgets every resident token and score (a new request or a truncated
  // context); keeps the buffers.
  void Reset();

  // Counts per (page, full layer) of the selections since the last call,
  // and clears them.
  std::vector<SelectionCount> TakeSelectionCounts();

  WorkingSetStats stats() const;
  const WorkingSetOptions& options() const;
  // "host", "emulated" or "cuda": where the slots are.
  std::string_view buffer_backend() const;
  // Why "auto" chose the emulated device ("" otherwise), for a log line.
  std::string_view buffer_fallback() const;
  // kDevice: the ordinal of the device holding the slots (-1 resolved);
  // kHost: -1.
  int buffer_device() const;

  class Impl;

 private:
  explicit SparseWorkingSet(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tierkv
