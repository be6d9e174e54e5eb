// libFuzzer: the safetensors reader (executor/safetensors.h) on arbitrary
// files: header length, JSON header, offsets, shapes and dtypes. The reader
// maps a path, so each input goes through a file in /dev/shm; every tensor
// it accepts is read end to end (its span must lie inside the mapping).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "executor/safetensors.h"

namespace {

const std::string& InputPath() {
  static const std::string path =
      "/dev/shm/tierkv-st-fuzz-" + std::to_string(::getpid()) + ".safetensors";
  return path;
}

struct RemoveAtExit {
  ~RemoveAtExit() { std::remove(InputPath().c_str()); }
} remove_at_exit;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tierkv::executor;
  FILE* f = std::fopen(InputPath().c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  auto reader = SafetensorsReader::Open(InputPath());
  if (!reader.ok()) return 0;
  unsigned sum = 0;
  for (const std::string& name : (*reader)->Names()) {
    const TensorView* t = (*reader)->Find(name);
    for (std::byte b : t->data) sum += static_cast<unsigned>(b);
  }
  return static_cast<int>(sum & 0);
}
