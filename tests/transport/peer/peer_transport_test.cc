// PeerTransport over real UCX on loopback: two transports in this process,
// or this binary re-executed as a peer process that a test can SIGKILL or
// SIGSTOP (PeerChildProcess.Serve below). UCX_TLS is forced through
// Options::ucx_settings (scaleout.md §5d).
#include "transport/peer/peer_transport.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/sync_points.h"
#include "tests/testing/temp_dir.h"
#include "transport/frame.h"
#include "transport/peer/cluster_secret.h"
#include "transport/peer/peer_handshake.h"
#include "transport/peer/peer_message.h"

extern char** environ;

#if defined(__SANITIZE_THREAD__)
#define TIERKV_TEST_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TIERKV_TEST_UNDER_TSAN 1
#endif
#endif
#ifndef TIERKV_TEST_UNDER_TSAN
#define TIERKV_TEST_UNDER_TSAN 0
#endif

namespace tierkv::transport::peer {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint16_t kEcho = 1;       // replies with the payload as head
constexpr uint16_t kBulk = 2;       // replies with head "bulk" + data
constexpr uint16_t kHold = 3;       // keeps the responder
constexpr uint16_t kFail = 4;       // replies NotFound
constexpr uint16_t kDrop = 5;       // drops the responder
constexpr uint16_t kChildBulk = 6;  // child: 64 MiB of pattern
constexpr uint64_t kChildBulkBytes = uint64_t{64} << 20;

// Latency bounds are multiplied by TIERKV_TEST_TIME_SCALE (default 1;
// sanitizer and loaded CI runs set it higher): they catch a call that waits
// for the wrong event, not a slow machine.
double TimeScale() {
  static const double scale = [] {
    const char* s = std::getenv("TIERKV_TEST_TIME_SCALE");
    const double v = s == nullptr ? 1.0 : std::atof(s);
    return v >= 1.0 ? v : 1.0;
  }();
  return scale;
}
milliseconds Scaled(milliseconds ms) {
  return milliseconds(static_cast<int64_t>(ms.count() * TimeScale()));
}

// Waits up to 10 s (scaled) for pred().
template <typename Pred>
bool Eventually(Pred pred) {
  const auto limit = Clock::now() + Scaled(milliseconds(10000));
  while (!pred()) {
    if (Clock::now() > limit) return pred();
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

#if TIERKV_TEST_UNDER_TSAN
// UCX's memory hooks (libucm patches mmap/madvise/...) re-enter
// ThreadSanitizer's interceptors and crash it when a thread exits (SIGSEGV
// in __tsan::MutexPreReadLock under ucm_madvise). They only serve UCX's
// registration cache, which TCP and shared memory do not use. libucm reads
// its settings when it is loaded, before any code here runs, so the binary
// re-executes itself once with them switched off (children inherit them).
const bool kUcxHooksOff = [] {
  if (std::getenv("UCX_MEM_MMAP_HOOK_MODE") != nullptr) return true;
  ::setenv("UCX_MEM_MMAP_HOOK_MODE", "none", 1);
  ::setenv("UCX_MEM_MALLOC_HOOKS", "no", 1);
  ::setenv("UCX_MEM_EVENTS", "no", 1);
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string arg; std::getline(f, arg, '\0');) args.push_back(arg);
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  if (!args.empty()) ::execv("/proc/self/exe", argv.data());
  return false;  // exec failed: run as is
}();
#endif

std::vector<std::byte> Secret(char fill) {
  return std::vector<std::byte>(32, static_cast<std::byte>(fill));
}

std::vector<std::byte> Bytes(std::string_view s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return std::vector<std::byte>(p, p + s.size());
}

std::string Text(std::span<const std::byte> b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

std::byte Pattern(uint64_t i) {
  return static_cast<std::byte>((i * 131 + (i >> 12)) & 0xff);
}

PeerTransportOptions Options(std::string node, std::vector<std::byte> secret,
                             std::string tls = "tcp") {
  PeerTransportOptions o;
  o.node_id = std::move(node);
  o.cluster_name = "test-cluster";
  o.cluster_secret = std::move(secret);
  o.ucx_settings = {{"TLS", tls}, {"KEEPALIVE_INTERVAL", "2s"}};
  return o;
}

// Records and counts events under one lock, for tests to wait on.
class Events {
 public:
  void Signal(int* counter) {
    MutexLock lock(&mu_);
    ++*counter;
    cv_.SignalAll();
  }
  // Waits up to `limit` for *counter >= n.
  bool WaitFor(const int* counter, int n,
               milliseconds limit_ms = milliseconds(10000)) {
    MutexLock lock(&mu_);
    const auto limit = Clock::now() + limit_ms;
    while (*counter < n) {
      if (!cv_.WaitUntil(&mu_, limit)) return *counter >= n;
    }
    return true;
  }

 private:
  Mutex mu_;
  CondVar cv_;
};

// A server whose handler implements the opcodes above.
class Server {
 public:
  explicit Server(PeerTransportOptions options) {
    Result<std::unique_ptr<PeerTransport>> t = PeerTransport::Open(
        options, [this](const PeerRequest& req, PeerResponder r) {
          Handle(req, std::move(r));
        });
    EXPECT_OK(t);
    if (t.ok()) transport = std::move(*t);
  }
  ~Server() {
    {
      std::lock_guard lock(mu);
      held.clear();  // answered Internal, before the transport goes
    }
    transport.reset();
  }

  void Handle(const PeerRequest& req, PeerResponder r) {
    handled++;
    events.Signal(&handled_events);
    {
      std::lock_guard lock(mu);
      last_peer = std::string(req.peer_node_id);
    }
    switch (req.opcode) {
      case kEcho:
        return r.Reply(
            std::vector<std::byte>(req.payload.begin(), req.payload.end()));
      case kBulk: {
        std::vector<std::span<const std::byte>> pieces;
        for (const auto& p : bulk_pieces) pieces.emplace_back(p);
        return r.ReplyWithData(Bytes("bulk"), std::move(pieces),
                               [this](Status s) {
                                 sent_calls++;
                                 events.Signal(&sent_events);
                                 if (!sent_reported.exchange(true)) {
                                   sent.set_value(s);
                                 }
                               });
      }
      case kHold: {
        std::lock_guard lock(mu);
        held.push_back(std::move(r));
        return;
      }
      case kFail:
        return r.ReplyError(Status::NotFound("no such page"));
      default:
        return;  // kDrop: the destroyed responder answers Internal
    }
  }

  std::string address() const { return transport->listen_address(); }

  std::unique_ptr<PeerTransport> transport;
  std::atomic<int> handled{0};
  Events events;
  int handled_events = 0;  // guarded by events' lock
  int sent_events = 0;     // kBulk's on_sent runs; guarded by events' lock
  std::mutex mu;
  std::string last_peer;
  std::vector<PeerResponder> held;
  // kBulk's reply data: each piece a separate allocation (an IOV).
  std::vector<std::vector<std::byte>> bulk_pieces;
  std::promise<Status> sent;  // the first kBulk reply's on_sent
  std::atomic<bool> sent_reported{false};
  std::atomic<int> sent_calls{0};  // on_sent runs of kBulk replies
};

// Lands a reply's data in `pieces` spans of a buffer with guard bytes
// before, between and after them.
class GuardedReceiver : public ReplyReceiver {
 public:
  static constexpr size_t kGuard = 4096;
  static constexpr std::byte kGuardByte{0xA5};

  GuardedReceiver(uint64_t piece_bytes, size_t pieces)
      : piece_bytes_(piece_bytes),
        pieces_(pieces),
        buffer_(kGuard + pieces * (piece_bytes + kGuard), kGuardByte) {}

  Result<std::vector<std::span<std::byte>>> OnReplyHead(
      std::span<const std::byte> head, uint64_t data_bytes) override {
    head_ = Text(head);
    if (data_bytes != piece_bytes_ * pieces_) {
      return Status::InvalidArgument("unexpected data size");
    }
    std::vector<std::span<std::byte>> dst;
    for (size_t i = 0; i < pieces_; ++i) dst.push_back(Piece(i));
    return dst;
  }
  void OnComplete(Status status) override { done_.set_value(status); }

  Status Wait() { return done_.get_future().get(); }
  std::span<std::byte> Piece(size_t i) {
    return std::span(buffer_).subspan(kGuard + i * (piece_bytes_ + kGuard),
                                      piece_bytes_);
  }
  // True when every byte outside the pieces still holds kGuardByte.
  bool GuardsIntact() const {
    for (size_t i = 0; i <= pieces_; ++i) {
      const size_t at = i * (piece_bytes_ + kGuard);
      for (size_t j = 0; j < kGuard; ++j) {
        if (buffer_[at + j] != kGuardByte) return false;
      }
    }
    return true;
  }
  const std::string& head() const { return head_; }

 private:
  const uint64_t piece_bytes_;
  const size_t pieces_;
  std::vector<std::byte> buffer_;
  std::string head_;
  std::promise<Status> done_;
};

class PeerTransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  PeerTransportOptions Opts(std::string node, char secret = 's') {
    return Options(std::move(node), Secret(secret), GetParam());
  }
  std::unique_ptr<PeerTransport> Client(char secret = 's') {
    Result<std::unique_ptr<PeerTransport>> t =
        PeerTransport::Open(Opts("client", secret), nullptr);
    EXPECT_OK(t);
    return t.ok() ? std::move(*t) : nullptr;
  }
};

TEST_P(PeerTransportTest, HandshakeThenRequestAndReply) {
  Server server(Opts("server"));
  ASSERT_NE(server.transport, nullptr);
  EXPECT_NE(server.address().find("127.0.0.1:"), std::string::npos);
  EXPECT_NE(server.address(), "127.0.0.1:0");
  auto client = Client();
  Result<PeerReply> r =
      client->CallAndWait(server.address(), kEcho, Bytes("hello"));
  ASSERT_OK(r);
  EXPECT_EQ(Text(r->head), "hello");
  EXPECT_TRUE(r->data.empty());
  {
    std::lock_guard lock(server.mu);
    EXPECT_EQ(server.last_peer, "client");
  }
  // The connection is reused.
  for (int i = 0; i < 20; ++i) {
    ASSERT_OK(
        client->CallAndWait(server.address(), kEcho, Bytes(std::to_string(i))));
  }
  const PeerTransportCounters c = client->counters();
  EXPECT_EQ(c.connections_opened, 1u);
  EXPECT_EQ(c.live_connections, 1u);
  EXPECT_EQ(c.requests_sent, 21u);
  EXPECT_EQ(c.replies_received, 21u);
  EXPECT_EQ(server.transport->counters().requests_served, 21u);
  EXPECT_EQ(server.transport->counters().live_connections, 1u);
}

TEST_P(PeerTransportTest, WrongSecretIsRefusedAndNothingIsServed) {
  Server server(Opts("server", 's'));
  auto client = Client(/*secret=*/'x');
  Result<PeerReply> r =
      client->CallAndWait(server.address(), kEcho, Bytes("hello"));
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied)
      << r.status().ToString();
  EXPECT_EQ(server.handled.load(), 0);
  EXPECT_EQ(server.transport->counters().requests_served, 0u);
  EXPECT_EQ(server.transport->counters().reply_data_bytes_served, 0u);
  EXPECT_EQ(client->counters().errors_auth, 1u);
  EXPECT_EQ(client->counters().live_connections, 0u);
  // The failure is remembered: the next call backs off without dialing.
  r = client->CallAndWait(server.address(), kEcho, Bytes("again"));
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(r.status().message().find("backed off"), std::string_view::npos);
}

TEST_P(PeerTransportTest, ServerRefusesClientThatIgnoresABadServerProof) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  testing::ScopedSyncPoints sync;
  sync.SetCallback("PeerTransport::VerifyServerProof", [](void* accepted) {
    *static_cast<bool*>(accepted) = true;
  });
  Server server(Opts("server", 's'));
  auto client = Client(/*secret=*/'x');
  Result<PeerReply> r =
      client->CallAndWait(server.address(), kEcho, Bytes("hello"));
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied)
      << r.status().ToString();
  EXPECT_EQ(server.handled.load(), 0);
  EXPECT_EQ(server.transport->counters().errors_auth, 1u);
  EXPECT_EQ(server.transport->counters().requests_served, 0u);
}

