// PeerServeStall: parsing TIERKV_TEST_STALL_PEER_SERVE, holding requests,
// and the FIFO wait (see peer_serve_stall.h). Compiled to nothing without
// TIERKV_SYNC_POINTS.
#include "daemon/cluster/peer_serve_stall.h"

#ifdef TIERKV_SYNC_POINTS

#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "daemon/cluster/fetch_protocol.h"

namespace tierkv::daemon::cluster {

using transport::peer::PeerRequest;
using transport::peer::PeerResponder;

Result<PeerServeStallSpec> ParsePeerServeStall(const std::string& value) {
  const auto bad = [&](const std::string& why) {
    return Status::InvalidArgument(std::string(kPeerServeStallEnv) + "='" +
                                   value + "': " + why +
                                   " (expected <n>:<fifo path>)");
  };
  const size_t colon = value.find(':');
  if (colon == std::string::npos) return bad("no ':'");
  PeerServeStallSpec spec;
  const char* first = value.data();
  const char* last = value.data() + colon;
  auto [end, ec] = std::from_chars(first, last, spec.nth_fetch);
  if (first == last || ec != std::errc() || end != last ||
      spec.nth_fetch == 0) {
    return bad("n is not a number in [1, 2^32)");
  }
  spec.fifo_path = value.substr(colon + 1);
  if (spec.fifo_path.empty()) return bad("empty FIFO path");
  struct stat st {};
  if (::stat(spec.fifo_path.c_str(), &st) != 0) {
    return bad(std::string("cannot stat the FIFO: ") + std::strerror(errno));
  }
  if (!S_ISFIFO(st.st_mode)) return bad("not a FIFO (create it with mkfifo)");
  return spec;
}

Result<std::optional<PeerServeStallSpec>> PeerServeStallFromEnvironment() {
  const char* value = std::getenv(kPeerServeStallEnv);
  if (value == nullptr) return std::optional<PeerServeStallSpec>();
  auto spec = ParsePeerServeStall(value);
  if (!spec.ok()) return spec.status();
  return std::optional<PeerServeStallSpec>(std::move(spec).value());
}

Result<std::unique_ptr<PeerServeStall>> PeerServeStall::Start(
    PeerServeStallSpec spec, transport::peer::RequestHandler serve) {
  const int stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd < 0) {
    return Status::IOError(std::string(kPeerServeStallEnv) +
                           ": eventfd: " + std::strerror(errno));
  }
  spdlog::warn(
      "{} is set: TEST-ONLY FAULT INJECTION, peer FETCH {} and those after "
      "it will be held until FIFO {} is written. Never set this in "
      "production.",
      kPeerServeStallEnv, spec.nth_fetch, spec.fifo_path);
  return std::unique_ptr<PeerServeStall>(
      new PeerServeStall(std::move(spec), std::move(serve), stop_fd));
}

PeerServeStall::PeerServeStall(PeerServeStallSpec spec,
                               transport::peer::RequestHandler serve,
                               int stop_fd)
    : spec_(std::move(spec)),
      serve_(std::move(serve)),
      stop_fd_(stop_fd),
      thread_([this] { Run(); }) {}

PeerServeStall::~PeerServeStall() {
  std::deque<HeldRequest> held;
  {
    MutexLock lock(&mu_);
    phase_ = Phase::kStopped;
    held = std::move(held_);
  }
  cv_.SignalAll();
  const uint64_t one = 1;
  (void)!::write(stop_fd_, &one, sizeof(one));
  for (HeldRequest& h : held) {
    h.responder.ReplyError(Status::Unavailable("this node is shutting down"));
  }
  thread_.join();
  ::close(stop_fd_);
}

void PeerServeStall::Handle(const PeerRequest& request,
                            PeerResponder responder) {
  {
    MutexLock lock(&mu_);
    bool hold = phase_ == Phase::kHolding;
    if (phase_ == Phase::kCounting && request.opcode == kFetchOpcode &&
        ++fetches_ == spec_.nth_fetch) {
      phase_ = Phase::kHolding;
      hold = true;
      cv_.SignalAll();
    }
    if (hold) {
      held_.push_back({std::string(request.peer_node_id), request.opcode,
                       std::vector<std::byte>(request.payload.begin(),
                                              request.payload.end()),
                       std::move(responder)});
      return;
    }
  }
  serve_(request, std::move(responder));
}

void PeerServeStall::Run() {
  {
    MutexLock lock(&mu_);
    while (phase_ == Phase::kCounting) cv_.Wait(&mu_);
    if (phase_ == Phase::kStopped) return;
  }
  if (!AwaitRelease()) return;
  // Served in arrival order; a request held meanwhile joins the queue, and
  // the stall lets requests pass only once the queue is empty.
  for (;;) {
    std::deque<HeldRequest> batch;
    {
      MutexLock lock(&mu_);
      if (phase_ == Phase::kStopped) return;  // the destructor answers
      if (held_.empty()) {
        phase_ = Phase::kReleased;
        return;
      }
      batch = std::move(held_);
      held_.clear();
    }
    for (HeldRequest& h : batch) Serve(h);
  }
}

bool PeerServeStall::AwaitRelease() {
  spdlog::warn("{}: holding peer FETCH {} until {} is written",
               kPeerServeStallEnv, spec_.nth_fetch, spec_.fifo_path);
  // Non-blocking, so the stop eventfd is watched from the start; Linux
  // reports no hang-up on it until a writer has come and gone.
  const int fd =
      ::open(spec_.fifo_path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    spdlog::error("{}: cannot open {}: {}; not stalling", kPeerServeStallEnv,
                  spec_.fifo_path, std::strerror(errno));
    return true;
  }
  bool released = false;
  bool stopped = false;
  while (!released && !stopped) {
    pollfd fds[2] = {{.fd = fd, .events = POLLIN, .revents = 0},
                     {.fd = stop_fd_, .events = POLLIN, .revents = 0}};
    if (::poll(fds, 2, /*timeout=*/-1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("{}: poll: {}; releasing", kPeerServeStallEnv,
                    std::strerror(errno));
      break;
    }
    if (fds[1].revents != 0) {
      stopped = true;
    } else if (fds[0].revents != 0) {
      char byte;
      const ssize_t n = ::read(fd, &byte, 1);  // a byte, or 0: EOF
      released = n >= 0 || (errno != EAGAIN && errno != EINTR);
    }
  }
  ::close(fd);
  if (stopped) return false;
  spdlog::warn("{}: released the held peer requests", kPeerServeStallEnv);
  return true;
}

void PeerServeStall::Serve(HeldRequest& held) {
  const PeerRequest request{.peer_node_id = held.peer_node_id,
                            .opcode = held.opcode,
                            .payload = held.payload};
  serve_(request, std::move(held.responder));
}

}  // namespace tierkv::daemon::cluster

#endif  // TIERKV_SYNC_POINTS
