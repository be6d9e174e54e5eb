#include "daemon/config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "daemon/host_memory.h"
#include "storage/device/device_backend.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace tierkv::daemon {
namespace {

Result<DaemonConfig> Load(const testing::TempDir& dir,
                          const std::string& text) {
  std::ofstream(dir.File("c.toml")) << text;
  return LoadConfigFile(dir.File("c.toml"), EmbeddedDefaults());
}

struct DaemonExit {
  int status = -1;  // the exit status; -1 when it did not exit by itself
  std::string output;
};

// Runs a real tierkvd with `args` for at most 60 s (a config that starts
// it is a failed test, not a hung one), its output captured.
DaemonExit RunTierkvd(const testing::TempDir& dir, const std::string& args) {
  const char* bin = std::getenv("TIERKV_BIN_DIR");
  EXPECT_NE(bin, nullptr);
  if (bin == nullptr) return {};
  const std::string cmd = "timeout 60 " + std::string(bin) + "/tierkvd " +
                          args + " > " + dir.File("out") + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream out(dir.File("out"));
  DaemonExit exit;
  exit.output.assign(std::istreambuf_iterator<char>(out),
                     std::istreambuf_iterator<char>());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) != 124) exit.status = WEXITSTATUS(rc);
  return exit;
}

TEST(ConfigTest, EmbeddedDefaultsAreValid) {
  DaemonConfig c = EmbeddedDefaults();
  EXPECT_OK(c.Validate());
  EXPECT_EQ(c.socket_path, "/run/tierkv/tierkv.sock");
  EXPECT_EQ(c.socket_mode, 0660u);
  EXPECT_EQ(c.metrics_listen, "127.0.0.1:9400");
  ASSERT_EQ(c.namespaces.size(), 1u);
  EXPECT_EQ(c.namespaces[0].token_file, "/run/tierkv/default.token");
}

TEST(ConfigTest, ParsesAFullFile) {
  testing::TempDir dir;
  auto c = Load(dir, R"(
[server]
socket = "/tmp/x.sock"
socket_mode = "0600"
io_threads = 4
poll_us = 0
poll_followup_us = 200
load_workers = 6
max_connections = 100
max_unauthenticated_connections = 8
handshake_timeout_ms = 2000
idle_timeout_ms = 60000
stall_timeout_ms = 5000
max_in_flight_bytes = "1GiB"
[metrics]
listen = ""
[leases]
ttl_ms = 5000
max_bytes_percent_per_connection = 25
max_bytes_percent_per_namespace = 75
refusal_delay_ms = 25
[[namespace]]
name = "glm-5@bf16"
token = "secret-token"
host_bytes = "2GiB"
shards = 16
hugepages = false
eviction_policy = "2q"
host_alignment = "4KiB"
)");
  ASSERT_OK(c);
  EXPECT_OK(c->Validate());
  EXPECT_EQ(c->socket_mode, 0600u);
  EXPECT_EQ(c->io_threads, 4u);
  EXPECT_EQ(c->poll_us, 0u);
  EXPECT_EQ(c->poll_followup_us, 200u);
  EXPECT_EQ(c->load_workers, 6u);
  EXPECT_EQ(c->max_connections, 100u);
  EXPECT_EQ(c->max_unauthenticated_connections, 8u);
  EXPECT_EQ(c->handshake_timeout_ms, 2000u);
  EXPECT_EQ(c->idle_timeout_ms, 60000u);
  EXPECT_EQ(c->metrics_listen, "");
  EXPECT_EQ(c->lease_ttl_ms, 5000u);
  EXPECT_EQ(c->stall_timeout_ms, 5000u);
  EXPECT_EQ(c->max_in_flight_bytes, uint64_t{1} << 30);
  EXPECT_EQ(c->max_leased_bytes_percent_per_connection, 25u);
  EXPECT_EQ(c->max_leased_bytes_percent_per_namespace, 75u);
  EXPECT_EQ(c->lease_refusal_delay_ms, 25u);
  ASSERT_EQ(c->namespaces.size(), 1u);
  EXPECT_EQ(c->namespaces[0].host_bytes, uint64_t{2} << 30);
  EXPECT_FALSE(c->namespaces[0].hugepages);
  EXPECT_EQ(c->namespaces[0].eviction_policy,
            storage::EvictionPolicyKind::kTwoQueue);
  EXPECT_EQ(c->namespaces[0].host_alignment, 4096u);
}