TEST_P(PeerTransportTest, RequestBeforeAuthenticationIsRefused) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  Events events;
  int failed = 0;
  testing::ScopedSyncPoints sync;
  sync.SetCallback("PeerTransport::HandshakeFailed",
                   [&](void*) { events.Signal(&failed); });
  Server server(Opts("server"));
  auto client = Client();
  const std::vector<std::byte> payload = Bytes("sneaky");
  const HeaderBytes frame = EncodeFrameHeader(kEcho, 1, payload);
  // Sent right behind the client's HELLO, before AUTH.
  client->TEST_SendRaw(server.address(), kRequestAmId,
                       std::vector<std::byte>(frame.begin(), frame.end()),
                       payload);
  ASSERT_TRUE(events.WaitFor(&failed, 1));
  EXPECT_EQ(server.handled.load(), 0);
  EXPECT_GE(server.transport->counters().errors_auth, 1u);
}

TEST_P(PeerTransportTest, BulkReplyLandsBitExactInRequesterChosenBuffer) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  Events events;
  int rendezvous = 0;
  testing::ScopedSyncPoints sync;
  sync.SetCallback("PeerTransport::RendezvousReceive",
                   [&](void*) { events.Signal(&rendezvous); });
  Server server(Opts("server"));
  const uint64_t size = uint64_t{4} << 20;
  server.bulk_pieces.emplace_back(size);
  for (uint64_t i = 0; i < size; ++i) server.bulk_pieces[0][i] = Pattern(i);
  auto client = Client();
  auto rx = std::make_shared<GuardedReceiver>(size, 1);
  client->Call(server.address(), kBulk, {}, Clock::now() + milliseconds(5000),
               rx);
  ASSERT_OK(rx->Wait());
  EXPECT_TRUE(events.WaitFor(&rendezvous, 1)) << "sent eagerly, not RNDV";
  EXPECT_EQ(rx->head(), "bulk");
  EXPECT_TRUE(std::equal(server.bulk_pieces[0].begin(),
                         server.bulk_pieces[0].end(), rx->Piece(0).begin()));
  EXPECT_TRUE(rx->GuardsIntact());
  // The replier hears when its memory is no longer needed.
  ASSERT_OK(server.sent.get_future().get());
  EXPECT_EQ(server.transport->counters().reply_data_bytes_served, size);
  EXPECT_GE(client->counters().bytes_received, size);
}

