#include "transport/uds_server.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "transport/fd_passing.h"
#include "transport/frame.h"
#include "transport/protocol.h"

namespace tierkv::transport {

namespace asio = boost::asio;
using LocalSocket = asio::local::stream_protocol::socket;

namespace {

// Payload buffers above this are released after use, so one large request
// does not pin memory for the life of the connection.
constexpr size_t kKeepPayloadCapacity = size_t{1} << 20;

// True when something is accepting connections on `path`.
bool SocketIsLive(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  bool live = ::connect(fd, reinterpret_cast<sockaddr*>(&addr),
                        sizeof(addr)) == 0;
  ::close(fd);
  return live;
}

}  // namespace

class Connection;

class UdsServer::Impl {
 public:
  Impl(const UdsServerOptions& o, FrameHandler* handler)
      : options(o), handler(handler), acceptor(io) {}

  Status Listen();
  void Accept();
  void Forget(uint64_t id) {
    std::lock_guard lock(mu);
    connections.erase(id);
  }
  void Stop();

  const UdsServerOptions options;
  FrameHandler* const handler;  // borrowed
  asio::io_context io;
  asio::local::stream_protocol::acceptor acceptor;
  std::vector<std::thread> threads;
  std::mutex mu;
  std::unordered_map<uint64_t, std::weak_ptr<Connection>> connections;
  uint64_t next_id = 1;
  bool stopped = false;
};

// One client connection. Bytes are read into a buffer as they come; every
// complete frame in it is handled in order and its reply written straight
// away with a non-blocking write (falling back to an asynchronous write only
// when the socket is full). A small request thus costs one wake-up of an io
// thread, and a client may pipeline requests. Owned by the shared_ptrs held
// in pending Asio handlers.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(UdsServer::Impl& server, LocalSocket socket, uint64_t id)
      : server_(server), socket_(std::move(socket)), id_(id) {}

  void Start() {
    boost::system::error_code ec;
    socket_.non_blocking(true, ec);
    server_.handler->OnConnect(id_);
    if (ec) return Close();
    ReadMore();
  }

 private:
  static constexpr size_t kReadChunk = 64 * 1024;

