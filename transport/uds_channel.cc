// UdsChannel: multiplexed request/reply framing over a Unix socket (see
// uds_channel.h).
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
  const uint16_t expect = opcode | kResponseBit;
  MutexLock lock(&mu_);
  while (true) {
    if (auto it = arrived_.find(request_id); it != arrived_.end()) {
      Arrived got = std::move(it->second);
      arrived_.erase(it);
      if (got.opcode != kErrorOpcode && got.opcode != expect) {
        if (got.reply.ok() && got.reply->fd >= 0) ::close(got.reply->fd);
        broken_ = Status::ProtocolError("reply does not match the request");
        arrived_cv_.SignalAll();
        return broken_;
      }
      return std::move(got.reply);
    }
    if (!broken_.ok()) return broken_;
    if (reading_) {
      arrived_cv_.Wait(&mu_);
      continue;
    }
    // Lead: read one frame without the lock, file it, wake the others.
    reading_ = true;
    lock.Unlock();
    if (spin) SpinUntilReadable();
    Result<Arrived> frame = ReadFrame();
    lock.Lock();
    reading_ = false;
    if (!frame.ok()) {
      broken_ = frame.status();
    } else if (frame->request_id == 0 ||
               frame->request_id >=
                   next_request_id_.load(std::memory_order_relaxed) ||
               arrived_.contains(frame->request_id)) {
      // Id 0: the daemon could not parse our stream and hung up.
      Status why =
          frame->reply.ok()
              ? Status::ProtocolError("reply for a request that was never sent")
              : frame->reply.status();
      if (frame->reply.ok() && frame->reply->fd >= 0) {
        ::close(frame->reply->fd);
      }
      broken_ = why;
    } else {
      const uint64_t id = frame->request_id;
      arrived_.emplace(id, std::move(frame).value());
    }
    arrived_cv_.SignalAll();
  }
}

Result<uint64_t> UdsChannel::Send(uint16_t opcode,
                                  std::span<const std::byte> payload,
                                  int fd_to_send) {
  {
    MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
  }
  MutexLock send_lock(&send_mu_);
  const uint64_t id = next_request_id_.fetch_add(1, std::memory_order_relaxed);
  HeaderBytes header = EncodeFrameHeader(opcode, id, payload);
  Status s;
  if (fd_to_send >= 0) {
    // The descriptor rides on the payload's first byte, sent apart from the
    // header (see OpcodeCarriesDescriptor).
    if (payload.empty()) {
      return Status::InvalidArgument("a descriptor needs a payload to ride");
    }
    s = SendAll(header, {});
    if (s.ok()) s = SendAllWithFd(fd_, payload, fd_to_send);
  } else {
    s = SendAll(header, payload);
  }
  if (!s.ok()) {
    MutexLock lock(&mu_);
    broken_ = Status::IOError("send to tierkvd: " + std::string(s.message()));
    // The daemon may have said why before it hung up (e.g. a refused
    // connection's ResourceExhausted): that beats "Broken pipe". Only read
    // when nobody else does and the socket is readable, so this never
    // blocks: after a hang-up it holds the frame or EOF.
    pollfd p{fd_, POLLIN, 0};
    if (!reading_ && ::poll(&p, 1, 0) == 1) {
      Result<Arrived> frame = ReadFrame();
      if (frame.ok() && frame->opcode == kErrorOpcode && !frame->reply.ok()) {
        broken_ = frame->reply.status();
      }
    }
    arrived_cv_.SignalAll();
    return broken_;
  }
  return id;
}

Status UdsChannel::SendAll(std::span<const std::byte> header,
                           std::span<const std::byte> payload) {
  iovec iov[2] = {{const_cast<std::byte*>(header.data()), header.size()},
                  {const_cast<std::byte*>(payload.data()), payload.size()}};
  const size_t total = header.size() + payload.size();
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
      return Status::IOError(std::strerror(errno));
    }
    sent += static_cast<size_t>(n);
  }
  return Status::OK();
}

Result<UdsChannel::Arrived> UdsChannel::ReadFrame() {
  HeaderBytes header{};
  Arrived out;
  ChannelReply reply;
  Status s = RecvAllWithFd(fd_, header, &reply.fd);
  auto fail = [&](Status why) -> Result<Arrived> {
    if (reply.fd >= 0) ::close(reply.fd);
    return why;
  };
  if (!s.ok()) return fail(s);
  auto h = DecodeFrameHeader(header, max_payload_);
  if (!h.ok()) return fail(h.status());
  reply.payload.resize(h->payload_len);
  s = RecvAllWithFd(fd_, reply.payload, &reply.fd);
  if (!s.ok()) return fail(s);
  if (s = VerifyFrameChecksum(header, reply.payload); !s.ok()) return fail(s);
  out.opcode = h->opcode;
  out.request_id = h->request_id;
  if (h->opcode == kErrorOpcode) {
    if (reply.fd >= 0) ::close(reply.fd);
    Status err = DecodeError(reply.payload);
    out.reply = err.ok() ? Status::ProtocolError("empty error frame") : err;
  } else {
    out.reply = std::move(reply);
  }
  return out;
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
  Result<Arrived> frame = ReadFrame();
  if (!frame.ok()) return frame.status();
  if (opcode) *opcode = frame->opcode;
  return std::move(frame->reply);
}

}  // namespace tierkv::transport
