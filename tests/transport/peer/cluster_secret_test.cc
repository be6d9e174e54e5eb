// ReadClusterSecretFile: only an owner-only file of 32+ bytes is a secret.
#include "transport/peer/cluster_secret.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <string>

#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace tierkv::transport::peer {
namespace {

std::string WriteFile(const testing::TempDir& dir, const std::string& name,
                      const std::string& contents, mode_t mode) {
  const std::string path = dir.File(name);
  std::ofstream(path) << contents;
  EXPECT_EQ(::chmod(path.c_str(), mode), 0);
  return path;
}

TEST(ClusterSecret, OwnerOnlyFileIsReadAsItsBytes) {
  testing::TempDir dir;
  const std::string secret(40, 'k');
  Result<std::vector<std::byte>> r =
      ReadClusterSecretFile(WriteFile(dir, "key", secret, 0600));
  ASSERT_OK(r);
  ASSERT_EQ(r->size(), secret.size());
  EXPECT_EQ(std::memcmp(r->data(), secret.data(), secret.size()), 0);
}

TEST(ClusterSecret, WorldReadableFileIsRefusedNamingTheFix) {
  testing::TempDir dir;
  Result<std::vector<std::byte>> r =
      ReadClusterSecretFile(WriteFile(dir, "key", std::string(40, 'k'), 0644));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(r.status().message().find("0644"), std::string_view::npos);
  EXPECT_NE(r.status().message().find("chmod 600"), std::string_view::npos);
}

TEST(ClusterSecret, GroupReadableFileIsRefused) {
  testing::TempDir dir;
  Result<std::vector<std::byte>> r =
      ReadClusterSecretFile(WriteFile(dir, "key", std::string(40, 'k'), 0640));
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied);
}

TEST(ClusterSecret, ShortSecretIsRefused) {
  testing::TempDir dir;
  Result<std::vector<std::byte>> r =
      ReadClusterSecretFile(WriteFile(dir, "key", std::string(31, 'k'), 0600));
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

TEST(ClusterSecret, MissingFileIsAnIOError) {
  testing::TempDir dir;
  EXPECT_EQ(ReadClusterSecretFile(dir.File("absent")).status().code(),
            StatusCode::kIOError);
}

TEST(ClusterSecret, DirectoryIsRefused) {
  testing::TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0700), 0);
  EXPECT_EQ(ReadClusterSecretFile(dir.path().string()).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tierkv::transport::peer
