#!/usr/bin/python3
"""Draws `tierkv replay --plot`: token hit rate vs host-tier capacity.

Usage: plot_replay.py REPORT.json OUT.png, where REPORT.json is the report
`tierkv replay --json` writes. One solid line per daemon eviction policy, the
offline LRU (dashed) and Belady (dotted) bounds for the same capacities. Uses
Debian's python3-matplotlib (headless Agg backend).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        report = json.load(f)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    offline = sorted(report["offline"], key=lambda r: r["host_blocks"])
    blocks = [r["host_blocks"] for r in offline]
    for policy in sorted({r["policy"] for r in report["runs"]}):
        runs = sorted((r for r in report["runs"] if r["policy"] == policy),
                      key=lambda r: r["host_blocks"])
        ax.plot([r["host_blocks"] for r in runs],
                [100 * r["token_hit_rate"] for r in runs], "-o", linewidth=3,
                markersize=8, alpha=0.7, label=f"tierkvd {policy}")
    # Drawn over the daemon's lines, which they may match exactly.
    ax.plot(blocks, [100 * r["lru"] for r in offline], "--x", color="black",
            label="offline LRU")
    ax.plot(blocks, [100 * r["belady"] for r in offline], ":x", color="gray",
            label="offline Belady (MIN)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(blocks)
    ax.set_xticklabels([str(b) for b in blocks])
    ax.set_xlabel(f"host tier capacity ({report['block_tokens']}-token blocks)"
                  + (f" + {report['nvme_blocks']} NVMe"
                     if report["nvme_blocks"] else ""))
    ax.set_ylabel("token hit rate (%)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    name = report["trace"].rsplit("/", 1)[-1]
    ax.set_title(f"{name}: {report['requests']} requests, "
                 f"{report['shards']} shard{'s' if report['shards'] > 1 else ''}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
