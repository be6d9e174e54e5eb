"""tierkv.sglang.TierkvHiCacheStorage created the way SGLang creates it
(StorageBackendFactory's "dynamic" path), over SGLang's own host pools
(MLATokenToKVPoolHost, DSAIndexerPoolHost) built on CPU from fake device
pools, moving pages through a real tierkvd bit-exact."""

from __future__ import annotations

import types

import pytest

from conftest import TOKEN, require_engine

require_engine("sglang.srt.mem_cache.hicache_storage", "sglang")

import torch  # noqa: E402
from sglang.srt.mem_cache.device_pool_info import (  # noqa: E402
    KVBufferLayout, KVBuffers, MHABufferInfo, MLABufferInfo)
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorageConfig, PoolName, PoolTransfer)
from sglang.srt.mem_cache.pool_host.base import (  # noqa: E402
    host_memory_budget_scope)
from sglang.srt.mem_cache.pool_host.dsa import (  # noqa: E402
    DSAIndexerPoolHost, make_dsa_indexer_pool_decl)
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import (  # noqa: E402
    StorageBackendFactory)

import tierkv  # noqa: E402
from tierkv.sglang import TierkvHiCacheStorage  # noqa: E402

LAYERS, DEV_TOKENS, PAGE = 3, 512, 64
# DeepSeek-V3.2 / GLM-5 FP8 MLA row (FlashMLA): 512 fp8 + 4 fp32 scales +
# 64 bf16 RoPE = 656 bytes; indexer key: 128 fp8 + 1 fp32 scale = 132 bytes.
FP8_ROW, INDEX_ROW = 656, 132


def mla_host(layout: str, fp8: bool = True, allocator: str = "default",
             layers: int = LAYERS):
    dtype = torch.uint8 if fp8 else torch.bfloat16
    dim = FP8_ROW if fp8 else 576
    dev = [torch.zeros(DEV_TOKENS, 1, dim, dtype=dtype) for _ in range(layers)]
    info = MLABufferInfo(
        buffers=tuple(dev),
        data_ptrs=torch.tensor([t.data_ptr() for t in dev], dtype=torch.uint64),
        layer_indices=tuple(range(layers)), device_layer_num=layers,
        page_size=PAGE, kv_lora_rank=512, qk_rope_head_dim=64,
        kv_cache_dim=dim, dtype=dtype, device=torch.device("cpu"),
        packed_fp8=fp8)
    with host_memory_budget_scope(1 << 30):
        return MLATokenToKVPoolHost(
            info, host_to_device_ratio=2.0, host_size=0, page_size=PAGE,
            layout=layout, pin_memory=False, device="cpu",
            allocator_type=allocator, device_capacity_tokens=DEV_TOKENS,
            # SGLang's assembler passes the packed FP8 row width this way.
            override_kv_cache_dim=dim if fp8 else None,
            start_layer=0, end_layer=layers, target_layer_num=layers)


def mha_host(layout: str, heads: int = 2, head_dim: int = 64):
    """A plain MHA model's host pool (K and V per layer, TP-sharded heads)."""
    def per_layer():
        return tuple(torch.zeros(DEV_TOKENS, heads, head_dim,
                                 dtype=torch.bfloat16) for _ in range(LAYERS))
    k, v = per_layer(), per_layer()
    ptrs = lambda ts: torch.tensor([t.data_ptr() for t in ts],  # noqa: E731
                                   dtype=torch.uint64)
    info = MHABufferInfo(
        buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v),
                          layout=KVBufferLayout.NHD),
        page_size=PAGE, head_num=heads, head_dim=head_dim,
        v_head_dim=head_dim, dtype=torch.bfloat16, device=torch.device("cpu"))
    with host_memory_budget_scope(1 << 30):
        return MHATokenToKVPoolHost(
            info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
            device_capacity_tokens=DEV_TOKENS, start_layer=0,
            end_layer=LAYERS)


def indexer_host(anchor, layers: int = LAYERS, name=PoolName.INDEXER):
    pages = DEV_TOKENS // PAGE + 1
    fake_device_pool = types.SimpleNamespace(
        index_page_size=PAGE, page_size=PAGE, index_head_dim=128,
        quant_block_size=128, skip_topk_layers=[False] * layers,
        layer_num=layers, start_layer=0, end_layer=layers,
        layer_shard_enabled=False, device="cpu", store_dtype=torch.uint8,
        index_k_with_scale_buffer=[
            torch.zeros(pages, PAGE * INDEX_ROW, dtype=torch.uint8)
            for _ in range(layers)])
    with host_memory_budget_scope(1 << 30):
        return DSAIndexerPoolHost(
            make_dsa_indexer_pool_decl(fake_device_pool, name=name), anchor,
            pin_memory=False, device="cpu", allocator_type="default")


