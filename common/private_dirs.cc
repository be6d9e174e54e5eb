// CreatePrivateDirectories (see private_dirs.h).
#include "common/private_dirs.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

namespace tierkv {

Status CreatePrivateDirectories(const std::filesystem::path& dir, mode_t mode) {
  if (dir.empty()) return Status::OK();
  // The missing tail of the path, outermost first.
  std::vector<std::filesystem::path> missing;
  for (std::filesystem::path p = dir; !p.empty(); p = p.parent_path()) {
    std::error_code ec;
    if (std::filesystem::exists(p, ec)) break;
    missing.push_back(p);
    if (p == p.parent_path()) break;
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    const std::string path = it->string();
    if (::mkdir(path.c_str(), mode) != 0 && errno != EEXIST) {
      return Status::IOError("mkdir " + path + ": " + std::strerror(errno));
    }
    if (::chmod(path.c_str(), mode) != 0) {
      return Status::IOError("chmod " + path + ": " + std::strerror(errno));
    }
  }
  return Status::OK();
}

}  // namespace tierkv
