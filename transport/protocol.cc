// Encodes and decodes the messages of protocol.h. Each message's wire layout
// is written down once, as a Fields() function listing its fields in wire
// order; FieldEncoder walks that list to write the bytes and FieldDecoder
// walks the same list to read them, so the two directions cannot drift
// apart. Decoding keeps WireReader's guarantees (bounds-checked reads,
// counts checked against the bytes left, one ProtocolError at the end).
#include "transport/protocol.h"

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "transport/frame.h"

namespace tierkv::transport {
namespace {

// The longest JSON document (kPing, kStats) and namespace name or token a
// decoder accepts, in bytes.
constexpr size_t kMaxJson = size_t{1} << 20;
constexpr size_t kMaxName = 256;
// A weights manifest travels whole in one frame; names as weights.h limits
// them.
constexpr size_t kMaxWeightsManifest = kDefaultMaxPayloadBytes;
constexpr size_t kMaxWeightsModel = 128;
constexpr size_t kMaxWeightsLayout = 256;

bool ValidTier(uint8_t raw) {
  return raw <= static_cast<uint8_t>(Tier::kPeer) ||
         raw == static_cast<uint8_t>(Tier::kMiss);
}

// `Is<T> auto& m` binds a T or a const T, so one Fields(io, m) serves the
// encoder (const messages) and the decoder (messages it fills in);
// `Is<T, U> auto& m` binds any of them, for messages laid out alike.
template <typename M, typename... Ts>
concept Is = (std::same_as<std::remove_const_t<M>, Ts> || ...);

// A plain integer field; bool is left out so that flags say which kind
// they are (Flag or LenientFlag).
template <typename T>
concept WireInt = std::integral<T> && !std::same_as<T, bool>;

// The vocabulary of a Fields(io, m) function, the same on both visitors:
//   io.Field(x)         x in its one encoding: a little-endian integer, a
//                       PageHash, SegmentKey, Status, Tier (u8) or
//                       LayoutSpec (wire.h); a std::vector as a u32 count
//                       then its items; a struct through its own Fields()
//   io.String(s, max)   u32 length, then the bytes; decoding refuses longer
//                       than `max`
//   io.Blob(v, max)     a std::vector<std::byte> like String
//   io.Flag(b)          u8 0 or 1; decoding refuses any other value
//   io.LenientFlag(b)   u8 0 or 1; decoding reads any non-zero value as set
//   io.Bytes(a)         a std::array<std::byte, N>'s bytes as they are
//   io.CountedArray(a)  u8 element count, then the elements; decoding
//                       refuses a count other than a.size()
//   io.Trailer(opt)     *opt when it is set and not empty(), as the last
//                       field; decoding reads it only when bytes remain
//   io.Check(ok)        decoding refuses the payload when `ok` is false;
//                       encoding ignores it
// A field that is present only for some values of an earlier field tests
// that field in plain C++: the decoder has stored it by then. A struct's
// Fields() overload is found by argument-dependent lookup (the visitors and
// the overloads share this namespace), so it may come after the visitors.

// Writes a message's fields. Not thread-safe; one per encoded message.
class FieldEncoder {
 public:
  template <WireInt T>
  void Field(const T& v) {
    w_.Int(v);
  }
  void Field(const PageHash& h) { w_.Hash(h); }
  void Field(const SegmentKey& k) { w_.Key(k); }
  void Field(const Status& s) { w_.StatusValue(s); }
  void Field(const Tier& t) { w_.Int(static_cast<uint8_t>(t)); }
  void Field(const LayoutSpec& layout) { w_.Layout(layout); }
  template <typename T>
  void Field(const std::vector<T>& items) {
    w_.Int(static_cast<uint32_t>(items.size()));
    for (const T& item : items) Field(item);
  }
  template <typename T>
  void Field(const T& record) {
    Fields(*this, record);
  }

  void String(const std::string& s, size_t /*max_len*/) { w_.String(s); }
  void Blob(const std::vector<std::byte>& v, size_t /*max_len*/) {
    w_.Int(static_cast<uint32_t>(v.size()));
    w_.Bytes(v);
  }
  void Flag(const bool& b) { w_.Int<uint8_t>(b ? 1 : 0); }
  void LenientFlag(const bool& b) { Flag(b); }
  template <size_t N>
  void Bytes(const std::array<std::byte, N>& a) {
    w_.Bytes(a);
  }
  template <typename T, size_t N>
  void CountedArray(const std::array<T, N>& a) {
    static_assert(N <= UINT8_MAX, "the count is a u8");
    w_.Int(static_cast<uint8_t>(N));
    for (const T& x : a) Field(x);
  }
  template <typename T>
  void Trailer(const std::optional<T>& t) {
    if (t && !t->empty()) Field(*t);
  }
  void Check(bool /*ok*/) {}

