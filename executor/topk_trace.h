// TopkTrace: a compact, versioned binary file of DeepSeek Sparse Attention
// top-k selections, one record per decode step, for the benchmarks of a
// sparse working set (a per-request token cache that keeps the rows the
// lightning indexer selects close; glm5-dsa.md §2.1, §4). Written by
// `tierkv-run --record-topk` (topk_trace_recorder.h) and by the synthetic
// generator `tierkv-bench topk-trace`.
//
// File format, version 1
// ======================
// Integers are little-endian. "varint" is unsigned LEB128: 7 bits per byte,
// least significant group first, the high bit set on every byte but the
// last, at most 10 bytes, minimal length (a multi-byte varint never ends in
// a 0x00 byte). Checksums are the low 32 bits of XXH3_64bits (seed 0).
//
// Header:
//   offset  bytes  field
//   0       8      magic "TIERKVTK"
//   8       2      u16 version = 1
//   10      2      u16 flags = 0 (reserved: a reader rejects any set bit)
//   12      4      u32 H = size of the header body
//   16      H      header body, all varints unless noted:
//                    num_layers            1 .. kMaxLayers
//                    page_tokens           1 .. kMaxPageTokens (KV page)
//                    k                     1 .. kMaxK (index_topk: the most
//                                          ids one selection may hold)
//                    F                     full (indexer) layers, >= 1
//                    F x full_layer        strictly ascending, < num_layers;
//                                          the first is layer 0
//                    num_layers x source   the full layer whose selection
//                                          layer l uses (IndexShare): l
//                                          itself for a full layer, else the
//                                          last full layer before l
//                    S, then S bytes       `source`: free text (UTF-8,
//                                          S <= kMaxSourceBytes) saying
//                                          what produced the trace
//   16 + H  4      u32 checksum of bytes [0, 16 + H)
//
// Then one record per decode step:
//   4      u32 B = body size (1 .. MaxRecordBodyBytes(header); 0xFFFFFFFF
//          is the end marker below, never a body size)
//   B      body:
//            varint V                  context tokens visible to the step
//                                      (its position + 1), 1 .. 2^31
//            for each full layer, in header order:
//              varint n                ids selected, 0 .. k
//              n varints               the ids ascending: the first one
//                                      absolute, then id[i] - id[i - 1]
//                                      (>= 1: ids are unique); every id < V
//   4      u32 checksum of the body
//
// Then the end record, written by TopkTraceWriter::Finish():
//   4      u32 0xFFFFFFFF
//   8      u64 number of step records before it
//   4      u32 checksum of those 8 bytes
// Nothing follows it. A file without it was not finished (its writer died
// or was not Finish()ed), and reads as truncated.
//
// Size: ids cost one byte while the gaps between them stay below 128
// tokens: ~1.0 byte per id for 2048 ids among 32K-68K tokens, ~1.15 among
// 128K, ~1.4 for 256 among 32K (synthetic traces, topk_trace_synth.h).
//
// Thread safety: TopkTraceWriter and TopkTraceReader are not thread-safe;
// use each from one thread. Free functions are pure.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tierkv/status.h"

namespace tierkv::executor {

inline constexpr char kTopkTraceMagic[8] = {'T', 'I', 'E', 'R',
                                            'K', 'V', 'T', 'K'};
inline constexpr uint16_t kTopkTraceVersion = 1;
// Format limits (a reader treats a value beyond them as corruption).
inline constexpr int64_t kTopkTraceMaxLayers = 4096;
inline constexpr int64_t kTopkTraceMaxPageTokens = int64_t{1} << 20;
inline constexpr int64_t kTopkTraceMaxK = int64_t{1} << 24;
inline constexpr int64_t kTopkTraceMaxContextTokens = int64_t{1} << 31;
inline constexpr size_t kTopkTraceMaxSourceBytes = 4096;
inline constexpr uint32_t kTopkTraceEndMarker = 0xFFFFFFFFu;

struct TopkTraceHeader {
  int64_t num_layers = 0;
  // Tokens per KV page of the engine that made the trace. Default: 64.
  int64_t page_tokens = 64;
  // index_topk: the most ids one selection holds.
  int64_t k = 0;
  // Full (indexer) layers, ascending; selections of a step come in this
  // order.
  std::vector<int32_t> full_layers;
  // [num_layers]: the full layer whose selection layer l attends over.
  std::vector<int32_t> selection_source;
  // What produced the trace, e.g. "tierkv-run glm5-small seed 1 prompt 600".
  std::string source;

  // The position of `layer` in full_layers, or -1 when it is not full.
  int FullIndex(int64_t layer) const;
  // Checks the limits and invariants of the format (see the file comment).
  // Returns InvalidArgument naming the field.
  Status Validate() const;
};

// The header of a model whose layer l runs its own indexer iff
// indexer_full[l] (ModelConfig::indexer_full): shared layers use the last
// full layer before them. Returns InvalidArgument when the result does not
// Validate() (e.g. layer 0 shared).
Result<TopkTraceHeader> TopkTraceHeaderFor(
    const std::vector<bool>& indexer_full, int64_t page_tokens, int64_t k,
    std::string source);

// One decode step.
struct TopkStep {
  // Tokens visible to the step: its position + 1 (the new token included).
  int64_t context_tokens = 0;
  // One selection per full layer, in the header's order; each ascending,
  // unique, ids in [0, context_tokens), at most k ids.
  std::vector<std::vector<int32_t>> selections;

