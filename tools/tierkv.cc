// tierkv: command-line client for tierkvd (status, stats, put/get/ls for
// debugging a namespace, and a synthetic demo workload). See README "CLI".
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "tierkv/client.h"
#include "tierkv/page_hash.h"
#include "tools/demo_workload.h"
#include "tools/soak_workload.h"

namespace {

using tierkv::Status;

struct Connection {
  std::string socket = "/run/tierkv/tierkv.sock";
  std::string ns = "default";
  std::string token;
  std::string token_file;  // default: <socket dir>/<namespace>.token
};

int Fail(const Status& s) {
  fmt::print(stderr, "tierkv: {}\n", s.ToString());
  return 1;
}

// --token, else the first line of --token-file (default: the namespace's
// token file next to the socket).
tierkv::Result<std::string> ResolveToken(const Connection& c) {
  if (!c.token.empty()) return c.token;
  std::string file = c.token_file;
  if (file.empty()) {
    file = (std::filesystem::path(c.socket).parent_path() / (c.ns + ".token"))
               .string();
  }
  std::ifstream in(file);
  if (!in) {
    return Status::PermissionDenied(
        "no --token given and cannot read token file " + file);
  }
  std::string token;
  std::getline(in, token);
  return token;
}

tierkv::Result<std::unique_ptr<tierkv::Client>> Connect(const Connection& c,
                                                        bool open_namespace) {
  auto client = tierkv::Client::Connect({.socket_path = c.socket});
  if (!client.ok() || !open_namespace) return client;
  auto token = ResolveToken(c);
  if (!token.ok()) return token.status();
  TIERKV_RETURN_IF_ERROR((*client)->OpenNamespace(c.ns, *token));
  return client;
}

// `tierkv soak`: prints the report; exit 1 on any error.
int RunSoak(const Connection& conn, tierkv::tools::SoakOptions o,
            uint32_t seconds, const std::string& json_path) {
  auto token = ResolveToken(conn);
  if (!token.ok()) return Fail(token.status());
  o.socket = conn.socket;
  o.ns = conn.ns;
  o.token = *token;
  o.duration = std::chrono::seconds(seconds);
  auto report = tierkv::tools::RunSoak(o);
  if (!report.ok()) return Fail(report.status());
  const nlohmann::json j = {
      {"seconds", report->seconds}, {"clients", o.clients},
      {"ops", report->ops},         {"by_op", report->by_op},
      {"busy", report->busy},       {"misses", report->misses},
      {"errors", report->errors},   {"first_errors", report->first_errors}};
  if (!json_path.empty()) std::ofstream(json_path) << j.dump(2) << "\n";
  fmt::print(
      "soak: {} clients, {:.0f} s: {} ops ({:.0f}/s), {} busy, {} misses, {} "
      "errors\n",
      o.clients, report->seconds, report->ops,
      report->ops / std::max(report->seconds, 1e-9), report->busy,
      report->misses, report->errors);
  for (const auto& e : report->first_errors) fmt::print("  error: {}\n", e);
  return report->errors == 0 ? 0 : 1;
}

tierkv::Result<tierkv::PageHash> ParsePage(const std::string& page,
                                           const std::string& tokens,
                                           const std::string& ns) {
  if (!page.empty()) return tierkv::PageHash::FromHex(page);
  if (tokens.empty())
    return Status::InvalidArgument("give --page HEX or --tokens 1,2,3");
  std::vector<uint32_t> ids;
  std::stringstream in(tokens);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      ids.push_back(static_cast<uint32_t>(std::stoul(item)));
    } catch (...) {
      return Status::InvalidArgument(
          "--tokens must be comma-separated integers");
    }
  }
  // The hash of the whole token list taken as one page.
  return tierkv::NextPageHash(tierkv::RootPageHash(ns), ids);
}

std::string Human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", bytes, units[u]);
}

