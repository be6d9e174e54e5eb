"""tierkv.vllm.TierkvConnector loaded by vLLM 0.33.0's own factory from
kv_connector_module_path, driven by vLLM's real Scheduler and by vLLM's own
worker-side connector plumbing around a stand-in forward pass that calls
exactly the hooks vLLM calls (tests/engines/vllm_engine.py): DSA indexer
keys, tensor and pipeline ranks, failures under both load-failure policies,
stats and metrics, against real tierkvd processes."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from conftest import TOKEN, namespace_config, require_engine

require_engine("vllm.v1.core.sched.scheduler", "vllm")

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.v1.metrics.cache_hit_source import CacheHitSource  # noqa: E402

import tierkv  # noqa: E402
from tierkv.testing import Tierkvd  # noqa: E402
from tierkv.vllm import (TierkvConnector, TierkvConnectorStats,  # noqa: E402
                         layer_parts, stage_namespaces)
from vllm_engine import (BLOCK, TINY_DSV32, TINY_LLAMA, Engine,  # noqa: E402
                         block_bytes)

PROMPT = [int(x) for x in
          np.random.default_rng(7).integers(2, 1000, 3 * BLOCK + 10)]


def test_versions():
    print(f"vllm {vllm.__version__}, torch {torch.__version__}")
    assert vllm.__version__ == "0.33.0"
    assert torch.__version__.split("+")[0] == "2.14.0"  # as vllm declares


def extra(daemon, namespace="default"):
    return {"socket": daemon.socket, "namespace": namespace, "token": TOKEN,
            "retry_s": 0.0}


def model(tmp_path, config):
    d = tmp_path / config["model_type"]
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    return d


@pytest.fixture
def dsv32(tmp_path):
    return model(tmp_path, TINY_DSV32)


def store(engine, req_id="r1", prompt=PROMPT):
    """Serves `prompt` cold on `engine`: every full block is saved."""
    engine.add(req_id, prompt)
    out = engine.step()
    assert out.scheduled_new_reqs[0].num_computed_tokens == 0
    assert [len(t.blocks) for t in out.kv_connector_metadata.saves] == [
        len(prompt) // BLOCK]
    engine.run()


def assert_reads_exact(engine, req_id, prompt, caches, blocks):
    """What each cache read for the loaded blocks is what the first engine
    computed for them."""
    for name in caches:
        for b in blocks:
            got = engine.reads[req_id, name, b]
            assert torch.equal(got, block_bytes(prompt, b, name, got.numel())), (
                name, b)


def test_layer_names_map_to_kv_and_index_key_parts():
    m = layer_parts(["model.layers.0.self_attn.attn",
                     "model.layers.0.self_attn.indexer.k_cache",
                     "model.layers.12.self_attn.attn"])
    assert m == {"model.layers.0.self_attn.attn": (0, "kv"),
                 "model.layers.0.self_attn.indexer.k_cache":
                     (0, "indexer.k_cache"),
                 "model.layers.12.self_attn.attn": (12, "kv")}


def test_dsa_indexer_keys_are_stored_with_their_layer_and_in_place_before_the_indexer_reads_them(
        dsv32, daemon):
    first = Engine(dsv32, extra(daemon))
    assert isinstance(first.scheduler.connector, TierkvConnector)
    assert isinstance(first.worker, TierkvConnector)
    # One tierkv page holds both caches of a layer: latent + index keys.
    assert first.worker.layout.layers[0] == (("kv", 656),
                                             ("indexer.k_cache", 132))
    store(first)

    second = Engine(dsv32, extra(daemon))
    second.add("r2", PROMPT)
    out = second.step()
    # The hit: 3 full blocks; vLLM computes the rest itself.
    assert out.scheduled_new_reqs[0].num_computed_tokens == 3 * BLOCK
    assert out.has_sync_kv_loads
    assert [len(t.blocks) for t in out.kv_connector_metadata.loads] == [3]
    # Every cache, indexer keys included, held the first engine's bytes at
    # the moment the stand-in indexer / MLA op read them.
    caches = [n for n in second.kv]
    assert any(".indexer." in n for n in caches)
    assert_reads_exact(second, "r2", PROMPT, caches, range(3))
    assert second.last_kv_output.invalid_block_ids == set()
    stats = second.last_kv_output.kv_connector_stats
    assert isinstance(stats, TierkvConnectorStats)
    assert stats.data["load_pages"] == 3 and stats.data["load_failed_pages"] == 0
    print(f"DSA: hit {3 * BLOCK} tokens; stats {stats.reduce()}")
    # Which tier served it (vLLM's cache-hit source label).
    sources = second.scheduler.connector.get_external_cache_hit_sources(
        second.scheduler.requests["r2"], 3 * BLOCK)
    assert sum(sources.values()) == 3 * BLOCK
    assert set(sources) <= {CacheHitSource.HOST, CacheHitSource.DISK}
    second.run()

    # tierkvd restarted between store and load: NVMe (write_through) hits.
    daemon.stop()
    daemon.start()
    third = Engine(dsv32, extra(daemon))
    third.add("r3", PROMPT + [5, 6])
    out = third.step()
    assert out.scheduled_new_reqs[0].num_computed_tokens == 3 * BLOCK
    assert_reads_exact(third, "r3", PROMPT, list(third.kv), range(3))
    sources = third.scheduler.connector.get_external_cache_hit_sources(
        third.scheduler.requests["r3"], 3 * BLOCK)
    assert sources == {CacheHitSource.DISK: 3 * BLOCK}


def test_only_the_attention_ops_hook_is_called(dsv32, daemon):
    # The stand-in calls the hooks exactly as vLLM: never for the indexer.
    engine = Engine(dsv32, extra(daemon))
    calls = []
    w = engine.worker
    for hook in ("wait_for_layer_load", "save_kv_layer"):
        original = getattr(w, hook)

        def spy(name, *args, _hook=hook, _original=original, **kw):
            calls.append((_hook, name))
            return _original(name, *args, **kw)
        setattr(w, hook, spy)
    store(engine)
    names = {n for _, n in calls}
    assert names == {"model.layers.0.self_attn.attn",
                     "model.layers.1.self_attn.attn"}


def test_a_local_prefix_hit_loads_only_the_pages_after_it(dsv32, daemon):
    store(Engine(dsv32, extra(daemon)))
    second = Engine(dsv32, extra(daemon))
    second.add("warm", PROMPT[:BLOCK + 5])
    second.run()
    second.add("full", PROMPT)
    out = second.step()
    assert out.scheduled_new_reqs[0].num_computed_tokens == 3 * BLOCK
    loads = out.kv_connector_metadata.loads
    assert [len(t.blocks) for t in loads] == [2]
    assert loads[0].blocks == second.blocks_of("full")[1:3]
    assert_reads_exact(second, "full", PROMPT, list(second.kv), [1, 2])


def test_a_prompt_shorter_than_a_block_or_unknown_matches_nothing(
        dsv32, daemon):
    engine = Engine(dsv32, extra(daemon))
    engine.add("short", PROMPT[:BLOCK - 1])
    engine.add("new", [3] * (2 * BLOCK + 1))
    out = engine.step()
    assert {r.req_id: r.num_computed_tokens
            for r in out.scheduled_new_reqs} == {"short": 0, "new": 0}
    assert out.kv_connector_metadata.loads == []


# ---- tensor and pipeline parallelism ----


def test_tp_ranks_of_an_mha_model_each_get_their_own_head_shard_back(
        tmp_path, daemon):
    llama = model(tmp_path, TINY_LLAMA)
    ranks = [Engine(llama, extra(daemon), mla=False, tp=2, rank=r,
                    content_tag=f"#tp{r}") for r in range(2)]
    layout = ranks[0].worker.layout
    assert layout == ranks[1].worker.layout
    assert [p for p, _ in layout.layers[0]] == ["kv@tp0", "kv@tp1"]

    # Rank 0 alone has stored: not a hit for the TP group.
    store(ranks[0])
    probe = Engine(llama, extra(daemon), mla=False, tp=2, rank=0)
    probe.add("p", PROMPT)
    assert probe.step().scheduled_new_reqs[0].num_computed_tokens == 0
    store(ranks[1])

    for r in range(2):
        e = Engine(llama, extra(daemon), mla=False, tp=2, rank=r)
        e.add("again", PROMPT)
        out = e.step()
        assert out.scheduled_new_reqs[0].num_computed_tokens == 3 * BLOCK
        for name in e.kv:
            for b in range(3):
                got = e.reads["again", name, b]
                want = block_bytes(PROMPT, b, f"{name}#tp{r}", got.numel())
                assert torch.equal(got, want), (r, name, b)


def test_mla_pages_are_shared_by_tp_ranks_and_saved_once(dsv32, daemon):
    rank1 = Engine(dsv32, extra(daemon), tp=2, rank=1)
    assert [p for p, _ in rank1.worker.layout.layers[0]] == [
        "kv", "indexer.k_cache"]
    store(rank1)  # rank 1 does not save replicated caches...
    store(Engine(dsv32, extra(daemon), tp=2, rank=0), "r0")  # ...so: cold
    for r in range(2):
        e = Engine(dsv32, extra(daemon), tp=2, rank=r)
        e.add("again", PROMPT)
        assert e.step().scheduled_new_reqs[0].num_computed_tokens == 3 * BLOCK
        assert_reads_exact(e, "again", PROMPT, list(e.kv), range(3))


PP_CONFIG = f"""
[[namespace]]
name = "m-pp0"
token = "{TOKEN}"
host_bytes = "32MiB"
[[namespace]]
name = "m-pp1"
token = "{TOKEN}"
host_bytes = "32MiB"
"""


def test_pp_stages_use_their_own_namespace_and_never_collide(dsv32, tmp_path):
    with pytest.raises(ValueError, match=r"\{pp_rank\}"):
        stage_namespaces("m", 2)
    with Tierkvd(tmp_path / "pp", PP_CONFIG) as d:
        ex = extra(d, "m-pp{pp_rank}")
        # Stage 0 holds layer 0, stage 1 layer 1 (vLLM's PP split).
        stages = [Engine(dsv32, ex, pp=2, rank=s, layers=[s])
                  for s in range(2)]
        assert [e.worker.namespace for e in stages] == ["m-pp0", "m-pp1"]
        # Both stages' layouts have one layer, in their own namespaces.
        assert stages[0].worker.layout == stages[1].worker.layout
        store(stages[0])
        probe = Engine(dsv32, ex, pp=2, rank=0, layers=[0])
        probe.add("p", PROMPT)  # stage 1 has nothing yet: no hit
        assert probe.step().scheduled_new_reqs[0].num_computed_tokens == 0
        store(stages[1])
        for s in range(2):
            e = Engine(dsv32, ex, pp=2, rank=s, layers=[s])
            e.add("again", PROMPT)
            assert e.step().scheduled_new_reqs[0].num_computed_tokens == 3 * BLOCK
            # Each stage got its own layer's bytes (names carry the layer).
            assert_reads_exact(e, "again", PROMPT, list(e.kv), range(3))
        stats = [tierkv.connect(d.socket, namespace=f"m-pp{s}",
                                token=TOKEN).stats() for s in range(2)]
        assert all(s for s in stats)


# ---- failures ----


def run_with_failure(dsv32, daemon, policy, fault):
    """Serves PROMPT (stored already) on a new engine with `fault` applied
    after the scheduler matched and before the worker loads."""
    engine = Engine(dsv32, extra(daemon), failure_policy=policy)
    engine.add("r", PROMPT, max_tokens=3)
    out = engine.step(between=lambda out: fault())
    assert out.scheduled_new_reqs[0].num_computed_tokens == 3 * BLOCK
    loaded = set(out.kv_connector_metadata.loads[0].blocks)
    assert engine.last_kv_output.invalid_block_ids == loaded
    return engine


def evict_everything(daemon):
    """Fills the namespace's DRAM with other pages: LRU drops PROMPT's."""
    with tierkv.connect(daemon.socket, namespace="default", token=TOKEN) as c:
        layout = c.layout
        filler = tierkv.page_hashes(np.arange(64 * BLOCK, dtype=np.uint32) + 5000,
                                    BLOCK, namespace="default")
        for layer, parts in enumerate(layout.layers):
            for part, bpt in parts:
                data = np.zeros((len(filler), bpt * BLOCK), dtype=np.uint8)
                c.put(filler, layer, part, data, check_items=False)


@pytest.fixture
def volatile_daemon(tmp_path):
    """DRAM only (4 MiB), so evicted or restarted means gone."""
    d = Tierkvd(tmp_path / "volatile", f"""
