// HostMemory (see host_memory.h).
#include "daemon/host_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

namespace tierkv::daemon {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A cgroup file holding one byte count ("max" = unlimited).
std::optional<uint64_t> ReadCount(const std::string& path) {
  const std::string text = ReadFile(path);
  if (text.empty() || text.starts_with("max")) return std::nullopt;
  try {
    return std::stoull(text);
  } catch (...) {
    return std::nullopt;
  }
}

std::optional<uint64_t> CgroupRoom() {
  std::istringstream lines(ReadFile("/proc/self/cgroup"));
  std::string line;
  while (std::getline(lines, line)) {
    // v2: "0::/path"; v1: "N:memory:/path" (or "N:memory,...:/path").
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    std::optional<uint64_t> limit, usage;
    if (line.starts_with("0::")) {
      limit = ReadCount("/sys/fs/cgroup" + path + "/memory.max");
      usage = ReadCount("/sys/fs/cgroup" + path + "/memory.current");
    } else if (("," + controllers + ",").find(",memory,") !=
               std::string::npos) {
      limit =
          ReadCount("/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes");
      usage =
          ReadCount("/sys/fs/cgroup/memory" + path + "/memory.usage_in_bytes");
    } else {
      continue;
    }
    // cgroup v1 reports "no limit" as a huge number.
    if (limit && usage && *limit < (uint64_t{1} << 60)) {
      return *limit > *usage ? *limit - *usage : 0;
    }
  }
  return std::nullopt;
}

}  // namespace

HostMemory ParseMeminfo(std::string_view text) {
  HostMemory m;
  uint64_t huge_free = 0, huge_size = 0;
  std::istringstream lines{std::string(text)};
  std::string key;
  uint64_t value = 0;
  std::string unit;
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    unit.clear();
    if (!(fields >> key >> value)) continue;
    fields >> unit;
    const uint64_t bytes = unit == "kB" ? value * 1024 : value;
    if (key == "MemAvailable:") m.mem_available = bytes;
    if (key == "HugePages_Free:") huge_free = value;
    if (key == "Hugepagesize:") huge_size = bytes;
  }
  m.hugepages_free = huge_free * huge_size;
  return m;
}

HostMemory ReadHostMemory() {
  HostMemory m = ParseMeminfo(ReadFile("/proc/meminfo"));
  m.cgroup_room = CgroupRoom();
  return m;
}

Status CheckHostBytes(const DaemonConfig& config, const HostMemory& memory) {
  if (memory.mem_available == 0) return Status::OK();  // unknown
  uint64_t need = 0;
  for (const NamespaceConfig& ns : config.namespaces) {
    if (ns.prefault) need += ns.host_bytes;
  }
  uint64_t room = memory.mem_available + memory.hugepages_free;
  if (memory.cgroup_room) room = std::min(room, *memory.cgroup_room);
  if (need <= room) return Status::OK();
  return Status::InvalidArgument(fmt::format(
      "config namespace.host_bytes: the namespaces' arenas need {} MiB of "
      "DRAM but only {} MiB can be committed (MemAvailable {} MiB, free "
      "hugepages {} MiB{}); lower host_bytes or set prefault = false",
      need >> 20, room >> 20, memory.mem_available >> 20,
      memory.hugepages_free >> 20,
      memory.cgroup_room
          ? fmt::format(", room under the memory cgroup's limit {} MiB",
                        *memory.cgroup_room >> 20)
          : std::string()));
}

}  // namespace tierkv::daemon