def storage_config(daemon, tp_rank=0, tp_size=1, mla=True, metrics=False,
                   **extra):
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1,
        attn_cp_rank=0, attn_cp_size=1, is_mla_model=mla,
        enable_storage_metrics=metrics, is_page_first_layout=True,
        model_name="zai-org/GLM-5-FP8",
        extra_config={"backend_name": "tierkv", "module_path": "tierkv.sglang",
                      "class_name": "TierkvHiCacheStorage", "interface_v1": 1,
                      "socket": daemon.socket, "namespace": "default",
                      "token": TOKEN, **extra})


def create(daemon, host, pools=(), **kw):
    """As HiCacheController / HybridCacheController.attach_storage_backend."""
    backend = StorageBackendFactory.create_backend(
        "dynamic", storage_config(daemon, **kw), host)
    assert isinstance(backend, TierkvHiCacheStorage)
    backend.register_mem_pool_host(host)
    for name, pool in pools:
        backend.register_mem_host_pool_v2(pool, name)
    backend.on_host_pools_registered()
    return backend


def fill(buffer: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    raw = buffer.view(torch.uint8).view(-1)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=g))
    return buffer.clone()


KEYS = ["a1" * 32, "b2" * 32, "c3" * 32]  # SGLang keys: hex page hashes


@pytest.mark.parametrize("layout", ["layer_first", "page_first",
                                    "page_first_direct"])
def test_mla_fp8_pages_round_trip_zero_copy_v1(daemon, layout):
    host = mla_host(layout)
    backend = create(daemon, host)
    idx = host.alloc(len(KEYS) * PAGE)
    want = fill(host.kv_buffer, 1)
    assert backend.batch_set_v1(KEYS, idx) == [True] * 3
    assert backend.batch_set_v1(KEYS, idx) == [True] * 3  # dedup
    host.kv_buffer.zero_()
    assert backend.batch_exists(KEYS + ["d4" * 32]) == 3
    assert backend.batch_get_v1(KEYS, idx) == [True] * 3
    for i in range(len(KEYS)):
        page = int(idx[i * PAGE])
        assert torch.equal(host.get_data_page(page),
                           fill_view(want, host, page))
    # Pieces per page: one per layer for layer_first, else one per page.
    layers = backend.layout.num_layers
    assert layers == (LAYERS if layout == "layer_first" else 1)
    assert backend.batch_get_v1(["e5" * 32], host.alloc(PAGE)) == [False]


