// `tierkv-bench peer`: the cluster's transports against the physical peer
// measured in the same run (issue 27, item 6; scaleout.md §9.6, §10):
//   fetch     - bulk fetch GB/s through transport::peer::PeerTransport:
//               calls whose replies carry 64 KiB .. 4 MiB segments (landed
//               by the ReplyReceiver in spans it chooses, ReplyWithData on
//               the holder), one segment per call with --in-flight calls
//               outstanding, and batches of 64 x 64 KiB segments per call;
//               rounds alternate with `ucx_perftest -t ucp_am_bw` of the
//               same message (the batch as a 64-piece IOV, which the
//               holder's transport gathers into one buffer unless
//               --gather-budget 0); each round
//               starts after 16 untimed calls, as ucx_perftest -w 16;
//   latency   - one 64 KiB fetch at a time, p50/p99 from Call to
//               OnComplete as the calling thread sees it, beside
//               `ucx_perftest -t ucp_am_lat -s 65536` (whose latency is half
//               a round trip of 64 KiB each way; the ratio is to its full
//               round trip);
//   directory - RedisDirectory::Lookup of 128 pages (one MGET) against a
//               redis-server started here, beside a raw hiredis MGET of
//               the same 128 keys.
// ucx_perftest runs both polling (-E poll, its default: both processes
// spin) and sleeping (-E sleep: they wait for events, as the transport's
// progress thread does); on a loaded 2-core machine the spinning pair can
// be the slower one.
// The requester is this process; the holder is this binary re-executed
// (`peer --holder-secret F --holder-fd N`), so that the two sides' progress
// threads are scheduled as two daemons' would be. Every UCX user here
// (both transports and ucx_perftest) runs with UCX_TLS=--tls (tcp: the
// multi-host transport; shared memory would be used otherwise, §5d).
#include <fcntl.h>
#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "bench/registry.h"
#include "bench/sample_stats.h"
#include "bench/size_option.h"
#include "bench/ucx_perftest_runner.h"
#include "common/mutex.h"
#include "tests/testing/temp_dir.h"
#include "tests/transport/directory/redis_server.h"
#include "tierkv/types.h"
#include "transport/directory/redis_directory.h"
#include "transport/peer/cluster_secret.h"
#include "transport/peer/peer_transport.h"

extern char** environ;

