// `tierkv stats --watch` (see stats_watch.h).
//
// Drawn with plain ANSI/VT100 sequences (alternate screen, cursor home,
// clear to end of line) rather than ncurses: the view is a block of text
// rewritten whole each refresh and reads one key, which needs four escape
// sequences and termios, not a screen library and its terminfo dependency.
// Bars are ASCII so the view survives any locale (and tmux captures).
#include "tools/stats_watch.h"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/human_bytes.h"

namespace tierkv::tools {
namespace {

using nlohmann::json;

// The number at `path` ("a/b/c") in `j`, or 0 where absent.
double At(const json& j, std::initializer_list<const char*> path) {
  const json* p = &j;
  for (const char* key : path) {
    if (!p->is_object() || !p->contains(key)) return 0;
    p = &(*p)[key];
  }
  return p->is_number() ? p->get<double>() : 0;
}

// The "tiers" array of a Stats document (empty when absent).
const json& Tiers(const json& stats) {
  static const json kNone = json::array();
  if (!stats.is_object() || !stats.contains("tiers") ||
      !stats["tiers"].is_array()) {
    return kNone;
  }
  return stats["tiers"];
}

// The entry of tier `name` in `stats`'s "tiers", or an empty object.
const json& TierNamed(const json& stats, const std::string& name) {
  static const json kNone = json::object();
  for (const json& t : Tiers(stats)) {
    if (t.is_object() && t.value("name", std::string()) == name) return t;
  }
  return kNone;
}

// Whether `entry[group][name]` exists.
bool Has(const json& entry, const char* group, const char* name) {
  return entry.is_object() && entry.contains(group) &&
         entry[group].is_object() && entry[group].contains(name);
}

std::string Bar(double fraction, int width) {
  const int fill =
      static_cast<int>(std::clamp(fraction, 0.0, 1.0) * width + 0.5);
  return "|" + std::string(fill, '#') + std::string(width - fill, '.') + "|";
}

// The local time of day, HH:MM:SS, for the frame's header.
std::string WallClock() {
  const std::time_t t = std::time(nullptr);
  std::tm local{};
  ::localtime_r(&t, &local);
  char clock[16];
  std::strftime(clock, sizeof clock, "%H:%M:%S", &local);
  return clock;
}

volatile std::sig_atomic_t g_stop = 0;
void OnStopSignal(int) { g_stop = 1; }

// The terminal as it was, restored on every way out.
class TerminalGuard {
 public:
  TerminalGuard(bool screen, bool keys) : screen_(screen) {
    if (keys && ::tcgetattr(STDIN_FILENO, &saved_) == 0) {
      termios raw = saved_;
      raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
      raw.c_cc[VMIN] = 0;
      raw.c_cc[VTIME] = 0;
      keys_ = ::tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
    }
    if (screen_) std::fputs("\x1b[?1049h\x1b[?25l", stdout);  // alt screen
    struct sigaction sa {};
    sa.sa_handler = OnStopSignal;  // no SA_RESTART: poll() wakes with EINTR
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~TerminalGuard() {
    if (screen_) std::fputs("\x1b[?25h\x1b[?1049l", stdout);
    std::fflush(stdout);
    if (keys_) ::tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }
  bool keys() const { return keys_; }

 private:
  bool screen_;
  bool keys_ = false;
  termios saved_{};
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

int TerminalWidth() {
  winsize ws{};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
    return ws.ws_col;
  }
  return 100;
}

// Waits up to `ms` for a key; true when it was q (or a stop signal came).
bool WaitForQuit(int ms, bool keys) {
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!g_stop) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          until - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) return false;
    pollfd p{keys ? STDIN_FILENO : -1, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) > 0 && (p.revents & POLLIN)) {
      char c = 0;
      while (::read(STDIN_FILENO, &c, 1) == 1) {
        if (c == 'q' || c == 'Q') return true;
      }
    }
  }
  return true;
}

}  // namespace

