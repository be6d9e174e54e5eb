// SparseWorkingSet: slot maps per IndexShare group, row buffers per layer,
// and the row copies between them and the source (see
// include/tierkv/sparse_working_set.h).
#include "tierkv/sparse_working_set.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "client/slot_policy.h"

namespace tierkv {

using client_internal::SlotPolicy;

Result<WorkingSetPolicy> ParseWorkingSetPolicy(std::string_view name) {
  if (name == "lru") return WorkingSetPolicy::kLru;
  if (name == "topk") return WorkingSetPolicy::kTopk;
  return Status::InvalidArgument(
      fmt::format("unknown working-set policy '{}' (known: lru, topk)", name));
}

const char* WorkingSetPolicyName(WorkingSetPolicy policy) {
  return policy == WorkingSetPolicy::kTopk ? "topk" : "lru";
}

class SparseWorkingSet::Impl {
 public:
  struct Group {
    uint16_t full_layer = 0;
    std::vector<uint16_t> layers;        // of the group, ascending
    std::vector<int32_t> token_of_slot;  // -1: free
    std::vector<int32_t> slot_of_token;  // -1: not resident; grows
    std::vector<uint32_t> free_slots;
    std::unique_ptr<SlotPolicy> policy;
    uint64_t step = 0;
    bool has_selection = false;  // the last Select succeeded
    // The last selection, in order, and where each id is.
    std::vector<int32_t> ids;
    std::vector<uint32_t> slots;
  };
  struct Layer {
    size_t group = 0;  // index into groups
    uint32_t row_bytes = 0;
    std::vector<std::byte> rows;  // [slots][row_bytes]
    // (slot, token) filled by the group's selections but not copied yet.
    std::vector<std::pair<uint32_t, int32_t>> pending;
  };

  Impl(const WorkingSetLayout& layout, const WorkingSetOptions& o,
       RowSource source)
      : options(o), source(std::move(source)) {
    const size_t num_layers = layout.group_of_layer.size();
    std::vector<size_t> group_index(num_layers, SIZE_MAX);
    layers.resize(num_layers);
    for (size_t l = 0; l < num_layers; ++l) {
      const uint16_t full = layout.group_of_layer[l];
      if (group_index[full] == SIZE_MAX) {
        group_index[full] = groups.size();
        Group& g = groups.emplace_back();
        g.full_layer = full;
      }
      Layer& layer = layers[l];
      layer.group = group_index[full];
      layer.row_bytes = layout.row_bytes[l];
      layer.rows.resize(size_t{o.slots} * layer.row_bytes);
      groups[layer.group].layers.push_back(static_cast<uint16_t>(l));
    }
    for (Group& g : groups) {
      g.token_of_slot.assign(o.slots, -1);
      g.policy = o.policy == WorkingSetPolicy::kTopk
                     ? client_internal::NewTopkSlotPolicy(
                           o.slots, o, &g.token_of_slot, &g.slot_of_token)
                     : client_internal::NewLruSlotPolicy(o.slots);
      ResetGroup(g);
    }
    group_of_full.assign(num_layers, SIZE_MAX);
    for (size_t i = 0; i < groups.size(); ++i) {
      group_of_full[groups[i].full_layer] = i;
    }
  }

  void ResetGroup(Group& g) {
    std::fill(g.token_of_slot.begin(), g.token_of_slot.end(), -1);
    g.slot_of_token.clear();
    g.free_slots.resize(options.slots);
    // Taken from the back: slot 0 first.
    for (uint32_t s = 0; s < options.slots; ++s) {
      g.free_slots[s] = options.slots - 1 - s;
    }
    g.policy->Reset();
    g.step = 0;
    g.has_selection = false;
    g.ids.clear();
    g.slots.clear();
    for (uint16_t l : g.layers) layers[l].pending.clear();
  }

  // Copies the rows `layer` still lacks. NotFound when the source has none
  // for a token: that token's slot is emptied for the whole group.
  Status Fill(uint16_t layer_index) {
    Layer& layer = layers[layer_index];
    Status failed;
    for (const auto& [slot, token] : layer.pending) {
      Group& g = groups[layer.group];
      if (g.token_of_slot[slot] != token) continue;  // emptied meanwhile
      const std::span<const std::byte> row = source(layer_index, token);
      if (row.size() != layer.row_bytes) {
        failed = Status::NotFound(fmt::format(
            "working set: no row of token {} in layer {}", token, layer_index));
        Evict(g, slot);
        continue;
      }
      std::memcpy(layer.rows.data() + size_t{slot} * layer.row_bytes,
                  row.data(), layer.row_bytes);
      stats.bytes_in += layer.row_bytes;
    }
    layer.pending.clear();
    return failed;
  }

