"""tierkv's Python package against a real tierkvd: the data path (Put/Get,
zero-copy leases, registered pools with per-layer Load/Store), page hashes,
and every kind of bad input raising a typed error with the library's
message instead of crashing."""

from __future__ import annotations

import os
import subprocess
import threading

import numpy as np
import pytest

import tierkv
from conftest import TOKEN

PAGE_TOKENS = 16
# GLM-5 / DeepSeek-V3.2 FP8 shapes: a 656-byte latent row on every layer,
# a 132-byte index key on full layers only (layer 1 shares layer 0's).
LAYOUT = tierkv.Layout.of(PAGE_TOKENS, [
    [("kv", 656), ("index_k", 132)],
    [("kv", 656)],
    [("kv", 656), ("index_k", 132)],
])
KV = PAGE_TOKENS * 656
IDX = PAGE_TOKENS * 132


def connect(daemon, **kw):
    c = tierkv.connect(daemon.socket, namespace="default", token=TOKEN, **kw)
    c.register_layout(LAYOUT)
    return c


def pages_for(n, seed=0):
    tokens = np.arange(seed, seed + n * PAGE_TOKENS, dtype=np.uint32)
    return tierkv.page_hashes(tokens, PAGE_TOKENS, namespace="default")


def rows(n, size, seed):
    return np.random.default_rng(seed).integers(0, 256, (n, size),
                                                dtype=np.uint8)


def test_page_hashes_follow_the_frozen_chain():
    # Same vectors as tests/common/page_hash_test.cc (FrozenVectors).
    root = tierkv.root_page_hash("default")
    assert f"{int(root[1]):016x}{int(root[0]):016x}" == \
        "12a03b47514c9b7dd69c36821acea183"
    h = tierkv.page_hashes(np.arange(1, 65), 64, namespace="default")
    assert h.shape == (1, 2) and h.dtype == np.uint64
    assert f"{int(h[0, 1]):016x}{int(h[0, 0]):016x}" == \
        "eaae000cecf2fc67f46506c014bbc5c0"
    salted = tierkv.page_hashes(np.arange(1, 5), 4, root=np.zeros(2, np.uint64),
                                salt=b"x")
    assert f"{int(salted[0, 1]):016x}{int(salted[0, 0]):016x}" == \
        "dfed77c69c84eb5533db2eeddfad8f25"
    # A chain continued from its own last hash equals the whole chain.
    whole = tierkv.page_hashes(np.arange(200), 16, namespace="n")
    tail = tierkv.page_hashes(np.arange(96, 200), 16, root=whole[5])
    np.testing.assert_array_equal(whole[6:], tail)
    assert len(tierkv.page_hashes(np.arange(15), 16, namespace="n")) == 0


def test_put_get_round_trips_bit_exact_and_dedups(daemon):
    with connect(daemon) as c:
        pages = pages_for(8)
        kv = rows(8, KV, 1)
        idx = rows(8, IDX, 2)
        assert not c.put(pages, 0, "kv", kv).any()
        assert not c.put(pages, 0, "index_k", list(idx)).any()
        assert c.put(pages, 0, "kv", kv).all()  # stored before: dedup
        out = np.zeros_like(kv)
        c.get(pages, 0, "kv", out)
        np.testing.assert_array_equal(out, kv)
        out_idx = [bytearray(IDX) for _ in range(8)]
        c.get(pages, 0, "index_k", out_idx)
        assert [bytes(b) for b in out_idx] == [r.tobytes() for r in idx]
        # Layer 0 is complete only for kv and index_k of every layer.
        assert c.match(pages).leading_pages == 0
        for layer in (1, 2):
            c.put(pages, layer, "kv", kv)
        c.put(pages, 2, "index_k", idx)
        m = c.match(np.concatenate([pages, pages_for(2, seed=9999)]))
        assert m.leading_pages == 8
        assert m.tiers == ["host"] * 8 + ["miss"] * 2


