#include "executor/daemon_weights.h"

#include <fmt/format.h>

#include <chrono>

#include "common/safetensors.h"
#include "executor/weights.h"

namespace tierkv::executor {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

Result<std::unique_ptr<DaemonWeights>> DaemonWeights::Connect(
    const DaemonWeightsOptions& options) {
  auto client = Client::Connect(options.client);
  if (!client.ok()) return client.status();
  TIERKV_RETURN_IF_ERROR(
      (*client)->OpenNamespace(options.namespace_name, options.token));
  return std::unique_ptr<DaemonWeights>(
      new DaemonWeights(std::move(client).value()));
}

Result<WeightsManifest> DaemonWeights::Import(
    const std::string& name, const std::filesystem::path& dir) {
  return ImportSafetensors(*client_, name, kExecutorWeightsLayout, dir);
}

Result<std::unique_ptr<Model>> DaemonWeights::LoadModel(
    const WeightsManifest& manifest, ModelConfig config,
    const ModelOptions& options, WeightsLoadReport* report) {
  WeightsLoadReport r;
  r.bytes = manifest.image_bytes;
  const PageHash version = WeightsVersionOf(manifest);
  if (auto listed = client_->ListWeights(manifest.model); listed.ok()) {
    for (const WeightsInfo& info : *listed) {
      if (info.id.layout == manifest.layout && info.id.version == version) {
        r.chunks_in_dram = info.chunks_in_dram;
        r.chunks_on_nvme = info.chunks_on_nvme;
      }
    }
  }
  if (image_.size() < manifest.image_bytes) image_.resize(manifest.image_bytes);
  const auto t0 = Clock::now();
  auto load = client_->LoadWeights(manifest, image_);
  if (!load.ok()) return load.status();
  TIERKV_RETURN_IF_ERROR(load->Wait());
  const auto t1 = Clock::now();
  // The shard's tensors, viewed where the load put them: the reader the
  // files would give, over the daemon's bytes.
  std::vector<TensorView> views;
  views.reserve(manifest.tensors.size());
  for (const WeightsTensor& t : manifest.tensors) {
    views.push_back(TensorView{
        .name = t.name,
        .dtype = t.dtype,
        .shape = t.shape,
        .data = std::span<const std::byte>(image_).subspan(t.offset, t.bytes),
        .file = fmt::format("tierkvd weights {} {}", manifest.model,
                            version.ToHex())});
  }
  auto reader = SafetensorsReader::FromViews(std::move(views));
  if (!reader.ok()) return reader.status();
  auto weights = LoadWeights(config, **reader);
  if (!weights.ok()) return weights.status();
  r.load_seconds = Seconds(t0, t1);
  r.convert_seconds = Seconds(t1, Clock::now());
  if (report != nullptr) *report = r;
  return Model::Create(std::move(config), std::move(weights).value(), options);
}

}  // namespace tierkv::executor
