// `tierkv-bench eviction`: what one eviction costs in a full host tier, per
// eviction policy (lru, 2q, s3fifo, topk) and arena size (issue "Top-k-aware
// caching": µs per eviction at 1 GiB and 16 GiB within 1.5x of each other).
//
// A HostTier is built directly (storage/, no daemon) with an unprefaulted
// arena without hugepages: the allocator and the index never touch the
// arena's bytes and neither does the bench, so a 16 GiB tier costs only its
// index (~262K entries of 64 KiB). It is filled completely with fixed-size
// segments, then every further Reserve of a new key must evict. Between
// those Reserves runs the traffic that shapes a policy's queues, untimed:
//   - Touch of a hot key (the first `hot` share of the keys ever stored,
//     so used again and again: 2q's protected queue, s3fifo's main, topk's
//     high scores) and of a random recent key (may have been evicted);
//   - Acquire + Release of a random recent key (a read: the segment leaves
//     the policy and comes back, wherever its rank puts it);
//   - every --report-every evictions, HostTier::Report of a batch of hot
//     and recent keys with weights (topk ranks by them; the others ignore
//     them, so every policy sees the same calls).
// Timed per call: the evicting Reserve (the figure of the acceptance),
// Commit (the policy's Admit and Link), and the Release that links a read
// segment back (a hook every read pays, O(1) in the contract of
// eviction_policy.h). The non-evicting Reserve + Commit of the fill's last
// tenth is the baseline of the same index size: what the hash maps and the
// allocator cost at that size, without a policy victim.
//
// A policy's cases are filled first and their timed Reserves then run in
// --rounds interleaved rounds (each after a few thousand untimed ones that
// bring its index back into the CPU caches), so other load on this shared
// machine falls on every case alike.
//
// Controls (--control): the largest arena with as few segments as the
// smallest has (segments 16x larger) and the smallest with as many as the
// largest has (16x smaller). They separate what the arena's size costs
// (nothing, for an O(1) policy) from what the segment count costs (the
// index and the policy's entries outgrowing the CPU caches, and a
// policy's own O(log n) or worse).
#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/registry.h"
#include "bench/sample_stats.h"
#include "storage/host/host_tier.h"
#include "storage/policy/eviction_policy.h"

namespace tierkv::bench {
namespace {

using Clock = std::chrono::steady_clock;
using storage::HostTier;

struct EvictionBenchOptions {
  std::vector<std::string> policies = {"lru", "2q", "s3fifo", "topk"};
  std::vector<uint64_t> capacities_gib = {1, 16};
  uint32_t segment_kib = 64;
  // Timed evicting Reserves per (policy, capacity), after `warmup` untimed
  // ones with the same traffic.
  uint64_t evictions = 100000;
  uint64_t warmup = 25000;
  // The timed Reserves run in this many rounds, interleaved over the cases
  // of a policy.
  uint64_t rounds = 10;
  // Untimed evicting Reserves at the start of each round.
  uint64_t round_warmup = 5000;
  // Share of the tier's segments that is hot (Touched again and again).
  double hot_fraction = 0.1;
  // Per eviction: Touches (alternately hot and recent keys) and reads
  // (Acquire + Release of a recent key).
  uint32_t touches = 2;
  uint32_t reads = 1;
  // A Report batch of `report_keys` keys every this many evictions.
  uint32_t report_every = 16;
  uint32_t report_keys = 64;
  uint32_t shards = 8;
  uint64_t seed = 1;
  // Also run the segment-count controls (see CaseSpecs).
  bool control = true;
  std::string json_path;
};

struct CaseResult {
  std::string policy;
  uint64_t capacity_gib = 0;
  uint64_t segment_kib = 0;
  uint64_t segments = 0;  // resident once full
  double fill_seconds = 0;
  // Microseconds per call.
  double baseline_p50 = 0;  // non-evicting Reserve + Commit, last tenth of fill
  double reserve_p50 = 0, reserve_p99 = 0;  // evicting Reserve
  double commit_p50 = 0;
  double release_p50 = 0, release_p99 = 0;  // a read's relink
  double evictions_per_second = 0;          // timed Reserves / their sum
  double evictions_per_reserve = 0;         // from the tier's counters
  uint64_t failed = 0;                      // Reserves that did not succeed
  std::vector<double> round_medians;        // evicting Reserve, per round
};

SegmentKey KeyOf(uint64_t i) {
  return SegmentKey{PageHash{.lo = i, .hi = 0x65766963u}, 0, 0};
}

double MicrosSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

class EvictionCase {
 public:
  EvictionCase(const EvictionBenchOptions& o, std::unique_ptr<HostTier> tier,
               uint64_t segment_bytes, uint64_t segments)
      : o_(o),
        tier_(std::move(tier)),
        segment_bytes_(segment_bytes),
        segments_(segments),
        hot_(std::max<uint64_t>(
            1, static_cast<uint64_t>(o.hot_fraction *
                                     static_cast<double>(segments)))),
        rng_(o.seed) {}

