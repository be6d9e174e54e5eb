#include "transport/fd_passing.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace tierkv::transport {
namespace {

Status Errno(const char* what) {
  return Status::IOError(std::string(what) + ": " + std::strerror(errno));
}

}  // namespace

Status SendAllWithFd(int socket_fd, std::span<const std::byte> bytes,
                     int fd_to_send) {
  size_t sent = 0;
  bool fd_pending = fd_to_send >= 0;
  while (sent < bytes.size()) {
    iovec iov{const_cast<std::byte*>(bytes.data() + sent), bytes.size() - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    if (fd_pending) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
      cmsg->cmsg_level = SOL_SOCKET;
      cmsg->cmsg_type = SCM_RIGHTS;
      cmsg->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(cmsg), &fd_to_send, sizeof(int));
    }
    ssize_t n = ::sendmsg(socket_fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        pollfd p{socket_fd, POLLOUT, 0};
        ::poll(&p, 1, 1000);
        continue;
      }
      return Errno("sendmsg");
    }
    fd_pending = false;
    sent += static_cast<size_t>(n);
  }
  return Status::OK();
}

namespace {
// Keeps the first descriptor of a message's SCM_RIGHTS data in *received_fd
// (when that is -1 and non-null) and closes the rest.
void TakeDescriptors(msghdr& msg, int* received_fd) {
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (received_fd && *received_fd < 0) {
        *received_fd = fd;
      } else {
        ::close(fd);
      }
    }
  }
}
}  // namespace

Result<size_t> RecvSomeWithFd(int socket_fd, std::span<std::byte> bytes,
                              int* received_fd) {
  while (true) {
    iovec iov{bytes.data(), bytes.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(socket_fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
      return Errno("recvmsg");
    }
    TakeDescriptors(msg, received_fd);
    if (n == 0) return Status::Unavailable("connection closed by peer");
    return static_cast<size_t>(n);
  }
}

Status RecvAllWithFd(int socket_fd, std::span<std::byte> bytes,
                     int* received_fd) {
  size_t got = 0;
  while (got < bytes.size()) {
    iovec iov{bytes.data() + got, bytes.size() - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(socket_fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return Status::IOError("timed out waiting for the daemon");
      }
      return Errno("recvmsg");
    }
    TakeDescriptors(msg, received_fd);
    if (n == 0) return Status::Unavailable("connection closed by peer");
    got += static_cast<size_t>(n);
  }
  return Status::OK();
}

}  // namespace tierkv::transport
