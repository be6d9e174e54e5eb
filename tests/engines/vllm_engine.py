"""A vLLM 0.33.0 engine without a model, for the connector tests: vLLM's real
Scheduler (scheduler-side connector), KV caches laid out by vLLM's real
planner, and a worker step that runs vLLM's own connector plumbing around a
stand-in forward pass:

- `KVConnectorModelRunnerMixin._get_kv_connector_output`
  (vllm/v1/worker/kv_connector_model_runner_mixin.py:66-105), the context
  manager the GPU model runner wraps its forward pass in: it binds the
  metadata, calls start_load_kv before the forward when the step has sync
  loads (after it otherwise), wait_for_save, get_block_ids_with_load_errors,
  get_kv_connector_stats;
- inside it, per layer in model order, what a DeepSeek-V3.2 decoder layer
  does (vllm/model_executor/layers/mla.py:232-244): the DSA indexer first
  (`Indexer.forward`, deepseek_v2.py:766; it reads the layer's indexer key
  cache and writes the new tokens' keys; no connector hook), then the MLA op,
  a function decorated with vLLM's real `maybe_transfer_kv_layer`
  (kv_transfer_utils.py:15; as `unified_mla_attention_with_output`,
  mla_attention.py:1485), which calls wait_for_layer_load on entry and
  save_kv_layer on exit;
- the scheduler then takes the worker's KVConnectorOutput
  (invalid_block_ids) in update_from_output, as EngineCore does.

The 'forward pass' writes each new block of each cache with bytes that are a
function of the block's token prefix and the cache's name (`block_bytes`), and
records what every cache read for the tokens it did not compute: so a test
can check that loaded KV and indexer keys were bit-exact *when read*.
"""

from __future__ import annotations

import hashlib
import types
from typing import Callable, Dict, List, Optional

import numpy as np
import torch
from vllm import SamplingParams
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig,
                         ModelConfig, ParallelConfig, SchedulerConfig,
                         VllmConfig, set_current_vllm_config)
from vllm.distributed.kv_transfer import kv_transfer_state
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.forward_context import set_forward_context
from vllm.model_executor.layers.attention.kv_transfer_utils import (
    maybe_transfer_kv_layer)
from vllm.model_executor.models.deepseek_v2 import DeepseekV32IndexerCache
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_planning import (get_global_kv_cache_groups,
                                            get_kv_cache_configs)
from vllm.v1.core.kv_cache_utils import (get_request_block_hasher,
                                         init_none_hash)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                        KVCacheGroupSpec, MLAAttentionSpec,
                                        get_kv_quant_mode)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.worker.kv_connector_model_runner_mixin import (
    KVConnectorModelRunnerMixin)
from vllm.v1.worker.utils import allocate_kv_cache

BLOCK = 64

# A DeepSeek-V3.2-shaped config.json (no weights: the scheduler and the KV
# planner need only the architecture).
TINY_DSV32 = {
    "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
    "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
    "num_hidden_layers": 2, "first_k_dense_replace": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 4,
    "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 1,
    "topk_group": 1, "routed_scaling_factor": 1.0, "q_lora_rank": 64,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "index_topk": 2048, "index_n_heads": 64,
    "index_head_dim": 128, "vocab_size": 1024, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
    "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc"}

# A Llama-shaped config (MHA/GQA: each TP rank holds its own KV heads).
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64,
    "vocab_size": 1024, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
    "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False}


def block_bytes(prompt: List[int], block: int, name: str, n: int) -> torch.Tensor:
    """The bytes a cache holds for block `block` of `prompt`: a function of
    the tokens up to the block's end and of the cache, like real KV."""
    seed = hashlib.sha256(np.asarray(prompt[:(block + 1) * BLOCK], np.uint32)
                          .tobytes() + name.encode()).digest()
    rng = np.random.default_rng(int.from_bytes(seed[:8], "little"))
    return torch.from_numpy(rng.integers(0, 256, n, dtype=np.uint8))