  // Stores one new key; its Reserve and Commit in microseconds, or false.
  bool Store(double* reserve_us, double* commit_us) {
    const SegmentKey key = KeyOf(next_key_++);
    auto t0 = Clock::now();
    auto r = tier_->Reserve(key, segment_bytes_);
    *reserve_us = MicrosSince(t0);
    if (!r.ok() || r->already_stored) return false;
    t0 = Clock::now();
    const Status s = tier_->Commit(key);
    *commit_us = MicrosSince(t0);
    return s.ok();
  }

  // The untimed traffic around one store, plus the reads' relink times.
  void Traffic(std::vector<double>* release_us) {
    for (uint32_t t = 0; t < o_.touches; ++t) {
      (void)tier_->Touch(KeyOf(t % 2 == 0 ? HotKey() : RecentKey()));
    }
    for (uint32_t r = 0; r < o_.reads; ++r) {
      const SegmentKey key = KeyOf(RecentKey());
      if (!tier_->Acquire(key).ok()) continue;
      const auto t0 = Clock::now();
      tier_->Release(key);
      if (release_us) release_us->push_back(MicrosSince(t0));
    }
    if (o_.report_every > 0 && ++stores_ % o_.report_every == 0) {
      std::vector<std::pair<SegmentKey, double>> batch;
      for (uint32_t i = 0; i < o_.report_keys; ++i) {
        const bool hot = i % 2 == 0;
        batch.push_back({KeyOf(hot ? HotKey() : RecentKey()),
                         hot ? 1.0 + static_cast<double>(rng_() % 32) : 1.0});
      }
      tier_->Report(batch);
    }
  }

  HostTier& tier() { return *tier_; }

 private:
  uint64_t HotKey() { return rng_() % std::min(hot_, next_key_); }
  // One of the last `segments_` keys stored (resident unless evicted).
  uint64_t RecentKey() {
    const uint64_t span = std::min(segments_, next_key_);
    return next_key_ - 1 - rng_() % span;
  }

