// SparseWorkingSet: slot maps per IndexShare group, row buffers per layer,
// and the row copies between them and the source (see
// include/tierkv/sparse_working_set.h).
#include "tierkv/sparse_working_set.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_map>

#include "client/slot_policy.h"
#include "storage/device/device_backend.h"

namespace tierkv {

using client_internal::SlotPolicy;

namespace {

// A device row gather is a few microseconds of work; a stream that does
// not finish one in this long is a broken device, reported as IOError.
// Such a gather's slots are emptied, and need no quarantine (unlike the
// daemon's, storage/device/device_quarantine.h): every gather and copy of the
// working set runs on its one in-order stream, so whatever fills those
// slots again is queued behind the late gather and lands after it, and
// no selection serves them before a later wait on that stream succeeds.
constexpr std::chrono::milliseconds kDeviceTimeout{30'000};

// Each layer's slots start on this boundary in the device pool (the row
// gather's 16-byte vector path needs 16; 256 matches cudaMalloc's).
constexpr uint64_t kDeviceAlignment = 256;

}  // namespace

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
    std::vector<std::byte> rows;  // [slots][row_bytes]; empty on a device
    uint64_t device_offset = 0;   // of its slots in the device pool
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
      if (o.memory == WorkingSetMemory::kHost) {
        layer.rows.resize(size_t{o.slots} * layer.row_bytes);
      }
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
  // for a token, or the device copy's error: those tokens' slots are
  // emptied for the whole group, and the group's selection is no longer
  // served (Gather and Rows fail until the next Select).
  // `on`: gather on the engine's stream (no host wait), else on the working
  // set's own and wait.
  Status Fill(uint16_t layer_index, const storage::ForeignStream* on) {
    Layer& layer = layers[layer_index];
    Group& g = groups[layer.group];
    Status failed;
    gather_rows.clear();
    gather_slots.clear();
    for (const auto& [slot, token] : layer.pending) {
      if (g.token_of_slot[slot] != token) continue;  // emptied meanwhile
      const std::span<const std::byte> row = source(layer_index, token);
      if (row.size() != layer.row_bytes) {
        failed = Status::NotFound(fmt::format(
            "working set: no row of token {} in layer {}", token, layer_index));
        Evict(g, slot);
        continue;
      }
      if (device) {
        gather_rows.push_back(row.data());
        gather_slots.push_back(slot);
      } else {
        std::memcpy(layer.rows.data() + size_t{slot} * layer.row_bytes,
                    row.data(), layer.row_bytes);
      }
      stats.bytes_in += layer.row_bytes;
    }
    layer.pending.clear();
    if (device && !gather_rows.empty()) {
      Status copied = GatherOnDevice(layer, on);
      if (!copied.ok()) {
        for (uint32_t slot : gather_slots) Evict(g, slot);
        stats.bytes_in -= gather_rows.size() * uint64_t{layer.row_bytes};
        failed = std::move(copied);
      }
    }
    if (!failed.ok()) g.has_selection = false;
    return failed;
  }

  // gather_rows -> their gather_slots of `layer` in the device pool, one
  // row gather: on the engine's stream `on` (ordered with its kernels, not
  // waited for), or on the working set's stream and waited for; either
  // way the layer's attention reads them next.
  Status GatherOnDevice(const Layer& layer, const storage::ForeignStream* on) {
    storage::DeviceBackend& b = *device->backend;
    const storage::DeviceRegion slots{
        device->pool, layer.device_offset,
        uint64_t{options.slots} * layer.row_bytes};
    if (on != nullptr) {
      TIERKV_RETURN_IF_ERROR(b.GatherRowsOn(*on, slots, gather_rows,
                                            layer.row_bytes, gather_slots));
      engine_stream = *on;
      stats.gathers++;
      return Status::OK();
    }
    TIERKV_RETURN_IF_ERROR(
        b.GatherRows(0, slots, gather_rows, layer.row_bytes, gather_slots));
    auto done = b.RecordEvent(0);
    if (!done.ok()) return done.status();
    stats.gathers++;
    return b.WaitEvent(*done, kDeviceTimeout);
  }

