// Implements include/tierkv/weights.h: the manifest's rules (Validate), the
// image planner, chunk keys and the manifest's binary encoding.
//
// Encoding, format 1 (all integers little-endian):
//   u32 magic "TKWM" | u16 format (1)
//   str model | str layout | u32 num_layers | u64 image_bytes
//   u32 tensor count, then per tensor:
//     str name | str dtype | u8 rank | rank x i64 dims | u32 layer
//     | u64 offset | u64 bytes
//   u32 chunk count, then per chunk:
//     u64 key.lo | u64 key.hi | u64 offset | u64 bytes | u32 layer
// where str is a u32 length then the bytes. The encoding is canonical (one
// manifest, one byte string), so its hash can name the version.
//
// The reader is local rather than transport/wire.h's WireReader: tierkv_common
// sits below tierkv_transport and must not depend on it.
#include <algorithm>
#include <bit>
#include <cstring>
#include <string>
#include <unordered_set>
#include <utility>

#define XXH_INLINE_ALL  // header-only: lets the compiler inline XXH3
#include <fmt/format.h>
#include <xxhash.h>

#include "tierkv/weights.h"

namespace tierkv {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the manifest encoding assumes a little-endian host");

constexpr uint32_t kManifestMagic = 0x4D574B54;  // "TKWM" little-endian
constexpr uint16_t kManifestFormat = 1;
constexpr size_t kMaxModelName = 128;
constexpr size_t kMaxLayoutName = 256;
constexpr size_t kMaxTensorName = 1024;
constexpr size_t kMaxDtype = 16;
constexpr size_t kMaxRank = 8;

uint64_t AlignUp(uint64_t v, uint64_t alignment) {
  return (v + alignment - 1) / alignment * alignment;
}

bool IsModelChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '@' ||
         c == '+' || c == '-';
}

bool IsLayoutChar(char c) {
  return IsModelChar(c) || c == '/' || c == ':' || c == '=' || c == ',';
}

Status CheckName(std::string_view what, std::string_view s, size_t max_len,
                 bool (*allowed)(char)) {
  if (s.empty() || s.size() > max_len) {
    return Status::InvalidArgument(fmt::format(
        "weights {} must be 1..{} bytes, not {}", what, max_len, s.size()));
  }
  for (char c : s) {
    if (!allowed(c)) {
      return Status::InvalidArgument(fmt::format(
          "weights {} '{}' has a character outside the allowed set", what, s));
    }
  }
  return Status::OK();
}

// The rules on a tensor that do not depend on where it is in the image.
Status CheckTensorFields(const WeightsTensor& t, size_t index) {
  if (t.name.empty() || t.name.size() > kMaxTensorName) {
    return Status::InvalidArgument(
        fmt::format("tensor {}: name must be 1..{} bytes, not {}", index,
                    kMaxTensorName, t.name.size()));
  }
  if (t.dtype.empty() || t.dtype.size() > kMaxDtype) {
    return Status::InvalidArgument(fmt::format(
        "tensor '{}': dtype must be 1..{} characters", t.name, kMaxDtype));
  }
  for (char c : t.dtype) {
    if (c < 0x20 || c > 0x7e) {
      return Status::InvalidArgument(fmt::format(
          "tensor '{}': dtype has a non-printable character", t.name));
    }
  }
  if (t.shape.size() > kMaxRank) {
    return Status::InvalidArgument(
        fmt::format("tensor '{}': {} dimensions, more than {}", t.name,
                    t.shape.size(), kMaxRank));
  }
  for (int64_t d : t.shape) {
    if (d < 0) {
      return Status::InvalidArgument(
          fmt::format("tensor '{}': negative dimension {}", t.name, d));
    }
  }
  if (t.bytes == 0 || t.bytes > kWeightsMaxImageBytes) {
    return Status::InvalidArgument(
        fmt::format("tensor '{}': {} bytes, not in 1..{}", t.name, t.bytes,
                    kWeightsMaxImageBytes));
  }
  if (t.layer >= kWeightsMaxLayers) {
    return Status::InvalidArgument(
        fmt::format("tensor '{}': layer {} is not below the limit {}", t.name,
                    t.layer, kWeightsMaxLayers));
  }
  return Status::OK();
}

