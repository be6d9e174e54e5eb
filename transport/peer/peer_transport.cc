#include "transport/peer/peer_transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "common/mutex.h"
#include "common/sync_point.h"
#include "transport/frame.h"
#include "transport/peer/peer_handshake.h"
#include "transport/peer/peer_message.h"
#include "transport/protocol.h"

namespace tierkv::transport::peer {

using Clock = std::chrono::steady_clock;

namespace {

// Handshake messages are a few hundred bytes; this bounds what a peer may
// make us decode before it has authenticated.
constexpr uint64_t kMaxHandshakeBytes = 1024;
// How long shutdown waits for UCX to finish closing endpoints and
// cancelled requests before destroying the worker anyway.
constexpr auto kShutdownDrainLimit = std::chrono::seconds(2);
// ucp_worker_progress calls per turn of the progress loop.
constexpr int kMaxProgressPerTurn = 64;
// The progress loop's poll period while UCX finishes deferred work.
constexpr int64_t kTeardownPollMs = 5;
// A connection on which this many call deadlines in a row passed without a
// single message from the peer is force-closed: the peer is hung (e.g.
// SIGSTOPped), and neither UCX's keepalive nor TCP notices a peer whose
// kernel still acks. Closing lets the back-off fail later calls at once.
constexpr uint32_t kSilentDeadlinesBeforeClose = 2;

std::string UcsError(ucs_status_t st) { return ucs_status_string(st); }

// "a.b.c.d:port" or "[v6]:port", numeric only: resolving names would block
// the progress thread (the directory publishes listen_address()).
Result<std::pair<sockaddr_storage, socklen_t>> ParseSockaddr(
    std::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon + 1 == address.size()) {
    return Status::InvalidArgument("peer address \"" + std::string(address) +
                                   "\" is not host:port");
  }
  std::string host(address.substr(0, colon));
  const std::string port(address.substr(colon + 1));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Status::InvalidArgument("peer address \"" + std::string(address) +
                                   "\": " + ::gai_strerror(rc) +
                                   " (numeric IP and port expected)");
  }
  std::pair<sockaddr_storage, socklen_t> out{};
  std::memcpy(&out.first, res->ai_addr, res->ai_addrlen);
  out.second = res->ai_addrlen;
  ::freeaddrinfo(res);
  return out;
}

std::string FormatSockaddr(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
  ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
  return "[" + std::string(host) + "]:" + std::to_string(ntohs(in6->sin6_port));
}

Status DeadlineExceeded() {
  // No kDeadlineExceeded in the closed StatusCode set: Busy ("transiently
  // unavailable; retry later") is what a caller should do about a peer
  // that did not answer in time.
  return Status::Busy("peer call deadline exceeded");
}

struct AtomicCounters {
  // Relaxed: statistics, read as a snapshot that publishes nothing else.
  std::atomic<uint64_t> requests_sent{0}, requests_served{0},
      replies_received{0}, bytes_sent{0}, bytes_received{0},
      reply_data_bytes_served{0}, errors_timeout{0}, errors_reset{0},
      errors_auth{0}, errors_malformed{0}, abandoned_receives{0},
      connections_opened{0}, live_connections{0}, replies_gathered{0};
};

void Add(std::atomic<uint64_t>& c, uint64_t n = 1) {
  c.fetch_add(n, std::memory_order_relaxed);
}

// Joins pieces that continue one another in memory (a page's layer windows
// read into one buffer): UCX then sees fewer pieces, often one. `Span` is a
// std::span of const or mutable bytes.
template <typename Span>
std::vector<Span> Coalesce(std::vector<Span> pieces) {
  std::vector<Span> out;
  out.reserve(pieces.size());
  for (const Span& p : pieces) {
    if (p.empty()) continue;
    if (!out.empty() && out.back().data() + out.back().size() == p.data()) {
      out.back() = Span(out.back().data(), out.back().size() + p.size());
    } else {
      out.push_back(p);
    }
  }
  return out;
}

// The bytes of multi-piece replies gathered into one buffer, against
// PeerTransportOptions::reply_gather_budget_bytes. Shared with each
// gathered buffer, which a queued command may hold past the Core.
class GatherBudget {
 public:
  explicit GatherBudget(uint64_t limit) : limit_(limit) {}
  // Takes `n` bytes if they fit under the limit.
  bool TryTake(uint64_t n) {
    uint64_t used = used_.load(std::memory_order_relaxed);
    do {
      if (n > limit_ || used > limit_ - n) return false;
    } while (!used_.compare_exchange_weak(used, used + n,
                                          std::memory_order_relaxed));
    return true;
  }
  void Give(uint64_t n) { used_.fetch_sub(n, std::memory_order_relaxed); }

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> used_{0};
};

// One reply's pieces copied into one buffer; returns its bytes to the
// budget when freed (after UCX is done with it: see ReplyWithData).
class GatheredData {
 public:
  GatheredData(std::shared_ptr<GatherBudget> budget,
               std::span<const std::span<const std::byte>> pieces,
               uint64_t total)
      : budget_(std::move(budget)),
        // Default-initialised: every byte is written below.
        bytes_(new std::byte[total]),
        size_(total) {
    std::byte* at = bytes_.get();
    for (const auto& p : pieces) {
      std::memcpy(at, p.data(), p.size());
      at += p.size();
    }
  }
  ~GatheredData() { budget_->Give(size_); }
  GatheredData(const GatheredData&) = delete;
  GatheredData& operator=(const GatheredData&) = delete;

  std::span<const std::byte> bytes() const { return {bytes_.get(), size_}; }

 private:
  const std::shared_ptr<GatherBudget> budget_;
  const std::unique_ptr<std::byte[]> bytes_;
  const uint64_t size_;
};

}  // namespace

Status PeerTransportOptions::Validate() const {
  if (node_id.empty() || node_id.size() > kMaxNodeIdBytes) {
    return Status::InvalidArgument("node_id must hold 1..255 bytes");
  }
  if (cluster_name.empty() || cluster_name.size() > kMaxClusterNameBytes) {
    return Status::InvalidArgument("cluster_name must hold 1..255 bytes");
  }
  if (cluster_secret.size() < 32) {
    return Status::InvalidArgument(
        "cluster_secret must hold at least 32 bytes");
  }
  if (default_deadline.count() <= 0 || handshake_timeout.count() <= 0) {
    return Status::InvalidArgument(
        "default_deadline and handshake_timeout must be positive");
  }
  if (max_request_bytes == 0 || max_reply_head_bytes == 0) {
    return Status::InvalidArgument(
        "max_request_bytes and max_reply_head_bytes must be positive");
  }
  if (stalled_receive_grace.count() < 0) {
    return Status::InvalidArgument("stalled_receive_grace must be >= 0");
  }
  if (max_outstanding_requests_per_connection == 0) {
    return Status::InvalidArgument(
        "max_outstanding_requests_per_connection must be positive");
  }
  if (max_unauthenticated_connections == 0) {
    return Status::InvalidArgument(
        "max_unauthenticated_connections must be positive");
  }
  if (reconnect_backoff_min.count() < 0 ||
      reconnect_backoff_max < reconnect_backoff_min) {
    return Status::InvalidArgument(
        "reconnect_backoff_min must be >= 0 and <= reconnect_backoff_max");
  }
  if (Result<std::pair<sockaddr_storage, socklen_t>> a =
          ParseSockaddr(listen_address);
      !a.ok()) {
    return Status::InvalidArgument("listen_address: " +
                                   std::string(a.status().message()));
  }
  return Status::OK();
}

// The transport's state, all of it owned by the progress thread except the
// command queue (mu_) and the counters (atomics). Shared with responders
// through weak_ptr so that a late reply finds out the transport is gone.
class Core : public std::enable_shared_from_this<Core> {
 public:
  Core(PeerTransportOptions options, RequestHandler handler)
      : options_(std::move(options)),
        handler_(std::move(handler)),
        gather_budget_(std::make_shared<GatherBudget>(
            options_.reply_gather_budget_bytes)) {}
  ~Core() {
    if (event_fd_ >= 0) ::close(event_fd_);
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
  }
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  // Starts the progress thread, which creates every UCX object; returns
  // the bound listen address once it listens, or why it could not.
  Result<std::string> Start();
  // Shuts down (see ~PeerTransport) and joins the progress thread.
  void Stop();

  // Runs `command` on the progress thread. False (and `command` is
  // dropped) once the transport is shutting down.
  bool Post(std::function<void()> command) EXCLUDES(mu_);

  // Progress-thread entry points for the public API.
  void StartCall(std::string address, uint16_t opcode,
                 std::vector<std::byte> payload, Clock::time_point deadline,
                 std::shared_ptr<ReplyReceiver> rx);
  // A responder's answer: the request stops counting toward
  // max_outstanding_requests_per_connection, then SendReplyNow.
  void SendReply(uint64_t conn_id, uint16_t opcode, uint64_t request_id,
                 bool is_error, std::vector<std::byte> head,
                 std::vector<std::span<const std::byte>> data,
                 std::function<void(Status)> on_sent);
  void SendReplyNow(uint64_t conn_id, uint16_t opcode, uint64_t request_id,
                    bool is_error, std::vector<std::byte> head,
                    std::vector<std::span<const std::byte>> data,
                    std::function<void(Status)> on_sent);
  void ForgetAddress(const std::string& address);
  void SendRaw(const std::string& address, unsigned am_id,
               std::vector<std::byte> header, std::vector<std::byte> data,
               bool sign);

  PeerTransportCounters Snapshot() const;
  const PeerTransportOptions& options() const { return options_; }

  // Any thread: `data` as PeerResponder::ReplyWithData will send it, with
  // pieces that continue one another joined, and several pieces of a
  // rendezvous-sized reply gathered into one buffer when the budget allows
  // (see reply_gather_budget_bytes). `on_sent` then holds that buffer, so
  // it lives until UCX has sent it.
  std::vector<std::span<const std::byte>> PrepareReplyData(
      std::vector<std::span<const std::byte>> data,
      std::function<void(Status)>& on_sent);

