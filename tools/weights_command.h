// `tierkv weights`: model weights in a daemon's weights namespace
// (include/tierkv/weights.h): import a safetensors checkpoint, list the
// sealed shards, drop them, say when one is next used (hint) or keep one in
// DRAM (pin). The connection options (--socket, -n, --token)
// are tierkv's own; -n names the weights namespace.
#pragma once

#include <string>

#include "tierkv/client.h"

namespace CLI {
class App;
}

namespace tierkv::tools {

// What the command line said; filled by the parser AddWeightsCommand adds.
struct WeightsCommand {
  std::string path;  // import: a .safetensors file or a directory
  std::string model;
  std::string layout;
  // drop, hint, pin: 32 hex digits; empty: every version (drop), the
  // newest (hint, pin).
  std::string version;
  bool json = false;   // ls
  double seconds = 0;  // hint: next use in; pin: for how long
  bool clear = false;  // hint --clear, pin --unpin
  CLI::App* import = nullptr;
  CLI::App* ls = nullptr;
  CLI::App* drop = nullptr;
  CLI::App* hint = nullptr;
  CLI::App* pin = nullptr;
};

// Adds `weights` (with import, ls, drop, hint, pin) to `app`; returns it. `cmd`
// is filled when the command line is parsed, and must outlive `app`.
CLI::App* AddWeightsCommand(CLI::App& app, WeightsCommand& cmd);

// Runs the parsed subcommand on `client` (bound to the weights namespace),
// printing to stdout. Returns the error to report, if any.
Status RunWeightsCommand(Client& client, const WeightsCommand& cmd);

}  // namespace tierkv::tools
