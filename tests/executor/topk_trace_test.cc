// Tests for executor/topk_trace: the byte format (round trip, varints),
// clear errors on truncated and corrupted files, the writer's checks and the
// consecutive-step overlap helper.
#include "executor/topk_trace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "executor/config.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace tierkv::executor {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// 4 layers, full 0, 1, 3 (the tiny preset's IndexShare), k 8.
TopkTraceHeader SmallHeader() {
  auto h = TopkTraceHeaderFor({true, true, false, true}, /*page_tokens=*/64,
                              /*k=*/8, "unit test");
  EXPECT_OK(h);
  return std::move(h).value();
}

TopkStep Step(int64_t context, std::vector<std::vector<int32_t>> ids) {
  return TopkStep{context, std::move(ids)};
}

// Writes `steps` to `path` and finishes the file.
void WriteTrace(const std::string& path, const TopkTraceHeader& header,
                const std::vector<TopkStep>& steps) {
  auto w = TopkTraceWriter::Create(path, header);
  ASSERT_OK(w);
  for (const TopkStep& s : steps) ASSERT_OK((*w)->Append(s));
  ASSERT_OK((*w)->Finish());
}

// Reads a whole trace; the first error, if any, in *error.
std::vector<TopkStep> ReadTrace(const std::string& path, Status* error) {
  std::vector<TopkStep> steps;
  auto r = TopkTraceReader::Open(path);
  if (!r.ok()) {
    *error = r.status();
    return steps;
  }
  TopkStep step;
  while (true) {
    auto more = (*r)->Next(&step);
    if (!more.ok()) {
      *error = more.status();
      return steps;
    }
    if (!*more) break;
    steps.push_back(step);
  }
  *error = Status::OK();
  return steps;
}

std::vector<TopkStep> SampleSteps() {
  const int32_t big = std::numeric_limits<int32_t>::max();
  return {
      Step(1, {{0}, {0}, {}}),              // id 0, an empty selection
      Step(5, {{0, 1, 2, 3, 4}, {}, {4}}),  // dense, empty, the newest
      Step(200000, {{0, 127, 128, 16511, 199999}, {3}, {7, 8}}),
      Step(int64_t{1} << 31, {{0, big - 1, big}, {big}, {}}),  // largest ids
  };
}

