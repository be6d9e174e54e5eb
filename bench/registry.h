// Registry of tierkv-bench subcommands. Each benchmark file registers itself
// at static-initialization time:
//
//   static const bool kRegistered = tierkv::bench::RegisterBench(
//       [](CLI::App& app) { auto* sub = app.add_subcommand("host", "..."); ...
//       });
//
// A subcommand's callback runs the benchmark, prints a table and, when given
// `--json FILE`, writes the same figures as JSON. Benchmarks report ratios to
// a baseline measured in the same run (memcpy, fio), never absolute targets.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace tierkv::bench {

using BenchSetup = std::function<void(CLI::App& app)>;

// Adds `setup` to the list run by main(); always returns true.
bool RegisterBench(BenchSetup setup);

// Process exit code a benchmark's callback wants (0 unless it failed).
void SetExitCode(int code);

}  // namespace tierkv::bench