  std::vector<std::byte> Take() { return w_.Take(); }

 private:
  WireWriter w_;
};

// The fewest bytes a T takes on the wire: the encoding of a default T, as
// every default is the smallest form (empty strings, lists and messages,
// absent trailers). Decoders accept only as many items as could fit in the
// bytes left, so a hostile count cannot make them allocate.
template <typename T>
size_t MinWireBytes() {
  static const size_t bytes = [] {
    FieldEncoder e;
    e.Field(T{});
    return e.Take().size();
  }();
  return bytes;
}

// Reads a message's fields from an untrusted payload. The first bad read or
// failed check fails the underlying WireReader: later reads yield zero
// values and status() reports the ProtocolError. Not thread-safe; one per
// decoded payload, which must outlive it.
class FieldDecoder {
 public:
  explicit FieldDecoder(std::span<const std::byte> in) : r_(in) {}

  template <WireInt T>
  void Field(T& v) {
    v = r_.Int<T>();
  }
  void Field(PageHash& h) { h = r_.Hash(); }
  void Field(SegmentKey& k) { k = r_.Key(); }
  void Field(Status& s) { s = r_.StatusValue(); }
  void Field(Tier& t) {
    const uint8_t raw = r_.Int<uint8_t>();
    if (!ValidTier(raw)) {
      r_.Fail();
      t = Tier::kMiss;
      return;
    }
    t = static_cast<Tier>(raw);
  }
  void Field(LayoutSpec& layout) { layout = r_.Layout(); }
  template <typename T>
  void Field(std::vector<T>& items) {
    items.resize(r_.Count(MinWireBytes<T>(), kMaxBatchItems));
    for (T& item : items) Field(item);
  }
  template <typename T>
  void Field(T& record) {
    Fields(*this, record);
  }

  void String(std::string& s, size_t max_len) { s = r_.String(max_len); }
  void Blob(std::vector<std::byte>& v, size_t max_len) {
    // Count() checks the length against the bytes left before the resize.
    v.resize(r_.Count(/*min_item_bytes=*/1, static_cast<uint32_t>(max_len)));
    r_.Bytes(v);
  }
  void Flag(bool& b) {
    const uint8_t raw = r_.Int<uint8_t>();
    Check(raw <= 1);
    b = raw == 1;
  }
  void LenientFlag(bool& b) { b = r_.Int<uint8_t>() != 0; }
  template <size_t N>
  void Bytes(std::array<std::byte, N>& a) {
    r_.Bytes(a);
  }
  template <typename T, size_t N>
  void CountedArray(std::array<T, N>& a) {
    Check(r_.Int<uint8_t>() == N);
    for (T& x : a) Field(x);
  }
  template <typename T>
  void Trailer(std::optional<T>& t) {
    t.reset();
    if (r_.remaining() == 0) return;
    T value;
    Field(value);
    if (!r_.failed()) t = std::move(value);
  }
  void Check(bool ok) {
    if (!ok) r_.Fail();
  }

  // OK when every read was in bounds, every check held and the payload was
  // consumed exactly.
  Status status() const { return r_.status(); }

