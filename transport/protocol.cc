#include "transport/protocol.h"

#include <cstring>

namespace tierkv::transport {
namespace {

constexpr size_t kMaxJson = size_t{1} << 20;
constexpr size_t kMaxName = 256;
constexpr size_t kMinStatusBytes = 1 + 4;

bool ValidTier(uint8_t raw) {
  return raw <= static_cast<uint8_t>(Tier::kPeer) ||
         raw == static_cast<uint8_t>(Tier::kMiss);
}

Tier ReadTier(WireReader& r) {
  const uint8_t raw = r.Int<uint8_t>();
  if (!ValidTier(raw)) {
    r.Fail();
    return Tier::kMiss;
  }
  return static_cast<Tier>(raw);
}

// Decodes the leading overall Status of a response.
template <typename Fn>
Status DecodeResponse(std::span<const std::byte> in, Status& status, Fn body) {
  WireReader r(in);
  status = r.StatusValue();
  if (r.failed()) return r.status();
  body(r);
  return r.status();
}

// A WaitReport trailer: u8 bucket count (must be kWaitReportBuckets), that
// many u64 counts, u64 summed nanoseconds. Absent when nothing was waited.
void WriteWaits(WireWriter& w, const std::optional<WaitReport>& waits) {
  if (!waits || waits->empty()) return;
  w.Int(kWaitReportBuckets);
  for (uint64_t c : waits->counts) w.Int(c);
  w.Int(waits->total_nanos);
}

// Reads the trailer when bytes remain; the caller then expects the end.
void ReadWaits(WireReader& r, std::optional<WaitReport>& waits) {
  waits.reset();
  if (r.remaining() == 0) return;
  if (r.Int<uint8_t>() != kWaitReportBuckets) {
    r.Fail();
    return;
  }
  WaitReport report;
  for (uint64_t& c : report.counts) c = r.Int<uint64_t>();
  report.total_nanos = r.Int<uint64_t>();
  if (!r.failed()) waits = report;
}

}  // namespace

std::vector<std::byte> Encode(const JsonResponse& m) {
  WireWriter w;
  w.StatusValue(m.status);
  w.String(m.json);
  return w.Take();
}
Status Decode(std::span<const std::byte> in, JsonResponse& out) {
  return DecodeResponse(in, out.status,
                        [&](WireReader& r) { out.json = r.String(kMaxJson); });
}

std::vector<std::byte> Encode(const OpenNamespaceRequest& m) {
  WireWriter w;
  w.String(m.name);
  w.String(m.token);
  return w.Take();
}
Status Decode(std::span<const std::byte> in, OpenNamespaceRequest& out) {
  WireReader r(in);
  out.name = r.String(kMaxName);
  out.token = r.String(kMaxName);
  return r.status();
}

std::vector<std::byte> Encode(const OpenNamespaceResponse& m) {
  WireWriter w;
  w.StatusValue(m.status);
  w.Int(m.arena_bytes);
  w.Int<uint8_t>(m.has_layout ? 1 : 0);
  if (m.has_layout) w.Layout(m.layout);
  return w.Take();
}
Status Decode(std::span<const std::byte> in, OpenNamespaceResponse& out) {
  return DecodeResponse(in, out.status, [&](WireReader& r) {
    out.arena_bytes = r.Int<uint64_t>();
    out.has_layout = r.Int<uint8_t>() != 0;
    if (out.has_layout) out.layout = r.Layout();
  });
}

std::vector<std::byte> Encode(const RegisterLayoutRequest& m) {
  WireWriter w;
  w.Layout(m.layout);
  return w.Take();
}
Status Decode(std::span<const std::byte> in, RegisterLayoutRequest& out) {
  WireReader r(in);
  out.layout = r.Layout();
  return r.status();
}

std::vector<std::byte> Encode(const MatchRequest& m) {
  WireWriter w;
  w.Int(static_cast<uint32_t>(m.pages.size()));
  for (const auto& h : m.pages) w.Hash(h);
  WriteWaits(w, m.waits);
  return w.Take();
}
Status Decode(std::span<const std::byte> in, MatchRequest& out) {
  WireReader r(in);
  out.pages.resize(r.Count(kWireHashBytes, kMaxBatchItems));
  for (auto& h : out.pages) h = r.Hash();
  ReadWaits(r, out.waits);
  return r.status();
}

std::vector<std::byte> Encode(const MatchResponse& m) {
  WireWriter w;
  w.StatusValue(m.status);
  w.Int(m.leading_pages);
  w.Int(static_cast<uint32_t>(m.tiers.size()));
  for (Tier t : m.tiers) w.Int(static_cast<uint8_t>(t));
  return w.Take();
}
Status Decode(std::span<const std::byte> in, MatchResponse& out) {
  return DecodeResponse(in, out.status, [&](WireReader& r) {
    out.leading_pages = r.Int<uint32_t>();
    out.tiers.resize(r.Count(1, kMaxBatchItems));
    for (auto& t : out.tiers) t = ReadTier(r);
  });
}

std::vector<std::byte> Encode(const PutReserveRequest& m) {
  WireWriter w;
  w.Int(static_cast<uint32_t>(m.items.size()));
  for (const auto& it : m.items) {
    w.Key(it.key);
    w.Int(it.size);
  }
  return w.Take();
}
Status Decode(std::span<const std::byte> in, PutReserveRequest& out) {
  WireReader r(in);
  out.items.resize(r.Count(kWireKeyBytes + 8, kMaxBatchItems));
  for (auto& it : out.items) {
    it.key = r.Key();
    it.size = r.Int<uint64_t>();
  }
  return r.status();
}

std::vector<std::byte> Encode(const PutReserveResponse& m) {
  WireWriter w;
  w.StatusValue(m.status);
  w.Int(m.lease_id);
  w.Int(static_cast<uint32_t>(m.items.size()));
  for (const auto& it : m.items) {
    w.StatusValue(it.status);
    w.Int(it.offset);
    w.Int<uint8_t>(it.already_stored ? 1 : 0);
  }
  return w.Take();
}
Status Decode(std::span<const std::byte> in, PutReserveResponse& out) {
  return DecodeResponse(in, out.status, [&](WireReader& r) {
    out.lease_id = r.Int<uint64_t>();
    out.items.resize(r.Count(kMinStatusBytes + 8 + 1, kMaxBatchItems));
    for (auto& it : out.items) {
      it.status = r.StatusValue();
      it.offset = r.Int<uint64_t>();
      const uint8_t already_stored = r.Int<uint8_t>();
      // A flag is 0 or 1, and dedup is a success: never with an error.
      if (already_stored > 1 || (already_stored && !it.status.ok())) {
        r.Fail();
        return;
      }
      it.already_stored = already_stored == 1;
    }
  });
}

std::vector<std::byte> Encode(const KeysRequest& m) {
  WireWriter w;
  w.Int(m.lease_id);
  w.Int(m.ttl_ms);
  w.Int(static_cast<uint32_t>(m.keys.size()));
  for (const auto& k : m.keys) w.Key(k);
  return w.Take();
}
Status Decode(std::span<const std::byte> in, KeysRequest& out) {
  WireReader r(in);
  out.lease_id = r.Int<uint64_t>();
  out.ttl_ms = r.Int<uint32_t>();
  out.keys.resize(r.Count(kWireKeyBytes, kMaxBatchItems));
  for (auto& k : out.keys) k = r.Key();
  return r.status();
}

std::vector<std::byte> Encode(const ItemStatusResponse& m) {
  WireWriter w;
  w.StatusValue(m.status);
  w.Int(m.lease_id);
  w.Int(static_cast<uint32_t>(m.items.size()));
  for (const auto& s : m.items) w.StatusValue(s);
  return w.Take();
}
Status Decode(std::span<const std::byte> in, ItemStatusResponse& out) {
  return DecodeResponse(in, out.status, [&](WireReader& r) {
    out.lease_id = r.Int<uint64_t>();
    out.items.resize(r.Count(kMinStatusBytes, kMaxBatchItems));
    for (auto& s : out.items) s = r.StatusValue();
  });
}

std::vector<std::byte> Encode(const GetResponse& m) {
  WireWriter w;
  w.StatusValue(m.status);
  w.Int(m.lease_id);
  w.Int(static_cast<uint32_t>(m.items.size()));
  for (const auto& it : m.items) {
    w.StatusValue(it.status);
    w.Int(static_cast<uint8_t>(it.tier));
    w.Int(it.offset);
    w.Int(it.size);
  }
  return w.Take();
}
Status Decode(std::span<const std::byte> in, GetResponse& out) {
  return DecodeResponse(in, out.status, [&](WireReader& r) {
    out.lease_id = r.Int<uint64_t>();
    out.items.resize(r.Count(kMinStatusBytes + 17, kMaxBatchItems));
    for (auto& it : out.items) {
      it.status = r.StatusValue();
      it.tier = ReadTier(r);
      it.offset = r.Int<uint64_t>();
      it.size = r.Int<uint64_t>();
    }
  });
}

std::vector<std::byte> Encode(const ReleaseRequest& m) {
  WireWriter w;
  w.Int(m.lease_id);
  return w.Take();
}
Status Decode(std::span<const std::byte> in, ReleaseRequest& out) {
  WireReader r(in);
  out.lease_id = r.Int<uint64_t>();
  return r.status();
}

std::vector<std::byte> Encode(const StatusResponse& m) {
  WireWriter w;
  w.StatusValue(m.status);
  return w.Take();
}
Status Decode(std::span<const std::byte> in, StatusResponse& out) {
  return DecodeResponse(in, out.status, [](WireReader&) {});
}

std::vector<std::byte> Encode(const ListRequest& m) {
  WireWriter w;
  w.Int(m.limit);
  return w.Take();
}
Status Decode(std::span<const std::byte> in, ListRequest& out) {
  WireReader r(in);
  out.limit = r.Int<uint32_t>();
  return r.status();
}

std::vector<std::byte> Encode(const ListResponse& m) {
  WireWriter w;
  w.StatusValue(m.status);
  w.Int(static_cast<uint32_t>(m.segments.size()));
  for (const auto& s : m.segments) {
    w.Key(s.key);
    w.Int(s.size);
    w.Int(s.refs);
    w.Int(static_cast<uint8_t>(s.tier));
  }
  return w.Take();
}
Status Decode(std::span<const std::byte> in, ListResponse& out) {
  return DecodeResponse(in, out.status, [&](WireReader& r) {
    out.segments.resize(r.Count(kWireKeyBytes + 13, kMaxBatchItems));
    for (auto& s : out.segments) {
      s.key = r.Key();
      s.size = r.Int<uint64_t>();
      s.refs = r.Int<uint32_t>();
      s.tier = ReadTier(r);
    }
  });
}

std::vector<std::byte> EncodeError(const Status& s) {
  WireWriter w;
  w.StatusValue(s);
  return w.Take();
}
Status DecodeError(std::span<const std::byte> in) {
  WireReader r(in);
  Status s = r.StatusValue();
  if (!r.status().ok()) return r.status();
  return s;
}

std::vector<std::byte> Encode(const RegisterPoolRequest& m) {
  WireWriter w;
  w.Int(m.layer);
  w.Int(m.part);
  w.Int(m.kind);
  w.Int(m.offset);
  w.Int(m.slot_bytes);
  w.Int(m.slot_count);
  if (m.kind == RegisterPoolRequest::kDeviceIpc) {
    for (size_t i = 0; i < m.device_handle.size(); i += 8) {
      uint64_t word;
      std::memcpy(&word, m.device_handle.data() + i, 8);
      w.Int(word);
    }
  }
  if (m.kind == RegisterPoolRequest::kDeviceIpc ||
      m.kind == RegisterPoolRequest::kDeviceFd) {
    w.Int(m.device_pool_bytes);
    for (size_t i = 0; i < m.device_uuid.size(); i += 8) {
      uint64_t word;
      std::memcpy(&word, m.device_uuid.data() + i, 8);
      w.Int(word);
    }
  }
  return w.Take();
}
Status Decode(std::span<const std::byte> in, RegisterPoolRequest& out) {
  WireReader r(in);
  out.layer = r.Int<uint16_t>();
  out.part = r.Int<uint8_t>();
  out.kind = r.Int<uint8_t>();
  out.offset = r.Int<uint64_t>();
  out.slot_bytes = r.Int<uint64_t>();
  out.slot_count = r.Int<uint32_t>();
  if (out.kind == RegisterPoolRequest::kDeviceIpc) {
    for (size_t i = 0; i < out.device_handle.size(); i += 8) {
      const auto word = r.Int<uint64_t>();
      std::memcpy(out.device_handle.data() + i, &word, 8);
    }
  }
  if (out.kind == RegisterPoolRequest::kDeviceIpc ||
      out.kind == RegisterPoolRequest::kDeviceFd) {
    out.device_pool_bytes = r.Int<uint64_t>();
    for (size_t i = 0; i < out.device_uuid.size(); i += 8) {
      const auto word = r.Int<uint64_t>();
      std::memcpy(out.device_uuid.data() + i, &word, 8);
    }
  }
  return r.status();
}

std::vector<std::byte> Encode(const RegisterTicketsRequest& m) {
  WireWriter w;
  w.Int(m.count);
  return w.Take();
}
Status Decode(std::span<const std::byte> in, RegisterTicketsRequest& out) {
  WireReader r(in);
  out.count = r.Int<uint32_t>();
  return r.status();
}

std::vector<std::byte> Encode(const TransferRequest& m) {
  WireWriter w;
  w.Int(m.ticket);
  w.Int(m.first_layer);
  w.Int(m.num_layers);
  w.Int(static_cast<uint32_t>(m.pages.size()));
  for (const auto& h : m.pages) w.Hash(h);
  w.Int(static_cast<uint32_t>(m.slots.size()));
  for (uint32_t s : m.slots) w.Int(s);
  WriteWaits(w, m.waits);
  return w.Take();
}
Status Decode(std::span<const std::byte> in, TransferRequest& out) {
  WireReader r(in);
  out.ticket = r.Int<uint32_t>();
  out.first_layer = r.Int<uint16_t>();
  out.num_layers = r.Int<uint16_t>();
  out.pages.resize(r.Count(kWireHashBytes, kMaxBatchItems));
  for (auto& h : out.pages) h = r.Hash();
  out.slots.resize(r.Count(sizeof(uint32_t), kMaxBatchItems));
  for (auto& s : out.slots) s = r.Int<uint32_t>();
  ReadWaits(r, out.waits);
  return r.status();
}

std::vector<std::byte> Encode(const TopkReportRequest& m) {
  WireWriter w;
  w.Int(static_cast<uint32_t>(m.items.size()));
  for (const auto& it : m.items) {
    w.Hash(it.page);
    w.Int(it.layer);
    w.Int(it.count);
  }
  return w.Take();
}
Status Decode(std::span<const std::byte> in, TopkReportRequest& out) {
  WireReader r(in);
  out.items.resize(r.Count(kWireHashBytes + 6, kMaxBatchItems));
  for (auto& it : out.items) {
    it.page = r.Hash();
    it.layer = r.Int<uint16_t>();
    it.count = r.Int<uint32_t>();
  }
  return r.status();
}

}  // namespace tierkv::transport
