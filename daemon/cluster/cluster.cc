#include "daemon/cluster/cluster.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <unordered_set>

#include "transport/directory/redis_directory.h"
#include "transport/peer/cluster_secret.h"

namespace tierkv::daemon::cluster {

namespace {

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') {
    return "tierkv-node";
  }
  // Keep what a node id allows ([A-Za-z0-9_.-], at most 64).
  std::string id;
  for (const char* c = name; *c != '\0' && id.size() < 64; ++c) {
    const bool ok = std::isalnum(static_cast<unsigned char>(*c)) || *c == '_' ||
                    *c == '.' || *c == '-';
    id.push_back(ok ? *c : '-');
  }
  return id;
}

}  // namespace

Result<std::unique_ptr<Cluster>> Cluster::Open(
    const ClusterConfig& config,
    const std::vector<NamespaceConfig>& namespaces) {
  std::unique_ptr<Cluster> c(new Cluster());
  for (const NamespaceConfig& ns : namespaces) {
    if (ns.shared) c->shared_.push_back(ns.name);
  }
  const std::string node_id =
      config.node_id.empty() ? HostName() : config.node_id;

  auto secret = transport::peer::ReadClusterSecretFile(config.secret_file);
  if (!secret.ok()) {
    return ConfigKeyError("cluster.secret_file", secret.status());
  }
  transport::peer::PeerTransportOptions to;
  to.listen_address = config.peer_listen;
  to.cluster_name = config.name;
  to.node_id = node_id;
  to.cluster_secret = std::move(secret).value();
  to.default_deadline = std::chrono::milliseconds(config.fetch_deadline_ms);
  to.transfer_spin = std::chrono::microseconds(config.transfer_spin_us);
  Cluster* self = c.get();
#ifdef TIERKV_SYNC_POINTS
  auto stall = PeerServeStallFromEnvironment();
  if (!stall.ok()) return stall.status();
  if (*stall) {
    auto armed = PeerServeStall::Start(
        **stall, [self](const transport::peer::PeerRequest& request,
                        transport::peer::PeerResponder responder) {
          self->Serve(request, std::move(responder));
        });
    if (!armed.ok()) return armed.status();
    c->serve_stall_ = std::move(armed).value();
  }
#endif
  auto transport = transport::peer::PeerTransport::Open(
      to, [self](const transport::peer::PeerRequest& request,
                 transport::peer::PeerResponder responder) {
        self->HandleRequest(request, std::move(responder));
      });
  if (!transport.ok()) {
    return ConfigKeyError("cluster.peer_listen", transport.status());
  }
  c->transport_ = std::move(transport).value();

  transport::RedisDirectory::Options dopt;
  dopt.url = config.directory;
  dopt.password_file = config.directory_password_file;
  dopt.cluster = config.name;
  dopt.node_id = node_id;
  dopt.address = c->transport_->listen_address();
  dopt.liveness_ttl = std::chrono::milliseconds(config.liveness_ttl_ms);
  dopt.heartbeat_period =
      std::max(std::chrono::milliseconds(50), dopt.liveness_ttl / 5);
  dopt.lookup_budget = std::chrono::microseconds(config.lookup_budget_us);
  dopt.republish = [target =
                        c->republish_](transport::DirectoryRepublisher& sink) {
    MutexLock lock(&target->mu);
    if (target->publisher != nullptr) target->publisher->Republish(sink);
  };
  auto directory = transport::RedisDirectory::Open(dopt);
  if (!directory.ok()) {
    return ConfigKeyError("cluster.directory", directory.status());
  }
  c->directory_ = std::move(directory).value();

  PeerTierOptions po;
  po.shared = c->shared_;
  po.fetch_deadline = std::chrono::milliseconds(config.fetch_deadline_ms);
  c->tier_ =
      std::make_unique<PeerTier>(po, c->directory_, c->transport_, c.get());
  c->tier_->SetServedCounters([self] { return self->server_counters(); });
  c->tier_->SetFetchedListener(
      [self](uint32_t ns_id, std::vector<PageHash> pages) {
        self->Fetched(ns_id, pages);
      });
  spdlog::info(
      "cluster '{}': node '{}' serves peers on {}, directory {}, shared "
      "namespaces: {}",
      config.name, node_id, c->transport_->listen_address(), config.directory,
      c->shared_.empty() ? "none"
                         : fmt::format("{}", fmt::join(c->shared_, ", ")));
  return c;
}