// Fills `server`'s kBulk reply with `pieces` separate pieces of `piece`
// bytes each (a pattern running across them). No piece ends where the next
// begins: each one's allocation reaches past it (an allocator may place
// equal blocks back to back, as TSan's does, and the transport joins pieces
// that continue one another).
void SetPatternPieces(Server& server, uint64_t piece, size_t pieces) {
  server.bulk_pieces.clear();
  uint64_t n = 0;
  for (size_t p = 0; p < pieces; ++p) {
    std::vector<std::byte>& v = server.bulk_pieces.emplace_back();
    v.reserve(piece + 4096);
    v.resize(piece);
    for (auto& b : v) b = Pattern(n++);
  }
}

// One kBulk call landing each piece in a separate, guarded buffer; expects
// every piece bit-exact and no byte written around them.
void ExpectPiecesArriveBitExact(PeerTransport& client, const Server& server) {
  const uint64_t piece = server.bulk_pieces.front().size();
  const size_t pieces = server.bulk_pieces.size();
  auto rx = std::make_shared<GuardedReceiver>(piece, pieces);
  client.Call(server.address(), kBulk, {}, Clock::now() + milliseconds(5000),
              rx);
  ASSERT_OK(rx->Wait());
  for (size_t p = 0; p < pieces; ++p) {
    ASSERT_TRUE(std::equal(server.bulk_pieces[p].begin(),
                           server.bulk_pieces[p].end(), rx->Piece(p).begin()))
        << "piece " << p;
  }
  EXPECT_TRUE(rx->GuardsIntact());
}

TEST_P(PeerTransportTest, ManyPiecesGoFromAnIovIntoScatteredBuffers) {
  Server server(Opts("server"));
  SetPatternPieces(server, 64 << 10, 64);
  auto client = Client();
  ExpectPiecesArriveBitExact(*client, server);
  ASSERT_OK(server.sent.get_future().get());
  // 4 MiB in 64 pieces: gathered into one buffer, sent contiguously.
  EXPECT_EQ(server.transport->counters().replies_gathered, 1u);
}

// Past reply_gather_budget_bytes the pieces go as an IOV, bit-exact too; a
// gathered reply's bytes return to the budget once sent.
TEST_P(PeerTransportTest, PiecesBeyondTheGatherBudgetGoAsAnIov) {
  const uint64_t piece = 64 << 10;
  const size_t pieces = 8;  // 512 KiB a reply: rendezvous
  PeerTransportOptions opts = Opts("server");
  opts.reply_gather_budget_bytes = piece * pieces;
  Server server(opts);
  SetPatternPieces(server, piece, pieces);
  auto client = Client();
  // The budget holds one reply: the second is gathered too once the
  // first one's send has completed (its buffer freed).
  ExpectPiecesArriveBitExact(*client, server);
  ASSERT_TRUE(
      server.events.WaitFor(&server.sent_events, 1, milliseconds(5000)));
  ExpectPiecesArriveBitExact(*client, server);
  EXPECT_EQ(server.transport->counters().replies_gathered, 2u);

  PeerTransportOptions small = Opts("server-small");
  small.reply_gather_budget_bytes = piece * pieces - 1;
  Server iov_server(small);
  SetPatternPieces(iov_server, piece, pieces);
  ExpectPiecesArriveBitExact(*client, iov_server);
  EXPECT_EQ(iov_server.transport->counters().replies_gathered, 0u);
}

TEST_P(PeerTransportTest, SmallDataGoesEagerlyIntoTheSameBuffers) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  Events events;
  int rendezvous = 0;
  testing::ScopedSyncPoints sync;
  sync.SetCallback("PeerTransport::RendezvousReceive",
                   [&](void*) { events.Signal(&rendezvous); });
  Server server(Opts("server"));
  server.bulk_pieces = {std::vector<std::byte>(100, std::byte{7}),
                        std::vector<std::byte>(100, std::byte{9})};
  auto client = Client();
  auto rx = std::make_shared<GuardedReceiver>(50, 4);
  client->Call(server.address(), kBulk, {}, Clock::now() + milliseconds(5000),
               rx);
  ASSERT_OK(rx->Wait());
  EXPECT_EQ(rx->Piece(1)[49], std::byte{7});
  EXPECT_EQ(rx->Piece(2)[0], std::byte{9});
  EXPECT_TRUE(rx->GuardsIntact());
  EXPECT_FALSE(events.WaitFor(&rendezvous, 1, milliseconds(0)));
}

TEST_P(PeerTransportTest, ErrorReplyCompletesTheCallWithThatStatus) {
  Server server(Opts("server"));
  auto client = Client();
  Result<PeerReply> r = client->CallAndWait(server.address(), kFail, {});
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), "no such page");
}