TEST(ConfigTest, MistakesAreNamed) {
  testing::TempDir dir;
  auto typo = Load(dir, "[server]\nsokcet = \"/x\"\n");
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("sokcet"), std::string_view::npos);
  auto syntax = Load(dir, "[server\n");
  ASSERT_FALSE(syntax.ok());
  EXPECT_NE(syntax.status().message().find("c.toml:1"), std::string_view::npos);
  auto type = Load(dir, "[server]\nio_threads = \"four\"\n");
  ASSERT_FALSE(type.ok());
  EXPECT_NE(type.status().message().find("io_threads"), std::string_view::npos);
  auto poll = Load(dir, "[server]\npoll_us = 20000\n");
  ASSERT_OK(poll);
  EXPECT_NE(poll->Validate().message().find("server.poll_us"),
            std::string_view::npos);
  auto followup = Load(dir, "[server]\npoll_followup_us = 20000\n");
  ASSERT_OK(followup);
  EXPECT_NE(followup->Validate().message().find("server.poll_followup_us"),
            std::string_view::npos);
  auto size = Load(dir,
                   "[[namespace]]\nname = \"a\"\ntoken = "
                   "\"12345678\"\nhost_bytes = \"1 furlong\"\n");
  ASSERT_FALSE(size.ok());
  EXPECT_NE(size.status().message().find("host_bytes"), std::string_view::npos);
  auto policy = Load(dir,
                     "[[namespace]]\nname = \"a\"\ntoken = "
                     "\"12345678\"\neviction_policy = \"mru\"\n");
  ASSERT_FALSE(policy.ok());
  EXPECT_NE(policy.status().message().find("namespace.eviction_policy"),
            std::string_view::npos);
  auto both = Load(dir,
                   "[[namespace]]\nname = \"a\"\ntoken = "
                   "\"12345678\"\ntoken_file = \"/x\"\n");
  EXPECT_FALSE(both.ok());
}

TEST(ConfigTest, HbmSectionIsParsedAndChecked) {
  testing::TempDir dir;
  auto c = Load(dir,
                "[hbm]\nbackend = \"emulated\"\ndevice = 1\n"
                "capacity_bytes = \"64MiB\"\nstreams = 4\n"
                "staging_bytes = \"1GiB\"\n"
                "emulated_fault_after_copies = 9\n");
  ASSERT_OK(c);
  EXPECT_EQ(c->hbm.staging_bytes, uint64_t{1} << 30);
  EXPECT_EQ(EmbeddedDefaults().hbm.staging_bytes, uint64_t{256} << 20);
  EXPECT_EQ(c->hbm.emulated_fault_after_copies, 9u);
  EXPECT_EQ(c->hbm.backend, "emulated");
  EXPECT_EQ(c->hbm.device, 1);
  EXPECT_EQ(c->hbm.capacity_bytes, uint64_t{64} << 20);
  EXPECT_EQ(c->hbm.streams, 4u);
  EXPECT_TRUE(c->hbm.enabled());
  EXPECT_FALSE(c->hbm.device_uuid.has_value());
  EXPECT_FALSE(EmbeddedDefaults().hbm.enabled());  // off unless configured
  // The GPU by UUID, as nvidia-smi -L prints it.
  auto by_uuid = Load(
      dir, "[hbm]\ndevice = \"GPU-5c3f1a2b-0d4e-6f70-8192-a3b4c5d6e7f8\"\n");
  ASSERT_OK(by_uuid);
  ASSERT_TRUE(by_uuid->hbm.device_uuid.has_value());
  EXPECT_EQ(storage::FormatDeviceUuid(*by_uuid->hbm.device_uuid),
            "GPU-5c3f1a2b-0d4e-6f70-8192-a3b4c5d6e7f8");
  for (const char* bad :
       {"[hbm]\nbackend = \"gpu\"\n", "[hbm]\nstreams = 0\n",
        "[hbm]\ncapacity_bytes = 1000\n", "[hbm]\nsize = 1\n",
        "[hbm]\ndevice = \"GPU-5c3f1a2b\"\n", "[hbm]\ndevice = -1\n",
        "[hbm]\nstaging_bytes = 4097\n", "[hbm]\nstaging_bytes = \"65GiB\"\n",
        // the fault drill is the emulated backend's only
        "[hbm]\nbackend = \"auto\"\nemulated_fault_after_copies = 1\n"}) {
    auto r = Load(dir, bad);
    ASSERT_FALSE(r.ok() && r->Validate().ok()) << bad;
    const Status s = r.ok() ? r->Validate() : r.status();
    EXPECT_NE(s.message().find("hbm"), std::string_view::npos) << s.ToString();
  }
  // A namespace's HBM quota: parsed, and only with an [hbm] tier that holds
  // it.
  const char* ns = "[[namespace]]\nname = \"a\"\ntoken = \"hbm-quota-token\"\n";
  auto quota = Load(dir, std::string("[hbm]\ncapacity_bytes = \"64MiB\"\n") +
                             ns + "hbm_bytes = \"16MiB\"\n");
  ASSERT_OK(quota);
  EXPECT_OK(quota->Validate());
  EXPECT_EQ(quota->namespaces[0].hbm_bytes, uint64_t{16} << 20);
  for (const std::string& bad :
       {std::string(ns) + "hbm_bytes = \"16MiB\"\n",
        std::string("[hbm]\ncapacity_bytes = \"64MiB\"\n") + ns +
            "hbm_bytes = \"128MiB\"\n"}) {
    auto r = Load(dir, bad);
    ASSERT_OK(r);
    const Status s = r->Validate();
    EXPECT_NE(s.message().find("hbm_bytes"), std::string_view::npos)
        << s.ToString();
  }
}

