#!/usr/bin/python3
"""Draws `tierkv-bench e2e --plot`: share of prompt tokens served per tier.

Usage: plot_e2e.py SESSIONS.json OUT.png, where SESSIONS.json is the bench's
"sessions" array (one object per session count and turn). Uses Debian's
python3-matplotlib (headless Agg backend).
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
        rows = json.load(f)
    counts = sorted({r["sessions"] for r in rows})
    fig, axes = plt.subplots(1, len(counts), figsize=(3.2 * len(counts), 3.2),
                             sharey=True, squeeze=False)
    for ax, s in zip(axes[0], counts):
        mine = sorted((r for r in rows if r["sessions"] == s),
                      key=lambda r: r["turn"])
        turns = [r["turn"] + 1 for r in mine]
        share = {k: [100.0 * r[k] / max(r["prompt_tokens"], 1) for r in mine]
                 for k in ("tokens_from_hbm", "tokens_from_host",
                           "tokens_from_nvme", "tokens_prefilled")}
        ax.stackplot(turns, share["tokens_from_hbm"],
                     share["tokens_from_host"], share["tokens_from_nvme"],
                     share["tokens_prefilled"],
                     labels=["hbm", "host DRAM", "NVMe", "prefilled"],
                     colors=["#7b3294", "#2b83ba", "#fdae61", "#d7191c"])
        ax.set_title(f"{s} session{'s' if s > 1 else ''}")
        ax.set_xlabel("turn")
        ax.set_xticks(turns)
        ax.set_ylim(0, 100)
    axes[0][0].set_ylabel("% of prompt tokens")
    axes[0][-1].legend(loc="lower right", fontsize=7)
    fig.suptitle("tierkv e2e: where prompt tokens came from", fontsize=9)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
