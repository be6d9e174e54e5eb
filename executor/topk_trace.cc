// TopkTrace writer, reader and overlap statistics (see topk_trace.h for the
// byte layout).
//
// The varint is written here rather than taken from a library: LEB128 is a
// dozen lines, and the only dependency that has one (protobuf) would be a
// large one for a single function.
#include "executor/topk_trace.h"

#include <fmt/format.h>
#include <sys/stat.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tierkv::executor {
namespace {

constexpr size_t kFixedHeaderBytes = 16;  // magic, version, flags, H
constexpr size_t kChecksumBytes = 4;
constexpr size_t kMaxVarintBytes = 10;
// Bytes of the largest varint of a value below 2^31 (an id, a count).
constexpr uint64_t kMaxIdVarintBytes = 5;

uint32_t Checksum(const void* data, size_t size) {
  return static_cast<uint32_t>(XXH3_64bits(data, size));
}

void PutU16(uint16_t v, uint8_t* out) {
  out[0] = static_cast<uint8_t>(v);
  out[1] = static_cast<uint8_t>(v >> 8);
}
void PutU32(uint32_t v, uint8_t* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutU64(uint64_t v, uint8_t* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint16_t GetU16(const uint8_t* in) {
  return static_cast<uint16_t>(in[0] | (in[1] << 8));
}
uint32_t GetU32(const uint8_t* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(in[i]) << (8 * i);
  return v;
}
uint64_t GetU64(const uint8_t* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(in[i]) << (8 * i);
  return v;
}

// Checks one selection against the TopkStep contract.
Status CheckSelection(const TopkTraceHeader& h, int64_t context_tokens,
                      size_t full_index, std::span<const int32_t> ids) {
  const int32_t layer = h.full_layers[full_index];
  if (static_cast<int64_t>(ids.size()) > h.k) {
    return Status::InvalidArgument(fmt::format(
        "layer {}: {} ids selected, more than k = {}", layer, ids.size(), h.k));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= context_tokens) {
      return Status::InvalidArgument(fmt::format(
          "layer {}: id {} outside [0, {})", layer, ids[i], context_tokens));
    }
    if (i > 0 && ids[i] <= ids[i - 1]) {
      return Status::InvalidArgument(
          fmt::format("layer {}: ids not strictly ascending ({} after {})",
                      layer, ids[i], ids[i - 1]));
    }
  }
  return Status::OK();
}

// Reads varints from a record or header body, turning every failure into a
// message naming the field.
class BodyDecoder {
 public:
  explicit BodyDecoder(std::span<const uint8_t> data) : data_(data) {}
  // Returns false with *error set when the varint is malformed or > max.
  bool Next(const char* field, uint64_t max, uint64_t* value,
            std::string* error) {
    const size_t at = pos_;
    if (!DecodeVarint(data_, &pos_, value)) {
      *error = fmt::format(
          "{} at body byte {}: malformed varint or the "
          "body ends inside it",
          field, at);
      return false;
    }
    if (*value > max) {
      *error = fmt::format("{} at body byte {}: {} exceeds {}", field, at,
                           *value, max);
      return false;
    }
    return true;
  }
  size_t pos() const { return pos_; }
  size_t remaining() const { return data_.size() - pos_; }

 private:
  std::span<const uint8_t> data_;
  size_t pos_ = 0;
};

// Decodes a header body (after the fixed 16 bytes) into *h. Returns false
// with *error naming the field.
bool ParseHeaderBody(std::span<const uint8_t> body, TopkTraceHeader* h,
                     std::string* error) {
  BodyDecoder d(body);
  uint64_t v = 0;
  if (!d.Next("num_layers", kTopkTraceMaxLayers, &v, error)) return false;
  if (v == 0) {
    *error = "num_layers is 0";
    return false;
  }
  h->num_layers = static_cast<int64_t>(v);
  if (!d.Next("page_tokens", kTopkTraceMaxPageTokens, &v, error)) return false;
  h->page_tokens = static_cast<int64_t>(v);
  if (!d.Next("k", kTopkTraceMaxK, &v, error)) return false;
  h->k = static_cast<int64_t>(v);
  const uint64_t last_layer = static_cast<uint64_t>(h->num_layers) - 1;
  if (!d.Next("full layer count", last_layer + 1, &v, error)) return false;
  h->full_layers.resize(v);
  for (int32_t& l : h->full_layers) {
    if (!d.Next("full layer", last_layer, &v, error)) return false;
    l = static_cast<int32_t>(v);
  }
  h->selection_source.resize(static_cast<size_t>(h->num_layers));
  for (int32_t& s : h->selection_source) {
    if (!d.Next("selection source", last_layer, &v, error)) return false;
    s = static_cast<int32_t>(v);
  }
  if (!d.Next("source length", kTopkTraceMaxSourceBytes, &v, error)) {
    return false;
  }
  if (v != d.remaining()) {
    *error = fmt::format("source length {} but {} header bytes remain", v,
                         d.remaining());
    return false;
  }
  h->source.assign(reinterpret_cast<const char*>(body.data() + d.pos()), v);
  if (Status s = h->Validate(); !s.ok()) {
    *error = std::string(s.message());
    return false;
  }
  return true;
}

}  // namespace

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

bool DecodeVarint(std::span<const uint8_t> data, size_t* pos, uint64_t* value) {
  uint64_t v = 0;
  size_t p = *pos;
  for (size_t i = 0; i < kMaxVarintBytes; ++i, ++p) {
    if (p >= data.size()) return false;
    const uint8_t byte = data[p];
    const uint64_t group = byte & 0x7f;
    // The tenth byte holds bit 63 only.
    if (i == kMaxVarintBytes - 1 && group > 1) return false;
    v |= group << (7 * i);
    if ((byte & 0x80) == 0) {
      if (i > 0 && byte == 0) return false;  // not minimal
      *value = v;
      *pos = p + 1;
      return true;
    }
  }
  return false;  // longer than 10 bytes
}

int TopkTraceHeader::FullIndex(int64_t layer) const {
  const auto it = std::lower_bound(full_layers.begin(), full_layers.end(),
                                   static_cast<int32_t>(layer));
  if (it == full_layers.end() || *it != layer) return -1;
  return static_cast<int>(it - full_layers.begin());
}

Status TopkTraceHeader::Validate() const {
  auto bad = [](std::string_view field, const std::string& why) {
    return Status::InvalidArgument(
        fmt::format("topk trace header: {} {}", field, why));
  };
  if (num_layers < 1 || num_layers > kTopkTraceMaxLayers) {
    return bad("num_layers", fmt::format("{} outside [1, {}]", num_layers,
                                         kTopkTraceMaxLayers));
  }
  if (page_tokens < 1 || page_tokens > kTopkTraceMaxPageTokens) {
    return bad("page_tokens", fmt::format("{} outside [1, {}]", page_tokens,
                                          kTopkTraceMaxPageTokens));
  }
  if (k < 1 || k > kTopkTraceMaxK) {
    return bad("k", fmt::format("{} outside [1, {}]", k, kTopkTraceMaxK));
  }
  if (full_layers.empty() || full_layers[0] != 0) {
    return bad("full_layers", "must start with layer 0");
  }
  for (size_t i = 0; i < full_layers.size(); ++i) {
    if (full_layers[i] >= num_layers ||
        (i > 0 && full_layers[i] <= full_layers[i - 1])) {
      return bad("full_layers",
                 fmt::format("must be strictly ascending layers below {} "
                             "(entry {} is {})",
                             num_layers, i, full_layers[i]));
    }
  }
  if (static_cast<int64_t>(selection_source.size()) != num_layers) {
    return bad("selection_source",
               fmt::format("has {} entries for {} layers",
                           selection_source.size(), num_layers));
  }
  int32_t last_full = -1;
  for (int32_t l = 0; l < num_layers; ++l) {
    if (FullIndex(l) >= 0) last_full = l;
    if (selection_source[l] != last_full) {
      return bad("selection_source",
                 fmt::format("of layer {} is {}; must be {} (the layer itself "
                             "when full, else the last full layer before it)",
                             l, selection_source[l], last_full));
    }
  }
  if (source.size() > kTopkTraceMaxSourceBytes) {
    return bad("source", fmt::format("is {} bytes, more than {}", source.size(),
                                     kTopkTraceMaxSourceBytes));
  }
  return Status::OK();
}

Result<TopkTraceHeader> TopkTraceHeaderFor(
    const std::vector<bool>& indexer_full, int64_t page_tokens, int64_t k,
    std::string source) {
  TopkTraceHeader h;
  h.num_layers = static_cast<int64_t>(indexer_full.size());
  h.page_tokens = page_tokens;
  h.k = k;
  h.source = std::move(source);
  int32_t last_full = -1;
  for (size_t l = 0; l < indexer_full.size(); ++l) {
    if (indexer_full[l]) {
      last_full = static_cast<int32_t>(l);
      h.full_layers.push_back(last_full);
    }
    h.selection_source.push_back(last_full);
  }
  TIERKV_RETURN_IF_ERROR(h.Validate());
  return h;
}

uint64_t MaxRecordBodyBytes(const TopkTraceHeader& h) {
  const uint64_t per_layer =
      kMaxIdVarintBytes + static_cast<uint64_t>(h.k) * kMaxIdVarintBytes;
  const uint64_t max = kMaxIdVarintBytes + h.full_layers.size() * per_layer;
  return std::min<uint64_t>(max, kTopkTraceEndMarker - 1);
}

// ---------------------------------------------------------------- writer

TopkTraceWriter::TopkTraceWriter(std::filesystem::path path,
                                 TopkTraceHeader header, std::FILE* file)
    : path_(std::move(path)), header_(std::move(header)), file_(file) {}

TopkTraceWriter::~TopkTraceWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

Result<std::unique_ptr<TopkTraceWriter>> TopkTraceWriter::Create(
    const std::filesystem::path& path, const TopkTraceHeader& header) {
  TIERKV_RETURN_IF_ERROR(header.Validate());
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return Status::IOError(fmt::format("cannot create topk trace {}: {}",
                                       path.string(), std::strerror(errno)));
  }
  std::unique_ptr<TopkTraceWriter> w(new TopkTraceWriter(path, header, f));
  std::string body;
  AppendVarint(static_cast<uint64_t>(header.num_layers), &body);
  AppendVarint(static_cast<uint64_t>(header.page_tokens), &body);
  AppendVarint(static_cast<uint64_t>(header.k), &body);
  AppendVarint(header.full_layers.size(), &body);
  for (int32_t l : header.full_layers) AppendVarint(l, &body);
  for (int32_t s : header.selection_source) AppendVarint(s, &body);
  AppendVarint(header.source.size(), &body);
  body += header.source;
  std::string bytes(kFixedHeaderBytes, '\0');
  auto* fixed = reinterpret_cast<uint8_t*>(bytes.data());
  std::memcpy(fixed, kTopkTraceMagic, sizeof(kTopkTraceMagic));
  PutU16(kTopkTraceVersion, fixed + 8);
  PutU16(0, fixed + 10);
  PutU32(static_cast<uint32_t>(body.size()), fixed + 12);
  bytes += body;
  uint8_t sum[kChecksumBytes];
  PutU32(Checksum(bytes.data(), bytes.size()), sum);
  bytes.append(reinterpret_cast<const char*>(sum), sizeof(sum));
  TIERKV_RETURN_IF_ERROR(w->Write(bytes.data(), bytes.size()));
  return w;
}

