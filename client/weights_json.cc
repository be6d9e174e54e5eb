// JSON views of weights values (weights_json.h).
#include "client/weights_json.h"

#include <nlohmann/json.hpp>

namespace tierkv::client_internal {

std::string WeightsListJson(std::span<const WeightsInfo> shards) {
  nlohmann::json out = nlohmann::json::array();
  for (const WeightsInfo& s : shards) {
    out.push_back({{"model", s.id.model},
                   {"layout", s.id.layout},
                   {"version", s.id.version.ToHex()},
                   {"image_bytes", s.image_bytes},
                   {"tensors", s.tensors},
                   {"chunks", s.chunks},
                   {"num_layers", s.num_layers},
                   {"sealed_unix_ms", s.sealed_unix_ms},
                   {"chunks_in_dram", s.chunks_in_dram},
                   {"chunks_on_nvme", s.chunks_on_nvme},
                   {"chunks_missing", s.chunks_missing},
                   {"unique_bytes", s.unique_bytes}});
  }
  return out.dump();
}

std::string WeightsManifestJson(const WeightsManifest& manifest) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const WeightsTensor& t : manifest.tensors) {
    tensors.push_back({{"name", t.name},
                       {"dtype", t.dtype},
                       {"shape", t.shape},
                       {"layer", t.layer},
                       {"offset", t.offset},
                       {"bytes", t.bytes}});
  }
  nlohmann::json chunks = nlohmann::json::array();
  for (const WeightsChunk& c : manifest.chunks) {
    chunks.push_back({{"key", c.key.ToHex()},
                      {"offset", c.offset},
                      {"bytes", c.bytes},
                      {"layer", c.layer}});
  }
  return nlohmann::json{{"model", manifest.model},
                        {"layout", manifest.layout},
                        {"version", WeightsVersionOf(manifest).ToHex()},
                        {"num_layers", manifest.num_layers},
                        {"image_bytes", manifest.image_bytes},
                        {"tensors", std::move(tensors)},
                        {"chunks", std::move(chunks)}}
      .dump();
}

}  // namespace tierkv::client_internal