TEST_P(PeerTransportTest, DroppedResponderAnswersInternal) {
  Server server(Opts("server"));
  auto client = Client();
  Result<PeerReply> r = client->CallAndWait(server.address(), kDrop, {});
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST_P(PeerTransportTest, PeerThatNeverAnswersFailsAtTheDeadline) {
  Server server(Opts("server"));
  auto client = Client();
  ASSERT_OK(client->CallAndWait(server.address(), kEcho, {}));  // connected
  const milliseconds deadline(200);
  const auto start = Clock::now();
  Result<PeerReply> r =
      client->CallAndWait(server.address(), kHold, {}, deadline);
  const auto took = Clock::now() - start;
  EXPECT_EQ(r.status().code(), StatusCode::kBusy) << r.status().ToString();
  EXPECT_GE(took, deadline);
  EXPECT_LT(took, deadline + Scaled(milliseconds(1000)));
  EXPECT_EQ(client->counters().errors_timeout, 1u);
  // The late reply is dropped; the connection keeps serving. (The deadline
  // says nothing about whether the handler ran yet: wait for it.)
  ASSERT_TRUE(server.events.WaitFor(&server.handled_events, 2));
  {
    std::lock_guard lock(server.mu);
    ASSERT_EQ(server.held.size(), 1u);
    server.held[0].Reply(Bytes("late"));
  }
  Result<PeerReply> next =
      client->CallAndWait(server.address(), kEcho, Bytes("next"));
  ASSERT_OK(next);
  EXPECT_EQ(Text(next->head), "next");
}

TEST_P(PeerTransportTest, MalformedHeadersAreRefusedAndCloseTheEndpoint) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  Events events;
  int malformed = 0;
  testing::ScopedSyncPoints sync;
  sync.SetCallback("PeerTransport::MalformedMessage",
                   [&](void*) { events.Signal(&malformed); });
  PeerTransportOptions so = Opts("server");
  Server server(so);
  auto client = Client();
  ASSERT_OK(client->CallAndWait(server.address(), kEcho, {}));
  std::mt19937_64 rng(27);
  std::vector<std::vector<std::byte>> headers;
  // Random bytes; a frame with a bad checksum; a truncated frame; the
  // response bit in a request; an oversized announced payload.
  std::vector<std::byte> junk(32);
  for (auto& b : junk) b = static_cast<std::byte>(rng());
  headers.push_back(junk);
  const std::vector<std::byte> payload = Bytes("x");
  HeaderBytes frame = EncodeFrameHeader(kEcho, 77, payload);
  frame[24] ^= std::byte{1};
  headers.emplace_back(frame.begin(), frame.end());
  headers.emplace_back(frame.begin(), frame.begin() + 20);
  frame = EncodeFrameHeader(kEcho | kResponseBit, 78, payload);
  headers.emplace_back(frame.begin(), frame.end());
  ASSERT_EQ(headers.size(), so.max_malformed_messages + 1);
  for (auto& h : headers) {
    // Signed: past the MAC check, so that the frame decoder refuses them.
    client->TEST_SendRaw(server.address(), kRequestAmId, h, payload,
                         /*sign=*/true);
  }
  ASSERT_TRUE(events.WaitFor(&malformed, static_cast<int>(headers.size())));
  EXPECT_EQ(server.handled.load(), 1);
  EXPECT_EQ(server.transport->counters().errors_malformed, headers.size());
  // The server closed the endpoint; after forgetting the failure the client
  // reconnects and is served again.
  client->Disconnect(server.address());
  Result<PeerReply> r =
      client->CallAndWait(server.address(), kEcho, Bytes("ok"));
  ASSERT_OK(r);
  EXPECT_EQ(Text(r->head), "ok");
}

TEST_P(PeerTransportTest, MessagesWithoutAValidMacAreRefused) {
  Server server(Opts("server"));
  auto client = Client();
  ASSERT_OK(client->CallAndWait(server.address(), kEcho, {}));
  const std::vector<std::byte> payload = Bytes("forged");
  const HeaderBytes frame = EncodeFrameHeader(kEcho, 4242, payload);
  const std::vector<std::byte> bare(frame.begin(), frame.end());
  // A well-formed request frame without a MAC, and with a wrong one.
  client->TEST_SendRaw(server.address(), kRequestAmId, bare, payload);
  std::vector<std::byte> wrong = bare;
  wrong.resize(bare.size() + kMacBytes, std::byte{0x5A});
  client->TEST_SendRaw(server.address(), kRequestAmId, wrong, payload);
  // A forged reply: refused before its request id is even looked up.
  const std::vector<std::byte> reply =
      EncodeFramedHeader(kEcho | kResponseBit, 1, Bytes("r"));
  client->TEST_SendRaw(server.address(), kReplyAmId, reply, {});
  ASSERT_TRUE(Eventually(
      [&] { return server.transport->counters().errors_malformed >= 3; }));
  EXPECT_EQ(server.transport->counters().errors_malformed, 3u);
  EXPECT_EQ(server.handled.load(), 1) << "a request without a MAC was served";
  // The same frame, signed with the session key, is served.
  client->TEST_SendRaw(server.address(), kRequestAmId, bare, payload,
                       /*sign=*/true);
  ASSERT_TRUE(server.events.WaitFor(&server.handled_events, 2));
  // Still authenticated and serving (3 <= max_malformed_messages).
  Result<PeerReply> r =
      client->CallAndWait(server.address(), kEcho, Bytes("still"));
  ASSERT_OK(r);
  EXPECT_EQ(Text(r->head), "still");
  EXPECT_EQ(server.transport->counters().errors_malformed, 3u);
  EXPECT_EQ(client->counters().errors_malformed, 0u);
}

