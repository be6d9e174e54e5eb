// DaemonWeights: a model's weights kept in tierkvd instead of read from its
// files each time (issue 28, the reference executor's teacher switching).
//
// A checkpoint is stored as its safetensors tensors, bytes as they are in
// the files (bf16, fp8 and their scales), one shard per checkpoint (layout
// kExecutorWeightsLayout), under a model name the caller picks. Loading one
// copies the shard from the daemon (DRAM, or NVMe through DRAM) into an
// image in this process, layer group by layer group, and builds the
// executor's fp32 weights from those bytes with the very code that builds
// them from files (LoadWeights over a SafetensorsReader): logits through
// the daemon are bit-identical to logits from the files by construction,
// and tests/executor/weights_switch_test.cc checks it.
//
// Thread safety: one thread.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "executor/config.h"
#include "executor/model.h"
#include "tierkv/client.h"
#include "tierkv/status.h"
#include "tierkv/weights.h"

namespace tierkv::executor {

// The shard layout of a checkpoint stored by DaemonWeights: one rank, the
// files' own tensors and dtypes.
inline constexpr char kExecutorWeightsLayout[] =
    "tierkv-run/safetensors/rank0-of-1";

struct DaemonWeightsOptions {
  ClientOptions client;                    // socket path, reply timeout
  std::string namespace_name = "weights";  // a `weights = true` namespace
  std::string token;
};

// What one LoadModel did.
struct WeightsLoadReport {
  uint64_t bytes = 0;           // the shard's image
  double load_seconds = 0;      // daemon -> image
  double convert_seconds = 0;   // image -> fp32 weights
  uint32_t chunks_in_dram = 0;  // where its chunks were when asked
  uint32_t chunks_on_nvme = 0;
};

class DaemonWeights {
 public:
  static Result<std::unique_ptr<DaemonWeights>> Connect(
      const DaemonWeightsOptions& options);

  // Stores the safetensors of checkpoint `dir` as model `name` (chunks the
  // daemon has already cost no copy) and returns the sealed manifest.
  Result<WeightsManifest> Import(const std::string& name,
                                 const std::filesystem::path& dir);

  // Loads `manifest`'s shard from the daemon and builds a Model of `config`
  // from its bytes. Errors: the daemon's (NotFound naming a chunk no tier
  // holds), the weights loader's (a tensor missing from the shard).
  Result<std::unique_ptr<Model>> LoadModel(const WeightsManifest& manifest,
                                           ModelConfig config,
                                           const ModelOptions& options,
                                           WeightsLoadReport* report = nullptr);

  Client& client() { return *client_; }

 private:
  explicit DaemonWeights(std::unique_ptr<Client> client)
      : client_(std::move(client)) {}
  std::unique_ptr<Client> client_;
  std::vector<std::byte> image_;  // reused across loads
};

}  // namespace tierkv::executor