  void ReadMore() {
    // Compact, then make room for at least kReadChunk more bytes.
    if (begin_ > 0) {
      std::memmove(in_.data(), in_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    if (end_ == 0 && in_.size() > kKeepPayloadCapacity) {
      std::vector<std::byte>(kReadChunk).swap(in_);  // one big frame is over
    }
    if (in_.size() < end_ + kReadChunk) in_.resize(end_ + kReadChunk);
    socket_.async_read_some(
        asio::buffer(in_.data() + end_, in_.size() - end_),
        [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
          if (ec) return self->Close();
          self->end_ += n;
          self->HandleBuffered();
        });
  }

  // Handles every complete frame in the buffer, then reads more. Returns
  // early while an asynchronous write is pending; its completion resumes.
  void HandleBuffered() {
    while (!closed_) {
      const size_t have = end_ - begin_;
      if (have < kFrameHeaderBytes) break;
      std::span<const std::byte> header(in_.data() + begin_, kFrameHeaderBytes);
      auto decoded = DecodeFrameHeader(header, server_.options.max_payload_bytes);
      if (!decoded.ok()) {
        // The stream cannot be trusted any more: answer and hang up.
        Reply(kErrorOpcode, 0, EncodeError(decoded.status()), -1, /*close_after=*/true);
        return;
      }
      const size_t frame_bytes = kFrameHeaderBytes + decoded->payload_len;
      if (have < frame_bytes) {
        // Bounded by max_payload_bytes (checked above).
        if (in_.size() < begin_ + frame_bytes) in_.resize(begin_ + frame_bytes);
        break;
      }
      std::span<const std::byte> payload(in_.data() + begin_ + kFrameHeaderBytes,
                                         decoded->payload_len);
      const bool async_write = HandleFrame(*decoded, header, payload);
      begin_ += frame_bytes;
      if (async_write) return;  // resumes in the write's completion
    }
    if (!closed_) ReadMore();
  }

  // Handles one frame; true when its reply is still being written.
  bool HandleFrame(const FrameHeader& frame, std::span<const std::byte> header,
                   std::span<const std::byte> payload) {
    if (frame.version != kProtocolVersion) {
      return Reply(kErrorOpcode, frame.request_id,
                   EncodeError(Status::ProtocolError(
                       "unsupported protocol version " + std::to_string(frame.version) +
                       " (this daemon speaks " + std::to_string(kProtocolVersion) + ")")),
                   -1, false);
    }
    if (Status s = VerifyFrameChecksum(header, payload); !s.ok()) {
      return Reply(kErrorOpcode, frame.request_id, EncodeError(s), -1, false);
    }
    if (frame.opcode & kResponseBit) {
      return Reply(kErrorOpcode, frame.request_id,
                   EncodeError(Status::ProtocolError("clients may not send response frames")),
                   -1, false);
    }
    HandlerReply reply = server_.handler->OnFrame(id_, frame.opcode, payload);
    if (reply.no_reply) return false;
    return Reply(reply.is_error ? kErrorOpcode : (frame.opcode | kResponseBit),
                 frame.request_id, std::move(reply.payload), reply.fd, false);
  }

  // Writes a reply; true when part of it is left to an asynchronous write.
  bool Reply(uint16_t opcode, uint64_t request_id, std::vector<std::byte> body, int fd,
             bool close_after) {
    reply_header_ = EncodeFrameHeader(opcode, request_id, body);
    reply_body_ = std::move(body);
    if (fd >= 0) {
      // Asio has no SCM_RIGHTS support: send this (small) reply directly.
      std::vector<std::byte> frame(reply_header_.begin(), reply_header_.end());
      frame.insert(frame.end(), reply_body_.begin(), reply_body_.end());
      Status s = SendAllWithFd(socket_.native_handle(), frame, fd);
      if (!s.ok() || close_after) Close();
      return false;
    }
    std::array<asio::const_buffer, 2> buffers{asio::buffer(reply_header_),
                                              asio::buffer(reply_body_)};
    boost::system::error_code ec;
    const size_t total = reply_header_.size() + reply_body_.size();
    size_t written = socket_.write_some(buffers, ec);
    if (ec && ec != asio::error::would_block) {
      Close();
      return false;
    }
    if (written == total) {
      if (close_after) Close();
      return false;
    }
    // The socket is full: finish asynchronously, then resume reading.
    const size_t header_left =
        written < reply_header_.size() ? reply_header_.size() - written : 0;
    const size_t body_done = written - (reply_header_.size() - header_left);
    std::array<asio::const_buffer, 2> rest{
        asio::buffer(reply_header_.data() + (reply_header_.size() - header_left), header_left),
        asio::buffer(reply_body_.data() + body_done, reply_body_.size() - body_done)};
    asio::async_write(socket_, rest,
                      [self = shared_from_this(), close_after](auto ec, size_t) {
                        if (ec || close_after) return self->Close();
                        self->HandleBuffered();
                      });
    return true;
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ignored;
    socket_.close(ignored);
    server_.handler->OnDisconnect(id_);
    server_.Forget(id_);
  }

  UdsServer::Impl& server_;
  LocalSocket socket_;
  const uint64_t id_;
  std::vector<std::byte> in_;  // received bytes: [begin_, end_) unhandled
  size_t begin_ = 0;
  size_t end_ = 0;
  HeaderBytes reply_header_{};
  std::vector<std::byte> reply_body_;
  bool closed_ = false;
};

Status UdsServer::Impl::Listen() {
  namespace fs = std::filesystem;
  const std::string& path = options.path;
  if (path.empty() || path.size() >= sizeof(sockaddr_un::sun_path)) {
    return Status::InvalidArgument("socket path is empty or longer than 107 bytes");
  }
  std::error_code fs_ec;
  fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent, fs_ec);
  struct stat st{};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Status::InvalidArgument(path + " exists and is not a socket");
    }
    if (SocketIsLive(path)) {
      return Status::Busy("another daemon is already listening on " + path);
    }
    ::unlink(path.c_str());  // stale socket from a crashed daemon
  }
  boost::system::error_code ec;
  asio::local::stream_protocol::endpoint endpoint(path);
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Status::IOError("listen on " + path + ": " + ec.message());
  if (!options.group.empty()) {
    struct group* g = ::getgrnam(options.group.c_str());
    if (!g) return Status::InvalidArgument("unknown socket group " + options.group);
    if (::chown(path.c_str(), static_cast<uid_t>(-1), g->gr_gid) != 0) {
      return Status::IOError("chown " + path + ": " + std::strerror(errno));
    }
  }
  if (::chmod(path.c_str(), options.mode) != 0) {
    return Status::IOError("chmod " + path + ": " + std::strerror(errno));
  }
  return Status::OK();
}

void UdsServer::Impl::Accept() {
  acceptor.async_accept([this](boost::system::error_code ec,
                               LocalSocket socket) {
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      return Accept();  // e.g. EMFILE: keep serving existing clients
    }
    std::shared_ptr<Connection> conn;
    {
      std::lock_guard lock(mu);
      if (stopped || connections.size() >= options.max_connections) {
        boost::system::error_code ignored;
        socket.close(ignored);
      } else {
        const uint64_t id = next_id++;
        conn = std::make_shared<Connection>(*this, std::move(socket), id);
        connections.emplace(id, conn);
      }
    }
    if (conn) conn->Start();
    Accept();
  });
}

void UdsServer::Impl::Stop() {
  {
    std::lock_guard lock(mu);
    if (stopped) return;
    stopped = true;
  }
  // Connections are not closed one by one: stopping the io_context and
  // destroying it (with Impl) destroys their pending handlers and sockets.
  asio::post(io, [this] {
    boost::system::error_code ignored;
    acceptor.close(ignored);
  });
  io.stop();
  for (auto& t : threads) t.join();
  threads.clear();
  ::unlink(options.path.c_str());
}

Result<std::unique_ptr<UdsServer>> UdsServer::Start(const UdsServerOptions& o,
                                                    FrameHandler* handler) {
  if (o.io_threads == 0 || o.io_threads > 64) {
    return Status::InvalidArgument("io_threads must be in [1, 64]");
  }
  auto impl = std::make_unique<Impl>(o, handler);
  TIERKV_RETURN_IF_ERROR(impl->Listen());
  impl->Accept();
  for (uint32_t i = 0; i < o.io_threads; ++i) {
    impl->threads.emplace_back([io = &impl->io] { io->run(); });
  }
  return std::unique_ptr<UdsServer>(new UdsServer(std::move(impl)));
}

UdsServer::UdsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

UdsServer::~UdsServer() { Stop(); }

void UdsServer::Stop() { impl_->Stop(); }

size_t UdsServer::connection_count() const {
  std::lock_guard lock(impl_->mu);
  return impl_->connections.size();
}

}  // namespace tierkv::transport
