#include "daemon/cluster/peer_server.h"

#include <fmt/format.h>

#include "daemon/cluster/fetch_protocol.h"

namespace tierkv::daemon::cluster {

using transport::peer::PeerRequest;
using transport::peer::PeerResponder;

PeerServer::PeerServer(storage::CacheEngine* engine,
                       std::unordered_set<std::string> shared)
    : engine_(engine), shared_(std::move(shared)) {}

void PeerServer::Handle(const PeerRequest& request, PeerResponder responder) {
  requests_.fetch_add(1, std::memory_order_relaxed);
  auto refuse = [&](const Status& status) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    responder.ReplyError(status);
  };
  if (request.opcode != kFetchOpcode) {
    refuse(Status::InvalidArgument(
        fmt::format("unknown peer request opcode {}", request.opcode)));
    return;
  }
  auto decoded = DecodeFetchRequest(request.payload);
  if (!decoded.ok()) {
    refuse(decoded.status());
    return;
  }
  FetchRequest fetch = std::move(decoded).value();
  if (!Enter()) {
    refuse(Status::Unavailable("this node is shutting down"));
    return;
  }
  storage::EngineNamespace* ns =
      shared_.contains(fetch.ns) ? engine_->Find(fetch.ns) : nullptr;
  if (ns == nullptr) {
    Leave();
    refuse(Status::PermissionDenied(
        fmt::format("namespace '{}' is not shared with peers here", fetch.ns)));
    return;
  }
  const uint64_t fingerprint = ns->fingerprint();
  if (fingerprint == 0 || fingerprint != fetch.fingerprint) {
    Leave();
    refuse(Status::InvalidArgument(fmt::format(
        "namespace '{}' has another layout here (fingerprint {:016x}, asked "
        "{:016x})",
        fetch.ns, fingerprint, fetch.fingerprint)));
    return;
  }
  std::vector<SegmentKey> keys = fetch.keys;
  // The Acquire may finish on this thread (all in DRAM) or on a tier's
  // thread after promoting from NVMe; either way the reply goes out then.
  auto shared_responder = std::make_shared<PeerResponder>(std::move(responder));
  const uint64_t owner = OwnerOf(request.peer_node_id);
  engine_->Acquire(
      owner, *ns, std::move(fetch.keys),
      [self = shared_from_this(), ns, owner, keys = std::move(keys),
       shared_responder](storage::EngineRead read) mutable {
        self->Reply(*ns, owner, std::move(keys), std::move(read),
                    std::move(*shared_responder));
      },
      storage::TierScope::kLocal);
  Leave();
}

void PeerServer::Reply(storage::EngineNamespace& ns, uint64_t owner,
                       std::vector<SegmentKey> keys, storage::EngineRead read,
                       PeerResponder responder) {
  // Stopped meanwhile (an NVMe promotion finishing at shutdown): the
  // namespace may be going; the engine ends the lease itself.
  if (!Enter()) {
    responder.ReplyError(Status::Unavailable("this node is shutting down"));
    return;
  }
  std::vector<FetchedSegment> head(keys.size());
  std::vector<std::span<const std::byte>> data;
  uint64_t bytes = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!read.items[i].ok()) {
      // NotFound: not here (or failed its NVMe checksum). Anything else
      // (lease limits, no DRAM to promote into, workers saturated) is a
      // refusal for now that must not read as "absent".
      if (read.items[i].status().IsNotFound()) {
        absent_segments_.fetch_add(1, std::memory_order_relaxed);
      } else {
        head[i].state = FetchedSegment::State::kUnavailable;
        unavailable_segments_.fetch_add(1, std::memory_order_relaxed);
      }
      continue;
    }
    const std::span<const std::byte> segment =
        ns.host().HostBytes(*read.items[i]);
    if (segment.empty()) {  // held, but not addressable here: not "absent"
      head[i].state = FetchedSegment::State::kUnavailable;
      unavailable_segments_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    head[i] = {.state = FetchedSegment::State::kServed,
               .bytes = static_cast<uint32_t>(segment.size()),
               .checksum = SegmentChecksum(segment)};
    data.push_back(segment);
    bytes += segment.size();
  }
  const uint64_t lease = read.lease_id;
  served_segments_.fetch_add(data.size(), std::memory_order_relaxed);
  served_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  Leave();
  // The bytes stay leased until sent (or the send failed, or the transport
  // closed): on_sent runs exactly once.
  responder.ReplyWithData(EncodeFetchReplyHead(head), std::move(data),
                          [self = shared_from_this(), owner, lease](Status) {
                            if (lease != 0) self->Release(owner, lease);
                          });
}

void PeerServer::Release(uint64_t owner, uint64_t lease_id) {
  if (!Enter()) return;  // the engine ends the lease itself
  (void)engine_->Release(owner, lease_id);
  Leave();
}

bool PeerServer::Enter() {
  MutexLock lock(&mu_);
  if (stopped_) return false;
  ++active_;
  return true;
}

void PeerServer::Leave() {
  MutexLock lock(&mu_);
  if (--active_ == 0) idle_cv_.SignalAll();
}

void PeerServer::Stop() {
  MutexLock lock(&mu_);
  stopped_ = true;
  while (active_ > 0) idle_cv_.Wait(&mu_);
}

PeerServerCounters PeerServer::counters() const {
  auto get = [](const std::atomic<uint64_t>& a) {
    return a.load(std::memory_order_relaxed);
  };
  return {.requests = get(requests_),
          .refused = get(refused_),
          .served_segments = get(served_segments_),
          .served_bytes = get(served_bytes_),
          .absent_segments = get(absent_segments_),
          .unavailable_segments = get(unavailable_segments_)};
}

}  // namespace tierkv::daemon::cluster
