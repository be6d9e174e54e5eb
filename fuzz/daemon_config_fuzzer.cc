// libFuzzer: tierkvd's TOML config loader and validation (daemon/config.h),
// on arbitrary file contents. LoadConfigFile reads a path, so each input
// goes through a file in /dev/shm (removed at exit).
#include <cstddef>
#include <cstdint>
#include <string>

#include "daemon/config.h"
#include "fuzz/input_file.h"

const tierkv::fuzz::InputFile input(".toml");

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tierkv::daemon;
  if (!input.Write(data, size)) return 0;
  auto config = LoadConfigFile(input.path(), EmbeddedDefaults());
  if (config.ok()) (void)config->Validate();
  return 0;
}
