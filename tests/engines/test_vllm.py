"""tierkv.vllm.TierkvConnector loaded by vLLM's own factory from
kv_connector_module_path, driven by vLLM's real Scheduler on CPU (scheduler
side) and handed KV caches laid out by vLLM's real planner for a
DeepSeek-V3.2 model, MLA latent and DSA indexer caches alike (worker side),
moving blocks through a real tierkvd bit-exact, across a daemon restart."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler",
                    reason="vLLM 0.33.0 does not import here "
                           "(scripts/engines-venv.sh)")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig,  # noqa: E402
                         ModelConfig, SchedulerConfig, VllmConfig,
                         set_current_vllm_config)
from vllm.distributed.kv_transfer.kv_connector.factory import (  # noqa: E402
    KVConnectorFactory)
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorRole)
from vllm.model_executor.models.deepseek_v2 import (  # noqa: E402
    DeepseekV32IndexerCache)
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_planning import (  # noqa: E402
    get_global_kv_cache_groups, get_kv_cache_configs)
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    get_request_block_hasher, init_none_hash)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec, MLAAttentionSpec,
                                        get_kv_quant_mode)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402
from vllm.v1.worker.utils import allocate_kv_cache  # noqa: E402

from conftest import TOKEN  # noqa: E402
from tierkv.vllm import TierkvConnector, layer_parts  # noqa: E402

BLOCK, LAYERS = 64, 2
# A DeepSeek-V3.2-shaped config.json (no weights: the scheduler and the KV
# planner need only the architecture).
TINY_DSV32 = {
    "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
    "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
    "num_hidden_layers": LAYERS, "first_k_dense_replace": LAYERS,
    "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 4,
    "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 1,
    "topk_group": 1, "routed_scaling_factor": 1.0, "q_lora_rank": 64,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "index_topk": 2048, "index_n_heads": 64,
    "index_head_dim": 128, "vocab_size": 1024, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
    "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc"}


class Engine:
    """One vLLM instance: its config, Scheduler (scheduler-side connector),
    KV caches and worker-side connector."""

    def __init__(self, model_dir, daemon):
        mc = ModelConfig(model=str(model_dir), dtype="bfloat16", seed=0,
                         skip_tokenizer_init=True, max_model_len=4096)
        cc = CacheConfig(block_size=BLOCK, cache_dtype="fp8_ds_mla",
                         enable_prefix_caching=True)
        self.vc = VllmConfig(
            model_config=mc, cache_config=cc, device_config=DeviceConfig("cpu"),
            scheduler_config=SchedulerConfig(
                max_num_seqs=4, max_num_batched_tokens=1024,
                max_model_len=4096, is_encoder_decoder=False),
            kv_transfer_config=KVTransferConfig(
                kv_connector="TierkvConnector",
                kv_connector_module_path="tierkv.vllm", kv_role="kv_both",
                kv_connector_extra_config={"socket": daemon.socket,
                                           "namespace": "default",
                                           "token": TOKEN}))
        specs = {}
        with set_current_vllm_config(self.vc):
            for i in range(LAYERS):
                indexer = DeepseekV32IndexerCache(
                    head_dim=132, dtype=torch.uint8, cache_config=cc,
                    prefix=f"model.layers.{i}.self_attn.indexer.k_cache")
                specs[indexer.prefix] = indexer.get_kv_cache_spec(self.vc)
                # As MLAAttention.get_kv_cache_spec for fp8_ds_mla (656 B).
                specs[f"model.layers.{i}.self_attn.attn"] = MLAAttentionSpec(
                    block_size=BLOCK, num_kv_heads=1, max_tp_shards=1,
                    head_size=576, dtype=torch.uint8,
                    cache_dtype_str="fp8_ds_mla",
                    kv_quant_mode=get_kv_quant_mode("fp8_ds_mla"),
                    state_content_bytes=656, is_index_group_leader=True)
        self.vc.cache_config.kv_cache_layout = "LBNHC"
        groups = get_global_kv_cache_groups(self.vc, [specs])
        self.kv_cache_config = get_kv_cache_configs(
            self.vc, [specs], [32 << 20], groups)[0]
        self.kv = allocate_kv_cache(
            self.kv_cache_config, torch.device("cpu"),
            self.vc.cache_config.get_resolved_kv_cache_layout())
        blocks = self.kv_cache_config.num_blocks
        self.vc.cache_config.num_gpu_blocks = blocks
        # The Scheduler's block allocator takes one spec per group (it has
        # no manager for the planner's UniformTypeKVCacheSpecs); the block
        # ids it hands out index every layer of the group alike.
        leader = specs["model.layers.0.self_attn.attn"]
        self.scheduler = Scheduler(
            vllm_config=self.vc, kv_cache_config=KVCacheConfig(
                num_blocks=blocks, kv_cache_tensors=[],
                kv_cache_groups=[KVCacheGroupSpec(list(specs), leader)]),
            structured_output_manager=StructuredOutputManager(self.vc),
            block_size=BLOCK, log_stats=True)
        self.worker = KVConnectorFactory.create_connector(
            self.vc, KVConnectorRole.WORKER, self.kv_cache_config)
        self.worker.register_kv_caches(self.kv)

    def step(self, compute=None):
        """One engine step: schedule, run the worker-side connector around
        a 'forward pass' (compute(blocks) fills the computed blocks), and
        feed a sampled token back."""
        out = self.scheduler.schedule()
        w = self.worker
        w.bind_connector_metadata(out.kv_connector_metadata)
        w.start_load_kv(None)
        for name in self.kv:
            w.wait_for_layer_load(name)
            if compute is not None:
                compute(name, out)
            w.save_kv_layer(name, self.kv[name], None)
        w.wait_for_save()
        w.clear_connector_metadata()
        ids = list(out.num_scheduled_tokens)
        self.scheduler.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[[7] for _ in ids], logprobs=None,
            prompt_logprobs_dict={}, pooler_output=None))
        return out

    def blocks_of(self, req_id):
        return list(self.scheduler.kv_cache_manager.get_block_ids(req_id)[0])


def request(req_id, tokens):
    init_none_hash(sha256)
    sp = SamplingParams(max_tokens=2)
    sp.update_from_generation_config({}, 1)
    return Request(request_id=req_id, prompt_token_ids=tokens,
                   sampling_params=sp, pooling_params=None, mm_features=None,
                   block_hasher=get_request_block_hasher(BLOCK, sha256))


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "tiny-dsv32"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY_DSV32))
    return d


PROMPT = [int(x) for x in np.random.default_rng(7).integers(2, 1000, 3 * BLOCK + 10)]


def compute_and_store(engine, req_id, prompt):
    """Runs `prompt` on `engine`, whose 'forward pass' fills each newly
    scheduled block with random bytes; the connector saves the full prompt
    blocks. Returns ({(layer name, block): bytes}, the prompt's blocks)."""
    rng = np.random.default_rng(1)
    written = {}

    def compute(name, out):
        for rid in out.num_scheduled_tokens:
            for b in engine.blocks_of(rid):
                if (name, b) not in written:
                    block = engine.kv[name][b].view(torch.uint8).view(-1)
                    data = torch.from_numpy(rng.integers(
                        0, 256, block.numel(), dtype=np.uint8))
                    block.copy_(data)
                    written[name, b] = data.clone()

    engine.scheduler.add_request(request(req_id, prompt))
    out = engine.step(compute)
    assert out.scheduled_new_reqs[0].num_computed_tokens == 0  # cold
    saves = out.kv_connector_metadata.saves
    assert [len(t.pages) for t in saves] == [len(prompt) // BLOCK]
    blocks = engine.blocks_of(req_id)[:len(prompt) // BLOCK]
    while engine.scheduler.has_unfinished_requests():
        engine.step()
    return written, blocks


def test_layer_names_map_to_kv_and_index_key_parts():
    m = layer_parts(["model.layers.0.self_attn.attn",
                     "model.layers.0.self_attn.indexer.k_cache",
                     "model.layers.12.self_attn.attn"])
    assert m == {"model.layers.0.self_attn.attn": (0, "kv"),
                 "model.layers.0.self_attn.indexer.k_cache":
                     (0, "indexer.k_cache"),
                 "model.layers.12.self_attn.attn": (12, "kv")}


def test_scheduler_matches_what_another_engine_stored_and_loads_it_bit_exact(
        model_dir, daemon):
    first = Engine(model_dir, daemon)
    assert isinstance(first.scheduler.connector, TierkvConnector)
    assert isinstance(first.worker, TierkvConnector)
    # The layout registered for both caches of each layer: latent + index.
    assert first.worker.layout.layers[0] == (("kv", 656),
                                             ("indexer.k_cache", 132))
    written, first_blocks = compute_and_store(first, "r1", PROMPT)

    # A second engine (another process, say) with empty KV caches.
    second = Engine(model_dir, daemon)
    second.scheduler.add_request(request("r2", PROMPT))
    out = second.step()
    assert out.scheduled_new_reqs[0].num_computed_tokens == 3 * BLOCK
    loads = out.kv_connector_metadata.loads
    assert [len(t.pages) for t in loads] == [3]
    for name in second.kv:
        for src, dst in zip(first_blocks, loads[0].blocks):
            got = second.kv[name][dst].view(torch.uint8).view(-1)
            assert torch.equal(got, written[name, src]), (name, src, dst)

    # tierkvd restarted between store and load: NVMe (write_through) hits.
    daemon.stop()
    daemon.start()
    third = Engine(model_dir, daemon)
    third.scheduler.add_request(request("r3", PROMPT + [5, 6]))
    out = third.step()
    assert out.scheduled_new_reqs[0].num_computed_tokens == 3 * BLOCK
    loads = out.kv_connector_metadata.loads
    name = "model.layers.1.self_attn.indexer.k_cache"
    for src, dst in zip(first_blocks, loads[0].blocks):
        assert torch.equal(third.kv[name][dst].view(torch.uint8).view(-1),
                           written[name, src])


def test_a_local_prefix_hit_loads_only_the_pages_after_it(model_dir, daemon):
    # Engine 2 has block 0 in its own prefix cache (from a shorter request)
    # and tierkv holds blocks 0-2: only pages 1 and 2 come from tierkv, into
    # the request's blocks 1 and 2.
    written, first_blocks = compute_and_store(Engine(model_dir, daemon), "r1",
                                              PROMPT)
    second = Engine(model_dir, daemon)
    second.scheduler.add_request(request("warm", PROMPT[:BLOCK + 5]))
    while second.scheduler.has_unfinished_requests():
        second.step()
    second.scheduler.add_request(request("full", PROMPT))
    out = second.step()
    assert out.scheduled_new_reqs[0].num_computed_tokens == 3 * BLOCK
    loads = out.kv_connector_metadata.loads
    assert [len(t.pages) for t in loads] == [2]
    blocks = second.blocks_of("full")
    assert loads[0].blocks == blocks[1:3]
    for name in second.kv:
        for src, dst in zip(first_blocks[1:3], blocks[1:3]):
            got = second.kv[name][dst].view(torch.uint8).view(-1)
            assert torch.equal(got, written[name, src]), (name, src, dst)


def test_a_prompt_shorter_than_a_block_or_unknown_matches_nothing(
        model_dir, daemon):
    engine = Engine(model_dir, daemon)
    engine.scheduler.add_request(request("short", PROMPT[:BLOCK - 1]))
    engine.scheduler.add_request(request("new", [3] * (2 * BLOCK + 1)))
    out = engine.step()
    assert {r.req_id: r.num_computed_tokens
            for r in out.scheduled_new_reqs} == {"short": 0, "new": 0}
    assert out.kv_connector_metadata.loads == []