Cluster::~Cluster() {
  Stop();
  transport_.reset();  // joins the progress thread (HandleRequest's)
#ifdef TIERKV_SYNC_POINTS
  serve_stall_.reset();  // answers what it holds, joins its thread
#endif
  directory_.reset();  // deregisters the node
}

void Cluster::Fetched(uint32_t ns_id, std::span<const PageHash> pages) {
  storage::CacheEngine* engine = engine_.load(std::memory_order_acquire);
  if (engine == nullptr || ns_id >= engine->namespaces().size()) return;
  Stored(engine->namespaces()[ns_id].get(), pages);
}

std::unique_ptr<storage::Tier> Cluster::TakeTier() { return std::move(tier_); }

void Cluster::Start(storage::CacheEngine* engine) {
  engine_.store(engine, std::memory_order_release);
  std::vector<storage::EngineNamespace*> shared;
  for (const std::string& name : shared_) {
    if (storage::EngineNamespace* ns = engine->Find(name)) shared.push_back(ns);
  }
  auto server = std::make_shared<PeerServer>(
      engine, std::unordered_set<std::string>(shared_.begin(), shared_.end()));
  auto publisher = std::make_shared<PagePublisher>(PagePublisherOptions{},
                                                   engine, directory_, shared);
  {
    MutexLock lock(&republish_->mu);
    republish_->publisher = publisher.get();
  }
  MutexLock lock(&mu_);
  server_ = std::move(server);
  publisher_ = std::move(publisher);
}

void Cluster::Stop() {
  std::shared_ptr<PeerServer> server;
  std::shared_ptr<PagePublisher> publisher;
  {
    MutexLock lock(&mu_);
    server = std::move(server_);
    publisher = std::move(publisher_);
  }
  // Peers are refused from now on, and no request in progress reaches the
  // engine any more.
  if (server) server->Stop();
  // Its thread ends, and a re-publish in progress stops at its next batch
  // (then the target is cleared: the callback returned).
  if (publisher) publisher->Stop();
  {
    MutexLock lock(&republish_->mu);
    republish_->publisher = nullptr;
  }
  // Before the engine goes: UCX must not read the arena (reply sends) or
  // write the engine's buffers (receives) once they are freed. Fetches in
  // flight end with Shutdown, and later ones at once.
  if (transport_) transport_->Shutdown();
  engine_.store(nullptr, std::memory_order_release);
}

void Cluster::HandleRequest(const transport::peer::PeerRequest& request,
                            transport::peer::PeerResponder responder) {
#ifdef TIERKV_SYNC_POINTS
  if (serve_stall_) {
    serve_stall_->Handle(request, std::move(responder));
    return;
  }
#endif
  Serve(request, std::move(responder));
}

void Cluster::Serve(const transport::peer::PeerRequest& request,
                    transport::peer::PeerResponder responder) {
  std::shared_ptr<PeerServer> server;
  {
    MutexLock lock(&mu_);
    server = server_;
  }
  if (!server) {
    responder.ReplyError(Status::Unavailable("this node is not serving yet"));
    return;
  }
  server->Handle(request, std::move(responder));
}

void Cluster::Stored(const storage::EngineNamespace* ns,
                     std::span<const PageHash> pages) {
  std::shared_ptr<PagePublisher> publisher;
  {
    MutexLock lock(&mu_);
    publisher = publisher_;
  }
  if (publisher) publisher->Stored(ns, pages);
}

std::shared_ptr<const LayoutSpec> Cluster::LayoutOf(uint32_t ns_id) const {
  storage::CacheEngine* engine = engine_.load(std::memory_order_acquire);
  if (engine == nullptr || ns_id >= engine->namespaces().size()) return nullptr;
  return engine->namespaces()[ns_id]->layout();
}

PeerServerCounters Cluster::server_counters() const {
  MutexLock lock(&mu_);
  return server_ ? server_->counters() : PeerServerCounters{};
}

PagePublisherStats Cluster::publisher_stats() const {
  MutexLock lock(&mu_);
  return publisher_ ? publisher_->Stats() : PagePublisherStats{};
}

}  // namespace tierkv::daemon::cluster
