// SendAllWithFd / RecvAllWithFd / RecvSomeWithFd over a socketpair: bytes
// arrive whole, a descriptor rides with them, and unwanted ones are closed.
#include "transport/fd_passing.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstddef>
#include <thread>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace tierkv::transport {
namespace {

// Owns one descriptor (-1: none) and closes it on destruction.
class ScopedFd {
 public:
  ScopedFd() = default;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() { Close(); }

  int get() const { return fd_; }
  int* slot() { return &fd_; }  // for out-parameters that expect -1
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// Both ends of a connected socketpair or of a pipe.
struct FdPair {
  ScopedFd first;
  ScopedFd second;
};

void OpenSocketPair(FdPair& pair) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  *pair.first.slot() = fds[0];
  *pair.second.slot() = fds[1];
}

void OpenPipe(FdPair& pair) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  *pair.first.slot() = fds[0];
  *pair.second.slot() = fds[1];
}

int OpenDescriptors() {
  int count = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (::readdir(dir) != nullptr) ++count;
  ::closedir(dir);
  return count;
}

bool SameFile(int a, int b) {
  struct stat sa, sb;
  return ::fstat(a, &sa) == 0 && ::fstat(b, &sb) == 0 &&
         sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

std::vector<std::byte> Bytes(size_t n) {
  std::vector<std::byte> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<std::byte>(i * 7);
  return bytes;
}

// The sender's end is `first`, the receiver's `second`.
class FdPassingTest : public ::testing::Test {
 protected:
  void SetUp() override { OpenSocketPair(sockets_); }
  int sender() const { return sockets_.first.get(); }
  int receiver() const { return sockets_.second.get(); }

  FdPair sockets_;
};

TEST_F(FdPassingTest, DescriptorArrivesWithTheBytes) {
  FdPair pipe;
  OpenPipe(pipe);
  const std::vector<std::byte> sent = Bytes(100);
  ASSERT_OK(SendAllWithFd(sender(), sent, pipe.first.get()));

  std::vector<std::byte> got(sent.size());
  ScopedFd received;
  ASSERT_OK(RecvAllWithFd(receiver(), got, received.slot()));
  EXPECT_EQ(got, sent);
  ASSERT_GE(received.get(), 0);
  EXPECT_NE(received.get(), pipe.first.get());  // a new descriptor
  EXPECT_TRUE(SameFile(received.get(), pipe.first.get()));
}

TEST_F(FdPassingTest, BytesWithoutADescriptorLeaveTheSlotEmpty) {
  const std::vector<std::byte> sent = Bytes(64);
  ASSERT_OK(SendAllWithFd(sender(), sent, /*fd_to_send=*/-1));
  std::vector<std::byte> got(sent.size());
  ScopedFd received;
  ASSERT_OK(RecvAllWithFd(receiver(), got, received.slot()));
  EXPECT_EQ(got, sent);
  EXPECT_EQ(received.get(), -1);
}

// A payload larger than the socket buffer takes several sendmsg/recvmsg
// calls; the descriptor rides with the first and only the first.
TEST_F(FdPassingTest, LargePayloadArrivesWholeWithOneDescriptor) {
  FdPair pipe;
  OpenPipe(pipe);
  const std::vector<std::byte> sent = Bytes(4 << 20);
  std::vector<std::byte> got(sent.size());
  ScopedFd received;
  Status recv_status;
  std::thread reader(
      [&] { recv_status = RecvAllWithFd(receiver(), got, received.slot()); });
  ASSERT_OK(SendAllWithFd(sender(), sent, pipe.first.get()));
  reader.join();
  ASSERT_OK(recv_status);
  EXPECT_EQ(got, sent);
  EXPECT_TRUE(SameFile(received.get(), pipe.first.get()));
}

TEST_F(FdPassingTest, UnwantedDescriptorsAreClosed) {
  FdPair pipe;
  OpenPipe(pipe);
  const std::vector<std::byte> sent = Bytes(8);
  ASSERT_OK(SendAllWithFd(sender(), sent, pipe.first.get()));
  ASSERT_OK(SendAllWithFd(sender(), sent, pipe.first.get()));

  const int open_before = OpenDescriptors();
  std::vector<std::byte> got(sent.size());
  int kept = pipe.second.get();  // already holds one: the arriving one goes
  ASSERT_OK(RecvAllWithFd(receiver(), got, &kept));
  EXPECT_EQ(kept, pipe.second.get());
  ASSERT_OK(RecvAllWithFd(receiver(), got, /*received_fd=*/nullptr));
  EXPECT_EQ(OpenDescriptors(), open_before);
}

TEST_F(FdPassingTest, RecvSomeReadsWhatIsThereAndNeverWaits) {
  std::array<std::byte, 16> buf{};
  ScopedFd received;
  Result<size_t> n = RecvSomeWithFd(receiver(), buf, received.slot());
  ASSERT_OK(n);
  EXPECT_EQ(*n, 0u);  // nothing yet

  FdPair pipe;
  OpenPipe(pipe);
  ASSERT_OK(SendAllWithFd(sender(), Bytes(5), pipe.second.get()));
  n = RecvSomeWithFd(receiver(), buf, received.slot());
  ASSERT_OK(n);
  EXPECT_EQ(*n, 5u);
  EXPECT_TRUE(SameFile(received.get(), pipe.second.get()));
}

TEST_F(FdPassingTest, PeerClosingIsUnavailable) {
  ASSERT_OK(SendAllWithFd(sender(), Bytes(3), /*fd_to_send=*/-1));
  sockets_.first.Close();
  std::array<std::byte, 8> buf{};
  ScopedFd received;
  // Three bytes arrive, then the end of the stream.
  EXPECT_EQ(RecvAllWithFd(receiver(), buf, received.slot()).code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(RecvSomeWithFd(receiver(), buf, received.slot()).status().code(),
            StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tierkv::transport