 private:
  enum class ConnState {
    kAwaitHello,     // server: endpoint accepted, no HELLO yet
    kAwaitHelloAck,  // client: HELLO sent
    kAwaitAuth,      // server: HELLO_ACK sent
    kAwaitAuthOk,    // client: AUTH sent
    kReady,          // authenticated both ways
  };
  struct Conn {
    uint64_t id = 0;
    ucp_ep_h ep = nullptr;
    bool outgoing = false;
    std::string address;  // outgoing: what callers named
    ConnState state = ConnState::kAwaitHello;
    Hello hello;   // server: the client's; client: ours
    HelloAck ack;  // client: the server's; server: ours
    Clock::time_point handshake_deadline;
    std::vector<uint64_t> waiting;  // calls queued until kReady
    std::set<uint64_t> calls;       // calls sent on this endpoint
    uint32_t malformed = 0;
    bool refused = false;  // the handshake failed; closing
    // Derived when the peer's proof checked (ComputeSessionKey); every
    // request and reply on the connection carries a MAC under it.
    SessionKey key{};
    // Deadlines passed on this connection since the peer last sent a
    // message that checked (see ExpireTimers).
    uint32_t silent_deadlines = 0;
    // Requests handed to the handler and not answered yet (live responders).
    uint32_t serving = 0;
    // UCX reported the endpoint failed: it must be closed with FORCE, even
    // when a graceful close was requested first.
    bool failed = false;
  };
  struct SendOp {
    Core* core = nullptr;
    uint64_t conn_id = 0;
    void* request = nullptr;  // UCX's, while in flight
    std::vector<std::byte> header;
    std::vector<std::byte> payload;  // contiguous data, or
    std::vector<ucp_dt_iov_t> iov;   // borrowed IOV data
    std::function<void(Status)> on_done;
  };
  struct RecvOp {
    Core* core = nullptr;
    void* request = nullptr;
    uint64_t call_id = 0;
    std::vector<ucp_dt_iov_t> iov;
    // Set when the call was completed without this receive (abandoned): the
    // receiver, and so the buffers `iov` points into, stay alive until UCX
    // completes the receive or the worker is destroyed.
    std::shared_ptr<ReplyReceiver> keep_alive;
  };
  struct PendingCall {
    uint64_t id = 0;
    uint64_t conn_id = 0;
    uint16_t opcode = 0;
    std::vector<std::byte> payload;  // until sent
    std::shared_ptr<ReplyReceiver> rx;
    std::multimap<Clock::time_point, uint64_t>::iterator deadline_it;
    SendOp* send = nullptr;  // the request, while UCX holds it
    RecvOp* recv = nullptr;  // the bulk data, while being received
    // Set when the call was completed while `recv` was in flight: reported
    // once UCX has let go of the caller's buffers.
    std::optional<Status> final_status;
    // The receive is being given up (see AbandonLater): its deadline entry
    // is now the end of the grace period.
    bool abandoning = false;
  };
  struct Backoff {
    Clock::time_point retry_at;
    std::chrono::milliseconds next{0};
    uint32_t failures = 0;
    Status why;
  };

  // UCX callbacks (progress thread, inside ucp_worker_progress).
  static void OnConnRequest(ucp_conn_request_h request, void* arg);
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t OnHandshakeAm(void* arg, const void* header,
                                    size_t header_length, void* data,
                                    size_t length,
                                    const ucp_am_recv_param_t* param);
  static ucs_status_t OnRequestAm(void* arg, const void* header,
                                  size_t header_length, void* data,
                                  size_t length,
                                  const ucp_am_recv_param_t* param);
  static ucs_status_t OnReplyAm(void* arg, const void* header,
                                size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* param);
  static void OnSendDone(void* request, ucs_status_t status, void* user);
  static void OnRecvDone(void* request, ucs_status_t status, size_t length,
                         void* user);
  static void OnCloseDone(void* request, ucs_status_t status, void* user);

  Status InitUcx(std::string* bound_address);
  void Run(std::promise<Result<std::string>> started);
  bool RunCommands(bool drain_event_fd) EXCLUDES(mu_);
  void Teardown() EXCLUDES(mu_);
  int NextTimeoutMs(Clock::time_point now) const;
  void ExpireTimers(Clock::time_point now);

  Conn* FindConn(uint64_t id);
  Conn* ConnOf(const ucp_am_recv_param_t* param);
  // The authenticated connection a request or reply (`what`) arrived on,
  // or null, *drop then being what its callback returns: an unknown or
  // refused endpoint, or one still in the handshake (which fails it).
  Conn* ReadyConnOf(const ucp_am_recv_param_t* param, std::string_view what,
                    ucs_status_t* drop);
  Result<Conn*> ConnectTo(const std::string& address);
  Conn& AddConn(ucp_ep_h ep, bool outgoing, std::string address);
  // How an endpoint is closed. kGraceful flushes what was sent and
  // disconnects through the connection manager, so that the peer hears of
  // it even on transports without a connection to break (shared memory);
  // kForce is for an endpoint that failed or a peer that stalled.
  enum class CloseMode { kGraceful, kForce };
  // Closes the endpoint after the current progress call returns; every
  // call on it completes with `why`.
  void RequestClose(uint64_t conn_id, Status why,
                    CloseMode mode = CloseMode::kGraceful);
  void ProcessCloses();
  void CloseNow(uint64_t conn_id, const Status& why, CloseMode mode);
  void FailHandshake(Conn& conn, Status why);
  void OnReady(Conn& conn);
  void HandleMalformed(Conn& conn, std::span<const std::byte> header,
                       const Status& why, bool answer);
  // Appends the MAC of `header` ‖ `body` under the connection's key.
  Status Sign(const Conn& conn, unsigned am_id, std::vector<std::byte>& header,
              std::span<const std::byte> body) const;
  // Checks and strips the MAC at the end of an incoming AM header; the
  // header without it, or nullopt when it is absent or wrong.
  std::optional<std::span<const std::byte>> CheckMac(
      const Conn& conn, unsigned am_id, std::span<const std::byte> header,
      std::span<const std::byte> body) const;

  // Sends one AM; returns the op while UCX holds it (nullptr when it
  // completed at once, after running on_done).
  SendOp* SendAm(Conn& conn, unsigned am_id, std::unique_ptr<SendOp> op,
                 uint32_t flags);
  void FinishSend(SendOp* op, ucs_status_t status);
  void FinishRecv(RecvOp* op, ucs_status_t status, size_t length);
  void SendRequest(Conn& conn, PendingCall& call);
  void SendHandshake(Conn& conn, HandshakeOp op, std::vector<std::byte> msg);
  void CompleteCall(uint64_t call_id, Status status);
  // For a call whose rendezvous receive cannot be ended: UCX 1.13 cancels
  // only tag receives (ucp_request_cancel), and a forced close does not
  // always complete an AM rendezvous receive whose sender stalled. After
  // options_.stalled_receive_grace the call completes anyway and the
  // receive is abandoned (its endpoint is closed by then, see ExpireTimers).
  void AbandonLater(PendingCall& call);

  const PeerTransportOptions options_;
  const RequestHandler handler_;
  const std::shared_ptr<GatherBudget> gather_budget_;
  AtomicCounters counters_;

  Mutex mu_;
  std::deque<std::function<void()>> commands_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  bool accepting_ GUARDED_BY(mu_) = true;
  // The loop found no commands and may be in (or on its way to) epoll_wait:
  // the next Post must write the eventfd. While the loop is busy a Post
  // needs no syscall (a reply posted from the handler, on the loop itself,
  // never does), and the loop reads the eventfd only when epoll says so.
  bool loop_may_sleep_ GUARDED_BY(mu_) = false;
  std::thread thread_;
  int event_fd_ = -1;
  int epoll_fd_ = -1;

  // Progress thread only from here on.
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  uint64_t epoch_ = 0;
  bool shutting_down_ = false;
  bool worker_destroying_ = false;  // inside ucp_worker_destroy: no UCX calls
  uint64_t next_conn_id_ = 0;
  std::map<uint64_t, std::unique_ptr<Conn>> conns_;
  std::unordered_map<ucp_ep_h, uint64_t> conn_by_ep_;
  std::map<std::string, uint64_t, std::less<>> conn_by_address_;
  std::map<std::string, Backoff, std::less<>> backoff_;
  std::map<uint64_t, PendingCall> calls_;
  std::multimap<Clock::time_point, uint64_t> deadlines_;
  struct PendingClose {
    uint64_t conn_id;
    Status why;
    CloseMode mode;
  };
  std::vector<PendingClose> to_close_;
  std::set<SendOp*> sends_;
  std::set<RecvOp*> recvs_;
  size_t closes_in_flight_ = 0;
  size_t abandoning_ = 0;  // calls in their grace period
};

// ---------------------------------------------------------------- startup

Result<std::string> Core::Start() {
  event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (event_fd_ < 0 || epoll_fd_ < 0) {
    return Status::IOError(std::string("eventfd/epoll: ") +
                           std::strerror(errno));
  }
  std::promise<Result<std::string>> started;
  std::future<Result<std::string>> result = started.get_future();
  thread_ = std::thread(&Core::Run, this, std::move(started));
  Result<std::string> bound = result.get();
  if (!bound.ok()) thread_.join();  // Run returned after failing
  return bound;
}