Status TopkTraceWriter::Write(const void* data, size_t size) {
  if (!error_.ok()) return error_;
  if (std::fwrite(data, 1, size, file_) != size) {
    error_ = Status::IOError(fmt::format("write to topk trace {} failed: {}",
                                         path_.string(), std::strerror(errno)));
    return error_;
  }
  bytes_ += size;
  return Status::OK();
}

Status TopkTraceWriter::Append(const TopkStep& step) {
  if (file_ == nullptr) {
    return Status::InvalidArgument(
        fmt::format("topk trace {}: Append after Finish", path_.string()));
  }
  if (step.context_tokens < 1 ||
      step.context_tokens > kTopkTraceMaxContextTokens) {
    return Status::InvalidArgument(
        fmt::format("topk trace step {}: context_tokens {} outside [1, {}]",
                    steps_, step.context_tokens, kTopkTraceMaxContextTokens));
  }
  if (step.selections.size() != header_.full_layers.size()) {
    return Status::InvalidArgument(fmt::format(
        "topk trace step {}: {} selections for {} full layers", steps_,
        step.selections.size(), header_.full_layers.size()));
  }
  body_.clear();
  AppendVarint(static_cast<uint64_t>(step.context_tokens), &body_);
  for (size_t f = 0; f < step.selections.size(); ++f) {
    const std::vector<int32_t>& ids = step.selections[f];
    if (Status s = CheckSelection(header_, step.context_tokens, f, ids);
        !s.ok()) {
      return Status::InvalidArgument(
          fmt::format("topk trace step {}: {}", steps_, s.message()));
    }
    AppendVarint(ids.size(), &body_);
    int64_t previous = 0;
    for (int32_t id : ids) {
      AppendVarint(static_cast<uint64_t>(id - previous), &body_);
      previous = id;
    }
  }
  uint8_t head[4], sum[kChecksumBytes];
  PutU32(static_cast<uint32_t>(body_.size()), head);
  PutU32(Checksum(body_.data(), body_.size()), sum);
  TIERKV_RETURN_IF_ERROR(Write(head, sizeof(head)));
  TIERKV_RETURN_IF_ERROR(Write(body_.data(), body_.size()));
  TIERKV_RETURN_IF_ERROR(Write(sum, sizeof(sum)));
  ++steps_;
  return Status::OK();
}

