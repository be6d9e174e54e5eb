// LayerStall: parsing TIERKV_TEST_STALL_LAYER and the FIFO wait on a sync
// point (see layer_stall.h). Compiled to nothing without TIERKV_SYNC_POINTS.
#include "daemon/layer_stall.h"

#ifdef TIERKV_SYNC_POINTS

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>

#include "common/mutex.h"
#include "common/sync_point.h"
#include "storage/engine/cache_engine.h"

namespace tierkv::daemon {

Result<LayerStall> ParseLayerStall(const std::string& value) {
  const auto bad = [&](const std::string& why) {
    return Status::InvalidArgument(std::string(kLayerStallEnv) + "='" + value +
                                   "': " + why +
                                   " (expected <layer>:<fifo path>)");
  };
  const size_t colon = value.find(':');
  if (colon == std::string::npos) return bad("no ':'");
  LayerStall stall;
  const char* first = value.data();
  const char* last = value.data() + colon;
  auto [end, ec] = std::from_chars(first, last, stall.layer);
  if (first == last || ec != std::errc() || end != last) {
    return bad("the layer is not a number in [0, 65535]");
  }
  stall.fifo_path = value.substr(colon + 1);
  if (stall.fifo_path.empty()) return bad("empty FIFO path");
  struct stat st {};
  if (::stat(stall.fifo_path.c_str(), &st) != 0) {
    return bad(std::string("cannot stat the FIFO: ") + std::strerror(errno));
  }
  if (!S_ISFIFO(st.st_mode)) return bad("not a FIFO (create it with mkfifo)");
  return stall;
}

Result<std::optional<LayerStall>> LayerStallFromEnvironment() {
  const char* value = std::getenv(kLayerStallEnv);
  if (value == nullptr) return std::optional<LayerStall>();
  auto stall = ParseLayerStall(value);
  if (!stall.ok()) return stall.status();
  return std::optional<LayerStall>(std::move(stall).value());
}

namespace {

// The FIFO wait for `stall`, called with each unit's layer. Thread-safe;
// copies share the one-shot state.
std::function<void(uint16_t)> MakeLayerStallHook(const LayerStall& stall) {
  // One-shot: the first transfer to reach the layer waits for the FIFO.
  // Every lane of it (each moves part of the layer) waits with it; lanes
  // arriving after the release pass.
  struct State {
    Mutex mu;
    CondVar cv;
    bool fired GUARDED_BY(mu) = false;
    bool released GUARDED_BY(mu) = false;
  };
  auto state = std::make_shared<State>();
  return [stall, state](uint16_t layer) {
    if (layer != stall.layer) return;
    {
      MutexLock lock(&state->mu);
      if (state->released) return;
      if (state->fired) {
        while (!state->released) state->cv.Wait(&state->mu);
        return;
      }
      state->fired = true;
    }
    spdlog::warn("{}: holding a transfer before layer {} until {} is written",
                 kLayerStallEnv, layer, stall.fifo_path);
    int fd;
    do {
      fd = ::open(stall.fifo_path.c_str(), O_RDONLY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
      spdlog::error("{}: cannot open {}: {}; not stalling", kLayerStallEnv,
                    stall.fifo_path, std::strerror(errno));
    } else {
      char byte;
      ssize_t n;
      do {
        n = ::read(fd, &byte, 1);  // a byte, or 0 once every writer closed
      } while (n < 0 && errno == EINTR);
      ::close(fd);
      spdlog::warn("{}: released layer {}", kLayerStallEnv, layer);
    }
    {
      MutexLock lock(&state->mu);
      state->released = true;
    }
    state->cv.SignalAll();
  };
}

}  // namespace

ArmedLayerStall::ArmedLayerStall(const LayerStall& stall) {
  spdlog::warn(
      "{} is set: TEST-ONLY FAULT INJECTION, the first transfer reaching "
      "layer {} will wait for FIFO {}. Never set this in production.",
      kLayerStallEnv, stall.layer, stall.fifo_path);
  SyncPoint& sync = SyncPoint::Get();
  sync.SetCallback(storage::CacheEngine::kBeforeTransferUnit,
                   [hook = MakeLayerStallHook(stall)](void* layer) {
                     hook(*static_cast<const uint16_t*>(layer));
                   });
  sync.EnableProcessing();
}

ArmedLayerStall::~ArmedLayerStall() {
  SyncPoint& sync = SyncPoint::Get();
  sync.DisableProcessing();
  sync.ClearCallback(storage::CacheEngine::kBeforeTransferUnit);
}

}  // namespace tierkv::daemon

#endif  // TIERKV_SYNC_POINTS