Status Core::InitUcx(std::string* bound_address) {
  Result<uint64_t> epoch = RandomEpoch();
  if (!epoch.ok()) return epoch.status();
  epoch_ = *epoch;

  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return Status::IOError("ucp_config_read: " + UcsError(st));
  for (const auto& [name, value] : options_.ucx_settings) {
    st = ucp_config_modify(config, name.c_str(), value.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return Status::InvalidArgument("UCX setting " + name + "=" + value +
                                     ": " + UcsError(st));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = "tierkv-peer";
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) return Status::IOError("ucp_init: " + UcsError(st));

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // the progress thread only
  st = ucp_worker_create(context_, &wp, &worker_);
  if (st != UCS_OK) {
    return Status::IOError("ucp_worker_create: " + UcsError(st));
  }
  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  st = ucp_worker_query(worker_, &attr);
  if (st != UCS_OK) return Status::IOError("ucp_worker_query: " + UcsError(st));
  if (attr.max_am_header <
          kFrameHeaderBytes + options_.max_reply_head_bytes + kMacBytes ||
      attr.max_am_header < kFrameHeaderBytes + kMaxHandshakeBytes) {
    return Status::InvalidArgument(
        "max_reply_head_bytes " +
        std::to_string(options_.max_reply_head_bytes) +
        " + the 32-byte frame and 16-byte MAC exceeds UCX's AM header bound "
        "of " +
        std::to_string(attr.max_am_header) + " B");
  }

  const std::pair<ucs_status_t (*)(void*, const void*, size_t, void*, size_t,
                                   const ucp_am_recv_param_t*),
                  unsigned>
      handlers[] = {{&Core::OnHandshakeAm, kHandshakeAmId},
                    {&Core::OnRequestAm, kRequestAmId},
                    {&Core::OnReplyAm, kReplyAmId}};
  for (const auto& [cb, id] : handlers) {
    ucp_am_handler_param_t hp{};
    hp.field_mask =
        UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
        UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = id;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    hp.cb = cb;
    hp.arg = this;
    st = ucp_worker_set_am_recv_handler(worker_, &hp);
    if (st != UCS_OK) {
      return Status::IOError("ucp_worker_set_am_recv_handler: " + UcsError(st));
    }
  }

  Result<std::pair<sockaddr_storage, socklen_t>> listen =
      ParseSockaddr(options_.listen_address);
  if (!listen.ok()) return listen.status();
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
                  UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&listen->first);
  lp.sockaddr.addrlen = listen->second;
  lp.conn_handler.cb = &Core::OnConnRequest;
  lp.conn_handler.arg = this;
  st = ucp_listener_create(worker_, &lp, &listener_);
  if (st != UCS_OK) {
    return Status::IOError("cannot listen on " + options_.listen_address +
                           ": ucp_listener_create: " + UcsError(st));
  }
  ucp_listener_attr_t la{};
  la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  st = ucp_listener_query(listener_, &la);
  if (st != UCS_OK) {
    return Status::IOError("ucp_listener_query: " + UcsError(st));
  }
  *bound_address = FormatSockaddr(la.sockaddr);

  int worker_fd = -1;
  st = ucp_worker_get_efd(worker_, &worker_fd);
  if (st != UCS_OK) {
    return Status::IOError("ucp_worker_get_efd: " + UcsError(st));
  }
  for (int fd : {worker_fd, event_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return Status::IOError(std::string("epoll_ctl: ") + std::strerror(errno));
    }
  }
  return Status::OK();
}

// ------------------------------------------------------------- the loop

void Core::Run(std::promise<Result<std::string>> started) {
  std::string bound;
  if (Status s = InitUcx(&bound); !s.ok()) {
    {
      MutexLock lock(&mu_);
      accepting_ = false;
    }
    shutting_down_ = true;
    Teardown();
    started.set_value(s);
    return;
  }
  started.set_value(bound);
  bool event_fd_readable = false;
  Clock::time_point last_work = Clock::now();
  for (;;) {
    const bool stop = RunCommands(event_fd_readable);
    // Bounded, so that a stream of incoming data cannot starve commands and
    // deadlines; what is left makes ucp_worker_arm say BUSY.
    int progressed = 0;
    while (progressed < kMaxProgressPerTurn &&
           ucp_worker_progress(worker_) != 0) {
      ++progressed;
    }
    if (progressed > 0) last_work = Clock::now();
    ProcessCloses();
    ExpireTimers(Clock::now());
    ProcessCloses();
    if (stop) break;
    event_fd_readable = false;
    // While bytes are moving, the next event is due within microseconds:
    // polling a little longer saves the sleep and wake-up per event (most
    // of a transfer's CPU beyond the kernel's copies; bench/RESULTS.md).
    if ((!recvs_.empty() || !sends_.empty()) &&
        Clock::now() - last_work < options_.transfer_spin) {
      continue;
    }
    {
      MutexLock lock(&mu_);
      if (!commands_.empty() || stopping_) continue;
      loop_may_sleep_ = true;
    }
    const ucs_status_t st = ucp_worker_arm(worker_);
    if (st == UCS_ERR_BUSY) continue;  // events arrived meanwhile
    epoll_event events[4];
    const int n =
        ::epoll_wait(epoll_fd_, events, 4, NextTimeoutMs(Clock::now()));
    // The worker is progressed every turn anyway; the eventfd is drained
    // only when it was written.
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == event_fd_) event_fd_readable = true;
    }
  }
  shutting_down_ = true;
  Teardown();
}

bool Core::Post(std::function<void()> command) {
  bool wake = false;
  {
    MutexLock lock(&mu_);
    if (!accepting_) return false;
    commands_.push_back(std::move(command));
    wake = loop_may_sleep_;
    loop_may_sleep_ = false;  // one write wakes it; it drains what follows
  }
  if (wake) {
    const uint64_t one = 1;
    // A full counter (never, at 2^64 - 1) would still leave the fd readable.
    [[maybe_unused]] ssize_t n = ::write(event_fd_, &one, sizeof(one));
  }
  return true;
}

bool Core::RunCommands(bool drain_event_fd) {
  if (drain_event_fd) {
    uint64_t drained = 0;
    [[maybe_unused]] ssize_t n = ::read(event_fd_, &drained, sizeof(drained));
  }
  std::deque<std::function<void()>> batch;
  bool stop = false;
  {
    MutexLock lock(&mu_);
    batch.swap(commands_);
    stop = stopping_;
    loop_may_sleep_ = false;
  }
  for (auto& command : batch) command();
  return stop;
}

