// UdsServer: Asio accept loop and per-connection frame state machine (see
// uds_server.h).
#include "transport/uds_server.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
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
  bool live =
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
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

Responder& Responder::operator=(Responder&& other) noexcept {
  if (this != &other) {
    if (target_)
      Send(HandlerReply{
          EncodeError(Status::Internal("request dropped without a reply")), -1,
          /*is_error=*/true});
    target_ = std::move(other.target_);
  }
  return *this;
}

Responder::~Responder() {
  if (target_) {
    Send(HandlerReply{
        EncodeError(Status::Internal("request dropped without a reply")), -1,
        /*is_error=*/true});
  }
}

void Responder::Send(HandlerReply reply) {
  std::shared_ptr<Target> target = std::move(target_);
  if (target) target->Deliver(std::move(reply));
}

// One client connection: reads a frame, hands it to the handler, writes the
// reply, and repeats. Owned by the shared_ptrs held in pending Asio handlers
// and Responders. Every handler of a connection runs on its strand, so its
// state needs no lock even when a worker thread delivers the reply.
class Connection : public std::enable_shared_from_this<Connection>,
                   public Responder::Target {
 public:
  Connection(UdsServer::Impl& server, LocalSocket socket, uint64_t id)
      : server_(server), socket_(std::move(socket)), id_(id) {}

  void Start() {
    server_.handler->OnConnect(id_);
    ReadHeader();
  }

 private:
  void ReadHeader() {
    asio::async_read(
        socket_, asio::buffer(header_),
        [self = shared_from_this()](auto ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(const boost::system::error_code& ec) {
    if (ec) return Close();
    auto decoded =
        DecodeFrameHeader(header_, server_.options.max_payload_bytes);
    if (!decoded.ok()) {
      // The stream cannot be trusted any more: answer and hang up.
      return Reply(kErrorOpcode, 0, EncodeError(decoded.status()), -1,
                   /*close_after=*/true);
    }
    frame_ = *decoded;
    payload_.resize(frame_.payload_len);
    asio::async_read(
        socket_, asio::buffer(payload_),
        [self = shared_from_this()](auto ec, size_t) { self->OnPayload(ec); });
  }

  void OnPayload(const boost::system::error_code& ec) {
    if (ec) return Close();
    if (frame_.version != kProtocolVersion) {
      return Reply(
          kErrorOpcode, frame_.request_id,
          EncodeError(Status::ProtocolError(
              "unsupported protocol version " + std::to_string(frame_.version) +
              " (this daemon speaks " + std::to_string(kProtocolVersion) +
              ")")),
          -1, false);
    }
    if (Status s = VerifyFrameChecksum(header_, payload_); !s.ok()) {
      return Reply(kErrorOpcode, frame_.request_id, EncodeError(s), -1, false);
    }
    if (frame_.opcode & kResponseBit) {
      return Reply(kErrorOpcode, frame_.request_id,
                   EncodeError(Status::ProtocolError(
                       "clients may not send response frames")),
                   -1, false);
    }
    dispatch_thread_.store(std::this_thread::get_id(),
                           std::memory_order_relaxed);
    server_.handler->OnFrame(id_, frame_.opcode, payload_,
                             Responder(shared_from_this()));
    dispatch_thread_.store(std::thread::id(), std::memory_order_relaxed);
    if (payload_.capacity() > kKeepPayloadCapacity) {
      std::vector<std::byte>().swap(payload_);
    }
    if (inline_reply_) {
      HandlerReply reply = std::move(*inline_reply_);
      inline_reply_.reset();
      SendHandlerReply(std::move(reply));
    }
  }

  // Responder::Target. A reply given during OnFrame on this thread is sent
  // when OnFrame returns (no extra hop); one from another thread is posted
  // to the connection's strand, which runs it after OnPayload finishes.
  void Deliver(HandlerReply reply) override {
    if (dispatch_thread_.load(std::memory_order_relaxed) ==
        std::this_thread::get_id()) {
      inline_reply_ = std::move(reply);
      return;
    }
    asio::post(socket_.get_executor(),
               [self = shared_from_this(), r = std::move(reply)]() mutable {
                 self->SendHandlerReply(std::move(r));
               });
  }

  void SendHandlerReply(HandlerReply reply) {
    if (closed_) return;
    if (reply.no_reply) return ReadHeader();
    Reply(reply.is_error ? kErrorOpcode : (frame_.opcode | kResponseBit),
          frame_.request_id, std::move(reply.payload), reply.fd, false);
  }

  void Reply(uint16_t opcode, uint64_t request_id, std::vector<std::byte> body,
             int fd, bool close_after) {
    reply_header_ = EncodeFrameHeader(opcode, request_id, body);
    reply_body_ = std::move(body);
    if (fd >= 0) {
      // Asio has no SCM_RIGHTS support: send this (small) reply directly.
      std::vector<std::byte> frame(reply_header_.begin(), reply_header_.end());
      frame.insert(frame.end(), reply_body_.begin(), reply_body_.end());
      Status s = SendAllWithFd(socket_.native_handle(), frame, fd);
      return AfterWrite(!s.ok() || close_after);
    }
    std::array<asio::const_buffer, 2> buffers{asio::buffer(reply_header_),
                                              asio::buffer(reply_body_)};
    asio::async_write(
        socket_, buffers,
        [self = shared_from_this(), close_after](auto ec, size_t) {
          self->AfterWrite(ec || close_after);
        });
  }

  void AfterWrite(bool close) {
    if (close) return Close();
    ReadHeader();
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
  HeaderBytes header_{};
  FrameHeader frame_;
  std::vector<std::byte> payload_;
  HeaderBytes reply_header_{};
  std::vector<std::byte> reply_body_;
  bool closed_ = false;
  // The thread running OnFrame for this connection (none otherwise), and
  // the reply it gave before returning.
  std::atomic<std::thread::id> dispatch_thread_{};
  std::optional<HandlerReply> inline_reply_;
};

Status UdsServer::Impl::Listen() {
  namespace fs = std::filesystem;
  const std::string& path = options.path;
  if (path.empty() || path.size() >= sizeof(sockaddr_un::sun_path)) {
    return Status::InvalidArgument(
        "socket path is empty or longer than 107 bytes");
  }
  std::error_code fs_ec;
  fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent, fs_ec);
  struct stat st {};
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
    if (!g)
      return Status::InvalidArgument("unknown socket group " + options.group);
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
  // Each connection's socket gets its own strand (see Connection).
  acceptor.async_accept(
      asio::make_strand(io),
      [this](boost::system::error_code ec, LocalSocket socket) {
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
