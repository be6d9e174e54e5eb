// BuildInfo: what this tierkvd is and how it was built, for
// `tierkvd --version` and the Ping reply.
#pragma once

namespace tierkv::daemon {

inline constexpr char kTierkvdVersion[] = "tierkvd 0.1.0";

// Whether test-only sync points are compiled in (the CMake option
// TIERKV_SYNC_POINTS; see common/sync_point.h). Tests that need one skip
// when `tierkvd --version` says "sync points: off".
#ifdef TIERKV_SYNC_POINTS
inline constexpr char kSyncPointsBuildInfo[] =
    "sync points: on (a test build; not for production)";
#else
inline constexpr char kSyncPointsBuildInfo[] = "sync points: off";
#endif

}  // namespace tierkv::daemon
