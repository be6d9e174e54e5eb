// LayerStall: a test-only fault injection that holds one transfer before a
// chosen layer until a test releases it, across processes, through a FIFO.
// It exists only in builds with sync points (TIERKV_SYNC_POINTS, see
// common/sync_point.h): a release tierkvd neither reads the variable nor
// has the point it hooks. Tests that need it skip without it
// (`tierkvd --version` says "sync points: on|off").
//
//   TIERKV_TEST_STALL_LAYER=<layer>:<fifo path>
//
// With it set, the first Load or Store that reaches layer <layer> blocks on
// its worker, before moving that layer, in open(<fifo>, O_RDONLY) and then
// in read() until one byte arrives or every writer has closed the FIFO
// (EOF). Tests use it to see WaitLayer(l) return while layer l+1 is held,
// without sleeps. Only the first such transfer stalls: later ones pass.
//
// A test should open the FIFO O_RDWR (Linux: never blocks) before the
// transfer, write one byte to release it, and keep the descriptor in an
// RAII holder: if the test dies or fails early, its close gives the
// daemon EOF and the worker goes on, so nothing hangs.
//
// It is a callback on the sync point CacheEngine::kBeforeTransferUnit,
// which a worker passes before each unit of a layer it moves.
//
// Never set in production: tierkvd logs a warning at start-up when it is.
#pragma once

#ifdef TIERKV_SYNC_POINTS

#include <cstdint>
#include <optional>
#include <string>

#include "tierkv/status.h"

namespace tierkv::daemon {

inline constexpr const char* kLayerStallEnv = "TIERKV_TEST_STALL_LAYER";

struct LayerStall {
  uint16_t layer = 0;
  std::string fifo_path;
};

// Parses `<layer>:<fifo path>`. InvalidArgument (naming the variable) for a
// missing colon, a layer that is not a number in [0, 65535], an empty path,
// or a path that is not a FIFO.
Result<LayerStall> ParseLayerStall(const std::string& value);

// The stall configured in the environment: nullopt when the variable is
// unset, InvalidArgument when it is set to something ParseLayerStall
// refuses.
Result<std::optional<LayerStall>> LayerStallFromEnvironment();

// `stall` in effect from construction to destruction: the callback of the
// sync point CacheEngine::kBeforeTransferUnit (with sync point processing
// enabled) waits as the file comment says, and a warning is logged. The
// destructor removes the callback, after any stalled call of it returned.
// One at a time per process.
class ArmedLayerStall {
 public:
  explicit ArmedLayerStall(const LayerStall& stall);
  ~ArmedLayerStall();
  ArmedLayerStall(const ArmedLayerStall&) = delete;
  ArmedLayerStall& operator=(const ArmedLayerStall&) = delete;
};

}  // namespace tierkv::daemon

#endif  // TIERKV_SYNC_POINTS