def fill_view(want: torch.Tensor, host, page: int) -> torch.Tensor:
    """The data page `page` of the saved buffer `want` (same layout)."""
    saved, host.kv_buffer = host.kv_buffer, want
    try:
        return host.get_data_page(page).clone()
    finally:
        host.kv_buffer = saved


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_dsa_kv_and_indexer_pages_travel_together_bit_exact(daemon, layout):
    anchor = mla_host(layout)
    index = indexer_host(anchor)
    backend = create(daemon, anchor, [(PoolName.KV, anchor),
                                      (PoolName.INDEXER, index)])
    assert [p for p, _ in backend.layout.layers[0]] == ["kv", "indexer"]
    if layout == "page_first":  # one zero-copy piece per page and pool
        assert backend.layout.layers[0] == (("kv", LAYERS * FP8_ROW),
                                            ("indexer", LAYERS * INDEX_ROW))
    else:  # KV per layer in place; the indexer pool's flat page, copied
        assert backend.layout.num_layers == LAYERS
        assert backend.layout.layers[0][1] == ("indexer", LAYERS * INDEX_ROW)
        assert backend.layout.layers[1] == (("kv", FP8_ROW),)
    idx = anchor.alloc(len(KEYS) * PAGE)
    kv = fill(anchor.kv_buffer, 2)
    ik = fill(index.index_k_with_scale_buffer, 3)
    transfers = lambda keys, ix: [  # noqa: E731
        PoolTransfer(name=PoolName.KV, host_indices=ix, keys=keys),
        PoolTransfer(name=PoolName.INDEXER, host_indices=ix, keys=keys)]
    done = backend.batch_set_v2(transfers(KEYS, idx))
    assert done == {"kv": [True] * 3, "indexer": [True] * 3}
    # A fourth page with KV but no index keys is not a hit: SGLang never
    # gets a page whose indexer keys are missing (sglang#17085).
    lone = anchor.alloc(PAGE)
    backend.batch_set_v2([PoolTransfer(name=PoolName.KV, host_indices=lone,
                                       keys=["f6" * 32])])
    hit = backend.batch_exists_v2(KEYS + ["f6" * 32], transfers(KEYS, idx))
    assert hit.kv_hit_pages == 3
    assert hit.extra_pool_hit_pages["indexer"] == 3
    anchor.kv_buffer.zero_()
    index.index_k_with_scale_buffer.zero_()
    got = backend.batch_get_v2(transfers(KEYS, idx))
    assert got == {"kv": [True] * 3, "indexer": [True] * 3}
    for i in range(3):
        page = int(idx[i * PAGE])
        assert torch.equal(anchor.get_data_page(page),
                           fill_view(kv, anchor, page))
        saved, index.index_k_with_scale_buffer = (
            index.index_k_with_scale_buffer, ik)
        want_index = index.get_data_page(page).clone()
        index.index_k_with_scale_buffer = saved
        assert torch.equal(index.get_data_page(page), want_index)


def test_pages_survive_a_daemon_restart(daemon):
    host = mla_host("page_first")
    backend = create(daemon, host)
    idx = host.alloc(2 * PAGE)
    want = fill(host.kv_buffer, 4)
    assert backend.batch_set_v1(KEYS[:2], idx) == [True, True]
    backend.close()
    daemon.stop()
    daemon.start()  # same NVMe file: write_through made the pages durable
    host.kv_buffer.zero_()
    backend = create(daemon, host)
    assert backend.batch_exists(KEYS[:2]) == 2
    assert backend.batch_get_v1(KEYS[:2], idx) == [True, True]
    rows = slice(int(idx[0]), int(idx[0]) + 2 * PAGE)
    assert torch.equal(host.kv_buffer[rows], want[rows])


def test_mla_tp_ranks_share_pages_and_mha_ranks_do_not(daemon):
    host0, host1 = mla_host("page_first"), mla_host("page_first")
    rank0 = create(daemon, host0, tp_rank=0, tp_size=2)
    rank1 = create(daemon, host1, tp_rank=1, tp_size=2)
    idx = host0.alloc(PAGE)
    want = fill(host0.kv_buffer, 5)
    assert rank0.batch_set_v1(KEYS[:1], idx) == [True]
    # MLA KV is the same on every TP rank: rank 1 finds rank 0's page.
    assert rank1.batch_exists(KEYS[:1]) == 1
    idx1 = host1.alloc(PAGE)
    assert rank1.batch_get_v1(KEYS[:1], idx1) == [True]
    assert torch.equal(host1.kv_buffer[int(idx1[0]):int(idx1[0]) + PAGE],
                       want[int(idx[0]):int(idx[0]) + PAGE])
    # Non-MLA models shard heads by TP rank: keys carry the rank.
    assert "_1_2" in TierkvHiCacheStorage._rank_suffix(
        storage_config(daemon, tp_rank=1, tp_size=2, mla=False))
    assert "_1_2" not in rank1.suffix


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_mha_pages_round_trip_per_tp_rank(daemon, layout):
    # Plain MHA: K and V of every layer; each TP rank holds its own heads,
    # so ranks name their pages apart (a second namespace layout would
    # clash, so the two ranks here share geometry).
    host0, host1 = mha_host(layout), mha_host(layout)
    rank0 = create(daemon, host0, mla=False, tp_rank=0, tp_size=2)
    rank1 = create(daemon, host1, mla=False, tp_rank=1, tp_size=2)
    pieces = 2 * LAYERS if layout == "layer_first" else 2
    assert rank0.layout.num_layers == pieces  # K and V pieces
    idx = host0.alloc(2 * PAGE)
    want = fill(host0.kv_buffer, 6)
    assert rank0.batch_set_v1(KEYS[:2], idx) == [True, True]
    assert rank1.batch_exists(KEYS[:2]) == 0  # rank 1's heads differ
    host0.kv_buffer.zero_()
    assert rank0.batch_get_v1(KEYS[:2], idx) == [True, True]
    for i in range(2):  # bytes, not bf16 values: random bits hold NaNs
        page = int(idx[i * PAGE])
        assert torch.equal(host0.get_data_page(page).view(torch.uint8),
                           fill_view(want, host0, page).view(torch.uint8))


