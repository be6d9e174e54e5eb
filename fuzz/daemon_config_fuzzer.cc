// libFuzzer: tierkvd's TOML config loader and validation (daemon/config.h),
// on arbitrary file contents. LoadConfigFile reads a path, so each input
// goes through a file in /dev/shm (removed at exit).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "daemon/config.h"

namespace {

const std::string& InputPath() {
  static const std::string path =
      "/dev/shm/tierkv-config-fuzz-" + std::to_string(::getpid()) + ".toml";
  return path;
}

struct RemoveAtExit {
  ~RemoveAtExit() { std::remove(InputPath().c_str()); }
} remove_at_exit;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tierkv::daemon;
  FILE* f = std::fopen(InputPath().c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  auto config = LoadConfigFile(InputPath(), EmbeddedDefaults());
  if (config.ok()) (void)config->Validate();
  return 0;
}
