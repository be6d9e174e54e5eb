// ReadClusterSecretFile: loads the cluster's shared secret, the key of the
// peers' mutual HMAC handshake (peer_handshake.h), from a file that only its
// owner may read (scaleout.md §8f).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "tierkv/status.h"

namespace tierkv::transport::peer {

// The shortest secret accepted: 256 bits, HMAC-SHA256's key strength.
inline constexpr size_t kMinClusterSecretBytes = 32;
// A bound on the file read, so a wrong path (a log, a device) is refused
// instead of being read whole.
inline constexpr size_t kMaxClusterSecretBytes = 4096;

// Returns the file's bytes, as they are (a trailing newline is part of the
// secret: every node reads the same file). PermissionDenied when the file
// is readable or writable by group or others (mode & 077), naming the mode
// and the `chmod 600` fix; InvalidArgument when it is not a regular file or
// holds fewer than kMinClusterSecretBytes or more than
// kMaxClusterSecretBytes bytes; IOError (with errno's text) when it cannot
// be opened or read.
Result<std::vector<std::byte>> ReadClusterSecretFile(const std::string& path);

}  // namespace tierkv::transport::peer
