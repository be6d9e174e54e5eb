// UdsServer + UdsChannel without any tier code: an echo handler.
#include "transport/uds_server.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "transport/protocol.h"
#include "transport/uds_channel.h"

namespace tierkv::transport {
namespace {

class EchoHandler : public FrameHandler {
 public:
  void OnFrame(uint64_t, uint16_t opcode, std::span<const std::byte> payload,
               int /*fd*/, Responder responder) override {
    frames++;
    if (opcode == 2) return responder.Send({{}, memfd, false});  // a descriptor
    if (opcode == 3) {
      return responder.Send({EncodeError(Status::Busy("try later")), -1, true});
    }
    if (opcode == 4) {
      // Answered later, from another thread (as the daemon's workers do).
      later.emplace_back([r = std::move(responder),
                          body = std::vector<std::byte>(
                              payload.begin(), payload.end())]() mutable {
        r.Send({std::move(body), -1, false});
      });
      return;
    }
    if (opcode == 5) return;  // dropped: the Responder answers Internal
    if (opcode == 8) {        // "authenticates" the connection
      HandlerReply r{{}, -1, false};
      r.admit = true;
      return responder.Send(std::move(r));
    }
    if (opcode == 6) {
      // Parked until a later request (opcode 7) of any connection.
      {
        std::lock_guard lock(parked_mu);
        parked.push_back(std::move(responder));
      }
      parked_cv.notify_all();
      return;
    }
    if (opcode == 7) {
      std::vector<Responder> release;
      {
        std::lock_guard lock(parked_mu);
        release.swap(parked);
      }
      for (auto& r : release) r.Send({{std::byte{6}}, -1, false});
      return responder.Send({{std::byte{7}}, -1, false});
    }
    responder.Send({{payload.begin(), payload.end()}, -1, false});
  }
  void OnDisconnect(uint64_t) override {
    {
      std::lock_guard lock(disconnect_mu);
      disconnects++;
    }
    disconnect_cv.notify_all();
  }
  // Waits until `n` connections have ended; false after 10 s without.
  bool WaitForDisconnects(int n) {
    std::unique_lock lock(disconnect_mu);
    return disconnect_cv.wait_for(lock, std::chrono::seconds(10),
                                  [&] { return disconnects.load() >= n; });
  }
  ~EchoHandler() override {
    for (auto& t : later) t.join();
  }

