// CreatePrivateDirectories: mkdir -p whose new directories get an exact
// mode whatever the process umask is (a daemon started under umask 000 must
// not leave its socket or token directory world-writable).
#pragma once

#include <sys/types.h>

#include <filesystem>

#include "tierkv/status.h"

namespace tierkv {

// Creates every missing directory of `dir` with mode `mode` (chmod'ed after
// mkdir, so the umask does not widen or narrow it). Existing directories
// are left as they are. IOError naming the directory on failure.
Status CreatePrivateDirectories(const std::filesystem::path& dir,
                                mode_t mode = 0750);

}  // namespace tierkv
