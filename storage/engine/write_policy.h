// WritePolicy: when a namespace's host segments are also written to the NVMe
// tier (DESIGN.md §4).
#pragma once

#include <cstdint>
#include <string_view>

namespace tierkv::storage {

enum class WritePolicy : uint8_t {
  // Before host DRAM evicts them: the mover persists the oldest dirty
  // segments while a shard runs short of clean space (the default with
  // NVMe).
  kWriteBack,
  kWriteThrough,  // every committed segment, asynchronously, soon after
  kNone,          // never (Flush still persists on request)
};

inline std::string_view WritePolicyName(WritePolicy policy) {
  switch (policy) {
    case WritePolicy::kWriteBack:
      return "write_back";
    case WritePolicy::kWriteThrough:
      return "write_through";
    case WritePolicy::kNone:
      return "none";
  }
  return "unknown";
}

}  // namespace tierkv::storage
