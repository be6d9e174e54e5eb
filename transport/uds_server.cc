// UdsServer: Asio accept loop and per-connection frame state machine (see
// uds_server.h).
#include "transport/uds_server.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <cstring>
#include <deque>
#include <filesystem>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>

#include "common/mutex.h"
#include "common/private_dirs.h"
#include "transport/fd_passing.h"
#include "transport/frame.h"
#include "transport/in_flight_budget.h"
#include "transport/protocol.h"

namespace tierkv::transport {

namespace asio = boost::asio;
using LocalSocket = asio::local::stream_protocol::socket;

namespace {

// Payload buffers above this are released after use, so one large request
// does not pin memory for the life of the connection.
constexpr size_t kKeepPayloadCapacity = size_t{1} << 20;
// A payload buffer starts at one page, then doubles with what arrived: a
// connection that announced a payload and sent none of it holds 4 KiB.
constexpr size_t kPayloadGrowStep = 4096;

using Clock = std::chrono::steady_clock;

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

// Until when this IO thread polls at least, set by replies that expect a
// follow-up (HandlerReply::expect_followup). Each connection's handlers
// and replies run on its own IO thread, the one that reads this.
thread_local Clock::time_point t_poll_until{};

// Runs `io` until it is stopped, polling for `poll` after each burst of
// work, or until t_poll_until if later, before blocking again (see
// UdsServerOptions::poll_after_work and poll_for_followup).
void RunPolling(asio::io_context& io, std::chrono::microseconds poll,
                std::chrono::microseconds followup) {
  if (poll.count() == 0 && followup.count() == 0) {
    io.run();
    return;
  }
  auto poll_until = [poll] {
    return std::max(Clock::now() + poll, t_poll_until);
  };
  while (io.run_one() > 0) {  // 0: stopped
    auto until = poll_until();
    while (!io.stopped() && Clock::now() < until) {
      if (io.poll() > 0) until = poll_until();
    }
  }
}

}  // namespace

class Connection;

class UdsServer::Impl {
 public:
  // One io_context per IO thread, each run by that thread alone: a
  // connection lives on one of them, so its reads, handler calls and
  // writes never hand off between threads (on a 2-core VM each hand-off
  // cost ~10 us of a ~20 us round trip). Connections are spread round-robin.
  Impl(const UdsServerOptions& o, FrameHandler* handler)
      : options(o),
        handler(handler),
        budget(o.max_in_flight_bytes),
        ios(MakeContexts(o.io_threads)),
        acceptor(*ios[0]) {}

  static std::vector<std::unique_ptr<asio::io_context>> MakeContexts(
      uint32_t n) {
    std::vector<std::unique_ptr<asio::io_context>> out;
    for (uint32_t i = 0; i < n; ++i) {
      out.push_back(std::make_unique<asio::io_context>(/*concurrency_hint=*/1));
    }
    return out;
  }

  Status Listen();
  void Accept();
  void Forget(uint64_t id) {
    MutexLock lock(&mu);
    auto it = connections.find(id);
    if (it == connections.end()) return;
    if (it->second.admitted) admitted--;
    connections.erase(it);
    unadmitted.erase(id);
  }
  // The connection authenticated (HandlerReply::admit). One already closed
  // for its handshake (no longer in `unadmitted`) stays unadmitted.
  void Admit(uint64_t id) {
    MutexLock lock(&mu);
    if (unadmitted.erase(id) == 0) return;
    connections[id].admitted = true;
    admitted++;
  }
  // Tells a connection refused for max_connections why, then it is closed.
  void RefuseFull(LocalSocket& socket);
  // Closes unadmitted connections past the handshake timeout and asks
  // admitted ones to close if idle past idle_timeout, and every one to
  // close if stalled past stall_timeout; re-arms itself.
  void Sweep();
  void Stop();

