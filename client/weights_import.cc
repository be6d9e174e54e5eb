// ImportSafetensors (client.h): a safetensors checkpoint stored as one
// weights shard, straight from the reader's file mapping.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <optional>

#include "common/safetensors.h"
#include "tierkv/client.h"

namespace tierkv {

namespace {

// N of the first name component "layers.N" (HF `model.layers.3.mlp`,
// Megatron `decoder.layers.3.mlp`), else nullopt.
std::optional<uint64_t> LayerOfName(std::string_view name) {
  constexpr std::string_view kLayers = "layers.";
  for (size_t at = name.find(kLayers); at != std::string_view::npos;
       at = name.find(kLayers, at + 1)) {
    if (at != 0 && name[at - 1] != '.') continue;  // "sublayers.3"
    const char* digits = name.data() + at + kLayers.size();
    const char* end = name.data() + name.size();
    uint64_t n = 0;
    auto [next, ec] = std::from_chars(digits, end, n);
    if (ec != std::errc() || next == digits) continue;
    if (next != end && *next != '.') continue;  // "layers.3x"
    return n;
  }
  return std::nullopt;
}

}  // namespace

Result<WeightsManifest> ImportSafetensors(Client& client, std::string model,
                                          std::string layout,
                                          const std::filesystem::path& path,
                                          WeightsPutStats* stats) {
  auto opened = SafetensorsReader::Open(path);
  if (!opened.ok()) return opened.status();
  const SafetensorsReader& reader = **opened;
  const std::vector<const TensorView*> in_file_order = reader.InFileOrder();
  if (in_file_order.empty()) {
    return Status::InvalidArgument(
        fmt::format("{} holds no tensors", path.string()));
  }

  // Each tensor's layer number (before renumbering), in file order.
  std::vector<std::optional<uint64_t>> numbers;
  std::map<uint64_t, uint32_t> group_of;  // layer number -> dense group
  size_t first_layered = in_file_order.size();
  for (size_t i = 0; i < in_file_order.size(); ++i) {
    numbers.push_back(LayerOfName(in_file_order[i]->name));
    if (numbers.back()) {
      group_of.emplace(*numbers.back(), 0);
      first_layered = std::min(first_layered, i);
    }
  }
  uint32_t next_group = 0;
  for (auto& [number, group] : group_of) group = next_group++;
  const uint32_t last_group = next_group == 0 ? 0 : next_group - 1;

  struct Ordered {
    uint32_t group;
    size_t file_position;
  };
  std::vector<Ordered> order;
  for (size_t i = 0; i < in_file_order.size(); ++i) {
    const TensorView& v = *in_file_order[i];
    if (v.data.empty()) {
      return Status::InvalidArgument(fmt::format(
          "tensor '{}' of {} has no bytes, which a weights image cannot hold",
          v.name, v.file));
    }
    uint32_t group = last_group;
    if (numbers[i]) {
      group = group_of.at(*numbers[i]);
    } else if (i < first_layered) {
      group = 0;
    }
    order.push_back({group, i});
  }
  std::stable_sort(
      order.begin(), order.end(),
      [](const Ordered& a, const Ordered& b) { return a.group < b.group; });

  std::vector<WeightsTensorData> tensors;
  tensors.reserve(order.size());
  for (const Ordered& o : order) {
    const TensorView& v = *in_file_order[o.file_position];
    tensors.push_back({.tensor = {.name = v.name,
                                  .dtype = v.dtype,
                                  .shape = v.shape,
                                  .layer = o.group,
                                  .bytes = v.data.size()},
                       .data = v.data});
  }
  return client.PutWeights(std::move(model), std::move(layout), tensors, stats);
}

}  // namespace tierkv