  void Evict(Group& g, uint32_t slot) {
    const int32_t token = g.token_of_slot[slot];
    if (token < 0) return;
    g.slot_of_token[static_cast<size_t>(token)] = -1;
    g.token_of_slot[slot] = -1;
    g.policy->Emptied(slot);
    g.free_slots.push_back(slot);
  }

  Status Select(uint16_t full, std::span<const int32_t> ids, int64_t context) {
    if (full >= group_of_full.size() || group_of_full[full] == SIZE_MAX) {
      return Status::InvalidArgument(
          fmt::format("working set: layer {} is not a full layer", full));
    }
    Group& g = groups[group_of_full[full]];
    if (ids.size() > options.slots) {
      return Status::InvalidArgument(
          fmt::format("working set: a selection of {} ids exceeds its {} slots",
                      ids.size(), options.slots));
    }
    // Validate before changing anything: in range, unique, rows exist in
    // the full layer (a shared layer writes the newest token's row after
    // this selection; its Gather finds it then).
    if (g.slot_of_token.size() < static_cast<size_t>(context)) {
      g.slot_of_token.resize(static_cast<size_t>(context), -1);
    }
    mark.resize(std::max(mark.size(), static_cast<size_t>(context)), 0);
    ++mark_epoch;
    for (int32_t id : ids) {
      if (id < 0 || id >= context) {
        return Status::InvalidArgument(fmt::format(
            "working set: id {} outside the {} visible tokens", id, context));
      }
      if (mark[static_cast<size_t>(id)] == mark_epoch) {
        return Status::InvalidArgument(
            fmt::format("working set: id {} selected twice", id));
      }
      mark[static_cast<size_t>(id)] = mark_epoch;
      if (g.slot_of_token[static_cast<size_t>(id)] < 0 &&
          source(full, id).size() != layers[full].row_bytes) {
        return Status::NotFound(fmt::format(
            "working set: no row of token {} in layer {}", id, full));
      }
    }
    // Rows still owed by the previous selection go in before slots move.
    for (uint16_t l : g.layers) TIERKV_RETURN_IF_ERROR(Fill(l));
    g.policy->BeginStep(++g.step, context);
    g.has_selection = false;  // until every id has a slot
    g.ids.assign(ids.begin(), ids.end());
    g.slots.assign(ids.size(), 0);
    std::vector<size_t> missed;
    for (size_t i = 0; i < ids.size(); ++i) {
      const int32_t slot = g.slot_of_token[static_cast<size_t>(ids[i])];
      if (slot < 0) {
        missed.push_back(i);
        continue;
      }
      g.slots[i] = static_cast<uint32_t>(slot);
      g.policy->Selected(static_cast<uint32_t>(slot), ids[i]);
    }
    for (size_t i : missed) {
      if (g.free_slots.empty()) {
        const std::optional<uint32_t> victim = g.policy->Victim();
        if (!victim) {  // slots >= ids: a resident token is not selected
          return Status::Internal("working set: no slot to replace");
        }
        Evict(g, *victim);
        stats.evictions++;
      }
      const uint32_t slot = g.free_slots.back();
      g.free_slots.pop_back();
      g.token_of_slot[slot] = ids[i];
      g.slot_of_token[static_cast<size_t>(ids[i])] = static_cast<int32_t>(slot);
      g.slots[i] = slot;
      g.policy->Selected(slot, ids[i]);
      for (uint16_t l : g.layers) layers[l].pending.push_back({slot, ids[i]});
    }
    g.has_selection = true;
    stats.steps++;
    stats.selected += ids.size();
    stats.misses += missed.size();
    stats.hits += ids.size() - missed.size();
    for (int32_t id : ids) {
      counts[CountKey(static_cast<uint32_t>(id) / options.page_tokens, full)]++;
    }
    return Status::OK();
  }

