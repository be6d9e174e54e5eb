#!/usr/bin/env python3
"""Python client vs C++ client, measured in the same run.

    /usr/bin/python3 bench/python_client_bench.py [--bin-dir build/bin]
        [--iterations 5] [--pages 128] [--layers 78] [--json FILE]

Runs the C++ client's own benchmarks first (`tierkv-bench host` for Get,
`tierkv-bench load --no-nvme` for per-layer Load), then the same work
through the Python package against a daemon configured the same way:
  get   72 KiB segments (GLM-5 bf16 latent rows x 64 tokens), a 256 MiB
        working set, Get in 8 MiB batches straight into a page-aligned
        numpy buffer (zero-copy: the library copies arena -> buffer once);
  load  --pages pages x --layers layers of GLM-5 geometry (kv 1152 B/token
        on every layer, index_k 132 B/token on the IndexShare full layers)
        loaded from DRAM into registered memfd pools, timed from the Load
        call to WaitLayer(last layer), exactly as the C++ benchmark does.
Reports GB/s for both and the ratio Python / C++ (the acceptance bar is
0.8). The two clients run in alternating rounds (--rounds, each a median of
--iterations) and the ratio is of the medians over rounds: on a shared VM a
noisy minute otherwise lands on one side only (single runs here ranged
0.53-1.01 for Get). Needs PYTHONPATH=build/python (or an installed package).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import tierkv
from tierkv.testing import Tierkvd

SEG_TOKENS = 64
KV_BPT = 1152  # bf16 latent: 512 + 64 values x 2 bytes
IDX_BPT = 132  # fp8 index key + fp32 scale
GET_WORKING_SET = 256 << 20
GET_BATCH = 8 << 20


def aligned(nbytes: int) -> np.ndarray:
    """A page-aligned, pre-faulted buffer (as the C++ bench uses)."""
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    a = np.frombuffer(m, dtype=np.uint8)
    a[:] = 1
    return a


def run_cpp(bin_dir: Path, args: list[str]) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        out = subprocess.run([str(bin_dir / "tierkv-bench"), *args, "--json",
                              f.name], capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"tierkv-bench {args[0]} failed:\n{out.stdout}"
                     f"{out.stderr}")
        print(out.stdout)
        return json.loads(Path(f.name).read_text())


def python_get(iterations: int, workdir: Path) -> dict:
    seg = SEG_TOKENS * KV_BPT
    count = GET_WORKING_SET // seg
    per_batch = max(1, GET_BATCH // seg)
    config = f"""
[[namespace]]
name = "bench"
token = "bench-token"
host_bytes = {GET_WORKING_SET * 4}
shards = 8
"""
    with Tierkvd(workdir / "get", config, ["--io-threads", "2"]) as d:
        c = tierkv.connect(d.socket, namespace="bench", token="bench-token")
        c.register_layout(tierkv.Layout.uniform(SEG_TOKENS, 1,
                                                [("kv", KV_BPT)]))
        src = aligned(count * seg).reshape(count, seg)
        src[:] = (np.arange(count * seg, dtype=np.uint64) * 131 %
                  256).astype(np.uint8).reshape(count, seg)
        dst = aligned(count * seg).reshape(count, seg)
        copy_dst = aligned(count * seg).reshape(count, seg)
        pages = np.stack([np.arange(1, count + 1, dtype=np.uint64),
                          np.full(count, 0xbe9c4, dtype=np.uint64)], axis=1)
        for b in range(0, count, per_batch):
            c.put(pages[b:b + per_batch], 0, 0, src[b:b + per_batch])
        get_s, copy_s = [], []
        for it in range(iterations + 1):  # iteration 0 warms up
            g = m = 0.0
            for n, b in enumerate(range(0, count, per_batch)):
                e = min(count, b + per_batch)

                def copy():
                    t = time.perf_counter()
                    np.copyto(copy_dst[b:e], src[b:e])
                    return time.perf_counter() - t
                if n % 2:
                    m += copy()
                t0 = time.perf_counter()
                c.get(pages[b:e], 0, 0, dst[b:e])
                g += time.perf_counter() - t0
                if n % 2 == 0:
                    m += copy()
            if not np.array_equal(dst, src):
                sys.exit("python get returned different bytes")
            if it:
                get_s.append(g)
                copy_s.append(m)
        c.close()
    gb = count * seg / 1e9
    return {"get_gbps": gb / statistics.median(get_s),
            "memcpy_gbps": gb / statistics.median(copy_s),
            "segment_bytes": seg, "segments_per_batch": per_batch}


def glm5_layout(layers: int, index_layers: int) -> tierkv.Layout:
    # As bench/load_bench.cc's Glm5Layout: spread the full layers evenly.
    out = []
    for i in range(layers):
        parts = [("kv", KV_BPT)]
        if index_layers and (i * index_layers) % layers < index_layers:
            parts.append(("index_k", IDX_BPT))
        out.append(parts)
    return tierkv.Layout.of(SEG_TOKENS, out)


def python_load(iterations: int, pages_n: int, layers: int,
                index_layers: int, workdir: Path) -> dict:
    layout = glm5_layout(layers, index_layers)
    page_bytes = sum(layout.segment_bytes(l, p)
                     for l in range(layers) for p in range(len(layout.layers[l])))
    data = page_bytes * pages_n
    config = f"""
