// EnginePools: an inference engine's pool memory for tests of registered
// pools (Client::RegisterPool, Load, Store): one memfd per (layer, part) of a
// layout, `slots` segments each, filled with 0xee. Header-only: the test
// folders build only *_test.cc files.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "tests/client/client_test_util.h"
#include "tierkv/client.h"
#include "tierkv/status.h"

namespace tierkv::testing {

class EnginePools {
 public:
  EnginePools(const LayoutSpec& layout, uint32_t slots) : slots_(slots) {
    for (uint16_t l = 0; l < layout.num_layers(); ++l) {
      for (uint8_t p = 0; p < layout.layers[l].parts.size(); ++p) {
        Region r;
        r.slot_bytes = layout.SegmentBytes(l, p);
        r.bytes = r.slot_bytes * slots;
        r.fd = ::memfd_create("pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        EXPECT_EQ(::ftruncate(r.fd, static_cast<off_t>(r.bytes)), 0);
        r.base = static_cast<std::byte*>(::mmap(
            nullptr, r.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd, 0));
        std::memset(r.base, 0xee, r.bytes);
        regions_[{l, p}] = r;
      }
    }
  }
  ~EnginePools() {
    for (auto& [k, r] : regions_) {
      ::munmap(r.base, r.bytes);
      ::close(r.fd);
    }
  }
  EnginePools(const EnginePools&) = delete;
  EnginePools& operator=(const EnginePools&) = delete;

  Status RegisterAll(Client& c) {
    for (auto& [k, r] : regions_) {
      TIERKV_RETURN_IF_ERROR(c.RegisterPool({.fd = r.fd,
                                             .slot_bytes = r.slot_bytes,
                                             .slot_count = slots_,
                                             .layer = k.first,
                                             .part = k.second}));
    }
    return Status::OK();
  }
  std::span<std::byte> Slot(uint16_t l, uint8_t p, uint32_t slot) {
    Region& r = regions_.at({l, p});
    return {r.base + slot * r.slot_bytes, r.slot_bytes};
  }
  // Whether slot `slot` holds `page`'s segments of layers [0, layers) as
  // PutLayoutPages wrote them.
  ::testing::AssertionResult Holds(const LayoutSpec& layout,
                                   const PageHash& page, uint32_t slot,
                                   uint16_t layers) const {
    for (const SegmentKey& k : LayoutKeys(layout, page)) {
      if (k.layer >= layers) continue;
      const Region& r = regions_.at({k.layer, k.part});
      const std::byte* got = r.base + slot * r.slot_bytes;
      if (std::vector<std::byte>(got, got + r.slot_bytes) !=
          SegmentBytes(k, r.slot_bytes)) {
        return ::testing::AssertionFailure() << k.ToString() << " differs";
      }
    }
    return ::testing::AssertionSuccess();
  }

 private:
  struct Region {
    int fd = -1;
    std::byte* base = nullptr;
    uint64_t bytes = 0;
    uint64_t slot_bytes = 0;
  };
  uint32_t slots_;
  std::map<std::pair<uint16_t, uint8_t>, Region> regions_;
};

}  // namespace tierkv::testing
