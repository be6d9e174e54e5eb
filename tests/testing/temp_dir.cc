#include "tests/testing/temp_dir.h"

#include <stdlib.h>

#include <system_error>

namespace tierkv::testing {

TempDir::TempDir() : TempDir(std::filesystem::temp_directory_path()) {}

TempDir::TempDir(const std::filesystem::path& parent) {
  std::string pattern = (parent / "tierkv-test-XXXXXX").string();
  char* made = ::mkdtemp(pattern.data());
  path_ = made ? std::filesystem::path(made) : std::filesystem::path();
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

}  // namespace tierkv::testing