def test_bad_configuration_is_a_clear_error(daemon):
    host = mla_host("page_first")
    with pytest.raises(tierkv.PermissionDeniedError):
        StorageBackendFactory.create_backend(
            "dynamic", storage_config(daemon, token="wrong"), host)
    backend = create(daemon, host)
    with pytest.raises(ValueError, match="does not support host pool"):
        backend.register_mem_host_pool_v2(host, PoolName.MAMBA)
    with pytest.raises(NotImplementedError, match="interface_v1"):
        backend.batch_get(KEYS, None)
    # Another host layout in the same namespace: a different tierkv layout.
    with pytest.raises(tierkv.InvalidArgumentError):
        create(daemon, mla_host("layer_first"))


# ---- speculative decoding, metrics, clear(), the production call split ----


def dsa_with_draft(daemon, layout="page_first"):
    """A DSA target (3 layers) with an MTP/EAGLE draft (1 layer), each with
    its KV and indexer pools, registered as HybridCacheController does
    (hybrid_pool_assembler.py: DRAFT and DRAFT_INDEXER ride on the KV
    anchor's indices)."""
    anchor = mla_host(layout)
    draft = mla_host(layout, layers=1)
    pools = [(PoolName.KV, anchor), (PoolName.INDEXER, indexer_host(anchor)),
             (PoolName.DRAFT, draft),
             (PoolName.DRAFT_INDEXER,
              indexer_host(draft, layers=1, name=PoolName.DRAFT_INDEXER))]
    return create(daemon, anchor, pools), dict(pools)


def test_draft_pools_are_stored_as_parts_of_the_same_page(daemon):
    backend, pools = dsa_with_draft(daemon)
    assert [p for p, _ in backend.layout.layers[0]] == [
        "kv", "draft", "draft_indexer", "indexer"]
    idx = pools[PoolName.KV].alloc(len(KEYS) * PAGE)
    names = [PoolName.KV, PoolName.INDEXER, PoolName.DRAFT,
             PoolName.DRAFT_INDEXER]

    def buffers():
        return {n: (pools[n].kv_buffer if n in (PoolName.KV, PoolName.DRAFT)
                    else pools[n].index_k_with_scale_buffer) for n in names}

    want = {n: fill(b, 10 + i) for i, (n, b) in enumerate(buffers().items())}
    transfers = lambda names: [  # noqa: E731
        PoolTransfer(name=n, host_indices=idx, keys=KEYS) for n in names]
    # Target pools alone: no hit yet (the draft model's KV is missing).
    assert backend.batch_set_v2(transfers(names[:2]))["kv"] == [True] * 3
    assert backend.batch_exists_v2(KEYS, transfers(names)).kv_hit_pages == 0
    done = backend.batch_set_v2(transfers(names[2:]))
    assert done == {"draft": [True] * 3, "draft_indexer": [True] * 3}
    hit = backend.batch_exists_v2(KEYS, transfers(names))
    assert hit.kv_hit_pages == 3
    assert hit.extra_pool_hit_pages == {n.value: 3 for n in names}
    for b in buffers().values():
        b.zero_()
    assert all(v == [True] * 3 for v in
               backend.batch_get_v2(transfers(names)).values())
    for i in range(3):  # the pools hold more than these pages: by page
        page = int(idx[i * PAGE])
        for n in names:
            assert torch.equal(pools[n].get_data_page(page),
                               page_of(pools[n], want[n], page)), (n, i)


def page_of(pool, saved: torch.Tensor, page: int) -> torch.Tensor:
    """Data page `page` of `pool` had its buffer been `saved`."""
    attr = ("index_k_with_scale_buffer"
            if hasattr(pool, "index_k_with_scale_buffer") else "kv_buffer")
    current = getattr(pool, attr)
    setattr(pool, attr, saved)
    try:
        return pool.get_data_page(page).clone()
    finally:
        setattr(pool, attr, current)