[[namespace]]
name = "bench"
token = "bench-token"
host_bytes = {2 * data + (256 << 20)}
shards = 8
"""
    with Tierkvd(workdir / "load", config, ["--io-threads", "2"]) as d:
        c = tierkv.connect(d.socket, namespace="bench", token="bench-token")
        c.register_layout(layout)
        pages = np.stack([np.arange(1, pages_n + 1, dtype=np.uint64),
                          np.full(pages_n, 0x10ad, dtype=np.uint64)], axis=1)
        rng = np.random.default_rng(0)
        pools = {}
        for l in range(layers):
            for p in range(len(layout.layers[l])):
                seg = layout.segment_bytes(l, p)
                rows = rng.integers(0, 256, (pages_n, seg), dtype=np.uint8)
                c.put(pages, l, p, rows)
                pool = tierkv.Pool(seg, pages_n)
                c.register_pool(pool, layer=l, part=p)
                pools[l, p] = (pool, rows)
        slots = np.arange(pages_n, dtype=np.uint32)
        load_s = []
        for it in range(iterations + 1):
            t0 = time.perf_counter()
            t = c.load(pages, slots)
            t.wait_layer(layers - 1)
            elapsed = time.perf_counter() - t0
            t.wait()
            t.close()
            if it == 0:
                for pool, rows in pools.values():
                    if not np.array_equal(pool.array, rows):
                        sys.exit("python load returned different bytes")
            else:
                load_s.append(elapsed)
        c.close()
    return {"load_gbps": data / 1e9 / statistics.median(load_s),
            "bytes_per_load": data}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", default=os.environ.get("TIERKV_BIN_DIR",
                                                        "build/bin"))
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pages", type=int, default=128)
    ap.add_argument("--layers", type=int, default=78)
    ap.add_argument("--index-layers", type=int, default=21)
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    bin_dir = Path(a.bin_dir).resolve()
    os.environ["TIERKV_BIN_DIR"] = str(bin_dir)

    cpp_get, cpp_load, py_gets, py_loads = [], [], [], []
    cpp_host = cpp_load_json = None
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            cpp_host = run_cpp(bin_dir, ["host", "--working-set", "256MiB",
                                         "--batch", "8MiB", "--iterations",
                                         str(a.iterations)])
            cpp_get.append(cpp_host["sizes"]["72KiB"]["get_gbps"])
            py_gets.append(python_get(a.iterations, Path(tmp) / f"g{r}"))
            cpp_load_json = run_cpp(bin_dir, [
                "load", "--no-nvme", "--pages", str(a.pages), "--layers",
                str(a.layers), "--index-layers", str(a.index_layers),
                "--iterations", str(a.iterations)])
            cpp_load.append(cpp_load_json["host"]["load_gbps"])
            py_loads.append(python_load(a.iterations, a.pages, a.layers,
                                        a.index_layers, Path(tmp) / f"l{r}"))
    med = statistics.median
    py_get = {"get_gbps": med(p["get_gbps"] for p in py_gets),
              "memcpy_gbps": med(p["memcpy_gbps"] for p in py_gets)}
    py_load = {"load_gbps": med(p["load_gbps"] for p in py_loads),
               "bytes_per_load": py_loads[0]["bytes_per_load"]}
    cpp_get_gbps = med(cpp_get)
    cpp_load_gbps = med(cpp_load)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "iterations": a.iterations,
        "rounds": a.rounds,
        "get_72KiB": {"python_gbps": py_get["get_gbps"],
                      "python_rounds_gbps": [p["get_gbps"] for p in py_gets],
                      "cpp_rounds_gbps": cpp_get,
                      "cpp_gbps": cpp_get_gbps,
                      "python_over_cpp": py_get["get_gbps"] / cpp_get_gbps,
                      "python_memcpy_gbps": py_get["memcpy_gbps"],
                      "cpp_memcpy_gbps":
                          cpp_host["sizes"]["72KiB"]["memcpy_gbps"]},
        "load": {"pages": a.pages, "layers": a.layers,
                 "bytes_per_load": py_load["bytes_per_load"],
                 "python_gbps": py_load["load_gbps"],
                 "python_rounds_gbps": [p["load_gbps"] for p in py_loads],
                 "cpp_rounds_gbps": cpp_load,
                 "cpp_gbps": cpp_load_gbps,
                 "python_over_cpp": py_load["load_gbps"] / cpp_load_gbps},
    }
    print(f"python client vs C++ client, same run, medians of {a.rounds} "
          f"alternating rounds:")
    print(f"  Get 72 KiB   python {py_get['get_gbps']:.2f} GB/s  C++ "
          f"{cpp_get_gbps:.2f} GB/s  ratio "
          f"{result['get_72KiB']['python_over_cpp']:.2f}")
    print(f"  Load {a.pages} pages x {a.layers} layers   python "
          f"{py_load['load_gbps']:.2f} GB/s  C++ {cpp_load_gbps:.2f} GB/s  "
          f"ratio {result['load']['python_over_cpp']:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
