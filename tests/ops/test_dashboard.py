"""deploy/grafana/tierkv.json: generated from deploy/grafana/tierkv_dashboard.py
(grafanalib), up to date, covering the required topics, and querying only
the metric names README.md's metrics table documents.

Whether every query returns data from a real daemon is
tests/ops/test_prometheus.py's job (a real Prometheus evaluates them all).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "deploy" / "grafana"
GENERATOR = GRAFANA / "tierkv_dashboard.py"
DASHBOARD = GRAFANA / "tierkv.json"

sys.path.insert(0, str(GRAFANA))
import tierkv_dashboard  # noqa: E402  (deploy/grafana is not a package)

# The topics, each by the panel(s) that show it.
REQUIRED_TITLES = {
    "Token hit rate",                  # overall hit rate (stat)
    "Occupancy",                       # occupancy per tier (stat)
    "Hit rate by tier",                # hit rate by tier over time
    "Tokens served by tier",           # tokens served per tier
    "Occupancy and capacity by tier",  # occupancy and capacity per tier
    "Evictions by tier",               # evictions
    "Demotions and promotions",        # demotions
    "Transfer bandwidth",              # transfer bandwidth
    "NVMe IO latency",                 # NVMe IO latency
    "Prefetch and mover batches",      # prefetch
    "Layer wait",                      # layer wait
    "Connections and leases",          # leases/connections
    "Errors",                          # errors
    "Corruptions",                     # corruptions
    "NVMe read-only",
    "Request latency p99 by op",
    # Issue 27: the cluster's directory and peers.
    "Directory up",
    "Directory latency",
    "Live peers",
    "Peer fetch bandwidth",
    "Peer errors by reason",
    "Peer bytes served",
}
ROWS = ["Overview", "Hit rate", "Capacity", "Movement", "Latency", "Health",
        "Cluster"]
METRIC = re.compile(r"\btierkv_[a-z_]+")
HISTOGRAM_SUFFIX = re.compile(r"_(bucket|sum|count)$")


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def all_panels(dashboard: dict):
    for p in dashboard.get("panels", []):
        yield p
        yield from p.get("panels") or []


def data_panels(dashboard: dict):
    return [p for p in all_panels(dashboard) if p["type"] != "row"]


def readme_metrics() -> set:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("| `")]
    names = set()
    for line in table:
        family_cell = line.split("|")[1]
        names.update(re.findall(r"`(tierkv_[a-z_]+)`", family_cell))
    assert len(names) > 30, f"parsed too few families: {sorted(names)}"
    return names


def test_committed_json_is_generated():
    r = subprocess.run([sys.executable, str(GENERATOR), "--check"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, (
        "deploy/grafana/tierkv.json differs from the generator; regenerate "
        "with `build/ops-venv/bin/python deploy/grafana/tierkv_dashboard.py "
        f"--out deploy/grafana/tierkv.json`\n{r.stdout[-4000:]}{r.stderr}")


def test_check_reports_a_stale_file(tmp_path):
    stale = tmp_path / "tierkv.json"
    stale.write_text(DASHBOARD.read_text().replace("Hit rate by tier",
                                                   "Hit rate per tier"))
    r = subprocess.run([sys.executable, str(GENERATOR), "--check", "--out",
                        str(stale)], capture_output=True, text=True)
    assert r.returncode == 1
    assert "+" in r.stdout and "Hit rate by tier" in r.stdout


def test_generation_is_deterministic():
    assert tierkv_dashboard.render() == tierkv_dashboard.render()
    assert tierkv_dashboard.render() == DASHBOARD.read_text(encoding="utf-8")


def test_identity_and_variables(dashboard):
    assert dashboard["uid"] == "tierkv-overview"
    assert dashboard["id"] is None
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    ns = variables["namespace"]
    assert ns["type"] == "query"
    assert ns["query"] == "label_values(tierkv_lookups_total, namespace)"
    assert ns["multi"] and ns["includeAll"] and ns["allValue"] == ".*"
    assert ns["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_rows_and_required_panels(dashboard):
    rows = [p["title"] for p in all_panels(dashboard) if p["type"] == "row"]
    assert rows == ROWS
    titles = [p["title"] for p in data_panels(dashboard)]
    assert len(titles) == len(set(titles)), "panel titles must be unique"
    missing = REQUIRED_TITLES - set(titles)
    assert not missing, f"missing panels: {sorted(missing)}"
    # Overview: stat panels first, the hit rate and occupancy among them.
    first = dashboard["panels"][1:9]
    assert all(p["type"] == "stat" for p in first)
    assert {"Token hit rate", "Occupancy"} <= {p["title"] for p in first}


def test_every_panel_queries_prometheus(dashboard):
    for p in data_panels(dashboard):
        assert p["datasource"] == {"type": "prometheus",
                                   "uid": "${datasource}"}, p["title"]
        assert p["targets"], f"{p['title']}: no targets"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["expr"].strip(), f"{p['title']}: empty expr"
            assert t["legendFormat"].strip(), f"{p['title']}: no legend"


def test_panel_queries_and_plausible(dashboard):
    queries = tierkv_dashboard.panel_queries(dashboard)
    expected = [(p["title"], t["expr"]) for p in data_panels(dashboard)
                for t in p["targets"]]
    assert queries == expected
    titles = {p["title"] for p in data_panels(dashboard)}
    plausible = tierkv_dashboard.PLAUSIBLE
    assert set(plausible) == titles
    assert set(plausible.values()) <= {"ratio", "bytes", "nonnegative"}
    for title in ("Token hit rate", "Hit rate by tier",
                  "Hit rate by namespace", "Occupancy"):
        assert plausible[title] == "ratio", title
    for p in data_panels(dashboard):
        unit = p["fieldConfig"]["defaults"]["unit"]
        if plausible[p["title"]] == "ratio":
            assert unit == "percentunit", p["title"]
        if plausible[p["title"]] == "bytes":
            assert unit == "bytes", p["title"]


def test_metric_names_are_documented(dashboard):
    documented = readme_metrics()
    used = set()
    for title, expr in tierkv_dashboard.panel_queries(dashboard):
        for name in METRIC.findall(expr):
            family = HISTOGRAM_SUFFIX.sub("", name)
            if family not in documented:
                family = name  # a counter whose own name ends in _count/_sum
            assert family in documented, (
                f"{title}: {name} is not in README.md's metrics table")
            used.add(family)
    for v in dashboard["templating"]["list"]:
        for name in METRIC.findall(v["query"] or ""):
            assert name in documented, name
    assert len(used) >= 25, sorted(used)


def test_cluster_panels_are_the_cluster_row_and_read_cluster_families(
        dashboard):
    """The Cluster row's panels (CLUSTER_TITLES, which the single-node
    Prometheus test leaves out) read only what a daemon with [cluster]
    exports: the directory and peer families, and the peer tier's counters
    by the names it reports (fetch_bytes, served_bytes, errors_*)."""
    panels = list(all_panels(dashboard))
    start = next(i for i, p in enumerate(panels)
                 if p["type"] == "row" and p["title"] == "Cluster")
    row = [p["title"] for p in panels[start + 1:] if p["type"] != "row"]
    assert set(row) == tierkv_dashboard.CLUSTER_TITLES
    for title, expr in tierkv_dashboard.panel_queries(dashboard):
        if title not in tierkv_dashboard.CLUSTER_TITLES:
            assert not re.search(r"tierkv_(directory|peer)", expr), title
            continue
        for name in METRIC.findall(expr):
            assert re.match(r"tierkv_(directory_|peers?_|tier_counter_total)",
                            name), (title, name)
        if "tierkv_tier_counter_total" in expr:
            assert 'tier="peer"' in expr, (title, expr)
            # The daemon-wide series or the namespaces' shares, never both.
            assert 'namespace=""' in expr and 'namespace!=""' in expr, expr


def test_queries_use_grafana_intervals_and_the_namespace_filter(dashboard):
    with_namespace = {"tierkv_lookup_tokens_total", "tierkv_lookups_total",
                      "tierkv_get_segments_total", "tierkv_put_segments_total",
                      "tierkv_namespace_bytes", "tierkv_evictions_total",
                      "tierkv_evicted_bytes_total",
                      "tierkv_layer_wait_seconds_bucket",
                      "tierkv_layer_wait_seconds_count"}
    for title, expr in tierkv_dashboard.panel_queries(dashboard):
        for window in re.findall(r"\[([^\]]*)\]", expr):
            assert window in ("$__rate_interval", "$__range"), (title, expr)
        for m in re.finditer(r"\b(tierkv_[a-z_]+)(\{[^}]*\})?", expr):
            if m.group(1) in with_namespace:
                assert 'namespace=~"$namespace"' in (m.group(2) or ""), (
                    title, expr)


def test_layout_fits_the_grid(dashboard):
    cells = {}
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, (
                    f"{p['title']} overlaps {cells[(x, y)]}")
                cells[(x, y)] = p["title"]
    ids = [p["id"] for p in all_panels(dashboard)]
    assert len(ids) == len(set(ids)) and None not in ids


def test_queries_parse_as_promql(tmp_path, dashboard):
    """Every expression, with Grafana's variables substituted as the
    Prometheus test does, parses (promtool checks a rule file's exprs)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: run scripts/install-deps.sh")
    subst = {"$namespace": ".*", "$__rate_interval": "1m",
             "$__range": "5m", "$__interval": "15s"}
    rules = []
    for i, (title, expr) in enumerate(
            tierkv_dashboard.panel_queries(dashboard)):
        for k, v in subst.items():
            expr = expr.replace(k, v)
        rules.append({"record": f"tierkv_dashboard:q{i}", "expr": expr})
    path = tmp_path / "dashboard-queries.yml"
    # JSON is YAML: no YAML library needed to write the rule file.
    path.write_text(json.dumps({"groups": [{"name": "dashboard",
                                            "rules": rules}]}))
    r = subprocess.run([promtool, "check", "rules", str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
