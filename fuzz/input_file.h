// InputFile: for fuzzers whose parser reads a path, not bytes. Each input
// is written to one file in /dev/shm (per process), removed at exit.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace tierkv::fuzz {

class InputFile {
 public:
  explicit InputFile(const std::string& suffix)
      : path_("/dev/shm/tierkv-fuzz-" + std::to_string(::getpid()) + suffix) {}
  ~InputFile() { std::remove(path_.c_str()); }

  // Replaces the file's contents with data[0, size); false if it cannot.
  bool Write(const uint8_t* data, size_t size) const {
    FILE* f = std::fopen(path_.c_str(), "wb");
    if (!f) return false;
    const bool ok = std::fwrite(data, 1, size, f) == size;
    return std::fclose(f) == 0 && ok;
  }
  const std::string& path() const { return path_; }

 private:
  const std::string path_;
};

}  // namespace tierkv::fuzz
