// Sends and receives bytes with an attached descriptor (SCM_RIGHTS) over a
// Unix socket; see fd_passing.h for the contracts.
#include "transport/fd_passing.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace tierkv::transport {
namespace {

// Descriptors one recvmsg call has room for; the kernel discards any beyond
// them (MSG_CTRUNC). tierkv peers send at most one per message.
constexpr size_t kMaxDescriptorsPerRecv = 4;

Status Errno(const char* what) {
  return Status::IOError(std::string(what) + ": " + std::strerror(errno));
}

// The msghdr of one sendmsg/recvmsg call: one iovec over borrowed bytes and
// the control buffer for SCM_RIGHTS descriptors. It points into itself, so
// it is neither copied nor moved; build a new one for every call.
class SocketMessage {
 public:
  // `bytes` must outlive the sendmsg/recvmsg call (sendmsg only reads them).
  SocketMessage(const std::byte* bytes, size_t size)
      : iov_{const_cast<std::byte*>(bytes), size} {
    msg_.msg_iov = &iov_;
    msg_.msg_iovlen = 1;
  }
  SocketMessage(const SocketMessage&) = delete;
  SocketMessage& operator=(const SocketMessage&) = delete;

  // Sending: `fd` (not owned; the kernel duplicates it) rides with the
  // message's first byte.
  void AttachDescriptor(int fd) {
    msg_.msg_control = control_;
    msg_.msg_controllen = CMSG_SPACE(sizeof(int));
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg_);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  }

  // Receiving: lets recvmsg deliver up to kMaxDescriptorsPerRecv
  // descriptors.
  void AcceptDescriptors() {
    msg_.msg_control = control_;
    msg_.msg_controllen = sizeof(control_);
  }

  // After recvmsg: keeps the first descriptor that arrived in *received_fd
  // (when that is non-null and -1) and closes the rest.
  void TakeDescriptors(int* received_fd) {
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg_); c; c = CMSG_NXTHDR(&msg_, c)) {
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

  msghdr* get() { return &msg_; }

 private:
  iovec iov_;
  alignas(cmsghdr) char control_[CMSG_SPACE(sizeof(int) *
                                            kMaxDescriptorsPerRecv)] = {};
  msghdr msg_{};
};

// One recvmsg into `bytes` with close-on-exec descriptors, retried on EINTR;
// the descriptors that came with the bytes go to TakeDescriptors. Returns
// recvmsg's result: bytes read, 0 at end of stream, or -1 with errno set.
ssize_t RecvWithDescriptors(int socket_fd, std::span<std::byte> bytes,
                            int flags, int* received_fd) {
  while (true) {
    SocketMessage msg(bytes.data(), bytes.size());
    msg.AcceptDescriptors();
    const ssize_t n = ::recvmsg(socket_fd, msg.get(), MSG_CMSG_CLOEXEC | flags);
    if (n < 0 && errno == EINTR) continue;
    if (n >= 0) msg.TakeDescriptors(received_fd);
    return n;
  }
}

}  // namespace

Status SendAllWithFd(int socket_fd, std::span<const std::byte> bytes,
                     int fd_to_send) {
  size_t sent = 0;
  bool fd_pending = fd_to_send >= 0;
  while (sent < bytes.size()) {
    SocketMessage msg(bytes.data() + sent, bytes.size() - sent);
    if (fd_pending) msg.AttachDescriptor(fd_to_send);
    ssize_t n = ::sendmsg(socket_fd, msg.get(), MSG_NOSIGNAL);
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

Result<size_t> RecvSomeWithFd(int socket_fd, std::span<std::byte> bytes,
                              int* received_fd) {
  const ssize_t n =
      RecvWithDescriptors(socket_fd, bytes, MSG_DONTWAIT, received_fd);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    return Errno("recvmsg");
  }
  if (n == 0) return Status::Unavailable("connection closed by peer");
  return static_cast<size_t>(n);
}

Status RecvAllWithFd(int socket_fd, std::span<std::byte> bytes,
                     int* received_fd) {
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = RecvWithDescriptors(socket_fd, bytes.subspan(got),
                                          /*flags=*/0, received_fd);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return Status::IOError("timed out waiting for the daemon");
      }
      return Errno("recvmsg");
    }
    if (n == 0) return Status::Unavailable("connection closed by peer");
    got += static_cast<size_t>(n);
  }
  return Status::OK();
}

}  // namespace tierkv::transport