def test_draft_swa_is_refused_clearly(daemon):
    host = mla_host("page_first")
    backend = create(daemon, host)
    with pytest.raises(ValueError, match="draft_swa"):
        backend.register_mem_host_pool_v2(host, PoolName.DRAFT_SWA)


def test_production_call_split_kv_v1_and_indexer_v2(daemon):
    # HybridCacheController (hybrid_cache_controller.py): the KV anchor
    # travels through the v1 zero-copy calls (super()._page_backup /
    # _page_transfer_kv_batch), the sidecar pools through batch_set_v2 /
    # batch_get_v2, and the lookup is one batch_exists_v2 over all pools.
    anchor = mla_host("page_first")
    index = indexer_host(anchor)
    backend = create(daemon, anchor, [(PoolName.KV, anchor),
                                      (PoolName.INDEXER, index)])
    idx = anchor.alloc(len(KEYS) * PAGE)
    kv, ik = fill(anchor.kv_buffer, 20), fill(index.index_k_with_scale_buffer, 21)
    sidecar = [PoolTransfer(name=PoolName.INDEXER, host_indices=idx, keys=KEYS)]
    assert backend.batch_set_v2(sidecar) == {"indexer": [True] * 3}
    assert backend.batch_set_v1(KEYS, idx) == [True] * 3
    query = [PoolTransfer(name=PoolName.KV, host_indices=idx, keys=KEYS),
             *sidecar]
    assert backend.batch_exists_v2(KEYS, query).kv_hit_pages == 3
    anchor.kv_buffer.zero_()
    index.index_k_with_scale_buffer.zero_()
    assert backend.batch_get_v1(KEYS, idx) == [True] * 3
    assert backend.batch_get_v2(sidecar) == {"indexer": [True] * 3}
    for i in range(3):
        page = int(idx[i * PAGE])
        assert torch.equal(anchor.get_data_page(page),
                           page_of(anchor, kv, page))
        assert torch.equal(index.get_data_page(page), page_of(index, ik, page))


def test_get_stats_is_what_enable_metrics_logs(daemon):
    from prometheus_client import REGISTRY
    from sglang.srt.observability.metrics_collector import (
        StorageMetrics, StorageMetricsCollector)
    host = mla_host("page_first")
    backend = create(daemon, host, metrics=True)
    idx = host.alloc(len(KEYS) * PAGE)
    fill(host.kv_buffer, 30)
    assert backend.batch_set_v1(KEYS, idx) == [True] * 3
    assert backend.batch_get_v1(KEYS[:2], idx[:2 * PAGE]) == [True] * 2
    # As UnifiedRadixCache's metrics drain (unified_radix_cache.py:3701-3707)
    # with --enable-metrics: get_stats() through the backend, then the
    # collector, which asserts the type.
    stats = backend.get_stats()
    assert isinstance(stats, StorageMetrics)
    assert stats.backup_pgs == [3] and stats.prefetch_pgs == [2]
    assert all(bw > 0 for bw in stats.backup_bandwidth + stats.prefetch_bandwidth)
    if not hasattr(stats, "prefetch_stats"):
        stats.prefetch_stats = {}
    labels = {"storage_backend": "tierkv-test"}
    collector = StorageMetricsCollector(labels=labels)
    collector.log_storage_metrics(stats)
    names = {m.name for m in REGISTRY.collect()}
    count = REGISTRY.get_sample_value("sglang:prefetch_pgs_count", labels)
    assert count == 1, sorted(n for n in names if "pgs" in n)
    assert REGISTRY.get_sample_value("sglang:backup_pgs_sum", labels) == 3
    # Drained: the next interval starts empty.
    assert backend.get_stats().prefetch_pgs == []


def test_clear_says_it_cleared_nothing(daemon):
    host = mla_host("page_first")
    backend = create(daemon, host)
    idx = host.alloc(PAGE)
    fill(host.kv_buffer, 40)
    assert backend.batch_set_v1(KEYS[:1], idx) == [True]
    assert backend.clear() is False
    assert backend.batch_exists(KEYS[:1]) == 1  # still there, as it said


