// TopkTraceRecorder (see topk_trace_recorder.h).
#include "executor/topk_trace_recorder.h"

#include <fmt/format.h>

#include <numeric>

namespace tierkv::executor {

TopkTraceRecorder::TopkTraceRecorder(std::unique_ptr<TopkTraceWriter> writer,
                                     int64_t first_decode_position)
    : writer_(std::move(writer)),
      first_decode_position_(first_decode_position),
      next_position_(first_decode_position) {
  const size_t num_full = writer_->header().full_layers.size();
  pending_.selections.resize(num_full);
  pending_filled_.assign(num_full, false);
}

Result<std::unique_ptr<TopkTraceRecorder>> TopkTraceRecorder::Create(
    const std::filesystem::path& path, const ModelConfig& config,
    int64_t page_tokens, int64_t first_decode_position, std::string source) {
  auto header = TopkTraceHeaderFor(config.indexer_full, page_tokens,
                                   config.index_topk, std::move(source));
  if (!header.ok()) return header.status();
  auto writer = TopkTraceWriter::Create(path, *header);
  if (!writer.ok()) return writer.status();
  return std::unique_ptr<TopkTraceRecorder>(
      new TopkTraceRecorder(std::move(writer).value(), first_decode_position));
}

SelectionObserver TopkTraceRecorder::Observer() {
  return [this](int64_t layer, int64_t position, std::span<const float>,
                std::span<const int32_t> selected) {
    OnSelection(layer, position, selected);
  };
}

Status TopkTraceRecorder::FillUnscoredSteps(int64_t end) {
  const TopkTraceHeader& h = writer_->header();
  TopkStep dense;
  dense.selections.resize(h.full_layers.size());
  for (int64_t p = next_position_; p < end; ++p) {
    if (p + 1 > h.k) {
      return Status::Internal(fmt::format(
          "topk trace: no selection observed at position {} ({} visible "
          "tokens > k = {}, so the indexer must have scored it)",
          p, p + 1, h.k));
    }
    dense.context_tokens = p + 1;
    for (auto& ids : dense.selections) {
      ids.resize(static_cast<size_t>(p + 1));
      std::iota(ids.begin(), ids.end(), 0);
    }
    TIERKV_RETURN_IF_ERROR(writer_->Append(dense));
    next_position_ = p + 1;
  }
  return Status::OK();
}

void TopkTraceRecorder::OnSelection(int64_t layer, int64_t position,
                                    std::span<const int32_t> selected) {
  if (!error_.ok()) return;
  if (position < next_position_) {
    // Prefill positions are not recorded; a written one must not recur.
    if (position >= first_decode_position_) {
      error_ = Status::Internal(fmt::format(
          "topk trace: layer {} selected at position {}, which was already "
          "written",
          layer, position));
    }
    return;
  }
  const TopkTraceHeader& h = writer_->header();
  const int f = h.FullIndex(layer);
  if (f < 0) {
    error_ = Status::Internal(fmt::format(
        "topk trace: a selection of layer {}, which is not a full layer",
        layer));
    return;
  }
  if (position != pending_position_) {
    if (pending_position_ >= 0) {
      error_ = Status::Internal(fmt::format(
          "topk trace: the step at position {} got {} of {} full layers' "
          "selections before position {} began",
          pending_position_, pending_count_, h.full_layers.size(), position));
      return;
    }
    if (error_ = FillUnscoredSteps(position); !error_.ok()) return;
    pending_position_ = position;
    pending_.context_tokens = position + 1;
    pending_filled_.assign(pending_filled_.size(), false);
    pending_count_ = 0;
  }
  if (pending_filled_[f]) {
    error_ = Status::Internal(fmt::format(
        "topk trace: layer {} selected twice at position {}", layer, position));
    return;
  }
  pending_.selections[f].assign(selected.begin(), selected.end());
  pending_filled_[f] = true;
  if (++pending_count_ < pending_filled_.size()) return;
  if (error_ = writer_->Append(pending_); !error_.ok()) return;
  next_position_ = position + 1;
  pending_position_ = -1;
}

Status TopkTraceRecorder::Finish(int64_t end_position) {
  if (!error_.ok()) return error_;
  if (pending_position_ >= 0) {
    return Status::Internal(fmt::format(
        "topk trace: the step at position {} got {} of {} full layers' "
        "selections",
        pending_position_, pending_count_, pending_filled_.size()));
  }
  if (next_position_ > end_position) {
    return Status::Internal(fmt::format(
        "topk trace: selections observed up to position {}, past the end {}",
        next_position_ - 1, end_position));
  }
  TIERKV_RETURN_IF_ERROR(FillUnscoredSteps(end_position));
  return writer_->Finish();
}

}  // namespace tierkv::executor
