// TempDir: a fresh directory under $TMPDIR, removed with its contents on
// destruction. Not thread-safe; one per test.
#pragma once

#include <filesystem>
#include <string>

namespace tierkv::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string File(const std::string& name) const {
    return (path_ / name).string();
  }

 private:
  std::filesystem::path path_;
};

}  // namespace tierkv::testing
