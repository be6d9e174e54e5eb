// `tierkv stats --watch`: a live full-screen view of one namespace, redrawn
// every interval from the daemon's Stats (one RPC per refresh): rates over
// the interval (lookups, tokens, gets, puts, evictions, NVMe traffic), the
// share of looked-up tokens each tier served as bars, and each tier's
// occupancy as a bar. The tiers are those the Stats JSON lists in "tiers"
// (daemon/tier_stats_json.h), whatever their names. `q` (or Ctrl-C) quits
// and restores the terminal.
#pragma once

#include <functional>
#include <string>

#include "tierkv/status.h"

namespace tierkv::tools {

struct WatchOptions {
  double interval_s = 2.0;  // between refreshes; >= 0.1
  int count = 0;            // stop after this many refreshes (0: until q)
};

// Renders one frame from two Stats JSON documents of the same namespace
// taken `elapsed_s` apart (`before` empty: the first frame, no rates yet).
// `refresh` is the frame's number (from 1). `width`: terminal columns.
std::string RenderWatchFrame(const std::string& before, const std::string& now,
                             double elapsed_s, int refresh, int width);

// Renders the frame of a refresh whose Stats failed (`error`), e.g. while
// the daemon restarts.
std::string RenderWatchError(const Status& error, int refresh,
                             double interval_s);

// Runs the view on the terminal until `q`, Ctrl-C or `count` refreshes.
// `fetch` returns the namespace's Stats JSON; its first failure ends the
// view with that error (a wrong socket or token), a later one is shown in
// the frame and retried every interval (the caller reconnects). On a
// terminal it uses the alternate screen; otherwise it prints frames one
// after another (for logs).
Status RunStatsWatch(const std::function<Result<std::string>()>& fetch,
                     const WatchOptions& options);

}  // namespace tierkv::tools