 private:
  WireReader r_;
};

// The messages, in wire order. Every response begins with its overall
// Status.

void Fields(auto& io, Is<JsonResponse> auto& m) {
  io.Field(m.status);
  io.String(m.json, kMaxJson);
}

void Fields(auto& io, Is<OpenNamespaceRequest> auto& m) {
  io.String(m.name, kMaxName);
  io.String(m.token, kMaxName);
}

void Fields(auto& io, Is<OpenNamespaceResponse> auto& m) {
  io.Field(m.status);
  io.Field(m.arena_bytes);
  // Any non-zero byte has always meant "a layout follows"; decoding stays
  // as lenient as it was.
  io.LenientFlag(m.has_layout);
  if (m.has_layout) io.Field(m.layout);
}

void Fields(auto& io, Is<RegisterLayoutRequest> auto& m) { io.Field(m.layout); }

// u8 bucket count (kWaitReportBuckets), the u64 counts, u64 nanoseconds.
void Fields(auto& io, Is<WaitReport> auto& m) {
  io.CountedArray(m.counts);
  io.Field(m.total_nanos);
}

void Fields(auto& io, Is<MatchPrefetch> auto& m) {
  io.Flag(m.enabled);
  io.Field(m.first);
  io.Field(m.count);
}

void Fields(auto& io, Is<MatchRequest> auto& m) {
  io.Field(m.pages);
  io.Trailer(m.prefetch);  // absent: every layer
}

void Fields(auto& io, Is<PrefetchRequest> auto& m) {
  io.Field(m.pages);
  io.Trailer(m.waits);  // absent when nothing was waited for
}

void Fields(auto& io, Is<MatchResponse> auto& m) {
  io.Field(m.status);
  io.Field(m.leading_pages);
  io.Field(m.tiers);
}

void Fields(auto& io, Is<PutItem> auto& m) {
  io.Field(m.key);
  io.Field(m.size);
}

void Fields(auto& io, Is<PutReserveRequest> auto& m) { io.Field(m.items); }

void Fields(auto& io, Is<Placement> auto& m) {
  io.Field(m.status);
  io.Field(m.offset);
  io.Flag(m.already_stored);
  // Dedup is a success: never flagged on an error.
  io.Check(!m.already_stored || m.status.ok());
}

void Fields(auto& io, Is<KeysRequest> auto& m) {
  io.Field(m.lease_id);
  io.Field(m.ttl_ms);
  io.Field(m.keys);
}

// The batch responses that carry a lease: the lease id (0: none), then one
// item per item of the request.
void Fields(auto& io,
            Is<PutReserveResponse, ItemStatusResponse, GetResponse> auto& m) {
  io.Field(m.status);
  io.Field(m.lease_id);
  io.Field(m.items);
}

void Fields(auto& io, Is<Location> auto& m) {
  io.Field(m.status);
  io.Field(m.tier);
  io.Field(m.offset);
  io.Field(m.size);
}

void Fields(auto& io, Is<ReleaseRequest> auto& m) { io.Field(m.lease_id); }

void Fields(auto& io, Is<StatusResponse> auto& m) { io.Field(m.status); }

void Fields(auto& io, Is<ListRequest> auto& m) { io.Field(m.limit); }

void Fields(auto& io, Is<ListedSegment> auto& m) {
  io.Field(m.key);
  io.Field(m.size);
  io.Field(m.refs);
  io.Field(m.tier);
}

void Fields(auto& io, Is<ListResponse> auto& m) {
  io.Field(m.status);
  io.Field(m.segments);
}

void Fields(auto& io, Is<RegisterPoolRequest> auto& m) {
  using Request = RegisterPoolRequest;
  io.Field(m.layer);
  io.Field(m.part);
  io.Field(m.kind);
  io.Field(m.offset);
  io.Field(m.slot_bytes);
  io.Field(m.slot_count);
  if (m.kind == Request::kDeviceIpc) io.Bytes(m.device_handle);
  if (m.kind == Request::kDeviceIpc || m.kind == Request::kDeviceFd) {
    io.Field(m.device_pool_bytes);
    io.Bytes(m.device_uuid);
  }
}

void Fields(auto& io, Is<RegisterTicketsRequest> auto& m) { io.Field(m.count); }

void Fields(auto& io, Is<TransferRequest> auto& m) {
  io.Field(m.ticket);
  io.Field(m.first_layer);
  io.Field(m.num_layers);
  io.Field(m.pages);
  io.Field(m.slots);
  io.Trailer(m.waits);  // absent when nothing was waited for
}

void Fields(auto& io, Is<SelectionReport> auto& m) {
  io.Field(m.page);
  io.Field(m.layer);
  io.Field(m.count);
}

void Fields(auto& io, Is<TopkReportRequest> auto& m) { io.Field(m.items); }

void Fields(auto& io, Is<WeightsSealRequest> auto& m) {
  io.Blob(m.manifest, kMaxWeightsManifest);
}

void Fields(auto& io, Is<WeightsSealResponse> auto& m) {
  io.Field(m.status);
  io.Field(m.version);
  io.Flag(m.already_sealed);
  io.Check(!m.already_sealed || m.status.ok());
}

void Fields(auto& io, Is<LayerRange> auto& m) {
  io.Field(m.first);
  io.Field(m.count);
}

void Fields(auto& io, Is<WeightsSelectRequest> auto& m) {
  io.String(m.model, kMaxWeightsModel);
  io.String(m.layout, kMaxWeightsLayout);
  io.Field(m.version);
  io.Field(m.layers);
}

void Fields(auto& io, Is<WeightsManifestResponse> auto& m) {
  io.Field(m.status);
  io.Blob(m.manifest, kMaxWeightsManifest);
}

void Fields(auto& io, Is<WeightsId> auto& m) {
  io.String(m.model, kMaxWeightsModel);
  io.String(m.layout, kMaxWeightsLayout);
  io.Field(m.version);
}

void Fields(auto& io, Is<WeightsInfo> auto& m) {
  io.Field(m.id);
  io.Field(m.image_bytes);
  io.Field(m.tensors);
  io.Field(m.chunks);
  io.Field(m.num_layers);
  io.Field(m.sealed_unix_ms);
  io.Field(m.chunks_in_dram);
  io.Field(m.chunks_on_nvme);
  io.Field(m.chunks_missing);
  io.Field(m.unique_bytes);
}

void Fields(auto& io, Is<WeightsListResponse> auto& m) {
  io.Field(m.status);
  io.Field(m.shards);
}

void Fields(auto& io, Is<WeightsDropResponse> auto& m) {
  io.Field(m.status);
  io.Field(m.dropped);
  io.Field(m.freed_bytes);
}

void Fields(auto& io, Is<WeightsHintItem> auto& m) {
  io.Field(m.id);
  io.Field(m.next_use_ms);
}

void Fields(auto& io, Is<WeightsHintRequest> auto& m) { io.Field(m.items); }

void Fields(auto& io, Is<WeightsPinRequest> auto& m) {
  io.Field(m.id);
  io.Field(m.ttl_ms);
}

void Fields(auto& io, Is<WeightsLoadRequest> auto& m) {
  io.Field(m.ticket);
  io.Field(m.id);
  io.Field(m.first_layer);
  io.Field(m.num_layers);
  io.Trailer(m.waits);  // absent when nothing was waited for
}

void Fields(auto& io, Is<WeightsStageExtent> auto& m) {
  io.Field(m.offset);
  io.Field(m.bytes);
}

void Fields(auto& io, Is<WeightsStageRequest> auto& m) { io.Field(m.extents); }

void Fields(auto& io, Is<WeightsStageResponse> auto& m) {
  io.Field(m.status);
  io.Field(m.keys);
  io.Field(m.already_stored);
  io.Check(m.already_stored.size() == m.keys.size());
}

template <typename M>
std::vector<std::byte> EncodeFields(const M& m) {
  FieldEncoder encoder;
  Fields(encoder, m);
  return encoder.Take();
}

template <typename M>
Status DecodeFields(std::span<const std::byte> in, M& out) {
  FieldDecoder decoder(in);
  Fields(decoder, out);
  return decoder.status();
}

}  // namespace

// protocol.h's Encode/Decode pair of message M. A macro because the pairs
// differ only in M, and protocol.h declares plain overloads so that no
// template reaches its includers.
#define TIERKV_ENCODE_DECODE(M)                                         \
  std::vector<std::byte> Encode(const M& m) { return EncodeFields(m); } \
  Status Decode(std::span<const std::byte> in, M& out) {                \
    return DecodeFields(in, out);                                       \
  }

TIERKV_ENCODE_DECODE(JsonResponse)
TIERKV_ENCODE_DECODE(OpenNamespaceRequest)
TIERKV_ENCODE_DECODE(OpenNamespaceResponse)
TIERKV_ENCODE_DECODE(RegisterLayoutRequest)
TIERKV_ENCODE_DECODE(MatchRequest)
TIERKV_ENCODE_DECODE(PrefetchRequest)
TIERKV_ENCODE_DECODE(MatchResponse)
TIERKV_ENCODE_DECODE(PutReserveRequest)
TIERKV_ENCODE_DECODE(PutReserveResponse)
TIERKV_ENCODE_DECODE(KeysRequest)
TIERKV_ENCODE_DECODE(ItemStatusResponse)
TIERKV_ENCODE_DECODE(GetResponse)
TIERKV_ENCODE_DECODE(ReleaseRequest)
TIERKV_ENCODE_DECODE(StatusResponse)
TIERKV_ENCODE_DECODE(ListRequest)
TIERKV_ENCODE_DECODE(ListResponse)
TIERKV_ENCODE_DECODE(RegisterPoolRequest)
TIERKV_ENCODE_DECODE(RegisterTicketsRequest)
TIERKV_ENCODE_DECODE(TransferRequest)
TIERKV_ENCODE_DECODE(TopkReportRequest)
TIERKV_ENCODE_DECODE(WeightsSealRequest)
TIERKV_ENCODE_DECODE(WeightsSealResponse)
TIERKV_ENCODE_DECODE(WeightsSelectRequest)
TIERKV_ENCODE_DECODE(WeightsManifestResponse)
TIERKV_ENCODE_DECODE(WeightsListResponse)
TIERKV_ENCODE_DECODE(WeightsDropResponse)
TIERKV_ENCODE_DECODE(WeightsHintRequest)
TIERKV_ENCODE_DECODE(WeightsPinRequest)
TIERKV_ENCODE_DECODE(WeightsLoadRequest)
TIERKV_ENCODE_DECODE(WeightsStageRequest)
TIERKV_ENCODE_DECODE(WeightsStageResponse)

#undef TIERKV_ENCODE_DECODE

// An error payload is a StatusResponse whose Status is the error.
std::vector<std::byte> EncodeError(const Status& s) {
  return Encode(StatusResponse{s});
}

Status DecodeError(std::span<const std::byte> in) {
  StatusResponse m;
  Status decoded = Decode(in, m);
  if (!decoded.ok()) return decoded;
  return m.status;
}

}  // namespace tierkv::transport