  std::vector<std::thread> later;  // only one connection's frames use it
  std::mutex parked_mu;
  std::condition_variable parked_cv;
  std::vector<Responder> parked;
  int memfd = -1;
  std::atomic<int> frames{0};
  std::mutex disconnect_mu;  // with disconnect_cv: signals disconnects
  std::condition_variable disconnect_cv;
  std::atomic<int> disconnects{0};
};

TEST(UdsServerTest, EchoesPayloadsAndPassesDescriptors) {
  testing::TempDir dir;
  EchoHandler handler;
  handler.memfd = ::memfd_create("t", 0);
  ASSERT_EQ(::ftruncate(handler.memfd, 4096), 0);
  auto server = UdsServer::Start({.path = dir.File("s.sock")}, &handler);
  ASSERT_OK(server);
  struct stat st {};
  ASSERT_EQ(::stat(dir.File("s.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);

  auto ch = UdsChannel::Connect(dir.File("s.sock"), std::chrono::seconds(5));
  ASSERT_OK(ch);
  ASSERT_OK((*ch)->Call(8, {}));  // large requests need authentication
  std::vector<std::byte> big(3 << 20, std::byte{7});
  auto reply = (*ch)->Call(1, big);
  ASSERT_OK(reply);
  EXPECT_EQ(reply->payload, big);

  auto with_fd = (*ch)->Call(2, {});
  ASSERT_OK(with_fd);
  ASSERT_GE(with_fd->fd, 0);
  struct stat fd_st {};
  ASSERT_EQ(::fstat(with_fd->fd, &fd_st), 0);
  EXPECT_EQ(fd_st.st_size, 4096);
  ::close(with_fd->fd);

  EXPECT_EQ((*ch)->Call(3, {}).status().code(), StatusCode::kBusy);
  EXPECT_OK((*ch)->Call(1, {}));  // still usable after an error frame
  ch->reset();
  EXPECT_TRUE(handler.WaitForDisconnects(1));
  EXPECT_EQ(handler.disconnects.load(), 1);
  ::close(handler.memfd);
}

TEST(UdsServerTest, RepliesFromAnotherThreadAndAnswersDroppedRequests) {
  testing::TempDir dir;
  EchoHandler handler;
  auto server = UdsServer::Start({.path = dir.File("s.sock")}, &handler);
  ASSERT_OK(server);
  auto ch = UdsChannel::Connect(dir.File("s.sock"), std::chrono::seconds(5));
  ASSERT_OK(ch);
  for (int i = 0; i < 20; ++i) {
    std::vector<std::byte> body(100 + i, static_cast<std::byte>(i));
    auto reply = (*ch)->Call(4, body);
    ASSERT_OK(reply);
    EXPECT_EQ(reply->payload, body);
    EXPECT_OK((*ch)->Call(1, body));  // inline replies interleave
  }
  EXPECT_EQ((*ch)->Call(5, {}).status().code(), StatusCode::kInternal);
  EXPECT_OK((*ch)->Call(1, {}));
}

TEST(UdsServerTest, OneConnectionCarriesConcurrentRequestsAnsweredOutOfOrder) {
  testing::TempDir dir;
  EchoHandler handler;
  auto server = UdsServer::Start({.path = dir.File("s.sock")}, &handler);
  ASSERT_OK(server);
  auto ch = UdsChannel::Connect(dir.File("s.sock"), std::chrono::seconds(10));
  ASSERT_OK(ch);
  // Thread A's request is answered only once thread B's request reaches the
  // daemon over the same connection: a serialized channel or server would
  // deadlock here (and fail by the receive timeout).
  std::thread a([&] {
    auto reply = (*ch)->Call(6, {});
    ASSERT_OK(reply);
    EXPECT_EQ(reply->payload, std::vector<std::byte>{std::byte{6}});
  });
  {  // wait for A's request to be parked, then release it
    std::unique_lock lock(handler.parked_mu);
    handler.parked_cv.wait(lock, [&] { return !handler.parked.empty(); });
  }
  auto b = (*ch)->Call(7, {});
  ASSERT_OK(b);
  EXPECT_EQ(b->payload, std::vector<std::byte>{std::byte{7}});
  a.join();
  // Pipelined on one thread, received in the reverse order of sending.
  auto first = (*ch)->Send(6, {});
  auto second = (*ch)->Send(1, std::vector<std::byte>(10, std::byte{1}));
  ASSERT_OK(first);
  ASSERT_OK(second);
  auto echoed = (*ch)->Receive(*second, 1);
  ASSERT_OK(echoed);
  EXPECT_EQ(echoed->payload.size(), 10u);
  ASSERT_OK((*ch)->Call(7, {}));
  ASSERT_OK((*ch)->Receive(*first, 6));
}

TEST(UdsServerTest, ABurstOfPipelinedFramesIsAnsweredInFullUnderTheBound) {
  // 2,000 frames in one write: the server reads them in one loop (no
  // recursion per frame), stops at the in-flight bound while some replies
  // come from other threads, and resumes as they complete.
  testing::TempDir dir;
  EchoHandler handler;
  auto server = UdsServer::Start(
      {.path = dir.File("s.sock"), .max_requests_in_flight = 3}, &handler);
  ASSERT_OK(server);
  auto ch = UdsChannel::Connect(dir.File("s.sock"), std::chrono::seconds(10));
  ASSERT_OK(ch);
  constexpr int kFrames = 2000;
  std::vector<std::byte> burst;
  for (int i = 0; i < kFrames; ++i) {
    const uint16_t opcode = i % 100 == 0 ? 4 : 1;  // 4: answered later
    std::vector<std::byte> body(sizeof(i));
    std::memcpy(body.data(), &i, sizeof(i));
    HeaderBytes h = EncodeFrameHeader(opcode, i + 1, body);
    burst.insert(burst.end(), h.begin(), h.end());
    burst.insert(burst.end(), body.begin(), body.end());
  }
  ASSERT_OK((*ch)->TEST_SendRaw(burst));
  std::vector<bool> seen(kFrames, false);
  for (int n = 0; n < kFrames; ++n) {
    uint16_t opcode = 0;
    auto reply = (*ch)->TEST_ReadReply(&opcode);
    ASSERT_OK(reply);
    ASSERT_EQ(reply->payload.size(), sizeof(int));
    int i;
    std::memcpy(&i, reply->payload.data(), sizeof(i));
    ASSERT_GE(i, 0);
    ASSERT_LT(i, kFrames);
    EXPECT_FALSE(seen[i]) << "frame " << i << " answered twice";
    seen[i] = true;
    EXPECT_EQ(opcode, (i % 100 == 0 ? 4 : 1) | kResponseBit);
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), true), kFrames);
  EXPECT_EQ(handler.frames.load(), kFrames);
}

TEST(UdsServerTest, RefusesToStealALiveSocketButReplacesAStaleOne) {
  testing::TempDir dir;
  EchoHandler handler;
  auto first = UdsServer::Start({.path = dir.File("s.sock")}, &handler);
  ASSERT_OK(first);
  EXPECT_EQ(
      UdsServer::Start({.path = dir.File("s.sock")}, &handler).status().code(),
      StatusCode::kBusy);
  std::string regular = dir.File("file");
  FILE* f = std::fopen(regular.c_str(), "w");
  std::fclose(f);
  EXPECT_EQ(UdsServer::Start({.path = regular}, &handler).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(UdsServerTest, StoppingLeavesASocketFileThatIsNoLongerItsOwn) {
  // A daemon replaced at the same path (its file removed, a new one bound)
  // must not take the new daemon's socket file with it when it stops.
  testing::TempDir dir;
  EchoHandler a_handler, b_handler;
  const std::string path = dir.File("s.sock");
  auto a = UdsServer::Start({.path = path}, &a_handler);
  ASSERT_OK(a);
  ASSERT_EQ(::unlink(path.c_str()), 0);
  auto b = UdsServer::Start({.path = path}, &b_handler);
  ASSERT_OK(b);
  (*a)->Stop();
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << "b's socket file is gone";
  auto ch = UdsChannel::Connect(path, std::chrono::seconds(5));
  ASSERT_OK(ch);
  EXPECT_OK((*ch)->Call(1, {}));
  (*b)->Stop();
  EXPECT_NE(::stat(path.c_str(), &st), 0) << "b removes its own file";
}

TEST(UdsServerTest, OversizedFramesCloseOnlyTheirConnection) {
  testing::TempDir dir;
  EchoHandler handler;
  auto server = UdsServer::Start(
      {.path = dir.File("s.sock"), .max_payload_bytes = 1024}, &handler);
  ASSERT_OK(server);
  auto bad = UdsChannel::Connect(dir.File("s.sock"), std::chrono::seconds(5));
  auto good = UdsChannel::Connect(dir.File("s.sock"), std::chrono::seconds(5));
  ASSERT_OK(bad);
  ASSERT_OK(good);
  std::vector<std::byte> big(2048);
  EXPECT_EQ((*bad)->Call(1, big).status().code(), StatusCode::kProtocolError);
  EXPECT_FALSE((*bad)->Call(1, {}).ok()) << "connection is closed";
  EXPECT_OK((*good)->Call(1, std::vector<std::byte>(1024)));
}

// An authenticated channel to `path`.
std::unique_ptr<UdsChannel> Admitted(const std::string& path) {
  auto ch = UdsChannel::Connect(path, std::chrono::seconds(10));
  EXPECT_OK(ch);
  if (!ch.ok()) return nullptr;
  EXPECT_OK((*ch)->Call(8, {}));
  return std::move(ch).value();
}

// Waits (bounded) until `done` holds; false if it never did.
template <typename Pred>
bool Eventually(Pred done) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

// Header and the first `sent` bytes of an echo request of `payload`.
std::vector<std::byte> PartialFrame(uint64_t request_id,
                                    const std::vector<std::byte>& payload,
                                    size_t sent) {
  const HeaderBytes h = EncodeFrameHeader(1, request_id, payload);
  std::vector<std::byte> out(h.size() + sent);
  std::memcpy(out.data(), h.data(), h.size());
  std::memcpy(out.data() + h.size(), payload.data(), sent);
  return out;
}

// Two 3 MiB requests against a 4 MiB budget: the second is not read until
// the first one's payload and reply are done with, and small requests are
// served all along.
TEST(UdsServerTest, RequestsBeyondTheInFlightBudgetWaitForRoom) {
  testing::TempDir dir;
  EchoHandler handler;
  const uint64_t kMiB = 1 << 20;
  auto server = UdsServer::Start({.path = dir.File("s.sock"),
                                  .max_payload_bytes = 4 * kMiB,
                                  .max_in_flight_bytes = 4 * kMiB},
                                 &handler);
  ASSERT_OK(server);
  auto a = Admitted(dir.File("s.sock"));
  auto b = Admitted(dir.File("s.sock"));
  auto c = Admitted(dir.File("s.sock"));
  ASSERT_TRUE(a && b && c);
  const int frames_before = handler.frames.load();
  const std::vector<std::byte> big_a(3 * kMiB, std::byte{1});
  const std::vector<std::byte> big_b(3 * kMiB, std::byte{2});
  // A announces 3 MiB and sends one: the server charges all three.
  ASSERT_OK(a->TEST_SendRaw(PartialFrame(100, big_a, kMiB)));
  ASSERT_TRUE(Eventually([&] { return (*server)->in_flight_bytes() > 0; }));
  EXPECT_EQ((*server)->in_flight_bytes(), 3 * kMiB);
  // B's 3 MiB do not fit beside them: B waits, holding nothing.
  std::thread b_sender([&] {
    auto id = b->Send(1, big_b);
    ASSERT_OK(id);
    auto reply = b->Receive(*id, 1);
    ASSERT_OK(reply);
    EXPECT_EQ(reply->payload, big_b);
  });
  ASSERT_TRUE(Eventually([&] { return (*server)->in_flight_waiters() == 1; }));
  EXPECT_EQ((*server)->in_flight_bytes(), 3 * kMiB);
  EXPECT_EQ(handler.frames.load(), frames_before);
  // Small requests need no budget.
  auto small = c->Call(1, std::vector<std::byte>(1000, std::byte{3}));
  ASSERT_OK(small);
  EXPECT_EQ(small->payload.size(), 1000u);
  // A's remaining bytes arrive: A is answered, then B.
  ASSERT_OK(a->TEST_SendRaw(std::span(big_a).subspan(kMiB)));
  uint16_t opcode = 0;
  auto a_reply = a->TEST_ReadReply(&opcode);
  ASSERT_OK(a_reply);
  EXPECT_EQ(a_reply->payload, big_a);
  b_sender.join();
  EXPECT_TRUE(Eventually([&] { return (*server)->in_flight_bytes() == 0; }));
}

// A client that stops sending in the middle of a charged request is hung up
// after stall_timeout, and what it held goes to the request waiting.
TEST(UdsServerTest, AStalledRequestIsClosedAndItsBudgetReturned) {
  testing::TempDir dir;
  EchoHandler handler;
  const uint64_t kMiB = 1 << 20;
  auto server =
      UdsServer::Start({.path = dir.File("s.sock"),
                        .max_payload_bytes = 4 * kMiB,
                        .max_in_flight_bytes = 4 * kMiB,
                        .stall_timeout = std::chrono::milliseconds(200)},
                       &handler);
  ASSERT_OK(server);
  auto staller = Admitted(dir.File("s.sock"));
  auto waiter = Admitted(dir.File("s.sock"));
  ASSERT_TRUE(staller && waiter);
  const std::vector<std::byte> big(3 * kMiB, std::byte{5});
  ASSERT_OK(staller->TEST_SendRaw(PartialFrame(7, big, kMiB)));
  ASSERT_TRUE(Eventually([&] { return (*server)->in_flight_bytes() > 0; }));
  auto reply = waiter->Call(1, big);  // waits until the staller is gone
  ASSERT_OK(reply);
  EXPECT_EQ(reply->payload, big);
  uint16_t opcode = 0;
  EXPECT_FALSE(staller->TEST_ReadReply(&opcode).ok()) << "hung up";
}

TEST(UdsServerTest, UnauthenticatedConnectionsMaySendOnlySmallRequests) {
  testing::TempDir dir;
  EchoHandler handler;
  auto server = UdsServer::Start({.path = dir.File("s.sock")}, &handler);
  ASSERT_OK(server);
  auto ch = UdsChannel::Connect(dir.File("s.sock"), std::chrono::seconds(5));
  ASSERT_OK(ch);
  EXPECT_OK((*ch)->Call(1, std::vector<std::byte>(64 << 10)));
  auto big = (*ch)->Call(1, std::vector<std::byte>((64 << 10) + 1));
  EXPECT_EQ(big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE((*ch)->Call(1, {}).ok()) << "connection is closed";
  EXPECT_EQ((*server)->in_flight_bytes(), 0u);
}

TEST(UdsServerTest, ManyConcurrentConnections) {
  testing::TempDir dir;
  EchoHandler handler;
  auto server =
      UdsServer::Start({.path = dir.File("s.sock"), .io_threads = 2}, &handler);
  ASSERT_OK(server);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto ch =
          UdsChannel::Connect(dir.File("s.sock"), std::chrono::seconds(5));
      if (!ch.ok()) return;
      for (int i = 0; i < 500; ++i) {
        std::vector<std::byte> p(1 + (i * 37 + t) % 5000,
                                 static_cast<std::byte>(t));
        auto r = (*ch)->Call(1, p);
        if (r.ok() && r->payload == p) ok++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 8 * 500);
}

}  // namespace
}  // namespace tierkv::transport