TEST(TopkTrace, RoundTripsHeaderAndSteps) {
  testing::TempDir dir;
  const std::string path = dir.File("t.tk");
  const TopkTraceHeader header = SmallHeader();
  WriteTrace(path, header, SampleSteps());
  auto r = TopkTraceReader::Open(path);
  ASSERT_OK(r);
  const TopkTraceHeader& h = (*r)->header();
  EXPECT_EQ(h.num_layers, 4);
  EXPECT_EQ(h.page_tokens, 64);
  EXPECT_EQ(h.k, 8);
  EXPECT_EQ(h.full_layers, (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(h.selection_source, (std::vector<int32_t>{0, 1, 1, 3}));
  EXPECT_EQ(h.source, "unit test");
  Status error;
  EXPECT_EQ(ReadTrace(path, &error), SampleSteps());
  EXPECT_OK(error);
}

TEST(TopkTrace, EmptyTraceHasHeaderAndEndRecordOnly) {
  testing::TempDir dir;
  const std::string path = dir.File("t.tk");
  WriteTrace(path, SmallHeader(), {});
  Status error;
  EXPECT_TRUE(ReadTrace(path, &error).empty());
  EXPECT_OK(error);
}

TEST(TopkTrace, ReaderReportsEndThenKeepsReturningFalse) {
  testing::TempDir dir;
  const std::string path = dir.File("t.tk");
  WriteTrace(path, SmallHeader(), {Step(1, {{0}, {0}, {0}})});
  auto r = TopkTraceReader::Open(path);
  ASSERT_OK(r);
  TopkStep step;
  EXPECT_TRUE((*r)->Next(&step).value());
  EXPECT_FALSE((*r)->Next(&step).value());
  EXPECT_FALSE((*r)->Next(&step).value());
  EXPECT_EQ((*r)->steps_read(), 1);
}

TEST(TopkTrace, HeaderForMapsSharedLayersToTheLastFullLayer) {
  // GLM-5.2: IndexShare freq 4, offset 3 (glm5-dsa.md §4).
  auto h =
      TopkTraceHeaderFor(IndexShareFullLayers(78, 4, 3), 64, 2048, "glm5.2");
  ASSERT_OK(h);
  EXPECT_EQ(h->full_layers.size(), 21u);
  EXPECT_EQ(h->full_layers[3], 6);
  EXPECT_EQ(h->FullIndex(6), 3);
  EXPECT_EQ(h->FullIndex(7), -1);
  EXPECT_EQ(h->selection_source[2], 2);
  EXPECT_EQ(h->selection_source[3], 2);
  EXPECT_EQ(h->selection_source[5], 2);
  EXPECT_EQ(h->selection_source[6], 6);
  EXPECT_EQ(h->selection_source[77], 74);
}

TEST(TopkTrace, HeaderWithoutFullLayerZeroIsInvalid) {
  auto h = TopkTraceHeaderFor({false, true}, 64, 8, "");
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
  TopkTraceHeader bad = SmallHeader();
  bad.selection_source[2] = 0;  // not the last full layer before 2
  EXPECT_EQ(bad.Validate().code(), StatusCode::kInvalidArgument);
  bad = SmallHeader();
  bad.source.assign(kTopkTraceMaxSourceBytes + 1, 'x');
  EXPECT_EQ(bad.Validate().code(), StatusCode::kInvalidArgument);
}

TEST(TopkTrace, WriterRejectsStepsThatBreakTheContractAndWritesNothing) {
  testing::TempDir dir;
  const std::string path = dir.File("t.tk");
  auto w = TopkTraceWriter::Create(path, SmallHeader());
  ASSERT_OK(w);
  const std::vector<TopkStep> bad = {
      Step(0, {{}, {}, {}}),        // no visible token
      Step(4, {{0}, {0}}),          // two selections for three
      Step(4, {{1, 0}, {0}, {0}}),  // not ascending
      Step(4, {{1, 1}, {0}, {0}}),  // repeated id
      Step(4, {{0}, {4}, {0}}),     // id == context
      Step(4, {{0}, {-1}, {0}}),    // negative id
      Step(20, {{0, 1, 2, 3, 4, 5, 6, 7, 8}, {0}, {0}}),  // 9 ids > k 8
  };
  for (const TopkStep& s : bad) {
    EXPECT_EQ((*w)->Append(s).code(), StatusCode::kInvalidArgument);
  }
  ASSERT_OK((*w)->Append(Step(2, {{1}, {0, 1}, {}})));
  ASSERT_OK((*w)->Finish());
  EXPECT_EQ((*w)->Finish().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*w)->Append(Step(2, {{1}, {0}, {}})).code(),
            StatusCode::kInvalidArgument);
  Status error;
  EXPECT_EQ(ReadTrace(path, &error).size(), 1u);
  EXPECT_OK(error);
}

TEST(TopkTrace, EveryTruncationIsACorruptionErrorNamingTheOffset) {
  testing::TempDir dir;
  const std::string path = dir.File("t.tk");
  WriteTrace(path, SmallHeader(), SampleSteps());
  const std::string full = ReadAll(path);
  const std::string cut = dir.File("cut.tk");
  for (size_t size = 0; size < full.size(); ++size) {
    SCOPED_TRACE(size);
    WriteAll(cut, full.substr(0, size));
    Status error;
    const auto steps = ReadTrace(cut, &error);
    ASSERT_EQ(error.code(), StatusCode::kCorruption) << error.ToString();
    EXPECT_NE(error.message().find("truncated"), std::string::npos)
        << error.ToString();
    EXPECT_NE(error.message().find("offset"), std::string::npos);
    // The steps before the cut are still returned.
    EXPECT_LE(steps.size(), SampleSteps().size());
  }
}

TEST(TopkTrace, UnfinishedTraceSaysTheWriterDidNotFinish) {
  testing::TempDir dir;
  const std::string path = dir.File("t.tk");
  {
    auto w = TopkTraceWriter::Create(path, SmallHeader());
    ASSERT_OK(w);
    ASSERT_OK((*w)->Append(Step(1, {{0}, {0}, {0}})));
  }  // destroyed without Finish()
  Status error;
  EXPECT_EQ(ReadTrace(path, &error).size(), 1u);
  EXPECT_EQ(error.code(), StatusCode::kCorruption);
  EXPECT_NE(error.message().find("no end record after 1 steps"),
            std::string::npos)
      << error.ToString();
}

TEST(TopkTrace, EveryFlippedByteIsDetected) {
  testing::TempDir dir;
  const std::string path = dir.File("t.tk");
  WriteTrace(path, SmallHeader(), SampleSteps());
  const std::string good = ReadAll(path);
  const std::string bad_path = dir.File("bad.tk");
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xff}}) {
      SCOPED_TRACE(::testing::Message() << "byte " << i << " mask " << +mask);
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ mask);
      WriteAll(bad_path, bad);
      Status error;
      ReadTrace(bad_path, &error);
      ASSERT_EQ(error.code(), StatusCode::kCorruption) << error.ToString();
    }
  }
}