  const EvictionBenchOptions& o_;
  const std::unique_ptr<HostTier> tier_;
  const uint64_t segment_bytes_;
  const uint64_t segments_;
  const uint64_t hot_;
  std::mt19937_64 rng_;
  uint64_t next_key_ = 0;
  uint64_t stores_ = 0;
};

struct CaseSpec {
  uint64_t capacity_gib = 0;
  uint64_t segment_kib = 0;
};

// The cases per policy: every capacity at --segment-kib and, with
// --control, the largest capacity with as few segments as the smallest
// (segments 16x larger) and the smallest with as many as the largest
// (16x smaller): what the arena's bytes cost apart from the segment count.
std::vector<CaseSpec> CaseSpecs(const EvictionBenchOptions& o, uint64_t lo,
                                uint64_t hi) {
  std::vector<CaseSpec> specs;
  for (uint64_t gib : o.capacities_gib) specs.push_back({gib, o.segment_kib});
  const uint64_t scale = hi / lo;
  if (o.control && hi != lo && hi % lo == 0 && o.segment_kib % scale == 0) {
    specs.push_back({hi, o.segment_kib * scale});
    specs.push_back({lo, o.segment_kib / scale});
  }
  return specs;
}

// One case in progress: its tier, kept full, and its samples.
struct LiveCase {
  std::unique_ptr<EvictionCase> c;
  CaseResult result;
  std::vector<double> reserve, commit, release;
  std::vector<double> round_medians;  // of the evicting Reserves
  uint64_t timed_evictions = 0;  // during the timed Reserves (tier counter)
};

// Creates and fills one tier (every Reserve finds free space), then runs
// the untimed warm-up.
Result<LiveCase> StartCase(const EvictionBenchOptions& o,
                           const std::string& policy, uint64_t capacity_gib,
                           uint64_t segment_kib) {
  auto kind = storage::ParseEvictionPolicy(policy);
  if (!kind.ok()) return kind.status();
  storage::HostTierOptions ho;
  ho.name = fmt::format("eviction-bench-{}-{}g-{}k", policy, capacity_gib,
                        segment_kib);
  ho.capacity_bytes = capacity_gib << 30;
  ho.shards = o.shards;
  ho.try_hugepages = false;
  ho.prefault = false;
  ho.eviction_policy = *kind;
  auto tier = HostTier::Create(ho);
  if (!tier.ok()) return tier.status();
  const uint64_t segment_bytes = segment_kib << 10;
  const uint64_t segments = ho.capacity_bytes / segment_bytes;
  LiveCase live;
  live.c = std::make_unique<EvictionCase>(o, std::move(tier).value(),
                                          segment_bytes, segments);
  EvictionCase& c = *live.c;
  CaseResult& r = live.result;
  r.policy = policy;
  r.capacity_gib = capacity_gib;
  r.segment_kib = segment_kib;
  r.segments = segments;
  std::vector<double> baseline;
  const auto fill_start = Clock::now();
  for (uint64_t i = 0; i < segments; ++i) {
    double reserve_us = 0, commit_us = 0;
    if (!c.Store(&reserve_us, &commit_us)) {
      return Status::Internal(
          fmt::format("{} at {} GiB: filling failed at segment {}", r.policy,
                      capacity_gib, i));
    }
    if (i >= segments - segments / 10) {
      baseline.push_back(reserve_us + commit_us);
    }
    c.Traffic(nullptr);
  }
  r.fill_seconds = MicrosSince(fill_start) * 1e-6;
  r.baseline_p50 = Median(baseline);
  if (c.tier().Stats().evictions != 0) {
    return Status::Internal(fmt::format(
        "{} at {} GiB: the fill evicted; the segments do not tile the arena",
        r.policy, capacity_gib));
  }
  for (uint64_t i = 0; i < o.warmup; ++i) {
    double reserve_us = 0, commit_us = 0;
    r.failed += !c.Store(&reserve_us, &commit_us);
    c.Traffic(nullptr);
  }
  live.reserve.reserve(o.evictions);
  live.commit.reserve(o.evictions);
  live.release.reserve(o.evictions * o.reads);
  return live;
}

// `warmup` untimed, then `n` timed evicting Reserves with their traffic.
// The untimed ones bring the case's index back into the CPU caches that
// the other cases' rounds took.
void RunRound(LiveCase& live, uint64_t warmup, uint64_t n) {
  for (uint64_t i = 0; i < warmup; ++i) {
    double reserve_us = 0, commit_us = 0;
    live.result.failed += !live.c->Store(&reserve_us, &commit_us);
    live.c->Traffic(nullptr);
  }
  std::vector<double> round;
  round.reserve(n);
  const uint64_t evictions_before = live.c->tier().Stats().evictions;
  for (uint64_t i = 0; i < n; ++i) {
    double reserve_us = 0, commit_us = 0;
    if (live.c->Store(&reserve_us, &commit_us)) {
      live.reserve.push_back(reserve_us);
      live.commit.push_back(commit_us);
      round.push_back(reserve_us);
    } else {
      live.result.failed++;
    }
    live.c->Traffic(&live.release);
  }
  live.timed_evictions += live.c->tier().Stats().evictions - evictions_before;
  live.round_medians.push_back(Median(std::move(round)));
}

// The case's figures; frees its tier.
CaseResult FinishCase(LiveCase& live) {
  CaseResult& r = live.result;
  const uint64_t evicted = live.timed_evictions;
  double reserve_sum = 0;
  for (double us : live.reserve) reserve_sum += us;
  r.reserve_p50 = Median(live.reserve);
  r.reserve_p99 = Percentile(live.reserve, 0.99);
  r.commit_p50 = Median(live.commit);
  r.release_p50 = Median(live.release);
  r.release_p99 = Percentile(live.release, 0.99);
  r.round_medians = live.round_medians;
  r.evictions_per_second =
      reserve_sum > 0 ? static_cast<double>(evicted) / (reserve_sum * 1e-6) : 0;
  r.evictions_per_reserve = live.reserve.empty()
                                ? 0
                                : static_cast<double>(evicted) /
                                      static_cast<double>(live.reserve.size());
  live.c.reset();
  return std::move(r);
}

double Ratio(double x, double y) { return y > 0 ? x / y : 0.0; }

int Run(const EvictionBenchOptions& o) {
  if (o.segment_kib == 0 || o.evictions == 0 || o.capacities_gib.empty() ||
      !(o.hot_fraction > 0 && o.hot_fraction < 1)) {
    fmt::print(stderr,
               "eviction bench: --segment-kib and --evictions must be > 0, "
               "--hot-fraction in (0, 1)\n");
    return 2;
  }
  const uint64_t lo =
      *std::min_element(o.capacities_gib.begin(), o.capacities_gib.end());
  const uint64_t hi =
      *std::max_element(o.capacities_gib.begin(), o.capacities_gib.end());
  fmt::print(
      "eviction bench: HostTier (no daemon), {} shards, arena not prefaulted "
      "and never written; per case: fill, {} warm-up and {} timed evicting "
      "Reserves (in {} rounds interleaved over a policy's cases), each with "
      "{} Touch(es) (hot {:.0f}% / recent), {} Acquire+Release of a recent "
      "key and every {} a Report of {} keys\n",
      o.shards, o.warmup, o.evictions, o.rounds, o.touches,
      o.hot_fraction * 100, o.reads, o.report_every, o.report_keys);
  std::vector<CaseResult> results;
  for (const std::string& policy : o.policies) {
    // Every case of the policy is filled first, then the timed Reserves
    // run in interleaved rounds, so a burst of other load on the machine
    // lands on every case alike.
    const auto t0 = Clock::now();
    std::vector<LiveCase> live;
    for (const CaseSpec& spec : CaseSpecs(o, lo, hi)) {
      auto c = StartCase(o, policy, spec.capacity_gib, spec.segment_kib);
      if (!c.ok()) {
        fmt::print(stderr, "eviction bench: {}\n", c.status().ToString());
        return 1;
      }
      live.push_back(std::move(c).value());
    }
    const uint64_t rounds = std::max<uint64_t>(1, o.rounds);
    for (uint64_t round = 0; round < rounds; ++round) {
      const uint64_t n =
          o.evictions / rounds + (round < o.evictions % rounds ? 1 : 0);
      for (LiveCase& c : live) RunRound(c, o.round_warmup, n);
    }
    for (LiveCase& c : live) results.push_back(FinishCase(c));
    fmt::print(stderr, "eviction bench: {} done in {:.1f} s\n", policy,
               MicrosSince(t0) * 1e-6);
  }
  fmt::print(
      "  {:<7} {:>4} {:>5} {:>8} {:>8} | {:>9} {:>9} {:>11} {:>6} | "
      "{:>7} {:>8} {:>9} {:>6}\n",
      "policy", "GiB", "KiB", "segments", "fill us", "evict p50", "evict p99",
      "evictions/s", "ev/res", "commit", "rel p50", "rel p99", "fill s");
  for (const CaseResult& r : results) {
    fmt::print(
        "  {:<7} {:>4} {:>5} {:>8} {:>8.2f} | {:>9.2f} {:>9.2f} "
        "{:>11.0f} {:>6.3f} | {:>7.2f} {:>8.2f} {:>9.2f} {:>6.1f}\n",
        r.policy, r.capacity_gib, r.segment_kib, r.segments, r.baseline_p50,
        r.reserve_p50, r.reserve_p99, r.evictions_per_second,
        r.evictions_per_reserve, r.commit_p50, r.release_p50, r.release_p99,
        r.fill_seconds);
  }
  auto find = [&](const std::string& policy, uint64_t gib,
                  uint64_t kib) -> const CaseResult* {
    for (const CaseResult& r : results) {
      if (r.policy == policy && r.capacity_gib == gib && r.segment_kib == kib) {
        return &r;
      }
    }
    return nullptr;
  };
  nlohmann::json ratios = nlohmann::json::object();
  bool all_within = true;
  const uint64_t scale = hi / lo;
  if (hi != lo) {
    fmt::print(
        "  ratios of medians (p99 for evict p99)  | {} GiB / {} GiB, {} KiB "
        "segments (acceptance)            | same segment count, {}x the "
        "arena  | {}x the segments, same arena\n",
        hi, lo, o.segment_kib, scale, scale);
    fmt::print(
        "  {:<7} {:>9} {:>9} {:>8} {:>7} {:>8} | {:>16} {:>16} | "
        "{:>14}\n",
        "policy", "evict p50", "evict p99", "fill", "rel", "<= 1.5x",
        fmt::format("{}G/{}K:{}G/{}K", hi, o.segment_kib * scale, lo,
                    o.segment_kib),
        fmt::format("{}G/{}K:{}G/{}K", hi, o.segment_kib, lo,
                    o.segment_kib / std::max<uint64_t>(scale, 1)),
        fmt::format("{}G/{}K:{}G/{}K", lo,
                    o.segment_kib / std::max<uint64_t>(scale, 1), lo,
                    o.segment_kib));
    for (const std::string& policy : o.policies) {
      const CaseResult* a = find(policy, lo, o.segment_kib);
      const CaseResult* b = find(policy, hi, o.segment_kib);
      if (!a || !b) continue;
      const double p50 = Ratio(b->reserve_p50, a->reserve_p50);
      const double p99 = Ratio(b->reserve_p99, a->reserve_p99);
      const double fill = Ratio(b->baseline_p50, a->baseline_p50);
      const double rel = Ratio(b->release_p50, a->release_p50);
      all_within = all_within && p50 <= 1.5;
      nlohmann::json j = {{"evict_p50", p50},
                          {"evict_p99", p99},
                          {"fill_p50", fill},
                          {"release_p50", rel},
                          {"within_1_5x", p50 <= 1.5}};
      // Controls: the arena's bytes at an equal segment count, and the
      // segment count at an equal arena.
      const CaseResult* big_segments = find(policy, hi, o.segment_kib * scale);
      const CaseResult* small_segments =
          scale > 0 && o.segment_kib % scale == 0
              ? find(policy, lo, o.segment_kib / scale)
              : nullptr;
      std::string bytes_few = "-", bytes_many = "-", count = "-";
      if (big_segments) {
        const double x = Ratio(big_segments->reserve_p50, a->reserve_p50);
        bytes_few = fmt::format("{:.2f}x", x);
        j["arena_bytes_at_small_count_evict_p50"] = x;
      }
      if (small_segments) {
        const double x = Ratio(b->reserve_p50, small_segments->reserve_p50);
        const double y = Ratio(small_segments->reserve_p50, a->reserve_p50);
        bytes_many = fmt::format("{:.2f}x", x);
        count = fmt::format("{:.2f}x", y);
        j["arena_bytes_at_large_count_evict_p50"] = x;
        j["segment_count_at_small_arena_evict_p50"] = y;
      }
      fmt::print(
          "  {:<7} {:>8.2f}x {:>8.2f}x {:>7.2f}x {:>6.2f}x {:>8} | "
          "{:>16} {:>16} | {:>14}\n",
          policy, p50, p99, fill, rel, p50 <= 1.5 ? "yes" : "NO", bytes_few,
          bytes_many, count);
      ratios[policy] = std::move(j);
    }
  }
  fmt::print(
      "  fill us = non-evicting Reserve + Commit (last tenth of the fill, "
      "median); evict = evicting Reserve; commit = its Commit (median); rel "
      "= Release of a read segment (its relink into the policy); ev/res = "
      "evictions per timed Reserve (tier counters); times in microseconds; "
      "controls compare evict p50\n");
  if (!o.json_path.empty()) {
    nlohmann::json cases = nlohmann::json::array();
    for (const CaseResult& r : results) {
      cases.push_back({{"policy", r.policy},
                       {"capacity_gib", r.capacity_gib},
                       {"segment_kib", r.segment_kib},
                       {"segments", r.segments},
                       {"fill_seconds", r.fill_seconds},
                       {"fill_reserve_commit_p50_us", r.baseline_p50},
                       {"evict_reserve_p50_us", r.reserve_p50},
                       {"evict_reserve_p99_us", r.reserve_p99},
                       {"commit_p50_us", r.commit_p50},
                       {"release_p50_us", r.release_p50},
                       {"release_p99_us", r.release_p99},
                       {"evictions_per_second", r.evictions_per_second},
                       {"evictions_per_reserve", r.evictions_per_reserve},
                       {"failed_reserves", r.failed},
                       {"evict_reserve_round_p50_us", r.round_medians}});
    }
    const nlohmann::json j = {{"segment_kib", o.segment_kib},
                              {"shards", o.shards},
                              {"evictions", o.evictions},
                              {"warmup", o.warmup},
                              {"rounds", o.rounds},
                              {"round_warmup", o.round_warmup},
                              {"hot_fraction", o.hot_fraction},
                              {"touches", o.touches},
                              {"reads", o.reads},
                              {"report_every", o.report_every},
                              {"report_keys", o.report_keys},
                              {"seed", o.seed},
                              {"cases", cases},
                              {"ratios", ratios},
                              {"all_within_1_5x", all_within}};
    std::ofstream(o.json_path) << j.dump(2) << "\n";
  }
  for (const CaseResult& r : results) {
    if (r.failed > 0) return 1;
  }
  return 0;
}

const bool kRegistered = RegisterBench([](CLI::App& app) {
  auto o = std::make_shared<EvictionBenchOptions>();
  auto* sub = app.add_subcommand(
      "eviction",
      "Cost of one eviction in a full HostTier per policy and arena size");
  sub->add_option("--policies", o->policies, "lru, 2q, s3fifo, topk")
      ->delimiter(',')
      ->check(CLI::IsMember({"lru", "2q", "s3fifo", "topk"}))
      ->capture_default_str();
  sub->add_option("--capacities-gib", o->capacities_gib,
                  "arena sizes (never written: only the index is resident)")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--segment-kib", o->segment_kib, "fixed segment size")
      ->capture_default_str();
  sub->add_option("--evictions", o->evictions,
                  "timed evicting Reserves per case")
      ->capture_default_str();
  sub->add_option("--warmup", o->warmup, "untimed evicting Reserves first")
      ->capture_default_str();
  sub->add_option("--rounds", o->rounds,
                  "timed Reserves run in rounds interleaved over the cases "
                  "of a policy")
      ->capture_default_str();
  sub->add_option("--round-warmup", o->round_warmup,
                  "untimed evicting Reserves at the start of each round")
      ->capture_default_str();
  sub->add_option("--hot-fraction", o->hot_fraction,
                  "share of the tier's segments touched again and again")
      ->capture_default_str();
  sub->add_option("--touches", o->touches, "Touches per eviction")
      ->capture_default_str();
  sub->add_option("--reads", o->reads, "Acquire+Release per eviction")
      ->capture_default_str();
  sub->add_option("--report-every", o->report_every,
                  "evictions between Report batches (0: none)")
      ->capture_default_str();
  sub->add_option("--report-keys", o->report_keys, "keys per Report batch")
      ->capture_default_str();
  sub->add_option("--shards", o->shards)->capture_default_str();
  sub->add_option("--seed", o->seed)->capture_default_str();
  sub->add_option("--control", o->control,
                  "also the largest arena with segments as many as the "
                  "smallest's, and the smallest with as many as the largest's")
      ->capture_default_str();
  sub->add_option("--json", o->json_path, "write the figures as JSON");
  sub->callback([o] { SetExitCode(Run(*o)); });
});

}  // namespace
}  // namespace tierkv::bench