Status TopkTraceWriter::Finish() {
  if (file_ == nullptr) {
    return Status::InvalidArgument(
        fmt::format("topk trace {}: Finish called twice", path_.string()));
  }
  uint8_t end[4 + 8 + kChecksumBytes];
  PutU32(kTopkTraceEndMarker, end);
  PutU64(static_cast<uint64_t>(steps_), end + 4);
  PutU32(Checksum(end + 4, 8), end + 12);
  Status s = Write(end, sizeof(end));
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (s.ok() && !closed) {
    s = Status::IOError(fmt::format("closing topk trace {} failed: {}",
                                    path_.string(), std::strerror(errno)));
  }
  return s;
}

// ---------------------------------------------------------------- reader

TopkTraceReader::TopkTraceReader(std::filesystem::path path, std::FILE* file,
                                 uint64_t file_bytes)
    : path_(std::move(path)), file_(file), file_bytes_(file_bytes) {}

TopkTraceReader::~TopkTraceReader() { std::fclose(file_); }

Result<std::unique_ptr<TopkTraceReader>> TopkTraceReader::Open(
    const std::filesystem::path& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int error = errno;
    const std::string why = fmt::format("cannot open topk trace {}: {}",
                                        path.string(), std::strerror(error));
    return error == ENOENT ? Status::NotFound(why) : Status::IOError(why);
  }
  struct stat st {};
  if (fstat(fileno(f), &st) != 0) {
    std::fclose(f);
    return Status::IOError(fmt::format("cannot stat topk trace {}: {}",
                                       path.string(), std::strerror(errno)));
  }
  std::unique_ptr<TopkTraceReader> r(
      new TopkTraceReader(path, f, static_cast<uint64_t>(st.st_size)));
  TIERKV_RETURN_IF_ERROR(r->ReadHeader());
  return r;
}

