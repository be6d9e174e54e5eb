// Reading ucx_perftest's CSV summary (bench/ucx_perftest_output.h), on
// output captured from ucx_perftest 1.13.1 (Debian ucx-utils).
#include "bench/ucx_perftest_output.h"

#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace tierkv::bench {
namespace {

TEST(UcxPerftestOutputTest, ReadsTheFinalLineOfABandwidthRun) {
  const char* out =
      "iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,"
      "avg_mr,overall_mr\n"
      "2000,4.980,296.009,296.009,3378.28,3378.28,3378,3378\n";
  Result<UcxPerftestResult> r = ParseUcxPerftestCsv(out);
  ASSERT_OK(r);
  EXPECT_EQ(r->iterations, 2000u);
  EXPECT_DOUBLE_EQ(r->percentile_rank, 50.0);
  EXPECT_DOUBLE_EQ(r->percentile_latency_us, 4.980);
  EXPECT_DOUBLE_EQ(r->average_latency_us, 296.009);
  EXPECT_DOUBLE_EQ(r->overall_latency_us, 296.009);
  EXPECT_DOUBLE_EQ(r->average_bandwidth_mib_s, 3378.28);
  EXPECT_DOUBLE_EQ(r->overall_bandwidth_mib_s, 3378.28);
  EXPECT_DOUBLE_EQ(r->overall_message_rate, 3378);
  // MiB/s to GB/s.
  EXPECT_NEAR(r->OverallGBps(), 3378.28 * 1048576 / 1e9, 1e-9);
}

TEST(UcxPerftestOutputTest, ReadsThePercentileRankFromTheHeader) {
  const char* out =
      "iterations,99.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,"
      "avg_mr,overall_mr\n"
      "2000,81.091,54.106,54.106,1155.15,1155.15,18482,18482\n";
  Result<UcxPerftestResult> r = ParseUcxPerftestCsv(out);
  ASSERT_OK(r);
  EXPECT_DOUBLE_EQ(r->percentile_rank, 99.0);
  EXPECT_DOUBLE_EQ(r->percentile_latency_us, 81.091);
}

TEST(UcxPerftestOutputTest, SkipsUcxLogLinesAndLeadingSpaces) {
  const char* out =
      "[1796415921.805391] [vm:24989:0]   parser.c:1885 UCX  WARN  unused "
      "env variable: UCX_FOO\n"
      "iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,"
      "avg_mr,overall_mr\n"
      "[1796415921.805392] [vm:24989:0]   ucp_ep.c:1 UCX  WARN  late note\n"
      " 100,5.159,3354.719,3354.719,1192.35,1192.35,298,298\r\n";
  Result<UcxPerftestResult> r = ParseUcxPerftestCsv(out);
  ASSERT_OK(r);
  EXPECT_EQ(r->iterations, 100u);
  EXPECT_DOUBLE_EQ(r->overall_bandwidth_mib_s, 1192.35);
}

TEST(UcxPerftestOutputTest, RefusesAnErrorWithoutFigures) {
  const char* out =
      "[1796415921.805391] [vm:24989:0]  perftest.c:405  UCX  ERROR client "
      "failed. connect() failed: Connection refused\n";
  EXPECT_EQ(ParseUcxPerftestCsv(out).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(ParseUcxPerftestCsv("").ok());
}

TEST(UcxPerftestOutputTest, RefusesAHeaderWithoutValuesOrABadNumber) {
  const char* header =
      "iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,"
      "avg_mr,overall_mr\n";
  EXPECT_FALSE(ParseUcxPerftestCsv(header).ok());
  EXPECT_FALSE(
      ParseUcxPerftestCsv(std::string(header) + "2000,x,1,1,1,1,1,1\n").ok());
  EXPECT_FALSE(ParseUcxPerftestCsv(std::string(header) + "2000,1,1\n").ok());
}

}  // namespace
}  // namespace tierkv::bench