// With no GPU (or no CUDA backend built), [hbm] backend = "auto" starts
// the daemon on the emulated backend and says so.
TEST(ConfigTest, DaemonWithAnAutoHbmTierSaysItEmulates) {
  tierkv::testing::DaemonProcess d;
  ASSERT_OK(
      d.Start({.config_toml = "[hbm]\nbackend = \"auto\"\ncapacity_bytes = "
                              "\"16MiB\"\n[[namespace]]\nname = \"default\"\n"
                              "token = \"hbm-test-token\"\nhost_bytes = "
                              "\"8MiB\"\nshards = 1\n"}));
  const std::string log = d.log();
  EXPECT_NE(log.find("HBM tier: emulated backend"), std::string::npos) << log;
  auto client = d.Connect("default", "hbm-test-token");
  EXPECT_OK(client);
}

TEST(ConfigTest, ValidateRejectsUnsafeOrImpossibleSettings) {
  DaemonConfig c = EmbeddedDefaults();
  c.socket_mode = 0666;
  EXPECT_NE(c.Validate().message().find("others"), std::string_view::npos);
  c = EmbeddedDefaults();
  c.namespaces.push_back(c.namespaces[0]);
  EXPECT_NE(c.Validate().message().find("duplicate"), std::string_view::npos);
  c = EmbeddedDefaults();
  c.load_workers = 0;
  EXPECT_NE(c.Validate().message().find("server.load_workers"),
            std::string_view::npos);
  c = EmbeddedDefaults();
  c.handshake_timeout_ms = 0;
  EXPECT_NE(c.Validate().message().find("server.handshake_timeout_ms"),
            std::string_view::npos);
  c = EmbeddedDefaults();
  c.max_in_flight_bytes = c.max_frame_bytes - 1;
  EXPECT_NE(c.Validate().message().find("server.max_in_flight_bytes"),
            std::string_view::npos);
  c = EmbeddedDefaults();
  c.max_leased_bytes_percent_per_connection = 101;
  EXPECT_NE(
      c.Validate().message().find("leases.max_bytes_percent_per_connection"),
      std::string_view::npos);
  c = EmbeddedDefaults();
  c.lease_refusal_delay_ms = 60000;
  EXPECT_NE(c.Validate().message().find("leases.refusal_delay_ms"),
            std::string_view::npos);
  c = EmbeddedDefaults();
  c.max_unauthenticated_connections = 0;
  EXPECT_NE(c.Validate().message().find("max_unauthenticated_connections"),
            std::string_view::npos);
  c = EmbeddedDefaults();
  c.namespaces[0].host_bytes = 1 << 20;  // 8 shards need 8 MiB
  EXPECT_FALSE(c.Validate().ok());
  c = EmbeddedDefaults();
  c.namespaces[0].name = "a/b";
  EXPECT_FALSE(c.Validate().ok());
  c = EmbeddedDefaults();
  c.log_level = "loud";
  EXPECT_FALSE(c.Validate().ok());
  // NVMe reservations: need the tier, 4 KiB multiples, within capacity.
  c = EmbeddedDefaults();
  c.namespaces[0].nvme_bytes = 1 << 20;
  EXPECT_NE(c.Validate().message().find("needs an [nvme] tier"),
            std::string_view::npos);
  c.nvme.path = "/var/tmp/x.data";
  c.nvme.capacity_bytes = 32 << 20;
  EXPECT_OK(c.Validate());
  c.namespaces[0].nvme_bytes = (1 << 20) + 1;
  EXPECT_NE(c.Validate().message().find("multiple of 4 KiB"),
            std::string_view::npos);
  c.namespaces[0].nvme_bytes = 64 << 20;
  EXPECT_NE(c.Validate().message().find("more than nvme.capacity_bytes"),
            std::string_view::npos);
  c.namespaces[0].nvme_bytes = 0;
  c.nvme.readers = 0;
  EXPECT_NE(c.Validate().message().find("nvme.readers"),
            std::string_view::npos);
}

TEST(ConfigTest, NvmeReadersAreRead) {
  testing::TempDir dir;
  auto c = Load(dir, R"(
[nvme]
path = "/var/tmp/x.data"
readers = 8
)");
  ASSERT_OK(c);
  EXPECT_OK(c->Validate());
  EXPECT_EQ(c->nvme.readers, 8u);
  EXPECT_EQ(EmbeddedDefaults().nvme.readers, 4u);
}