  // Before a fill or read without the engine's stream, after stream-ordered
  // gathers: the working set's own stream waits for what the engine's
  // stream held (those gathers), and the host for that, so neither a new
  // gather nor a host read overtakes them on the slots.
  Status SettleEngineStream() {
    if (!engine_stream) return Status::OK();
    storage::DeviceBackend& b = *device->backend;
    TIERKV_RETURN_IF_ERROR(b.StreamWaitForeign(0, *engine_stream));
    auto done = b.RecordEvent(0);
    if (!done.ok()) return done.status();
    TIERKV_RETURN_IF_ERROR(b.WaitEvent(*done, kDeviceTimeout));
    engine_stream.reset();
    return Status::OK();
  }

  Result<WorkingSetRows> RowsOn(uint16_t layer_index,
                                const EngineStream& stream) {
    if (!device) {
      return Status::InvalidArgument(
          "working set: a stream-ordered Rows needs a device buffer "
          "(WorkingSetMemory::kDevice)");
    }
    storage::ForeignStream on;
    if (device->backend->host_addressable()) {  // emulated
      if (stream.handle == nullptr) {
        return Status::InvalidArgument(
            "working set: on the emulated device, EngineStream::handle is "
            "the emulated DeviceBackend standing in for the engine's");
      }
      on.emulated = static_cast<storage::DeviceBackend*>(stream.handle);
      on.emulated_stream = stream.emulated_stream;
    } else {
      on.cuda = stream.handle;
    }
    return Rows(layer_index, &on);
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
    // Rows still owed by the previous selection go in before slots move,
    // on the engine's stream when the engine orders fills on one.
    for (uint16_t l : g.layers) {
      TIERKV_RETURN_IF_ERROR(
          Fill(l, engine_stream ? &*engine_stream : nullptr));
    }
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

  // The layer, once its group has a selection and the layer's rows of it
  // are in.
  Result<Layer*> Ready(uint16_t layer_index, const storage::ForeignStream* on) {
    if (layer_index >= layers.size()) {
      return Status::InvalidArgument(
          fmt::format("working set: no layer {}", layer_index));
    }
    Layer& layer = layers[layer_index];
    if (!groups[layer.group].has_selection) {
      return Status::InvalidArgument(fmt::format(
          "working set: layer {}'s group has no selection (none yet, or the "
          "last one failed)",
          layer_index));
    }
    if (on == nullptr) TIERKV_RETURN_IF_ERROR(SettleEngineStream());
    TIERKV_RETURN_IF_ERROR(Fill(layer_index, on));
    return &layer;
  }

  // `on` as Fill's.
  Result<WorkingSetRows> Rows(uint16_t layer_index,
                              const storage::ForeignStream* on = nullptr) {
    auto ready = Ready(layer_index, on);
    if (!ready.ok()) return ready.status();
    const Layer& layer = **ready;
    WorkingSetRows rows;
    rows.row_bytes = layer.row_bytes;
    rows.slots = groups[layer.group].slots;
    if (device) {
      rows.base = device->base + layer.device_offset;
      rows.host_addressable = device->backend->host_addressable();
    } else {
      rows.base = layer.rows.data();
    }
    return rows;
  }

  Status Gather(uint16_t layer_index, std::span<std::byte> out) {
    auto rows = Rows(layer_index);
    if (!rows.ok()) return rows.status();
    if (out.size() != rows->slots.size() * size_t{rows->row_bytes}) {
      return Status::InvalidArgument(
          fmt::format("working set: {} B out for {} rows of {} B", out.size(),
                      rows->slots.size(), rows->row_bytes));
    }
    const uint32_t rb = rows->row_bytes;
    if (rows->host_addressable) {
      for (size_t i = 0; i < rows->slots.size(); ++i) {
        std::memcpy(out.data() + i * rb,
                    rows->base + size_t{rows->slots[i]} * rb, rb);
      }
      return Status::OK();
    }
    // A device the host cannot address: the selection packed on the
    // device (one kernel), then copied back in one piece.
    storage::DeviceBackend& b = *device->backend;
    if (out.empty()) return Status::OK();
    if (device->pack_bytes < out.size()) {
      // Grown once to the largest selection; nothing is in flight (every
      // Gather waits for its copy).
      if (device->pack_bytes != 0) {
        TIERKV_RETURN_IF_ERROR(b.FreePool(device->pack_pool));
        device->pack_bytes = 0;
      }
      auto pack = b.AllocatePool(out.size());
      if (!pack.ok()) return pack.status();
      device->pack_pool = pack->id;
      device->pack_bytes = out.size();
    }
    const uint64_t offset = layers[layer_index].device_offset;
    const storage::DeviceRegion packed{device->pack_pool, 0, out.size()};
    TIERKV_RETURN_IF_ERROR(b.PackRows(
        0, packed, {device->pool, offset, uint64_t{options.slots} * rb}, rb,
        rows->slots));
    TIERKV_RETURN_IF_ERROR(b.CopyToHost(0, out, packed));
    auto done = b.RecordEvent(0);
    if (!done.ok()) return done.status();
    return b.WaitEvent(*done, kDeviceTimeout);
  }

  // kDevice: opens the backend and allocates one pool for every layer's
  // slots.
  Status OpenDevice() {
    auto kind = storage::ParseDeviceBackendKind(options.device_backend);
    if (!kind.ok()) return kind.status();
    uint64_t bytes = 0;
    for (Layer& layer : layers) {
      layer.device_offset = bytes;
      bytes += uint64_t{options.slots} * layer.row_bytes;
      bytes =
          (bytes + kDeviceAlignment - 1) / kDeviceAlignment * kDeviceAlignment;
    }
    storage::DeviceBackendOptions o;
    o.kind = *kind;
    static_assert(storage::DeviceBackendOptions::kCurrentDevice == -1,
                  "WorkingSetOptions::device documents -1");
    o.device = options.device;
    o.streams = 1;  // one decode loop
    // The emulated device holds exactly the slots.
    o.emulated_capacity_bytes = bytes;
    DeviceSlots d;
    auto backend = storage::DeviceBackend::Open(o, &fallback);
    if (!backend.ok()) return backend.status();
    d.backend = std::move(backend).value();
    auto pool = d.backend->AllocatePool(bytes);
    if (!pool.ok()) return pool.status();
    d.pool = pool->id;
    auto base = d.backend->PoolBase(d.pool);
    if (!base.ok()) return base.status();
    d.base = *base;
    device = std::move(d);
    return Status::OK();
  }

  Status RegisterSourceMemory(std::span<std::byte> memory) {
    if (!device) return Status::OK();
    TIERKV_RETURN_IF_ERROR(device->backend->RegisterHost(memory));
    device->registered.push_back(memory.data());
    return Status::OK();
  }

  ~Impl() {
    if (!device) return;
    // Nothing is in flight: every gather and copy was waited for.
    for (std::byte* range : device->registered) {
      (void)device->backend->UnregisterHost(range);
    }
    (void)device->backend->FreePool(device->pool);
    if (device->pack_bytes != 0) {
      (void)device->backend->FreePool(device->pack_pool);
    }
  }

  // The engine's stream of the last stream-ordered Rows: fills follow on
  // it, until work on the working set's own stream orders itself after it.
  std::optional<storage::ForeignStream> engine_stream;

  struct DeviceSlots {
    std::unique_ptr<storage::DeviceBackend> backend;
    uint32_t pool = 0;
    std::byte* base = nullptr;  // of the pool, in this process
    std::vector<std::byte*> registered;
    // Gather's packed selection (PackRows), allocated at the first Gather
    // on a device the host cannot address.
    uint32_t pack_pool = 0;
    uint64_t pack_bytes = 0;
  };

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
  std::optional<DeviceSlots> device;  // kDevice only
  std::string fallback;               // why "auto" emulates
  // Fill's lists for the device's row gather (kept to reuse their memory).
  std::vector<const std::byte*> gather_rows;
  std::vector<uint32_t> gather_slots;
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
  auto impl = std::make_unique<Impl>(layout, options, std::move(source));
  if (options.memory == WorkingSetMemory::kDevice) {
    TIERKV_RETURN_IF_ERROR(impl->OpenDevice());
  }
  return std::unique_ptr<SparseWorkingSet>(
      new SparseWorkingSet(std::move(impl)));
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

Result<WorkingSetRows> SparseWorkingSet::Rows(uint16_t layer) {
  return impl_->Rows(layer);
}

Result<WorkingSetRows> SparseWorkingSet::Rows(uint16_t layer,
                                              const EngineStream& stream) {
  return impl_->RowsOn(layer, stream);
}

Status SparseWorkingSet::RegisterSourceMemory(std::span<std::byte> memory) {
  return impl_->RegisterSourceMemory(memory);
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

std::string_view SparseWorkingSet::buffer_backend() const {
  return impl_->device ? impl_->device->backend->name() : "host";
}

std::string_view SparseWorkingSet::buffer_fallback() const {
  return impl_->fallback;
}

int SparseWorkingSet::buffer_device() const {
  return impl_->device ? impl_->device->backend->device() : -1;
}

}  // namespace tierkv