[[namespace]]
name = "default"
token = "{TOKEN}"
host_bytes = "4MiB"
shards = 1
""")
    d.start()
    yield d
    d.stop()


@pytest.mark.parametrize("fault", ["evicted", "restarted", "killed"])
def test_a_page_that_cannot_be_loaded_is_recomputed(dsv32, volatile_daemon,
                                                     fault):
    d = volatile_daemon
    action = {"evicted": lambda: evict_everything(d),
              "restarted": lambda: (d.stop(), d.start()),
              "killed": lambda: d.stop(signal.SIGKILL)}[fault]
    store(Engine(dsv32, extra(d)))
    engine = run_with_failure(dsv32, d, "recompute", action)
    # vLLM rescheduled the request from the first bad block: the next step
    # computes the prompt itself, and the request finishes normally.
    out = engine.step()
    assert out.num_scheduled_tokens["r"] == len(PROMPT)
    outputs = engine.run()
    assert [str(o.finish_reason) for o in outputs if o.finished] == ["length"]
    stats = engine.worker.get_kv_connector_stats()
    print(f"{fault}: recomputed; invalid blocks reported, then "
          f"{[str(o.finish_reason) for o in outputs if o.finished]}")
    assert stats is None or stats.data["load_failed_pages"] == 0


def test_a_corrupt_nvme_copy_is_recomputed(dsv32, daemon):
    # Pages only on NVMe (DRAM lost with a restart), whose bytes then rot:
    # Match still finds them (it reads the catalog); their checksums fail
    # when read, so tierkvd serves no bad byte and the load fails.
    store(Engine(dsv32, extra(daemon)))
    daemon.stop()
    daemon.start()
    path = daemon.dir / "nvme.data"
    with open(path, "r+b") as f:
        for off in range(0, path.stat().st_size, 4096):
            f.seek(off)
            f.write(b"\xa5" * 64)
        os.fsync(f.fileno())
    engine = run_with_failure(dsv32, daemon, "recompute", lambda: None)
    engine.run()
    assert [str(o.finish_reason) for o in engine.outputs if o.finished] == [
        "length"]
    with tierkv.connect(daemon.socket, namespace="default", token=TOKEN) as c:
        assert c.stats()["nvme"]["checksum_failures"] > 0


def test_the_fail_policy_ends_only_that_request(dsv32, volatile_daemon):
    d = volatile_daemon
    store(Engine(dsv32, extra(d)))
    engine = run_with_failure(dsv32, d, "fail", lambda: evict_everything(d))
    finished = [o for o in engine.outputs if o.finished]
    assert [str(o.finish_reason) for o in finished] == ["error"]
    # The engine goes on serving.
    engine.add("next", [9] * (BLOCK + 3))
    engine.run()
    assert engine.outputs[-1].finished


def test_tierkvd_down_means_no_hits_and_the_engine_serves_on(
        dsv32, volatile_daemon):
    d = volatile_daemon
    engine = Engine(dsv32, extra(d))
    d.stop(signal.SIGKILL)
    engine.add("r", PROMPT)
    out = engine.step()
    assert out.scheduled_new_reqs[0].num_computed_tokens == 0
    engine.run()
    # It comes back: the scheduler and worker reconnect (and re-register the
    # layout); the next prompt is saved and found again.
    d.start()
    engine.add("r2", PROMPT[:2 * BLOCK + 1])
    engine.run()
    other = Engine(dsv32, extra(d))
    other.add("r3", PROMPT[:2 * BLOCK + 1])
    assert other.step().scheduled_new_reqs[0].num_computed_tokens == 2 * BLOCK


def test_connector_metrics_reach_prometheus_families():
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    registry = CollectorRegistry()

    def bound(cls):
        class Bound(cls):
            def __init__(self, *a, **kw):
                super().__init__(*a, registry=registry, **kw)
        return Bound

    vc = types_config()
    metrics = TierkvConnector.build_prom_metrics(
        vc, {Gauge: bound(Gauge), Counter: bound(Counter),
             Histogram: bound(Histogram)}, ["engine"], {0: ["0"]})
    stats = TierkvConnector.build_kv_connector_stats(
        {"load_pages": 3, "load_bytes": 1000})
    metrics.observe(stats.data, 0)
    assert registry.get_sample_value("vllm:tierkv_load_pages_total",
                                     {"engine": "0"}) == 3
    assert TierkvConnector.requires_piecewise_for_cudagraph({})


def types_config():
    from types import SimpleNamespace
    return SimpleNamespace(kv_transfer_config=SimpleNamespace(
        kv_connector_extra_config={}))
