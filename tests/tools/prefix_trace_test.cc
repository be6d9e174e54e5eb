// Reading Mooncake prefix traces: tools/prefix_trace.cc.
#include "tools/prefix_trace.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

#include "tests/testing/status_matchers.h"

namespace tierkv::tools {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Result<std::vector<TraceRequest>> Parse(const std::string& text) {
  std::istringstream in(text);
  return ParsePrefixTrace(in, "t.jsonl");
}

// The error message of parsing `text`, which must fail.
std::string ErrorOf(const std::string& text) {
  auto parsed = Parse(text);
  EXPECT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  return std::string(parsed.status().message());
}

TEST(PrefixTrace, ParsesMooncakeLinesInOrder) {
  auto trace = Parse(
      R"({"timestamp": 0, "input_length": 1100, "output_length": 6, "hash_ids": [0, 1, 2]})"
      "\n"
      R"({"timestamp": 27, "input_length": 600, "output_length": 4, "hash_ids": [0, 3]})"
      "\n");
  ASSERT_OK(trace);
  ASSERT_EQ(trace->size(), 2u);
  EXPECT_EQ((*trace)[0].timestamp_ms, 0u);
  EXPECT_EQ((*trace)[0].input_length, 1100u);
  EXPECT_EQ((*trace)[0].output_length, 6u);
  EXPECT_THAT((*trace)[0].hash_ids, ElementsAre(0, 1, 2));
  EXPECT_EQ((*trace)[1].timestamp_ms, 27u);
  EXPECT_THAT((*trace)[1].hash_ids, ElementsAre(0, 3));
}

TEST(PrefixTrace, SkipsBlankLinesAndIgnoresOtherKeys) {
  auto trace = Parse(
      "\n"
      R"({"timestamp": 5, "input_length": 10, "hash_ids": [7], "x": "y"})"
      "\n   \n");
  ASSERT_OK(trace);
  ASSERT_EQ(trace->size(), 1u);
  EXPECT_EQ((*trace)[0].output_length, 0u);  // optional
}

TEST(PrefixTrace, NamesFileAndLineOfInvalidJson) {
  EXPECT_THAT(ErrorOf(R"({"timestamp": 0, "input_length": 10, "hash_ids": [1]})"
                      "\n"
                      R"({"timestamp": 1, "input_length": 10,)"
                      "\n"),
              HasSubstr("t.jsonl:2: not valid JSON"));
}

TEST(PrefixTrace, NamesTheMissingField) {
  EXPECT_THAT(ErrorOf(R"({"timestamp": 0, "input_length": 10})"),
              HasSubstr("t.jsonl:1: missing \"hash_ids\""));
  EXPECT_THAT(ErrorOf(R"({"input_length": 10, "hash_ids": [1]})"),
              HasSubstr("t.jsonl:1: missing \"timestamp\""));
  EXPECT_THAT(ErrorOf(R"({"timestamp": 0, "hash_ids": [1]})"),
              HasSubstr("t.jsonl:1: missing \"input_length\""));
}

TEST(PrefixTrace, NamesTheMistypedField) {
  EXPECT_THAT(
      ErrorOf(R"({"timestamp": -1, "input_length": 10, "hash_ids": [1]})"),
      HasSubstr("\"timestamp\" must be a non-negative integer, not -1"));
  EXPECT_THAT(
      ErrorOf(R"({"timestamp": 0, "input_length": "10", "hash_ids": [1]})"),
      HasSubstr("\"input_length\" must be a non-negative integer"));
  EXPECT_THAT(ErrorOf(R"({"timestamp": 0, "input_length": 10, )"
                      R"("output_length": 1.5, "hash_ids": [1]})"),
              HasSubstr("\"output_length\" must be a non-negative integer"));
  EXPECT_THAT(ErrorOf(R"({"timestamp": 0, "input_length": 10, "hash_ids": 1})"),
              HasSubstr("\"hash_ids\" must be an array"));
  EXPECT_THAT(
      ErrorOf(
          R"({"timestamp": 0, "input_length": 1000, "hash_ids": [1, "b"]})"),
      HasSubstr("t.jsonl:1: \"hash_ids\"[1] must be a non-negative integer"));
  EXPECT_THAT(ErrorOf("[1, 2]"), HasSubstr("t.jsonl:1: not a JSON object"));
}

TEST(PrefixTrace, RejectsAnEmptyPrompt) {
  EXPECT_THAT(ErrorOf(R"({"timestamp": 0, "input_length": 0, "hash_ids": []})"),
              HasSubstr("\"input_length\" must be at least 1"));
}

TEST(PrefixTrace, RejectsFewerIdsThanCacheableBlocks) {
  // 1537 tokens: 3 cacheable 512-token blocks (the 4th is partial).
  EXPECT_THAT(
      ErrorOf(R"({"timestamp": 0, "input_length": 1537, "hash_ids": [1, 2]})"),
      HasSubstr("\"hash_ids\" has 2 ids, but \"input_length\" 1537 needs at "
                "least 3"));
  EXPECT_OK(Parse(
      R"({"timestamp": 0, "input_length": 1537, "hash_ids": [1, 2, 3]})"));
}

TEST(PrefixTrace, RejectsATraceWithoutRequests) {
  EXPECT_THAT(ErrorOf("\n\n"), HasSubstr("t.jsonl: no requests"));
}

TEST(PrefixTrace, LoadReportsAMissingFile) {
  auto trace = LoadPrefixTrace("/nonexistent/trace.jsonl");
  EXPECT_EQ(trace.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(std::string(trace.status().message()),
              HasSubstr("/nonexistent/trace.jsonl"));
}

}  // namespace
}  // namespace tierkv::tools
