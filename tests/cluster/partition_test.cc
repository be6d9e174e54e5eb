// A network partition between two tierkvd nodes (shared/reference/
// scaleout.md §9.4): each node in a network namespace the test creates,
// joined by a veth pair, the directory's redis-server on node A's side. The
// link goes down (a partition: B reaches neither A nor the directory) and
// comes back (the heal). While partitioned, B's reads of A's pages fail by
// the fetch deadline, never hang and never return wrong bytes; healed, B
// reads them again. Needs root (ip netns); skipped otherwise.
//
// Daemons start through `ip netns exec`; the test thread enters node A's
// namespace only to start and reach the redis-server there. Clients reach
// the daemons through their Unix sockets, which no network namespace hides.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <thread>

#include "tests/client/client_test_util.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/transport/directory/redis_server.h"

namespace tierkv::testing {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kToken[] = "partition-test-token-0123456789abcdef";

// This thread in network namespace `name` for the scope.
class ScopedNetns {
 public:
  explicit ScopedNetns(const std::string& name)
      : home_(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC)) {
    const int target =
        ::open(("/var/run/netns/" + name).c_str(), O_RDONLY | O_CLOEXEC);
    entered_ = home_ >= 0 && target >= 0 && ::setns(target, CLONE_NEWNET) == 0;
    if (target >= 0) ::close(target);
  }
  ~ScopedNetns() {
    if (entered_) ::setns(home_, CLONE_NEWNET);
    if (home_ >= 0) ::close(home_);
  }
  bool entered() const { return entered_; }

 private:
  const int home_;
  bool entered_ = false;
};

// Two namespaces joined by a veth pair: a at 10.199.N.1, b at 10.199.N.2.
class TestNetwork {
 public:
  TestNetwork()
      : tag_(std::to_string(::getpid() % 100000)),
        subnet_(fmt::format("10.199.{}", ::getpid() % 250)) {}
  ~TestNetwork() {
    Run("ip netns del " + a());
    Run("ip netns del " + b());
  }

  // False (with the failing command in `error`) when namespaces cannot be
  // made here (not root, no ip, a container without the capability).
  bool Create(std::string& error) {
    for (const std::string& cmd :
         {"ip netns add " + a(), "ip netns add " + b(),
          fmt::format("ip link add tkv{}a netns {} type veth peer name tkv{}b "
                      "netns {}",
                      tag_, a(), tag_, b()),
          fmt::format("ip -n {} addr add {}/24 dev tkv{}a", a(), address_a(),
                      tag_),
          fmt::format("ip -n {} addr add {}/24 dev tkv{}b", b(), address_b(),
                      tag_),
          "ip -n " + a() + " link set lo up",
          "ip -n " + b() + " link set lo up",
          fmt::format("ip -n {} link set tkv{}a up", a(), tag_),
          fmt::format("ip -n {} link set tkv{}b up", b(), tag_)}) {
      if (!Run(cmd)) {
        error = cmd;
        return false;
      }
    }
    // The kernel reports a veth's carrier with a delay of up to a second
    // (linkwatch), and UCX leaves out a device without one: a bounded poll
    // of the state the kernel shows, as nothing signals it.
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (!Run(fmt::format("ip -n {} -br link show tkv{}b | grep -q ' UP '",
                            b(), tag_)) ||
           !Run(fmt::format("ip -n {} -br link show tkv{}a | grep -q ' UP '",
                            a(), tag_))) {
      if (Clock::now() > deadline) {
        error = "the veth pair never got a carrier";
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }
  // The partition (false) and the heal (true).
  bool SetLink(bool up) {
    return Run(fmt::format("ip -n {} link set tkv{}a {}", a(), tag_,
                           up ? "up" : "down"));
  }

  std::string a() const { return "tkv" + tag_ + "a"; }
  std::string b() const { return "tkv" + tag_ + "b"; }
  std::string device_a() const { return "tkv" + tag_ + "a"; }
  std::string device_b() const { return "tkv" + tag_ + "b"; }
  std::string address_a() const { return subnet_ + ".1"; }
  std::string address_b() const { return subnet_ + ".2"; }

 private:
  static bool Run(const std::string& cmd) {
    return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0;
  }
  const std::string tag_;
  const std::string subnet_;
};

class ClusterPartitionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root for ip netns";
    if (!RedisServer::Available()) GTEST_SKIP() << "no redis-server";
    std::string error;
    if (!net_.Create(error))
      GTEST_SKIP() << "cannot make namespaces: " << error;
    redis_ = std::make_unique<RedisServer>(
        RedisServer::Spec{.also_bind = net_.address_a()});
    ScopedNetns in(net_.a());
    ASSERT_TRUE(in.entered());
    ASSERT_OK(redis_->Start());
  }

  std::string WriteSecret() {
    std::vector<char> bytes(32);
    std::random_device rd;
    for (char& b : bytes) b = static_cast<char>(rd());
    const std::string path = dir_.File("cluster.key");
    std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
    ::chmod(path.c_str(), 0600);
    return path;
  }

