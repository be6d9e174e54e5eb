#!/usr/bin/env python3
"""The tierkv Grafana dashboard, as code (grafanalib).

deploy/grafana/tierkv.json is generated from this file; never edit the JSON by
hand. In the ops virtualenv (scripts/ops-venv.sh):

    build/ops-venv/bin/python deploy/grafana/tierkv_dashboard.py > deploy/grafana/tierkv.json
    build/ops-venv/bin/python deploy/grafana/tierkv_dashboard.py --out deploy/grafana/tierkv.json
    build/ops-venv/bin/python deploy/grafana/tierkv_dashboard.py --check

--check exits 1 with a unified diff when the committed JSON differs from what
this code generates (tests/ops/test_dashboard.py runs it).

Every query uses only the metric names of README.md's "## Metrics" table and
raw series (no recording rules need to be loaded). Every query returns a
result whenever the daemon exports the family, even if the event never
happened (a rate of 0), and never NaN: ratios divide by clamp_min(..., 1e-9)
(0 while idle), and quantiles of idle series fall back to 0. The operations
test (tests/ops/test_prometheus.py) evaluates every query against a real
Prometheus scraping a real tierkvd; it walks the JSON with panel_queries()
and checks values by PLAUSIBLE.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import Dict, List, Tuple

from grafanalib._gen import DashboardEncoder
from grafanalib.core import (REFRESH_ON_TIME_RANGE_CHANGE, Dashboard, GridPos,
                             RowPanel, Stat, Target, Template, Templating, Time,
                             TimeSeries)

HERE = Path(__file__).resolve().parent
DEFAULT_JSON = HERE / "tierkv.json"

UID = "tierkv-overview"
TITLE = "tierkv"

# Panels and targets take the data source from the `datasource` variable, so
# the dashboard imports into any Grafana with a Prometheus data source.
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

NS = 'namespace=~"$namespace"'
RI = "[$__rate_interval]"

# Grafana units.
BYTES, BPS, PERCENT, SECONDS, OPS, REQPS, SHORT = (
    "bytes", "Bps", "percentunit", "s", "ops", "reqps", "short")

# What the operations test checks each panel's values against: "ratio" in
# [0, 1], "bytes" at most the largest tier capacity, "nonnegative" >= 0.
PLAUSIBLE: Dict[str, str] = {}


# --- query helpers -----------------------------------------------------------

def rate(family: str, selector: str = "") -> str:
    sel = "{" + selector + "}" if selector else ""
    return f"rate({family}{sel}{RI})"


def quantile(q: float, family: str, by: str, selector: str = "") -> str:
    """The q-quantile of a histogram per `by` label(s); a series with no
    observations in the window gives 0 instead of NaN (so the panel still has
    a value, and an idle op reads as "nothing waited")."""
    sel = "{" + selector + "}" if selector else ""
    return (f"histogram_quantile({q}, sum by (le, {by}) "
            f"(rate({family}_bucket{sel}{RI}))) >= 0"
            f" or sum by ({by}) (rate({family}_count{sel}{RI})) * 0")


def ratio(numerator: str, denominator: str, match: str = "") -> str:
    """numerator / denominator, 0 (not NaN) while the denominator is 0."""
    return f"{numerator} / {match}clamp_min({denominator}, 1e-9)"


def hit_tokens(by: str = "") -> str:
    """Tokens per second served from any tier (not "miss"), summed by `by`."""
    agg = f"sum by ({by}) " if by else "sum"
    sel = NS + ',tier!="miss"'
    return f"{agg}({rate('tierkv_lookup_tokens_total', sel)})"


# --- panel helpers -----------------------------------------------------------

def target(expr: str, legend: str, ref: str) -> Target:
    return Target(expr=expr, legendFormat=legend, refId=ref,
                  datasource=DATASOURCE, intervalFactor=1)


def targets(*pairs: Tuple[str, str]) -> List[Target]:
    return [target(expr, legend, chr(ord("A") + i))
            for i, (expr, legend) in enumerate(pairs)]


def stat(title: str, kind: str, description: str, unit: str,
         queries: List[Tuple[str, str]], steps=None, mappings=None,
         text_mode: str = "auto", decimals=None) -> Stat:
    PLAUSIBLE[title] = kind
    return Stat(
        title=title, description=description, dataSource=DATASOURCE,
        targets=targets(*queries), format=unit, decimals=decimals,
        reduceCalc="lastNotNull", graphMode="area", textMode=text_mode,
        colorMode="value", noValue="no data", color={"mode": "thresholds"},
        thresholds=steps or [{"color": "blue", "value": None}],
        mappings=mappings or [])


def series(title: str, kind: str, description: str, unit: str,
           queries: List[Tuple[str, str]], stacked: bool = False,
           max_one: bool = False, overrides=None,
           interpolation: str = "linear") -> TimeSeries:
    PLAUSIBLE[title] = kind
    return TimeSeries(
        title=title, description=description, dataSource=DATASOURCE,
        targets=targets(*queries), unit=unit, maxDataPoints=None,
        valueMin=0, valueMax=1 if max_one else None,
        stacking={"mode": "normal", "group": "A"} if stacked else {},
        fillOpacity=30 if stacked else 10,
        lineInterpolation=interpolation, showPoints="never",
        legendDisplayMode="table", legendPlacement="bottom",
        legendCalcs=["lastNotNull", "max"], tooltipMode="multi",
        tooltipSort="desc", overrides=overrides or [])


CAPACITY_DASHED = [{
    "matcher": {"id": "byRegexp", "options": ".*capacity.*"},
    "properties": [
        {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
        {"id": "custom.fillOpacity", "value": 0},
    ],
}]

RED_ON_ANY = [{"color": "green", "value": None}, {"color": "red", "value": 1}]


# --- the panels, by row ------------------------------------------------------

def overview() -> List:
    return [
        (4, stat(
            "Token hit rate", "ratio",
            "Share of Match-ed tokens served from any tier (hbm, host or "
            "nvme) over the selected namespaces; 0 while there are no "
            "lookups.", PERCENT,
            [(ratio(hit_tokens(),
                    f"sum({rate('tierkv_lookup_tokens_total', NS)})"),
              "hit rate")], decimals=1)),
        (6, stat(
            "Occupancy", "ratio",
            "Used bytes / capacity per tier, the whole daemon. Host DRAM "
            "and NVMe are caches: near 100% is normal (they evict).",
            PERCENT,
            [(ratio('sum by (tier) (tierkv_tier_bytes{state="used"})',
                    'sum by (tier) (tierkv_tier_bytes{state="capacity"})'),
              "{{tier}}")],
            text_mode="value_and_name", decimals=1)),
        (3, stat(
            "Requests", "nonnegative",
            "Requests per second, every op.", REQPS,
            [(f"sum({rate('tierkv_request_seconds_count')})", "requests")])),
        (2, stat(
            "Connections", "nonnegative", "Open client connections.", SHORT,
            [("sum(tierkv_connections)", "connections")])),
        (2, stat(
            "Leases", "nonnegative", "Read leases held by clients.", SHORT,
            [("sum(tierkv_active_leases)", "leases")])),
        (3, stat(
            "Errors in range", "nonnegative",
            "Error replies, malformed frames and refused OpenNamespace calls "
            "over the dashboard's time range.", SHORT,
            [("sum(increase(tierkv_request_errors_total[$__range]))"
              " + sum(increase(tierkv_protocol_errors_total[$__range]))"
              " + sum(increase(tierkv_auth_failures_total[$__range]))",
              "errors")], steps=RED_ON_ANY, decimals=0)),
        (2, stat(
            "Corruptions in range", "nonnegative",
            "Segments that failed their checksum twice (dropped, served as "
            "misses) over the time range.", SHORT,
            [("sum(increase(tierkv_corruptions_total[$__range]))",
              "corruptions")], steps=RED_ON_ANY, decimals=0)),
        (2, stat(
            "NVMe writable", "nonnegative",
            "Whether the NVMe catalog accepts writes (read-only after a full "
            "disk or a failing device).", SHORT,
            [("max(tierkv_nvme_read_only)", "read-only")],
            steps=RED_ON_ANY,
            mappings=[{"type": "value", "options": {
                "0": {"text": "writable", "color": "green", "index": 0},
                "1": {"text": "READ-ONLY", "color": "red", "index": 1}}}])),
    ]


def hit_rate() -> List:
    all_tokens = f"sum({rate('tierkv_lookup_tokens_total', NS)})"
    return [
        (12, series(
            "Hit rate by tier", "ratio",
            "Share of Match-ed tokens whose leading pages the tier served "
            "(by the slowest tier holding them); stacked, the total is the "
            "token hit rate.", PERCENT,
            [(ratio(hit_tokens("tier"), all_tokens,
                    match="ignoring(tier) group_left "), "{{tier}}")],
            stacked=True, max_one=True)),
        (12, series(
            "Hit rate by namespace", "ratio",
            "Token hit rate (any tier) per namespace.", PERCENT,
            [(ratio(hit_tokens("namespace"),
                    "sum by (namespace) "
                    f"({rate('tierkv_lookup_tokens_total', NS)})"),
              "{{namespace}}")], max_one=True)),
        (12, series(
            "Tokens served by tier", "nonnegative",
            "Match-ed tokens per second by the tier that served them "
            "(miss: in no tier).", SHORT,
            [("sum by (tier) "
              f"({rate('tierkv_lookup_tokens_total', NS)})", "{{tier}}")],
            stacked=True)),
        (12, series(
            "Get and Put segments", "nonnegative",
            "Segments asked for by Get and offered by Put, per second, by "
            "result.", OPS,
            [("sum by (result) "
              f"({rate('tierkv_get_segments_total', NS)})", "get {{result}}"),
             ("sum by (result) "
              f"({rate('tierkv_put_segments_total', NS)})",
              "put {{result}}")])),
    ]


def capacity() -> List:
    return [
        (12, series(
            "Occupancy and capacity by tier", "bytes",
            "Bytes used per tier (solid) against its capacity (dashed).",
            BYTES,
            [('sum by (tier) (tierkv_tier_bytes{state="used"})',
              "{{tier}} used"),
             ('sum by (tier) (tierkv_tier_bytes{state="capacity"})',
              "{{tier}} capacity")],
            overrides=CAPACITY_DASHED)),
        (12, series(
            "Namespace occupancy", "bytes",
            "Bytes each namespace holds per tier.", BYTES,
            [("sum by (namespace, tier) "
              f'(tierkv_namespace_bytes{{{NS},state="used"}})',
              "{{namespace}} {{tier}}")])),
        (12, series(
            "Host dirty and reserved bytes", "bytes",
            "DRAM not yet written back to NVMe (dirty) and held by Puts in "
            "flight (reserved).", BYTES,
            [('sum by (tier, state) '
              '(tierkv_tier_bytes{state=~"dirty|reserved"})',
              "{{tier}} {{state}}")])),
        (12, series(
            "Segments by tier", "nonnegative",
            "Committed segments per tier.", SHORT,
            [("sum by (tier) (tierkv_tier_segments)", "{{tier}}")])),
    ]


def movement() -> List:
    return [
        (12, series(
            "Evictions by tier", "nonnegative",
            "Segments evicted for space per second, by tier and policy "
            "(hbm evictions carry no namespace: shown only with All).", OPS,
            [("sum by (tier, policy) "
              f"({rate('tierkv_evictions_total', NS)})",
              "{{tier}} ({{policy}})")])),
        (12, series(
            "Evicted bytes by tier", "nonnegative",
            "Bytes evicted per second (host, hbm).", BPS,
            [("sum by (tier) "
              f"({rate('tierkv_evicted_bytes_total', NS)})", "{{tier}}")])),
        (12, series(
            "Demotions and promotions", "nonnegative",
            "Segments the mover handled per second: demotion = write-back "
            "host→nvme (failed: dropped write-backs), promotion = nvme→host.",
            OPS,
            [("sum by (queue, result) "
              f"({rate('tierkv_mover_segments_total')})",
              "{{queue}} {{result}}")])),
        (12, series(
            "Transfer bandwidth", "nonnegative",
            "Bytes moved per second by route: →pool (Load), pool→host "
            "(Store), nvme→host (promotion), host→nvme (write-back).", BPS,
            [("sum by (src, dst) "
              f"({rate('tierkv_transfer_bytes_total')})",
              "{{src}}→{{dst}}")])),
        (12, series(
            "Prefetch and mover batches", "nonnegative",
            "Mover batches per second by kind (prefetch_dropped: prefetches "
            "dropped), and transfer calls accepted by op.", OPS,
            [("sum by (kind) "
              f"({rate('tierkv_mover_batches_total')})", "batch {{kind}}"),
             ("sum by (op) "
              f"({rate('tierkv_transfers_total')})", "call {{op}}")])),
        (12, series(
            "Queues", "nonnegative",
            "Queued mover work and transfer worker queue depth.", SHORT,
            [("sum by (queue) (tierkv_mover_queue_depth)", "mover {{queue}}"),
             ("sum(tierkv_worker_queue_depth)", "transfer workers")])),
    ]


def latency() -> List:
    rq = "tierkv_request_seconds"
    lw = "tierkv_layer_wait_seconds"
    io = "tierkv_nvme_io_latency_seconds"
    tr = "tierkv_transfer_seconds"
    return [
        (12, series(
            "Request latency p99 by op", "nonnegative",
            "99th percentile from arrival to reply (Load/Store reply once "
            "queued); 0 for ops with no requests.", SECONDS,
            [(quantile(0.99, rq, "op"), "{{op}}")])),
        (12, series(
            "Request latency p50 by op", "nonnegative",
            "Median from arrival to reply; 0 for ops with no requests.",
            SECONDS,
            [(quantile(0.5, rq, "op"), "{{op}}")])),
        (8, series(
            "Layer wait", "nonnegative",
            "Time engines blocked in WaitLayer/Wait per call (0 when the "
            "layer was there), by namespace.", SECONDS,
            [(quantile(0.5, lw, "namespace", NS), "p50 {{namespace}}"),
             (quantile(0.99, lw, "namespace", NS), "p99 {{namespace}}")])),
        (8, series(
            "NVMe IO latency", "nonnegative",
            "Device IO latency by op.", SECONDS,
            [(quantile(0.5, io, "op"), "p50 {{op}}"),
             (quantile(0.99, io, "op"), "p99 {{op}}")])),
        (8, series(
            "Load and Store latency", "nonnegative",
            "A Load/Store from acceptance until its last layer is published.",
            SECONDS,
            [(quantile(0.5, tr, "op"), "p50 {{op}}"),
             (quantile(0.99, tr, "op"), "p99 {{op}}")])),
        (12, series(
            "NVMe IO throughput", "nonnegative",
            "Device IO bytes per second by op.", BPS,
            [("sum by (op) "
              f"({rate('tierkv_nvme_io_bytes_total')})", "{{op}}")])),
        (12, series(
            "NVMe writes", "nonnegative",
            "Segments written to NVMe per second by result, and device "
            "fdatasyncs.", OPS,
            [("sum by (result) "
              f"({rate('tierkv_nvme_writes_total')})", "{{result}}"),
             (f"sum({rate('tierkv_nvme_device_syncs_total')})", "fdatasync")])),
    ]


def health() -> List:
    return [
        (8, series(
            "Connections and leases", "nonnegative",
            "Open client connections, read leases held and engine pools "
            "registered.", SHORT,
            [("sum(tierkv_connections)", "connections"),
             ("sum(tierkv_active_leases)", "leases"),
             ("sum(tierkv_registered_pools)", "pools")])),
        (8, series(
            "Errors", "nonnegative",
            "Per second: error replies by op, malformed frames, refused "
            "OpenNamespace, NVMe write errors and tier read errors.", OPS,
            [("sum by (op) "
              f"({rate('tierkv_request_errors_total')})", "reply {{op}}"),
             (f"sum({rate('tierkv_protocol_errors_total')})", "protocol"),
             (f"sum({rate('tierkv_auth_failures_total')})", "auth"),
             ("sum"
              f"""({rate('tierkv_nvme_writes_total', 'result="error"')})""",
              "nvme write error"),
             ("sum by (tier) "
              f"""({rate('tierkv_tier_reads_total', 'result="error"')})""",
              "{{tier}} read error")])),
        (8, series(
            "Corruptions", "nonnegative",
            "Per second: segments that failed their checksum twice (dropped), "
            "and checksum failures a re-read cured.", OPS,
            [("sum by (tier) "
              f"({rate('tierkv_corruptions_total')})", "{{tier}} corrupt"),
             (f"sum({rate('tierkv_nvme_checksum_reread_ok_total')})",
              "re-read cured")])),
        (12, series(
            "NVMe read-only", "nonnegative",
            "1 while the NVMe catalog refuses writes (full disk, failing "
            "device); and how often it entered that state.", SHORT,
            [("max(tierkv_nvme_read_only)", "read-only"),
             ("sum(increase(tierkv_nvme_read_only_entries_total"
              f"{RI}))", "entries")],
            interpolation="stepAfter")),
        (12, series(
            "Backpressure", "nonnegative",
            "Per second: reserves that waited for write-back, segments still "
            "Busy after waiting, transfer calls answered Busy.", OPS,
            [(f"sum({rate('tierkv_backpressure_waits_total')})", "waits"),
             (f"sum({rate('tierkv_backpressure_busy_total')})", "busy"),
             (f"sum({rate('tierkv_worker_rejections_total')})",
              "worker rejections")])),
    ]


def peer_tier(name_selector: str, by: str = "") -> str:
    """The peer tier's counters (tierkv_tier_counter_total{tier="peer"}) per
    second, summed by `by`: its daemon-wide series where the tier reports
    them (no `namespace` label), else the sum of its namespaces' shares
    (never both, which would count each byte twice)."""
    agg = f"sum by ({by}) " if by else "sum"
    family = "tierkv_tier_counter_total"
    whole = rate(family, f'tier="peer",namespace="",{name_selector}')
    shares = rate(family, f'tier="peer",namespace!="",{name_selector}')
    return f"{agg}({whole}) or {agg}({shares})"


def cluster() -> List:
    """Multi-node daemons ([cluster]): the directory, the peers and the peer
    tier. A single-node daemon exports none of these families, so its
    panels read "no data" (CLUSTER_TITLES)."""
    return [
        (4, stat(
            "Directory up", "nonnegative",
            "Whether every daemon's last round trip to the cluster directory "
            "(Redis) succeeded. While it is down, lookups are local-only and "
            "publishes queue, then drop.", SHORT,
            [("min(tierkv_directory_up)", "up")],
            steps=[{"color": "red", "value": None},
                   {"color": "green", "value": 1}],
            mappings=[{"type": "value", "options": {
                "0": {"text": "DOWN", "color": "red", "index": 0},
                "1": {"text": "up", "color": "green", "index": 1}}}])),
        (4, stat(
            "Live peers", "nonnegative",
            "Live nodes other than itself in each daemon's view of the "
            "directory; the lowest view.", SHORT,
            [("min(tierkv_peers_live)", "live peers")])),
        (8, series(
            "Directory latency", "nonnegative",
            "Each daemon's latest directory lookup (its budget is "
            "lookup_budget_us, 2 ms by default).", SECONDS,
            [("max by (instance) (tierkv_directory_last_lookup_seconds)",
              "{{instance}}")])),
        (8, series(
            "Peers and connections", "nonnegative",
            "Per daemon: live peers in its directory view and authenticated "
            "peer connections.", SHORT,
            [("max by (instance) (tierkv_peers_live)",
              "{{instance}} live peers"),
             ("max by (instance) (tierkv_peer_connections)",
              "{{instance}} connections")])),
        (12, series(
            "Peer fetch bandwidth", "nonnegative",
            "Bytes per second fetched from peers by the peer tier, and the "
            "peer transport's traffic by direction (requests, reply heads and "
            "data).", BPS,
            [(peer_tier('name="fetch_bytes"'), "fetched"),
             ("sum by (direction) "
              f"({rate('tierkv_peer_bytes_total')})", "transport {{direction}}")
             ])),
        (12, series(
            "Peer bytes served", "nonnegative",
            "Bytes per second this cluster's daemons served to peers (reply "
            "data sent), and the peer tier's own count of them.", BPS,
            [(f"sum({rate('tierkv_peer_served_bytes_total')})", "sent"),
             (peer_tier('name="served_bytes"'), "peer tier served")])),
        (12, series(
            "Peer errors by reason", "nonnegative",
            "Per second: peer transport errors (timeout, reset, auth, "
            "malformed, abandoned) and the peer tier's fetch errors (timeout, "
            "unavailable, stale directory entry, checksum, refused).", OPS,
            [("sum by (reason) "
              f"({rate('tierkv_peer_errors_total')})", "transport {{reason}}"),
             (peer_tier('name=~"errors_.+"', by="name"), "fetch {{name}}")])),
        (12, series(
            "Directory operations", "nonnegative",
            "Per second: directory operations by op (publish, unpublish and "
            "forget in pages), failures by op, and pages dropped by a full "
            "publish queue; pages still queued.", OPS,
            [("sum by (op) "
              f"({rate('tierkv_directory_ops_total')})", "{{op}}"),
             ("sum by (op) "
              f"({rate('tierkv_directory_errors_total')})", "{{op}} errors"),
             (f"sum({rate('tierkv_directory_dropped_pages_total')})",
              "dropped pages"),
             ("sum(tierkv_directory_queued_pages)", "queued pages")])),
    ]


ROWS = [
    ("Overview", overview, 5),
    ("Hit rate", hit_rate, 8),
    ("Capacity", capacity, 8),
    ("Movement", movement, 8),
    ("Latency", latency, 8),
    ("Health", health, 8),
    ("Cluster", cluster, 8),
]

# The Cluster row's panels: they have data only from daemons with [cluster]
# (tests/ops/test_prometheus.py scrapes a single node and leaves them out).
CLUSTER_TITLES = frozenset(panel.title for _, panel in cluster())


def layout() -> List:
    """Rows (uncollapsed) and their panels, left to right, wrapping at 24
    columns; panels at the dashboard's top level, after their row."""
    panels: List = []
    y = 0
    for title, make, height in ROWS:
        panels.append(RowPanel(title=title, gridPos=GridPos(h=1, w=24, x=0,
                                                            y=y)))
        y += 1
        x = 0
        for width, panel in make():
            if x + width > 24:
                x, y = 0, y + height
            panel.gridPos = GridPos(h=height, w=width, x=x, y=y)
            panels.append(panel)
            x += width
        y += height
    return panels


