// StreamCopy: every instruction set this CPU has copies exactly the bytes
// asked for, at every alignment of source and destination, on both sides of
// the streaming threshold, and writes nothing outside the destination.
#include "common/stream_copy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace tierkv {
namespace {

constexpr size_t kGuard = 64;
constexpr std::byte kSentinel{0xA5};

std::vector<StreamCopyIsa> SupportedIsas() {
  std::vector<StreamCopyIsa> out;
  for (StreamCopyIsa isa :
       {StreamCopyIsa::kMemcpy, StreamCopyIsa::kSse2, StreamCopyIsa::kAvx2}) {
    if (StreamCopyIsaSupported(isa)) out.push_back(isa);
  }
  return out;
}

TEST(StreamCopyTest, TheDefaultInstructionSetIsSupported) {
  EXPECT_TRUE(StreamCopyIsaSupported(StreamCopyDefaultIsa()));
#if defined(__x86_64__)
  EXPECT_NE(StreamCopyDefaultIsa(), StreamCopyIsa::kMemcpy);
#endif
}

TEST(StreamCopyTest, CopiesExactlyTheRangeAtEveryAlignment) {
  const std::vector<size_t> sizes = {0,
                                     1,
                                     kStreamCopyMinBytes - 1,
                                     kStreamCopyMinBytes,
                                     kStreamCopyMinBytes + 1,
                                     72 * 1024,
                                     72 * 1024 + 77,
                                     (size_t{1} << 20) + 5};
  const std::vector<size_t> offsets = {0, 1, 15, 16, 31, 33, 63};
  const size_t max = sizes.back() + 2 * kGuard + 64;
  std::vector<std::byte> src(max), dst(max);
  for (size_t i = 0; i < max; ++i) {
    src[i] = static_cast<std::byte>((i * 131 + 7) % 251);
  }
  for (StreamCopyIsa isa : SupportedIsas()) {
    for (size_t n : sizes) {
      for (size_t src_off : offsets) {
        for (size_t dst_off : {size_t{0}, size_t{1}, size_t{17}, size_t{32}}) {
          std::fill(dst.begin(), dst.end(), kSentinel);
          std::byte* d = dst.data() + kGuard + dst_off;
          const std::byte* s = src.data() + src_off;
          StreamCopyWith(isa, d, s, n);
          SCOPED_TRACE(testing::Message()
                       << "isa " << static_cast<int>(isa) << " n " << n
                       << " src+" << src_off << " dst+" << dst_off);
          ASSERT_EQ(std::memcmp(d, s, n), 0);
          for (const std::byte* p = dst.data(); p < d; ++p) {
            ASSERT_EQ(*p, kSentinel) << "wrote before dst";
          }
          for (const std::byte* p = d + n; p < d + n + kGuard; ++p) {
            ASSERT_EQ(*p, kSentinel) << "wrote past dst + n";
          }
        }
      }
    }
  }
}

TEST(StreamCopyTest, TheDefaultEntryPointCopies) {
  std::vector<std::byte> src(100 * 1024), dst(src.size());
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i);
  StreamCopy(dst.data(), src.data(), src.size());
  EXPECT_EQ(dst, src);
}

}  // namespace
}  // namespace tierkv
