// PlacementOptions: which tiers below host DRAM a daemon reads, in what
// order, and where host write-back sends dirty segments (the placement
// policy, after navy's Driver + AdmissionPolicy and Mooncake's
// AllocationStrategy). Tiers are named by Tier::name().
#pragma once

#include <string>
#include <vector>

namespace tierkv::storage {

struct PlacementOptions {
  // The order reads try the tiers below DRAM in, cheapest first: Match
  // reports, and Get, Load and promotion read, each segment from the first
  // tier that holds it. Every tier handed to the chain must be named once.
  // Empty: the order the tiers were handed over in.
  std::vector<std::string> read_order;
  // Where write-back (write_back / write_through namespaces) and Flush
  // write dirty host segments. Empty: the first persistent tier in read
  // order (NVMe), else the first tier.
  std::string demote_to;
};

}  // namespace tierkv::storage
