// PeerServeStallFifo: the test's end of a TIERKV_TEST_STALL_PEER_SERVE FIFO
// (daemon/cluster/peer_serve_stall.h): it learns the moment a holder holds a
// peer's FETCH, then releases the holder or kills it there.
//
//   PeerServeStallFifo fifo(dir.File("serve.fifo"));
//   holder.Start({..., .env = {fifo.Env(/*nth_fetch=*/3), ...}});
//   ... a peer starts fetching from the holder ...
//   ASSERT_TRUE(fifo.AwaitHeld());   // FETCH 3 is held now
//   fifo.Release();                  // or: holder.Stop(SIGKILL)
//
// The holder opens the FIFO for reading when it holds; AwaitHeld opens it
// for writing, which blocks until then: an event, not a poll. If it never
// comes, AwaitHeld gives up after its timeout (opening the FIFO for reading
// itself, which ends the blocked open). The destructor closes the write
// end: a holder still waiting reads EOF and serves, so a failing test
// cannot leave a daemon held.
//
// Thread safety: not thread-safe; one owner (the test).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <string>
#include <utility>

namespace tierkv::testing {

class PeerServeStallFifo {
 public:
  explicit PeerServeStallFifo(std::string path) : path_(std::move(path)) {
    EXPECT_EQ(::mkfifo(path_.c_str(), 0600), 0) << std::strerror(errno);
  }
  ~PeerServeStallFifo() {
    if (fd_ >= 0) ::close(fd_);
  }
  PeerServeStallFifo(const PeerServeStallFifo&) = delete;
  PeerServeStallFifo& operator=(const PeerServeStallFifo&) = delete;

  const std::string& path() const { return path_; }

  // The holder's environment entry: hold FETCH `nth_fetch` (from 1) and
  // every request after it until released.
  std::pair<std::string, std::string> Env(uint32_t nth_fetch) const {
    return {"TIERKV_TEST_STALL_PEER_SERVE",
            std::to_string(nth_fetch) + ":" + path_};
  }

  // Blocks until the holder holds a FETCH; false if it does not within
  // `timeout`. REQUIRES: not called after it returned true.
  bool AwaitHeld(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    auto opened = std::async(std::launch::async, [path = path_] {
      int fd;
      do {
        fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
      } while (fd < 0 && errno == EINTR);
      return fd;
    });
    if (opened.wait_for(timeout) != std::future_status::ready) {
      // A reader of our own ends the blocked open; then close both.
      const int reader = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK);
      const int writer = opened.get();
      if (writer >= 0) ::close(writer);
      if (reader >= 0) ::close(reader);
      return false;
    }
    fd_ = opened.get();
    EXPECT_GE(fd_, 0) << std::strerror(errno);
    return fd_ >= 0;
  }

  // Lets the holder serve what it holds, and everything after.
  // REQUIRES: AwaitHeld() returned true.
  void Release() {
    const char byte = 1;
    EXPECT_EQ(::write(fd_, &byte, 1), 1) << std::strerror(errno);
  }

 private:
  std::string path_;
  int fd_ = -1;  // the write end, once the holder holds
};

}  // namespace tierkv::testing