def templating() -> Templating:
    datasource = Template(
        name="datasource", label="Data source", type="datasource",
        query="prometheus", refresh=1, sort=0)
    namespace = Template(
        name="namespace", label="Namespace", type="query",
        query="label_values(tierkv_lookups_total, namespace)",
        dataSource=DATASOURCE, includeAll=True, multi=True, allValue=".*",
        refresh=REFRESH_ON_TIME_RANGE_CHANGE)
    namespace._current = {"selected": True, "text": ["All"],
                          "value": ["$__all"]}
    return Templating(list=[datasource, namespace])


def dashboard() -> Dashboard:
    PLAUSIBLE.clear()
    return Dashboard(
        title=TITLE, uid=UID,
        description="tierkvd: KV-cache hit rate, occupancy, movement "
                    "between tiers, latency and health (generated by "
                    "deploy/grafana/tierkv_dashboard.py).",
        tags=["tierkv"], timezone="browser", refresh="30s",
        schemaVersion=39, graphTooltip=1, editable=True,
        time=Time("now-1h", "now"), templating=templating(),
        panels=layout()).auto_panel_ids()


def render() -> str:
    """The dashboard JSON, deterministic (sorted keys, fixed uid, no
    timestamps), with a trailing newline."""
    return json.dumps(dashboard().to_json_data(), cls=DashboardEncoder,
                      indent=2, sort_keys=True, ensure_ascii=False) + "\n"


# Filled once at import, so importers see every panel's kind.
dashboard()


def panel_queries(dashboard_json: dict) -> List[Tuple[str, str]]:
    """(panel title, expr) for every target of every panel, rows' panels
    included."""
    out: List[Tuple[str, str]] = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets") or []:
                out.append((p.get("title", ""), t.get("expr", "")))
            walk(p.get("panels") or [])

    walk(dashboard_json.get("panels") or [])
    for row in dashboard_json.get("rows") or []:
        walk(row.get("panels") or [])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path,
                    help="write the JSON here (default: stdout)")
    ap.add_argument("--check", action="store_true",
                    help=f"compare with --out (default {DEFAULT_JSON.name}) "
                         "and exit 1 with a diff if it differs")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        path = args.out or DEFAULT_JSON
        try:
            committed = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            committed = ""
        if committed == text:
            return 0
        sys.stdout.writelines(difflib.unified_diff(
            committed.splitlines(keepends=True), text.splitlines(keepends=True),
            f"{path} (committed)", f"{path} (generated)"))
        print(f"\n{path} is stale: regenerate with "
              f"{Path(__file__).name} --out {path}", file=sys.stderr)
        return 1
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