// 0x7FFF | kResponseBit is kErrorOpcode: such a request could never be
// answered unambiguously, so neither side accepts it.
TEST_P(PeerTransportTest, Opcode7FFFIsRefusedOnBothSides) {
  Server server(Opts("server"));
  auto client = Client();
  ASSERT_OK(client->CallAndWait(server.address(), kEcho, {}));
  EXPECT_EQ(client->CallAndWait(server.address(), 0x7FFF, {}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(client->CallAndWait(server.address(), 0x8001, {}).status().code(),
            StatusCode::kInvalidArgument);
  const std::vector<std::byte> payload = Bytes("p");
  const HeaderBytes frame = EncodeFrameHeader(0x7FFF, 4243, payload);
  client->TEST_SendRaw(server.address(), kRequestAmId,
                       std::vector<std::byte>(frame.begin(), frame.end()),
                       payload, /*sign=*/true);
  ASSERT_TRUE(Eventually(
      [&] { return server.transport->counters().errors_malformed >= 1; }));
  EXPECT_EQ(server.handled.load(), 1);
  ASSERT_OK(client->CallAndWait(server.address(), kEcho, {}));
  EXPECT_EQ(server.transport->counters().errors_malformed, 1u);
}

TEST_P(PeerTransportTest, OutstandingRequestsPerConnectionAreCapped) {
  PeerTransportOptions so = Opts("server");
  so.max_outstanding_requests_per_connection = 2;
  Server server(so);
  auto client = Client();
  std::vector<std::shared_ptr<GuardedReceiver>> holds;
  for (int i = 0; i < 2; ++i) {
    holds.push_back(std::make_shared<GuardedReceiver>(0, 0));
    client->Call(server.address(), kHold, {},
                 Clock::now() + milliseconds(60000), holds.back());
  }
  ASSERT_TRUE(server.events.WaitFor(&server.handled_events, 2));
  Result<PeerReply> r =
      client->CallAndWait(server.address(), kEcho, {}, milliseconds(30000));
  EXPECT_EQ(r.status().code(), StatusCode::kBusy) << r.status().ToString();
  EXPECT_NE(r.status().message().find("outstanding"), std::string_view::npos)
      << r.status().ToString();
  EXPECT_EQ(server.handled.load(), 2);
  {
    std::lock_guard lock(server.mu);
    for (auto& h : server.held) h.Reply(Bytes("done"));
    server.held.clear();
  }
  for (auto& h : holds) EXPECT_OK(h->Wait());
  ASSERT_OK(client->CallAndWait(server.address(), kEcho, Bytes("again")));
}

TEST_P(PeerTransportTest, ConcurrentCallsFromManyThreadsAllComplete) {
  Server server(Opts("server"));
  const uint64_t size = 256 << 10;
  server.bulk_pieces.emplace_back(size);
  for (uint64_t i = 0; i < size; ++i) server.bulk_pieces[0][i] = Pattern(i);
  auto client = Client();
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        if (i % 5 == 0) {  // every fifth call fetches bulk data
          auto rx = std::make_shared<GuardedReceiver>(size, 1);
          client->Call(server.address(), kBulk, {},
                       Clock::now() + milliseconds(5000), rx);
          if (rx->Wait().ok() && rx->GuardsIntact() &&
              std::equal(server.bulk_pieces[0].begin(),
                         server.bulk_pieces[0].end(), rx->Piece(0).begin())) {
            ok++;
          }
          continue;
        }
        const std::string text = std::to_string(t) + ":" + std::to_string(i);
        Result<PeerReply> r = client->CallAndWait(
            server.address(), kEcho, Bytes(text), milliseconds(5000));
        if (r.ok() && Text(r->head) == text) ok++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 200);
  EXPECT_EQ(client->counters().connections_opened, 1u);
}

TEST_P(PeerTransportTest, ServerClosesAClientThatNeverSaysHello) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  testing::ScopedSyncPoints sync;
  sync.SetCallback("PeerTransport::SendHello",
                   [](void* send) { *static_cast<bool*>(send) = false; });
  PeerTransportOptions so = Opts("server");
  so.handshake_timeout = milliseconds(100);
  Server server(so);
  PeerTransportOptions co = Opts("client");
  co.handshake_timeout = milliseconds(10000);
  Result<std::unique_ptr<PeerTransport>> client =
      PeerTransport::Open(co, nullptr);
  ASSERT_OK(client);
  const auto start = Clock::now();
  Result<PeerReply> r =
      (*client)->CallAndWait(server.address(), kEcho, {}, milliseconds(30000));
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().code(), StatusCode::kBusy) << "closed, not timed out";
  EXPECT_LT(Clock::now() - start, Scaled(milliseconds(5000)));
  EXPECT_EQ(server.transport->counters().errors_auth, 1u);
  EXPECT_EQ(server.handled.load(), 0);
}

TEST_P(PeerTransportTest, UnauthenticatedConnectionsAreCapped) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  testing::ScopedSyncPoints sync;
  std::atomic<bool> stall{true};
  sync.SetCallback("PeerTransport::SendHello", [&](void* send) {
    *static_cast<bool*>(send) = !stall.load();
  });
  PeerTransportOptions so = Opts("server");
  so.max_unauthenticated_connections = 1;
  Server server(so);
  auto stalled = Client();
  auto rx = std::make_shared<GuardedReceiver>(0, 0);
  // Occupies the one unauthenticated slot until its deadline.
  stalled->Call(server.address(), kEcho, {}, Clock::now() + milliseconds(3000),
                rx);
  // A second client is turned away at once, while the first one holds it.
  auto second = Client();
  Status s = Status::OK();
  for (int attempt = 0; attempt < 50 && s.code() != StatusCode::kUnavailable;
       ++attempt) {
    // The first endpoint may reach the server after the second: retry
    // until the slot is held (each attempt reconnects).
    second->Disconnect(server.address());
    s = second->CallAndWait(server.address(), kEcho, {}, milliseconds(1000))
            .status();
  }
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_GE(server.transport->counters().errors_auth, 1u);
  stall = false;
}

TEST_P(PeerTransportTest, ClusterNameMismatchIsRefused) {
  Server server(Opts("server"));
  PeerTransportOptions o = Opts("client");
  o.cluster_name = "other-cluster";
  Result<std::unique_ptr<PeerTransport>> client =
      PeerTransport::Open(o, nullptr);
  ASSERT_OK(client);
  Result<PeerReply> r =
      (*client)->CallAndWait(server.address(), kEcho, Bytes("hi"));
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied)
      << r.status().ToString();
  EXPECT_EQ(server.handled.load(), 0);
}

TEST_P(PeerTransportTest, SizesAreBoundedOnBothSides) {
  PeerTransportOptions so = Opts("server");
  so.max_request_bytes = 1024;
  Server server(so);
  server.bulk_pieces.emplace_back(uint64_t{1} << 20);
  PeerTransportOptions co = Opts("client");
  co.max_request_bytes = 4096;
  co.max_reply_data_bytes = 512 << 10;
  Result<std::unique_ptr<PeerTransport>> made =
      PeerTransport::Open(co, nullptr);
  ASSERT_OK(made);
  PeerTransport& client = **made;
  // Over the caller's own bound: refused before sending.
  EXPECT_EQ(
      client.CallAndWait(server.address(), kEcho, std::vector<std::byte>(4097))
          .status()
          .code(),
      StatusCode::kInvalidArgument);
  // Over the server's bound: an error reply, and the handler never sees it.
  EXPECT_EQ(
      client.CallAndWait(server.address(), kEcho, std::vector<std::byte>(2048))
          .status()
          .code(),
      StatusCode::kProtocolError);
  EXPECT_EQ(server.handled.load(), 0);
  // A reply with more data than the caller accepts: refused, not received.
  EXPECT_EQ(client.CallAndWait(server.address(), kBulk, {}).status().code(),
            StatusCode::kProtocolError);
  // The replier hears that its data was not taken.
  EXPECT_FALSE(server.sent.get_future().get().ok());
  EXPECT_LT(client.counters().bytes_received, uint64_t{512} << 10);
}