def test_acquire_gives_read_only_views_of_the_arena(daemon):
    c = connect(daemon)
    pages = pages_for(3)
    kv = rows(3, KV, 3)
    c.put(pages[:2], 1, 0, kv[:2])
    lease = c.acquire(pages, 1, "kv")
    np.testing.assert_array_equal(lease[0], kv[0])
    np.testing.assert_array_equal(lease[1], kv[1])
    assert lease[2] is None and list(lease.statuses) == [0, 0, 1]
    with pytest.raises(ValueError):
        lease[0][0] = 1  # the arena is the daemon's: read-only
    view = lease[1]
    del lease
    c.close()
    # The view keeps its lease, and the lease the mapping: still readable.
    np.testing.assert_array_equal(view, kv[1])


def test_pools_load_and_store_layer_by_layer(daemon):
    slots = 4
    writer = connect(daemon)
    pools = {}
    for layer, parts in enumerate(LAYOUT.layers):
        for part, (name, _) in enumerate(parts):
            pool = tierkv.Pool(LAYOUT.segment_bytes(layer, part), slots)
            pool.array[:] = rows(slots, pool.slot_bytes, 10 * layer + part)
            writer.register_pool(pool, layer=layer, part=name)
            pools[layer, part] = pool
    pages = pages_for(3, seed=500)
    with writer.store(pages, [2, 0, 3]) as t:
        t.wait()
    assert writer.match(pages).leading_pages == 3

    reader = connect(daemon)
    loaded = {}
    for (layer, part), src in pools.items():
        dst = tierkv.Pool(src.slot_bytes, 8)
        reader.register_pool(dst, layer=layer, part=part)
        loaded[layer, part] = dst
    with reader.load(pages, [5, 6, 7]) as t:
        for layer in range(LAYOUT.num_layers):
            assert list(t.wait_layer(layer)) == [0, 0, 0]
            assert t.layers_done >= layer + 1
            for part in range(len(LAYOUT.layers[layer])):
                got = loaded[layer, part].array
                want = pools[layer, part].array
                np.testing.assert_array_equal(got[5:8], want[[2, 0, 3]])
    # A page in no tier: its slot is untouched and its status NotFound.
    missing = pages_for(1, seed=7777)
    loaded[0, 0].array[1] = 0xAB
    with reader.load(missing, [1]) as t:
        with pytest.raises(tierkv.NotFoundError) as e:
            t.wait()
        assert e.value.index == 0 and list(e.value.statuses) == [1]
        assert list(t.wait(check_pages=False)) == [1]
    assert (loaded[0, 0].array[1] == 0xAB).all()


def test_flush_persists_across_a_restart(daemon, tmp_path):
    pages = pages_for(2, seed=42)
    kv = rows(2, KV, 4)
    with connect(daemon) as c:
        c.put(pages, 0, "kv", kv)
        assert list(c.flush(pages, 0, "kv")) == [0, 0]
    daemon.stop()
    daemon.start()
    with connect(daemon) as c:
        out = np.zeros_like(kv)
        c.get(pages, 0, "kv", out)
        np.testing.assert_array_equal(out, kv)


def tierkvd_has_sync_points() -> bool:
    """Whether tierkvd was built with test-only sync points, which
    TIERKV_TEST_STALL_LAYER needs (`tierkvd --version`; release builds,
    -DTIERKV_SYNC_POINTS=OFF, have none)."""
    from tierkv.testing import bin_dir
    version = subprocess.run([str(bin_dir() / "tierkvd"), "--version"],
                             capture_output=True, text=True, check=True,
                             timeout=30).stdout
    return "sync points: on" in version


