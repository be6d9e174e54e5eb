// One trace request through one tierkvd client (see prefix_replayer.h).
#include "tools/prefix_replayer.h"

#include "tools/prefix_hit_rules.h"

namespace tierkv::tools {

LayoutSpec ReplayLayout(uint32_t bytes_per_token) {
  return LayoutSpec::Uniform(kTraceBlockTokens, 1, {{"kv", bytes_per_token}});
}

PrefixReplayer::PrefixReplayer(Client& client, uint32_t bytes_per_token,
                               bool prefetch)
    : client_(client),
      prefetch_(prefetch),
      payload_(uint64_t{kTraceBlockTokens} * bytes_per_token, std::byte{0x5a}) {
}

void PrefixReplayer::SetPages(const TraceRequest& request) {
  pages_.clear();
  for (uint64_t id : CacheableBlocks(request)) {
    pages_.push_back(PageHash{.lo = id, .hi = kReplayPageSalt});
  }
}

Result<RequestOutcome> PrefixReplayer::Request(const TraceRequest& request) {
  RequestOutcome out;
  SetPages(request);
  if (pages_.empty()) return out;
  auto match = client_.Match(pages_, {.prefetch = prefetch_});
  if (!match.ok()) return match.status();
  auto read = ReadLeading(match->leading_pages, match->tiers, out);
  if (!read.ok()) return read.status();
  TIERKV_RETURN_IF_ERROR(StoreFrom(*read, out));
  return out;
}

Result<uint32_t> PrefixReplayer::OwnLeadingPages(const TraceRequest& request) {
  SetPages(request);
  if (pages_.empty()) return 0u;
  auto match = client_.Match(pages_, {.prefetch = false});
  if (!match.ok()) return match.status();
  uint32_t own = 0;
  while (own < match->leading_pages && match->tiers[own] != Tier::kPeer) ++own;
  return own;
}

Result<uint32_t> PrefixReplayer::ReadLeading(uint32_t leading,
                                             std::span<const Tier> tiers,
                                             RequestOutcome& out) {
  if (leading == 0) return 0u;
  const size_t segment_bytes = payload_.size();
  if (read_buffer_.size() < leading * segment_bytes) {
    read_buffer_.resize(leading * segment_bytes);
  }
  reads_.clear();
  for (uint32_t i = 0; i < leading; ++i) {
    reads_.push_back({.key = {pages_[i], 0, 0},
                      .dst = std::span(read_buffer_)
                                 .subspan(i * segment_bytes, segment_bytes)});
  }
  const std::vector<Status> got = client_.Get(reads_);
  uint32_t read = 0;
  for (uint32_t i = 0; i < leading; ++i) {
    const Status& s = got[i];
    if (!s.ok() && !s.IsNotFound() && s.code() != StatusCode::kIOError) {
      return s;
    }
    if (!s.ok()) {
      out.get_missed++;
      continue;
    }
    if (read != i) continue;  // past the first miss: not a hit
    ++read;
    switch (tiers[i]) {
      case Tier::kNvme:
        out.nvme_pages++;
        break;
      case Tier::kPeer:
        out.peer_pages++;
        break;
      default:
        out.host_pages++;
        break;
    }
  }
  return read;
}

Status PrefixReplayer::StoreFrom(uint32_t first, RequestOutcome& out) {
  if (first == pages_.size()) return Status::OK();
  writes_.clear();
  for (size_t i = first; i < pages_.size(); ++i) {
    writes_.push_back({.key = {pages_[i], 0, 0}, .data = payload_});
  }
  for (const PutResult& r : client_.Put(writes_)) {
    if (r.ok()) continue;
    const StatusCode code = r.status.code();
    if (code != StatusCode::kBusy && code != StatusCode::kResourceExhausted) {
      return r.status;
    }
    out.put_failed++;
  }
  return Status::OK();
}

}  // namespace tierkv::tools