  Status Gather(uint16_t layer_index, std::span<std::byte> out) {
    if (layer_index >= layers.size()) {
      return Status::InvalidArgument(
          fmt::format("working set: no layer {}", layer_index));
    }
    Layer& layer = layers[layer_index];
    Group& g = groups[layer.group];
    if (!g.has_selection) {
      return Status::InvalidArgument(fmt::format(
          "working set: layer {}'s group has no selection (none yet, or the "
          "last one failed)",
          layer_index));
    }
    if (out.size() != g.ids.size() * size_t{layer.row_bytes}) {
      return Status::InvalidArgument(
          fmt::format("working set: {} B out for {} rows of {} B", out.size(),
                      g.ids.size(), layer.row_bytes));
    }
    TIERKV_RETURN_IF_ERROR(Fill(layer_index));
    for (size_t i = 0; i < g.slots.size(); ++i) {
      std::memcpy(out.data() + i * layer.row_bytes,
                  layer.rows.data() + size_t{g.slots[i]} * layer.row_bytes,
                  layer.row_bytes);
    }
    return Status::OK();
  }

  static uint64_t CountKey(uint32_t page, uint16_t layer) {
    return uint64_t{page} << 16 | layer;
  }

  const WorkingSetOptions options;
  const RowSource source;
  std::vector<Group> groups;
  std::vector<Layer> layers;
  std::vector<size_t> group_of_full;  // layer -> group index (full only)
  std::vector<uint64_t> mark;         // duplicate detection per Select
  uint64_t mark_epoch = 0;
  std::unordered_map<uint64_t, uint32_t> counts;  // CountKey -> selections
  WorkingSetStats stats;
};

Result<std::unique_ptr<SparseWorkingSet>> SparseWorkingSet::Create(
    const WorkingSetLayout& layout, const WorkingSetOptions& options,
    RowSource source) {
  const size_t n = layout.group_of_layer.size();
  if (n == 0 || n != layout.row_bytes.size() || n > UINT16_MAX) {
    return Status::InvalidArgument(
        "working set: one group and one row size per layer, at least one "
        "layer");
  }
  for (size_t l = 0; l < n; ++l) {
    const uint16_t g = layout.group_of_layer[l];
    if (g > l || layout.group_of_layer[g] != g) {
      return Status::InvalidArgument(fmt::format(
          "working set: layer {} follows layer {}, which is not a full "
          "layer at or before it",
          l, g));
    }
    if (layout.row_bytes[l] == 0) {
      return Status::InvalidArgument(
          fmt::format("working set: layer {} has rows of 0 B", l));
    }
  }
  if (options.slots == 0 || !(options.decay > 0 && options.decay < 1) ||
      options.page_tokens == 0) {
    return Status::InvalidArgument(
        "working set: slots and page_tokens must be > 0 and decay in (0, 1)");
  }
  if (!source) return Status::InvalidArgument("working set: no row source");
  return std::unique_ptr<SparseWorkingSet>(new SparseWorkingSet(
      std::make_unique<Impl>(layout, options, std::move(source))));
}

SparseWorkingSet::SparseWorkingSet(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

SparseWorkingSet::~SparseWorkingSet() = default;

Status SparseWorkingSet::Select(uint16_t group, std::span<const int32_t> ids,
                                int64_t context_tokens) {
  return impl_->Select(group, ids, context_tokens);
}

Status SparseWorkingSet::Gather(uint16_t layer, std::span<std::byte> out) {
  return impl_->Gather(layer, out);
}

void SparseWorkingSet::Reset() {
  for (auto& g : impl_->groups) impl_->ResetGroup(g);
}

std::vector<SelectionCount> SparseWorkingSet::TakeSelectionCounts() {
  std::vector<SelectionCount> out;
  out.reserve(impl_->counts.size());
  for (const auto& [key, count] : impl_->counts) {
    out.push_back({static_cast<uint32_t>(key >> 16),
                   static_cast<uint16_t>(key & 0xffff), count});
  }
  impl_->counts.clear();
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return std::tie(a.layer, a.page) < std::tie(b.layer, b.page);
  });
  return out;
}

WorkingSetStats SparseWorkingSet::stats() const { return impl_->stats; }

const WorkingSetOptions& SparseWorkingSet::options() const {
  return impl_->options;
}

}  // namespace tierkv