void Core::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(event_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

int Core::NextTimeoutMs(Clock::time_point now) const {
  std::optional<Clock::time_point> next;
  if (!deadlines_.empty()) next = deadlines_.begin()->first;
  for (const auto& [id, conn] : conns_) {
    if (conn->state != ConnState::kReady &&
        (!next || conn->handshake_deadline < *next)) {
      next = conn->handshake_deadline;
    }
  }
  // While UCX tears endpoints down or a receive is being given up, some of
  // its work is deferred to progress calls that no fd announces: poll.
  const bool poll = closes_in_flight_ > 0 || abandoning_ > 0;
  if (!next) return poll ? static_cast<int>(kTeardownPollMs) : -1;
  if (*next <= now) return 0;
  int64_t ms =
      std::chrono::ceil<std::chrono::milliseconds>(*next - now).count();
  if (poll) ms = std::min<int64_t>(ms, kTeardownPollMs);
  return static_cast<int>(std::min<int64_t>(ms, 60'000));
}

void Core::ExpireTimers(Clock::time_point now) {
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    const uint64_t id = deadlines_.begin()->second;
    PendingCall& call = calls_.at(id);
    deadlines_.erase(deadlines_.begin());
    call.deadline_it = deadlines_.end();
    if (call.abandoning) {
      --abandoning_;
      call.abandoning = false;
      if (call.recv != nullptr) {
        call.recv->call_id = 0;  // UCX may still complete it: ignored then
        call.recv->keep_alive = call.rx;  // UCX may still write into it
        call.recv = nullptr;
        Add(counters_.abandoned_receives);
      }
      CompleteCall(id, call.final_status.value_or(DeadlineExceeded()));
      continue;
    }
    Add(counters_.errors_timeout);
    const uint64_t conn_id = call.conn_id;
    const bool receiving = call.recv != nullptr;
    // The request never left (it sits in UCX's queue for a peer that does
    // not read): ucp_request_cancel does nothing for AM sends in UCX 1.13,
    // so only closing the endpoint ends it.
    const bool unsent = call.send != nullptr;
    CompleteCall(id, DeadlineExceeded());
    // A peer that stalls mid-rendezvous: the receive cannot be cancelled
    // (UCX 1.13) and the endpoint is suspect anyway, so force-close it
    // (scaleout.md §8e), which cuts the path the data would take, and give
    // UCX a grace period to complete the receive before abandoning it.
    if (receiving) {
      if (auto it = calls_.find(id); it != calls_.end()) {
        AbandonLater(it->second);
        RequestClose(conn_id,
                     Status::Busy("peer stalled mid-transfer past a deadline"),
                     CloseMode::kForce);
      }
      continue;
    }
    Conn* conn = FindConn(conn_id);
    if (conn == nullptr) continue;  // never connected, or closing already
    if (conn->state != ConnState::kReady) continue;  // handshake timer's job
    ++conn->silent_deadlines;
    if (unsent || conn->silent_deadlines >= kSilentDeadlinesBeforeClose) {
      RequestClose(conn_id,
                   Status::Unavailable(
                       unsent ? "peer did not take a request before its "
                                "deadline (hung?)"
                              : "peer sent nothing across " +
                                    std::to_string(conn->silent_deadlines) +
                                    " call deadlines (hung?)"),
                   CloseMode::kForce);
    }
  }
  std::vector<uint64_t> expired;
  for (const auto& [id, conn] : conns_) {
    if (conn->state != ConnState::kReady && conn->handshake_deadline <= now) {
      expired.push_back(id);
    }
  }
  for (uint64_t id : expired) {
    Conn* conn = FindConn(id);
    if (conn->outgoing || conn->refused) {
      // Our own dial got no answer, or a refusal could not be delivered in
      // a further handshake_timeout: give up on the peer.
      if (!conn->refused) Add(counters_.errors_auth);
      RequestClose(id, Status::Unavailable("peer handshake timed out"),
                   CloseMode::kForce);
      continue;
    }
    // A client that connected and stalled: refuse it (so that it hears why,
    // see FailHandshake), within one more handshake_timeout.
    conn->handshake_deadline = now + options_.handshake_timeout;
    FailHandshake(*conn, Status::Unavailable("peer handshake timed out"));
  }
}

// ------------------------------------------------------------ connections

Core::Conn* Core::FindConn(uint64_t id) {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second.get();
}

Core::Conn* Core::ConnOf(const ucp_am_recv_param_t* param) {
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0) return nullptr;
  auto it = conn_by_ep_.find(param->reply_ep);
  return it == conn_by_ep_.end() ? nullptr : FindConn(it->second);
}

Core::Conn* Core::ReadyConnOf(const ucp_am_recv_param_t* param,
                              std::string_view what, ucs_status_t* drop) {
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  *drop = rndv ? UCS_ERR_CANCELED : UCS_OK;
  Conn* conn = ConnOf(param);
  if (conn == nullptr || conn->refused) return nullptr;
  if (conn->state != ConnState::kReady) {
    FailHandshake(*conn, Status::PermissionDenied(std::string(what) +
                                                  " before authentication"));
    return nullptr;
  }
  return conn;
}

Core::Conn& Core::AddConn(ucp_ep_h ep, bool outgoing, std::string address) {
  auto conn = std::make_unique<Conn>();
  conn->id = ++next_conn_id_;
  conn->ep = ep;
  conn->outgoing = outgoing;
  conn->address = std::move(address);
  conn->state = outgoing ? ConnState::kAwaitHelloAck : ConnState::kAwaitHello;
  conn->handshake_deadline = Clock::now() + options_.handshake_timeout;
  Conn& ref = *conn;
  conn_by_ep_[ep] = ref.id;
  conns_[ref.id] = std::move(conn);
  return ref;
}

void Core::OnConnRequest(ucp_conn_request_h request, void* arg) {
  Core* core = static_cast<Core*>(arg);
  size_t unauthenticated = 0;
  for (const auto& [id, conn] : core->conns_) {
    if (!conn->outgoing && conn->state != ConnState::kReady) ++unauthenticated;
  }
  if (core->shutting_down_ ||
      unauthenticated >= core->options_.max_unauthenticated_connections) {
    // Refused at once, so idle unauthenticated sockets cannot pile up
    // (each is closed at handshake_timeout anyway).
    if (!core->shutting_down_) Add(core->counters_.errors_auth);
    ucp_listener_reject(core->listener_, request);
    return;
  }
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST |
                  UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.conn_request = request;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &Core::OnEndpointError;
  ep.err_handler.arg = core;
  ucp_ep_h handle = nullptr;
  if (ucp_ep_create(core->worker_, &ep, &handle) != UCS_OK) return;
  core->AddConn(handle, /*outgoing=*/false, "");
}

Result<Core::Conn*> Core::ConnectTo(const std::string& address) {
  if (auto it = conn_by_address_.find(address); it != conn_by_address_.end()) {
    return FindConn(it->second);
  }
  if (auto b = backoff_.find(address);
      b != backoff_.end() && Clock::now() < b->second.retry_at) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(
        b->second.retry_at - Clock::now());
    const StatusCode code =
        b->second.why.code() == StatusCode::kPermissionDenied
            ? StatusCode::kPermissionDenied
            : StatusCode::kUnavailable;
    return Status(code, "peer " + address + " is backed off for another " +
                            std::to_string(left.count()) +
                            " ms after: " + b->second.why.ToString());
  }
  Result<std::pair<sockaddr_storage, socklen_t>> sa = ParseSockaddr(address);
  if (!sa.ok()) return sa.status();
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                  UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa->first);
  ep.sockaddr.addrlen = sa->second;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &Core::OnEndpointError;
  ep.err_handler.arg = this;
  ucp_ep_h handle = nullptr;
  const ucs_status_t st = ucp_ep_create(worker_, &ep, &handle);
  if (st != UCS_OK) {
    return Status::Unavailable("cannot connect to peer " + address +
                               ": ucp_ep_create: " + UcsError(st));
  }
  Conn& conn = AddConn(handle, /*outgoing=*/true, address);
  conn_by_address_[address] = conn.id;
  Result<Nonce> nonce = RandomNonce();
  if (!nonce.ok()) {
    RequestClose(conn.id, nonce.status());
    return nonce.status();
  }
  conn.hello = Hello{options_.cluster_name, options_.node_id, epoch_, *nonce};
  bool send_hello = true;
  // Tests clear it to play a client that connects and then stalls.
  TIERKV_SYNC_POINT_CALLBACK("PeerTransport::SendHello", &send_hello);
  if (send_hello) {
    SendHandshake(conn, HandshakeOp::kHello, EncodeHello(conn.hello));
  }
  return &conn;
}

void Core::OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  Core* core = static_cast<Core*>(arg);
  auto it = core->conn_by_ep_.find(ep);
  if (it == core->conn_by_ep_.end()) return;
  if (Conn* conn = core->FindConn(it->second); conn != nullptr) {
    conn->failed = true;
  }
  // UCX requires a failed endpoint to be closed with FORCE.
  core->RequestClose(
      it->second,
      Status::Unavailable("peer connection failed: " + UcsError(status)),
      CloseMode::kForce);
}

void Core::RequestClose(uint64_t conn_id, Status why, CloseMode mode) {
  if (worker_destroying_) return;  // the worker took its endpoints along
  to_close_.push_back(PendingClose{conn_id, std::move(why), mode});
}

void Core::ProcessCloses() {
  while (!to_close_.empty()) {
    std::vector<PendingClose> batch;
    batch.swap(to_close_);
    for (const PendingClose& c : batch) CloseNow(c.conn_id, c.why, c.mode);
  }
}

void Core::CloseNow(uint64_t conn_id, const Status& why, CloseMode mode) {
  Conn* conn = FindConn(conn_id);
  if (conn == nullptr) return;
  for (uint64_t id : conn->calls) {
    // A graceful close would wait for a receive that a stalled peer never
    // finishes; a forced one completes it (PEER error mode), so that the
    // caller's buffers are released now.
    if (auto it = calls_.find(id); it != calls_.end() && it->second.recv) {
      mode = CloseMode::kForce;
    }
  }
  if (conn->failed) mode = CloseMode::kForce;
  Status status = why;
  if (conn->state == ConnState::kReady) {
    counters_.live_connections.fetch_sub(1, std::memory_order_relaxed);
  } else if (conn->state == ConnState::kAwaitAuthOk && conn->failed &&
             why.code() == StatusCode::kUnavailable) {
    // The server hung up on our AUTH: it did not accept our proof.
    status = Status::PermissionDenied(
        "peer " + conn->address +
        " closed the connection during authentication (different cluster "
        "secret or name?)");
  }
  const ucp_ep_h ep = conn->ep;
  conn_by_ep_.erase(ep);
  if (conn->outgoing) {
    conn_by_address_.erase(conn->address);
    if (why.code() != StatusCode::kShutdown) {
      Backoff& b = backoff_[conn->address];
      // Doubles from the minimum (from 1 ms when the minimum is 0).
      b.next =
          b.failures++ == 0
              ? options_.reconnect_backoff_min
              : std::min(std::max(b.next * 2, std::chrono::milliseconds(1)),
                         options_.reconnect_backoff_max);
      b.retry_at = Clock::now() + b.next;
      b.why = status;
    }
  }
  // Move the calls out first: completing them may re-enter (a receiver
  // that calls again, a cancelled receive completing inline).
  std::vector<uint64_t> calls(conn->calls.begin(), conn->calls.end());
  calls.insert(calls.end(), conn->waiting.begin(), conn->waiting.end());
  std::unique_ptr<Conn> owned = std::move(conns_.at(conn_id));
  conns_.erase(conn_id);
  for (uint64_t id : calls) {
    if (status.code() != StatusCode::kShutdown &&
        status.code() != StatusCode::kPermissionDenied) {
      Add(counters_.errors_reset);
    }
    CompleteCall(id, status);
    auto it = calls_.find(id);
    if (it != calls_.end() && it->second.recv != nullptr &&
        !it->second.abandoning) {
      AbandonLater(it->second);
    }
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK |
                   UCP_OP_ATTR_FIELD_USER_DATA;
  p.flags = mode == CloseMode::kForce ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  p.cb.send = &Core::OnCloseDone;
  p.user_data = this;
  const ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) ++closes_in_flight_;
}

void Core::OnCloseDone(void* request, ucs_status_t, void* user) {
  Core* core = static_cast<Core*>(user);
  --core->closes_in_flight_;
  ucp_request_free(request);
}

void Core::ForgetAddress(const std::string& address) {
  if (auto it = conn_by_address_.find(address); it != conn_by_address_.end()) {
    CloseNow(it->second, Status::Unavailable("disconnected by the owner"),
             CloseMode::kGraceful);
  }
  backoff_.erase(address);
}

// --------------------------------------------------------------- sending