TEST_P(PeerTransportTest, ReceiverThatRefusesTheDataCompletesWithItsError) {
  Server server(Opts("server"));
  server.bulk_pieces.emplace_back(uint64_t{1} << 20);
  auto client = Client();
  // Expects 1000 B: OnReplyHead refuses 1 MiB with InvalidArgument.
  auto rx = std::make_shared<GuardedReceiver>(1000, 1);
  client->Call(server.address(), kBulk, {}, Clock::now() + milliseconds(5000),
               rx);
  EXPECT_EQ(rx->Wait().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(rx->GuardsIntact());
  // The connection is still good.
  ASSERT_OK(client->CallAndWait(server.address(), kEcho, {}));
}

TEST_P(PeerTransportTest, UnreachablePeerFailsFastThenBacksOff) {
  // A port nothing listens on: open and close a transport to find one.
  std::string address;
  {
    Server gone(Opts("gone"));
    address = gone.address();
  }
  auto client = Client();
  const auto start = Clock::now();
  Result<PeerReply> r = client->CallAndWait(address, kEcho, {});
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable)
      << r.status().ToString();
  EXPECT_LT(Clock::now() - start, Scaled(milliseconds(1500)));
  r = client->CallAndWait(address, kEcho, {});
  EXPECT_NE(r.status().message().find("backed off"), std::string_view::npos)
      << r.status().ToString();
}

TEST_P(PeerTransportTest, ReconnectsOnNextUseAfterTheBackoff) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  Events events;
  int malformed = 0;
  testing::ScopedSyncPoints sync;
  sync.SetCallback("PeerTransport::MalformedMessage",
                   [&](void*) { events.Signal(&malformed); });
  PeerTransportOptions so = Opts("server");
  so.max_malformed_messages = 0;  // the first one closes the endpoint
  Server server(so);
  PeerTransportOptions co = Opts("client");
  co.reconnect_backoff_min = milliseconds(50);
  Result<std::unique_ptr<PeerTransport>> made =
      PeerTransport::Open(co, nullptr);
  ASSERT_OK(made);
  PeerTransport& client = **made;
  ASSERT_OK(client.CallAndWait(server.address(), kEcho, {}));
  client.TEST_SendRaw(server.address(), kRequestAmId,
                      std::vector<std::byte>(32), {});
  ASSERT_TRUE(events.WaitFor(&malformed, 1));
  // The server hung up; the client fails calls until its back-off ends.
  Status s = Status::OK();
  for (int i = 0; i < 100 && s.ok(); ++i) {
    s = client.CallAndWait(server.address(), kEcho, {}).status();
  }
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  // The back-off is wall-clock time (no injected clock yet): wait it out.
  std::this_thread::sleep_for(co.reconnect_backoff_min * 2);
  Result<PeerReply> r =
      client.CallAndWait(server.address(), kEcho, Bytes("back"));
  ASSERT_OK(r);
  EXPECT_EQ(Text(r->head), "back");
  EXPECT_EQ(client.counters().connections_opened, 2u);
}

TEST_P(PeerTransportTest,
       ClosingWithCallsOutstandingCompletesThemWithShutdown) {
  Server server(Opts("server"));
  auto client = Client();
  auto rx = std::make_shared<GuardedReceiver>(0, 0);
  client->Call(server.address(), kHold, {}, Clock::now() + milliseconds(10000),
               rx);
  ASSERT_TRUE(server.events.WaitFor(&server.handled_events, 1));
  client.reset();
  EXPECT_EQ(rx->Wait().code(), StatusCode::kShutdown);
}

TEST(PeerTransportOptions, ValidateNamesTheBadField) {
  PeerTransportOptions o = Options("n", Secret('s'));
  EXPECT_OK(o.Validate());
  o.node_id = "";
  EXPECT_NE(o.Validate().message().find("node_id"), std::string_view::npos);
  o = Options("n", std::vector<std::byte>(31));
  EXPECT_NE(o.Validate().message().find("cluster_secret"),
            std::string_view::npos);
  o = Options("n", Secret('s'));
  o.listen_address = "localhost";
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PeerTransport::Open(o, nullptr).status().code(),
            StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Tls, PeerTransportTest,
                         ::testing::Values("tcp", "sm,tcp"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), ',', '_');
                           return name;
                         });

// ------------------------------------------------------ a second process

constexpr char kChildEnv[] = "TIERKV_PEER_TEST_CHILD";  // the secret's path
constexpr char kChildFdEnv[] = "TIERKV_PEER_TEST_FD";   // where to say "ready"

// Not a test on its own: the body of the peer process the tests below
// start (this binary, re-executed with a filter). It serves kEcho, kHold
// and kChildBulk until it is killed.
TEST(PeerChildProcess, Serve) {
  const char* secret_path = std::getenv(kChildEnv);
  const char* fd_text = std::getenv(kChildFdEnv);
  if (secret_path == nullptr || fd_text == nullptr) {
    GTEST_SKIP() << "runs only as the child of the process tests";
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a crashed parent
  Result<std::vector<std::byte>> secret = ReadClusterSecretFile(secret_path);
  ASSERT_OK(secret);
  static std::vector<std::byte> bulk(kChildBulkBytes);
  for (uint64_t i = 0; i < bulk.size(); ++i) bulk[i] = Pattern(i);
  static std::mutex mu;
  static std::vector<PeerResponder> held;
  Result<std::unique_ptr<PeerTransport>> t = PeerTransport::Open(
      Options("child", *secret), [](const PeerRequest& req, PeerResponder r) {
        if (req.opcode == kEcho) {
          return r.Reply(
              std::vector<std::byte>(req.payload.begin(), req.payload.end()));
        }
        if (req.opcode == kChildBulk) {
          // The payload, if any, is the size wanted (<= kChildBulkBytes).
          uint64_t size = kChildBulkBytes;
          if (req.payload.size() == sizeof(size)) {
            std::memcpy(&size, req.payload.data(), sizeof(size));
          }
          return r.ReplyWithData(
              Bytes("bulk"),
              {std::span(bulk).first(std::min(size, kChildBulkBytes))},
              nullptr);
        }
        std::lock_guard lock(mu);
        held.push_back(std::move(r));
      });
  ASSERT_OK(t);
  const std::string line = (*t)->listen_address() + "\n";
  const int fd = std::atoi(fd_text);
  ASSERT_EQ(::write(fd, line.data(), line.size()),
            static_cast<ssize_t>(line.size()));
  ::close(fd);
  for (;;) ::pause();  // until the parent kills us
}

// This binary running PeerChildProcess.Serve, stopped by SIGKILL at the end.
class ChildPeer {
 public:
  explicit ChildPeer(const std::string& secret_path) {
    int fds[2];
    // CLOEXEC: only the child's copy of the write end (dup'd below by
    // posix_spawn's file actions, which clears the flag on the copy) may
    // outlive the spawn; no other child may inherit either end.
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    const int child_fd = fds[1] == 200 ? 201 : 200;
    std::vector<std::string> env_strings = {
        std::string(kChildEnv) + "=" + secret_path,
        std::string(kChildFdEnv) + "=" + std::to_string(child_fd)};
    std::vector<char*> envp;
    for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string self(4096, '\0');
    const ssize_t n =
        ::readlink("/proc/self/exe", self.data(), self.size() - 1);
    if (n <= 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      return;
    }
    self.resize(static_cast<size_t>(n));
    std::string filter = "--gtest_filter=PeerChildProcess.Serve";
    char* argv[] = {self.data(), filter.data(), nullptr};
    posix_spawn_file_actions_t actions;
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawn_file_actions_adddup2(&actions, fds[1], child_fd);
    if (::posix_spawn(&pid_, self.c_str(), &actions, nullptr, argv,
                      envp.data()) != 0) {
      pid_ = -1;
    }
    ::posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    // The child writes its address once it listens (10 s bound).
    pollfd p{fds[0], POLLIN, 0};
    std::string line;
    char c = 0;
    while (pid_ > 0 && ::poll(&p, 1, 10000) == 1 &&
           ::read(fds[0], &c, 1) == 1 && c != '\n') {
      line += c;
    }
    ::close(fds[0]);
    address_ = line;
  }
  ~ChildPeer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      Reap();
    }
  }
  void Kill() {
    ::kill(pid_, SIGKILL);
    Reap();
  }
  // Returns once the child is stopped (not merely signalled).
  void Stop() {
    ::kill(pid_, SIGSTOP);
    int status = 0;
    ::waitpid(pid_, &status, WUNTRACED);
  }
  const std::string& address() const { return address_; }

 private:
  void Reap() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  pid_t pid_ = -1;
  std::string address_;
};

class PeerProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    secret_path_ = dir_.File("cluster.key");
    {
      std::ofstream f(secret_path_);
      f << std::string(32, 'p');
    }
    ASSERT_EQ(::chmod(secret_path_.c_str(), 0600), 0);
    Result<std::unique_ptr<PeerTransport>> t =
        PeerTransport::Open(Options("parent", Secret('p')), nullptr);
    ASSERT_OK(t);
    client_ = std::move(*t);
  }

  testing::TempDir dir_;
  std::string secret_path_;
  std::unique_ptr<PeerTransport> client_;
};

// Holds the progress thread in OnReplyHead until the test lets it go, so
// that the holder dies between the reply's header and its data.
class PausingReceiver : public ReplyReceiver {
 public:
  Result<std::vector<std::span<std::byte>>> OnReplyHead(
      std::span<const std::byte>, uint64_t data_bytes) override {
    buffer_.resize(data_bytes);
    head_arrived_.set_value();
    resume_.get_future().wait();
    return std::vector<std::span<std::byte>>{std::span(buffer_)};
  }
  void OnComplete(Status status) override {
    completed_at_ = Clock::now();
    done_.set_value(status);
  }

  std::promise<void> head_arrived_;
  std::promise<void> resume_;
  std::promise<Status> done_;
  Clock::time_point completed_at_;
  std::vector<std::byte> buffer_;
};

class StatusReceiver : public ReplyReceiver {
 public:
  Result<std::vector<std::span<std::byte>>> OnReplyHead(
      std::span<const std::byte>, uint64_t) override {
    return std::vector<std::span<std::byte>>{};
  }
  void OnComplete(Status status) override {
    completed_at_ = Clock::now();
    done_.set_value(status);
  }
  std::promise<Status> done_;
  Clock::time_point completed_at_;
};

TEST_F(PeerProcessTest,
       KilledHolderFailsEveryOutstandingCallWithinHalfASecond) {
  ChildPeer child(secret_path_);
  ASSERT_FALSE(child.address().empty());
  ASSERT_OK(client_->CallAndWait(child.address(), kEcho, Bytes("up")));
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  auto held = std::make_shared<StatusReceiver>();
  client_->Call(child.address(), kHold, {}, deadline, held);
  auto bulk = std::make_shared<PausingReceiver>();
  client_->Call(child.address(), kChildBulk, {}, deadline, bulk);
  bulk->head_arrived_.get_future().wait();
  child.Kill();  // returns once the process is gone (reaped)
  const auto killed = Clock::now();
  bulk->resume_.set_value();
  const Status bulk_status = bulk->done_.get_future().get();
  const Status held_status = held->done_.get_future().get();
  EXPECT_FALSE(bulk_status.ok());
  EXPECT_FALSE(held_status.ok());
  EXPECT_NE(bulk_status.code(), StatusCode::kBusy) << "not the deadline";
  EXPECT_NE(held_status.code(), StatusCode::kBusy) << "not the deadline";
  EXPECT_LT(bulk->completed_at_ - killed, Scaled(milliseconds(3000)))
      << bulk_status.ToString();
  EXPECT_LT(held->completed_at_ - killed, Scaled(milliseconds(3000)))
      << held_status.ToString();
  EXPECT_GE(client_->counters().errors_reset, 1u);
  EXPECT_EQ(client_->counters().live_connections, 0u);
}

// The requester stalls (its progress thread held in OnReplyHead, as if
// SIGSTOPped) while the server's rendezvous reply waits for it to pull the
// data; the server then shuts down. Its on_sent must run exactly once, and
// nothing may touch the freed send (ASan catches a use-after-free).
TEST(PeerShutdown, RendezvousReplyInFlightToAStalledPeer) {
  Server server(Options("server", Secret('s')));
  server.bulk_pieces = {
      std::vector<std::byte>(uint64_t{1} << 20, std::byte{3})};
  Result<std::unique_ptr<PeerTransport>> client =
      PeerTransport::Open(Options("client", Secret('s')), nullptr);
  ASSERT_OK(client);
  auto bulk = std::make_shared<PausingReceiver>();
  (*client)->Call(server.address(), kBulk, {},
                  Clock::now() + milliseconds(60000), bulk);
  bulk->head_arrived_.get_future().wait();
  server.transport.reset();  // the reply is still in flight
  EXPECT_EQ(server.sent_calls.load(), 1);
  const Status sent = server.sent.get_future().get();
  EXPECT_FALSE(sent.ok()) << sent.ToString();
  bulk->resume_.set_value();
  const Status s = bulk->done_.get_future().get();
  EXPECT_FALSE(s.ok()) << s.ToString();
  client->reset();
  EXPECT_EQ(server.sent_calls.load(), 1);
}

TEST_F(PeerProcessTest, BulkFromAnotherProcessArrivesBitExact) {
  ChildPeer child(secret_path_);
  ASSERT_FALSE(child.address().empty());
  Result<PeerReply> r = client_->CallAndWait(child.address(), kChildBulk, {},
                                             milliseconds(10000));
  ASSERT_OK(r);
  ASSERT_EQ(r->data.size(), kChildBulkBytes);
  for (uint64_t i = 0; i < r->data.size(); ++i) {
    ASSERT_EQ(r->data[i], Pattern(i)) << i;
  }
}