  friend bool operator==(const TopkStep&, const TopkStep&) = default;
};

// The largest step body a valid record of `header` can have, in bytes.
uint64_t MaxRecordBodyBytes(const TopkTraceHeader& header);

// Writes a trace: Create → Append per step → Finish. Owns its file.
class TopkTraceWriter {
 public:
  // Creates (truncates) `path` and writes the header. Returns
  // InvalidArgument when !header.Validate(), IOError when the file cannot
  // be created or written.
  static Result<std::unique_ptr<TopkTraceWriter>> Create(
      const std::filesystem::path& path, const TopkTraceHeader& header);
  // Closes the file. Without a successful Finish() it has no end record
  // and readers report it truncated.
  ~TopkTraceWriter();
  TopkTraceWriter(const TopkTraceWriter&) = delete;
  TopkTraceWriter& operator=(const TopkTraceWriter&) = delete;

  // Appends one step record. Returns InvalidArgument for a step that breaks
  // the TopkStep contract for this header (nothing is written then),
  // IOError when writing fails (then every later call fails too).
  // REQUIRES: Finish() not called.
  Status Append(const TopkStep& step);
  // Writes the end record and closes the file (not fsynced). Returns
  // IOError on failure, InvalidArgument when called twice.
  Status Finish();

  const TopkTraceHeader& header() const { return header_; }
  int64_t steps_written() const { return steps_; }
  // Bytes written so far (the file size once finished).
  uint64_t bytes_written() const { return bytes_; }

 private:
  TopkTraceWriter(std::filesystem::path path, TopkTraceHeader header,
                  std::FILE* file);
  Status Write(const void* data, size_t size);

  std::filesystem::path path_;
  TopkTraceHeader header_;
  std::FILE* file_;  // owned; null once closed
  Status error_;     // sticky IO error
  int64_t steps_ = 0;
  uint64_t bytes_ = 0;
  std::string body_;  // reused encoding buffer
};

// Reads a trace written by TopkTraceWriter. Owns its file.
class TopkTraceReader {
 public:
  // Opens `path` and checks its header. Returns NotFound / IOError when it
  // cannot be read, Corruption (naming the file, offset and what was
  // expected) for a wrong magic, an unknown version or flags, a header
  // checksum mismatch or a truncated header.
  static Result<std::unique_ptr<TopkTraceReader>> Open(
      const std::filesystem::path& path);
  ~TopkTraceReader();
  TopkTraceReader(const TopkTraceReader&) = delete;
  TopkTraceReader& operator=(const TopkTraceReader&) = delete;

  const TopkTraceHeader& header() const { return header_; }

  // Reads the next step into *step: true with a step, false at the end
  // record. Returns Corruption naming the file, record number and offset
  // for a truncated file (including one without an end record), a checksum
  // mismatch, a malformed varint or a value outside the format, and
  // IOError for a failed read. Steps before a damaged record are returned
  // normally, so a consumer may keep them. After false or an error every
  // call returns the same.
  Result<bool> Next(TopkStep* step);

  int64_t steps_read() const { return steps_; }
  uint64_t file_bytes() const { return file_bytes_; }

 private:
  TopkTraceReader(std::filesystem::path path, std::FILE* file,
                  uint64_t file_bytes);
  Status ReadHeader();
  // Reads exactly `size` bytes at the current offset, or returns Corruption
  // saying that the file ends while reading `what`.
  Status ReadExact(void* data, size_t size, const char* what);
  Status CorruptionAt(uint64_t offset, const std::string& what) const;

  std::filesystem::path path_;
  std::FILE* file_;  // owned
  uint64_t file_bytes_ = 0;
  uint64_t offset_ = 0;
  TopkTraceHeader header_;
  uint64_t max_body_ = 0;
  int64_t steps_ = 0;
  bool done_ = false;
  Status error_;
  std::vector<uint8_t> body_;  // reused
};

// |current ∩ previous| / |current|; 0 when `current` is empty.
// REQUIRES: both ascending.
double SelectionOverlap(std::span<const int32_t> current,
                        std::span<const int32_t> previous);

// Consecutive-step overlap per full layer, fed step by step:
// the mean over steps t >= 1 (with a non-empty S_t) of
// |S_t ∩ S_{t-1}| / |S_t|. Also counts the distinct ids each layer selected
// over the whole trace (its working set).
class TopkOverlapMeter {
 public:
  explicit TopkOverlapMeter(size_t num_full_layers);
  // REQUIRES: step.selections.size() == num_full_layers, ascending.
  void Add(const TopkStep& step);
  // Per full layer; 0 for a layer without a consecutive pair.
  std::vector<double> MeanOverlap() const;
  // Per full layer: distinct ids selected in any step.
  std::vector<int64_t> DistinctIds() const;
  int64_t steps() const { return steps_; }

 private:
  std::vector<std::vector<int32_t>> previous_;
  std::vector<double> sum_;
  std::vector<int64_t> pairs_;
  std::vector<std::vector<bool>> seen_;
  std::vector<int64_t> distinct_;
  int64_t steps_ = 0;
};

// A whole trace's figures, read from its file.
struct TopkTraceSummary {
  TopkTraceHeader header;
  int64_t steps = 0;
  int64_t ids = 0;  // over all steps and full layers
  uint64_t file_bytes = 0;
  std::vector<double> mean_overlap;   // per full layer (TopkOverlapMeter)
  std::vector<int64_t> distinct_ids;  // per full layer
};

// Reads `path` to its end record. Returns TopkTraceReader's errors.
Result<TopkTraceSummary> SummarizeTopkTrace(const std::filesystem::path& path);

// LEB128 varints as the format uses them; exposed for tests and tools.
void AppendVarint(uint64_t value, std::string* out);
// Decodes one varint from data[*pos...], advancing *pos. Returns false
// (leaving *pos) when the bytes end first, it is longer than 10 bytes, it
// overflows 64 bits or it is not minimal.
bool DecodeVarint(std::span<const uint8_t> data, size_t* pos, uint64_t* value);

}  // namespace tierkv::executor