Core::SendOp* Core::SendAm(Conn& conn, unsigned am_id,
                           std::unique_ptr<SendOp> op, uint32_t flags) {
  op->core = this;
  op->conn_id = conn.id;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = &Core::OnSendDone;
  p.user_data = op.get();
  // REPLY: the receiver learns which endpoint a message came on, which is
  // how it finds the connection (and its authentication state).
  p.flags = flags | UCP_AM_SEND_FLAG_REPLY;
  const void* buffer = op->payload.empty() ? nullptr : op->payload.data();
  size_t count = op->payload.size();
  if (op->iov.size() == 1) {
    // One piece goes as contiguous data. UCX 1.13 moves an IOV datatype
    // by copying it through its own buffers (bcopy, a rendezvous over AM
    // fragments), while contiguous data on both sides (OnReplyAm receives
    // one piece the same way) goes zero-copy where the transport can: on
    // TCP, sendmsg straight from this buffer and recv straight into the
    // requester's. tierkv-bench peer: 4 MiB single-segment replies over
    // TCP went from ~1 GB/s to 3-4.7 GB/s.
    buffer = op->iov.front().buffer;
    count = op->iov.front().length;
  } else if (!op->iov.empty()) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    p.datatype = ucp_dt_make_iov();
    buffer = op->iov.data();
    count = op->iov.size();
  }
  const ucs_status_ptr_t r = ucp_am_send_nbx(
      conn.ep, am_id, op->header.data(), op->header.size(), buffer, count, &p);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {
    const ucs_status_t st = r == nullptr ? UCS_OK : UCS_PTR_STATUS(r);
    if (op->on_done) {
      op->on_done(st == UCS_OK ? Status::OK()
                               : Status::Unavailable("ucp_am_send_nbx: " +
                                                     UcsError(st)));
    }
    return nullptr;
  }
  op->request = r;
  SendOp* raw = op.release();
  sends_.insert(raw);
  return raw;
}

void Core::OnSendDone(void* request, ucs_status_t status, void* user) {
  SendOp* op = static_cast<SendOp*>(user);
  ucp_request_free(request);
  op->core->FinishSend(op, status);
}

void Core::FinishSend(SendOp* op, ucs_status_t status) {
  sends_.erase(op);
  std::unique_ptr<SendOp> owned(op);
  if (owned->on_done) {
    owned->on_done(status == UCS_OK ? Status::OK()
                                    : Status::Unavailable("peer send failed: " +
                                                          UcsError(status)));
  }
}

void Core::SendHandshake(Conn& conn, HandshakeOp op,
                         std::vector<std::byte> msg) {
  auto send = std::make_unique<SendOp>();
  send->header =
      EncodeFramedHeader(static_cast<uint16_t>(op), /*request_id=*/0, msg);
  Add(counters_.bytes_sent, send->header.size());
  SendAm(conn, kHandshakeAmId, std::move(send), UCP_AM_SEND_FLAG_EAGER);
}

void Core::SendRaw(const std::string& address, unsigned am_id,
                   std::vector<std::byte> header, std::vector<std::byte> data,
                   bool sign) {
  Result<Conn*> conn = ConnectTo(address);
  if (!conn.ok()) return;
  if (sign && !Sign(**conn, am_id, header, data).ok()) return;
  auto send = std::make_unique<SendOp>();
  send->header = std::move(header);
  send->payload = std::move(data);
  SendAm(**conn, am_id, std::move(send), UCP_AM_SEND_FLAG_EAGER);
}

// ------------------------------------------------------------ handshake

void Core::FailHandshake(Conn& conn, Status why) {
  if (conn.refused) return;  // already on its way out
  conn.refused = true;
  // A further handshake_timeout to deliver REFUSED and close; then the
  // handshake timer force-closes it.
  if (conn.state != ConnState::kReady) {
    conn.handshake_deadline = Clock::now() + options_.handshake_timeout;
  }
  Add(counters_.errors_auth);
  TIERKV_SYNC_POINT("PeerTransport::HandshakeFailed");
  if (conn.outgoing || conn.state == ConnState::kReady) {
    RequestClose(conn.id, std::move(why));
    return;
  }
  // Close once REFUSED is out (or could not be sent), so that it reaches
  // the client before the disconnect does.
  auto send = std::make_unique<SendOp>();
  send->header =
      EncodeFramedHeader(static_cast<uint16_t>(HandshakeOp::kRefused),
                         /*request_id=*/0, {});
  send->on_done = [this, id = conn.id, why = std::move(why)](Status) {
    RequestClose(id, why);
  };
  Add(counters_.bytes_sent, send->header.size());
  SendAm(conn, kHandshakeAmId, std::move(send), UCP_AM_SEND_FLAG_EAGER);
}

void Core::OnReady(Conn& conn) {
  conn.state = ConnState::kReady;
  Add(counters_.connections_opened);
  Add(counters_.live_connections);
  if (conn.outgoing) backoff_.erase(conn.address);
  std::vector<uint64_t> waiting;
  waiting.swap(conn.waiting);
  for (uint64_t id : waiting) {
    auto it = calls_.find(id);
    if (it != calls_.end()) SendRequest(conn, it->second);
  }
}

ucs_status_t Core::OnHandshakeAm(void* arg, const void* header,
                                 size_t header_length, void*, size_t length,
                                 const ucp_am_recv_param_t* param) {
  Core* core = static_cast<Core*>(arg);
  Conn* conn = core->ConnOf(param);
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  const ucs_status_t drop = rndv ? UCS_ERR_CANCELED : UCS_OK;
  if (conn == nullptr || conn->refused) return drop;
  Add(core->counters_.bytes_received, header_length);
  const std::span<const std::byte> bytes(static_cast<const std::byte*>(header),
                                         header_length);
  Result<FramedHeader> frame = DecodeFramedHeader(bytes, kMaxHandshakeBytes);
  if (!frame.ok() || length != 0) {
    core->FailHandshake(*conn, Status::PermissionDenied(
                                   "malformed handshake message from peer"));
    return drop;
  }
  const PeerTransportOptions& o = core->options_;
  const auto op = static_cast<HandshakeOp>(frame->frame.opcode);
  if (op == HandshakeOp::kHello && conn->state == ConnState::kAwaitHello) {
    Result<Hello> hello = DecodeHello(frame->head);
    if (!hello.ok() || hello->cluster != o.cluster_name) {
      core->FailHandshake(
          *conn,
          Status::PermissionDenied("HELLO from another cluster or malformed"));
      return drop;
    }
    Result<Nonce> nonce = RandomNonce();
    if (!nonce.ok()) {
      core->FailHandshake(*conn, nonce.status());
      return drop;
    }
    conn->hello = *hello;
    conn->ack.node_id = o.node_id;
    conn->ack.epoch = core->epoch_;
    conn->ack.nonce = *nonce;
    const Transcript t{o.cluster_name, hello->node_id, o.node_id,
                       hello->epoch,   core->epoch_,   hello->nonce,
                       conn->ack.nonce};
    Result<Proof> proof = ComputeProof(o.cluster_secret, ProofRole::kServer, t);
    if (!proof.ok()) {
      core->FailHandshake(*conn, proof.status());
      return drop;
    }
    conn->ack.proof = *proof;
    conn->state = ConnState::kAwaitAuth;
    core->SendHandshake(*conn, HandshakeOp::kHelloAck,
                        EncodeHelloAck(conn->ack));
    return drop;
  }
  if (op == HandshakeOp::kHelloAck &&
      conn->state == ConnState::kAwaitHelloAck) {
    Result<HelloAck> ack = DecodeHelloAck(frame->head);
    if (!ack.ok()) {
      core->FailHandshake(*conn, ack.status());
      return drop;
    }
    conn->ack = *ack;
    const Transcript t{o.cluster_name,    o.node_id,  ack->node_id,
                       conn->hello.epoch, ack->epoch, conn->hello.nonce,
                       ack->nonce};
    bool accepted =
        VerifyProof(o.cluster_secret, ProofRole::kServer, t, ack->proof);
    // Tests force `accepted` to play a client that ignores a bad server
    // proof, to check that the server refuses it on its own.
    TIERKV_SYNC_POINT_CALLBACK("PeerTransport::VerifyServerProof", &accepted);
    if (!accepted) {
      core->FailHandshake(
          *conn, Status::PermissionDenied(
                     "peer " + conn->address + " (" + ack->node_id +
                     ") failed the cluster handshake: different cluster "
                     "secret?"));
      return drop;
    }
    Result<Proof> proof = ComputeProof(o.cluster_secret, ProofRole::kClient, t);
    Result<SessionKey> key = ComputeSessionKey(o.cluster_secret, t);
    if (!proof.ok() || !key.ok()) {
      core->FailHandshake(*conn, !proof.ok() ? proof.status() : key.status());
      return drop;
    }
    conn->key = *key;
    conn->state = ConnState::kAwaitAuthOk;
    core->SendHandshake(*conn, HandshakeOp::kAuth, EncodeAuth(Auth{*proof}));
    return drop;
  }
  if (op == HandshakeOp::kAuth && conn->state == ConnState::kAwaitAuth) {
    Result<Auth> auth = DecodeAuth(frame->head);
    const Transcript t{
        o.cluster_name, conn->hello.node_id, o.node_id,      conn->hello.epoch,
        core->epoch_,   conn->hello.nonce,   conn->ack.nonce};
    if (!auth.ok() ||
        !VerifyProof(o.cluster_secret, ProofRole::kClient, t, auth->proof)) {
      core->FailHandshake(
          *conn, Status::PermissionDenied("peer " + conn->hello.node_id +
                                          " failed the cluster handshake"));
      return drop;
    }
    Result<SessionKey> key = ComputeSessionKey(o.cluster_secret, t);
    if (!key.ok()) {
      core->FailHandshake(*conn, key.status());
      return drop;
    }
    conn->key = *key;
    core->SendHandshake(*conn, HandshakeOp::kAuthOk, {});
    core->OnReady(*conn);
    return drop;
  }
  if (op == HandshakeOp::kAuthOk && conn->state == ConnState::kAwaitAuthOk &&
      frame->head.empty()) {
    core->OnReady(*conn);
    return drop;
  }
  if (op == HandshakeOp::kRefused && conn->outgoing &&
      conn->state != ConnState::kReady) {
    core->FailHandshake(
        *conn, Status::PermissionDenied(
                   "peer " + conn->address +
                   " refused the cluster handshake (different cluster name "
                   "or secret?)"));
    return drop;
  }
  core->FailHandshake(*conn, Status::PermissionDenied(
                                 "unexpected handshake message from peer"));
  return drop;
}

