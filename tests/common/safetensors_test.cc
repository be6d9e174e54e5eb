// Tests for common/safetensors: the reader's checks of malformed files,
// file order, and the writer round trip.
#include "common/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace tierkv {
namespace {

std::vector<std::byte> F32Bytes(const std::vector<float>& v) {
  std::vector<std::byte> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

TEST(SafetensorsReader, TruncatedFileIsCorruption) {
  testing::TempDir dir;
  ASSERT_OK(WriteSafetensors(dir.File("m.safetensors"),
                             {{"a", "F32", {4}, F32Bytes({1, 2, 3, 4})}}));
  const auto path = dir.path() / "m.safetensors";
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
  auto reader = SafetensorsReader::Open(path);
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), StatusCode::kCorruption);
  EXPECT_NE(reader.status().message().find("truncated"), std::string::npos);
  // Truncated inside the header too.
  std::filesystem::resize_file(path, 20);
  reader = SafetensorsReader::Open(path);
  ASSERT_FALSE(reader.ok());
  EXPECT_NE(reader.status().message().find("truncated"), std::string::npos);
  std::filesystem::resize_file(path, 3);
  reader = SafetensorsReader::Open(path);
  ASSERT_FALSE(reader.ok());
  EXPECT_NE(reader.status().message().find("truncated"), std::string::npos);
}

TEST(SafetensorsReader, SizeDisagreeingWithShapeIsCorruption) {
  testing::TempDir dir;
  ASSERT_OK(WriteSafetensors(dir.File("m.safetensors"),
                             {{"a", "F32", {3}, F32Bytes({1, 2, 3, 4})}}));
  auto reader = SafetensorsReader::Open(dir.path());
  ASSERT_FALSE(reader.ok());
  EXPECT_NE(reader.status().message().find("'a'"), std::string::npos);
}

TEST(SafetensorsReader, EmptyDirectoryIsNotFound) {
  testing::TempDir dir;
  auto reader = SafetensorsReader::Open(dir.path());
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), StatusCode::kNotFound);
}

TEST(SafetensorsReader, InFileOrderFollowsFilesThenDataOffsets) {
  testing::TempDir dir;
  // Names sort differently from the layout: z first in a.safetensors,
  // then b.safetensors.
  ASSERT_OK(WriteSafetensors(
      dir.File("a.safetensors"),
      {{"z", "F32", {1}, F32Bytes({1})}, {"m", "F32", {2}, F32Bytes({2, 3})}}));
  ASSERT_OK(WriteSafetensors(dir.File("b.safetensors"),
                             {{"a", "F32", {1}, F32Bytes({4})}}));
  auto reader = SafetensorsReader::Open(dir.path());
  ASSERT_OK(reader);
  std::vector<std::string> order;
  for (const TensorView* v : (*reader)->InFileOrder()) {
    order.push_back(v->name);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"z", "m", "a"}));
  EXPECT_EQ((*reader)->Find("a")->file_index, 1u);
  EXPECT_EQ((*reader)->Find("m")->file_offset, 4u);
}

TEST(SafetensorsDTypeSize, KnowsTheFormatsDtypesOnly) {
  EXPECT_EQ(SafetensorsDTypeSize("BF16"), 2u);
  EXPECT_EQ(SafetensorsDTypeSize("F8_E4M3"), 1u);
  EXPECT_EQ(SafetensorsDTypeSize("I64"), 8u);
  EXPECT_EQ(SafetensorsDTypeSize("Q4_K"), 0u);
}

}  // namespace
}  // namespace tierkv
