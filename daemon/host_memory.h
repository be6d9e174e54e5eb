// HostMemory: how much DRAM the daemon can still commit, read at start-up
// so that namespaces whose host_bytes cannot fit are refused with a message
// naming the key, instead of the kernel's OOM killer ending the daemon
// silently while it prefaults its arenas.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "daemon/config.h"
#include "tierkv/status.h"

namespace tierkv::daemon {

struct HostMemory {
  uint64_t mem_available = 0;   // /proc/meminfo MemAvailable; 0 = unknown
  uint64_t hugepages_free = 0;  // HugePages_Free × Hugepagesize
  // The memory cgroup's limit minus its usage (v2 memory.max/current or v1
  // memory.limit_in_bytes/usage_in_bytes); none when unlimited or unknown.
  std::optional<uint64_t> cgroup_room;
};

// Reads /proc/meminfo and this process's memory cgroup (best effort).
HostMemory ReadHostMemory();

// Parses /proc/meminfo text into mem_available and hugepages_free.
HostMemory ParseMeminfo(std::string_view text);

// InvalidArgument naming namespace.host_bytes when the prefaulted arenas
// of `config` need more than `memory` can give; OK when the memory is
// unknown. Namespaces with prefault = false are left out (their pages are
// committed as they fill; that overcommit is the operator's choice).
Status CheckHostBytes(const DaemonConfig& config, const HostMemory& memory);

}  // namespace tierkv::daemon
