// tierkv-bench: one binary, one subcommand per benchmark (see registry.h).
#include <vector>

#include "bench/registry.h"

namespace tierkv::bench {
namespace {

std::vector<BenchSetup>& Registry() {
  static std::vector<BenchSetup> setups;
  return setups;
}
int g_exit_code = 0;

}  // namespace

bool RegisterBench(BenchSetup setup) {
  Registry().push_back(std::move(setup));
  return true;
}

void SetExitCode(int code) { g_exit_code = code; }

}  // namespace tierkv::bench

int main(int argc, char** argv) {
  CLI::App app{
      "tierkv-bench: tierkv benchmarks, each compared with a baseline "
      "measured in the same run"};
  app.require_subcommand(1);
  for (auto& setup : tierkv::bench::Registry()) setup(app);
  CLI11_PARSE(app, argc, argv);
  return tierkv::bench::g_exit_code;
}