// Issue 26: a config error names its key as "config <section>.<key>: ...",
// for a key of a [[namespace]] entry with the entry's name.
TEST(ConfigTest, EveryLoadErrorNamesItsKey) {
  testing::TempDir dir;
  const std::string ns = "[[namespace]]\nname = \"a\"\n";
  const std::pair<std::string, std::string> cases[] = {
      {"sokcet = 1\n", "config sokcet: unknown key (line 1)"},
      {"[server]\nsokcet = \"/x\"\n", "config server.sokcet: unknown key"},
      {"server = 1\n", "config server: must be a table"},
      {"[[hbm]]\nbackend = \"emulated\"\n", "config hbm: must be a table"},
      {"[server]\nio_threads = -1\n", "config server.io_threads: must be"},
      {"[server]\nmax_frame_bytes = -1\n",
       "config server.max_frame_bytes: must be >= 0"},
      {"[server]\nmax_frame_bytes = \"16 MB/s\"\n",
       "config server.max_frame_bytes: \"16 MB/s\": unknown unit \"MB/s\""},
      {"[nvme]\ncapacity_bytes = true\n",
       "config nvme.capacity_bytes: must be a byte count"},
      {"[log]\nlevel = 3\n", "config log.level: must be a string"},
      {"[server]\nio_threads = true\n", "config server.io_threads: must be"},
      {"[server]\nio_threads = 2.5\n", "config server.io_threads: must be"},
      {"[nvme]\ndirect_io = 1\n",
       "config nvme.direct_io: must be true or false"},
      {ns + "tokn = \"12345678\"\n",
       "config namespace.tokn (namespace 'a'): unknown key (line 3)"},
      {ns + "shards = -1\n", "config namespace.shards (namespace 'a'): "},
      {ns + "host_bytes = \"1 furlong\"\n",
       "config namespace.host_bytes (namespace 'a'): \"1 furlong\": unknown "
       "unit \"furlong\""},
      {ns + "host_bytes = \"1.5GiB\"\n",
       "config namespace.host_bytes (namespace 'a'): \"1.5GiB\" is not a "
       "whole number"},
      {ns + "hugepages = \"yes\"\n",
       "config namespace.hugepages (namespace 'a'): must be true or false"},
      {ns + "token = \"12345678\"\ntoken_file = \"/x\"\n",
       "config namespace.token_file (namespace 'a'): give either token or "
       "token_file"},
      {ns + "write_policy = \"sometimes\"\n",
       "config namespace.write_policy (namespace 'a'): unknown write_policy"},
      {ns + "eviction_policy = \"mru\"\n",
       "config namespace.eviction_policy (namespace 'a'): "},
  };
  for (const auto& [toml, expected] : cases) {
    auto r = Load(dir, toml);
    ASSERT_FALSE(r.ok()) << toml;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << toml;
    EXPECT_NE(r.status().message().find(expected), std::string_view::npos)
        << toml << "\n-> " << r.status().ToString();
  }
}

TEST(ConfigTest, EveryValidateErrorOfANamespaceNamesItsKeyAndEntry) {
  const std::pair<std::function<void(NamespaceConfig&)>, std::string> cases[] =
      {{[](NamespaceConfig& n) { n.name = "a/b"; },
        "config namespace.name (namespace 'a/b'): may use"},
       {[](NamespaceConfig& n) { n.name = ""; },
        "config namespace.name (namespace ''): must have 1..128"},
       {[](NamespaceConfig& n) { n.token_file.clear(); },
        "config namespace.token (namespace 'default'): missing"},
       {[](NamespaceConfig& n) {
          n.token_file.clear();
          n.token = "short";
        },
        "config namespace.token (namespace 'default'): must have at least 8"},
       {[](NamespaceConfig& n) { n.shards = 0; },
        "config namespace.shards (namespace 'default'): must be in [1, 256]"},
       {[](NamespaceConfig& n) { n.host_alignment = 1000; },
        "config namespace.host_alignment (namespace 'default'): must be a "
        "power of two in [64, 4096]"},
       {[](NamespaceConfig& n) { n.host_alignment = 8192; },
        "config namespace.host_alignment (namespace 'default'): must be a "
        "power of two in [64, 4096]"},
       {[](NamespaceConfig& n) { n.host_bytes = 1 << 20; },
        "config namespace.host_bytes (namespace 'default'): must be at least "
        "1 MiB per shard (8 shards)"},
       {[](NamespaceConfig& n) { n.hbm_bytes = 1 << 20; },
        "config namespace.hbm_bytes (namespace 'default'): needs an [hbm]"},
       {[](NamespaceConfig& n) { n.nvme_bytes = 1 << 20; },
        "config namespace.nvme_bytes (namespace 'default'): needs an [nvme]"},
       {[](NamespaceConfig& n) { n.write_policy = WritePolicy::kWriteBack; },
        "config namespace.write_policy (namespace 'default'): write_back "
        "needs an [nvme] tier"}};
  for (const auto& [mutate, expected] : cases) {
    DaemonConfig c = EmbeddedDefaults();
    mutate(c.namespaces[0]);
    const Status s = c.Validate();
    EXPECT_NE(s.message().find(expected), std::string_view::npos)
        << expected << "\n-> " << s.ToString();
  }
  DaemonConfig twice = EmbeddedDefaults();
  twice.namespaces.push_back(twice.namespaces[0]);
  EXPECT_NE(twice.Validate().message().find(
                "config namespace.name (namespace 'default'): duplicate"),
            std::string_view::npos)
      << twice.Validate().ToString();
}