// --------------------------------------------------------- serving

Status Core::Sign(const Conn& conn, unsigned am_id,
                  std::vector<std::byte>& header,
                  std::span<const std::byte> body) const {
  Result<MessageMac> mac = ComputeMessageMac(
      conn.key,
      conn.outgoing ? MacDirection::kFromClient : MacDirection::kFromServer,
      am_id, header, body);
  if (!mac.ok()) return mac.status();
  header.insert(header.end(), mac->begin(), mac->end());
  return Status::OK();
}

std::optional<std::span<const std::byte>> Core::CheckMac(
    const Conn& conn, unsigned am_id, std::span<const std::byte> header,
    std::span<const std::byte> body) const {
  if (header.size() < kMacBytes) return std::nullopt;
  const std::span<const std::byte> bare =
      header.first(header.size() - kMacBytes);
  if (!VerifyMessageMac(
          conn.key,
          conn.outgoing ? MacDirection::kFromServer : MacDirection::kFromClient,
          am_id, bare, body, header.last(kMacBytes))) {
    return std::nullopt;
  }
  return bare;
}

void Core::HandleMalformed(Conn& conn, std::span<const std::byte> header,
                           const Status& why, bool answer) {
  Add(counters_.errors_malformed);
  TIERKV_SYNC_POINT("PeerTransport::MalformedMessage");
  if (++conn.malformed > options_.max_malformed_messages) {
    RequestClose(conn.id, Status::ProtocolError(
                              "too many malformed messages from the peer: " +
                              why.ToString()));
    return;
  }
  if (!answer) return;
  // Answer when the request id is readable at all, so that a requester with
  // a bug learns why instead of waiting for its deadline.
  Result<FrameHeader> h = DecodeFrameHeader(header, UINT64_MAX);
  if (!h.ok()) return;
  auto send = std::make_unique<SendOp>();
  send->header =
      EncodeFramedHeader(kErrorOpcode, h->request_id, EncodeError(why));
  if (!Sign(conn, kReplyAmId, send->header, {}).ok()) return;
  Add(counters_.bytes_sent, send->header.size());
  SendAm(conn, kReplyAmId, std::move(send), UCP_AM_SEND_FLAG_EAGER);
}

ucs_status_t Core::OnRequestAm(void* arg, const void* header,
                               size_t header_length, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
  Core* core = static_cast<Core*>(arg);
  ucs_status_t drop = UCS_OK;
  Conn* conn = core->ReadyConnOf(param, "request", &drop);
  if (conn == nullptr) return drop;
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  const std::span<const std::byte> hdr(static_cast<const std::byte*>(header),
                                       header_length);
  if (rndv) {  // requests are sent eagerly; a rendezvous one is hostile
    core->HandleMalformed(*conn, hdr,
                          Status::ProtocolError("rendezvous request"),
                          /*answer=*/true);
    return drop;
  }
  const std::span<const std::byte> payload(static_cast<const std::byte*>(data),
                                           length);
  Add(core->counters_.bytes_received, header_length + length);
  // Nothing in the header is trusted before its MAC checks: it is what
  // ties the message to the authenticated peer (not UCX's reply_ep, which
  // comes from a sender-written endpoint id). Unanswered: we would be
  // replying to whoever forged it.
  const std::optional<std::span<const std::byte>> bare =
      core->CheckMac(*conn, kRequestAmId, hdr, payload);
  if (!bare) {
    core->HandleMalformed(*conn, hdr,
                          Status::ProtocolError("request with a bad MAC"),
                          /*answer=*/false);
    return UCS_OK;
  }
  conn->silent_deadlines = 0;
  Result<FrameHeader> h =
      DecodeRequestHeader(*bare, payload, core->options_.max_request_bytes);
  if (h.ok() && (h->opcode & kResponseBit) != 0) {
    h = Status::ProtocolError("request opcode has the response bit");
  } else if (h.ok() && (h->opcode | kResponseBit) == kErrorOpcode) {
    h = Status::ProtocolError(
        "request opcode 0x7FFF (its reply would be an "
        "error reply)");
  }
  if (!h.ok()) {
    core->HandleMalformed(*conn, *bare, h.status(), /*answer=*/true);
    return UCS_OK;
  }
  if (conn->serving >= core->options_.max_outstanding_requests_per_connection) {
    core->SendReplyNow(
        conn->id, h->opcode, h->request_id, /*is_error=*/true,
        EncodeError(Status::Busy("peer has too many outstanding requests "
                                 "from this node")),
        {}, nullptr);
    return UCS_OK;
  }
  ++conn->serving;
  Add(core->counters_.requests_served);
  PeerResponder responder(core->weak_from_this(), conn->id, h->opcode,
                          h->request_id);
  if (!core->handler_) {
    responder.ReplyError(Status::Unavailable("peer serves no requests"));
    return UCS_OK;
  }
  // A connection serves both ways: the peer is whoever is not us.
  const std::string& peer =
      conn->outgoing ? conn->ack.node_id : conn->hello.node_id;
  core->handler_(PeerRequest{peer, h->opcode, payload}, std::move(responder));
  return UCS_OK;
}

void Core::SendReply(uint64_t conn_id, uint16_t opcode, uint64_t request_id,
                     bool is_error, std::vector<std::byte> head,
                     std::vector<std::span<const std::byte>> data,
                     std::function<void(Status)> on_sent) {
  if (Conn* conn = FindConn(conn_id); conn != nullptr && conn->serving > 0) {
    --conn->serving;
  }
  SendReplyNow(conn_id, opcode, request_id, is_error, std::move(head),
               std::move(data), std::move(on_sent));
}

void Core::SendReplyNow(uint64_t conn_id, uint16_t opcode, uint64_t request_id,
                        bool is_error, std::vector<std::byte> head,
                        std::vector<std::span<const std::byte>> data,
                        std::function<void(Status)> on_sent) {
  auto report = [&](Status s) {
    if (on_sent) on_sent(std::move(s));
  };
  if (shutting_down_) return report(Status::Shutdown("peer transport closed"));
  Conn* conn = FindConn(conn_id);
  if (conn == nullptr || conn->state != ConnState::kReady) {
    return report(Status::Unavailable("the requester's connection is gone"));
  }
  uint64_t total = 0;
  for (const auto& d : data) total += d.size();
  Status refused;
  if (head.size() > options_.max_reply_head_bytes) {
    refused =
        Status::InvalidArgument("reply head exceeds max_reply_head_bytes");
  } else if (total > options_.max_reply_data_bytes) {
    refused =
        Status::InvalidArgument("reply data exceeds max_reply_data_bytes");
  }
  if (!refused.ok()) {
    // The requester hears Internal (a bug here), the owner why.
    SendReplyNow(conn_id, opcode, request_id, /*is_error=*/true,
                 EncodeError(Status::Internal("peer built an oversized reply")),
                 {}, nullptr);
    return report(refused);
  }
  auto send = std::make_unique<SendOp>();
  send->header = EncodeFramedHeader(
      is_error ? kErrorOpcode : static_cast<uint16_t>(opcode | kResponseBit),
      request_id, head);
  if (Status s = Sign(*conn, kReplyAmId, send->header, {}); !s.ok()) {
    return report(s);
  }
  uint32_t flags = UCP_AM_SEND_FLAG_EAGER;
  if (total > 0) {
    send->iov.reserve(data.size());
    for (const auto& d : data) {
      if (d.empty()) continue;
      // UCX's IOV takes a non-const pointer; it only reads a send buffer.
      send->iov.push_back(
          ucp_dt_iov_t{const_cast<std::byte*>(d.data()), d.size()});
    }
    if (total >= options_.rendezvous_threshold_bytes) {
      flags = UCP_AM_SEND_FLAG_RNDV;
    }
  }
  Add(counters_.bytes_sent, send->header.size() + total);
  send->on_done = [this, total, on_sent = std::move(on_sent)](Status s) {
    if (s.ok()) Add(counters_.reply_data_bytes_served, total);
    if (on_sent) on_sent(std::move(s));
  };
  SendAm(*conn, kReplyAmId, std::move(send), flags);
}

// --------------------------------------------------------- requesting

void Core::StartCall(std::string address, uint16_t opcode,
                     std::vector<std::byte> payload, Clock::time_point deadline,
                     std::shared_ptr<ReplyReceiver> rx) {
  if (shutting_down_) {
    return rx->OnComplete(Status::Shutdown("peer transport closed"));
  }
  // 0x7FFF's reply opcode would be kErrorOpcode (0x7FFF | kResponseBit).
  if ((opcode & kResponseBit) != 0 || (opcode | kResponseBit) == kErrorOpcode) {
    return rx->OnComplete(
        Status::InvalidArgument("peer opcodes must be below 0x7FFF"));
  }
  if (payload.size() > options_.max_request_bytes) {
    return rx->OnComplete(
        Status::InvalidArgument("request payload exceeds max_request_bytes"));
  }
  // Random, so that a call's id tells nothing about the next one.
  uint64_t id = 0;
  do {
    Result<uint64_t> r = RandomEpoch();
    if (!r.ok()) return rx->OnComplete(r.status());
    id = *r;
  } while (calls_.contains(id));
  PendingCall& call = calls_[id];
  call.id = id;
  call.opcode = opcode;
  call.payload = std::move(payload);
  call.rx = std::move(rx);
  call.deadline_it = deadlines_.emplace(deadline, id);
  Result<Conn*> conn = ConnectTo(address);
  if (!conn.ok()) return CompleteCall(id, conn.status());
  call.conn_id = (*conn)->id;
  if ((*conn)->state == ConnState::kReady) {
    SendRequest(**conn, call);
  } else {
    (*conn)->waiting.push_back(id);
  }
}