std::string RenderWatchFrame(const std::string& before_text,
                             const std::string& now_text, double elapsed_s,
                             int refresh, int width) {
  const json now = json::parse(now_text);
  const json before =
      before_text.empty() ? json::object() : json::parse(before_text);
  const bool rates = !before_text.empty() && elapsed_s > 0;
  // Occupancy lines carry ~95 columns besides their bar.
  const int bar = std::clamp(width - 95, 10, 50);
  // Per second over the interval, or "-" on the first frame.
  auto per_s = [&](std::initializer_list<const char*> path) {
    if (!rates) return std::string("-");
    const double d = std::max(0.0, At(now, path) - At(before, path));
    return fmt::format("{:.1f}", d / elapsed_s);
  };
  std::string out;
  auto line = [&](const std::string& s) { out += s + "\n"; };

  line(fmt::format(
      "tierkv stats --watch   namespace {}   refresh {} every {:.1f} s   {}"
      "   (q quits)",
      now.value("namespace", std::string("?")), refresh,
      rates ? elapsed_s : 0.0, WallClock()));
  line("");
  // Hit shares by where Match found the pages: the tiers' kinds cheapest
  // first, then any other key the daemon reports, "miss" last.
  std::vector<std::string> sources;
  auto add_source = [&](const std::string& key) {
    if (key != "miss" &&
        std::find(sources.begin(), sources.end(), key) == sources.end() &&
        now.contains("lookup_tokens") && now["lookup_tokens"].contains(key)) {
      sources.push_back(key);
    }
  };
  for (const json& t : Tiers(now)) add_source(t.value("kind", std::string()));
  if (now.contains("lookup_tokens") && now["lookup_tokens"].is_object()) {
    for (const auto& [key, value] : now["lookup_tokens"].items()) {
      add_source(key);
    }
  }
  sources.push_back("miss");
  double interval_total = 0, start_total = 0;
  for (const std::string& source : sources) {
    const char* key = source.c_str();
    start_total += At(now, {"lookup_tokens", key});
    interval_total +=
        At(now, {"lookup_tokens", key}) - At(before, {"lookup_tokens", key});
  }
  const std::string tokens_per_s =
      rates ? fmt::format("{:.0f}", std::max(0.0, interval_total) / elapsed_s)
            : "-";
  line(fmt::format(
      "lookups {:>8}/s   tokens {:>9}/s   gets hit {}/s miss {}/s   puts "
      "stored {}/s dedup {}/s failed {}/s",
      per_s({"lookups"}), tokens_per_s, per_s({"get_segments", "hit"}),
      per_s({"get_segments", "miss"}), per_s({"put_segments", "stored"}),
      per_s({"put_segments", "dedup"}), per_s({"put_segments", "failed"})));

  // Hit share by tier: over the interval, else since the daemon started.
  const bool recent = rates && interval_total > 0;
  line("");
  line(recent ? fmt::format("hit share of looked-up tokens (last {:.1f} s)",
                            elapsed_s)
              : std::string("hit share of looked-up tokens (since start)"));
  for (const std::string& source : sources) {
    const char* key = source.c_str();
    const double v = recent ? At(now, {"lookup_tokens", key}) -
                                  At(before, {"lookup_tokens", key})
                            : At(now, {"lookup_tokens", key});
    const double total = recent ? interval_total : start_total;
    const double share = total > 0 ? v / total : 0;
    line(fmt::format("  {:<5} {:>6.1f}% {}", source, 100 * share,
                     Bar(share, bar)));
  }

  // One occupancy line per tier the daemon lists, cheapest first.
  line("");
  line("occupancy");
  double dirty_segments = 0;
  for (const json& t : Tiers(now)) {
    dirty_segments += At(t, {"gauges", "dirty_segments"});
  }
  std::vector<std::string> health;
  for (const json& t : Tiers(now)) {
    const std::string name = t.value("name", std::string("?"));
    const json& was = TierNamed(before, name);
    auto tier_rate = [&](const char* counter) {
      if (!rates) return std::string("-");
      const double d = std::max(
          0.0, At(t, {"counters", counter}) - At(was, {"counters", counter}));
      return fmt::format("{:.1f}", d / elapsed_s);
    };
    const double used = At(t, {"gauges", "used_bytes"});
    const double capacity = At(t, {"gauges", "capacity_bytes"});
    // The write-back target carries the mover's counters: its line shows
    // them instead of the eviction total.
    const std::string tail =
        Has(t, "counters", "demotions_done")
            ? fmt::format("evict {}/s, demote {}/s, promote {}/s",
                          tier_rate("evictions"), tier_rate("demotions_done"),
                          tier_rate("promotions_done"))
            : fmt::format("evict {}/s ({:.0f} in all)", tier_rate("evictions"),
                          At(t, {"counters", "evictions"}));
    const double f = capacity > 0 ? used / capacity : 0;
    line(fmt::format("  {:<5} {:>10} / {:<10} {:>6.1f}% {}  {}", name,
                     HumanBytes(used), HumanBytes(capacity), 100 * f,
                     Bar(f, bar), tail));
    if (Has(t, "counters", "checksum_failures") ||
        Has(t, "counters", "demotions_failed")) {
      health.push_back(fmt::format(
          "  {} health: {:.0f} checksum failures, {:.0f} demotions failed, "
          "{:.0f} dirty segments waiting",
          name, At(t, {"counters", "checksum_failures"}),
          At(t, {"counters", "demotions_failed"}), dirty_segments));
    }
  }
  for (const std::string& h : health) line(h);
  line("");
  line(fmt::format(
      "leases {:.0f} active   transfers: loads {}/s, stores "
      "{}/s, prefetches {}/s",
      At(now, {"active_leases"}), per_s({"transfers", "loads"}),
      per_s({"transfers", "stores"}), per_s({"transfers", "prefetches"})));
  return out;
}