Status TopkTraceReader::CorruptionAt(uint64_t offset,
                                     const std::string& what) const {
  return Status::Corruption(fmt::format("topk trace {}, offset {}: {}",
                                        path_.string(), offset, what));
}

Status TopkTraceReader::ReadExact(void* data, size_t size, const char* what) {
  const size_t got = std::fread(data, 1, size, file_);
  if (got != size) {
    if (std::ferror(file_)) {
      return Status::IOError(fmt::format("reading topk trace {} failed: {}",
                                         path_.string(), std::strerror(errno)));
    }
    return CorruptionAt(offset_ + got,
                        fmt::format("truncated: the file ends {} bytes into "
                                    "{} ({} bytes expected)",
                                    got, what, size));
  }
  offset_ += size;
  return Status::OK();
}

Status TopkTraceReader::ReadHeader() {
  uint8_t fixed[kFixedHeaderBytes];
  TIERKV_RETURN_IF_ERROR(ReadExact(fixed, sizeof(fixed), "the file header"));
  if (std::memcmp(fixed, kTopkTraceMagic, sizeof(kTopkTraceMagic)) != 0) {
    return CorruptionAt(0, "not a topk trace (magic \"TIERKVTK\" expected)");
  }
  const uint16_t version = GetU16(fixed + 8);
  if (version != kTopkTraceVersion) {
    return CorruptionAt(8, fmt::format("unsupported version {} (this reader "
                                       "knows version {})",
                                       version, kTopkTraceVersion));
  }
  if (const uint16_t flags = GetU16(fixed + 10); flags != 0) {
    return CorruptionAt(10, fmt::format("unknown flags 0x{:04x}", flags));
  }
  const uint32_t body_bytes = GetU32(fixed + 12);
  if (body_bytes + uint64_t{kFixedHeaderBytes + kChecksumBytes} > file_bytes_) {
    return CorruptionAt(
        12, fmt::format("truncated: the header declares {} body bytes, the "
                        "file has {} bytes in all",
                        body_bytes, file_bytes_));
  }
  std::vector<uint8_t> bytes(fixed, fixed + sizeof(fixed));
  bytes.resize(kFixedHeaderBytes + body_bytes + kChecksumBytes);
  TIERKV_RETURN_IF_ERROR(ReadExact(bytes.data() + kFixedHeaderBytes,
                                   body_bytes + kChecksumBytes,
                                   "the header body"));
  const size_t sum_at = kFixedHeaderBytes + body_bytes;
  const uint32_t stored = GetU32(bytes.data() + sum_at);
  const uint32_t computed = Checksum(bytes.data(), sum_at);
  if (stored != computed) {
    return CorruptionAt(sum_at, fmt::format("header checksum mismatch (stored "
                                            "0x{:08x}, computed 0x{:08x})",
                                            stored, computed));
  }
  std::string error;
  if (!ParseHeaderBody(std::span<const uint8_t>(
                           bytes.data() + kFixedHeaderBytes, body_bytes),
                       &header_, &error)) {
    return CorruptionAt(kFixedHeaderBytes, "header body: " + error);
  }
  max_body_ = MaxRecordBodyBytes(header_);
  return Status::OK();
}