namespace tierkv::bench {
namespace {

using Clock = std::chrono::steady_clock;
using transport::peer::PeerRequest;
using transport::peer::PeerResponder;
using transport::peer::PeerTransport;
using transport::peer::PeerTransportOptions;
using transport::peer::ReplyReceiver;

// The one opcode the holder serves: payload FetchRequest, reply head the
// segment count, reply data `segments` spans of `segment_bytes`.
constexpr uint16_t kFetchOpcode = 1;
struct FetchRequest {
  uint64_t segment_bytes = 0;
  uint64_t segments = 0;
};
// The holder's source buffer: every reply's spans lie in it.
constexpr uint64_t kHolderBufferBytes = uint64_t{64} << 20;
// Untimed calls before each timed fetch round, and ucx_perftest's -w.
constexpr uint64_t kFetchWarmupCalls = 16;
// Bytes left between consecutive segments of one call, on both sides, so
// that no two spans are adjacent (as pages in an arena seldom are) and no
// layer may merge them into one contiguous transfer.
constexpr uint64_t kSegmentGapBytes = 4096;
constexpr uint64_t kLatencySegmentBytes = uint64_t{64} << 10;
constexpr size_t kLookupPages = 128;

struct PeerBenchOptions {
  int iterations = 3;                      // rounds per configuration
  std::string bytes_per_round = "128MiB";  // per fetch round and perftest run
  int in_flight = 8;         // calls outstanding in the fetch rows
  int latency_calls = 1000;  // per round
  int lookup_calls = 1000;   // per round, and raw MGETs
  std::string tls = "tcp";
  // PeerTransportOptions::rendezvous_threshold_bytes on both sides; empty
  // keeps the transport's default.
  std::string rendezvous_threshold;
  // PeerTransportOptions::reply_gather_budget_bytes on both sides (the
  // holder's is the one used); empty keeps the transport's default.
  std::string gather_budget;
  // PeerTransportOptions::transfer_spin on both sides, in us; negative
  // keeps the transport's default.
  int transfer_spin_us = -1;
  // Which parts run: any of fetch, latency, directory.
  std::vector<std::string> sections = {"fetch", "latency", "directory"};
  // Fetch rows to run, by name (64KiB .. 64x64KiB); empty runs all.
  std::vector<std::string> cases;
  std::string ucx_perftest = "/usr/bin/ucx_perftest";
  std::string json_path;
  // Set only in the re-executed holder.
  std::string holder_secret;
  int holder_fd = -1;
};

std::byte Pattern(uint64_t i) {
  return static_cast<std::byte>((i * 131 + (i >> 12)) & 0xff);
}

Result<PeerTransportOptions> TransportOptions(const std::string& node,
                                              std::vector<std::byte> secret,
                                              const PeerBenchOptions& bench) {
  PeerTransportOptions o;
  o.node_id = node;
  o.cluster_name = "tierkv-bench";
  o.cluster_secret = std::move(secret);
  o.ucx_settings = {{"TLS", bench.tls}, {"KEEPALIVE_INTERVAL", "2s"}};
  if (!bench.rendezvous_threshold.empty()) {
    auto bytes =
        ParseSizeOption("--rendezvous-threshold", bench.rendezvous_threshold);
    if (!bytes.ok()) return bytes.status();
    o.rendezvous_threshold_bytes = *bytes;
  }
  if (!bench.gather_budget.empty()) {
    auto bytes = ParseSizeOption("--gather-budget", bench.gather_budget);
    if (!bytes.ok()) return bytes.status();
    o.reply_gather_budget_bytes = *bytes;
  }
  if (bench.transfer_spin_us >= 0) {
    o.transfer_spin = std::chrono::microseconds(bench.transfer_spin_us);
  }
  return o;
}

// ------------------------------------------------------------ the holder

// The re-executed holder: serves kFetchOpcode from a pre-faulted buffer,
// writes its listen address to `fd`, then runs until its stdin (the
// parent's lifeline pipe) reaches EOF.
int RunHolder(const PeerBenchOptions& o) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a crashed parent
  Result<std::vector<std::byte>> secret =
      transport::peer::ReadClusterSecretFile(o.holder_secret);
  if (!secret.ok()) {
    fmt::print(stderr, "holder: {}\n", secret.status().ToString());
    return 1;
  }
  static std::vector<std::byte> source(kHolderBufferBytes);
  for (uint64_t i = 0; i < source.size(); ++i) source[i] = Pattern(i);
  Result<PeerTransportOptions> options = TransportOptions("holder", *secret, o);
  if (!options.ok()) {
    fmt::print(stderr, "holder: {}\n", options.status().ToString());
    return 1;
  }
  Result<std::unique_ptr<PeerTransport>> t = PeerTransport::Open(
      *options, [](const PeerRequest& req, PeerResponder r) {
        FetchRequest f;
        if (req.opcode != kFetchOpcode || req.payload.size() != sizeof(f)) {
          return r.ReplyError(Status::InvalidArgument("bad fetch"));
        }
        std::memcpy(&f, req.payload.data(), sizeof(f));
        if (f.segment_bytes == 0 || f.segments == 0 ||
            (f.segment_bytes + kSegmentGapBytes) * f.segments > source.size()) {
          return r.ReplyError(Status::InvalidArgument("fetch too large"));
        }
        std::vector<std::span<const std::byte>> spans;
        spans.reserve(f.segments);
        for (uint64_t i = 0; i < f.segments; ++i) {
          spans.push_back(std::span(source).subspan(
              i * (f.segment_bytes + kSegmentGapBytes), f.segment_bytes));
        }
        std::vector<std::byte> head(sizeof(f.segments));
        std::memcpy(head.data(), &f.segments, sizeof(f.segments));
        r.ReplyWithData(std::move(head), std::move(spans), nullptr);
      });
  if (!t.ok()) {
    fmt::print(stderr, "holder: {}\n", t.status().ToString());
    return 1;
  }
  const std::string line = (*t)->listen_address() + "\n";
  if (::write(o.holder_fd, line.data(), line.size()) !=
      static_cast<ssize_t>(line.size())) {
    return 1;
  }
  ::close(o.holder_fd);
  for (;;) {  // until the parent closes the lifeline (or dies)
    char c;
    const ssize_t n = ::read(STDIN_FILENO, &c, 1);
    if (n == 0 || (n < 0 && errno != EINTR)) return 0;
  }
}

// The holder process, seen from the requester: started on construction,
// SIGKILLed and reaped on destruction.
class HolderProcess {
 public:
  HolderProcess(const std::string& secret_path, const PeerBenchOptions& o) {
    int ready[2], lifeline[2];
    if (::pipe2(ready, O_CLOEXEC) != 0) return;
    if (::pipe2(lifeline, O_CLOEXEC) != 0) {
      ::close(ready[0]);
      ::close(ready[1]);
      return;
    }
    const int child_fd = ready[1] == 200 ? 201 : 200;
    std::string self(4096, '\0');
    const ssize_t n =
        ::readlink("/proc/self/exe", self.data(), self.size() - 1);
    self.resize(n > 0 ? static_cast<size_t>(n) : 0);
    std::vector<std::string> args = {
        self,        "peer",        "--holder-secret",
        secret_path, "--holder-fd", std::to_string(child_fd),
        "--tls",     o.tls};
    if (!o.rendezvous_threshold.empty()) {
      args.push_back("--rendezvous-threshold");
      args.push_back(o.rendezvous_threshold);
    }
    if (!o.gather_budget.empty()) {
      args.push_back("--gather-budget");
      args.push_back(o.gather_budget);
    }
    if (o.transfer_spin_us >= 0) {
      args.push_back("--transfer-spin-us");
      args.push_back(std::to_string(o.transfer_spin_us));
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawn_file_actions_adddup2(&actions, ready[1], child_fd);
    ::posix_spawn_file_actions_adddup2(&actions, lifeline[0], STDIN_FILENO);
    if (n <= 0 || ::posix_spawn(&pid_, self.c_str(), &actions, nullptr,
                                argv.data(), environ) != 0) {
      pid_ = -1;
    }
    ::posix_spawn_file_actions_destroy(&actions);
    ::close(ready[1]);
    ::close(lifeline[0]);
    lifeline_ = lifeline[1];
    // The holder writes its address once it listens (20 s bound: UCX
    // start-up on a loaded 2-core VM).
    pollfd p{ready[0], POLLIN, 0};
    char c = 0;
    while (pid_ > 0 && ::poll(&p, 1, 20000) == 1 &&
           ::read(ready[0], &c, 1) == 1 && c != '\n') {
      address_ += c;
    }
    ::close(ready[0]);
  }
  ~HolderProcess() {
    if (lifeline_ >= 0) ::close(lifeline_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }
  HolderProcess(const HolderProcess&) = delete;
  HolderProcess& operator=(const HolderProcess&) = delete;

  // Empty when the holder did not start.
  const std::string& address() const { return address_; }

 private:
  pid_t pid_ = -1;
  int lifeline_ = -1;
  std::string address_;
};

// --------------------------------------------------------- the requester

// Completions of the calls in flight: which landing slots are free again,
// and the first error. With a refill set, a completed call's slot goes
// straight to the next call, started by the completion itself on the
// progress thread: a stream of fetches, as PeerTier issues a Read's calls
// all at once, without a waiting thread woken per call (a hop the bench
// would add and the daemon does not have).
class Completions {
 public:
  void Done(size_t slot, Status s) {
    const Clock::time_point now = Clock::now();
    bool again = false;
    std::function<void(size_t)> refill;
    {
      MutexLock lock(&mu_);
      last_done_ = now;
      ++completed_;
      if (!s.ok() && first_error_.ok()) first_error_ = std::move(s);
      again = first_error_.ok() && to_start_ > 0;
      if (again) {
        --to_start_;
        refill = refill_;
      } else {
        free_slots_.push_back(slot);
      }
      // Only a waiter that can go on is woken: TakeSlot by a freed slot,
      // WaitCompleted by its count (a wake-up per call would cost the
      // 2-core VM a context switch per call).
      if (!again || completed_ >= wake_at_ || !first_error_.ok()) {
        cv_.Signal();
      }
    }
    if (again) refill(slot);
  }
  // The next `calls` completions each start one more call in their slot.
  void RefillWith(uint64_t calls, std::function<void(size_t)> refill) {
    MutexLock lock(&mu_);
    to_start_ = calls;
    refill_ = std::move(refill);
  }
  // Waits until a slot is free; returns it, or the first error.
  Result<size_t> TakeSlot() {
    MutexLock lock(&mu_);
    while (free_slots_.empty() && first_error_.ok()) cv_.Wait(&mu_);
    if (!first_error_.ok()) return first_error_;
    const size_t slot = free_slots_.back();
    free_slots_.pop_back();
    return slot;
  }
  // Waits until `calls` calls have completed in all.
  Status WaitCompleted(uint64_t calls) {
    MutexLock lock(&mu_);
    wake_at_ = calls;
    while (completed_ < calls && first_error_.ok()) cv_.Wait(&mu_);
    wake_at_ = UINT64_MAX;
    return first_error_;
  }
  // When the last call completed (its OnComplete ran).
  Clock::time_point last_done() {
    MutexLock lock(&mu_);
    return last_done_;
  }
  void Reset(size_t slots) {
    MutexLock lock(&mu_);
    free_slots_.clear();
    for (size_t i = 0; i < slots; ++i) free_slots_.push_back(i);
    completed_ = 0;
    to_start_ = 0;
    refill_ = nullptr;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  std::vector<size_t> free_slots_ GUARDED_BY(mu_);
  uint64_t completed_ GUARDED_BY(mu_) = 0;
  uint64_t wake_at_ GUARDED_BY(mu_) = UINT64_MAX;  // WaitCompleted's count
  Clock::time_point last_done_ GUARDED_BY(mu_);
  uint64_t to_start_ GUARDED_BY(mu_) = 0;
  std::function<void(size_t)> refill_ GUARDED_BY(mu_);
  Status first_error_ GUARDED_BY(mu_);
};

// Lands one call's segments in its slot's buffer, segment i at
// i * (segment_bytes + kSegmentGapBytes) (the spans an engine would pass:
// one per page).
class SlotReceiver final : public ReplyReceiver {
 public:
  SlotReceiver(std::span<std::byte> slot, uint64_t segment_bytes,
               uint64_t segments, size_t slot_index, Completions* done)
      : slot_(slot),
        segment_bytes_(segment_bytes),
        segments_(segments),
        slot_index_(slot_index),
        done_(done) {}

  Result<std::vector<std::span<std::byte>>> OnReplyHead(
      std::span<const std::byte>, uint64_t data_bytes) override {
    if (data_bytes != segment_bytes_ * segments_) {
      return Status::InvalidArgument("unexpected reply size");
    }
    std::vector<std::span<std::byte>> spans;
    spans.reserve(segments_);
    for (uint64_t i = 0; i < segments_; ++i) {
      spans.push_back(slot_.subspan(i * (segment_bytes_ + kSegmentGapBytes),
                                    segment_bytes_));
    }
    return spans;
  }
  void OnComplete(Status status) override {
    done_->Done(slot_index_, std::move(status));
  }

 private:
  const std::span<std::byte> slot_;
  const uint64_t segment_bytes_;
  const uint64_t segments_;
  const size_t slot_index_;
  Completions* const done_;  // owned by the bench, outlives the transport
};

struct FetchCase {
  std::string name;
  uint64_t segment_bytes;
  uint64_t segments;  // per call
  int in_flight;
};

class Requester {
 public:
  // `slot_bytes` x `slots` of landing buffers, pre-faulted.
  Requester(PeerTransport* transport, std::string address, size_t slots,
            uint64_t slot_bytes)
      : transport_(transport),
        address_(std::move(address)),
        landing_(slots * slot_bytes, std::byte{0}),
        slot_bytes_(slot_bytes) {}

  // Issues `calls` fetches of `c`, keeping c.in_flight outstanding (each
  // completion starts the next); returns the seconds from the first Call to
  // the last completion.
  Result<double> Fetch(const FetchCase& c, uint64_t calls) {
    const uint64_t first = std::min<uint64_t>(calls, c.in_flight);
    done_.Reset(static_cast<size_t>(c.in_flight));
    done_.RefillWith(calls - first, [this, c](size_t slot) { Start(c, slot); });
    const auto t0 = Clock::now();
    for (uint64_t i = 0; i < first; ++i) {
      Result<size_t> slot = done_.TakeSlot();
      if (!slot.ok()) return slot.status();
      Start(c, *slot);
    }
    if (Status s = done_.WaitCompleted(calls); !s.ok()) return s;
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

  // One call of `c` at a time; appends each one's microseconds to `us`,
  // and to `wake_us` the part from its OnComplete (on the progress thread)
  // to this thread's return from the wait.
  Status Latencies(const FetchCase& c, int calls, std::vector<double>* us,
                   std::vector<double>* wake_us) {
    done_.Reset(1);
    for (int i = 0; i < calls; ++i) {
      Result<size_t> slot = done_.TakeSlot();
      if (!slot.ok()) return slot.status();
      const auto t0 = Clock::now();
      Start(c, *slot);
      if (Status s = done_.WaitCompleted(static_cast<uint64_t>(i) + 1);
          !s.ok()) {
        return s;
      }
      const auto t1 = Clock::now();
      us->push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      wake_us->push_back(
          std::chrono::duration<double, std::micro>(t1 - done_.last_done())
              .count());
    }
    return Status::OK();
  }

  // One fetch of `c` whose bytes are compared with the holder's pattern.
  Status Verify(const FetchCase& c) {
    std::fill(landing_.begin(), landing_.begin() + SlotBytes(c), std::byte{0});
    Result<double> s = Fetch({c.name, c.segment_bytes, c.segments, 1}, 1);
    if (!s.ok()) return s.status();
    const uint64_t stride = c.segment_bytes + kSegmentGapBytes;
    for (uint64_t i = 0; i < SlotBytes(c); ++i) {
      const bool in_segment = i % stride < c.segment_bytes;
      if (landing_[i] != (in_segment ? Pattern(i) : std::byte{0})) {
        return Status::Corruption(
            fmt::format("{}: byte {} differs", c.name, i));
      }
    }
    return Status::OK();
  }

  // Bytes of reply data per call.
  static uint64_t CallBytes(const FetchCase& c) {
    return c.segment_bytes * c.segments;
  }
  // Bytes of landing buffer per call, gaps included.
  static uint64_t SlotBytes(const FetchCase& c) {
    return (c.segment_bytes + kSegmentGapBytes) * c.segments;
  }

 private:
  void Start(const FetchCase& c, size_t slot) {
    FetchRequest f{c.segment_bytes, c.segments};
    std::vector<std::byte> payload(sizeof(f));
    std::memcpy(payload.data(), &f, sizeof(f));
    transport_->Call(
        address_, kFetchOpcode, std::move(payload),
        Clock::now() + std::chrono::seconds(10),
        std::make_shared<SlotReceiver>(
            std::span(landing_).subspan(slot * slot_bytes_, SlotBytes(c)),
            c.segment_bytes, c.segments, slot, &done_));
  }

  PeerTransport* const transport_;  // owned by the caller
  const std::string address_;
  std::vector<std::byte> landing_;
  const uint64_t slot_bytes_;
  Completions done_;
};

// This process's CPU time and context switches so far (all threads): what
// the requester side of a call costs beyond its wall time.
struct ProcessCost {
  double cpu_us = 0;
  double switches = 0;

  static ProcessCost Now() {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    auto us = [](const timeval& tv) { return tv.tv_sec * 1e6 + tv.tv_usec; };
    return {us(u.ru_utime) + us(u.ru_stime),
            static_cast<double>(u.ru_nvcsw + u.ru_nivcsw)};
  }
  ProcessCost operator-(const ProcessCost& b) const {
    return {cpu_us - b.cpu_us, switches - b.switches};
  }
};

// ------------------------------------------------------------ directory

// A raw hiredis MGET of `keys`: the floor under a directory Lookup (the
// same one command in one round trip, without parsing or filtering).
class RawMget {
 public:
  explicit RawMget(int port) {
    timeval tv{5, 0};
    ctx_ = ::redisConnectWithTimeout("127.0.0.1", port, tv);
  }
  ~RawMget() {
    if (ctx_ != nullptr) ::redisFree(ctx_);
  }
  RawMget(const RawMget&) = delete;
  RawMget& operator=(const RawMget&) = delete;
  bool ok() const { return ctx_ != nullptr && ctx_->err == 0; }

  // Returns the number of keys that hold a value, or -1.
  int64_t Run(const std::vector<std::string>& keys) {
    argv_.assign(1, "MGET");
    lengths_.assign(1, 4);
    for (const std::string& k : keys) {
      argv_.push_back(k.data());
      lengths_.push_back(k.size());
    }
    void* r = ::redisCommandArgv(ctx_, static_cast<int>(argv_.size()),
                                 argv_.data(), lengths_.data());
    if (r == nullptr) return -1;
    auto* reply = static_cast<redisReply*>(r);
    int64_t values = -1;
    if (reply->type == REDIS_REPLY_ARRAY) {
      values = 0;
      for (size_t i = 0; i < reply->elements; ++i) {
        if (reply->element[i]->type == REDIS_REPLY_STRING) ++values;
      }
    }
    ::freeReplyObject(reply);
    return values;
  }

 private:
  redisContext* ctx_ = nullptr;
  std::vector<const char*> argv_;
  std::vector<size_t> lengths_;
};

struct LookupFigures {
  std::vector<double> lookup_us, raw_us;
};

Status MeasureDirectory(const PeerBenchOptions& o, LookupFigures* fig) {
  testing::RedisServer redis(testing::RedisServer::Spec{.password = ""});
  if (!testing::RedisServer::Available()) {
    return Status::NotFound("no redis-server (" +
                            testing::RedisServer::Binary() + ")");
  }
  if (Status s = redis.Start(); !s.ok()) return s;
  auto options = [&](const std::string& node) {
    transport::RedisDirectory::Options d;
    d.url = redis.url();
    d.cluster = "bench";
    d.node_id = node;
    d.address = "127.0.0.1:1";
    // Wide enough that a VM hiccup shows in p99 instead of ending the
    // lookup early (the daemon's default is 2 ms).
    d.lookup_budget = std::chrono::milliseconds(100);
    return d;
  };
  auto holder = transport::RedisDirectory::Open(options("holder"));
  if (!holder.ok()) return holder.status();
  auto requester = transport::RedisDirectory::Open(options("requester"));
  if (!requester.ok()) return requester.status();
  const transport::DirectoryNamespace ns{"bench-ns", 0x5eed};
  const std::string key_prefix =
      transport::RedisDirectory::PageKeyPrefix("bench", ns);
  std::vector<PageHash> pages;
  std::vector<std::string> keys;
  for (size_t i = 0; i < kLookupPages; ++i) {
    pages.push_back(PageHash{0x1234 + i, 0x9876 * (i + 1)});
    keys.push_back(key_prefix + pages.back().ToHex());
  }
  const auto soon = [] { return Clock::now() + std::chrono::seconds(5); };
  if (Status s = (*holder)->Publish(ns, pages); !s.ok()) return s;
  if (Status s = (*holder)->Flush(soon()); !s.ok()) return s;
  if (Status s = (*requester)->RefreshLiveNodes(soon()); !s.ok()) return s;
  // The keys the holder's Publish wrote (through the directory's script).
  RawMget raw(redis.port());
  if (!raw.ok()) return Status::Unavailable("hiredis cannot connect");

  // Blocks of lookups alternate with blocks of raw MGETs; the first
  // block of each is a warm-up.
  constexpr int kBlock = 100;
  for (int it = -1; it < o.iterations; ++it) {
    for (int b = 0; b < std::max(1, o.lookup_calls / kBlock); ++b) {
      for (int i = 0; i < kBlock; ++i) {
        const auto t0 = Clock::now();
        auto found = (*requester)->Lookup(ns, pages, soon());
        const double us =
            std::chrono::duration<double, std::micro>(Clock::now() - t0)
                .count();
        if (!found.ok()) return found.status();
        if (found->size() != kLookupPages) {
          return Status::Internal(fmt::format("lookup found {} of {} pages",
                                              found->size(), kLookupPages));
        }
        if (it >= 0) fig->lookup_us.push_back(us);
      }
      for (int i = 0; i < kBlock; ++i) {
        const auto t0 = Clock::now();
        const int64_t values = raw.Run(keys);
        const double us =
            std::chrono::duration<double, std::micro>(Clock::now() - t0)
                .count();
        if (values != static_cast<int64_t>(kLookupPages)) {
          return Status::Internal(fmt::format("raw MGET found {} of {} keys",
                                              values, kLookupPages));
        }
        if (it >= 0) fig->raw_us.push_back(us);
      }
      if (it < 0) break;
    }
  }
  return Status::OK();
}

// ----------------------------------------------------------------- run

bool Wanted(const PeerBenchOptions& o, std::string_view section) {
  return std::find(o.sections.begin(), o.sections.end(), section) !=
         o.sections.end();
}

Result<std::string> WriteSecret(const testing::TempDir& dir) {
  std::vector<std::byte> bytes(32);
  if (::getrandom(bytes.data(), bytes.size(), 0) !=
      static_cast<ssize_t>(bytes.size())) {
    return Status::IOError("getrandom failed");
  }
  const std::string path = dir.File("cluster.key");
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Status::IOError("cannot create " + path);
  const bool ok = ::write(fd, bytes.data(), bytes.size()) ==
                  static_cast<ssize_t>(bytes.size());
  ::close(fd);
  if (!ok) return Status::IOError("cannot write " + path);
  return path;
}

int Run(const PeerBenchOptions& o) {
  if (o.iterations < 1 || o.in_flight < 1 || o.latency_calls < 1 ||
      o.lookup_calls < 1) {
    fmt::print(stderr,
               "--iterations, --in-flight and the call counts must "
               "be positive\n");
    return 2;
  }
  auto round_bytes = ParseSizeOption("--bytes-per-round", o.bytes_per_round);
  if (!round_bytes.ok()) {
    fmt::print(stderr, "{}\n", round_bytes.status().ToString());
    return 2;
  }
  if (!UcxPerftestAvailable(o.ucx_perftest)) {
    fmt::print(stderr, "{} not found (Debian ucx-utils)\n", o.ucx_perftest);
    return 1;
  }
  // ucx_perftest takes its transports from the environment only; the
  // holder inherits it too.
  ::setenv("UCX_TLS", o.tls.c_str(), 1);

  testing::TempDir dir;
  Result<std::string> secret_path = WriteSecret(dir);
  if (!secret_path.ok()) {
    fmt::print(stderr, "{}\n", secret_path.status().ToString());
    return 1;
  }
  Result<std::vector<std::byte>> secret =
      transport::peer::ReadClusterSecretFile(*secret_path);
  if (!secret.ok()) {
    fmt::print(stderr, "{}\n", secret.status().ToString());
    return 1;
  }
  HolderProcess holder(*secret_path, o);
  if (holder.address().empty()) {
    fmt::print(stderr, "the holder process did not start\n");
    return 1;
  }

  const uint64_t kKiB = 1024, kMiB = kKiB * 1024;
  const std::vector<FetchCase> cases = {
      {"64KiB", 64 * kKiB, 1, o.in_flight},
      {"256KiB", 256 * kKiB, 1, o.in_flight},
      {"1MiB", kMiB, 1, o.in_flight},
      {"4MiB", 4 * kMiB, 1, o.in_flight},
      {"64x64KiB", 64 * kKiB, 64, 1},
      {"64x64KiB", 64 * kKiB, 64, o.in_flight},
  };
  uint64_t slot_bytes = 0;
  for (const auto& c : cases) {
    slot_bytes = std::max(slot_bytes, Requester::SlotBytes(c));
  }
  // Declared before the transport, so destroyed after it: UCX may write
  // into the landing buffers until the transport has shut down.
  std::unique_ptr<Requester> requester;
  Result<PeerTransportOptions> options =
      TransportOptions("requester", *secret, o);
  if (!options.ok()) {
    fmt::print(stderr, "{}\n", options.status().ToString());
    return 2;
  }
  Result<std::unique_ptr<PeerTransport>> opened =
      PeerTransport::Open(*options, nullptr);
  if (!opened.ok()) {
    fmt::print(stderr, "{}\n", opened.status().ToString());
    return 1;
  }
  std::unique_ptr<PeerTransport> transport = std::move(*opened);
  requester =
      std::make_unique<Requester>(transport.get(), holder.address(),
                                  static_cast<size_t>(o.in_flight), slot_bytes);

  nlohmann::json out;
  out["tls"] = o.tls;
  out["iterations"] = o.iterations;
  out["bytes_per_round"] = *round_bytes;
  out["transfer_spin_us"] =
      o.transfer_spin_us >= 0
          ? o.transfer_spin_us
          : transport::peer::PeerTransportOptions{}.transfer_spin.count();
  out["reply_gather_budget_bytes"] = options->reply_gather_budget_bytes;
  if (Wanted(o, "fetch")) {
    fmt::print(
        "peer fetch, UCX_TLS={}, holder in another process; GB/s = 1e9 B/s; "
        "medians of {} rounds of {} each, alternating with ucx_perftest "
        "ucp_am_bw of the same message, polling (-E poll, its default) and "
        "sleeping (-E sleep, event-driven as tierkv); ratios are medians of "
        "per-round ratios; requester CPU in cores\n",
        o.tls, o.iterations, o.bytes_per_round);
    fmt::print("{:>10} {:>9} {:>12} {:>12} {:>8} {:>12} {:>8} {:>13}\n",
               "segments", "in flight", "tierkv GB/s", "poll GB/s", "ratio",
               "sleep GB/s", "ratio", "requester CPU");
    for (const FetchCase& c : cases) {
      if (!o.cases.empty() &&
          std::find(o.cases.begin(), o.cases.end(), c.name) == o.cases.end()) {
        continue;
      }
      if (Status s = requester->Verify(c); !s.ok()) {
        fmt::print(stderr, "{}: {}\n", c.name, s.ToString());
        return 1;
      }
      const uint64_t call_bytes = Requester::CallBytes(c);
      const uint64_t calls = std::max<uint64_t>(
          static_cast<uint64_t>(c.in_flight) * 2, *round_bytes / call_bytes);
      UcxPerftestSpec spec;
      spec.binary = o.ucx_perftest;
      spec.test = "ucp_am_bw";
      spec.sizes.assign(c.segments, c.segment_bytes);
      spec.iov = c.segments > 1;
      spec.iterations = calls;
      spec.warmup = kFetchWarmupCalls;
      // Per round: tierkv, ucx_perftest polling, ucx_perftest sleeping, in
      // an order that rotates from round to round. The requester's CPU is
      // in seconds per wall second.
      std::vector<double> ours, poll, sleep, poll_ratios, sleep_ratios, cpu;
      for (int it = 0; it < o.iterations; ++it) {
        double mine = 0, polled = 0, slept = 0;
        for (int turn = 0; turn < 3; ++turn) {
          const int which = (turn + it) % 3;
          if (which == 0) {
            // Warmed up untimed as ucx_perftest is (-w).
            Result<double> sec = requester->Fetch(c, kFetchWarmupCalls);
            if (!sec.ok()) {
              fmt::print(stderr, "{}: {}\n", c.name, sec.status().ToString());
              return 1;
            }
            const ProcessCost before = ProcessCost::Now();
            sec = requester->Fetch(c, calls);
            if (!sec.ok()) {
              fmt::print(stderr, "{}: {}\n", c.name, sec.status().ToString());
              return 1;
            }
            mine = static_cast<double>(calls * call_bytes) / *sec / 1e9;
            cpu.push_back((ProcessCost::Now() - before).cpu_us / (*sec * 1e6));
            continue;
          }
          spec.wait_mode = which == 1 ? "poll" : "sleep";
          Result<UcxPerftestResult> r = RunUcxPerftest(spec);
          if (!r.ok()) {
            fmt::print(stderr, "{}\n", r.status().ToString());
            return 1;
          }
          (which == 1 ? polled : slept) = r->OverallGBps();
        }
        ours.push_back(mine);
        poll.push_back(polled);
        sleep.push_back(slept);
        poll_ratios.push_back(mine / polled);
        sleep_ratios.push_back(mine / slept);
      }
      fmt::print(
          "{:>10} {:>9} {:>12.2f} {:>12.2f} {:>8.2f} {:>12.2f} {:>8.2f} "
          "{:>13.2f}\n",
          c.name, c.in_flight, Median(ours), Median(poll), Median(poll_ratios),
          Median(sleep), Median(sleep_ratios), Median(cpu));
      out["fetch"].push_back({{"case", c.name},
                              {"segment_bytes", c.segment_bytes},
                              {"segments_per_call", c.segments},
                              {"in_flight", c.in_flight},
                              {"calls_per_round", calls},
                              {"tierkv_gbps", Median(ours)},
                              {"ucp_am_bw_poll_gbps", Median(poll)},
                              {"ratio_to_poll", Median(poll_ratios)},
                              {"ucp_am_bw_sleep_gbps", Median(sleep)},
                              {"ratio_to_sleep", Median(sleep_ratios)},
                              {"requester_cpu_per_wall_second", Median(cpu)},
                              {"tierkv_gbps_rounds", ours},
                              {"ucp_am_bw_poll_gbps_rounds", poll},
                              {"ucp_am_bw_sleep_gbps_rounds", sleep}});
    }
  }

  // One 64 KiB fetch at a time, against ucp_am_lat's round trip (polling
  // and sleeping).
  if (Wanted(o, "latency")) {
    const FetchCase one{"64KiB", kLatencySegmentBytes, 1, 1};
    std::vector<double> lat_us, wake_us;
    // Per wait mode (poll, sleep): each round's p50 and p99 round trips.
    std::vector<double> am_p50[2], am_p99[2];
    if (Status s = requester->Latencies(one, 100, &lat_us, &wake_us); !s.ok()) {
      fmt::print(stderr, "latency warm-up: {}\n", s.ToString());
      return 1;
    }
    lat_us.clear();
    wake_us.clear();
    ProcessCost cost;
    for (int it = 0; it < o.iterations; ++it) {
      const ProcessCost before = ProcessCost::Now();
      if (Status s =
              requester->Latencies(one, o.latency_calls, &lat_us, &wake_us);
          !s.ok()) {
        fmt::print(stderr, "latency: {}\n", s.ToString());
        return 1;
      }
      const ProcessCost spent = ProcessCost::Now() - before;
      cost.cpu_us += spent.cpu_us;
      cost.switches += spent.switches;
      for (int mode = 0; mode < 2; ++mode) {
        for (double rank : {50.0, 99.0}) {
          UcxPerftestSpec spec;
          spec.binary = o.ucx_perftest;
          spec.test = "ucp_am_lat";
          spec.sizes = {kLatencySegmentBytes};
          spec.iterations = static_cast<uint64_t>(o.latency_calls);
          spec.warmup = 100;
          spec.percentile = rank;
          spec.wait_mode = mode == 0 ? "poll" : "sleep";
          Result<UcxPerftestResult> r = RunUcxPerftest(spec);
          if (!r.ok()) {
            fmt::print(stderr, "{}\n", r.status().ToString());
            return 1;
          }
          // Half a round trip in ucx_perftest's report: double it.
          (rank == 50.0 ? am_p50 : am_p99)[mode].push_back(
              2 * r->percentile_latency_us);
        }
      }
    }
    const double p50 = Median(lat_us), p99 = Percentile(lat_us, 0.99);
    const double calls = static_cast<double>(lat_us.size());
    fmt::print(
        "\nfetch latency, one 64 KiB segment per call, {} calls: p50 {:.1f} "
        "us, p99 {:.1f} us (goal <= 100 / 300 us)\n"
        "  of which OnComplete to the caller's wake-up: p50 {:.1f} us\n"
        "  requester process per call: {:.1f} us of CPU, {:.1f} context "
        "switches\n",
        lat_us.size(), p50, p99, Median(wake_us), cost.cpu_us / calls,
        cost.switches / calls);
    out["fetch_latency_64KiB_us"] = {
        {"calls", lat_us.size()},
        {"p50", p50},
        {"p99", p99},
        {"complete_to_caller_wake_p50", Median(wake_us)},
        {"requester_cpu_us_per_call", cost.cpu_us / calls},
        {"requester_context_switches_per_call", cost.switches / calls}};
    for (int mode = 0; mode < 2; ++mode) {
      const char* name = mode == 0 ? "poll" : "sleep";
      const double b50 = Median(am_p50[mode]), b99 = Median(am_p99[mode]);
      fmt::print(
          "  ucp_am_lat -E {}, 64 KiB each way, round trip (2x its figure; "
          "medians of {} runs): p50 {:.1f} us, p99 {:.1f} us; tierkv/it p50 "
          "{:.2f}, p99 {:.2f}\n",
          name, am_p50[mode].size(), b50, b99, p50 / b50, p99 / b99);
      out["fetch_latency_64KiB_us"][std::string("ucp_am_lat_") + name] = {
          {"round_trip_p50", b50},
          {"round_trip_p99", b99},
          {"p50_ratio", p50 / b50},
          {"p99_ratio", p99 / b99}};
    }
  }

  const auto counters = transport->counters();
  out["requester_counters"] = {{"requests_sent", counters.requests_sent},
                               {"replies_received", counters.replies_received},
                               {"errors_timeout", counters.errors_timeout},
                               {"errors_reset", counters.errors_reset}};

  int rc = 0;
  LookupFigures fig;
  if (!Wanted(o, "directory")) {
    // skipped
  } else if (Status s = MeasureDirectory(o, &fig); !s.ok()) {
    fmt::print(stderr, "directory: {}\n", s.ToString());
    rc = 1;
  } else {
    const double p50 = Median(fig.lookup_us),
                 p99 = Percentile(fig.lookup_us, 0.99);
    const double raw_p50 = Median(fig.raw_us),
                 raw_p99 = Percentile(fig.raw_us, 0.99);
    fmt::print(
        "\ndirectory lookup of {} pages ({} calls, redis-server on "
        "loopback): p50 {:.1f} us, p99 {:.1f} us (goal p50 <= 200 us); raw "
        "hiredis MGET of {} keys p50 {:.1f} us, p99 {:.1f} us; ratio p50 "
        "{:.2f}, p99 {:.2f}\n",
        kLookupPages, fig.lookup_us.size(), p50, p99, kLookupPages, raw_p50,
        raw_p99, p50 / raw_p50, p99 / raw_p99);
    out["directory_lookup_128_us"] = {{"calls", fig.lookup_us.size()},
                                      {"p50", p50},
                                      {"p99", p99},
                                      {"raw_mget_p50", raw_p50},
                                      {"raw_mget_p99", raw_p99},
                                      {"p50_ratio", p50 / raw_p50},
                                      {"p99_ratio", p99 / raw_p99}};
  }
  if (!o.json_path.empty()) {
    std::ofstream(o.json_path) << out.dump(2) << "\n";
    fmt::print("wrote {}\n", o.json_path);
  }
  return rc;
}

const bool kRegistered = RegisterBench([](CLI::App& app) {
  auto opts = std::make_shared<PeerBenchOptions>();
  auto* sub = app.add_subcommand(
      "peer",
      "Peer transport fetch GB/s and latency vs ucx_perftest, directory "
      "lookup vs a raw Redis MGET");
  sub->add_option("--iterations", opts->iterations, "rounds per figure")
      ->capture_default_str();
  sub->add_option("--bytes-per-round", opts->bytes_per_round,
                  "bytes fetched per bandwidth round (and per ucx_perftest "
                  "run)")
      ->capture_default_str();
  sub->add_option("--in-flight", opts->in_flight,
                  "calls outstanding in the bandwidth rows")
      ->capture_default_str();
  sub->add_option("--latency-calls", opts->latency_calls, "per round")
      ->capture_default_str();
  sub->add_option("--lookup-calls", opts->lookup_calls, "per round")
      ->capture_default_str();
  sub->add_option("--tls", opts->tls, "UCX_TLS for every UCX user here")
      ->capture_default_str();
  sub->add_option("--rendezvous-threshold", opts->rendezvous_threshold,
                  "the transports' rendezvous_threshold_bytes (default: "
                  "theirs)");
  sub->add_option("--gather-budget", opts->gather_budget,
                  "the transports' reply_gather_budget_bytes; 0 sends "
                  "multi-piece replies as an IOV (default: theirs)");
  sub->add_option("--transfer-spin-us", opts->transfer_spin_us,
                  "the transports' transfer_spin in us (default: theirs)");
  sub->add_option("--sections", opts->sections,
                  "which parts to run: fetch, latency, directory")
      ->capture_default_str()
      ->check(CLI::IsMember({"fetch", "latency", "directory"}));
  sub->add_option("--cases", opts->cases,
                  "fetch rows to run (64KiB, 256KiB, 1MiB, 4MiB, 64x64KiB); "
                  "default all");
  sub->add_option("--ucx-perftest", opts->ucx_perftest)->capture_default_str();
  sub->add_option("--json", opts->json_path, "also write the figures here");
  // The re-executed holder (HolderProcess); not for people.
  sub->add_option("--holder-secret", opts->holder_secret)->group("");
  sub->add_option("--holder-fd", opts->holder_fd)->group("");
  sub->callback([opts] {
    SetExitCode(opts->holder_fd >= 0 ? RunHolder(*opts) : Run(*opts));
  });
});

}  // namespace
}  // namespace tierkv::bench
