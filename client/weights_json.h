// JSON views of weights values, for the interfaces that speak JSON: the C
// API (tierkv_weights_manifest_json, tierkv_weights_list_json, and so the
// Python package) and `tierkv weights ls --json`. One spelling for all.
//
//   WeightsListJson: [{"model": "m", "layout": "l", "version": "<32 hex>",
//     "image_bytes": 1, "tensors": 1, "chunks": 1, "num_layers": 1,
//     "sealed_unix_ms": 1, "chunks_in_dram": 1, "chunks_on_nvme": 0,
//     "chunks_missing": 0, "unique_bytes": 1}, ...]
//   WeightsManifestJson: {"model", "layout", "version", "num_layers",
//     "image_bytes", "tensors": [{"name", "dtype", "shape": [..], "layer",
//     "offset", "bytes"}, ...], "chunks": [{"key", "offset", "bytes",
//     "layer"}, ...]}
//
// Thread safety: pure functions.
#pragma once

#include <span>
#include <string>

#include "tierkv/weights.h"

namespace tierkv::client_internal {

std::string WeightsListJson(std::span<const WeightsInfo> shards);
std::string WeightsManifestJson(const WeightsManifest& manifest);

}  // namespace tierkv::client_internal
