// The grammar of ParseByteSize (common/byte_size.h), spelling by spelling.
#include "common/byte_size.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <utility>

namespace tierkv {
namespace {

uint64_t Parsed(std::string_view text) {
  auto r = ParseByteSize(text);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status().ToString();
  return r.ok() ? *r : 0;
}

std::string ErrorOf(std::string_view text) {
  auto r = ParseByteSize(text);
  EXPECT_FALSE(r.ok()) << text << " parsed as " << (r.ok() ? *r : 0);
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

TEST(ByteSizeTest, APlainNumberIsBytes) {
  EXPECT_EQ(Parsed("1048576"), 1048576u);
  EXPECT_EQ(Parsed("4096B"), 4096u);
  EXPECT_EQ(Parsed("0"), 0u);  // a key that may not be 0 says so itself
  EXPECT_EQ(Parsed("18446744073709551615"), UINT64_MAX);
}

// Every spelling README.md, deploy/ and the scripts write, and the ones
// tierkvd and tierkv-bench read before there was one parser.
TEST(ByteSizeTest, DocumentedSpellingsKeepWorking) {
  EXPECT_EQ(Parsed("16MiB"), uint64_t{16} << 20);
  EXPECT_EQ(Parsed("256GiB"), uint64_t{256} << 30);
  EXPECT_EQ(Parsed("72KiB"), uint64_t{72} << 10);
  EXPECT_EQ(Parsed("512 MiB"), uint64_t{512} << 20);
  EXPECT_EQ(Parsed("64k"), uint64_t{64} << 10);
  EXPECT_EQ(Parsed("2GiB"), uint64_t{2} << 30);
  EXPECT_EQ(Parsed("64TiB"), uint64_t{64} << 40);
}

TEST(ByteSizeTest, EveryUnitIsBinaryAndCaseInsensitive) {
  for (const char* k : {"1K", "1k", "1KB", "1kb", "1KiB", "1kib", "1 KIB"})
    EXPECT_EQ(Parsed(k), uint64_t{1} << 10) << k;
  for (const char* m : {"1M", "1MB", "1MiB", "1mib"})
    EXPECT_EQ(Parsed(m), uint64_t{1} << 20) << m;
  for (const char* g : {"1G", "1GB", "1GiB", "1gb"})
    EXPECT_EQ(Parsed(g), uint64_t{1} << 30) << g;
  for (const char* t : {"1T", "1TB", "1TiB", "1tib"})
    EXPECT_EQ(Parsed(t), uint64_t{1} << 40) << t;
  EXPECT_EQ(Parsed("1b"), 1u);
}

TEST(ByteSizeTest, SpacesAroundTheNumberAndUnitAreIgnored) {
  EXPECT_EQ(Parsed("  8MiB"), uint64_t{8} << 20);
  EXPECT_EQ(Parsed("8MiB  "), uint64_t{8} << 20);
  EXPECT_EQ(Parsed("8\tMiB"), uint64_t{8} << 20);
}

TEST(ByteSizeTest, ErrorsQuoteTheTextAndSayWhatIsWrong) {
  const std::pair<std::string_view, std::string_view> cases[] = {
      {"", "empty size"},
      {"   ", "empty size"},
      {"GiB", "\"GiB\" is not a size: it must start with a whole number"},
      {"-1", "\"-1\" is not a size"},
      {"+1", "\"+1\" is not a size"},
      {"1 furlong", "\"1 furlong\": unknown unit \"furlong\""},
      {"1.5GiB", "\"1.5GiB\" is not a whole number of bytes"},
      {"1 2", "\"1 2\": unknown unit \"2\""},
      {"1,024", "\"1,024\": unknown unit \",024\""},
      {"1PiB", "\"1PiB\": unknown unit \"PiB\""},  // beyond TiB
  };
  for (const auto& [text, expected] : cases) {
    const std::string error = ErrorOf(text);
    EXPECT_NE(error.find(expected), std::string::npos)
        << "\"" << text << "\" -> " << error;
  }
}

TEST(ByteSizeTest, SizesBeyondSixtyFourBitsAreRefused) {
  std::string e = ErrorOf("18446744073709551616");
  EXPECT_NE(e.find("more than 2^64 - 1 bytes"), std::string::npos) << e;
  EXPECT_FALSE(ParseByteSize("99999999999999999999").ok());
  EXPECT_FALSE(ParseByteSize("17000000000T").ok());
  EXPECT_FALSE(ParseByteSize("16777216TiB").ok());  // 2^64 exactly
  EXPECT_EQ(Parsed("16777215TiB"), uint64_t{16777215} << 40);
}

}  // namespace
}  // namespace tierkv
