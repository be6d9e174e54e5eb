// Tests daemon/cluster_metrics.cc and DaemonMetrics::AddCluster: the
// cluster's directory (an in-process MemoryDirectory) and real peer
// transports (UCX over TCP on loopback, two or three in this process) are
// exported at scrape time, so every scrape shows what they counted by then.
#include "daemon/cluster_metrics.h"

#include <gtest/gtest.h>
#include <prometheus/metric_family.h>

#include <cstddef>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "daemon/metrics.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"
#include "transport/directory/memory_directory.h"
#include "transport/peer/peer_transport.h"

#if defined(__SANITIZE_THREAD__)
#define TIERKV_TEST_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TIERKV_TEST_UNDER_TSAN 1
#endif
#endif
#ifndef TIERKV_TEST_UNDER_TSAN
#define TIERKV_TEST_UNDER_TSAN 0
#endif

namespace tierkv::daemon {
namespace {

using transport::DirectoryNamespace;
using transport::MemoryDirectory;
using transport::MemoryDirectoryCluster;
using transport::peer::PeerReply;
using transport::peer::PeerRequest;
using transport::peer::PeerResponder;
using transport::peer::PeerTransport;
using transport::peer::PeerTransportOptions;
using Labels = std::map<std::string, std::string>;

constexpr uint16_t kFetch = 1;            // replies "head" + kReplyBytes
constexpr size_t kReplyBytes = 64 << 10;  // rendezvous (>= 16 KiB)
const DirectoryNamespace kNs{"shared", 42};

std::vector<PageHash> Pages(size_t count) {
  std::vector<PageHash> pages;
  for (size_t i = 0; i < count; ++i) pages.push_back(PageHash{i + 1, 7});
  return pages;
}

PeerTransportOptions Options(std::string node, char secret) {
  PeerTransportOptions o;
  o.node_id = std::move(node);
  o.cluster_name = "metrics-test";
  o.cluster_secret.assign(32, static_cast<std::byte>(secret));
  o.ucx_settings = {{"TLS", "tcp"}, {"KEEPALIVE_INTERVAL", "2s"}};
  return o;
}

// The value of the sample of `family` whose labels are exactly `labels`.
std::optional<double> Sample(const std::vector<prometheus::MetricFamily>& all,
                             const std::string& family,
                             const Labels& labels = {}) {
  for (const prometheus::MetricFamily& f : all) {
    if (f.name != family) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      Labels got;
      for (const auto& l : m.label) got[l.name] = l.value;
      if (got != labels) continue;
      return f.type == prometheus::MetricType::Counter ? m.counter.value
                                                       : m.gauge.value;
    }
  }
  return std::nullopt;
}

// Two cluster nodes, "a" and "b": each a MemoryDirectory in one shared
// cluster and a PeerTransport. b answers kFetch with kReplyBytes of data and
// reports when the send completed (which is when it counts the bytes
// served).
class ClusterMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (TIERKV_TEST_UNDER_TSAN) {
      // UCX's memory hooks crash ThreadSanitizer (see
      // tests/transport/peer/peer_transport_test.cc, which runs the
      // transport under it with the hooks off).
      GTEST_SKIP() << "UCX under ThreadSanitizer: covered by peer_tests";
    }
    reply_data_.assign(kReplyBytes, std::byte{0x5a});
    auto b = PeerTransport::Open(
        Options("b", 's'), [this](const PeerRequest&, PeerResponder r) {
          r.ReplyWithData({std::byte{'h'}},
                          {std::span<const std::byte>(reply_data_)},
                          [this](Status s) { sent_.set_value(s); });
        });
    ASSERT_OK(b);
    peer_b_ = std::move(*b);
    auto a = PeerTransport::Open(Options("a", 's'), nullptr);
    ASSERT_OK(a);
    peer_a_ = std::move(*a);
    dir_a_.emplace(&cluster_,
                   transport::DirectoryNode{"a", peer_a_->listen_address(), 1});
    dir_b_.emplace(&cluster_,
                   transport::DirectoryNode{"b", peer_b_->listen_address(), 1});
  }

  // a fetches from b; returns once b's send has completed too.
  void FetchFromB() {
    Result<PeerReply> reply =
        peer_a_->CallAndWait(peer_b_->listen_address(), kFetch, {});
    ASSERT_OK(reply);
    EXPECT_EQ(reply->data.size(), kReplyBytes);
    ASSERT_OK(sent_.get_future().get());
  }

  MemoryDirectoryCluster cluster_;  // outlives the directories
  std::vector<std::byte> reply_data_;
  std::promise<Status> sent_;  // b's one reply send, completed
  std::unique_ptr<PeerTransport> peer_b_;
  std::unique_ptr<PeerTransport> peer_a_;
  std::optional<MemoryDirectory> dir_a_;
  std::optional<MemoryDirectory> dir_b_;
};