TEST(TopkTrace, ChecksumMismatchNamesTheRecordAndOffset) {
  testing::TempDir dir;
  const std::string path = dir.File("t.tk");
  WriteTrace(path, SmallHeader(), SampleSteps());
  // Record 0 starts after the header; its body's first byte is V.
  const std::string good = ReadAll(path);
  const size_t header_bytes = 16 + (good[12] & 0xff) + 4;
  std::string bad = good;
  bad[header_bytes + 4] ^= 0x01;
  WriteAll(path, bad);
  Status error;
  EXPECT_TRUE(ReadTrace(path, &error).empty());
  EXPECT_EQ(error.code(), StatusCode::kCorruption);
  EXPECT_NE(error.message().find("offset " + std::to_string(header_bytes) +
                                 ": record 0 checksum mismatch"),
            std::string::npos)
      << error.ToString();
}

TEST(TopkTrace, WrongMagicVersionAndTrailingBytesAreErrors) {
  testing::TempDir dir;
  const std::string path = dir.File("t.tk");
  WriteTrace(path, SmallHeader(), SampleSteps());
  const std::string good = ReadAll(path);
  std::string bad = good;
  bad[0] = 'X';
  WriteAll(path, bad);
  auto r = TopkTraceReader::Open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("magic"), std::string::npos);
  bad = good;
  bad[8] = 2;  // version 2
  WriteAll(path, bad);
  r = TopkTraceReader::Open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unsupported version 2"),
            std::string::npos)
      << r.status().ToString();
  WriteAll(path, good + "x");
  Status error;
  ReadTrace(path, &error);
  EXPECT_NE(error.message().find("1 bytes after the end record"),
            std::string::npos)
      << error.ToString();
  EXPECT_EQ(TopkTraceReader::Open(dir.File("missing.tk")).status().code(),
            StatusCode::kNotFound);
}

TEST(TopkTrace, VarintsRoundTripAtEveryLengthBoundary) {
  const std::vector<std::pair<uint64_t, size_t>> cases = {
      {0, 1},
      {1, 1},
      {127, 1},
      {128, 2},
      {16383, 2},
      {16384, 3},
      {(uint64_t{1} << 31) - 1, 5},
      {(uint64_t{1} << 32) - 1, 5},
      {(uint64_t{1} << 35), 6},
      {uint64_t{1} << 63, 10},
      {std::numeric_limits<uint64_t>::max(), 10},
  };
  std::string all;
  for (const auto& [value, bytes] : cases) {
    std::string one;
    AppendVarint(value, &one);
    EXPECT_EQ(one.size(), bytes) << value;
    all += one;
  }
  const auto* data = reinterpret_cast<const uint8_t*>(all.data());
  const std::span<const uint8_t> span(data, all.size());
  size_t pos = 0;
  for (const auto& [value, bytes] : cases) {
    uint64_t v = 0;
    ASSERT_TRUE(DecodeVarint(span, &pos, &v));
    EXPECT_EQ(v, value);
  }
  EXPECT_EQ(pos, all.size());
}

