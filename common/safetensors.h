// Safetensors files: a memory-mapped reader (single file, directory, or a
// sharded checkpoint described by model.safetensors.index.json) and a
// streaming writer. In common/ because two layers read checkpoints: the
// reference executor (executor/weights.cc) and the client library's
// ImportSafetensors (client/weights_import.cc), which must not depend on
// the executor.
//
// Format (huggingface/safetensors): u64 little-endian header length N, N
// bytes of JSON {name: {dtype, shape, data_offsets: [begin, end)}, optional
// "__metadata__"}, then the data section; offsets are relative to it.
//
// The reader validates every header entry at Open(): offsets inside the data
// section (else Corruption "... is truncated ..."), shape/dtype sizes that
// agree for the dtypes SafetensorsDTypeSize knows. An unknown dtype string is
// kept and reported when that tensor is read, so unrelated extra tensors do not
// block loading.
//
// Thread safety: a SafetensorsReader is immutable after Open() and may be
// read from many threads. Tensor data spans stay valid for its lifetime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tierkv/status.h"

namespace tierkv {

struct TensorView {
  std::string name;
  std::string dtype;  // safetensors dtype string, e.g. "BF16"
  std::vector<int64_t> shape;
  std::span<const std::byte> data;  // borrowed from the reader's mapping
  std::string file;                 // file that holds it (for messages)
  // Where it is stored: the file's position in the order Open() read the
  // files (sorted names, or the index's sorted shard names), and its data
  // offset inside that file's data section. Together: "file order".
  uint32_t file_index = 0;
  uint64_t file_offset = 0;
};

// The element size in bytes of a safetensors dtype string ("F32" 4, "BF16"
// 2, "F8_E4M3" 1, "BOOL" 1, ...), or 0 for a dtype the format does not
// define (kept, never interpreted, by the reader).
size_t SafetensorsDTypeSize(std::string_view dtype);

class MappedFile;

class SafetensorsReader {
 public:
  // `path` is a .safetensors file or a directory. A directory uses
  // model.safetensors.index.json when present (every shard it names must
  // exist), else every *.safetensors file in it. Returns NotFound when there
  // is nothing to read, Corruption for malformed or truncated files.
  static Result<std::unique_ptr<SafetensorsReader>> Open(
      const std::filesystem::path& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  // Null when absent.
  const TensorView* Find(const std::string& name) const;
  size_t size() const { return tensors_.size(); }
  std::vector<std::string> Names() const;  // sorted by name
  // Every tensor in file order (file_index, then file_offset): the order
  // the checkpoint's writer laid them out in. Views owned by the reader.
  std::vector<const TensorView*> InFileOrder() const;

 private:
  SafetensorsReader() = default;
  Status AddFile(const std::filesystem::path& file);

  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, TensorView> tensors_;
};

// One tensor to write: dtype is a safetensors dtype string and nbytes its
// data size (the writer does not check nbytes against shape, so tests can
// write deliberately broken files).
struct TensorSpec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
};

// Fills the bytes of tensor `index`; returning an error aborts the write.
using TensorFiller = std::function<Status(size_t index, std::span<std::byte>)>;

// Writes `tensors` in order to `file`, streaming one tensor at a time.
// Returns IOError on write failure.
Status WriteSafetensors(const std::filesystem::path& file,
                        std::span<const TensorSpec> tensors,
                        const TensorFiller& fill);

// Convenience for tests: tensors with their bytes already in memory.
struct RawTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};
Status WriteSafetensors(const std::filesystem::path& file,
                        const std::vector<RawTensor>& tensors);

}  // namespace tierkv