def test_a_lost_daemon_is_a_miss_and_the_backend_recovers(daemon):
    host = mla_host("page_first")
    backend = create(daemon, host, retry_s=0.0)
    idx = host.alloc(PAGE)
    fill(host.kv_buffer, 50)
    assert backend.batch_set_v1(KEYS[:1], idx) == [True]
    daemon.stop(9)
    assert backend.batch_exists(KEYS) == 0
    assert backend.batch_get_v1(KEYS[:1], idx) == [False]
    assert backend.batch_set_v1(KEYS[1:2], idx) == [False]
    # tierkvd is back: the backend reconnects (and registers its layout
    # again) on its next call.
    daemon.start()
    assert backend.batch_set_v1(KEYS[1:2], idx) == [True]
    assert backend.batch_exists(KEYS[1:2]) == 1
    assert backend.batch_get_v1(KEYS[1:2], idx) == [True]


# ---- SGLang's real HiCacheController, on CPU ----


@pytest.fixture(scope="module")
def gloo_world():
    """The process group HiCacheController all-reduces hit counts over."""
    import torch.distributed as dist
    if not dist.is_initialized():
        store = dist.HashStore()
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    return dist.group.WORLD


def test_sglangs_hicache_controller_backs_up_and_prefetches_through_tierkv(
        daemon, gloo_world):
    import queue
    import threading
    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
    from sglang.srt.mem_cache.utils import get_storage_hash_str
    from sglang.srt.runtime_context import get_parallel
    # A real device pool on CPU, the host pool SGLang builds from it.
    device = MLATokenToKVPool(size=DEV_TOKENS, page_size=PAGE,
                              dtype=torch.bfloat16, kv_lora_rank=512,
                              qk_rope_head_dim=64, layer_num=LAYERS,
                              device="cpu", enable_memory_saver=False)
    with host_memory_budget_scope(1 << 30):
        host = MLATokenToKVPoolHost(
            device._mla_buffer_info(), host_to_device_ratio=2.0, host_size=0,
            page_size=PAGE, layout="page_first", pin_memory=False,
            device="cpu", allocator_type="default",
            device_capacity_tokens=DEV_TOKENS, start_layer=0,
            end_layer=LAYERS, target_layer_num=LAYERS)
    extra = storage_config(daemon).extra_config
    # What a launched server publishes for its ranks (one rank here).
    with get_parallel().override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1,
                                 attn_dcp_rank=0, attn_dcp_size=1):
        ctrl = HiCacheController(
            types.SimpleNamespace(get_kvcache=lambda: device), host, PAGE,
            gloo_world, threading.Event(), io_backend="direct",
            storage_backend="dynamic", model_name="zai-org/GLM-5-FP8",
            storage_backend_extra_config=dict(extra))
    try:
        assert isinstance(ctrl.storage_backend, TierkvHiCacheStorage)
        tokens = [int(t) for t in torch.randint(2, 1000, (3 * PAGE,))]
        hashes = get_storage_hash_str(tokens, None, page_size=PAGE)
        idx = host.alloc(len(tokens))
        want = fill(host.kv_buffer, 60)
        # Backup thread: HiCacheController._page_backup -> batch_set_v1.
        op_id = ctrl.write_storage(idx, tokens, hash_value=hashes)
        done = ctrl.ack_backup_queue.get(timeout=30)
        assert done.id == op_id and done.completed_tokens == len(tokens)
        host.kv_buffer.zero_()
        # Prefetch thread: _storage_hit_query -> batch_exists; then what the
        # radix cache does with a hit (unified_radix_cache.py:3143-3150), and
        # the IO thread: _page_transfer -> batch_get_v1.
        op = ctrl.prefetch(types.SimpleNamespace(rid="r1"), tokens)
        hit = ctrl.prefetch_hit_queue.get(timeout=30)
        assert hit is op and hit.storage_hit_count == len(tokens)
        op.host_indices = host.alloc(len(tokens))
        ctrl.prefetch_buffer.put(op)
        completed = 0
        while True:
            ack = ctrl.ack_prefetch_queue.get(timeout=30)
            completed = max(completed, ack.completed_tokens or 0)
            if ack.completed_req:
                break
        assert completed == len(tokens)
        for i in range(3):
            src, dst = int(idx[i * PAGE]), int(op.host_indices[i * PAGE])
            # bytes, not bf16 values: random bits hold NaNs
            assert torch.equal(host.get_data_page(dst).view(torch.uint8),
                               fill_view(want, host, src).view(torch.uint8))
    finally:
        ctrl.storage_stop_event.set()
        try:
            ctrl._stop_storage_threads()
        except (RuntimeError, queue.Empty):
            pass
