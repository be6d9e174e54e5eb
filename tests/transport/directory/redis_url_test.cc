// Tests transport/directory/redis_url.cc: the two URL forms the directory
// accepts, and the refusals.
#include "transport/directory/redis_url.h"

#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace tierkv::transport {
namespace {

TEST(RedisUrl, ParsesHostPortAndDatabase) {
  Result<RedisUrl> url = RedisUrl::Parse("redis://10.0.0.2:6380/3");
  ASSERT_OK(url);
  EXPECT_EQ(url->host, "10.0.0.2");
  EXPECT_EQ(url->port, 6380);
  EXPECT_EQ(url->database, 3u);
  EXPECT_TRUE(url->user.empty());
  EXPECT_FALSE(url->is_unix());
  EXPECT_EQ(url->ToString(), "redis://10.0.0.2:6380/3");
}

TEST(RedisUrl, DefaultsToPort6379AndDatabaseZero) {
  Result<RedisUrl> url = RedisUrl::Parse("redis://redis.internal");
  ASSERT_OK(url);
  EXPECT_EQ(url->host, "redis.internal");
  EXPECT_EQ(url->port, 6379);
  EXPECT_EQ(url->database, 0u);
}

TEST(RedisUrl, ParsesAclUser) {
  Result<RedisUrl> url = RedisUrl::Parse("redis://tierkv@127.0.0.1:7000");
  ASSERT_OK(url);
  EXPECT_EQ(url->user, "tierkv");
  EXPECT_EQ(url->host, "127.0.0.1");
  EXPECT_EQ(url->port, 7000);
}

TEST(RedisUrl, ParsesBracketedIpv6Host) {
  Result<RedisUrl> url = RedisUrl::Parse("redis://[::1]:7000/1");
  ASSERT_OK(url);
  EXPECT_EQ(url->host, "::1");
  EXPECT_EQ(url->port, 7000);
  EXPECT_EQ(url->database, 1u);
  EXPECT_EQ(url->ToString(), "redis://[::1]:7000/1");
}

TEST(RedisUrl, ParsesUnixSocket) {
  Result<RedisUrl> url = RedisUrl::Parse("unix:///run/redis/redis.sock");
  ASSERT_OK(url);
  EXPECT_TRUE(url->is_unix());
  EXPECT_EQ(url->unix_path, "/run/redis/redis.sock");
  EXPECT_EQ(url->ToString(), "unix:///run/redis/redis.sock");
}

TEST(RedisUrl, RefusesMalformedUrls) {
  for (const char* bad : {
           "",
           "localhost:6379",
           "http://127.0.0.1:6379",
           "redis://",
           "redis://:6379",
           "redis://127.0.0.1:",
           "redis://127.0.0.1:0",
           "redis://127.0.0.1:65536",
           "redis://127.0.0.1:12ab",
           "redis://127.0.0.1:6379/x",
           "redis://127.0.0.1:6379/",
           "redis://127.0.0.1/99999999999",
           "redis://[::1",
           "redis://[::1]x",
           "redis://@127.0.0.1",
           "redis://127.0.0.1:6379?db=1",
           "redis://127.0.0.1 :6379",
           "unix://relative/redis.sock",
           "unix://",
           "unix:///",
       }) {
    Result<RedisUrl> url = RedisUrl::Parse(bad);
    EXPECT_FALSE(url.ok()) << bad;
    EXPECT_EQ(url.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(RedisUrl, RefusesPasswordInUrlAndSaysWhereItGoes) {
  Result<RedisUrl> url = RedisUrl::Parse("redis://user:secret@127.0.0.1");
  ASSERT_FALSE(url.ok());
  EXPECT_EQ(url.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(url.status().message().find("password file"), std::string::npos)
      << url.status().ToString();
  EXPECT_EQ(url.status().message().find("secret"), std::string::npos)
      << "the refusal must not echo the password";
}

TEST(RedisUrl, RefusesUnixSocketPathsLongerThanSunPath) {
  const std::string fits = "/" + std::string(106, 's');  // 107 + NUL = 108
  EXPECT_TRUE(RedisUrl::Parse("unix://" + fits).ok());
  EXPECT_EQ(RedisUrl::Parse("unix://" + fits + "s").status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tierkv::transport