def test_wait_layer_releases_the_gil_while_the_daemon_holds_a_layer(tmp_path):
    from conftest import CONFIG
    from tierkv.testing import Tierkvd

    if not tierkvd_has_sync_points():
        pytest.skip("needs TIERKV_TEST_STALL_LAYER: this tierkvd was built "
                    "with -DTIERKV_SYNC_POINTS=OFF, as release builds are")
    fifo = str(tmp_path / "stall.fifo")
    os.mkfifo(fifo)
    # Held open read-write: the daemon's read waits for our byte, and if
    # this test dies the close gives it EOF, so nothing hangs.
    hold = os.open(fifo, os.O_RDWR)
    try:
        d = Tierkvd(tmp_path / "run", CONFIG,
                    env={"TIERKV_TEST_STALL_LAYER": f"1:{fifo}"}).start()
        try:
            c = connect(d)
            src = {}
            for layer, parts in enumerate(LAYOUT.layers):
                for part in range(len(parts)):
                    pool = tierkv.Pool(LAYOUT.segment_bytes(layer, part), 2)
                    c.register_pool(pool, layer=layer, part=part)
                    src[layer, part] = pool
            pages = pages_for(2, seed=900)
            for (layer, part), pool in src.items():
                c.put(pages, layer, part, pool.array)
            t = c.load(pages, [0, 1])
            t.wait_layer(0)
            entered = threading.Event()
            done = threading.Event()

            def waiter():
                entered.set()
                t.wait_layer(1)
                done.set()

            th = threading.Thread(target=waiter)
            th.start()
            assert entered.wait(10)
            # The waiter is inside WaitLayer(1), which the daemon holds;
            # this thread still runs Python: the call dropped the GIL.
            spins = sum(1 for _ in range(100000))
            assert spins == 100000 and not done.is_set()
            assert t.layers_done == 1
            os.write(hold, b"\x01")
            th.join(30)
            assert done.is_set()
            t.close()
            c.close()
        finally:
            d.stop()
    finally:
        os.close(hold)


def test_concurrent_threads_share_one_client(daemon):
    c = connect(daemon)
    errors = []

    def work(seed):
        try:
            pages = pages_for(4, seed=10000 + 100 * seed)
            kv = rows(4, KV, seed)
            c.put(pages, 1, "kv", kv)
            out = np.zeros_like(kv)
            c.get(pages, 1, "kv", out)
            np.testing.assert_array_equal(out, kv)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []


def test_stats_ping_prefetch_and_topk_reports(daemon):
    with connect(daemon) as c:
        info = c.ping()
        assert info["pid"] == daemon.proc.pid
        pages = pages_for(2, seed=321)
        c.put(pages, 0, "kv", rows(2, KV, 5))
        c.prefetch(pages)
        c.report_topk(pages, 0, [3, 1])
        stats = c.stats()
        assert stats["namespace"] == "default"
        assert c.layout == LAYOUT
    # A fresh client learns the layout from the daemon.
    with tierkv.connect(daemon.socket, namespace="default", token=TOKEN) as c:
        assert c.layout == LAYOUT


# ---- bad input: typed errors with the library's message, never a crash ----


def test_wrong_sizes_are_invalid_argument_with_the_librarys_message(daemon):
    c = connect(daemon)
    pages = pages_for(2)
    with pytest.raises(tierkv.InvalidArgumentError) as e:
        c.put(pages, 0, "kv", np.zeros((2, KV - 1), np.uint8))
    assert "invalid_argument" in str(e.value) and e.value.index == 0
    c.put(pages, 0, "kv", rows(2, KV, 6))
    with pytest.raises(tierkv.InvalidArgumentError):
        c.get(pages, 0, "kv", np.zeros((2, KV + 8), np.uint8))
    with pytest.raises(tierkv.InvalidArgumentError):
        c.get(pages, 0, "kv", np.zeros((3, KV), np.uint8))  # 3 rows, 2 keys
    with pytest.raises(tierkv.InvalidArgumentError):
        c.put(pages, 7, 0, rows(2, KV, 6))  # no layer 7
    with pytest.raises(tierkv.InvalidArgumentError):
        c.put(pages, 1, "index_k", rows(2, IDX, 6))  # layer 1 has no index_k
    pool = tierkv.Pool(KV, 2)
    c.register_pool(pool, layer=0, part="kv")
    with pytest.raises(tierkv.InvalidArgumentError):
        c.register_pool(tierkv.Pool(KV + 1, 2), layer=1, part="kv")
    with pytest.raises(tierkv.InvalidArgumentError):
        c.load(pages, [0, 5], layer_count=1)  # slot 5 of a 2-slot pool