std::string RenderWatchError(const Status& error, int refresh,
                             double interval_s) {
  return fmt::format(
      "tierkv stats --watch   refresh {} every {:.1f} s   {}   (q quits)\n\n"
      "tierkvd unreachable: {}\nretrying every {:.1f} s\n",
      refresh, interval_s, WallClock(), error.ToString(), interval_s);
}

Status RunStatsWatch(const std::function<Result<std::string>()>& fetch,
                     const WatchOptions& options) {
  if (!(options.interval_s >= 0.1)) {
    return Status::InvalidArgument("--interval must be at least 0.1 s");
  }
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  g_stop = 0;
  TerminalGuard terminal(tty, tty && ::isatty(STDIN_FILENO) == 1);
  std::string before;
  auto taken = std::chrono::steady_clock::now();
  for (int refresh = 1; options.count == 0 || refresh <= options.count;
       ++refresh) {
    Result<std::string> now = fetch();
    if (!now.ok() && refresh == 1) return now.status();
    const auto at = std::chrono::steady_clock::now();
    const double elapsed = std::chrono::duration<double>(at - taken).count();
    const std::string frame =
        now.ok()
            ? RenderWatchFrame(before, *now, elapsed, refresh, TerminalWidth())
            : RenderWatchError(now.status(), refresh, options.interval_s);
    if (tty) {
      // Home, then each line cleared to its end, then the rest cleared.
      std::string screen = "\x1b[H";
      size_t start = 0;
      for (size_t nl; (nl = frame.find('\n', start)) != std::string::npos;
           start = nl + 1) {
        screen += frame.substr(start, nl - start) + "\x1b[K\n";
      }
      screen += "\x1b[J";
      std::fputs(screen.c_str(), stdout);
    } else {
      std::fputs((frame + "\n").c_str(), stdout);
    }
    std::fflush(stdout);
    // After a failure the next frame has no rates (the counters may have
    // restarted with the daemon).
    before = now.ok() ? std::move(*now) : std::string();
    taken = at;
    if (options.count != 0 && refresh == options.count) break;
    if (WaitForQuit(static_cast<int>(options.interval_s * 1000),
                    terminal.keys())) {
      break;
    }
  }
  return Status::OK();
}

}  // namespace tierkv::tools