// Everything about the tensors except their offsets: names, counts, layer
// order and uniqueness.
Status CheckHeaderAndTensors(std::string_view model, std::string_view layout,
                             const std::vector<WeightsTensor>& tensors) {
  TIERKV_RETURN_IF_ERROR(CheckName("model", model, kMaxModelName, IsModelChar));
  TIERKV_RETURN_IF_ERROR(
      CheckName("layout", layout, kMaxLayoutName, IsLayoutChar));
  if (tensors.empty()) {
    return Status::InvalidArgument("a weights shard needs at least one tensor");
  }
  if (tensors.size() > kWeightsMaxTensors) {
    return Status::InvalidArgument(fmt::format(
        "{} tensors, more than {}", tensors.size(), kWeightsMaxTensors));
  }
  if (tensors.front().layer != 0) {
    return Status::InvalidArgument(
        fmt::format("tensor '{}': the first tensor's layer must be 0, not {}",
                    tensors.front().name, tensors.front().layer));
  }
  std::unordered_set<std::string_view> names;
  names.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const WeightsTensor& t = tensors[i];
    TIERKV_RETURN_IF_ERROR(CheckTensorFields(t, i));
    if (i > 0 && t.layer < tensors[i - 1].layer) {
      return Status::InvalidArgument(fmt::format(
          "tensor '{}': layer {} after layer {} (layers must not decrease)",
          t.name, t.layer, tensors[i - 1].layer));
    }
    if (!names.insert(t.name).second) {
      return Status::InvalidArgument(
          fmt::format("tensor name '{}' appears twice", t.name));
    }
  }
  return Status::OK();
}

// Whether a tensor starting at `offset` of `bytes` ends inside the image
// limit, without overflowing.
bool EndsWithinLimit(uint64_t offset, uint64_t bytes) {
  return offset <= kWeightsMaxImageBytes &&
         bytes <= kWeightsMaxImageBytes - offset;
}

// Every chunk of `m` against its tensors (offsets already checked
// ascending and inside the image): each chunk starts where the previous
// one's tensor bytes left off, so no tensor byte is skipped or covered
// twice; it ends inside a tensor or at a tensor's end, so no chunk byte is
// trailing padding; every tensor it touches is of its layer.
Status CheckChunks(const WeightsManifest& m) {
  const auto& tensors = m.tensors;
  const auto& chunks = m.chunks;
  if (chunks.empty()) return Status::InvalidArgument("a shard without chunks");
  size_t ti = 0;                          // the tensor holding `pos`
  uint64_t pos = tensors.front().offset;  // the next tensor byte to cover
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    const WeightsChunk& c = chunks[ci];
    if (c.bytes == 0 || c.bytes > kWeightsMaxChunkBytes) {
      return Status::InvalidArgument(
          fmt::format("chunk {} at {}: {} bytes, not in 1..{}", ci, c.offset,
                      c.bytes, kWeightsMaxChunkBytes));
    }
    if (ti == tensors.size()) {
      return Status::InvalidArgument(
          fmt::format("chunk {} at {}: past the last tensor", ci, c.offset));
    }
    if (c.offset != pos) {
      return Status::InvalidArgument(fmt::format(
          "chunk {} starts at {}, but the next tensor byte to cover is at {} "
          "(in tensor '{}')",
          ci, c.offset, pos, tensors[ti].name));
    }
    if (c.bytes > m.image_bytes - c.offset) {
      return Status::InvalidArgument(
          fmt::format("chunk {} at {} ends past the image ({} bytes)", ci,
                      c.offset, m.image_bytes));
    }
    const uint64_t end = c.offset + c.bytes;
    uint64_t last_tensor_end = 0;
    while (ti < tensors.size() && tensors[ti].offset < end) {
      const WeightsTensor& t = tensors[ti];
      if (t.layer != c.layer) {
        return Status::InvalidArgument(
            fmt::format("chunk {} (layer {}) holds tensor '{}' of layer {}", ci,
                        c.layer, t.name, t.layer));
      }
      const uint64_t t_end = t.offset + t.bytes;
      if (t_end > end) {  // the next chunk continues this tensor
        pos = end;
        last_tensor_end = end;
        break;
      }
      last_tensor_end = t_end;
      ++ti;
      pos = ti < tensors.size() ? tensors[ti].offset : m.image_bytes;
    }
    if (last_tensor_end != end) {
      return Status::InvalidArgument(fmt::format(
          "chunk {} at {} ends at {}, in padding after a tensor ending at {}",
          ci, c.offset, end, last_tensor_end));
    }
  }
  if (ti != tensors.size()) {
    return Status::InvalidArgument(
        fmt::format("tensor '{}' is not covered by chunks", tensors[ti].name));
  }
  return Status::OK();
}

// Bounds-checked little-endian reads from an untrusted manifest encoding.
// The first failure sticks (later reads return zero values), so the
// decoder checks ok() where it matters and once at the end.
class ManifestReader {
 public:
  explicit ManifestReader(std::span<const std::byte> in) : in_(in) {}