  const UdsServerOptions options;
  FrameHandler* const handler;  // borrowed
  // Before `ios`: connections, destroyed with their contexts, outlive no
  // budget.
  InFlightBudget budget;
  const std::vector<std::unique_ptr<asio::io_context>> ios;
  asio::local::stream_protocol::acceptor acceptor;  // on ios[0]
  size_t next_context = 0;                          // accept loop only
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>>
      keep_running;
  std::vector<std::thread> threads;
  mutable Mutex mu;
  struct Entry {
    std::weak_ptr<Connection> conn;
    Clock::time_point accepted;
    bool admitted = false;
  };
  std::unordered_map<uint64_t, Entry> connections GUARDED_BY(mu);
  // Ids of connections not admitted yet; ids grow with accept order, so
  // begin() is the oldest.
  std::set<uint64_t> unadmitted GUARDED_BY(mu);
  // connections.size() - unadmitted.size() at most
  size_t admitted GUARDED_BY(mu) = 0;
  uint64_t next_id GUARDED_BY(mu) = 1;
  bool stopped GUARDED_BY(mu) = false;
  std::optional<asio::steady_timer> sweep_timer;  // on ios[0]
  // The socket file this server created (device, inode), so that Stop
  // removes it only if it is still ours: after a restart on the same path
  // it is the new daemon's.
  dev_t socket_dev = 0;
  ino_t socket_ino = 0;
};

Responder& Responder::operator=(Responder&& other) noexcept {
  if (this != &other) {
    if (target_)
      Send(HandlerReply{
          EncodeError(Status::Internal("request dropped without a reply")), -1,
          /*is_error=*/true});
    target_ = std::move(other.target_);
    opcode_ = other.opcode_;
    request_id_ = other.request_id_;
    observer_ = std::exchange(other.observer_, nullptr);
    received_ = other.received_;
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
  if (!target) return;
  if (observer_ != nullptr) {
    observer_->OnReply(opcode_, reply.is_error, received_);
  }
  target->Deliver(opcode_, request_id_, std::move(reply));
}

// One client connection: reads frames and hands them to the handler while
// earlier replies are pending, and writes replies as they complete. Owned
// by the shared_ptrs held in pending Asio handlers and Responders. Every
// handler of a connection runs on its strand, so its state needs no lock
// even when a worker thread delivers a reply.
class Connection : public std::enable_shared_from_this<Connection>,
                   public Responder::Target {
 public:
  Connection(UdsServer::Impl& server, LocalSocket socket, uint64_t id)
      : server_(server), socket_(std::move(socket)), id_(id) {}
  ~Connection() override {
    if (frame_fd_ >= 0) ::close(frame_fd_);
  }

  LocalSocket::executor_type executor() { return socket_.get_executor(); }

  // Server-initiated close (cap, timeouts); on the connection's strand.
  void CloseNow() { Close(); }
  // Closes the connection when it has nothing in flight and nothing
  // arrived for `idle`; on the connection's strand.
  void CloseIfIdle(std::chrono::milliseconds idle) {
    if (in_flight_ == 0 && !writing_ && Clock::now() - last_activity_ >= idle) {
      Close();
    }
  }
  // Closes the connection when it holds in-flight bytes (a charged
  // payload being received, replies unsent) and moved none for `stall`;
  // on the connection's strand.
  void CloseIfStalled(std::chrono::milliseconds stall) {
    if ((payload_charge_ > 0 || !out_.empty()) &&
        Clock::now() - last_progress_ >= stall) {
      Close();
    }
  }

  void Start() {
    server_.handler->OnConnect(id_);
    boost::system::error_code ignored;
    socket_.native_non_blocking(true, ignored);  // for RecvSomeWithFd
    ReadHeader();
  }

  // Responder::Target. A reply given during OnFrame on this thread is sent
  // when OnFrame returns (no extra hop); one from another thread is posted
  // to the connection's strand.
  void Deliver(uint16_t opcode, uint64_t request_id,
               HandlerReply reply) override {
    if (dispatch_thread_.load(std::memory_order_relaxed) ==
        std::this_thread::get_id()) {
      inline_replies_.push_back({opcode, request_id, std::move(reply)});
      return;
    }
    asio::post(socket_.get_executor(),
               [self = shared_from_this(), opcode, request_id,
                r = std::move(reply)]() mutable {
                 self->Complete(opcode, request_id, std::move(r));
               });
  }

 private:
  struct PendingReply {
    uint16_t opcode;
    uint64_t request_id;
    HandlerReply reply;
  };
  struct OutFrame {
    HeaderBytes header;
    std::vector<std::byte> body;
    int fd = -1;  // borrowed from the handler
    bool close_after = false;
  };

  // Reads frames with non-blocking recvs straight from the socket while
  // bytes are there, dispatching each as it completes, and waits for
  // readiness only after EAGAIN. One loop instead of an async_read per
  // header and per payload: each Asio completion is a posted handler and a
  // reactor poll, which cost a third of a small request's server time
  // (measured with strace: 3 epoll_waits per Match before, 1 after). A
  // loop, not recursion, so a burst of pipelined frames cannot grow the
  // stack. `reading_` stays set while it runs, so replies completed inline
  // do not start a second reader.
  void ReadHeader() {
    // A connection waiting for budget has a header read already.
    if (closed_ || reading_ || waiting_for_budget_) return;
    reading_ = true;
    header_got_ = 0;
    ReadFrames();
  }

  void ReadFrames() {
    const int fd = socket_.native_handle();
    while (!closed_) {
      if (header_got_ < header_.size()) {
        // A descriptor riding on header bytes is closed (none should).
        auto n = RecvSomeWithFd(fd, std::span(header_).subspan(header_got_),
                                nullptr);
        if (!n.ok()) return Close();
        if (*n == 0) return WaitReadable();
        header_got_ += *n;
        last_activity_ = last_progress_ = Clock::now();
        if (header_got_ < header_.size()) continue;
        if (!OnHeader()) return;
        if (!ChargePayload()) {
          reading_ = false;
          return;  // ResumeWithBudget (or a refusal's reply) goes on
        }
      }
      if (payload_got_ < payload_len_) {
        // Grow the buffer with what arrives, not with what the header
        // claims: a header announcing 16 MiB costs nothing by itself.
        if (payload_got_ == payload_.size()) {
          payload_.resize(std::min(
              payload_len_, std::max(payload_got_ * 2, kPayloadGrowStep)));
        }
        int* fd_slot =
            OpcodeCarriesDescriptor(frame_.opcode) ? &frame_fd_ : nullptr;
        auto n =
            RecvSomeWithFd(fd,
                           std::span(payload_).subspan(
                               payload_got_, payload_.size() - payload_got_),
                           fd_slot);
        if (!n.ok()) return Close();
        if (*n == 0) return WaitReadable();
        payload_got_ += *n;
        last_activity_ = last_progress_ = Clock::now();
        if (payload_got_ < payload_len_) continue;
      }
      Dispatch();
      if (closed_ || !CanReadMore()) {
        // Complete() or OnWritten() resumes reading.
        reading_ = false;
        return MaybeFinishClose();
      }
      header_got_ = 0;
    }
    reading_ = false;
  }

  void WaitReadable() {
    socket_.async_wait(
        asio::socket_base::wait_read,
        [self = shared_from_this()](const boost::system::error_code& ec) {
          if (ec || self->closed_) {
            self->reading_ = false;
            return self->Close();
          }
          self->ReadFrames();
        });
  }

  // Decodes a complete header and sizes the payload. False when the stream
  // cannot be trusted any more (answered with an error, then hung up).
  bool OnHeader() {
    auto decoded =
        DecodeFrameHeader(header_, server_.options.max_payload_bytes);
    if (!decoded.ok()) {
      reading_ = false;
      Queue({EncodeFrameHeader(kErrorOpcode, 0, EncodeError(decoded.status())),
             EncodeError(decoded.status()), -1, /*close_after=*/true});
      return false;
    }
    frame_ = *decoded;
    payload_len_ = frame_.payload_len;
    payload_.clear();  // keeps its capacity (see kKeepPayloadCapacity)
    payload_got_ = 0;
    return true;
  }

  // Charges the payload just announced to the server's in-flight budget
  // (see in_flight_budget.h) when it is larger than the allowance. False
  // when it cannot be read now: the budget has no room (this connection
  // is woken to retry when some is released) or the connection may not
  // send that much yet (refused, then closed).
  bool ChargePayload() {
    const UdsServerOptions& o = server_.options;
    if (!admitted_ && payload_len_ > o.max_unauthenticated_payload_bytes) {
      const Status refused = Status::InvalidArgument(
          "a request of " + std::to_string(payload_len_) +
          " B before the connection opened a namespace; at most " +
          std::to_string(o.max_unauthenticated_payload_bytes) +
          " B until then");
      Queue({EncodeFrameHeader(kErrorOpcode, frame_.request_id,
                               EncodeError(refused)),
             EncodeError(refused), -1, /*close_after=*/true});
      return false;
    }
    if (payload_len_ <= o.in_flight_allowance_bytes) return true;
    // The wake-up owns the connection while it waits: nothing else does
    // (no read or write is pending). Stop drops the wake-ups.
    const bool charged =
        server_.budget.ChargeOrWait(payload_len_, [self = shared_from_this()] {
          asio::post(self->executor(), [self] { self->ResumeWithBudget(); });
        });
    if (!charged) {
      waiting_for_budget_ = true;
      return false;
    }
    payload_charge_ = payload_len_;
    return true;
  }

  // Budget was released somewhere: retry the charge of the frame whose
  // header was read, and read its payload if it fits now.
  void ResumeWithBudget() {
    if (!waiting_for_budget_) return;
    waiting_for_budget_ = false;
    if (closed_) return MaybeFinishClose();
    if (!ChargePayload()) return;
    reading_ = true;  // the header is complete: ReadFrames reads the payload
    ReadFrames();
  }

  void ReleasePayloadCharge() {
    if (payload_charge_ == 0) return;
    server_.budget.Release(payload_charge_);
    payload_charge_ = 0;
  }

  // Keeps the charge for unsent replies equal to what exceeds the
  // allowance; called whenever out_bytes_ changes.
  void SyncReplyCharge() {
    const uint64_t allowance = server_.options.in_flight_allowance_bytes;
    const uint64_t want = out_bytes_ > allowance ? out_bytes_ - allowance : 0;
    if (want > reply_charge_) {
      server_.budget.Charge(want - reply_charge_);
    } else if (want < reply_charge_) {
      server_.budget.Release(reply_charge_ - want);
    }
    reply_charge_ = want;
  }

  // Hands a complete frame to the handler; replies it gives before
  // returning are sent on return.
  void Dispatch() {
    in_flight_++;
    Status bad;
    if (frame_.version != kProtocolVersion) {
      bad = Status::ProtocolError(
          "unsupported protocol version " + std::to_string(frame_.version) +
          " (this daemon speaks " + std::to_string(kProtocolVersion) + ")");
    } else if (Status s = VerifyFrameChecksum(header_, payload_); !s.ok()) {
      bad = s;
    } else if (frame_.opcode & kResponseBit) {
      bad = Status::ProtocolError("clients may not send response frames");
    }
    if (!bad.ok()) {
      Complete(frame_.opcode, frame_.request_id,
               HandlerReply{EncodeError(bad), -1, /*is_error=*/true});
    } else {
      dispatch_thread_.store(std::this_thread::get_id(),
                             std::memory_order_relaxed);
      server_.handler->OnFrame(
          id_, frame_.opcode, payload_, frame_fd_,
          Responder(shared_from_this(), frame_.opcode, frame_.request_id));
      dispatch_thread_.store(std::thread::id(), std::memory_order_relaxed);
      std::vector<PendingReply> replies;
      replies.swap(inline_replies_);
      for (auto& r : replies) {
        Complete(r.opcode, r.request_id, std::move(r.reply));
      }
    }
    if (frame_fd_ >= 0) {
      ::close(frame_fd_);
      frame_fd_ = -1;
    }
    if (payload_.capacity() > kKeepPayloadCapacity) {
      std::vector<std::byte>().swap(payload_);
    }
    ReleasePayloadCharge();
  }

  // Reads the next frame unless the in-flight bound is reached (then the
  // completion of a request resumes reading).
  void MaybeReadMore() {
    if (CanReadMore()) ReadHeader();
  }

  // Backpressure: a client that keeps sending while it does not read its
  // replies stops being read once max_queued_reply_bytes wait to be sent,
  // so it cannot make the daemon hold an unbounded reply queue; and while
  // the server's in-flight budget is spent, a connection with a charged
  // reply queue waits for its client to read it first.
  bool CanReadMore() const {
    const UdsServerOptions& o = server_.options;
    return in_flight_ < o.max_requests_in_flight &&
           out_bytes_ < o.max_queued_reply_bytes &&
           (reply_charge_ == 0 || !server_.budget.exhausted());
  }

  // A request is answered (on the strand).
  void Complete(uint16_t opcode, uint64_t request_id, HandlerReply reply) {
    in_flight_--;
    last_activity_ = Clock::now();
    if (reply.admit && !reply.is_error) {
      admitted_ = true;
      server_.Admit(id_);
    }
    if (reply.expect_followup && server_.options.poll_for_followup.count()) {
      t_poll_until = std::max(t_poll_until,
                              Clock::now() + server_.options.poll_for_followup);
    }
    if (!closed_ && !reply.no_reply) {
      const uint16_t out_opcode =
          reply.is_error ? kErrorOpcode : (opcode | kResponseBit);
      Queue({EncodeFrameHeader(out_opcode, request_id, reply.payload),
             std::move(reply.payload), reply.fd, reply.close_after});
    }
    if (closed_) return MaybeFinishClose();
    MaybeReadMore();
  }

  void Queue(OutFrame frame) {
    if (closed_) return;
    out_bytes_ += frame.header.size() + frame.body.size();
    out_.push_back(std::move(frame));
    SyncReplyCharge();
    if (!writing_) WriteNext();
  }

  void PopFront() {
    out_bytes_ -= out_.front().header.size() + out_.front().body.size();
    out_.pop_front();
    last_progress_ = Clock::now();
    SyncReplyCharge();
  }

  void ClearReplies() {
    out_.clear();
    out_bytes_ = 0;
    SyncReplyCharge();
  }

  void WriteNext() {
    while (!out_.empty() && !closed_) {
      OutFrame& f = out_.front();
      if (f.fd < 0) break;
      // Asio has no SCM_RIGHTS support: send this (small) reply directly,
      // in its turn (no other write is in progress here).
      std::vector<std::byte> frame(f.header.begin(), f.header.end());
      frame.insert(frame.end(), f.body.begin(), f.body.end());
      const Status s = SendAllWithFd(socket_.native_handle(), frame, f.fd);
      const bool close_after = f.close_after;
      PopFront();
      if (!s.ok() || close_after) return Close();
    }
    if (out_.empty() || closed_) return;
    writing_ = true;
    std::array<asio::const_buffer, 2> buffers{asio::buffer(out_.front().header),
                                              asio::buffer(out_.front().body)};
    asio::async_write(
        socket_, buffers,
        [self = shared_from_this()](auto ec, size_t) { self->OnWritten(ec); });
  }

  void OnWritten(const boost::system::error_code& ec) {
    writing_ = false;
    if (closed_) {
      ClearReplies();  // no write refers to them any more
      return MaybeFinishClose();
    }
    const bool close_after = out_.front().close_after;
    PopFront();
    if (ec || close_after) return Close();
    WriteNext();
    MaybeReadMore();  // the reply queue may have drained below its bound
  }

  // Every path that ends a connection comes here, so it returns the
  // connection's budget (the destructor does not: it may run while the
  // server tears down its contexts).
  void Close() {
    if (!closed_) {
      closed_ = true;
      boost::system::error_code ignored;
      socket_.close(ignored);
      if (!writing_) ClearReplies();  // else OnWritten clears them
      ReleasePayloadCharge();
    }
    MaybeFinishClose();
  }

  // OnDisconnect once the peer is gone and no request is pending.
  void MaybeFinishClose() {
    if (!closed_ || in_flight_ > 0 || writing_ || disconnected_) return;
    disconnected_ = true;
    server_.handler->OnDisconnect(id_);
    server_.Forget(id_);
  }

  UdsServer::Impl& server_;
  LocalSocket socket_;
  const uint64_t id_;
  // The frame being read.
  HeaderBytes header_{};
  size_t header_got_ = 0;
  size_t payload_got_ = 0;
  size_t payload_len_ = 0;  // of the frame being read; payload_ grows to it
  int frame_fd_ = -1;       // owned until OnFrame returns
  FrameHeader frame_;
  std::vector<std::byte> payload_;
  bool reading_ = false;
  bool admitted_ = false;  // HandlerReply::admit seen
  // The frame whose header was read waits for in-flight budget.
  bool waiting_for_budget_ = false;
  uint64_t payload_charge_ = 0;  // of the frame being read, to the budget
  uint64_t reply_charge_ = 0;    // of out_, to the budget
  uint32_t in_flight_ = 0;       // handed to the handler, not yet answered
  std::deque<OutFrame> out_;
  size_t out_bytes_ = 0;  // header + body bytes in out_
  bool writing_ = false;
  bool closed_ = false;
  bool disconnected_ = false;
  Clock::time_point last_activity_ = Clock::now();  // bytes in or reply out
  Clock::time_point last_progress_ = Clock::now();  // any byte in or out
  // The thread running OnFrame for this connection (none otherwise), and
  // the replies it gave before returning.
  std::atomic<std::thread::id> dispatch_thread_{};
  std::vector<PendingReply> inline_replies_;
};

Status UdsServer::Impl::Listen() {
  namespace fs = std::filesystem;
  const std::string& path = options.path;
  if (path.empty() || path.size() >= sizeof(sockaddr_un::sun_path)) {
    return Status::InvalidArgument(
        "socket path is empty or longer than 107 bytes");
  }
  // A new socket directory is 0750: the socket's group may traverse it.
  TIERKV_RETURN_IF_ERROR(
      CreatePrivateDirectories(fs::path(path).parent_path(), 0750));
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
  if (::lstat(path.c_str(), &st) == 0) {
    socket_dev = st.st_dev;
    socket_ino = st.st_ino;
  }
  return Status::OK();
}

void UdsServer::Impl::Accept() {
  // Each connection's socket gets its own strand (see Connection) on the
  // next context in turn.
  asio::io_context& io = *ios[next_context++ % ios.size()];
  acceptor.async_accept(
      asio::make_strand(io),
      [this](boost::system::error_code ec, LocalSocket socket) {
        if (ec) {
          if (ec == asio::error::operation_aborted) return;
          return Accept();  // e.g. EMFILE: keep serving existing clients
        }
        std::shared_ptr<Connection> conn, evicted;
        {
          MutexLock lock(&mu);
          if (stopped || admitted >= options.max_connections ||
              options.max_unauthenticated_connections == 0) {
            if (!stopped) RefuseFull(socket);
            boost::system::error_code ignored;
            socket.close(ignored);
          } else {
            if (unadmitted.size() >= options.max_unauthenticated_connections) {
              // Make room by closing the oldest connection still in its
              // handshake (see UdsServerOptions).
              const uint64_t oldest = *unadmitted.begin();
              unadmitted.erase(unadmitted.begin());
              evicted = connections[oldest].conn.lock();
            }
            const uint64_t id = next_id++;
            conn = std::make_shared<Connection>(*this, std::move(socket), id);
            connections.emplace(id, Entry{conn, Clock::now(), false});
            unadmitted.insert(id);
          }
        }
        if (evicted) {
          asio::post(evicted->executor(), [evicted] { evicted->CloseNow(); });
        }
        if (conn) {
          // Start on the connection's own thread, like all its handlers.
          asio::post(conn->executor(), [conn] { conn->Start(); });
        }
        Accept();
      });
}

void UdsServer::Impl::RefuseFull(LocalSocket& socket) {
  // One small error frame, sent without blocking (a full socket buffer on
  // a brand-new connection is impossible), so the client says why.
  const std::vector<std::byte> body = EncodeError(Status::ResourceExhausted(
      "tierkvd has " + std::to_string(options.max_connections) +
      " connections already (server.max_connections)"));
  const HeaderBytes header = EncodeFrameHeader(kErrorOpcode, 0, body);
  std::vector<std::byte> frame(header.begin(), header.end());
  frame.insert(frame.end(), body.begin(), body.end());
  (void)::send(socket.native_handle(), frame.data(), frame.size(),
               MSG_DONTWAIT | MSG_NOSIGNAL);
}

void UdsServer::Impl::Sweep() {
  std::vector<std::shared_ptr<Connection>> expired, admitted_conns, others;
  const auto now = Clock::now();
  {
    MutexLock lock(&mu);
    if (stopped) return;
    for (auto it = unadmitted.begin(); it != unadmitted.end();) {
      const Entry& e = connections.at(*it);
      if (now - e.accepted < options.handshake_timeout) break;  // in order
      if (auto c = e.conn.lock()) expired.push_back(std::move(c));
      it = unadmitted.erase(it);
    }
    const bool idle = options.idle_timeout.count() > 0;
    const bool stall = options.stall_timeout.count() > 0;
    if (idle || stall) {
      for (auto& [id, e] : connections) {
        if (!e.admitted && !stall) continue;
        if (auto c = e.conn.lock()) {
          (e.admitted ? admitted_conns : others).push_back(std::move(c));
        }
      }
    }
  }
  for (auto& c : expired) asio::post(c->executor(), [c] { c->CloseNow(); });
  for (auto& c : admitted_conns) {
    asio::post(c->executor(), [c, o = &options] {
      if (o->idle_timeout.count() > 0) c->CloseIfIdle(o->idle_timeout);
      if (o->stall_timeout.count() > 0) c->CloseIfStalled(o->stall_timeout);
    });
  }
  for (auto& c : others) {
    asio::post(c->executor(), [c, stall = options.stall_timeout] {
      c->CloseIfStalled(stall);
    });
  }
  // Re-check at a quarter of the shortest timeout (50 ms .. 1 s): a
  // connection is closed at most that late.
  auto period = options.handshake_timeout;
  for (auto t : {options.idle_timeout, options.stall_timeout}) {
    if (t.count() > 0) period = std::min(period, t);
  }
  period = std::clamp(period / 4, std::chrono::milliseconds(50),
                      std::chrono::milliseconds(1000));
  sweep_timer->expires_after(period);
  sweep_timer->async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Sweep();
  });
}