Result<bool> TopkTraceReader::Next(TopkStep* step) {
  if (!error_.ok()) return error_;
  if (done_) return false;
  auto fail = [&](Status s) -> Result<bool> {
    error_ = std::move(s);
    return error_;
  };
  const uint64_t record_at = offset_;
  const std::string record = fmt::format("record {}", steps_);
  if (offset_ == file_bytes_) {
    return fail(CorruptionAt(
        offset_, fmt::format("truncated: no end record after {} steps (the "
                             "writer did not finish)",
                             steps_)));
  }
  uint8_t head[4];
  if (Status s =
          ReadExact(head, sizeof(head), (record + "'s size field").c_str());
      !s.ok()) {
    return fail(s);
  }
  const uint32_t body_bytes = GetU32(head);
  if (body_bytes == kTopkTraceEndMarker) {
    uint8_t end[8 + kChecksumBytes];
    if (Status s = ReadExact(end, sizeof(end), "the end record"); !s.ok()) {
      return fail(s);
    }
    const uint32_t stored = GetU32(end + 8), computed = Checksum(end, 8);
    if (stored != computed) {
      return fail(CorruptionAt(
          record_at, fmt::format("end record checksum mismatch (stored "
                                 "0x{:08x}, computed 0x{:08x})",
                                 stored, computed)));
    }
    const uint64_t count = GetU64(end);
    if (count != static_cast<uint64_t>(steps_)) {
      return fail(CorruptionAt(
          record_at, fmt::format("the end record counts {} steps, {} were "
                                 "read",
                                 count, steps_)));
    }
    if (offset_ != file_bytes_) {
      return fail(CorruptionAt(
          offset_,
          fmt::format("{} bytes after the end record", file_bytes_ - offset_)));
    }
    done_ = true;
    return false;
  }
  if (body_bytes == 0 || body_bytes > max_body_) {
    return fail(CorruptionAt(
        record_at, fmt::format("{} declares a body of {} bytes; a valid one "
                               "has 1 to {}",
                               record, body_bytes, max_body_)));
  }
  if (offset_ + body_bytes + kChecksumBytes > file_bytes_) {
    return fail(CorruptionAt(
        record_at, fmt::format("truncated: {} declares {} + {} bytes, the "
                               "file has {} left",
                               record, body_bytes, kChecksumBytes,
                               file_bytes_ - offset_)));
  }
  body_.resize(body_bytes + kChecksumBytes);
  if (Status s = ReadExact(body_.data(), body_.size(), record.c_str());
      !s.ok()) {
    return fail(s);
  }
  const uint32_t stored = GetU32(body_.data() + body_bytes);
  const uint32_t computed = Checksum(body_.data(), body_bytes);
  if (stored != computed) {
    return fail(CorruptionAt(
        record_at, fmt::format("{} checksum mismatch (stored 0x{:08x}, "
                               "computed 0x{:08x})",
                               record, stored, computed)));
  }
  // The checksum matched: what remains to catch is a writer bug or a
  // deliberate edit, reported with the body byte.
  BodyDecoder d(std::span<const uint8_t>(body_.data(), body_bytes));
  std::string error;
  uint64_t v = 0;
  auto bad = [&](const std::string& why) {
    return fail(CorruptionAt(record_at, fmt::format("{}: {}", record, why)));
  };
  if (!d.Next("context_tokens", kTopkTraceMaxContextTokens, &v, &error)) {
    return bad(error);
  }
  if (v == 0) return bad("context_tokens is 0");
  step->context_tokens = static_cast<int64_t>(v);
  const size_t num_full = header_.full_layers.size();
  step->selections.resize(num_full);
  for (size_t f = 0; f < num_full; ++f) {
    std::vector<int32_t>& ids = step->selections[f];
    const int32_t layer = header_.full_layers[f];
    if (!d.Next("id count", static_cast<uint64_t>(header_.k), &v, &error)) {
      return bad(fmt::format("layer {}: {}", layer, error));
    }
    if (v > d.remaining()) {  // every id takes at least one byte
      return bad(fmt::format("layer {}: {} ids in {} remaining bytes", layer, v,
                             d.remaining()));
    }
    ids.resize(v);
    int64_t id = -1;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!d.Next("id", kTopkTraceMaxContextTokens, &v, &error)) {
        return bad(fmt::format("layer {}: {}", layer, error));
      }
      if (i > 0 && v == 0) {
        return bad(fmt::format("layer {}: id {} repeats", layer, id));
      }
      id = i == 0 ? static_cast<int64_t>(v) : id + static_cast<int64_t>(v);
      if (id >= step->context_tokens) {
        return bad(fmt::format("layer {}: id {} outside the {} visible tokens",
                               layer, id, step->context_tokens));
      }
      ids[i] = static_cast<int32_t>(id);
    }
  }
  if (d.remaining() != 0) {
    return bad(fmt::format("{} bytes left over in the body", d.remaining()));
  }
  ++steps_;
  return true;
}