def test_wrong_dtypes_shapes_and_layouts_are_rejected(daemon):
    c = connect(daemon)
    with pytest.raises(tierkv.InvalidArgumentError, match="dtype"):
        c.match(np.zeros((2, 2), np.float64))
    with pytest.raises(tierkv.InvalidArgumentError, match="shape"):
        c.match(np.zeros((2, 3), np.uint64))
    with pytest.raises(tierkv.InvalidArgumentError, match="range"):
        c.put(pages_for(1), -1, 0, rows(1, KV, 0))
    with pytest.raises(tierkv.InvalidArgumentError):
        tierkv.page_hashes([1.5, 2.5], 1, namespace="x")
    with pytest.raises(tierkv.InvalidArgumentError):
        c.put(pages_for(1), 0, 0, "not a buffer list")
    with pytest.raises(tierkv.InvalidArgumentError):
        c.register_layout(tierkv.Layout.uniform(16, 3, [("kv", 100)]))
    with pytest.raises(tierkv.InvalidArgumentError):
        c.register_layout(tierkv.Layout.uniform(0, 1, [("kv", 100)]))


def test_non_contiguous_and_read_only_buffers_are_rejected(daemon):
    c = connect(daemon)
    pages = pages_for(2)
    wide = rows(2, 2 * KV, 7)
    with pytest.raises(tierkv.InvalidArgumentError, match="contiguous"):
        c.put(pages, 0, 0, wide[:, ::2])
    with pytest.raises(tierkv.InvalidArgumentError, match="contiguous"):
        c.put(pages, 0, 0, [wide[0, ::2], wide[1, ::2]])
    c.put(pages, 0, 0, rows(2, KV, 8))
    ro = np.zeros((2, KV), np.uint8)
    ro.flags.writeable = False
    with pytest.raises(tierkv.InvalidArgumentError, match="read-only"):
        c.get(pages, 0, 0, ro)
    with pytest.raises(tierkv.InvalidArgumentError, match="read-only"):
        c.get(pages, 0, 0, [bytes(KV), bytes(KV)])


def test_closed_clients_and_handles_raise(daemon):
    c = connect(daemon)
    c.close()
    c.close()  # idempotent
    assert c.closed
    with pytest.raises(tierkv.ClientClosedError):
        c.match(pages_for(1))
    with pytest.raises(tierkv.ClientClosedError):
        c.put(pages_for(1), 0, 0, rows(1, KV, 0))
    c = connect(daemon)
    pool = tierkv.Pool(KV, 1)
    c.register_pool(pool, layer=1, part=0)  # layer 1: kv only
    t = c.load(pages_for(1, seed=31337), [0], first_layer=1, layer_count=1)
    t.close()
    with pytest.raises(tierkv.ClientClosedError):
        t.wait()


def test_connection_errors_are_typed(daemon, tmp_path):
    with pytest.raises(tierkv.UnavailableError):
        tierkv.Client(str(tmp_path / "nobody.sock"), timeout=1.0)
    with pytest.raises(tierkv.PermissionDeniedError):
        tierkv.connect(daemon.socket, namespace="default", token="wrong")
    with pytest.raises(tierkv.PermissionDeniedError):
        tierkv.connect(daemon.socket, namespace="nope", token=TOKEN)
    c = connect(daemon)
    daemon.stop()
    with pytest.raises((tierkv.UnavailableError, tierkv.TierkvIOError)):
        c.match(pages_for(1))
