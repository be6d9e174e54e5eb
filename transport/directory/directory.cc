// DirectoryNamespace's key form and validation (directory.h).
#include "transport/directory/directory.h"

#include <cstdio>

namespace tierkv::transport {
namespace {
constexpr size_t kMaxNamespaceNameBytes = 255;
}  // namespace

std::string DirectoryNamespace::KeyComponent() const {
  char fingerprint[17];
  std::snprintf(fingerprint, sizeof(fingerprint), "%016llx",
                static_cast<unsigned long long>(layout_fingerprint));
  // The fingerprint has a fixed width and ends the component, so names
  // holding '@' or ':' still give distinct keys.
  return name + "@" + fingerprint;
}

Status DirectoryNamespace::Validate() const {
  if (name.empty()) {
    return Status::InvalidArgument("directory namespace name is empty");
  }
  if (name.size() > kMaxNamespaceNameBytes) {
    return Status::InvalidArgument(
        "directory namespace name is longer than 255 bytes");
  }
  for (const char c : name) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return Status::InvalidArgument(
          "directory namespace name holds a control character");
    }
  }
  return Status::OK();
}

}  // namespace tierkv::transport