def block_view(cache: torch.Tensor, block: int) -> torch.Tensor:
    """Block `block` of a cache as its bytes, in memory order (a writable
    view: the head-major [B, H, N, C] layouts are not contiguous
    logically)."""
    t = cache[block]
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    dense = t.permute(order)
    assert dense.is_contiguous(), (tuple(t.shape), t.stride())
    return dense.view(torch.uint8).view(-1)


def request(req_id: str, tokens: List[int], max_tokens: int = 2) -> Request:
    init_none_hash(sha256)
    sp = SamplingParams(max_tokens=max_tokens)
    sp.update_from_generation_config({}, 1)
    return Request(request_id=req_id, prompt_token_ids=tokens,
                   sampling_params=sp, pooling_params=None, mm_features=None,
                   block_hasher=get_request_block_hasher(BLOCK, sha256))


class Engine:
    """One vLLM engine (one worker): config, Scheduler and its connector,
    KV caches and the worker's connector."""

    def __init__(self, model_dir, extra: Dict, *, mla: bool = True,
                 tp: int = 1, pp: int = 1, rank: int = 0,
                 failure_policy: str = "recompute",
                 layers: Optional[List[int]] = None, content_tag: str = ""):
        # content_tag: appended to cache names in block_bytes, so that TP
        # ranks of an MHA model hold different bytes (their own heads).
        self.content_tag = content_tag
        mc = ModelConfig(model=str(model_dir), dtype="bfloat16", seed=0,
                         skip_tokenizer_init=True, max_model_len=4096)
        cc = CacheConfig(block_size=BLOCK,
                         cache_dtype="fp8_ds_mla" if mla else "auto",
                         enable_prefix_caching=True)
        pc = ParallelConfig(tensor_parallel_size=tp,
                            pipeline_parallel_size=pp)
        pc.rank = rank
        self.vc = VllmConfig(
            model_config=mc, cache_config=cc, device_config=DeviceConfig("cpu"),
            parallel_config=pc,
            scheduler_config=SchedulerConfig(
                max_num_seqs=4, max_num_batched_tokens=1024,
                max_model_len=4096, is_encoder_decoder=False),
            kv_transfer_config=KVTransferConfig(
                kv_connector="TierkvConnector",
                kv_connector_module_path="tierkv.vllm", kv_role="kv_both",
                kv_load_failure_policy=failure_policy,
                kv_connector_extra_config=extra))
        layers = list(range(2)) if layers is None else layers
        specs = {}
        self.attention_layers: List[str] = []
        self.indexer_layers: Dict[str, str] = {}  # attention -> indexer
        with set_current_vllm_config(self.vc):
            for i in layers:
                attn = f"model.layers.{i}.self_attn.attn"
                if mla:
                    indexer = DeepseekV32IndexerCache(
                        head_dim=132, dtype=torch.uint8, cache_config=cc,
                        prefix=f"model.layers.{i}.self_attn.indexer.k_cache")
                    specs[indexer.prefix] = indexer.get_kv_cache_spec(self.vc)
                    self.indexer_layers[attn] = indexer.prefix
                    # As MLAAttention.get_kv_cache_spec for fp8_ds_mla (656 B).
                    specs[attn] = MLAAttentionSpec(
                        block_size=BLOCK, num_kv_heads=1, max_tp_shards=1,
                        head_size=576, dtype=torch.uint8,
                        cache_dtype_str="fp8_ds_mla",
                        kv_quant_mode=get_kv_quant_mode("fp8_ds_mla"),
                        state_content_bytes=656, is_index_group_leader=True)
                else:  # this rank's 2 of 4 KV heads (TP 2)
                    specs[attn] = FullAttentionSpec(
                        block_size=BLOCK, num_kv_heads=4 // tp, head_size=64,
                        dtype=torch.bfloat16)
                self.attention_layers.append(attn)
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
        leader = specs[self.attention_layers[0]]
        self.scheduler = Scheduler(
            vllm_config=self.vc, kv_cache_config=KVCacheConfig(
                num_blocks=blocks, kv_cache_tensors=[],
                kv_cache_groups=[KVCacheGroupSpec(list(specs), leader)]),
            structured_output_manager=StructuredOutputManager(self.vc),
            block_size=BLOCK, log_stats=True)
        self.worker = KVConnectorFactory.create_connector(
            self.vc, KVConnectorRole.WORKER, self.kv_cache_config)
        self.worker.register_kv_caches(self.kv)
        # What get_attention_context (attention.py:685) looks up.
        for name in self.attention_layers:
            self.vc.compilation_config.static_forward_context[name] = (
                types.SimpleNamespace(kv_cache=self.kv[name]))
        self.prompts: Dict[str, List[int]] = {}
        self.reads: Dict[tuple, torch.Tensor] = {}  # (req, cache, block)
        self.outputs: List = []
        self.last_kv_output = None

    def add(self, req_id: str, prompt: List[int], max_tokens: int = 2):
        self.prompts[req_id] = prompt
        self.scheduler.add_request(request(req_id, prompt, max_tokens))

    def blocks_of(self, req_id: str) -> List[int]:
        return list(self.scheduler.kv_cache_manager.get_block_ids(req_id)[0])

    # ---- the stand-in forward pass ----

    def _cache_step(self, name: str, out) -> None:
        """One cache's work for a step: read the blocks of tokens computed
        before it (prefix cache or tierkv), then write the new ones."""
        cache = self.kv[name]
        computed = {r.req_id: r.num_computed_tokens
                    for r in out.scheduled_new_reqs}
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(getattr(cached, "req_ids", [])):
            computed[req_id] = cached.num_computed_tokens[i]
        for req_id, n in out.num_scheduled_tokens.items():
            prompt = self.prompts[req_id]
            blocks = self.blocks_of(req_id)
            done = computed[req_id]
            for b in range(done // BLOCK):
                self.reads[req_id, name, b] = block_view(cache,
                                                         blocks[b]).clone()
            for b in range(done // BLOCK, min(len(blocks),
                                               -(-(done + n) // BLOCK))):
                view = block_view(cache, blocks[b])
                view.copy_(block_bytes(prompt, b, name + self.content_tag,
                                       view.numel()))

    def step(self, between: Optional[Callable[[object], None]] = None):
        """One engine step. `between(scheduler_output)` runs after the
        scheduler's Match and allocation, before the worker's load."""
        out = self.scheduler.schedule()
        if between is not None:
            between(out)

        @maybe_transfer_kv_layer
        def mla_attention_op(output, layer_name):
            self._cache_step(layer_name, current_step)

        current_step = out
        saved_agent = kv_transfer_state._KV_CONNECTOR_AGENT
        kv_transfer_state._KV_CONNECTOR_AGENT = self.worker
        try:
            metadata = {name: object() for name in self.attention_layers}
            with set_forward_context(metadata, self.vc, slot_mapping={}):
                with KVConnectorModelRunnerMixin._get_kv_connector_output(
                        out) as kv_output:
                    for name in self.attention_layers:
                        indexer = self.indexer_layers.get(name)
                        if indexer is not None:  # no hook: just runs
                            self._cache_step(indexer, out)
                        mla_attention_op(None, name)
        finally:
            kv_transfer_state._KV_CONNECTOR_AGENT = saved_agent
        self.last_kv_output = kv_output
        ids = list(out.num_scheduled_tokens)
        result = self.scheduler.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[[7] for _ in ids], logprobs=None,
            prompt_logprobs_dict={}, pooler_output=None,
            kv_connector_output=kv_output))
        for engine_outputs in result.values():
            self.outputs.extend(engine_outputs.outputs)
        return out

    def run(self, between=None):
        """Steps until every request is finished; returns the outputs."""
        first = True
        while self.scheduler.has_unfinished_requests():
            self.step(between if first else None)
            first = False
        return self.outputs

    def shutdown(self):
        self.worker.shutdown()
        self.scheduler.connector.shutdown()
