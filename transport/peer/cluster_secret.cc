#include "transport/peer/cluster_secret.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace tierkv::transport::peer {
namespace {

std::string Octal(unsigned mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", mode & 07777);
  return buf;
}

}  // namespace

Result<std::vector<std::byte>> ReadClusterSecretFile(const std::string& path) {
  // O_NOFOLLOW is not used: a symlink to a 0600 file (a mounted Kubernetes
  // secret) is fine; fstat below checks the file itself.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Status::IOError("cannot open cluster secret file " + path + ": " +
                           std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::IOError("cannot stat cluster secret file " + path + ": " +
                           std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::InvalidArgument("cluster secret " + path +
                                   " is not a regular file");
  }
  if ((st.st_mode & 077) != 0) {
    ::close(fd);
    return Status::PermissionDenied(
        "cluster secret file " + path + " has mode " + Octal(st.st_mode) +
        ", readable or writable by group or others; run `chmod 600 " + path +
        "`");
  }
  if (st.st_size < static_cast<off_t>(kMinClusterSecretBytes) ||
      st.st_size > static_cast<off_t>(kMaxClusterSecretBytes)) {
    ::close(fd);
    return Status::InvalidArgument(
        "cluster secret file " + path + " holds " + std::to_string(st.st_size) +
        " B; it must hold " + std::to_string(kMinClusterSecretBytes) + " to " +
        std::to_string(kMaxClusterSecretBytes) +
        " B (e.g. `head -c 32 /dev/urandom > " + path + "`)");
  }
  std::vector<std::byte> secret(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < secret.size()) {
    const ssize_t n = ::read(fd, secret.data() + done, secret.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      ::close(fd);
      return Status::IOError("cannot read cluster secret file " + path + ": " +
                             (n < 0 ? std::strerror(err) : "short read"));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return secret;
}

}  // namespace tierkv::transport::peer