TEST_F(PeerProcessTest, HolderStoppedMidRendezvousFailsAtTheDeadline) {
  ChildPeer child(secret_path_);
  ASSERT_FALSE(child.address().empty());
  ASSERT_OK(client_->CallAndWait(child.address(), kEcho, Bytes("up")));
  const milliseconds deadline(500);
  const auto start = Clock::now();
  auto bulk = std::make_shared<PausingReceiver>();
  client_->Call(child.address(), kChildBulk, {}, start + deadline, bulk);
  bulk->head_arrived_.get_future().wait();
  child.Stop();  // before the receiver asks for the data
  bulk->resume_.set_value();
  const Status s = bulk->done_.get_future().get();
  EXPECT_EQ(s.code(), StatusCode::kBusy) << s.ToString();
  EXPECT_GE(bulk->completed_at_ - start, deadline);
  EXPECT_LT(bulk->completed_at_ - start, deadline + Scaled(milliseconds(1000)));
  // The stalled endpoint was force-closed.
  EXPECT_EQ(client_->counters().live_connections, 0u);
  RecordProperty("abandoned_receives",
                 std::to_string(client_->counters().abandoned_receives));
}

TEST_F(PeerProcessTest, StoppedHolderFailsAtTheDeadline) {
  ChildPeer child(secret_path_);
  ASSERT_FALSE(child.address().empty());
  ASSERT_OK(client_->CallAndWait(child.address(), kEcho, Bytes("up")));
  child.Stop();
  const milliseconds deadline(300);
  const auto start = Clock::now();
  Result<PeerReply> r =
      client_->CallAndWait(child.address(), kEcho, Bytes("x"), deadline);
  const auto took = Clock::now() - start;
  EXPECT_EQ(r.status().code(), StatusCode::kBusy) << r.status().ToString();
  EXPECT_GE(took, deadline);
  EXPECT_LT(took, deadline + Scaled(milliseconds(1000)));
}

// A SIGSTOPped peer's kernel still acks, so neither TCP nor UCX's keepalive
// notices it: after 2 call deadlines with nothing from it, the connection
// is force-closed, and the back-off fails the next call at once instead of
// letting it wait out its deadline too.
TEST_F(PeerProcessTest, StoppedPeerIsClosedAfterSilentDeadlines) {
  PeerTransportOptions o = Options("parent2", Secret('p'));
  o.reconnect_backoff_min = milliseconds(60000);
  o.reconnect_backoff_max = milliseconds(60000);
  Result<std::unique_ptr<PeerTransport>> made = PeerTransport::Open(o, nullptr);
  ASSERT_OK(made);
  PeerTransport& client = **made;
  ChildPeer child(secret_path_);
  ASSERT_FALSE(child.address().empty());
  ASSERT_OK(client.CallAndWait(child.address(), kEcho, Bytes("up")));
  EXPECT_EQ(client.counters().live_connections, 1u);
  child.Stop();
  for (int i = 0; i < 2; ++i) {
    Result<PeerReply> r = client.CallAndWait(child.address(), kEcho, Bytes("x"),
                                             milliseconds(200));
    EXPECT_EQ(r.status().code(), StatusCode::kBusy) << r.status().ToString();
  }
  ASSERT_TRUE(
      Eventually([&] { return client.counters().live_connections == 0; }));
  const auto start = Clock::now();
  Result<PeerReply> r = client.CallAndWait(child.address(), kEcho, Bytes("y"),
                                           milliseconds(30000));
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable)
      << r.status().ToString();
  EXPECT_LT(Clock::now() - start, Scaled(milliseconds(2000)))
      << "should fail at once (back-off), not at the deadline";
  EXPECT_EQ(client.counters().errors_timeout, 2u);
}

TEST_P(PeerTransportTest, IdleTransportsUseNoCpu) {
  Server server(Opts("server"));
  auto client = Client();
  ASSERT_OK(client->CallAndWait(server.address(), kEcho, {}));
  auto cpu = [] {
    timespec ts{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return std::chrono::seconds(ts.tv_sec) +
           std::chrono::nanoseconds(ts.tv_nsec);
  };
  const auto before = cpu();
  // Measuring idleness takes wall time; nothing is synchronised by it.
  std::this_thread::sleep_for(milliseconds(500));
  const auto used = cpu() - before;
  // A busy-polling progress thread would burn ~500 ms; sanitizer runtimes
  // and a loaded machine add a little, never that much.
  EXPECT_LT(used, std::min(Scaled(milliseconds(100)), milliseconds(300)))
      << "busy polling?";
}

// Throughput and latency against a peer process, for comparison with
// `ucx_perftest -t ucp_am_bw` under the same UCX_TLS. Run by hand:
//   peer_tests --gtest_also_run_disabled_tests --gtest_filter='*Measure*'
TEST_F(PeerProcessTest, DISABLED_MeasureBulkThroughputAndLatency) {
  ChildPeer child(secret_path_);
  ASSERT_FALSE(child.address().empty());
  ASSERT_OK(client_->CallAndWait(child.address(), kEcho, Bytes("up")));
  std::vector<std::byte> buffer(kChildBulkBytes);
  for (uint64_t size : {uint64_t{64} << 10, uint64_t{1} << 20,
                        uint64_t{4} << 20, uint64_t{64} << 20}) {
    const int n =
        static_cast<int>(std::max<uint64_t>(20, (uint64_t{1} << 30) / size));
    std::vector<std::byte> want(sizeof(size));
    std::memcpy(want.data(), &size, sizeof(size));
    std::vector<double> us;
    const auto start = Clock::now();
    for (int i = 0; i < n; ++i) {
      struct Into : ReplyReceiver {
        std::span<std::byte> dst;
        std::promise<Status> done;
        Result<std::vector<std::span<std::byte>>> OnReplyHead(
            std::span<const std::byte>, uint64_t bytes) override {
          return std::vector<std::span<std::byte>>{dst.first(bytes)};
        }
        void OnComplete(Status s) override { done.set_value(s); }
      };
      auto rx = std::make_shared<Into>();
      rx->dst = std::span(buffer);
      const auto t0 = Clock::now();
      client_->Call(child.address(), kChildBulk, want, t0 + milliseconds(10000),
                    rx);
      ASSERT_OK(rx->done.get_future().get());
      us.push_back(
          std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    const double secs =
        std::chrono::duration<double>(Clock::now() - start).count();
    std::sort(us.begin(), us.end());
    std::printf(
        "reply %8llu B x %5d: %7.3f GiB/s  p50 %8.1f us  p99 %8.1f us\n",
        static_cast<unsigned long long>(size), n,
        static_cast<double>(size) * n / secs / (1 << 30), us[us.size() / 2],
        us[us.size() * 99 / 100]);
  }
}

}  // namespace
}  // namespace tierkv::transport::peer
