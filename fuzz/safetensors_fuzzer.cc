// libFuzzer: the safetensors reader (common/safetensors.h) on arbitrary
// files: header length, JSON header, offsets, shapes and dtypes. The reader
// maps a path, so each input goes through a file in /dev/shm; every tensor
// it accepts is read end to end (its span must lie inside the mapping).
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/safetensors.h"
#include "fuzz/input_file.h"

const tierkv::fuzz::InputFile input(".safetensors");

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tierkv;
  if (!input.Write(data, size)) return 0;
  auto reader = SafetensorsReader::Open(input.path());
  if (!reader.ok()) return 0;
  unsigned sum = 0;
  for (const std::string& name : (*reader)->Names()) {
    const TensorView* t = (*reader)->Find(name);
    for (std::byte b : t->data) sum += static_cast<unsigned>(b);
  }
  return static_cast<int>(sum & 0);
}