void Core::SendRequest(Conn& conn, PendingCall& call) {
  auto send = std::make_unique<SendOp>();
  const HeaderBytes frame =
      EncodeFrameHeader(call.opcode, call.id, call.payload);
  send->header.assign(frame.begin(), frame.end());
  send->payload = std::move(call.payload);
  if (Status s = Sign(conn, kRequestAmId, send->header, send->payload);
      !s.ok()) {
    return CompleteCall(call.id, std::move(s));
  }
  Add(counters_.requests_sent);
  Add(counters_.bytes_sent, send->header.size() + send->payload.size());
  conn.calls.insert(call.id);
  const uint64_t id = call.id;
  send->on_done = [this, id](Status s) {
    auto it = calls_.find(id);
    if (it == calls_.end()) return;
    it->second.send = nullptr;
    if (!s.ok()) CompleteCall(id, std::move(s));
  };
  SendOp* op =
      SendAm(conn, kRequestAmId, std::move(send), UCP_AM_SEND_FLAG_EAGER);
  if (auto it = calls_.find(id); it != calls_.end()) it->second.send = op;
}

ucs_status_t Core::OnReplyAm(void* arg, const void* header,
                             size_t header_length, void* data, size_t length,
                             const ucp_am_recv_param_t* param) {
  Core* core = static_cast<Core*>(arg);
  ucs_status_t drop = UCS_OK;
  Conn* conn = core->ReadyConnOf(param, "reply", &drop);
  if (conn == nullptr) return drop;
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  const std::span<const std::byte> hdr(static_cast<const std::byte*>(header),
                                       header_length);
  Add(core->counters_.bytes_received, header_length + (rndv ? 0 : length));
  const std::optional<std::span<const std::byte>> bare =
      core->CheckMac(*conn, kReplyAmId, hdr, {});
  if (!bare) {
    core->HandleMalformed(*conn, hdr,
                          Status::ProtocolError("reply with a bad MAC"),
                          /*answer=*/false);
    return drop;
  }
  conn->silent_deadlines = 0;
  Result<FramedHeader> frame =
      DecodeFramedHeader(*bare, core->options_.max_reply_head_bytes);
  if (frame.ok() && (frame->frame.opcode & kResponseBit) == 0) {
    frame = Status::ProtocolError("reply without the response bit");
  }
  if (!frame.ok()) {
    core->HandleMalformed(*conn, hdr, frame.status(), /*answer=*/false);
    return drop;
  }
  auto it = core->calls_.find(frame->frame.request_id);
  if (it == core->calls_.end() || it->second.conn_id != conn->id ||
      it->second.recv != nullptr) {
    return drop;  // late (the call timed out) or unknown: not ours to keep
  }
  PendingCall& call = it->second;
  const uint64_t id = call.id;
  if (frame->frame.opcode == kErrorOpcode) {
    Status s = DecodeError(frame->head);
    if (s.ok()) s = Status::ProtocolError("peer sent an OK error reply");
    core->CompleteCall(id, std::move(s));
    return drop;
  }
  if (frame->frame.opcode != (call.opcode | kResponseBit)) {
    core->CompleteCall(id, Status::ProtocolError("reply to another opcode"));
    core->HandleMalformed(*conn, hdr, Status::ProtocolError("wrong opcode"),
                          /*answer=*/false);
    return drop;
  }
  if (length > core->options_.max_reply_data_bytes) {
    core->CompleteCall(
        id, Status::ProtocolError("reply data of " + std::to_string(length) +
                                  " B exceeds max_reply_data_bytes"));
    return drop;
  }
  std::shared_ptr<ReplyReceiver> rx = call.rx;
  Result<std::vector<std::span<std::byte>>> dst =
      rx->OnReplyHead(frame->head, length);
  if (!dst.ok()) {
    core->CompleteCall(id, dst.status());
    return drop;
  }
  uint64_t room = 0;
  for (const auto& d : *dst) room += d.size();
  if (room != length) {
    core->CompleteCall(
        id, Status::InvalidArgument(
                "OnReplyHead returned " + std::to_string(room) +
                " B of buffers for " + std::to_string(length) + " B of data"));
    return drop;
  }
  if (length == 0) {
    core->CompleteCall(id, Status::OK());
    return UCS_OK;
  }
  if (!rndv) {  // eager: one copy out of UCX's buffer
    const auto* from = static_cast<const std::byte*>(data);
    for (const auto& d : *dst) {
      std::memcpy(d.data(), from, d.size());
      from += d.size();
    }
    core->CompleteCall(id, Status::OK());
    return UCS_OK;
  }
  TIERKV_SYNC_POINT("PeerTransport::RendezvousReceive");
  auto op = std::make_unique<RecvOp>();
  op->core = core;
  op->call_id = id;
  for (const auto& d : Coalesce(std::move(*dst))) {
    op->iov.push_back(ucp_dt_iov_t{d.data(), d.size()});
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FIELD_DATATYPE;
  p.cb.recv_am = &Core::OnRecvDone;
  p.user_data = op.get();
  p.datatype = ucp_dt_make_iov();
  void* buffer = op->iov.data();
  size_t count = op->iov.size();
  if (op->iov.size() == 1) {  // contiguous, as SendAm sends one piece
    p.datatype = ucp_dt_make_contig(1);
    buffer = op->iov.front().buffer;
    count = op->iov.front().length;
  }
  const ucs_status_ptr_t r =
      ucp_am_recv_data_nbx(core->worker_, data, buffer, count, &p);
  if (r == nullptr) {
    Add(core->counters_.bytes_received, length);
    core->CompleteCall(id, Status::OK());
  } else if (UCS_PTR_IS_ERR(r)) {
    const Status why = Status::Unavailable("ucp_am_recv_data_nbx: " +
                                           UcsError(UCS_PTR_STATUS(r)));
    const uint64_t conn_id = conn->id;
    core->CompleteCall(id, why);
    // UCX keeps the data descriptor and the sender never hears an ack: the
    // endpoint cannot be trusted to make progress, so force-close it (which
    // also fails the sender's rendezvous send).
    core->RequestClose(conn_id, why, CloseMode::kForce);
  } else {
    op->request = r;
    call.recv = op.get();
    core->recvs_.insert(op.release());
  }
  return UCS_INPROGRESS;
}

void Core::OnRecvDone(void* request, ucs_status_t status, size_t length,
                      void* user) {
  RecvOp* op = static_cast<RecvOp*>(user);
  ucp_request_free(request);
  op->core->FinishRecv(op, status, length);
}

void Core::FinishRecv(RecvOp* op, ucs_status_t status, size_t length) {
  recvs_.erase(op);
  std::unique_ptr<RecvOp> owned(op);
  auto it = calls_.find(op->call_id);
  if (op->call_id == 0 || it == calls_.end()) return;  // abandoned
  it->second.recv = nullptr;
  if (it->second.abandoning) {
    --abandoning_;
    it->second.abandoning = false;
  }
  if (status == UCS_OK) Add(counters_.bytes_received, length);
  Status s = it->second.final_status.value_or(
      status == UCS_OK
          ? Status::OK()
          : Status::Unavailable("receiving the reply's data failed: " +
                                UcsError(status)));
  CompleteCall(op->call_id, std::move(s));
}

void Core::AbandonLater(PendingCall& call) {
  if (call.deadline_it != deadlines_.end()) deadlines_.erase(call.deadline_it);
  call.abandoning = true;
  ++abandoning_;
  call.deadline_it = deadlines_.emplace(
      Clock::now() + options_.stalled_receive_grace, call.id);
}

void Core::CompleteCall(uint64_t call_id, Status status) {
  auto it = calls_.find(call_id);
  if (it == calls_.end()) return;
  PendingCall& call = it->second;
  if (call.recv != nullptr) {
    // UCX may still write into the caller's buffers: report once it has
    // let go (FinishRecv).
    if (!call.final_status) call.final_status = status;
    return;
  }
  if (call.deadline_it != deadlines_.end()) deadlines_.erase(call.deadline_it);
  if (Conn* conn = FindConn(call.conn_id); conn != nullptr) {
    conn->calls.erase(call_id);
    std::erase(conn->waiting, call_id);
  }
  std::shared_ptr<ReplyReceiver> rx = std::move(call.rx);
  calls_.erase(it);
  if (status.ok()) Add(counters_.replies_received);
  rx->OnComplete(std::move(status));
}

// ------------------------------------------------------------ teardown

void Core::Teardown() {
  std::deque<std::function<void()>> late;
  {
    MutexLock lock(&mu_);
    accepting_ = false;
    late.swap(commands_);
  }
  for (auto& command : late) command();  // each sees shutting_down_
  if (worker_ != nullptr) {
    if (listener_ != nullptr) ucp_listener_destroy(listener_);
    listener_ = nullptr;
    // An endpoint with a send still in flight (e.g. a rendezvous reply
    // that a stalled peer never pulls) is closed with FORCE, which fails
    // those sends through their callbacks: UCX 1.13 must not destroy the
    // worker while an endpoint still holds protocol requests.
    std::set<uint64_t> sending;
    for (const SendOp* op : sends_) sending.insert(op->conn_id);
    std::vector<uint64_t> ids;
    for (const auto& [id, conn] : conns_) ids.push_back(id);
    for (uint64_t id : ids) {
      RequestClose(
          id, Status::Shutdown("peer transport closed"),
          sending.contains(id) ? CloseMode::kForce : CloseMode::kGraceful);
    }
    ProcessCloses();
    const Clock::time_point limit = Clock::now() + kShutdownDrainLimit;
    auto receiving = [this] {
      return std::any_of(recvs_.begin(), recvs_.end(),
                         [](const RecvOp* op) { return op->call_id != 0; });
    };
    while ((closes_in_flight_ > 0 || !sends_.empty() || receiving()) &&
           Clock::now() < limit) {
      ucp_worker_progress(worker_);
    }
  }
  // Destroy the worker while every op UCX may still hold is alive: it
  // purges the endpoints' queues and outstanding requests, running their
  // callbacks (FinishSend / FinishRecv finish and free those ops). Only
  // what UCX did not report is completed below, exactly once.
  if (worker_ != nullptr) {
    worker_destroying_ = true;
    ucp_worker_destroy(worker_);
    worker_ = nullptr;
    to_close_.clear();  // no endpoint is left to close
  }
  for (RecvOp* op : std::set<RecvOp*>(recvs_)) {
    recvs_.erase(op);
    std::unique_ptr<RecvOp> owned(op);
    if (auto it = calls_.find(op->call_id);
        op->call_id != 0 && it != calls_.end()) {
      it->second.recv = nullptr;
    }
  }
  for (SendOp* op : std::set<SendOp*>(sends_)) {
    sends_.erase(op);
    std::unique_ptr<SendOp> owned(op);
    if (owned->on_done)
      owned->on_done(Status::Shutdown("peer transport closed"));
  }
  // Calls that never reached an endpoint, and anything UCX did not finish.
  std::vector<uint64_t> calls;
  for (const auto& [id, call] : calls_) calls.push_back(id);
  for (uint64_t id : calls) {
    auto it = calls_.find(id);
    if (it == calls_.end()) continue;
    it->second.recv = nullptr;
    CompleteCall(id, it->second.final_status.value_or(
                         Status::Shutdown("peer transport closed")));
  }
  if (context_ != nullptr) ucp_cleanup(context_);
  worker_ = nullptr;
  context_ = nullptr;
}

PeerTransportCounters Core::Snapshot() const {
  auto get = [](const std::atomic<uint64_t>& c) {
    return c.load(std::memory_order_relaxed);
  };
  PeerTransportCounters c;
  c.requests_sent = get(counters_.requests_sent);
  c.requests_served = get(counters_.requests_served);
  c.replies_received = get(counters_.replies_received);
  c.bytes_sent = get(counters_.bytes_sent);
  c.bytes_received = get(counters_.bytes_received);
  c.reply_data_bytes_served = get(counters_.reply_data_bytes_served);
  c.errors_timeout = get(counters_.errors_timeout);
  c.errors_reset = get(counters_.errors_reset);
  c.errors_auth = get(counters_.errors_auth);
  c.errors_malformed = get(counters_.errors_malformed);
  c.abandoned_receives = get(counters_.abandoned_receives);
  c.connections_opened = get(counters_.connections_opened);
  c.live_connections = get(counters_.live_connections);
  c.replies_gathered = get(counters_.replies_gathered);
  return c;
}

std::vector<std::span<const std::byte>> Core::PrepareReplyData(
    std::vector<std::span<const std::byte>> data,
    std::function<void(Status)>& on_sent) {
  data = Coalesce(std::move(data));
  uint64_t total = 0;
  for (const auto& d : data) total += d.size();
  // Below the rendezvous threshold UCX copies the pieces into its eager
  // buffer anyway; an oversized reply is refused by SendReply.
  if (data.size() < 2 || total < options_.rendezvous_threshold_bytes ||
      total > options_.max_reply_data_bytes ||
      !gather_budget_->TryTake(total)) {
    return data;
  }
  auto gathered =
      std::make_shared<const GatheredData>(gather_budget_, data, total);
  Add(counters_.replies_gathered);
  on_sent = [gathered, on_sent = std::move(on_sent)](Status s) {
    if (on_sent) on_sent(std::move(s));
  };
  return {gathered->bytes()};
}

// ------------------------------------------------------------ responder

PeerResponder::PeerResponder(std::weak_ptr<Core> core, uint64_t connection_id,
                             uint16_t opcode, uint64_t request_id)
    : core_(std::move(core)),
      connection_id_(connection_id),
      opcode_(opcode),
      request_id_(request_id),
      answered_(false) {}

PeerResponder::PeerResponder(PeerResponder&& other) noexcept
    : core_(std::move(other.core_)),
      connection_id_(other.connection_id_),
      opcode_(other.opcode_),
      request_id_(other.request_id_),
      answered_(other.answered_) {
  other.answered_ = true;
}

PeerResponder& PeerResponder::operator=(PeerResponder&& other) noexcept {
  if (this != &other) {
    if (!answered_) ReplyError(Status::Internal("peer dropped the request"));
    core_ = std::move(other.core_);
    connection_id_ = other.connection_id_;
    opcode_ = other.opcode_;
    request_id_ = other.request_id_;
    answered_ = other.answered_;
    other.answered_ = true;
  }
  return *this;
}

PeerResponder::~PeerResponder() {
  if (!answered_) ReplyError(Status::Internal("peer dropped the request"));
}

void PeerResponder::Reply(std::vector<std::byte> head) {
  ReplyWithData(std::move(head), {}, nullptr);
}

void PeerResponder::ReplyWithData(std::vector<std::byte> head,
                                  std::vector<std::span<const std::byte>> data,
                                  std::function<void(Status)> on_sent) {
  answered_ = true;
  std::shared_ptr<Core> core = core_.lock();
  if (core != nullptr && data.size() > 1) {
    data = core->PrepareReplyData(std::move(data), on_sent);
  }
  auto command = [core_ptr = core.get(), conn = connection_id_, op = opcode_,
                  req = request_id_, head = std::move(head),
                  data = std::move(data), on_sent]() mutable {
    core_ptr->SendReply(conn, op, req, /*is_error=*/false, std::move(head),
                        std::move(data), std::move(on_sent));
  };
  if (core == nullptr || !core->Post(std::move(command))) {
    if (on_sent) on_sent(Status::Shutdown("peer transport closed"));
  }
}

void PeerResponder::ReplyError(const Status& status) {
  answered_ = true;
  std::shared_ptr<Core> core = core_.lock();
  if (core == nullptr) return;
  const Status s =
      status.ok() ? Status::Internal("ReplyError with an OK status") : status;
  core->Post([core_ptr = core.get(), conn = connection_id_, op = opcode_,
              req = request_id_, body = EncodeError(s)]() mutable {
    core_ptr->SendReply(conn, op, req, /*is_error=*/true, std::move(body), {},
                        nullptr);
  });
}

// ------------------------------------------------------------ transport

Result<std::unique_ptr<PeerTransport>> PeerTransport::Open(
    const PeerTransportOptions& options, RequestHandler handler) {
  TIERKV_RETURN_IF_ERROR(options.Validate());
  auto core = std::make_shared<Core>(options, std::move(handler));
  Result<std::string> bound = core->Start();
  if (!bound.ok()) return bound.status();
  return std::unique_ptr<PeerTransport>(
      new PeerTransport(std::move(core), std::move(*bound)));
}

PeerTransport::PeerTransport(std::shared_ptr<Core> core,
                             std::string listen_address)
    : core_(std::move(core)), listen_address_(std::move(listen_address)) {}

PeerTransport::~PeerTransport() { core_->Stop(); }

void PeerTransport::Shutdown() { core_->Stop(); }

const std::string& PeerTransport::node_id() const {
  return core_->options().node_id;
}

void PeerTransport::Call(std::string_view address, uint16_t opcode,
                         std::vector<std::byte> payload,
                         Clock::time_point deadline,
                         std::shared_ptr<ReplyReceiver> receiver) {
  Core* core = core_.get();
  const bool posted =
      core->Post([core, address = std::string(address), opcode,
                  payload = std::move(payload), deadline, receiver]() mutable {
        core->StartCall(std::move(address), opcode, std::move(payload),
                        deadline, std::move(receiver));
      });
  if (!posted) receiver->OnComplete(Status::Shutdown("peer transport closed"));
}

namespace {

// Gathers a reply into memory for CallAndWait.
class GatheringReceiver : public ReplyReceiver {
 public:
  Result<std::vector<std::span<std::byte>>> OnReplyHead(
      std::span<const std::byte> head, uint64_t data_bytes) override {
    reply_.head.assign(head.begin(), head.end());
    reply_.data.resize(data_bytes);
    std::vector<std::span<std::byte>> dst;
    if (data_bytes > 0) dst.emplace_back(reply_.data);
    return dst;
  }
  void OnComplete(Status status) override {
    MutexLock lock(&mu_);
    status_ = std::move(status);
    done_ = true;
    cv_.SignalAll();
  }
  Result<PeerReply> Wait() {
    MutexLock lock(&mu_);
    while (!done_) cv_.Wait(&mu_);
    if (!status_.ok()) return status_;
    return std::move(reply_);
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool done_ GUARDED_BY(mu_) = false;
  Status status_ GUARDED_BY(mu_);
  PeerReply reply_;  // written on the progress thread before OnComplete
};

}  // namespace

Result<PeerReply> PeerTransport::CallAndWait(
    std::string_view address, uint16_t opcode, std::vector<std::byte> payload,
    std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) timeout = core_->options().default_deadline;
  auto receiver = std::make_shared<GatheringReceiver>();
  Call(address, opcode, std::move(payload), Clock::now() + timeout, receiver);
  return receiver->Wait();
}

void PeerTransport::Disconnect(std::string_view address) {
  Core* core = core_.get();
  core->Post(
      [core, address = std::string(address)] { core->ForgetAddress(address); });
}

PeerTransportCounters PeerTransport::counters() const {
  return core_->Snapshot();
}

void PeerTransport::TEST_SendRaw(std::string_view address, unsigned am_id,
                                 std::vector<std::byte> header,
                                 std::vector<std::byte> data, bool sign) {
  Core* core = core_.get();
  core->Post([core, address = std::string(address), am_id,
              header = std::move(header), data = std::move(data),
              sign]() mutable {
    core->SendRaw(address, am_id, std::move(header), std::move(data), sign);
  });
}

}  // namespace tierkv::transport::peer