TEST(ConfigTest, EachLeaseSegmentLimitIsNamedOnItsOwn) {
  DaemonConfig c = EmbeddedDefaults();
  c.max_leased_segments_per_namespace = 0;
  EXPECT_NE(c.Validate().message().find(
                "config leases.max_segments_per_namespace: must be > 0"),
            std::string_view::npos)
      << c.Validate().ToString();
  c = EmbeddedDefaults();
  c.max_leased_segments_per_connection = 0;
  EXPECT_NE(c.Validate().message().find(
                "config leases.max_segments_per_connection: must be > 0"),
            std::string_view::npos)
      << c.Validate().ToString();
}

// README: hbm.capacity_bytes "0 (default) disables the tier"; nvme_bytes
// and hbm_bytes 0 mean "no reservation" and "all of it". Zero was refused
// as "must be > 0" before; every byte key reads 0 and Validate() judges.
TEST(ConfigTest, ByteKeysWhoseZeroMeansSomethingTakeZero) {
  testing::TempDir dir;
  auto c = Load(dir,
                "[hbm]\ncapacity_bytes = 0\n[[namespace]]\nname = \"a\"\n"
                "token = \"12345678\"\nhost_bytes = \"8MiB\"\nnvme_bytes = 0\n"
                "hbm_bytes = \"0GiB\"\n");
  ASSERT_OK(c);
  EXPECT_OK(c->Validate());
  EXPECT_FALSE(c->hbm.enabled());
  EXPECT_EQ(c->namespaces[0].nvme_bytes, 0u);
  EXPECT_EQ(c->namespaces[0].hbm_bytes, 0u);
  // A key that may not be 0 still says so, by name.
  for (const auto& [toml, key] :
       {std::pair{"[server]\nmax_frame_bytes = 0\n", "server.max_frame_bytes"},
        std::pair{"[[namespace]]\nname = \"a\"\ntoken = \"12345678\"\n"
                  "host_bytes = 0\n",
                  "namespace.host_bytes (namespace 'a')"}}) {
    auto zero = Load(dir, toml);
    ASSERT_OK(zero);
    EXPECT_NE(zero->Validate().message().find(key), std::string_view::npos)
        << zero->Validate().ToString();
  }
}

// Issue 26's example: a token_file whose directory cannot be made said only
// "io_error: mkdir ...".
TEST(ConfigTest, TokenFileErrorsNameTheKey) {
  testing::TempDir dir;
  std::ofstream(dir.File("plain")) << "a file, not a directory\n";
  std::ofstream(dir.File("short.token")) << "abc\n";
  ASSERT_EQ(::chmod(dir.File("short.token").c_str(), 0600), 0);
  std::filesystem::create_directory(dir.File("a-directory"));
  const std::pair<std::string, std::string> cases[] = {
      {dir.File("plain/sub/t.token"),
       "cannot create " + dir.File("plain/sub/t.token") + ": mkdir"},
      {dir.File("short.token"), "holds fewer than 8 characters"},
      {dir.File("a-directory"), "is not a regular file"}};
  for (const auto& [path, what] : cases) {
    DaemonConfig c = EmbeddedDefaults();
    c.namespaces[0].token_file = path;
    const Status s = ResolveTokens(c);
    ASSERT_FALSE(s.ok()) << path;
    EXPECT_NE(
        s.message().find("config namespace.token_file (namespace 'default'): "),
        std::string_view::npos)
        << s.ToString();
    EXPECT_NE(s.message().find(what), std::string_view::npos) << s.ToString();
  }
}

TEST(ConfigTest, ConfigKeyErrorKeepsTheCodeAndAddsTheKey) {
  const Status s =
      ConfigKeyError("nvme.path", Status::IOError("open /x: no such file"));
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_EQ(s.message(), "config nvme.path: open /x: no such file");
  EXPECT_OK(ConfigKeyError("nvme.path", Status::OK()));
}