  template <typename T>
  T Int() {
    T v{};
    if (!Need(sizeof(T))) return v;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string String(size_t max_len) {
    const uint32_t n = Int<uint32_t>();
    if (n > max_len || !Need(n)) {
      failed_ = true;
      return {};
    }
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  // A count of items of at least `min_item_bytes` each, at most
  // `max_count`, and no more than the bytes left could hold: a hostile
  // count cannot make the decoder allocate.
  uint32_t Count(size_t min_item_bytes, uint32_t max_count) {
    const uint32_t n = Int<uint32_t>();
    if (failed_ || n > max_count || n > remaining() / min_item_bytes) {
      failed_ = true;
      return 0;
    }
    return n;
  }
  bool ok() const { return !failed_; }
  size_t remaining() const { return failed_ ? 0 : in_.size() - pos_; }
  void Fail() { failed_ = true; }

 private:
  bool Need(size_t n) {
    if (failed_ || in_.size() - pos_ < n) {
      failed_ = true;
      return false;
    }
    return true;
  }

  std::span<const std::byte> in_;
  size_t pos_ = 0;
  bool failed_ = false;
};

class ManifestWriter {
 public:
  template <typename T>
  void Int(T v) {
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &v, sizeof(T));
  }
  void String(std::string_view s) {
    Int(static_cast<uint32_t>(s.size()));
    const size_t at = out_.size();
    out_.resize(at + s.size());
    if (!s.empty()) std::memcpy(out_.data() + at, s.data(), s.size());
  }
  std::vector<std::byte> Take() { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

// The fewest bytes one encoded tensor / chunk takes (empty strings, rank 0).
constexpr size_t kMinTensorBytes = 4 + 4 + 1 + 4 + 8 + 8;
constexpr size_t kChunkBytes = 16 + 8 + 8 + 4;

}  // namespace

Status WeightsManifest::Validate() const {
  TIERKV_RETURN_IF_ERROR(CheckHeaderAndTensors(model, layout, tensors));
  uint64_t prev_end = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const WeightsTensor& t = tensors[i];
    if (i > 0 && t.offset < prev_end) {
      return Status::InvalidArgument(fmt::format(
          "tensor '{}' at {} overlaps or precedes the tensor before it, which "
          "ends at {}",
          t.name, t.offset, prev_end));
    }
    if (!EndsWithinLimit(t.offset, t.bytes)) {
      return Status::InvalidArgument(
          fmt::format("tensor '{}' ends past the image limit of {} bytes",
                      t.name, kWeightsMaxImageBytes));
    }
    prev_end = t.offset + t.bytes;
  }
  if (image_bytes != prev_end) {
    return Status::InvalidArgument(
        fmt::format("image_bytes is {}, but the last tensor ends at {}",
                    image_bytes, prev_end));
  }
  if (num_layers != tensors.back().layer + 1) {
    return Status::InvalidArgument(
        fmt::format("num_layers is {}, but the last tensor's layer is {}",
                    num_layers, tensors.back().layer));
  }
  return CheckChunks(*this);
}

std::pair<size_t, size_t> WeightsManifest::ChunksOfLayer(uint32_t layer) const {
  const auto first = std::partition_point(
      chunks.begin(), chunks.end(),
      [&](const WeightsChunk& c) { return c.layer < layer; });
  const auto last = std::partition_point(
      first, chunks.end(),
      [&](const WeightsChunk& c) { return c.layer <= layer; });
  return {static_cast<size_t>(first - chunks.begin()),
          static_cast<size_t>(last - chunks.begin())};
}

Result<WeightsManifest> PlanWeightsImage(std::string model, std::string layout,
                                         std::vector<WeightsTensor> tensors) {
  TIERKV_RETURN_IF_ERROR(CheckHeaderAndTensors(model, layout, tensors));
  WeightsManifest m;
  m.model = std::move(model);
  m.layout = std::move(layout);
  uint64_t end = 0;  // the end of the last tensor placed
  size_t i = 0;
  while (i < tensors.size()) {
    WeightsTensor& first = tensors[i];
    const uint64_t start = AlignUp(end, kWeightsChunkAlignment);
    if (!EndsWithinLimit(start, first.bytes)) {
      return Status::InvalidArgument(
          fmt::format("tensor '{}' would end past the image limit of {} bytes",
                      first.name, kWeightsMaxImageBytes));
    }
    if (first.bytes >= kWeightsSmallTensorBytes) {
      first.offset = start;
      for (uint64_t at = 0; at < first.bytes; at += kWeightsMaxChunkBytes) {
        m.chunks.push_back(WeightsChunk{
            PageHash{}, start + at,
            std::min(kWeightsMaxChunkBytes, first.bytes - at), first.layer});
      }
      end = start + first.bytes;
      ++i;
      continue;
    }
    // A pack: the maximal run of small tensors of this layer that fits.
    uint64_t pack_end = start;
    size_t j = i;
    while (j < tensors.size() && tensors[j].bytes < kWeightsSmallTensorBytes &&
           tensors[j].layer == first.layer) {
      const uint64_t at = AlignUp(pack_end, kWeightsPackedAlignment);
      if (at + tensors[j].bytes - start > kWeightsMaxChunkBytes) break;
      tensors[j].offset = at;
      pack_end = at + tensors[j].bytes;
      ++j;
    }
    m.chunks.push_back(
        WeightsChunk{PageHash{}, start, pack_end - start, first.layer});
    end = pack_end;
    i = j;
  }
  m.image_bytes = end;
  m.num_layers = tensors.back().layer + 1;
  m.tensors = std::move(tensors);
  TIERKV_RETURN_IF_ERROR(m.Validate());
  return m;
}

PageHash WeightsChunkKey(std::span<const std::byte> bytes) {
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return PageHash{h.low64, h.high64};
}

std::vector<std::byte> EncodeWeightsManifest(const WeightsManifest& m) {
  ManifestWriter w;
  w.Int(kManifestMagic);
  w.Int(kManifestFormat);
  w.String(m.model);
  w.String(m.layout);
  w.Int(m.num_layers);
  w.Int(m.image_bytes);
  w.Int(static_cast<uint32_t>(m.tensors.size()));
  for (const WeightsTensor& t : m.tensors) {
    w.String(t.name);
    w.String(t.dtype);
    w.Int(static_cast<uint8_t>(t.shape.size()));
    for (int64_t d : t.shape) w.Int(d);
    w.Int(t.layer);
    w.Int(t.offset);
    w.Int(t.bytes);
  }
  w.Int(static_cast<uint32_t>(m.chunks.size()));
  for (const WeightsChunk& c : m.chunks) {
    w.Int(c.key.lo);
    w.Int(c.key.hi);
    w.Int(c.offset);
    w.Int(c.bytes);
    w.Int(c.layer);
  }
  return w.Take();
}

Result<WeightsManifest> DecodeWeightsManifest(std::span<const std::byte> in) {
  ManifestReader r(in);
  if (r.Int<uint32_t>() != kManifestMagic || !r.ok()) {
    return Status::Corruption("weights manifest: bad magic");
  }
  const uint16_t format = r.Int<uint16_t>();
  if (!r.ok() || format != kManifestFormat) {
    return Status::Corruption(
        fmt::format("weights manifest: unknown format {}", format));
  }
  WeightsManifest m;
  m.model = r.String(kMaxModelName);
  m.layout = r.String(kMaxLayoutName);
  m.num_layers = r.Int<uint32_t>();
  m.image_bytes = r.Int<uint64_t>();
  m.tensors.resize(r.Count(kMinTensorBytes, kWeightsMaxTensors));
  for (WeightsTensor& t : m.tensors) {
    t.name = r.String(kMaxTensorName);
    t.dtype = r.String(kMaxDtype);
    const uint8_t rank = r.Int<uint8_t>();
    if (rank > kMaxRank || rank * sizeof(int64_t) > r.remaining()) r.Fail();
    if (!r.ok()) break;
    t.shape.resize(rank);
    for (int64_t& d : t.shape) d = r.Int<int64_t>();
    t.layer = r.Int<uint32_t>();
    t.offset = r.Int<uint64_t>();
    t.bytes = r.Int<uint64_t>();
  }
  // No count limit of its own (Validate bounds chunks by the tensors they
  // cover); the bytes left bound the allocation.
  m.chunks.resize(r.Count(kChunkBytes, UINT32_MAX));
  for (WeightsChunk& c : m.chunks) {
    c.key.lo = r.Int<uint64_t>();
    c.key.hi = r.Int<uint64_t>();
    c.offset = r.Int<uint64_t>();
    c.bytes = r.Int<uint64_t>();
    c.layer = r.Int<uint32_t>();
  }
  if (!r.ok()) return Status::Corruption("weights manifest: truncated");
  if (r.remaining() != 0) {
    return Status::Corruption("weights manifest: trailing bytes");
  }
  if (Status valid = m.Validate(); !valid.ok()) {
    return Status::Corruption(
        fmt::format("weights manifest: {}", valid.message()));
  }
  return m;
}

PageHash WeightsVersionOf(const WeightsManifest& manifest) {
  return WeightsChunkKey(EncodeWeightsManifest(manifest));
}

}  // namespace tierkv