TEST(TopkTrace, MalformedVarintsAreRejectedWithoutMoving) {
  auto decode = [](std::vector<uint8_t> bytes) {
    size_t pos = 0;
    uint64_t v = 0;
    const bool ok = DecodeVarint(bytes, &pos, &v);
    EXPECT_EQ(pos, ok ? bytes.size() : 0u);
    return ok;
  };
  EXPECT_TRUE(decode({0x00}));
  EXPECT_FALSE(decode({}));                  // nothing
  EXPECT_FALSE(decode({0x80}));              // ends inside
  EXPECT_FALSE(decode({0xff, 0xff}));        // ends inside
  EXPECT_FALSE(decode({0x80, 0x00}));        // not minimal: 0 in two bytes
  EXPECT_FALSE(decode({0xff, 0x80, 0x00}));  // not minimal
  // 10 bytes, the last above bit 63: overflows.
  EXPECT_FALSE(
      decode({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}));
  // 11 bytes.
  EXPECT_FALSE(decode(
      {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x81, 0x01}));
}

TEST(TopkTrace, DsaStepCostsAboutOneToTwoBytesPerId) {
  // 2048 ids among 68K tokens (the blog's prompt), drawn uniformly.
  testing::TempDir dir;
  const std::string path = dir.File("t.tk");
  auto header = TopkTraceHeaderFor({true}, 64, 2048, "size");
  ASSERT_OK(header);
  std::mt19937_64 rng(1);
  std::vector<TopkStep> steps;
  for (int s = 0; s < 8; ++s) {
    const int64_t context = 68000 + s;
    std::vector<int32_t> ids(static_cast<size_t>(context));
    std::iota(ids.begin(), ids.end(), 0);
    for (size_t i = 0; i < 2048; ++i) {
      std::swap(ids[i], ids[i + rng() % (ids.size() - i)]);
    }
    ids.resize(2048);
    std::sort(ids.begin(), ids.end());
    steps.push_back(Step(context, {ids}));
  }
  WriteTrace(path, *header, steps);
  const double per_id =
      static_cast<double>(std::filesystem::file_size(path)) / (8 * 2048);
  EXPECT_GE(per_id, 1.0);
  EXPECT_LE(per_id, 1.5);
}

TEST(TopkOverlap, SelectionOverlapIsSharedOverCurrentSize) {
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {2, 4, 6}, none;
  EXPECT_DOUBLE_EQ(SelectionOverlap(a, b), 0.5);
  EXPECT_DOUBLE_EQ(SelectionOverlap(b, a), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(SelectionOverlap(a, a), 1.0);
  EXPECT_DOUBLE_EQ(SelectionOverlap(a, none), 0.0);
  EXPECT_DOUBLE_EQ(SelectionOverlap(none, a), 0.0);
}

TEST(TopkOverlap, MeterAveragesConsecutivePairsPerLayer) {
  TopkOverlapMeter meter(2);
  meter.Add(Step(10, {{0, 1, 2, 3}, {5}}));
  meter.Add(Step(11, {{0, 1, 8, 9}, {5}}));     // 0.5, 1
  meter.Add(Step(12, {{0, 1, 8, 9}, {}}));      // 1, (empty: skipped)
  meter.Add(Step(13, {{4, 5, 6, 7}, {5, 6}}));  // 0, 0 (previous empty)
  const auto mean = meter.MeanOverlap();
  ASSERT_EQ(mean.size(), 2u);
  EXPECT_DOUBLE_EQ(mean[0], 0.5);
  EXPECT_DOUBLE_EQ(mean[1], 0.5);
  EXPECT_EQ(meter.DistinctIds(), (std::vector<int64_t>{10, 2}));
  EXPECT_EQ(meter.steps(), 4);
}

TEST(TopkOverlap, SummaryReadsTheWholeFile) {
  testing::TempDir dir;
  const std::string path = dir.File("t.tk");
  WriteTrace(path, SmallHeader(),
             {Step(4, {{0, 1}, {2}, {3}}), Step(5, {{0, 4}, {2}, {}})});
  auto s = SummarizeTopkTrace(path);
  ASSERT_OK(s);
  EXPECT_EQ(s->steps, 2);
  EXPECT_EQ(s->ids, 7);
  EXPECT_EQ(s->file_bytes, std::filesystem::file_size(path));
  EXPECT_EQ(s->mean_overlap, (std::vector<double>{0.5, 1.0, 0.0}));
}

}  // namespace
}  // namespace tierkv::executor
