// TopkTraceRecorder: writes the lightning indexer's decode-step selections
// of a Model run to a top-k trace (topk_trace.h), one record per decode
// step with one selection per full (indexer) layer. Fed by the model's
// SelectionObserver (ModelOptions::observer); `tierkv-run --record-topk`.
//
// Which positions: those at or after `first_decode_position` (the prompt
// length), i.e. the tokens fed by decode steps; the prompt's selections
// (prefill, or a prefix loaded from tierkvd) are not recorded.
//
// Unscored steps: when a step's visible tokens (position + 1) are <= k
// (index_topk) the model selects every causal token without scoring and
// the observer does not fire. The recorder writes those steps itself, as
// the ids [0, visible) on every full layer: that is exactly what the model
// attends over (model.cc), and making the observer fire for them would
// change the model's hook for every other user. Only positions with
// visible <= k may be filled in; a missing selection elsewhere is an error.
//
// Thread safety: not thread-safe; the model calls its observer from the
// thread that runs Forward().
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "executor/config.h"
#include "executor/model.h"
#include "executor/topk_trace.h"
#include "tierkv/status.h"

namespace tierkv::executor {

class TopkTraceRecorder {
 public:
  // Creates the trace file for a model of `config` (its full layers and
  // index_topk). Returns TopkTraceWriter::Create's errors.
  // REQUIRES: first_decode_position >= 0.
  static Result<std::unique_ptr<TopkTraceRecorder>> Create(
      const std::filesystem::path& path, const ModelConfig& config,
      int64_t page_tokens, int64_t first_decode_position, std::string source);
  TopkTraceRecorder(const TopkTraceRecorder&) = delete;
  TopkTraceRecorder& operator=(const TopkTraceRecorder&) = delete;

  // An observer for ModelOptions::observer that forwards to OnSelection.
  // Borrows this recorder: it must outlive every call of the observer.
  SelectionObserver Observer();

  // One full layer's selection at `position` (ascending ids). A step is
  // appended once every full layer has reported it. Errors (a layer that
  // is not full, a step left incomplete, a write failure) are kept and
  // returned by Finish(); later calls are then ignored.
  void OnSelection(int64_t layer, int64_t position,
                   std::span<const int32_t> selected);

  // Ends the trace after the decode steps at positions below
  // `end_position`: writes the unscored steps not yet written and the end
  // record. Returns the first error of the run: Internal for a missing
  // selection, the writer's errors otherwise. Call once.
  Status Finish(int64_t end_position);

  const TopkTraceHeader& header() const { return writer_->header(); }
  int64_t steps_written() const { return writer_->steps_written(); }
  uint64_t bytes_written() const { return writer_->bytes_written(); }

 private:
  TopkTraceRecorder(std::unique_ptr<TopkTraceWriter> writer,
                    int64_t first_decode_position);
  // Appends the dense steps [next_position_, end): each must be unscored.
  Status FillUnscoredSteps(int64_t end);

  std::unique_ptr<TopkTraceWriter> writer_;
  const int64_t first_decode_position_;
  int64_t next_position_;  // the first position not yet written
  // The step being assembled, for position pending_position_ (-1: none).
  int64_t pending_position_ = -1;
  TopkStep pending_;
  std::vector<bool> pending_filled_;
  size_t pending_count_ = 0;
  Status error_;
};

}  // namespace tierkv::executor