// ---------------------------------------------------------------- overlap

double SelectionOverlap(std::span<const int32_t> current,
                        std::span<const int32_t> previous) {
  if (current.empty()) return 0.0;
  size_t i = 0, j = 0, common = 0;
  while (i < current.size() && j < previous.size()) {
    if (current[i] < previous[j]) {
      ++i;
    } else if (previous[j] < current[i]) {
      ++j;
    } else {
      ++common, ++i, ++j;
    }
  }
  return static_cast<double>(common) / static_cast<double>(current.size());
}

TopkOverlapMeter::TopkOverlapMeter(size_t num_full_layers)
    : previous_(num_full_layers),
      sum_(num_full_layers, 0.0),
      pairs_(num_full_layers, 0),
      seen_(num_full_layers),
      distinct_(num_full_layers, 0) {}

void TopkOverlapMeter::Add(const TopkStep& step) {
  for (size_t f = 0; f < previous_.size(); ++f) {
    const std::vector<int32_t>& ids = step.selections[f];
    if (steps_ > 0 && !ids.empty()) {
      sum_[f] += SelectionOverlap(ids, previous_[f]);
      ++pairs_[f];
    }
    std::vector<bool>& seen = seen_[f];
    for (int32_t id : ids) {
      if (static_cast<size_t>(id) >= seen.size()) {
        seen.resize(
            std::max<size_t>(static_cast<size_t>(id) + 1, seen.size() * 2));
      }
      if (!seen[id]) {
        seen[id] = true;
        ++distinct_[f];
      }
    }
    previous_[f] = ids;
  }
  ++steps_;
}

std::vector<double> TopkOverlapMeter::MeanOverlap() const {
  std::vector<double> mean(sum_.size(), 0.0);
  for (size_t f = 0; f < sum_.size(); ++f) {
    if (pairs_[f] > 0) mean[f] = sum_[f] / static_cast<double>(pairs_[f]);
  }
  return mean;
}

std::vector<int64_t> TopkOverlapMeter::DistinctIds() const { return distinct_; }

Result<TopkTraceSummary> SummarizeTopkTrace(const std::filesystem::path& path) {
  auto reader = TopkTraceReader::Open(path);
  if (!reader.ok()) return reader.status();
  TopkTraceSummary s;
  s.header = (*reader)->header();
  s.file_bytes = (*reader)->file_bytes();
  TopkOverlapMeter meter(s.header.full_layers.size());
  TopkStep step;
  while (true) {
    auto more = (*reader)->Next(&step);
    if (!more.ok()) return more.status();
    if (!*more) break;
    meter.Add(step);
    for (const auto& ids : step.selections) {
      s.ids += static_cast<int64_t>(ids.size());
    }
  }
  s.steps = (*reader)->steps_read();
  s.mean_overlap = meter.MeanOverlap();
  s.distinct_ids = meter.DistinctIds();
  return s;
}

}  // namespace tierkv::executor
