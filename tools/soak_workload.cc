#include "tools/soak_workload.h"

#include <fmt/format.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <thread>

#include "tierkv/client.h"
#include "tierkv/page_hash.h"

namespace tierkv::tools {
namespace {

// The bytes of page i's segment: a function of the page alone, so any
// client can verify any Get, whoever stored it.
void FillSegment(uint32_t page, std::span<std::byte> out) {
  uint64_t x = page * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < out.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(out.data() + i, &x, std::min<size_t>(8, out.size() - i));
  }
}

// What all clients share: the working set and the tallies.
class Soak {
 public:
  explicit Soak(const SoakOptions& o) : o_(o) {
    std::vector<uint32_t> tokens(size_t{o.pages} * 64);
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<uint32_t>(i);
    }
    pages_ = PageHashChain(RootPageHash("tierkv-soak"), tokens, 64);
    expected_.resize(o.pages);
    for (uint32_t p = 0; p < o.pages; ++p) {
      expected_[p].resize(o.segment_bytes);
      FillSegment(p, expected_[p]);
    }
  }

  void RunClient(uint32_t id, std::chrono::steady_clock::time_point until) {
    std::mt19937_64 rng(o_.seed * 1000003 + id);
    std::unique_ptr<Client> c;
    while (std::chrono::steady_clock::now() < until) {
      if (!c) {
        auto made = Connect();
        Count("connect", made.status());
        if (!made.ok()) continue;
        c = std::move(made).value();
      }
      std::vector<uint32_t> batch(o_.batch);
      for (uint32_t& p : batch) p = static_cast<uint32_t>(rng() % o_.pages);
      const uint32_t pick = static_cast<uint32_t>(rng() % 100);
      if (pick < 35) {
        Put(*c, batch);
      } else if (pick < 65) {
        Get(*c, batch);
      } else if (pick < 80) {
        Lease(*c, batch);
      } else if (pick < 90) {
        Match(*c, batch);
      } else if (pick < 95 && o_.flush) {
        Flush(*c, batch);
      } else {
        c.reset();  // reconnect: the daemon must clean up after a client
      }
    }
  }

  SoakReport Report(double seconds) {
    std::lock_guard lock(mu_);
    report_.seconds = seconds;
    return report_;
  }

 private:
  Result<std::unique_ptr<Client>> Connect() {
    auto c =
        Client::Connect({.socket_path = o_.socket, .prefault_arena = false});
    if (!c.ok()) return c;
    TIERKV_RETURN_IF_ERROR((*c)->OpenNamespace(o_.ns, o_.token));
    TIERKV_RETURN_IF_ERROR((*c)->RegisterLayout(
        LayoutSpec::Uniform(64, 1, {{"kv", o_.segment_bytes / 64}})));
    return c;
  }

  SegmentKey Key(uint32_t page) const { return {pages_[page], 0, 0}; }

  void Put(Client& c, const std::vector<uint32_t>& batch) {
    std::vector<SegmentWrite> writes;
    for (uint32_t p : batch) writes.push_back({Key(p), expected_[p]});
    for (const PutResult& r : c.Put(writes)) Count("put", r.status);
  }

  void Get(Client& c, const std::vector<uint32_t>& batch) {
    std::vector<std::vector<std::byte>> bufs(batch.size());
    std::vector<SegmentRead> reads;
    for (size_t i = 0; i < batch.size(); ++i) {
      bufs[i].resize(o_.segment_bytes);
      reads.push_back({Key(batch[i]), bufs[i]});
    }
    const std::vector<Status> got = c.Get(reads);
    for (size_t i = 0; i < batch.size(); ++i) {
      Count("get", got[i].ok() && bufs[i] != expected_[batch[i]]
                       ? Status::Corruption("get: bytes differ")
                       : got[i]);
    }
  }

  void Lease(Client& c, const std::vector<uint32_t>& batch) {
    std::vector<SegmentKey> keys;
    for (uint32_t p : batch) keys.push_back(Key(p));
    auto lease = c.Acquire(keys);
    Count("lease", lease.status());
    if (!lease.ok()) return;
    for (size_t i = 0; i < batch.size(); ++i) {
      const Status& s = lease->statuses()[i];
      const auto view = lease->data(i);
      const auto& want = expected_[batch[i]];
      const bool same = view.size() == want.size() &&
                        std::memcmp(view.data(), want.data(), want.size()) == 0;
      Count("lease_read",
            s.ok() && !same ? Status::Corruption("lease: bytes differ") : s);
    }
    Count("release", lease->Release());
  }

  void Match(Client& c, const std::vector<uint32_t>& batch) {
    std::vector<PageHash> pages;
    for (uint32_t p : batch) pages.push_back(pages_[p]);
    Count("match", c.Match(pages).status());
  }

  void Flush(Client& c, const std::vector<uint32_t>& batch) {
    std::vector<SegmentKey> keys;
    for (uint32_t p : batch) keys.push_back(Key(p));
    for (const Status& s : c.Flush(keys)) Count("flush", s);
  }

  void Count(const char* op, const Status& s) {
    std::lock_guard lock(mu_);
    ++report_.ops;
    ++report_.by_op[op];
    if (s.ok()) return;
    if (s.code() == StatusCode::kBusy) {
      ++report_.busy;
    } else if (s.code() == StatusCode::kNotFound) {
      ++report_.misses;  // evicted, or not stored yet by anyone
    } else {
      ++report_.errors;
      if (report_.first_errors.size() < 10) {
        report_.first_errors.push_back(fmt::format("{}: {}", op, s.ToString()));
      }
    }
  }

  const SoakOptions o_;
  std::vector<PageHash> pages_;
  std::vector<std::vector<std::byte>> expected_;
  std::mutex mu_;
  SoakReport report_;
};

}  // namespace

Result<SoakReport> RunSoak(const SoakOptions& options) {
  if (options.clients == 0 || options.pages == 0 || options.batch == 0 ||
      options.segment_bytes == 0 || options.segment_bytes % 64 != 0) {
    return Status::InvalidArgument(
        "soak: clients, pages, batch must be > 0 and segment_bytes a "
        "positive multiple of 64");
  }
  // Fails fast on a wrong socket or token instead of soaking errors.
  {
    auto probe = Client::Connect(
        {.socket_path = options.socket, .prefault_arena = false});
    if (!probe.ok()) return probe.status();
    TIERKV_RETURN_IF_ERROR((*probe)->OpenNamespace(options.ns, options.token));
  }
  Soak soak(options);
  const auto start = std::chrono::steady_clock::now();
  const auto until = start + options.duration;
  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < options.clients; ++i) {
    threads.emplace_back([&soak, i, until] { soak.RunClient(i, until); });
  }
  for (auto& t : threads) t.join();
  return soak.Report(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count());
}

}  // namespace tierkv::tools
