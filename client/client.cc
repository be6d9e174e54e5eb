// libtierkv: implements tierkv/client.h over transport's UdsChannel.
#include "tierkv/client.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <deque>
#include <optional>

#include "client/client_impl.h"
#include "common/latency_histogram.h"
#include "common/load_ticket.h"
#include "common/mutex.h"
#include "common/shared_mapping.h"
#include "common/stream_copy.h"
#include "common/sync_point.h"
#include "common/thread_annotations.h"
#include "storage/device/device_backend.h"
#include "transport/protocol.h"
#include "transport/uds_channel.h"

namespace tierkv {

using namespace transport;  // NOLINT: protocol message types

static_assert(LatencyHistogram::kBuckets == kWaitReportBuckets,
              "the wire's wait buckets are LatencyHistogram's");

Result<uint32_t> Client::Impl::TakeTicket() {
  MutexLock lock(&tickets_mu_);
  if (!tickets_ready_) {
    const uint64_t bytes = uint64_t{ticket_count_} * sizeof(LoadTicket);
    const int fd =
        ::memfd_create("tierkv-tickets", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
      return Status::IOError(std::string("memfd_create: ") +
                             std::strerror(errno));
    }
    void* base = MAP_FAILED;
    if (::ftruncate(fd, static_cast<off_t>(bytes)) == 0 &&
        ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0) {
      base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (base == MAP_FAILED) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      return Status::IOError("ticket region: " + why);
    }
    StatusResponse resp;
    Status s =
        Call(Opcode::kRegisterTickets,
             Encode(RegisterTicketsRequest{ticket_count_}), resp, nullptr, fd);
    ::close(fd);  // the mappings (ours and the daemon's) keep it alive
    if (!s.ok()) {
      ::munmap(base, bytes);
      return s;
    }
    tickets_ = static_cast<LoadTicket*>(base);
    gate_targets_.assign(ticket_count_, 0);
    for (uint32_t i = ticket_count_; i-- > 0;) free_tickets_.push_back(i);
    tickets_ready_ = true;
  }
  if (free_tickets_.empty()) {
    return Status::Busy("every transfer ticket is in use; wait for one");
  }
  const uint32_t t = free_tickets_.back();
  free_tickets_.pop_back();
  return t;
}

Result<storage::DeviceBackend*> Client::Impl::StreamBackend() {
  MutexLock lock(&stream_mu_);
  if (stream_backend_) return stream_backend_.get();
  // The caller's current device: where the engine's stream is.
  auto opened = storage::DeviceBackend::Open(
      {.kind = stream_kind_,
       .device = storage::DeviceBackendOptions::kCurrentDevice,
       .streams = 1});
  if (!opened.ok()) {
    return Status(opened.status().code(),
                  "ordering a transfer with the engine's stream: " +
                      std::string(opened.status().message()));
  }
  const uint64_t bytes = uint64_t{ticket_count_} * sizeof(LoadTicket);
  TIERKV_RETURN_IF_ERROR(
      (*opened)->RegisterHost({reinterpret_cast<std::byte*>(tickets_), bytes}));
  stream_emulated_.store((*opened)->name() == "emulated",
                         std::memory_order_release);
  stream_backend_ = std::move(opened).value();
  return stream_backend_.get();
}

namespace {

// Get and Put pipeline sub-batches of about this many bytes, one request
// each.
constexpr size_t kPipelineChunkBytes = size_t{2} << 20;
// Get keeps up to this many bytes of sub-batches requested ahead. Requests go
// out in groups (the window is refilled once half of it is consumed), so the
// daemon's IO thread, which sleeps after `server.poll_us` idle, is woken
// about once per group rather than once per sub-batch: on a VM a wake-up
// costs the sender ~10 us (an IPI) and the reply as much again. Get of
// 72 KiB went from 0.79x to 0.83x memcpy (bench/RESULTS.md). Put gained
// nothing from the same window (its time goes to the daemon's reserve and
// commit, not to wake-ups) and keeps one sub-batch ahead.
constexpr size_t kGetWindowBytes = size_t{8} << 20;

// Splits items [0, n) into consecutive [begin, end) chunks of about
// `chunk_bytes` (at least one item, at most kMaxBatchItems each).
template <typename SizeOf>
std::vector<std::pair<size_t, size_t>> SplitByBytes(size_t n,
                                                    uint64_t chunk_bytes,
                                                    SizeOf size_of) {
  std::vector<std::pair<size_t, size_t>> chunks;
  for (size_t begin = 0; begin < n;) {
    size_t end = begin;
    uint64_t bytes = 0;
    while (end < n && end - begin < kMaxBatchItems &&
           (bytes < chunk_bytes || end == begin)) {
      bytes += size_of(end++);
    }
    chunks.emplace_back(begin, end);
    begin = end;
  }
  return chunks;
}

// Splits [0, n) into request-sized chunks.
template <typename Fn>
void ForEachChunk(size_t n, Fn fn) {
  for (size_t begin = 0; begin < n; begin += kMaxBatchItems) {
    fn(begin, std::min<size_t>(n, begin + kMaxBatchItems));
  }
}

}  // namespace

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  auto channel = UdsChannel::Connect(options.socket_path, options.timeout);
  if (!channel.ok()) return channel.status();
  auto impl = std::make_unique<Impl>(std::move(channel).value());
  impl->prefault_ = options.prefault_arena;
  impl->timeout_ = options.timeout;
  impl->weights_batch_bytes_ = options.weights_batch_bytes;
  impl->weights_verify_loads_ = options.weights_verify_loads;
  impl->ticket_count_ = std::max<uint32_t>(1, options.max_transfers_in_flight);
  auto kind = storage::ParseDeviceBackendKind(options.stream_backend);
  if (!kind.ok()) {
    return Status::InvalidArgument("ClientOptions::stream_backend: " +
                                   std::string(kind.status().message()));
  }
  impl->stream_kind_ = *kind;
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Status Client::OpenNamespace(const std::string& name,
                             const std::string& token) {
  if (impl_->arena_) {
    return Status::InvalidArgument("this client already opened a namespace");
  }
  OpenNamespaceResponse resp;
  int fd = -1;
  Status s = impl_->Call(Opcode::kOpenNamespace,
                         Encode(OpenNamespaceRequest{name, token}), resp, &fd);
  if (!s.ok()) {
    if (fd >= 0) ::close(fd);
    return s;
  }
  if (fd < 0) return Status::ProtocolError("daemon sent no arena descriptor");
  // Prefaulted as written (common/shared_mapping.h): the client is the
  // arena's writer, and clean page-table entries made a Put into a fresh
  // arena 0.52x memcpy.
  void* base = MapShared(fd, resp.arena_bytes, impl_->prefault_);
  ::close(fd);  // the mapping keeps the memory alive
  if (base == MAP_FAILED) {
    return Status::IOError(std::string("mmap arena: ") + std::strerror(errno));
  }
  impl_->arena_ = static_cast<std::byte*>(base);
  impl_->arena_bytes_ = resp.arena_bytes;
  if (resp.has_layout) {
    MutexLock lock(&impl_->layout_mu_);
    impl_->layout_ = resp.layout;
  }
  return Status::OK();
}

Status Client::RegisterLayout(const LayoutSpec& layout) {
  TIERKV_RETURN_IF_ERROR(layout.Validate());
  StatusResponse resp;
  TIERKV_RETURN_IF_ERROR(impl_->Call(
      Opcode::kRegisterLayout, Encode(RegisterLayoutRequest{layout}), resp));
  MutexLock lock(&impl_->layout_mu_);
  impl_->layout_ = layout;
  return Status::OK();
}

std::optional<LayoutSpec> Client::layout() const {
  MutexLock lock(&impl_->layout_mu_);
  return impl_->layout_;
}

Result<MatchResult> Client::Match(std::span<const PageHash> pages,
                                  const MatchOptions& options) {
  MatchResult result;
  bool leading = true;
  Status failure;
  ForEachChunk(pages.size(), [&](size_t begin, size_t end) {
    if (!failure.ok()) return;
    MatchRequest req;
    req.pages.assign(pages.begin() + begin, pages.begin() + end);
    if (!options.prefetch || options.prefetch_layers.first != 0 ||
        options.prefetch_layers.count != 0) {
      req.prefetch = MatchPrefetch{.enabled = options.prefetch,
                                   .first = options.prefetch_layers.first,
                                   .count = options.prefetch_layers.count};
    }
    MatchResponse resp;
    // Spin for the reply: a Match is answered from the daemon's index in
    // microseconds, and sleeping for it doubled its latency on a 2-core VM
    // (p50 29-33 us blocking, 18-22 us spinning; bench/RESULTS.md).
    failure = impl_->Call(Opcode::kMatch, Encode(req), resp, /*fd=*/nullptr,
                          /*fd_to_send=*/-1, /*spin=*/true);
    if (!failure.ok()) return;
    if (resp.tiers.size() != req.pages.size()) {
      failure = Status::ProtocolError("match reply has the wrong item count");
      return;
    }
    if (leading) result.leading_pages += resp.leading_pages;
    leading = leading && resp.leading_pages == req.pages.size();
    result.tiers.insert(result.tiers.end(), resp.tiers.begin(),
                        resp.tiers.end());
  });
  if (!failure.ok()) return failure;
  return result;
}

std::vector<PutResult> Client::Put(std::span<const SegmentWrite> writes) {
  // Pipelined like Get: the reservation of sub-batch k+1 and the commit of
  // k-1 are in flight while sub-batch k is copied into the arena. Sub-batches
  // are also bounded in bytes so that one call never needs more reserved
  // (unevictable) space at once than a fraction of the arena.
  std::vector<PutResult> out(writes.size());
  const uint64_t chunk_bytes = std::max<uint64_t>(
      1, std::min<uint64_t>(kPipelineChunkBytes, impl_->arena_bytes_ / 16));
  const auto chunks = SplitByBytes(writes.size(), chunk_bytes, [&](size_t i) {
    return writes[i].data.size();
  });
  std::vector<PutReserveResponse> reserved(chunks.size());
  std::vector<std::vector<size_t>> committed(chunks.size());  // item indices
  struct InFlight {
    uint64_t id;
    Opcode op;
    size_t chunk;
  };
  std::deque<InFlight> in_flight;  // replies arrive in this order

  UdsChannel& channel = *impl_->channel_;
  auto fail_chunk = [&](size_t k, const Status& s) {
    for (size_t i = chunks[k].first; i < chunks[k].second; ++i) {
      out[i] = {.status = s};
    }
  };
  auto send = [&](Opcode op, size_t k, std::vector<std::byte> payload) {
    auto id = channel.Send(static_cast<uint16_t>(op), payload);
    if (id.ok()) {
      in_flight.push_back({*id, op, k});
    } else {
      fail_chunk(k, id.status());
    }
  };
  auto send_reserve = [&](size_t k) {
    PutReserveRequest req;
    for (size_t i = chunks[k].first; i < chunks[k].second; ++i) {
      req.items.push_back({writes[i].key, writes[i].data.size()});
    }
    send(Opcode::kPutReserve, k, Encode(req));
  };
  // Receives replies in order up to and including the one for (op, k).
  auto receive_until = [&](Opcode op, size_t k) {
    while (!in_flight.empty()) {
      const InFlight r = in_flight.front();
      in_flight.pop_front();
      const auto [begin, end] = chunks[r.chunk];
      if (r.op == Opcode::kPutReserve) {
        Status s = impl_->Receive(r.op, r.id, reserved[r.chunk], nullptr, true);
        if (s.ok() && reserved[r.chunk].items.size() != end - begin) {
          s = Status::ProtocolError("reserve reply has the wrong item count");
        }
        if (!s.ok()) {
          reserved[r.chunk].items.clear();
          fail_chunk(r.chunk, s);
        }
      } else {
        ItemStatusResponse done;
        Status s = impl_->Receive(r.op, r.id, done, nullptr, true);
        const auto& idx = committed[r.chunk];
        if (s.ok() && done.items.size() != idx.size()) {
          s = Status::ProtocolError("commit reply has the wrong item count");
        }
        for (size_t j = 0; j < idx.size(); ++j)
          out[idx[j]].status = s.ok() ? done.items[j] : s;
      }
      if (r.op == op && r.chunk == k) return;
    }
  };

  if (!chunks.empty()) send_reserve(0);
  for (size_t k = 0; k < chunks.size(); ++k) {
    receive_until(Opcode::kPutReserve, k);
    if (k + 1 < chunks.size()) send_reserve(k + 1);
    const auto [begin, end] = chunks[k];
    const PutReserveResponse& r = reserved[k];
    // Tests hold a Put here, its segments reserved and not yet committed.
    TIERKV_SYNC_POINT("Client::Put:Reserved");
    if (r.items.empty()) continue;  // the whole chunk failed
    KeysRequest commit;
    commit.lease_id = r.lease_id;
    for (size_t i = begin; i < end; ++i) {
      const Placement& p = r.items[i - begin];
      out[i] = {.status = p.status, .already_stored = p.already_stored};
      if (!p.status.ok() || p.already_stored) continue;
      auto dst = impl_->ArenaRange(p.offset, writes[i].data.size());
      if (dst.empty()) {
        out[i].status =
            Status::ProtocolError("daemon placed a segment outside the arena");
        continue;  // the reservation expires with the lease
      }
      StreamCopy(dst.data(), writes[i].data.data(), dst.size());
      commit.keys.push_back(writes[i].key);
      committed[k].push_back(i);
    }
    if (!commit.keys.empty()) {
      send(Opcode::kPutCommit, k, Encode(commit));
    } else if (r.lease_id) {
      (void)channel.Send(static_cast<uint16_t>(Opcode::kReleaseOneWay),
                         Encode(ReleaseRequest{r.lease_id}));
    }
  }
  receive_until(Opcode::kPing,
                SIZE_MAX);  // matches nothing: drains every reply
  return out;
}

std::vector<Status> Client::Get(std::span<const SegmentRead> reads) {
  // Pipelined: up to a window of sub-batches is leased ahead while
  // earlier ones are copied out of the arena. Each request carries the
  // release of one copied sub-batch's lease; what is left when the last
  // sub-batch is copied is released one-way. The window bounds what one call
  // holds leased (unevictable): at most 1/8 of the arena.
  std::vector<Status> out(reads.size());
  const size_t window = static_cast<size_t>(std::max<uint64_t>(
      1, std::min<uint64_t>(kGetWindowBytes, impl_->arena_bytes_ / 8) /
             kPipelineChunkBytes));
  const auto chunks =
      SplitByBytes(reads.size(), kPipelineChunkBytes,
                   [&](size_t i) { return reads[i].dst.size(); });
  UdsChannel& channel = *impl_->channel_;
  std::vector<uint64_t> finished;        // leases copied out, not yet released
  std::deque<Result<uint64_t>> pending;  // request ids, oldest first
  size_t next = 0;
  auto send_group = [&](size_t consumed) {
    for (; next < chunks.size() && next < consumed + window; ++next) {
      KeysRequest req;
      if (!finished.empty()) {
        req.lease_id = finished.back();
        finished.pop_back();
      }
      req.keys.reserve(chunks[next].second - chunks[next].first);
      for (size_t i = chunks[next].first; i < chunks[next].second; ++i) {
        req.keys.push_back(reads[i].key);
      }
      pending.push_back(
          channel.Send(static_cast<uint16_t>(Opcode::kGet), Encode(req)));
    }
  };

  send_group(0);
  for (size_t k = 0; k < chunks.size(); ++k) {
    const auto [begin, end] = chunks[k];
    const Result<uint64_t> id = std::move(pending.front());
    pending.pop_front();
    GetResponse resp;
    Status s = id.ok() ? impl_->Receive(Opcode::kGet, *id, resp, nullptr,
                                        /*spin=*/true)
                       : id.status();
    if (s.ok() && resp.items.size() != end - begin) {
      s = Status::ProtocolError("get reply has the wrong item count");
    }
    if (!s.ok()) {
      for (size_t i = begin; i < end; ++i) out[i] = s;
    } else {
      for (size_t i = begin; i < end; ++i) {
        const Location& loc = resp.items[i - begin];
        out[i] = loc.status;
        if (!loc.status.ok()) continue;
        if (loc.size != reads[i].dst.size()) {
          out[i] = Status::InvalidArgument(
              "destination is " + std::to_string(reads[i].dst.size()) +
              " B but the segment is " + std::to_string(loc.size) + " B");
          continue;
        }
        auto src = impl_->ArenaRange(loc.offset, loc.size);
        if (src.empty()) {
          out[i] = Status::ProtocolError(
              "daemon located a segment outside the arena");
          continue;
        }
        StreamCopy(reads[i].dst.data(), src.data(), src.size());
      }
      if (resp.lease_id) finished.push_back(resp.lease_id);
    }
    // Refill once no more than half the window is still outstanding.
    if (next < chunks.size() && next - (k + 1) <= window / 2) {
      send_group(k + 1);
    }
  }
  // Nothing follows that could carry these. A failure only delays reuse
  // until the lease expires.
  for (uint64_t lease : finished) {
    (void)channel.Send(static_cast<uint16_t>(Opcode::kReleaseOneWay),
                       Encode(ReleaseRequest{lease}));
  }
  return out;
}

std::vector<Status> Client::Flush(std::span<const SegmentKey> keys) {
  std::vector<Status> out(keys.size());
  ForEachChunk(keys.size(), [&](size_t begin, size_t end) {
    KeysRequest req;
    req.keys.assign(keys.begin() + begin, keys.begin() + end);
    ItemStatusResponse resp;
    Status s = impl_->Call(Opcode::kFlush, Encode(req), resp);
    if (s.ok() && resp.items.size() != req.keys.size()) {
      s = Status::ProtocolError("flush reply has the wrong item count");
    }
    for (size_t i = begin; i < end; ++i)
      out[i] = s.ok() ? resp.items[i - begin] : s;
  });
  return out;
}

Result<ReadLease> Client::Acquire(std::span<const SegmentKey> keys) {
  if (keys.size() > kMaxBatchItems) {
    return Status::InvalidArgument("too many keys for one lease");
  }
  KeysRequest req;
  req.keys.assign(keys.begin(), keys.end());
  GetResponse resp;
  TIERKV_RETURN_IF_ERROR(impl_->Call(Opcode::kGet, Encode(req), resp));
  if (resp.items.size() != keys.size()) {
    if (resp.lease_id) (void)ReleaseLease(resp.lease_id);
    return Status::ProtocolError("get reply has the wrong item count");
  }
  ReadLease lease;
  lease.client_ = this;
  lease.lease_id_ = resp.lease_id;
  for (const auto& loc : resp.items) {
    auto range = loc.status.ok() ? impl_->ArenaRange(loc.offset, loc.size)
                                 : std::span<std::byte>();
    lease.statuses_.push_back(
        loc.status.ok() && range.empty()
            ? Status::ProtocolError("segment outside the arena")
            : loc.status);
    lease.views_.emplace_back(range.data(), range.size());
  }
  return lease;
}

Result<PinLease> Client::Pin(std::span<const SegmentKey> keys,
                             std::chrono::milliseconds ttl) {
  if (keys.size() > kMaxBatchItems) {
    return Status::InvalidArgument("too many keys for one pin");
  }
  KeysRequest req;
  req.ttl_ms = static_cast<uint32_t>(
      std::min<int64_t>(ttl.count(), std::numeric_limits<uint32_t>::max()));
  req.keys.assign(keys.begin(), keys.end());
  ItemStatusResponse resp;
  TIERKV_RETURN_IF_ERROR(impl_->Call(Opcode::kPin, Encode(req), resp));
  PinLease pin;
  pin.client_ = this;
  pin.lease_id_ = resp.lease_id;
  pin.statuses_ = std::move(resp.items);
  return pin;
}

Status Client::RegisterPool(const PoolSpec& pool) {
  if (pool.kind == PoolSpec::Kind::kDeviceIpc) {
    if (pool.device_pool_bytes == 0) {
      return Status::InvalidArgument("a device pool of 0 bytes");
    }
    RegisterPoolRequest req{.layer = pool.layer,
                            .part = pool.part,
                            .kind = RegisterPoolRequest::kDeviceIpc,
                            .offset = pool.offset,
                            .slot_bytes = pool.slot_bytes,
                            .slot_count = pool.slot_count,
                            .device_handle = pool.device_handle,
                            .device_pool_bytes = pool.device_pool_bytes,
                            .device_uuid = pool.device_uuid};
    StatusResponse resp;
    return impl_->Call(Opcode::kRegisterPool, Encode(req), resp);
  }
  if (pool.kind == PoolSpec::Kind::kDeviceFd) {
    if (pool.device_pool_bytes == 0 || pool.fd < 0) {
      return Status::InvalidArgument(
          "a device pool exported as a descriptor needs the descriptor and "
          "the allocation's size");
    }
    RegisterPoolRequest req{.layer = pool.layer,
                            .part = pool.part,
                            .kind = RegisterPoolRequest::kDeviceFd,
                            .offset = pool.offset,
                            .slot_bytes = pool.slot_bytes,
                            .slot_count = pool.slot_count,
                            .device_pool_bytes = pool.device_pool_bytes,
                            .device_uuid = pool.device_uuid};
    StatusResponse resp;
    return impl_->Call(Opcode::kRegisterPool, Encode(req), resp, nullptr,
                       pool.fd);
  }
  if (pool.kind != PoolSpec::Kind::kMemfd) {
    return Status::InvalidArgument("unsupported pool kind");
  }
  // Seal against shrinking: the daemon refuses a pool that could vanish
  // under its writes. Adding a seal that is already there is fine.
  if (::fcntl(pool.fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0 && errno != EPERM) {
    return Status::InvalidArgument(
        std::string("cannot seal the pool memfd (create it with "
                    "MFD_ALLOW_SEALING): ") +
        std::strerror(errno));
  }
  StatusResponse resp;
  return impl_->Call(Opcode::kRegisterPool,
                     Encode(RegisterPoolRequest{.layer = pool.layer,
                                                .part = pool.part,
                                                .kind = 0,
                                                .offset = pool.offset,
                                                .slot_bytes = pool.slot_bytes,
                                                .slot_count = pool.slot_count}),
                     resp, nullptr, pool.fd);
}

Result<TransferHandle> Client::Load(std::span<const PageHash> pages,
                                    std::span<const uint32_t> slots,
                                    LayerRange layers) {
  return Transfer(/*load=*/true, pages, slots, layers, nullptr);
}

Result<TransferHandle> Client::Load(std::span<const PageHash> pages,
                                    std::span<const uint32_t> slots,
                                    LayerRange layers,
                                    const EngineStream& after) {
  return Transfer(/*load=*/true, pages, slots, layers, &after);
}

Result<TransferHandle> Client::Store(std::span<const PageHash> pages,
                                     std::span<const uint32_t> slots,
                                     LayerRange layers,
                                     const EngineStream& after) {
  return Transfer(/*load=*/false, pages, slots, layers, &after);
}

Result<TransferHandle> Client::Store(std::span<const PageHash> pages,
                                     std::span<const uint32_t> slots,
                                     LayerRange layers) {
  return Transfer(/*load=*/false, pages, slots, layers, nullptr);
}

Result<TransferHandle> Client::Transfer(bool load,
                                        std::span<const PageHash> pages,
                                        std::span<const uint32_t> slots,
                                        LayerRange layers,
                                        const EngineStream* after) {
  if (pages.size() != slots.size()) {
    return Status::InvalidArgument("one slot per page");
  }
  if (pages.size() > kMaxBatchItems) {
    return Status::InvalidArgument("too many pages for one transfer");
  }
  const auto layout = this->layout();
  if (!layout) return Status::InvalidArgument("register a layout first");
  if (layers.first >= layout->num_layers()) {
    return Status::InvalidArgument("first layer outside the layout");
  }
  const uint16_t count =
      layers.count ? layers.count
                   : static_cast<uint16_t>(layout->num_layers() - layers.first);
  return SubmitTransfer(
      static_cast<uint16_t>(load ? Opcode::kLoad : Opcode::kStore),
      [&](uint32_t ticket) {
        return Encode(TransferRequest{ticket,
                                      layers.first,
                                      count,
                                      {pages.begin(), pages.end()},
                                      {slots.begin(), slots.end()},
                                      impl_->TakeWaits()});
      },
      layers.first, count, static_cast<uint32_t>(pages.size()), after);
}

Result<TransferHandle> Client::SubmitTransfer(
    uint16_t opcode,
    const std::function<std::vector<std::byte>(uint32_t ticket)>& encode,
    uint16_t first, uint16_t count, uint32_t pages, const EngineStream* after) {
  auto ticket = impl_->TakeTicket();
  if (!ticket.ok()) return ticket.status();
  // Set before the request goes out (LoadTicket::gate, device_layers): the
  // daemon reads both when it accepts it.
  LoadTicket& words = impl_->Ticket(*ticket);
  const uint32_t device_base =
      words.device_layers.load(std::memory_order_acquire);
  words.gate_target.store(0, std::memory_order_relaxed);
  if (after != nullptr) {
    auto backend = impl_->StreamBackend();
    const uint32_t target = impl_->NextGateTarget(*ticket);
    Status queued = backend.ok()
                        ? (*backend)->WriteValueOn(impl_->Foreign(*after),
                                                   &words.gate, target)
                        : backend.status();
    if (!queued.ok()) {
      impl_->ReturnTicket(*ticket);
      return queued;
    }
    words.gate_target.store(target, std::memory_order_release);
  }
  StatusResponse resp;
  Status s = impl_->Call(static_cast<Opcode>(opcode), encode(*ticket), resp);
  if (!s.ok()) {
    // Refused: the daemon never touched it (a queued gate write is of an
    // old target by the ticket's next use, see LoadTicket::gate_target).
    impl_->ReturnTicket(*ticket);
    return s;
  }
  TransferHandle h;
  h.client_ = this;
  h.ticket_ = *ticket;
  h.device_base_ = device_base;
  h.first_ = first;
  h.count_ = count;
  h.pages_ = pages;
  return h;
}

Status Client::Prefetch(std::span<const PageHash> pages) {
  Status failure;
  ForEachChunk(pages.size(), [&](size_t begin, size_t end) {
    if (!failure.ok()) return;
    PrefetchRequest req;
    req.pages.assign(pages.begin() + begin, pages.begin() + end);
    req.waits = impl_->TakeWaits();
    StatusResponse resp;
    failure = impl_->Call(Opcode::kPrefetch, Encode(req), resp);
  });
  return failure;
}

Status Client::ReportTopk(std::span<const SelectionReport> reports) {
  Status failure;
  ForEachChunk(reports.size(), [&](size_t begin, size_t end) {
    if (!failure.ok()) return;
    TopkReportRequest req;
    req.items.assign(reports.begin() + begin, reports.begin() + end);
    StatusResponse resp;
    failure = impl_->Call(Opcode::kReportTopk, Encode(req), resp);
  });
  return failure;
}

namespace {

// Waits until `word` (in memory shared with the daemon) is >= `target`, or
// `deadline`. Spins briefly first: a layer often lands within microseconds.
bool WaitAtLeast(std::atomic<uint32_t>& word, uint32_t target,
                 std::chrono::steady_clock::time_point deadline) {
  for (int i = 0; i < 2000; ++i) {
    if (word.load(std::memory_order_acquire) >= target) return true;
  }
  while (true) {
    const uint32_t seen = word.load(std::memory_order_acquire);
    if (seen >= target) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    const auto left =
        std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now);
    timespec ts{static_cast<time_t>(left.count() / 1000000000),
                static_cast<long>(left.count() % 1000000000)};
    // Shared (not FUTEX_PRIVATE): the daemon wakes it from its process.
    ::syscall(SYS_futex, &word, FUTEX_WAIT, seen, &ts, nullptr, 0);
  }
}

}  // namespace

TransferHandle::TransferHandle(TransferHandle&& o) noexcept
    : client_(std::exchange(o.client_, nullptr)),
      ticket_(o.ticket_),
      first_(o.first_),
      count_(o.count_),
      pages_(o.pages_),
      device_base_(o.device_base_) {}

TransferHandle& TransferHandle::operator=(TransferHandle&& o) noexcept {
  if (this != &o) {
    this->~TransferHandle();
    new (this) TransferHandle(std::move(o));
  }
  return *this;
}

TransferHandle::~TransferHandle() {
  if (!client_) return;
  Client::Impl& impl = *client_->impl_;
  LoadTicket& t = impl.Ticket(ticket_);
  const bool finished = WaitAtLeast(
      t.finished, 1, std::chrono::steady_clock::now() + impl.timeout_);
  // Whatever the daemon did, no engine stream waits on this transfer any
  // more (a no-op when the daemon published every layer).
  ReleaseStreamWaits();
  if (finished) impl.ReturnTicket(ticket_);
  // Else the daemon may still write it: leak the ticket rather than reuse.
}

void TransferHandle::ReleaseStreamWaits() {
  RaiseTo(client_->impl_->Ticket(ticket_).device_layers, device_base_ + count_);
}

Status TransferHandle::StreamWaitLayer(uint16_t layer,
                                       const EngineStream& stream) {
  if (!client_) return Status::InvalidArgument("empty transfer handle");
  if (layer < first_ || layer >= first_ + count_) {
    return Status::InvalidArgument("layer outside the transfer");
  }
  Client::Impl& impl = *client_->impl_;
  auto backend = impl.StreamBackend();
  if (!backend.ok()) return backend.status();
  return (*backend)->WaitValueOn(impl.Foreign(stream),
                                 &impl.Ticket(ticket_).device_layers,
                                 device_base_ + (layer - first_) + 1u);
}

bool TransferHandle::LayerReady(uint16_t layer) const {
  const LoadTicket& t = client_->impl_->Ticket(ticket_);
  return t.layers_done.load(std::memory_order_acquire) >= layer - first_ + 1u;
}

Result<std::vector<Status>> TransferHandle::WaitLayer(uint16_t layer) {
  if (!client_) return Status::InvalidArgument("empty transfer handle");
  if (layer < first_ || layer >= first_ + count_) {
    return Status::InvalidArgument("layer outside the transfer");
  }
  const bool ready = LayerReady(layer);
  const auto start = std::chrono::steady_clock::now();
  auto out = AwaitLayer(layer);
  client_->impl_->RecordWait(ready ? std::chrono::nanoseconds(0)
                                   : std::chrono::steady_clock::now() - start);
  return out;
}

Result<std::vector<Status>> TransferHandle::AwaitLayer(uint16_t layer) {
  Client::Impl& impl = *client_->impl_;
  LoadTicket& t = impl.Ticket(ticket_);
  if (!WaitAtLeast(t.layers_done, layer - first_ + 1u,
                   std::chrono::steady_clock::now() + impl.timeout_)) {
    // Giving up: the engine's stream must not wait for what may never come.
    ReleaseStreamWaits();
    return Status::IOError("the daemon did not finish layer " +
                           std::to_string(layer) + " in time");
  }
  std::vector<Status> out(pages_);
  const uint32_t errors = t.error_count.load(std::memory_order_acquire);
  if (errors > LoadTicket::kMaxErrors) {
    out.assign(pages_, Status::IOError("too many failed segments to list"));
    return out;
  }
  for (uint32_t e = 0; e < errors; ++e) {
    const LoadTicket::Error& err = t.errors[e];
    if (err.layer != layer || err.page >= pages_ || !out[err.page].ok()) {
      continue;
    }
    const auto code = static_cast<StatusCode>(err.code);
    out[err.page] =
        code == StatusCode::kNotFound
            ? Status::NotFound("segment in no tier (slot not written)")
            : Status(code, "segment could not be moved");
  }
  return out;
}

uint16_t TransferHandle::LayersDone() const {
  if (!client_) return 0;
  const uint32_t done = client_->impl_->Ticket(ticket_).layers_done.load(
      std::memory_order_acquire);
  return static_cast<uint16_t>(std::min<uint32_t>(done, count_));
}

std::optional<TransferHandle::Times> TransferHandle::times() const {
  if (!client_ || LayersDone() < count_) return std::nullopt;
  // layers_done covering the last layer (acquire, in LayersDone) publishes
  // the stamps written before it.
  const LoadTicket& t = client_->impl_->Ticket(ticket_);
  auto at = [](const std::atomic<uint64_t>& ns) {
    return std::chrono::steady_clock::time_point(
        std::chrono::nanoseconds(ns.load(std::memory_order_relaxed)));
  };
  return Times{at(t.accepted_ns), at(t.first_layer_ns), at(t.last_layer_ns)};
}

Result<std::vector<Status>> TransferHandle::Wait() {
  if (!client_) return Status::InvalidArgument("empty transfer handle");
  const uint16_t last = first_ + count_ - 1;
  const bool ready = LayerReady(last);
  const auto start = std::chrono::steady_clock::now();
  auto out = AwaitAll();
  client_->impl_->RecordWait(ready ? std::chrono::nanoseconds(0)
                                   : std::chrono::steady_clock::now() - start);
  return out;
}

Result<std::vector<Status>> TransferHandle::AwaitAll() {
  std::vector<Status> out(pages_);
  for (uint16_t l = first_; l < first_ + count_; ++l) {
    auto layer = AwaitLayer(l);
    if (!layer.ok()) return layer.status();
    for (uint32_t i = 0; i < pages_; ++i) {
      if (out[i].ok() && !(*layer)[i].ok()) out[i] = (*layer)[i];
    }
  }
  return out;
}

Result<std::string> Client::Ping() {
  JsonResponse resp;
  TIERKV_RETURN_IF_ERROR(impl_->Call(Opcode::kPing, {}, resp));
  return resp.json;
}

Result<std::string> Client::StatsJson() {
  JsonResponse resp;
  TIERKV_RETURN_IF_ERROR(impl_->Call(Opcode::kStats, {}, resp));
  return resp.json;
}

Result<std::vector<Client::ListedSegment>> Client::List(uint32_t limit) {
  ListResponse resp;
  TIERKV_RETURN_IF_ERROR(
      impl_->Call(Opcode::kList, Encode(ListRequest{limit}), resp));
  std::vector<ListedSegment> out;
  for (const auto& s : resp.segments)
    out.push_back({s.key, s.size, s.refs, s.tier});
  return out;
}

Status Client::ReleaseLease(uint64_t lease_id) {
  StatusResponse resp;
  return impl_->Call(Opcode::kRelease, Encode(ReleaseRequest{lease_id}), resp);
}

// ReadLease / PinLease: RAII over a daemon lease.

ReadLease::ReadLease(ReadLease&& o) noexcept { *this = std::move(o); }
ReadLease& ReadLease::operator=(ReadLease&& o) noexcept {
  if (this != &o) {
    (void)Release();
    client_ = std::exchange(o.client_, nullptr);
    lease_id_ = std::exchange(o.lease_id_, 0);
    statuses_ = std::move(o.statuses_);
    views_ = std::move(o.views_);
  }
  return *this;
}
ReadLease::~ReadLease() { (void)Release(); }
Status ReadLease::Release() {
  views_.clear();
  if (!client_ || lease_id_ == 0) return Status::OK();
  Status s = client_->ReleaseLease(std::exchange(lease_id_, 0));
  client_ = nullptr;
  return s;
}

PinLease::PinLease(PinLease&& o) noexcept { *this = std::move(o); }
PinLease& PinLease::operator=(PinLease&& o) noexcept {
  if (this != &o) {
    (void)Unpin();
    client_ = std::exchange(o.client_, nullptr);
    lease_id_ = std::exchange(o.lease_id_, 0);
    statuses_ = std::move(o.statuses_);
  }
  return *this;
}
PinLease::~PinLease() { (void)Unpin(); }
Status PinLease::Unpin() {
  if (!client_ || lease_id_ == 0) return Status::OK();
  Status s = client_->ReleaseLease(std::exchange(lease_id_, 0));
  client_ = nullptr;
  return s;
}

}  // namespace tierkv