int PrintStats(const std::string& json_text, bool raw) {
  if (raw) {
    fmt::print("{}\n", json_text);
    return 0;
  }
  auto j = nlohmann::json::parse(json_text);
  const auto& h = j["host"];
  const double hit = j["lookup_tokens"]["host"].get<double>();
  const double miss = j["lookup_tokens"]["miss"].get<double>();
  const double ghit = j["get_segments"]["hit"].get<double>();
  const double gmiss = j["get_segments"]["miss"].get<double>();
  fmt::print("namespace {}\n", j["namespace"].get<std::string>());
  fmt::print(
      "  host tier   {} / {} used ({:.1f}%), {} reserved, {} segments{}\n",
      Human(h["used_bytes"].get<double>()),
      Human(h["capacity_bytes"].get<double>()),
      100.0 * h["used_bytes"].get<double>() / h["capacity_bytes"].get<double>(),
      Human(h["reserved_bytes"].get<double>()), h["segments"].get<uint64_t>(),
      h["hugepages"].get<bool>() ? ", hugepages" : "");
  const double hit_nvme = j["lookup_tokens"].value("nvme", 0.0);
  fmt::print(
      "  lookups     {:.0f} requests; tokens hit {:.0f} in host, {:.0f} on "
      "nvme, "
      "missed {:.0f} (hit rate {:.1f}%)\n",
      j["lookups"].get<double>(), hit, hit_nvme, miss,
      100.0 * (hit + hit_nvme) / std::max(1.0, hit + hit_nvme + miss));
  fmt::print(
      "  gets        {:.0f} segments hit, {:.0f} missed (hit rate {:.1f}%)\n",
      ghit, gmiss, 100.0 * ghit / std::max(1.0, ghit + gmiss));
  fmt::print(
      "  puts        {:.0f} stored, {:.0f} deduplicated, {:.0f} failed\n",
      j["put_segments"]["stored"].get<double>(),
      j["put_segments"]["dedup"].get<double>(),
      j["put_segments"]["failed"].get<double>());
  fmt::print("  evictions   {} segments, {}\n", h["evictions"].get<uint64_t>(),
             Human(h["evicted_bytes"].get<double>()));
  if (j.contains("nvme")) {
    const auto& n = j["nvme"];
    fmt::print(
        "  nvme tier   {} / {} used, {} segments, {} evictions, {} checksum "
        "failures ({}, {})\n",
        Human(n["used_bytes"].get<double>()),
        Human(n["capacity_bytes"].get<double>()), n["segments"].get<uint64_t>(),
        n["evictions"].get<uint64_t>(), n["checksum_failures"].get<uint64_t>(),
        n["direct_io"].get<bool>() ? "O_DIRECT" : "buffered",
        n["io_uring"].get<bool>() ? "io_uring" : "pread/pwrite");
    fmt::print("  recovered   {} segments, {} at start-up{}\n",
               n["recovered_segments"].get<uint64_t>(),
               Human(n["recovered_bytes"].get<double>()),
               n["catalog_recreated"].get<bool>()
                   ? " (damaged catalog recreated)"
                   : "");
    fmt::print(
        "  mover       {} demoted in {} batches ({} failed), {} dirty "
        "waiting, {} reservations held back; {} promoted; policy {}\n",
        n["demotions_done"].get<uint64_t>(),
        n["demotion_batches"].get<uint64_t>(),
        n["demotions_failed"].get<uint64_t>(),
        h["dirty_segments"].get<uint64_t>(),
        h["backpressure_rejections"].get<uint64_t>(),
        n["promotions_done"].get<uint64_t>(),
        j["write_policy"].get<std::string>());
  }
  if (j.contains("transfers")) {
    // Registered-pool transfers (daemon-wide) and this namespace's waits.
    const auto& t = j["transfers"];
    auto u = [&](const char* a, const char* b) {
      return t.contains(a) && t[a].contains(b) ? t[a][b].get<double>() : 0.0;
    };
    auto mean_ms = [](const nlohmann::json& h) {
      const double n = h.value("count", 0.0);
      return n > 0 ? 1e3 * h.value("sum", 0.0) / n : 0.0;
    };
    fmt::print(
        "  transfers   {} loads, {} stores, {} prefetches, {} pools "
        "registered\n",
        t.value("loads", uint64_t{0}), t.value("stores", uint64_t{0}),
        t.value("prefetches", uint64_t{0}),
        t.value("registered_pools", uint64_t{0}));
    fmt::print(
        "    loaded    {:.0f} segments / {} from host, {:.0f} / {} from nvme, "
        "{:.0f} missed; mean {:.3f} ms per Load\n",
        u("load_segments", "host"), Human(u("load_bytes", "host")),
        u("load_segments", "nvme"), Human(u("load_bytes", "nvme")),
        u("load_segments", "miss"),
        mean_ms(t.value("load_seconds", nlohmann::json::object())));
    fmt::print(
        "    stored    {} segments / {}, {} deduplicated; mean {:.3f} ms per "
        "Store\n",
        t.value("store_segments", uint64_t{0}),
        Human(t.value("store_bytes", 0.0)), t.value("store_dedup", uint64_t{0}),
        mean_ms(t.value("store_seconds", nlohmann::json::object())));
    if (t.contains("promoted")) {
      fmt::print(
          "    tiers     {:.0f} segments / {} nvme -> host, {:.0f} / {} host "
          "-> nvme\n",
          u("promoted", "segments"), Human(u("promoted", "bytes")),
          u("written_to_nvme", "segments"),
          Human(u("written_to_nvme", "bytes")));
    }
    const auto w = t.value("layer_waits", nlohmann::json::object());
    const double waits = w.value("count", 0.0);
    fmt::print(
        "    waits     {:.0f} WaitLayer/Wait calls, {:.0f} blocked >= 1 us, "
        "{:.3f} s blocked in all\n",
        waits, w.value("blocked", 0.0), w.value("seconds", 0.0));
  }
  if (j.contains("workers")) {
    fmt::print(
        "  workers     {} queued, {} rejected (Busy); {} Reserves "
        "waited for write-back, {} still Busy\n",
        j["workers"].value("queue_depth", uint64_t{0}),
        j["workers"].value("rejections", uint64_t{0}),
        h.value("backpressure_waits", uint64_t{0}),
        h.value("backpressure_busy", uint64_t{0}));
  }
  fmt::print("  leases      {} active, {} segments referenced\n",
             j["active_leases"].get<uint64_t>(),
             h["referenced_segments"].get<uint64_t>());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tierkv: command-line client for tierkvd"};
  app.require_subcommand(1);
  Connection conn;
  app.add_option("--socket", conn.socket, "daemon socket")
      ->capture_default_str();
  app.add_option("-n,--namespace", conn.ns, "namespace")->capture_default_str();
  app.add_option("--token", conn.token, "namespace token");
  app.add_option(
      "--token-file", conn.token_file,
      "file holding the token (default: <socket dir>/<namespace>.token)");

  auto* status = app.add_subcommand(
      "status", "Is the daemon up? Version, uptime, namespaces");
  bool json_out = false;
  auto* stats = app.add_subcommand(
      "stats", "Hit rates, occupancy, evictions of a namespace");
  stats->add_flag("--json", json_out, "print the raw JSON");

  std::string page, tokens, file, out;
  uint16_t layer = 0;
  uint16_t part = 0;
  auto add_key = [&](CLI::App* sub) {
    sub->add_option("--page", page, "page hash (32 hex digits)");
    sub->add_option("--tokens", tokens, "token ids forming one page: 1,2,3");
    sub->add_option("--layer", layer, "layer")->capture_default_str();
    sub->add_option("--part", part, "part index within the layer")
        ->capture_default_str();
  };
  auto* put = app.add_subcommand("put", "Store a file as one segment");
  add_key(put);
  put->add_option("--file", file, "bytes to store")->required();
  auto* get = app.add_subcommand("get", "Fetch one segment");
  add_key(get);
  get->add_option("--out", out,
                  "write the bytes here (default: print size and hash)");
  uint32_t limit = 100;
  auto* ls = app.add_subcommand("ls", "List stored segments");
  ls->add_option("--limit", limit, "at most this many")->capture_default_str();

  tierkv::tools::DemoOptions demo_options;
  auto* demo = app.add_subcommand(
      "demo", "Run a synthetic byte workload (chat sessions sharing a prefix)");
  demo->add_option("--sessions", demo_options.sessions)->capture_default_str();
  demo->add_option("--prefix-tokens", demo_options.shared_prefix_tokens)
      ->capture_default_str();
  demo->add_option("--session-tokens", demo_options.session_tokens)
      ->capture_default_str();
  demo->add_option("--layers", demo_options.layers)->capture_default_str();

  tierkv::tools::SoakOptions soak_options;
  uint32_t soak_seconds = 600;
  std::string soak_json;
  auto* soak = app.add_subcommand(
      "soak",
      "Many clients running mixed Put/Get/lease/Match/Flush/reconnect load "
      "(scripts/soak.sh)");
  soak->add_option("--clients", soak_options.clients)->capture_default_str();
  soak->add_option("--seconds", soak_seconds)->capture_default_str();
  soak->add_option("--pages", soak_options.pages, "shared working set")
      ->capture_default_str();
  soak->add_option("--segment-bytes", soak_options.segment_bytes)
      ->capture_default_str();
  bool soak_no_flush = false;
  soak->add_flag("--no-flush", soak_no_flush, "skip Flush (no NVMe tier)");
  soak->add_option("--json", soak_json, "write the report as JSON");

  CLI11_PARSE(app, argc, argv);

  if (soak->parsed()) {
    soak_options.flush = !soak_no_flush;
    return RunSoak(conn, soak_options, soak_seconds, soak_json);
  }
  auto client = Connect(conn, /*open_namespace=*/!status->parsed());
  if (!client.ok()) return Fail(client.status());
  tierkv::Client& c = **client;

  if (status->parsed()) {
    auto info = c.Ping();
    if (!info.ok()) return Fail(info.status());
    auto j = nlohmann::json::parse(*info);
    fmt::print("tierkvd up: {} (pid {}), uptime {:.0f} s, namespaces: {}\n",
               j["version"].get<std::string>(), j["pid"].get<int>(),
               j["uptime_s"].get<double>(), j["namespaces"].dump());
    return 0;
  }
  if (stats->parsed()) {
    auto s = c.StatsJson();
    if (!s.ok()) return Fail(s.status());
    return PrintStats(*s, json_out);
  }
  if (ls->parsed()) {
    auto segments = c.List(limit);
    if (!segments.ok()) return Fail(segments.status());
    fmt::print("{:<32} {:>5} {:>4} {:>10} {:>4} {}\n", "page", "layer", "part",
               "bytes", "refs", "tier");
    for (const auto& s : *segments) {
      fmt::print("{:<32} {:>5} {:>4} {:>10} {:>4} {}\n", s.key.page.ToHex(),
                 s.key.layer, s.key.part, s.size, s.refs,
                 tierkv::TierName(s.tier));
    }
    return 0;
  }
  if (demo->parsed()) {
    Status s = tierkv::tools::RunDemo(c, demo_options);
    return s.ok() ? 0 : Fail(s);
  }
  auto hash = ParsePage(page, tokens, conn.ns);
  if (!hash.ok()) return Fail(hash.status());
  if (part > 255) return Fail(Status::InvalidArgument("--part must be < 256"));
  tierkv::SegmentKey key{*hash, layer, static_cast<uint8_t>(part)};
  if (put->parsed()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return Fail(Status::NotFound("cannot read " + file));
    std::string data((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
    tierkv::SegmentWrite w{key, std::as_bytes(std::span(data))};
    const tierkv::PutResult r = c.Put(std::span(&w, 1))[0];
    if (!r.ok()) return Fail(r.status);
    if (r.already_stored) {
      fmt::print("{} already stored (deduplicated, nothing copied)\n",
                 key.ToString());
      return 0;
    }
    fmt::print("stored {} ({} bytes)\n", key.ToString(), data.size());
    return 0;
  }
  if (get->parsed()) {
    auto lease = c.Acquire(std::span(&key, 1));
    if (!lease.ok()) return Fail(lease.status());
    if (!lease->statuses()[0].ok()) return Fail(lease->statuses()[0]);
    auto bytes = lease->data(0);
    if (out.empty()) {
      fmt::print("{}: {} bytes\n", key.ToString(), bytes.size());
    } else {
      std::ofstream o(out, std::ios::binary);
      o.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
      if (!o) return Fail(Status::IOError("cannot write " + out));
      fmt::print("wrote {} bytes to {}\n", bytes.size(), out);
    }
    return 0;
  }
  return 0;
}