TEST_F(ClusterMetricsTest, DaemonMetricsScrapesShowWhatTheClusterCounted) {
  DaemonMetrics metrics;
  ASSERT_OK(metrics.Serve("127.0.0.1:0"));
  metrics.AddCluster(&*dir_a_, peer_a_.get());
  auto scrape = [&] {
    Result<std::string> text = testing::HttpGet(metrics.port(), "/metrics");
    EXPECT_OK(text);
    return text.ok() ? *text : std::string();
  };
  auto value = [](const std::string& text, const std::string& series) {
    return testing::MetricValue(text, series);
  };

  std::string text = scrape();
  EXPECT_EQ(value(text, "tierkv_directory_up"), 1);
  EXPECT_EQ(value(text, "tierkv_peers_live"), 1) << "b; a itself is left out";
  EXPECT_EQ(value(text, "tierkv_directory_ops_total{op=\"lookup\"}"), 0);
  EXPECT_EQ(value(text, "tierkv_peer_connections"), 0);
  EXPECT_EQ(value(text, "tierkv_peer_requests_total{direction=\"sent\"}"), 0);
  EXPECT_EQ(value(text, "tierkv_peer_errors_total{reason=\"auth\"}"), 0);

  const auto pages = Pages(3);
  ASSERT_OK(dir_a_->Publish(kNs, pages));
  ASSERT_OK(dir_b_->Publish(kNs, std::span(pages).subspan(0, 2)));
  auto holders = dir_a_->Lookup(kNs, pages);
  ASSERT_OK(holders);
  ASSERT_EQ(holders->size(), 2u);
  FetchFromB();

  text = scrape();
  EXPECT_EQ(value(text, "tierkv_directory_ops_total{op=\"lookup\"}"), 1);
  EXPECT_EQ(value(text, "tierkv_directory_ops_total{op=\"publish\"}"), 3)
      << "pages a published";
  EXPECT_EQ(
      value(text, "tierkv_directory_lookup_pages_total{result=\"requested\"}"),
      3);
  EXPECT_EQ(value(text, "tierkv_directory_lookup_pages_total{result=\"held\"}"),
            2);
  EXPECT_EQ(value(text, "tierkv_peer_connections"), 1);
  EXPECT_EQ(value(text, "tierkv_peer_connections_opened_total"), 1);
  EXPECT_EQ(value(text, "tierkv_peer_requests_total{direction=\"sent\"}"), 1);
  EXPECT_EQ(value(text, "tierkv_peer_requests_total{direction=\"served\"}"), 0);
  EXPECT_GE(value(text, "tierkv_peer_bytes_total{direction=\"received\"}"),
            static_cast<double>(kReplyBytes));
  EXPECT_GT(value(text, "tierkv_peer_bytes_total{direction=\"sent\"}"), 0);
  EXPECT_EQ(value(text, "tierkv_peer_served_bytes_total"), 0);

  // b goes quiet (its liveness TTL ran out), then the directory goes down:
  // a's writes are dropped and the gauge says so.
  cluster_.SetLive("b", false);
  cluster_.SetDown(true);
  EXPECT_FALSE(dir_a_->Publish(kNs, pages).ok());
  text = scrape();
  EXPECT_EQ(value(text, "tierkv_peers_live"), 0);
  EXPECT_EQ(value(text, "tierkv_directory_up"), 0);
  EXPECT_EQ(value(text, "tierkv_directory_dropped_pages_total"), 3);
  metrics.StopServing();
}

TEST_F(ClusterMetricsTest, TheServingNodeCountsWhatItServed) {
  FetchFromB();
  const auto all = ClusterMetrics(&*dir_b_, peer_b_.get()).Collect();
  EXPECT_EQ(
      Sample(all, "tierkv_peer_requests_total", {{"direction", "served"}}), 1);
  EXPECT_EQ(Sample(all, "tierkv_peer_served_bytes_total"),
            static_cast<double>(kReplyBytes));
  EXPECT_GE(Sample(all, "tierkv_peer_bytes_total", {{"direction", "sent"}}),
            static_cast<double>(kReplyBytes));
  EXPECT_EQ(Sample(all, "tierkv_peer_connections"), 1);
}

TEST_F(ClusterMetricsTest, ARefusedHandshakeIsAnAuthError) {
  auto intruder = PeerTransport::Open(Options("intruder", 'x'), nullptr);
  ASSERT_OK(intruder);
  Result<PeerReply> reply =
      (*intruder)->CallAndWait(peer_b_->listen_address(), kFetch, {});
  EXPECT_EQ(reply.status().code(), StatusCode::kPermissionDenied);
  const auto all = ClusterMetrics(nullptr, intruder->get()).Collect();
  EXPECT_EQ(Sample(all, "tierkv_peer_errors_total", {{"reason", "auth"}}), 1);
  EXPECT_EQ(Sample(all, "tierkv_peer_errors_total", {{"reason", "timeout"}}),
            0);
  EXPECT_EQ(Sample(all, "tierkv_peer_connections"), 0);
  EXPECT_EQ(Sample(all, "tierkv_directory_up"), std::nullopt)
      << "no directory given, no directory families";
}

TEST(ClusterMetrics, EveryFamilyIsPresentBeforeAnythingHappened) {
  MemoryDirectoryCluster cluster;
  MemoryDirectory self(&cluster, {"self", "127.0.0.1:1", 1});
  const auto all = ClusterMetrics(&self, nullptr).Collect();
  EXPECT_EQ(Sample(all, "tierkv_directory_up"), 1);
  for (const char* family :
       {"tierkv_directory_last_lookup_seconds", "tierkv_directory_queued_pages",
        "tierkv_directory_dropped_pages_total",
        "tierkv_directory_reconnects_total", "tierkv_peers_live"}) {
    EXPECT_EQ(Sample(all, family), 0) << family;
  }
  for (const char* op : {"lookup", "publish", "unpublish", "forget",
                         "heartbeat", "refresh", "republish"}) {
    EXPECT_EQ(Sample(all, "tierkv_directory_ops_total", {{"op", op}}), 0) << op;
  }
  for (const char* op : {"lookup", "heartbeat", "write"}) {
    EXPECT_EQ(Sample(all, "tierkv_directory_errors_total", {{"op", op}}), 0)
        << op;
  }
}

}  // namespace
}  // namespace tierkv::daemon
