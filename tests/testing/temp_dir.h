// TempDir: a fresh directory under $TMPDIR (or under `parent`), removed
// with its contents on destruction; path() is empty when it could not be
// made. Not thread-safe; one per test.
#pragma once

#include <filesystem>
#include <string>

namespace tierkv::testing {

class TempDir {
 public:
  TempDir();
  // E.g. "/var/tmp" for files that need O_DIRECT (tmpfs refuses it).
  explicit TempDir(const std::filesystem::path& parent);
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
