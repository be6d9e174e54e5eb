// Helpers shared by the client integration tests: a small GLM-like layout,
// deterministic segment bytes, put/get shorthands, and the bounded poll of
// a daemon's state.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tierkv/client.h"
#include "tierkv/page_hash.h"

namespace tierkv::testing {

// One layer, one "kv" part of `bytes_per_token`, 64-token pages.
inline LayoutSpec OnePartLayout(uint32_t bytes_per_token = 1024) {
  return LayoutSpec::Uniform(64, 1, {{"kv", bytes_per_token}});
}

// GLM-5-shaped, shrunk: `layers` layers of bf16 latent KV (1152 B/token),
// indexer keys (132 B/token) on every `full_every`-th layer only
// (IndexShare), 64-token pages.
inline LayoutSpec IndexShareLayout(int layers, int full_every) {
  LayoutSpec l;
  l.page_tokens = 64;
  for (int i = 0; i < layers; ++i) {
    LayerSpec layer;
    layer.parts.push_back({"kv", 1152});
    if (i % full_every == 0) layer.parts.push_back({"index_k", 132});
    l.layers.push_back(layer);
  }
  return l;
}

// Pages of a synthetic prompt: `n` pages of tokens starting at `first`.
inline std::vector<PageHash> Pages(size_t n, uint32_t first = 0,
                                   std::string_view ns = "default") {
  std::vector<uint32_t> tokens(n * 64);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = first + static_cast<uint32_t>(i);
  return PageHashChain(RootPageHash(ns), tokens, 64);
}

inline std::vector<std::byte> SegmentBytes(const SegmentKey& key, size_t size) {
  std::vector<std::byte> out(size);
  uint64_t x = key.page.lo ^ (uint64_t{key.layer} << 20) ^ key.part;
  for (size_t i = 0; i < size; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    out[i] = static_cast<std::byte>(x >> 56);
  }
  return out;
}

// Puts segment (page, 0, 0) of `size` bytes for every page; returns Put's
// per-item results.
inline std::vector<PutResult> PutPages(Client& c,
                                       const std::vector<PageHash>& pages,
                                       size_t size) {
  std::vector<std::vector<std::byte>> data;
  std::vector<SegmentWrite> writes;
  for (const auto& p : pages) data.push_back(SegmentBytes({p, 0, 0}, size));
  for (size_t i = 0; i < pages.size(); ++i)
    writes.push_back({{pages[i], 0, 0}, data[i]});
  return c.Put(writes);
}

// Every segment key of `page` under `layout`, layer by layer, part by part.
inline std::vector<SegmentKey> LayoutKeys(const LayoutSpec& layout,
                                          const PageHash& page) {
  std::vector<SegmentKey> keys;
  for (uint16_t l = 0; l < layout.num_layers(); ++l) {
    for (uint8_t p = 0; p < layout.layers[l].parts.size(); ++p) {
      keys.push_back({page, l, p});
    }
  }
  return keys;
}

// Puts every segment of `pages` under `layout` (SegmentBytes contents);
// returns Put's per-item results.
inline std::vector<PutResult> PutLayoutPages(
    Client& c, const LayoutSpec& layout, const std::vector<PageHash>& pages) {
  std::vector<std::vector<std::byte>> data;
  std::vector<SegmentKey> keys;
  for (const auto& page : pages) {
    for (const auto& k : LayoutKeys(layout, page)) {
      keys.push_back(k);
      data.push_back(SegmentBytes(k, layout.SegmentBytes(k.layer, k.part)));
    }
  }
  std::vector<SegmentWrite> writes;
  for (size_t i = 0; i < keys.size(); ++i) writes.push_back({keys[i], data[i]});
  return c.Put(writes);
}

// True when segment (page, 0, 0) reads back exactly as PutPages wrote it.
inline ::testing::AssertionResult ReadsBackExact(Client& c,
                                                 const PageHash& page,
                                                 size_t size) {
  std::vector<std::byte> dst(size);
  SegmentRead r{{page, 0, 0}, dst};
  const Status s = c.Get(std::span(&r, 1))[0];
  if (!s.ok()) return ::testing::AssertionFailure() << "Get: " << s.ToString();
  if (dst != SegmentBytes({page, 0, 0}, size)) {
    return ::testing::AssertionFailure() << "bytes differ";
  }
  return ::testing::AssertionSuccess();
}

// Polls `done` until it holds; false if it still does not after `timeout`.
// Only for what a daemon shows in its stats alone, with no event a test
// could wait on (what it reclaimed after a client died, a lease its
// sweeper expired): a bounded poll of the real condition, never a sleep
// that hopes. The short pause between polls spares the daemon (and the CPU
// it needs to get there) a busy loop of Stats calls.
template <typename Pred>
bool PollUntil(Pred done,
               std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// The test's end of a TIERKV_TEST_STALL_LAYER FIFO. Opened O_RDWR, which
// never blocks on Linux and keeps a writer present, so the daemon's
// open(O_RDONLY) returns at once and its read() waits for Release(). A
// failing test closes the descriptor on the way out: the daemon reads EOF
// and the stalled worker goes on, so no failure can hang the test.
class StallFifo {
 public:
  explicit StallFifo(std::string path) : path_(std::move(path)) {
    EXPECT_EQ(::mkfifo(path_.c_str(), 0600), 0) << std::strerror(errno);
    fd_ = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);
    EXPECT_GE(fd_, 0) << std::strerror(errno);
  }
  ~StallFifo() {
    if (fd_ >= 0) ::close(fd_);
  }
  StallFifo(const StallFifo&) = delete;
  StallFifo& operator=(const StallFifo&) = delete;

  const std::string& path() const { return path_; }
  void Release() {
    const char byte = 1;
    EXPECT_EQ(::write(fd_, &byte, 1), 1) << std::strerror(errno);
  }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace tierkv::testing
