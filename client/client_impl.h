// Client::Impl: the state behind tierkv::Client (the daemon connection, the
// mapped arena, transfer tickets), shared by the files that implement the
// Client's calls: client.cc (KV segments, pools, transfers) and
// weights_client.cc (model weights). Private to client/.
#pragma once

#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/latency_histogram.h"
#include "common/load_ticket.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "storage/device/device_backend.h"
#include "tierkv/client.h"
#include "transport/protocol.h"
#include "transport/uds_channel.h"

namespace tierkv {

class Client::Impl {
  using ChannelReply = transport::ChannelReply;
  using Opcode = transport::Opcode;
  using UdsChannel = transport::UdsChannel;
  using WaitReport = transport::WaitReport;

 public:
  explicit Impl(std::unique_ptr<UdsChannel> channel)
      : channel_(std::move(channel)) {}
  ~Impl() {
    if (arena_) ::munmap(arena_, arena_bytes_);
    {
      MutexLock lock(&stream_mu_);
      if (stream_backend_) {
        // Best effort: the mapping goes away next either way.
        (void)stream_backend_->UnregisterHost(
            reinterpret_cast<std::byte*>(tickets_));
        stream_backend_.reset();
      }
    }
    if (tickets_) ::munmap(tickets_, ticket_count_ * sizeof(LoadTicket));
  }

  // Creates and registers the ticket region on first use, then takes a
  // free ticket. Busy when all are in flight.
  Result<uint32_t> TakeTicket() EXCLUDES(tickets_mu_);
  void ReturnTicket(uint32_t ticket) EXCLUDES(tickets_mu_) {
    MutexLock lock(&tickets_mu_);
    free_tickets_.push_back(ticket);
  }
  LoadTicket& Ticket(uint32_t i) const { return tickets_[i]; }
  // The next LoadTicket::gate_target of ticket `i` (never 0). REQUIRES:
  // the caller holds the ticket.
  uint32_t NextGateTarget(uint32_t i) {
    uint32_t& seq = gate_targets_[i];
    if (++seq == 0) ++seq;
    return seq;
  }

  // The device backend that orders transfers with engines' streams, opened
  // on first use (ClientOptions::stream_backend) with the ticket region
  // registered, so the device reads and writes its words. REQUIRES: the
  // ticket region exists (a ticket was taken).
  Result<storage::DeviceBackend*> StreamBackend() EXCLUDES(stream_mu_);
  // `stream` as the stream backend addresses it.
  storage::ForeignStream Foreign(const EngineStream& stream) const {
    if (stream_emulated_) {
      return {.emulated = static_cast<storage::DeviceBackend*>(stream.handle),
              .emulated_stream = stream.emulated_stream};
    }
    return {.cuda = stream.handle};
  }

  // One WaitLayer / Wait call: `waited` is zero when it returned at once.
  void RecordWait(std::chrono::nanoseconds waited) { waits_.Record(waited); }
  // The waits recorded since the last call, for the next transfer request
  // (nullopt when none). Each wait is taken by exactly one request.
  std::optional<WaitReport> TakeWaits() {
    WaitReport report;
    report.counts = waits_.Drain(report.total_nanos);
    if (report.empty()) return std::nullopt;
    return report;
  }

  // Sends a request and decodes its response. Concurrent calls share the
  // (multiplexed) channel; no lock is held here. `spin`: see
  // UdsChannel::Receive.
  template <typename Response>
  Status Call(Opcode op, const std::vector<std::byte>& payload, Response& out,
              int* fd = nullptr, int fd_to_send = -1, bool spin = false) {
    auto id = channel_->Send(static_cast<uint16_t>(op), payload, fd_to_send);
    if (!id.ok()) return id.status();
    return Receive(op, *id, out, fd, spin);
  }

  // Waits for the reply to request `id` (sent with `op`) and decodes it.
  template <typename Response>
  Status Receive(Opcode op, uint64_t id, Response& out, int* fd = nullptr,
                 bool spin = false) {
    Result<ChannelReply> reply =
        channel_->Receive(id, static_cast<uint16_t>(op), spin);
    if (!reply.ok()) return reply.status();
    if (fd) {
      *fd = reply->fd;
    } else if (reply->fd >= 0) {
      ::close(reply->fd);
    }
    TIERKV_RETURN_IF_ERROR(Decode(reply->payload, out));
    return out.status;
  }

  // The arena bytes [offset, offset + size), or empty if the daemon sent a
  // range outside the mapping (never trusted blindly).
  std::span<std::byte> ArenaRange(uint64_t offset, uint64_t size) const {
    if (!arena_ || offset > arena_bytes_ || size > arena_bytes_ - offset) {
      return {};
    }
    return {arena_ + offset, size};
  }

  // Thread-safe and multiplexed: concurrent calls each wait only for their
  // own replies, and byte copies run outside any lock.
  const std::unique_ptr<UdsChannel> channel_;
  std::byte* arena_ = nullptr;  // set once by OpenNamespace
  uint64_t arena_bytes_ = 0;
  Mutex layout_mu_;
  std::optional<LayoutSpec> layout_ GUARDED_BY(layout_mu_);
  bool prefault_ = true;
  uint64_t weights_batch_bytes_ = 0;  // ClientOptions::weights_batch_bytes
  std::chrono::milliseconds timeout_{10000};

  Mutex tickets_mu_;
  uint32_t ticket_count_ = 0;      // set before tickets_ is published
  LoadTicket* tickets_ = nullptr;  // set once under tickets_mu_
  std::vector<uint32_t> free_tickets_ GUARDED_BY(tickets_mu_);
  bool tickets_ready_ GUARDED_BY(tickets_mu_) = false;

  // Per ticket, owned by whoever holds the ticket (see NextGateTarget).
  std::vector<uint32_t> gate_targets_;

  storage::DeviceBackendKind stream_kind_ = storage::DeviceBackendKind::kAuto;
  Mutex stream_mu_;
  std::unique_ptr<storage::DeviceBackend> stream_backend_
      GUARDED_BY(stream_mu_);
  std::atomic<bool> stream_emulated_{false};  // set with stream_backend_

  // Time engine threads spent blocked in WaitLayer / Wait, shipped to the
  // daemon piggybacked on transfer requests (lock-free: relaxed atomics).
  LatencyHistogram waits_;
};

}  // namespace tierkv
