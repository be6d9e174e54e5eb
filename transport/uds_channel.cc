#include "transport/uds_channel.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "transport/fd_passing.h"
#include "transport/protocol.h"

namespace tierkv::transport {

Result<std::unique_ptr<UdsChannel>> UdsChannel::Connect(
    const std::string& path, std::chrono::milliseconds timeout,
    uint64_t max_payload_bytes) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument("socket path is empty or too long");
  }
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return Status::IOError(std::string("socket: ") + std::strerror(errno));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::string why = std::strerror(errno);
    ::close(fd);
    return Status::Unavailable("cannot connect to tierkvd at " + path + ": " +
                               why + " (is tierkvd running?)");
  }
  timeval tv{};
  tv.tv_sec = timeout.count() / 1000;
  tv.tv_usec = (timeout.count() % 1000) * 1000;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return std::unique_ptr<UdsChannel>(new UdsChannel(fd, max_payload_bytes));
}

UdsChannel::~UdsChannel() { ::close(fd_); }

Result<ChannelReply> UdsChannel::Call(uint16_t opcode,
                                      std::span<const std::byte> payload) {
  auto id = Send(opcode, payload);
  if (!id.ok()) return id.status();
  return Receive(*id, opcode);
}

Result<ChannelReply> UdsChannel::Receive(uint64_t request_id, uint16_t opcode,
                                         bool spin) {
  if (!broken_.ok()) return broken_;
  return ReadReply(request_id, opcode | kResponseBit, nullptr, spin);
}

Result<uint64_t> UdsChannel::Send(uint16_t opcode,
                                  std::span<const std::byte> payload) {
  if (!broken_.ok()) return broken_;
  const uint64_t id = next_request_id_++;
  HeaderBytes header = EncodeFrameHeader(opcode, id, payload);
  iovec iov[2] = {{header.data(), header.size()},
                  {const_cast<std::byte*>(payload.data()), payload.size()}};
  size_t total = header.size() + payload.size();
  size_t sent = 0;
  // writev loop: header and payload without an extra copy.
  while (sent < total) {
    msghdr msg{};
    iovec rest[2];
    int n_iov = 0;
    size_t skip = sent;
    for (auto& v : iov) {
      if (skip >= v.iov_len) {
        skip -= v.iov_len;
        continue;
      }
      rest[n_iov++] = {static_cast<char*>(v.iov_base) + skip, v.iov_len - skip};
      skip = 0;
    }
    msg.msg_iov = rest;
    msg.msg_iovlen = n_iov;
    ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      broken_ = Status::IOError(std::string("send to tierkvd: ") +
                                std::strerror(errno));
      return broken_;
    }
    sent += static_cast<size_t>(n);
  }
  return id;
}

Result<ChannelReply> UdsChannel::ReadReply(uint64_t request_id,
                                           uint16_t expect_opcode,
                                           uint16_t* opcode_out, bool spin) {
  HeaderBytes header{};
  ChannelReply reply;
  if (spin) SpinUntilReadable();
  Status s = RecvAllWithFd(fd_, header, &reply.fd);
  auto fail = [&](Status why) -> Result<ChannelReply> {
    if (reply.fd >= 0) ::close(reply.fd);
    broken_ = why;
    return why;
  };
  if (!s.ok()) return fail(s);
  auto h = DecodeFrameHeader(header, max_payload_);
  if (!h.ok()) return fail(h.status());
  reply.payload.resize(h->payload_len);
  s = RecvAllWithFd(fd_, reply.payload, &reply.fd);
  if (!s.ok()) return fail(s);
  if (s = VerifyFrameChecksum(header, reply.payload); !s.ok()) return fail(s);
  if (opcode_out) *opcode_out = h->opcode;
  if (h->opcode == kErrorOpcode) {
    if (reply.fd >= 0) ::close(reply.fd);
    Status err = DecodeError(reply.payload);
    return err.ok() ? Status::ProtocolError("empty error frame") : err;
  }
  if (expect_opcode != 0 &&
      (h->opcode != expect_opcode || h->request_id != request_id)) {
    return fail(Status::ProtocolError("reply does not match the request"));
  }
  return reply;
}

void UdsChannel::SpinUntilReadable() const {
  // Replies to small requests usually arrive within tens of microseconds;
  // polling briefly avoids a sleep/wake-up cycle that costs as much again
  // (the daemon's answer lands while this thread would still be asleep).
  const auto deadline = std::chrono::steady_clock::now() + kSpinBeforeBlocking;
  pollfd p{fd_, POLLIN, 0};
  while (::poll(&p, 1, 0) == 0 && std::chrono::steady_clock::now() < deadline) {
  }
}

Status UdsChannel::TEST_SendRaw(std::span<const std::byte> bytes) {
  return SendAllWithFd(fd_, bytes, -1);
}

Result<ChannelReply> UdsChannel::TEST_ReadReply(uint16_t* opcode) {
  return ReadReply(0, 0, opcode);
}

}  // namespace tierkv::transport