void UdsServer::Impl::Stop() {
  {
    MutexLock lock(&mu);
    if (stopped) return;
    stopped = true;
  }
  // Connections are not closed one by one: stopping the io_context and
  // destroying it (with Impl) destroys their pending handlers and sockets.
  asio::post(*ios[0], [this] {
    boost::system::error_code ignored;
    acceptor.close(ignored);
    if (sweep_timer) sweep_timer->cancel();
  });
  for (auto& io : ios) io->stop();
  for (auto& t : threads) t.join();
  threads.clear();
  // Connections waiting for budget are owned by their wake-ups: destroyed
  // here, while their io_contexts still exist.
  budget.DropWaiters();
  struct stat st {};
  if (::lstat(options.path.c_str(), &st) == 0 && st.st_dev == socket_dev &&
      st.st_ino == socket_ino) {
    ::unlink(options.path.c_str());
  }
}

Result<std::unique_ptr<UdsServer>> UdsServer::Start(const UdsServerOptions& o,
                                                    FrameHandler* handler) {
  if (o.io_threads == 0 || o.io_threads > 64) {
    return Status::InvalidArgument("io_threads must be in [1, 64]");
  }
  auto impl = std::make_unique<Impl>(o, handler);
  if (o.handshake_timeout.count() <= 0 || o.idle_timeout.count() < 0 ||
      o.stall_timeout.count() < 0) {
    return Status::InvalidArgument(
        "handshake_timeout must be > 0, idle_timeout and stall_timeout >= 0");
  }
  if (o.max_in_flight_bytes < o.max_payload_bytes) {
    return Status::InvalidArgument(
        "max_in_flight_bytes must be >= max_payload_bytes (one request of "
        "the largest size must fit)");
  }
  TIERKV_RETURN_IF_ERROR(impl->Listen());
  impl->Accept();
  impl->sweep_timer.emplace(*impl->ios[0]);
  asio::post(*impl->ios[0], [i = impl.get()] { i->Sweep(); });
  for (auto& io : impl->ios) {
    // Until Stop, a context without connections still keeps its thread.
    impl->keep_running.push_back(asio::make_work_guard(*io));
    impl->threads.emplace_back(
        [io = io.get(), poll = o.poll_after_work,
         followup = o.poll_for_followup] { RunPolling(*io, poll, followup); });
  }
  return std::unique_ptr<UdsServer>(new UdsServer(std::move(impl)));
}

UdsServer::UdsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

UdsServer::~UdsServer() { Stop(); }

void UdsServer::Stop() { impl_->Stop(); }

size_t UdsServer::connection_count() const {
  MutexLock lock(&impl_->mu);
  return impl_->connections.size();
}

uint64_t UdsServer::in_flight_bytes() const { return impl_->budget.charged(); }

size_t UdsServer::in_flight_waiters() const { return impl_->budget.waiters(); }

size_t UdsServer::unauthenticated_count() const {
  MutexLock lock(&impl_->mu);
  return impl_->unadmitted.size();
}

}  // namespace tierkv::transport
