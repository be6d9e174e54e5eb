// libFuzzer: the executor's config.json parser (executor/config.h) on
// arbitrary JSON, then its validation.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "executor/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto json = nlohmann::json::parse(data, data + size, /*cb=*/nullptr,
                                    /*allow_exceptions=*/false);
  if (json.is_discarded()) return 0;
  auto config = tierkv::executor::ParseModelConfig(json);
  if (config.ok()) (void)config->Validate();
  return 0;
}
