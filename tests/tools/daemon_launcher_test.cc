// Starting and stopping a real tierkvd: tools/daemon_launcher.cc.
#include "tools/daemon_launcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>

#include "tests/testing/status_matchers.h"

namespace tierkv::tools {
namespace {

using ::testing::HasSubstr;

constexpr char kConfig[] = R"(
[[namespace]]
name = "launched"
token = "launcher-secret"
host_bytes = "2MiB"
shards = 1
)";

TEST(DaemonLauncher, ServesTheConfigInAPrivateDirectoryRemovedAfterwards) {
  std::filesystem::path dir;
  {
    DaemonLauncher daemon;
    dir = daemon.dir();
    ASSERT_OK(daemon.Start({.config_toml = kConfig}));
    EXPECT_TRUE(daemon.running());
    EXPECT_GT(daemon.metrics_port(), 0);
    EXPECT_EQ(std::filesystem::path(daemon.socket_path()).parent_path(), dir);
    auto client = daemon.Connect("launched", "launcher-secret");
    ASSERT_OK(client);
    ASSERT_OK((*client)->Ping());
  }
  EXPECT_FALSE(dir.empty());
  EXPECT_FALSE(std::filesystem::exists(dir));
}

TEST(DaemonLauncher, StopsGracefullyAndRestartsInTheSameDirectory) {
  DaemonLauncher daemon;
  ASSERT_OK(daemon.Start({.config_toml = kConfig}));
  const int status = daemon.Stop(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << daemon.log();
  EXPECT_FALSE(daemon.running());
  EXPECT_EQ(daemon.Stop(), -1);  // nothing left to stop
  ASSERT_OK(daemon.Start({.config_toml = kConfig}));
  EXPECT_OK(daemon.Connect("launched", "launcher-secret"));
}

TEST(DaemonLauncher, ReadsTheTokenFileOfTheEmbeddedDefaults) {
  DaemonLauncher daemon;
  ASSERT_OK(daemon.Start({.args = {"--host-bytes", "8MiB"}}));
  EXPECT_OK(daemon.Connect());  // "default", token from <dir>/default.token
}

TEST(DaemonLauncher, ReportsAMissingBinary) {
  DaemonLauncher daemon;
  Status s = daemon.Start({.bin_dir = "/nonexistent"});
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("/nonexistent/tierkvd"));
}

TEST(DaemonLauncher, ReportsAConfigTheDaemonRejectsWithItsLog) {
  DaemonLauncher daemon;
  Status s = daemon.Start({.config_toml = "[[namespace]]\nno_such_key = 1\n"});
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("no_such_key"));
  EXPECT_FALSE(daemon.running());
}

}  // namespace
}  // namespace tierkv::tools
