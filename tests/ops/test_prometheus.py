"""The dashboard and the rules against the real thing: Debian's Prometheus
server, started here with deploy/prometheus/prometheus.yml (its target and
intervals pointed at this test's daemon), scrapes a real tierkvd with every
tier while `tierkv demo` runs against two namespaces; then every panel query
of deploy/grafana/tierkv.json and every recording rule is evaluated through
Prometheus's HTTP API and must return series with plausible values."""

from __future__ import annotations

import importlib.util
import json
import math
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import REPO, TOKEN, require_tool, stop_process

# Grafana's variables, as Grafana would expand them for "All namespaces"
# over a short test: every window reaches back over the whole workload.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "5m",
    "$namespace": ".*",
    "${namespace}": ".*",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, timeout: float = 10.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read().decode())


class Prometheus:
    """A real Prometheus server on loopback, its config written from the
    shipped deploy/prometheus/prometheus.yml."""

    def __init__(self, workdir: Path, target: str):
        self.port = free_port()
        shipped = yaml.safe_load(
            (REPO / "deploy/prometheus/prometheus.yml").read_text())
        # What the test changes: where the daemon is, how often to look, and
        # absolute rule paths. Everything else is the shipped file.
        shipped["global"]["scrape_interval"] = "1s"
        shipped["global"]["evaluation_interval"] = "1s"
        shipped["rule_files"] = [
            str(REPO / "deploy/prometheus" / f) for f in shipped["rule_files"]
        ]
        (job,) = [j for j in shipped["scrape_configs"]
                  if j["job_name"] == "tierkv"]
        job["static_configs"] = [{"targets": [target]}]
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(shipped))
        self.log = open(workdir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [require_tool("prometheus"), f"--config.file={self.config}",
             f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_until(self, what: str, pred, timeout: float = 60.0):
        """Polls `pred` (Prometheus's own state: readiness, samples in its
        TSDB) until it holds; fails with the log if it never does. A
        bounded poll of the real condition: Prometheus announces neither
        readiness nor a scrape to anyone."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"prometheus exited: {self.read_log()}")
            try:
                if pred():
                    return
            except OSError:
                pass
            time.sleep(0.2)
        pytest.fail(f"prometheus: {what} not within {timeout} s\n"
                    f"{self.read_log()}")

    def query(self, expr: str) -> list:
        r = http_json(f"{self.url}/api/v1/query?" +
                      urllib.parse.urlencode({"query": expr}))
        assert r["status"] == "success", (expr, r)
        return r["data"]["result"]

    def read_log(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-4000:]

    def stop(self):
        stop_process(self.proc)
        self.log.close()


def load_dashboard_module():
    spec = importlib.util.spec_from_file_location(
        "tierkv_dashboard", REPO / "deploy/grafana/tierkv_dashboard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def panel_targets(dashboard: dict):
    """(panel title, expr) for every target of every panel, rows included."""
    for panel in dashboard["panels"]:
        for p in [panel] + panel.get("panels", []):
            for t in p.get("targets", []):
                if t.get("expr"):
                    yield p["title"], t["expr"]


def expand(expr: str) -> str:
    for name in sorted(GRAFANA_VARIABLES, key=len, reverse=True):
        expr = expr.replace(name, GRAFANA_VARIABLES[name])
    assert "$" not in expr, f"an unexpanded variable in {expr}"
    return expr


class Workload:
    """`tierkv demo` in a loop against each namespace until stopped."""

    def __init__(self, bins: Path, sock: str):
        self.stop_event = threading.Event()
        self.runs = 0
        self.errors: list[str] = []
        self.threads = [
            threading.Thread(target=self._loop, args=(bins, sock, ns, token))
            for ns, token in (("default", TOKEN), ("batch", TOKEN + "-batch"))
        ]
        for t in self.threads:
            t.start()

    def _loop(self, bins, sock, ns, token):
        while not self.stop_event.is_set():
            r = subprocess.run(
                [str(bins / "tierkv"), "--socket", sock, "-n", ns, "--token",
                 token, "demo", "--sessions", "6", "--prefix-tokens", "2048",
                 "--session-tokens", "1024"],
                capture_output=True, text=True, timeout=120)
            if r.returncode != 0 or "0 read-back mismatches" not in r.stdout:
                self.errors.append(r.stdout[-2000:] + r.stderr[-2000:])
                return
            self.runs += 1

    def stop(self):
        self.stop_event.set()
        for t in self.threads:
            t.join()


def values(result: list) -> list[float]:
    return [float(s["value"][1]) for s in result]


def test_every_panel_and_recording_rule_on_a_real_prometheus(
        all_tiers_daemon, bins, tmp_path):
    d = all_tiers_daemon
    prom = Prometheus(tmp_path, f"127.0.0.1:{d.metrics_port}")
    workload = Workload(bins, d.socket)
    try:
        prom.wait_until("ready", lambda: urllib.request.urlopen(
            f"{prom.url}/-/ready", timeout=5).status == 200)
        # Scraped the daemon, and the rules have seen two scrapes of a
        # workload that has looked pages up in both namespaces.
        prom.wait_until("tierkvd scraped", lambda: values(
            prom.query('up{job="tierkv"}')) == [1.0])
        prom.wait_until(
            "lookups in both namespaces recorded",
            lambda: len(prom.query('tierkv:hit_ratio_all:rate5m')) == 2)
        # Ten scrapes at least under load, so every rate has samples.
        prom.wait_until("ten scrapes", lambda: values(prom.query(
            'count_over_time(tierkv_connections[1m])')) and values(
                prom.query('count_over_time(tierkv_connections[1m])'))[0]
            >= 10)
        assert not workload.errors, workload.errors

        capacity = sum(values(prom.query(
            'tierkv_tier_bytes{state="capacity"}')))
        assert capacity == 16 * 2**20 + 16 * 2**20 + 256 * 2**20

        # Every recording rule: present, finite, and within its range.
        rules = yaml.safe_load(
            (REPO / "deploy/prometheus/rules/tierkv-recording.yml")
            .read_text())
        recorded = [r["record"] for g in rules["groups"] for r in g["rules"]]
        assert len(recorded) == 4
        for name in recorded:
            result = prom.query(name)
            assert result, f"recording rule {name}: no series"
            for v in values(result):
                assert math.isfinite(v) and v >= 0, (name, result)
                if "ratio" in name:
                    assert v <= 1.0, (name, result)
        # The tiers' hit shares add up to the namespace's hit ratio, and the
        # workload (a second turn over the same prompts) hits.
        for ns in ("default", "batch"):
            by_tier = sum(values(prom.query(
                f'tierkv:hit_ratio:rate5m{{namespace="{ns}"}}')))
            (overall,) = values(prom.query(
                f'tierkv:hit_ratio_all:rate5m{{namespace="{ns}"}}'))
            assert by_tier == pytest.approx(overall, abs=1e-9)
            assert 0.2 < overall <= 1.0, (ns, overall)
        tiers = {s["metric"]["tier"]
                 for s in prom.query("tierkv:tier_occupancy:ratio")}
        assert tiers == {"hbm", "host", "nvme"}

        # Every dashboard panel's query: non-empty, finite, plausible.
        dashboard = json.loads(
            (REPO / "deploy/grafana/tierkv.json").read_text())
        module = load_dashboard_module()
        plausible = module.PLAUSIBLE
        checked = 0
        for title, expr in panel_targets(dashboard):
            if title in module.CLUSTER_TITLES:
                # Only a daemon with [cluster] exports these families; this
                # one is a single node. tests/ops/test_dashboard.py checks
                # that they parse and read only the cluster's families.
                continue
            result = prom.query(expand(expr))
            assert result, f"panel '{title}': no series for {expr}"
            kind = plausible.get(title, "nonnegative")
            for v in values(result):
                assert not math.isnan(v), (title, expr, result)
                if kind == "ratio":
                    assert 0.0 <= v <= 1.0, (title, expr, result)
                elif kind == "bytes":
                    assert 0.0 <= v <= capacity, (title, expr, result)
                elif kind == "nonnegative":
                    assert v >= 0.0, (title, expr, result)
            checked += 1
        assert checked >= 20, f"only {checked} panel queries"
        print(f"{checked} panel queries and {len(recorded)} recording rules "
              f"checked against Prometheus after {workload.runs} demo runs")

        # The alert rules are loaded and none fires on a healthy daemon. One
        # may be pending: its condition holds right now and its `for:` has
        # not run out (TierkvWriteBackBehind when write-back lags the demo's
        # Puts on a loaded machine); then it must carry the value that
        # triggered it, and it is named in the output.
        rules_api = http_json(f"{prom.url}/api/v1/rules")
        alerts = [r for g in rules_api["data"]["groups"] for r in g["rules"]
                  if r["type"] == "alerting"]
        assert len(alerts) == 8
        assert all(r["health"] == "ok" for r in alerts), alerts
        firing = [r["name"] for r in alerts if r["state"] == "firing"]
        assert firing == [], firing
        for r in alerts:
            if r["state"] == "pending":
                triggered = [float(a["value"]) for a in r["alerts"]]
                assert triggered and all(v > 0 for v in triggered), r
                print(f"pending, condition holds (for: not elapsed): "
                      f"{r['name']} {triggered}")
            else:
                assert r["state"] == "inactive", r
    finally:
        workload.stop()
        prom.stop()


def test_promtool_checks_and_unit_tests_the_rules():
    promtool = require_tool("promtool")
    rules = sorted(str(p) for p in
                   (REPO / "deploy/prometheus/rules").glob("*.yml"))
    assert len(rules) == 2
    check = subprocess.run([promtool, "check", "rules", *rules],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    config = subprocess.run(
        [promtool, "check", "config",
         str(REPO / "deploy/prometheus/prometheus.yml")],
        capture_output=True, text=True)
    assert config.returncode == 0, config.stdout + config.stderr
    unit = subprocess.run(
        [promtool, "test", "rules",
         str(REPO / "deploy/prometheus/tests/tierkv-rules-test.yml")],
        capture_output=True, text=True)
    assert unit.returncode == 0, unit.stdout + unit.stderr
    assert "SUCCESS" in unit.stdout
