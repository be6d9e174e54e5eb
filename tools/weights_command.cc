// `tierkv weights` (weights_command.h).
#include "tools/weights_command.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>

#include "client/weights_json.h"
#include "tools/human_bytes.h"

namespace tierkv::tools {

CLI::App* AddWeightsCommand(CLI::App& app, WeightsCommand& cmd) {
  auto* weights = app.add_subcommand(
      "weights",
      "Model weights in a weights namespace (-n): import, ls, drop, hint, "
      "pin");
  weights->require_subcommand(1);
  cmd.import = weights->add_subcommand(
      "import",
      "Store a safetensors checkpoint (a file, or a directory) as one shard; "
      "chunks stored before are not copied again");
  cmd.import->add_option("path", cmd.path, ".safetensors file or directory")
      ->required()
      ->check(CLI::ExistingPath);
  cmd.import->add_option("--model", cmd.model, "model name")->required();
  cmd.import
      ->add_option("--layout", cmd.layout,
                   "shard layout: engine, quantization, rank, e.g. "
                   "vllm-0.25/bf16/rank0-of-1")
      ->required();
  cmd.ls = weights->add_subcommand("ls", "List the sealed shards");
  cmd.ls->add_option("--model", cmd.model, "only this model");
  cmd.ls->add_flag("--json", cmd.json, "print JSON");
  cmd.drop = weights->add_subcommand(
      "drop", "Unseal shards; chunks no other shard uses are freed");
  cmd.drop->add_option("--model", cmd.model, "model name")->required();
  cmd.drop->add_option("--layout", cmd.layout,
                       "only this layout (default: every layout)");
  cmd.drop->add_option("--version", cmd.version,
                       "only this version, 32 hex digits (default: every "
                       "version)");
  cmd.hint = weights->add_subcommand(
      "hint",
      "Say when a shard is next used: the daemon evicts the farthest next "
      "use first and brings what is due from NVMe into DRAM ahead of it");
  cmd.pin = weights->add_subcommand(
      "pin", "Keep a shard in DRAM for a while (at most half its DRAM)");
  for (CLI::App* sub : {cmd.hint, cmd.pin}) {
    sub->add_option("--model", cmd.model, "model name")->required();
    sub->add_option("--layout", cmd.layout, "shard layout")->required();
    sub->add_option("--version", cmd.version,
                    "32 hex digits (default: the newest sealed)");
  }
  auto* in =
      cmd.hint->add_option("--in", cmd.seconds, "next use, in seconds from now")
          ->check(CLI::NonNegativeNumber);
  auto* clear = cmd.hint->add_flag("--clear", cmd.clear,
                                   "no known next use: clear the hint");
  in->excludes(clear);
  auto* ttl =
      cmd.pin->add_option("--ttl", cmd.seconds, "seconds to keep it in DRAM")
          ->check(CLI::PositiveNumber);
  auto* unpin = cmd.pin->add_flag("--unpin", cmd.clear, "end the pin");
  ttl->excludes(unpin);
  return weights;
}

namespace {

Status Import(Client& client, const WeightsCommand& cmd) {
  WeightsPutStats stats;
  auto m = ImportSafetensors(client, cmd.model, cmd.layout, cmd.path, &stats);
  if (!m.ok()) return m.status();
  fmt::print(
      "imported {} / {} version {}: {} tensors in {} layers, {} chunks, {}\n",
      m->model, m->layout, WeightsVersionOf(*m).ToHex(), m->tensors.size(),
      m->num_layers, m->chunks.size(), HumanBytes(m->image_bytes));
  fmt::print("  stored {} chunks ({}), {} deduplicated ({}, not copied)\n",
             stats.chunks_stored, HumanBytes(stats.bytes_stored),
             stats.chunks_deduplicated, HumanBytes(stats.bytes_deduplicated));
  return Status::OK();
}

Status List(Client& client, const WeightsCommand& cmd) {
  auto shards = client.ListWeights(cmd.model);
  if (!shards.ok()) return shards.status();
  if (cmd.json) {
    fmt::print("{}\n", client_internal::WeightsListJson(*shards));
    return Status::OK();
  }
  fmt::print(
      "{:<24} {:<28} {:<32} {:>6} {:>7} {:>10} {:>6} {:>6} {:>7} {:>10}\n",
      "model", "layout", "version", "layers", "tensors", "size", "dram", "nvme",
      "missing", "unique");
  for (const WeightsInfo& s : *shards) {
    fmt::print(
        "{:<24} {:<28} {:<32} {:>6} {:>7} {:>10} {:>6} {:>6} {:>7} {:>10}\n",
        s.id.model, s.id.layout, s.id.version.ToHex(), s.num_layers, s.tensors,
        HumanBytes(s.image_bytes), s.chunks_in_dram, s.chunks_on_nvme,
        s.chunks_missing, HumanBytes(s.unique_bytes));
  }
  return Status::OK();
}

// The shard (or, for drop, the shards) the command names.
Result<WeightsId> IdOf(const WeightsCommand& cmd) {
  WeightsId id{.model = cmd.model, .layout = cmd.layout};
  if (!cmd.version.empty()) {
    auto version = PageHash::FromHex(cmd.version);
    if (!version.ok()) {
      return Status::InvalidArgument("--version must be 32 hex digits");
    }
    id.version = *version;
  }
  return id;
}

// Whole milliseconds, at least 1 for a positive time (a pin of 0.1 ms is a
// pin, not an unpin); past ~31 years is forever in practice (and llround
// must not overflow).
std::chrono::milliseconds Millis(double seconds) {
  const long long ms = std::llround(std::min(seconds, 1e9) * 1000);
  return std::chrono::milliseconds(seconds > 0 ? std::max(ms, 1LL) : ms);
}

Status Hint(Client& client, const WeightsCommand& cmd) {
  if (!cmd.clear && cmd.hint->count("--in") == 0) {
    return Status::InvalidArgument("weights hint: --in SECONDS or --clear");
  }
  auto id = IdOf(cmd);
  if (!id.ok()) return id.status();
  const WeightsHint hint{
      *id, cmd.clear ? std::chrono::milliseconds(-1) : Millis(cmd.seconds)};
  TIERKV_RETURN_IF_ERROR(client.HintWeights({&hint, 1}));
  if (cmd.clear) {
    fmt::print("cleared the hint of {} / {}\n", id->model, id->layout);
  } else {
    fmt::print("{} / {} is next used in {} s\n", id->model, id->layout,
               cmd.seconds);
  }
  return Status::OK();
}

Status Pin(Client& client, const WeightsCommand& cmd) {
  if (!cmd.clear && cmd.pin->count("--ttl") == 0) {
    return Status::InvalidArgument("weights pin: --ttl SECONDS or --unpin");
  }
  auto id = IdOf(cmd);
  if (!id.ok()) return id.status();
  TIERKV_RETURN_IF_ERROR(client.PinWeights(
      *id, cmd.clear ? std::chrono::milliseconds(0) : Millis(cmd.seconds)));
  if (cmd.clear) {
    fmt::print("unpinned {} / {}\n", id->model, id->layout);
  } else {
    fmt::print("pinned {} / {} in DRAM for {} s\n", id->model, id->layout,
               cmd.seconds);
  }
  return Status::OK();
}

Status Drop(Client& client, const WeightsCommand& cmd) {
  auto id = IdOf(cmd);
  if (!id.ok()) return id.status();
  auto dropped = client.DropWeights(*id);
  if (!dropped.ok()) return dropped.status();
  fmt::print("dropped {} shard{}, freed {}\n", dropped->shards,
             dropped->shards == 1 ? "" : "s", HumanBytes(dropped->freed_bytes));
  return Status::OK();
}

}  // namespace

Status RunWeightsCommand(Client& client, const WeightsCommand& cmd) {
  if (cmd.import->parsed()) return Import(client, cmd);
  if (cmd.ls->parsed()) return List(client, cmd);
  if (cmd.drop->parsed()) return Drop(client, cmd);
  if (cmd.hint->parsed()) return Hint(client, cmd);
  if (cmd.pin->parsed()) return Pin(client, cmd);
  return Status::InvalidArgument("weights: import, ls, drop, hint or pin");
}

}  // namespace tierkv::tools