  // Starts node `id` in namespace `netns`, its peer listener on `address`
  // of interface `device`.
  std::unique_ptr<DaemonProcess> StartNode(const std::string& id,
                                           const std::string& netns,
                                           const std::string& address,
                                           const std::string& device) {
    const std::string config = fmt::format(
        R"([cluster]
name = "test"
node_id = "{}"
secret_file = "{}"
directory = "{}"
directory_password_file = "{}"
peer_listen = "{}:0"
liveness_ttl_ms = 2000
lookup_budget_us = 100000
fetch_deadline_ms = 1000
[[namespace]]
name = "default"
token = "{}"
host_bytes = "16MiB"
shards = 1
shared = true
)",
        id, secret_, redis_->url(), redis_->password_file(), address, kToken);
    auto d = std::make_unique<DaemonProcess>();
    // `ip netns exec` rather than this thread's namespace: it also mounts
    // the namespace's own /sys, where UCX looks for network devices. UCX
    // 1.13 leaves a veth out of its tcp devices unless named (it has no
    // link speed to rank it by).
    const Status s =
        d->Start({.config_toml = config,
                  .env = {{"UCX_TLS", "tcp"},
                          {"UCX_NET_DEVICES", device},
                          {"UCX_WARN_UNUSED_ENV_VARS", "n"}},
                  .wrapper = {"/usr/sbin/ip", "netns", "exec", netns}});
    EXPECT_OK(s);
    return s.ok() ? std::move(d) : nullptr;
  }

  std::unique_ptr<Client> Open(const DaemonProcess& d) {
    auto c = d.Connect("default", kToken);
    EXPECT_OK(c);
    if (!c.ok()) return nullptr;
    EXPECT_OK((*c)->RegisterLayout(IndexShareLayout(4, 2)));
    return std::move(c).value();
  }

  // Per segment of `page`: OK only with the bytes A stored.
  static std::vector<Status> GetPage(Client& c, const PageHash& page) {
    const LayoutSpec layout = IndexShareLayout(4, 2);
    const std::vector<SegmentKey> keys = LayoutKeys(layout, page);
    std::vector<std::vector<std::byte>> dst;
    std::vector<SegmentRead> reads;
    for (const auto& k : keys) {
      dst.emplace_back(layout.SegmentBytes(k.layer, k.part));
    }
    for (size_t i = 0; i < keys.size(); ++i) reads.push_back({keys[i], dst[i]});
    std::vector<Status> out = c.Get(reads);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (out[i].ok() && dst[i] != SegmentBytes(keys[i], dst[i].size())) {
        out[i] = Status::Corruption("wrong bytes for " + keys[i].ToString());
      }
    }
    return out;
  }
  static bool AllOk(const std::vector<Status>& statuses) {
    return std::all_of(statuses.begin(), statuses.end(),
                       [](const Status& s) { return s.ok(); });
  }

  TestNetwork net_;  // declared first: torn down after the processes in it
  TempDir dir_;
  std::unique_ptr<RedisServer> redis_;
  const std::string secret_ = WriteSecret();
};

TEST_F(ClusterPartitionTest,
       APartitionFailsReadsByTheDeadlineAndTheHealEndsIt) {
  auto a = StartNode("node-a", net_.a(), net_.address_a(), net_.device_a());
  auto b = StartNode("node-b", net_.b(), net_.address_b(), net_.device_b());
  ASSERT_TRUE(a && b);
  const auto pages = Pages(6);
  auto ca = Open(*a);
  for (const PutResult& r :
       PutLayoutPages(*ca, IndexShareLayout(4, 2), pages)) {
    ASSERT_OK(r);
  }
  auto cb = Open(*b);
  ASSERT_TRUE(PollUntil([&] {
    auto m = cb->Match(pages, {.prefetch = false});
    return m.ok() && m->leading_pages == pages.size();
  })) << b->log();
  for (const Status& s : GetPage(*cb, pages[0])) ASSERT_OK(s);

  ASSERT_TRUE(net_.SetLink(false));
  for (const PageHash& page : {pages[1], pages[2]}) {
    const auto t0 = Clock::now();
    const std::vector<Status> got = GetPage(*cb, page);
    const auto took = Clock::now() - t0;
    for (const Status& s : got) {
      EXPECT_FALSE(s.ok());
      EXPECT_NE(s.code(), StatusCode::kCorruption) << s.ToString();
    }
    // fetch_deadline_ms, plus the transport's stalled-receive grace.
    EXPECT_LT(took, std::chrono::milliseconds(1500));
  }
  // B still serves what it holds.
  EXPECT_TRUE(AllOk(GetPage(*cb, pages[0])));

  ASSERT_TRUE(net_.SetLink(true));
  // Healed: once the transport's and the directory's back-offs end.
  EXPECT_TRUE(PollUntil([&] { return AllOk(GetPage(*cb, pages[3])); },
                        std::chrono::seconds(40)))
      << b->log();
  for (const PageHash& page : pages) EXPECT_TRUE(AllOk(GetPage(*cb, page)));
}

}  // namespace
}  // namespace tierkv::testing
