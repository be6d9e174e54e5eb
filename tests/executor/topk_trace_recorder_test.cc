// Tests for executor/topk_trace_recorder: a model run's decode-step
// selections, recorded through the SelectionObserver, read back equal to
// what an observer sees; unscored steps recorded as every visible token;
// errors for selections that cannot make a step.
#include "executor/topk_trace_recorder.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <vector>

#include "executor/generator.h"
#include "executor/presets.h"
#include "tests/executor/test_tokens.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace tierkv::executor {
namespace {

// (layer, position) -> the selection an observer saw.
using Observed = std::map<std::pair<int64_t, int64_t>, std::vector<int32_t>>;

struct RecordedRun {
  Observed observed;
  int64_t decode_steps = 0;
};

// Generates `new_tokens` after a prompt of `prompt_tokens` on the tiny
// preset (full layers 0, 1, 3; index_topk 16), recording to `path` and
// observing every selection alongside.
RecordedRun RecordRun(const std::string& path, int64_t prompt_tokens,
                      int64_t new_tokens) {
  RecordedRun run;
  const ModelConfig c = PresetConfig("tiny").value();
  auto recorder = TopkTraceRecorder::Create(path, c, /*page_tokens=*/64,
                                            prompt_tokens, "recorder test");
  EXPECT_OK(recorder);
  if (!recorder.ok()) return run;
  ModelOptions o;
  const SelectionObserver record = (*recorder)->Observer();
  o.observer = [&](int64_t layer, int64_t position,
                   std::span<const float> scores,
                   std::span<const int32_t> selected) {
    run.observed[{layer, position}].assign(selected.begin(), selected.end());
    record(layer, position, scores, selected);
  };
  auto model = Model::Create(c, RandomWeights(c, /*seed=*/1), o);
  EXPECT_OK(model);
  auto cache = (*model)->NewCache(prompt_tokens + new_tokens);
  EXPECT_OK(cache);
  GenerateOptions g;
  g.max_new_tokens = new_tokens;
  auto r = Generate(**model, cache->get(), TestTokens(prompt_tokens), g);
  EXPECT_OK(r);
  run.decode_steps = r->decode_steps;
  EXPECT_OK((*recorder)->Finish(prompt_tokens + r->decode_steps));
  return run;
}

std::vector<TopkStep> ReadSteps(const std::string& path,
                                TopkTraceHeader* header) {
  std::vector<TopkStep> steps;
  auto reader = TopkTraceReader::Open(path);
  EXPECT_OK(reader);
  if (!reader.ok()) return steps;
  *header = (*reader)->header();
  TopkStep step;
  while (true) {
    auto more = (*reader)->Next(&step);
    EXPECT_OK(more);
    if (!more.ok() || !*more) break;
    steps.push_back(step);
  }
  return steps;
}

TEST(TopkTraceRecorder, RecordsEachDecodeStepAsTheObserverSawIt) {
  testing::TempDir dir;
  const std::string path = dir.File("t.tk");
  // 40 prompt tokens > index_topk 16: every decode step is scored.
  const RecordedRun run = RecordRun(path, 40, 10);
  ASSERT_EQ(run.decode_steps, 9);
  TopkTraceHeader h;
  const auto steps = ReadSteps(path, &h);
  EXPECT_EQ(h.full_layers, (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(h.k, 16);
  EXPECT_EQ(h.source, "recorder test");
  ASSERT_EQ(steps.size(), 9u);
  for (size_t s = 0; s < steps.size(); ++s) {
    const int64_t position = 40 + static_cast<int64_t>(s);
    EXPECT_EQ(steps[s].context_tokens, position + 1);
    ASSERT_EQ(steps[s].selections.size(), 3u);
    for (size_t f = 0; f < 3; ++f) {
      const auto it = run.observed.find({h.full_layers[f], position});
      ASSERT_NE(it, run.observed.end());
      EXPECT_EQ(steps[s].selections[f], it->second);
      EXPECT_EQ(steps[s].selections[f].size(), 16u);
    }
  }
}

TEST(TopkTraceRecorder, UnscoredStepsAreRecordedAsEveryVisibleToken) {
  testing::TempDir dir;
  const std::string path = dir.File("t.tk");
  // Positions 10..22: visible 11..16 are not scored (<= index_topk 16).
  const RecordedRun run = RecordRun(path, 10, 14);
  TopkTraceHeader h;
  const auto steps = ReadSteps(path, &h);
  ASSERT_EQ(steps.size(), 13u);
  for (size_t s = 0; s < steps.size(); ++s) {
    const int64_t position = 10 + static_cast<int64_t>(s);
    const int64_t visible = position + 1;
    EXPECT_EQ(steps[s].context_tokens, visible);
    for (size_t f = 0; f < 3; ++f) {
      const auto it = run.observed.find({h.full_layers[f], position});
      if (visible <= 16) {
        EXPECT_EQ(it, run.observed.end());
        std::vector<int32_t> all(static_cast<size_t>(visible));
        std::iota(all.begin(), all.end(), 0);
        EXPECT_EQ(steps[s].selections[f], all);
      } else {
        ASSERT_NE(it, run.observed.end());
        EXPECT_EQ(steps[s].selections[f], it->second);
      }
    }
  }
}

TEST(TopkTraceRecorder, PrefillPositionsAreNotRecorded) {
  testing::TempDir dir;
  const ModelConfig c = PresetConfig("tiny").value();
  auto r = TopkTraceRecorder::Create(dir.File("t.tk"), c, 64,
                                     /*first_decode_position=*/30, "");
  ASSERT_OK(r);
  const std::vector<int32_t> ids(16, 0);
  for (int64_t l : {0, 1, 3}) (*r)->OnSelection(l, 20, ids);
  ASSERT_OK((*r)->Finish(30));
  EXPECT_EQ((*r)->steps_written(), 0);
}

TEST(TopkTraceRecorder, SelectionOfASharedLayerIsAnError) {
  testing::TempDir dir;
  const ModelConfig c = PresetConfig("tiny").value();
  auto r = TopkTraceRecorder::Create(dir.File("t.tk"), c, 64, 30, "");
  ASSERT_OK(r);
  std::vector<int32_t> ids(16);
  std::iota(ids.begin(), ids.end(), 0);
  (*r)->OnSelection(2, 30, ids);  // layer 2 is shared in tiny
  const Status s = (*r)->Finish(31);
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("not a full layer"), std::string::npos)
      << s.ToString();
}

TEST(TopkTraceRecorder, MissingScoredSelectionIsAnError) {
  testing::TempDir dir;
  const ModelConfig c = PresetConfig("tiny").value();
  auto r = TopkTraceRecorder::Create(dir.File("t.tk"), c, 64, 30, "");
  ASSERT_OK(r);
  std::vector<int32_t> ids(16);
  std::iota(ids.begin(), ids.end(), 0);
  (*r)->OnSelection(0, 30, ids);
  (*r)->OnSelection(1, 30, ids);
  (*r)->OnSelection(0, 31, ids);  // layer 3 of position 30 never came
  Status s = (*r)->Finish(32);
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("position 30 got 2 of 3"), std::string::npos)
      << s.ToString();

  auto r2 = TopkTraceRecorder::Create(dir.File("t2.tk"), c, 64, 30, "");
  ASSERT_OK(r2);
  s = (*r2)->Finish(31);  // position 30 (31 visible > 16) was never scored
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("no selection observed at position 30"),
            std::string::npos)
      << s.ToString();
}

}  // namespace
}  // namespace tierkv::executor