TEST(ConfigTest, TokenFilesAreCreatedPrivateAndReused) {
  testing::TempDir dir;
  DaemonConfig c = EmbeddedDefaults();
  c.namespaces[0].token_file = dir.File("sub/default.token");
  ASSERT_OK(ResolveTokens(c));
  const std::string token = c.namespaces[0].token;
  EXPECT_GE(token.size(), 32u);
  struct stat st {};
  ASSERT_EQ(::stat(dir.File("sub/default.token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  DaemonConfig again = EmbeddedDefaults();
  again.namespaces[0].token_file = dir.File("sub/default.token");
  ASSERT_OK(ResolveTokens(again));
  EXPECT_EQ(again.namespaces[0].token, token);
}

// Under umask 000 new directories would be world-writable; the token's
// directory must come out 0750 regardless.
TEST(ConfigTest, NewTokenDirectoriesArePrivateWhateverTheUmask) {
  testing::TempDir dir;
  const mode_t old_mask = ::umask(0);
  DaemonConfig c = EmbeddedDefaults();
  c.namespaces[0].token_file = dir.File("a/b/default.token");
  const Status s = ResolveTokens(c);
  ::umask(old_mask);
  ASSERT_OK(s);
  for (const char* d : {"a", "a/b"}) {
    struct stat st {};
    ASSERT_EQ(::stat(dir.File(d).c_str(), &st), 0) << d;
    EXPECT_EQ(st.st_mode & 0777, 0750u) << d;
  }
  struct stat st {};
  ASSERT_EQ(::stat(dir.File("a/b/default.token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(ConfigTest, ATokenFileOthersCanReadIsRefused) {
  testing::TempDir dir;
  std::ofstream(dir.File("t.token")) << "a-long-enough-token\n";
  ASSERT_EQ(::chmod(dir.File("t.token").c_str(), 0644), 0);
  DaemonConfig c = EmbeddedDefaults();
  c.namespaces[0].token_file = dir.File("t.token");
  const Status s = ResolveTokens(c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("chmod o-rwx"), std::string_view::npos)
      << s.ToString();
  ASSERT_EQ(::chmod(dir.File("t.token").c_str(), 0640), 0);  // group: fine
  EXPECT_OK(ResolveTokens(c));
  EXPECT_EQ(c.namespaces[0].token, "a-long-enough-token");
}

TEST(ConfigTest, AConfigPathThatIsADirectoryIsAnError) {
  testing::TempDir dir;
  auto c = LoadConfigFile(dir.path().string(), EmbeddedDefaults());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("is a directory"), std::string_view::npos)
      << c.status().ToString();
}

TEST(ConfigTest, MeminfoIsParsed) {
  const HostMemory m = ParseMeminfo(
      "MemTotal:       24683204 kB\nMemAvailable:   16455556 kB\n"
      "HugePages_Free:       3\nHugepagesize:       2048 kB\n");
  EXPECT_EQ(m.mem_available, uint64_t{16455556} * 1024);
  EXPECT_EQ(m.hugepages_free, uint64_t{3} * 2048 * 1024);
}

TEST(ConfigTest, HostBytesBeyondAvailableMemoryIsRefusedNamingTheKey) {
  DaemonConfig c = EmbeddedDefaults();  // 1 GiB, prefaulted
  HostMemory m;
  m.mem_available = uint64_t{512} << 20;
  Status s = CheckHostBytes(c, m);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("host_bytes"), std::string_view::npos)
      << s.ToString();
  m.hugepages_free = uint64_t{1} << 30;  // hugepage arenas fit there
  EXPECT_OK(CheckHostBytes(c, m));
  m.cgroup_room = uint64_t{256} << 20;  // but the cgroup limit does not
  s = CheckHostBytes(c, m);
  EXPECT_NE(s.message().find("cgroup"), std::string_view::npos) << s.ToString();
  c.namespaces[0].prefault = false;  // committed lazily: the operator's call
  EXPECT_OK(CheckHostBytes(c, m));
  EXPECT_OK(CheckHostBytes(c, HostMemory{}));  // unknown: no check
}

TEST(ConfigTest, DaemonExitsNonZeroWithAClearMessageOnABadConfig) {
  testing::TempDir dir;
  std::ofstream(dir.File("bad.toml")) << "[server]\nio_threads = 0\n";
  const DaemonExit exit =
      RunTierkvd(dir, "--config " + dir.File("bad.toml") + " --socket " +
                          dir.File("s.sock"));
  EXPECT_EQ(exit.status, 2) << exit.output;
  EXPECT_NE(exit.output.find("server.io_threads"), std::string::npos)
      << exit.output;
}

// Issue 26: what a valid-looking config meets at start-up (a directory that
// cannot be made, an address that cannot be bound) is reported by a real
// tierkvd, exit status 2, with the key to fix.
TEST(ConfigTest, DaemonNamesTheKeyOfEveryStartUpFailure) {
  testing::TempDir dir;
  std::ofstream(dir.File("plain")) << "a file, not a directory\n";
  const std::string blocked = dir.File("plain");  // mkdir under it fails
  const std::string ns =
      "[[namespace]]\nname = \"a\"\nhost_bytes = "
      "\"8MiB\"\nshards = 1\nprefault = false\n";
  const std::string token = "token = \"12345678\"\n";
  struct Case {
    std::string toml;
    std::string args;
    std::vector<std::string> expected;  // all of them, in the output
  };
  const Case cases[] = {
      {ns + "token_file = \"" + blocked + "/tokens/a.token\"\n",
       "--metrics off",
       {"config namespace.token_file (namespace 'a'): cannot create " +
        blocked + "/tokens/a.token: mkdir " + blocked + "/tokens"}},
      {"[server]\nsocket = \"" + blocked + "/run/s.sock\"\n" + ns + token,
       "--metrics off",
       {"config server.socket: mkdir " + blocked + "/run"}},
      {"[server]\nsocket_group = \"no-such-group-tierkv\"\n" + ns + token,
       "--socket " + dir.File("s.sock") + " --metrics off",
       {"config server.socket_group: ", "no-such-group-tierkv"}},
      {"[metrics]\nlisten = \"not-an-address\"\n" + ns + token,
       "--socket " + dir.File("s.sock"),
       {"config metrics.listen: ", "not-an-address"}},
      {"[nvme]\npath = \"" + blocked + "/nvme.data\"\n" + ns + token,
       "--socket " + dir.File("s.sock") + " --metrics off",
       {"config nvme.path: NVMe tier at " + blocked + "/nvme.data"}},
      {ns + token,
       "--socket " + dir.File("s.sock") + " --metrics off --write-policy often",
       {"--write-policy: unknown write_policy 'often'"}},
      {ns + token,
       "--socket " + dir.File("s.sock") + " --metrics off --host-bytes 8MB/s",
       {"--host-bytes: \"8MB/s\": unknown unit \"MB/s\""}},
      {"[hbm]\nbackend = \"cuda\"\ndevice = 63\ncapacity_bytes = \"16MiB\"\n" +
           ns + token,
       "--socket " + dir.File("s.sock") + " --metrics off",
       {storage::DeviceBackend::CudaBuiltIn() ? "config hbm.device: "
                                              : "config hbm.backend: "}},
  };
  for (const Case& c : cases) {
    std::ofstream(dir.File("c.toml"), std::ios::trunc) << c.toml;
    const DaemonExit exit =
        RunTierkvd(dir, "--config " + dir.File("c.toml") + " " + c.args);
    EXPECT_EQ(exit.status, 2) << c.toml << c.args << "\n" << exit.output;
    for (const std::string& expected : c.expected) {
      EXPECT_NE(exit.output.find(expected), std::string::npos)
          << c.toml << c.args << "\nwanted: " << expected << "\n"
          << exit.output;
    }
  }
}

TEST(ConfigTest, DaemonRefusesHostBytesTheMachineDoesNotHave) {
  testing::TempDir dir;
  const DaemonExit exit =
      RunTierkvd(dir, "--host-bytes 64TiB --socket " + dir.File("s.sock") +
                          " --metrics off");
  EXPECT_EQ(exit.status, 2) << exit.output;
  EXPECT_NE(exit.output.find("namespace.host_bytes"), std::string::npos)
      << exit.output;
}

}  // namespace
}  // namespace tierkv::daemon

namespace tierkv::daemon {
namespace {

TEST(ConfigTest, ClusterSectionParsesWithFilesBesideTheConfig) {
  testing::TempDir dir;
  auto c = Load(dir, R"(
[cluster]
name = "prod-a"
node_id = "gpu-07"
secret_file = "cluster.key"
directory = "redis://10.0.0.2:6379/0"
directory_password_file = "/etc/tierkv/redis.pass"
peer_listen = "10.0.0.7:7400"
liveness_ttl_ms = 5000
lookup_budget_us = 500
fetch_deadline_ms = 750
transfer_spin_us = 0
[[namespace]]
name = "glm"
token = "a-long-enough-token"
shared = true
)");
  ASSERT_OK(c);
  ASSERT_OK(c->Validate());
  ASSERT_TRUE(c->cluster.has_value());
  const ClusterConfig& k = *c->cluster;
  EXPECT_EQ(k.name, "prod-a");
  EXPECT_EQ(k.node_id, "gpu-07");
  EXPECT_EQ(k.secret_file, dir.File("cluster.key"));  // next to the config
  EXPECT_EQ(k.directory_password_file, "/etc/tierkv/redis.pass");
  EXPECT_EQ(k.peer_listen, "10.0.0.7:7400");
  EXPECT_EQ(k.liveness_ttl_ms, 5000u);
  EXPECT_EQ(k.lookup_budget_us, 500u);
  EXPECT_EQ(k.fetch_deadline_ms, 750u);
  EXPECT_EQ(k.transfer_spin_us, 0u);
  EXPECT_TRUE(c->namespaces[0].shared);
  // Without [cluster], a node is alone and shares nothing.
  auto alone =
      Load(dir, "[[namespace]]\nname = \"x\"\ntoken = \"t-123456789\"\n");
  ASSERT_OK(alone);
  EXPECT_FALSE(alone->cluster.has_value());
  EXPECT_FALSE(alone->namespaces[0].shared);
}

TEST(ConfigTest, ClusterMistakesNameTheirKey) {
  testing::TempDir dir;
  const std::string base =
      "[cluster]\nsecret_file = \"k\"\ndirectory = \"redis://h:1\"\n";
  struct Case {
    std::string text;
    std::string key;
  };
  for (const Case& bad : std::vector<Case>{
           {"[cluster]\ndirectory = \"redis://h:1\"\n", "cluster.secret_file"},
           {"[cluster]\nsecret_file = \"k\"\n", "cluster.directory"},
           {base + "peer_listen = \"0.0.0.0:7400\"\n", "cluster.peer_listen"},
           {base + "name = \"has space\"\n", "cluster.name"},
           {base + "node_id = \"a/b\"\n", "cluster.node_id"},
           {base + "liveness_ttl_ms = 100\n", "cluster.liveness_ttl_ms"},
           {base + "fetch_deadline_ms = 0\n", "cluster.fetch_deadline_ms"},
           {base + "lookup_budget_us = 1\n", "cluster.lookup_budget_us"},
           {base + "transfer_spin_us = 20000\n", "cluster.transfer_spin_us"},
           {base + "colour = \"red\"\n", "cluster"},
           {"[[namespace]]\nname = \"x\"\ntoken = \"t-123456789\"\nshared = "
            "true\n",
            "shared"},
       }) {
    auto c = Load(dir, bad.text);
    const Status s = c.ok() ? c->Validate() : c.status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad.text;
    EXPECT_NE(s.message().find(bad.key), std::string::npos)
        << bad.text << " -> " << s.ToString();
  }
}

}  // namespace
}  // namespace tierkv::daemon

namespace tierkv::daemon {
namespace {

TEST(ConfigTest, WeightsNamespaceParsesAndDefaultsToOff) {
  testing::TempDir dir;
  auto c = Load(dir, R"(
[[namespace]]
name = "kv"
token = "a-long-enough-token"
[[namespace]]
name = "weights"
token = "another-long-token"
host_bytes = "512MiB"
weights = true
)");
  ASSERT_OK(c);
  ASSERT_OK(c->Validate());
  EXPECT_FALSE(c->namespaces[0].weights);
  EXPECT_TRUE(c->namespaces[1].weights);
  // A weights namespace is ordered by its schedule unless told otherwise.
  EXPECT_EQ(c->namespaces[0].eviction_policy,
            storage::EvictionPolicyKind::kLru);
  EXPECT_EQ(c->namespaces[1].eviction_policy,
            storage::EvictionPolicyKind::kWeights);
  EXPECT_EQ(c->namespaces[1].prefetch_horizon_ms, 60000u);
  EXPECT_EQ(c->namespaces[1].prefetch_bytes_per_second, 0u);
}

TEST(ConfigTest, WeightsPrefetchKeysParse) {
  testing::TempDir dir;
  auto c = Load(dir, R"(
[[namespace]]
name = "weights"
token = "another-long-token"
weights = true
eviction_policy = "lru"
prefetch_horizon_ms = 5000
prefetch_bytes_per_second = "2GiB"
)");
  ASSERT_OK(c);
  ASSERT_OK(c->Validate());
  EXPECT_EQ(c->namespaces[0].eviction_policy,
            storage::EvictionPolicyKind::kLru);
  EXPECT_EQ(c->namespaces[0].prefetch_horizon_ms, 5000u);
  EXPECT_EQ(c->namespaces[0].prefetch_bytes_per_second, uint64_t{2} << 30);
}

TEST(ConfigTest, WeightsMistakesNameTheirKey) {
  testing::TempDir dir;
  const std::string ns =
      "[[namespace]]\nname = \"w\"\ntoken = \"t-123456789\"\nweights = true\n";
  struct Case {
    std::string text;
    std::string key;
  };
  for (const Case& bad : std::vector<Case>{
           // The default host_bytes (1 GiB) is enough; 255 MiB is not.
           {ns + "host_bytes = \"255MiB\"\n", "namespace.host_bytes"},
           {"[cluster]\nsecret_file = \"k\"\ndirectory = \"redis://h:1\"\n" +
                ns + "shared = true\n",
            "namespace.weights"},
           {"[[namespace]]\nname = \"w\"\ntoken = \"t-123456789\"\n"
            "weights = 1\n",
            "namespace.weights"},
           // Weights-only keys and policy on a KV namespace.
           {"[[namespace]]\nname = \"k\"\ntoken = \"t-123456789\"\n"
            "eviction_policy = \"weights\"\n",
            "namespace.eviction_policy"},
           {"[[namespace]]\nname = \"k\"\ntoken = \"t-123456789\"\n"
            "prefetch_horizon_ms = 10\n",
            "namespace.prefetch_horizon_ms"},
           {"[[namespace]]\nname = \"k\"\ntoken = \"t-123456789\"\n"
            "prefetch_bytes_per_second = \"1GiB\"\n",
            "namespace.prefetch_bytes_per_second"},
           // Past a week: a next use that far is no schedule (and the
           // deadline arithmetic must stay in range).
           {ns + "prefetch_horizon_ms = 604800001\n",
            "namespace.prefetch_horizon_ms"},
       }) {
    auto c = Load(dir, bad.text);
    const Status s = c.ok() ? c->Validate() : c.status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad.text;
    EXPECT_NE(s.message().find(bad.key), std::string::npos)
        << bad.text << " -> " << s.ToString();
  }
}

}  // namespace
}  // namespace tierkv::daemon
