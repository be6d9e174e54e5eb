// The order statistics every tierkv-bench subcommand reports with
// (bench/sample_stats.h).
#include "bench/sample_stats.h"

#include <gtest/gtest.h>

#include <vector>

namespace tierkv::bench {
namespace {

TEST(SampleStatsTest, MedianOfAnOddCountIsTheMiddleSample) {
  EXPECT_EQ(Median({3, 1, 2}), 2);
  EXPECT_EQ(Median({5, 1, 4, 2, 3}), 3);
  EXPECT_EQ(Median({7}), 7);
}

// The textbook median, not the upper one (issue 26: two benches disagreed).
TEST(SampleStatsTest, MedianOfAnEvenCountIsTheMeanOfTheMiddleTwo) {
  EXPECT_EQ(Median({1, 3}), 2);
  EXPECT_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(Median({10, 10, 1, 100}), 10);
}

TEST(SampleStatsTest, NoSamplesGiveZero) {
  EXPECT_EQ(Median({}), 0);
  EXPECT_EQ(Percentile({}, 0.99), 0);
}

TEST(SampleStatsTest, PercentileIsTheNearestRank) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);  // 1..100, unsorted
  EXPECT_EQ(Percentile(v, 0.99), 100);  // index floor(0.99 * 100) = 99
  EXPECT_EQ(Percentile(v, 0.0), 1);
  EXPECT_EQ(Percentile(v, 1.0), 100);
  EXPECT_EQ(Percentile(v, 0.5), 51);  // the upper median: use Median()
  EXPECT_EQ(Median(v), 50.5);
}

}  // namespace
}  // namespace tierkv::bench
