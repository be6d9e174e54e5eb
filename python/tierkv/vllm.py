"""tierkv as a vLLM KV connector (vllm 0.33.0, KVConnectorBase_V1).

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "TierkvConnector",
        "kv_connector_module_path": "tierkv.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"socket": "/run/tierkv/tierkv.sock",
            "namespace": "default", "token_file": "/run/tierkv/default.token"}}'

Why this interface and not the offloading path (OffloadingConnector with a
SecondaryTierManager): tierkv moves KV layer by layer. The V1 connector's
worker side is called per layer (wait_for_layer_load before a layer's
attention, save_kv_layer after it), so tierkv's loads overlap the model's
compute exactly as in tierkv's own executor, and the scheduler side asks
tierkvd how many leading tokens are stored (one Match) before it allocates.
The offloading path runs in the scheduler process over a shared-memory
primary tier and moves whole blocks between steps: a second copy of what
tierkvd's host tier already is.

What is stored. Every full block of a prompt (block_size tokens = one tierkv
page) of every KV cache layer vLLM registers: for DeepSeek-V3.2 / GLM-5 the
MLA latent cache `model.layers.{i}.self_attn.attn` (part "kv") *and* the
DSA indexer key cache `model.layers.{i}.self_attn.indexer.k_cache` (part
"indexer.k_cache") of the same layer i, so index keys can never be missing
after a hit (LMCache#5002). Pages are named by tierkv's own prefix-hash
chain over the prompt's token ids (salted with the LoRA name and
cache_salt), so they are shared with every other tierkv user of the
namespace (tierkv-run, SGLang on the same tokens) and independent of vLLM's
prefix-caching hash settings. Multimodal prompts are neither matched nor
stored (their placeholder tokens do not name the image).

Data path. Blocks move between tierkvd and vLLM's KV tensors by address:
CPU tensors directly, GPU tensors through a host staging buffer (tierkv's
HBM tier, with CUDA IPC, is later work). Loads run on a background thread
in layer order while the model computes earlier layers (ctypes releases the
GIL); saves are queued per layer and wait_for_save waits for them.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

import tierkv

try:
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(f"tierkv.vllm needs vLLM (pip install vllm): {e}")

logger = logging.getLogger(__name__)

_LAYER = re.compile(r"^(.*?layers\.)(\d+)\.(.+)$")


@dataclass
class _Transfer:
    """Pages of one request and the vLLM blocks they go to or come from."""

    req_id: str
    pages: np.ndarray  # (n, 2) uint64
    blocks: List[int]


@dataclass
class TierkvConnectorMetadata(KVConnectorMetadata):
    loads: List[_Transfer] = field(default_factory=list)
    saves: List[_Transfer] = field(default_factory=list)


def layer_parts(names: List[str]) -> Dict[str, Tuple[int, str]]:
    """Maps vLLM KV cache layer names to tierkv (layer, part name):
    `model.layers.7.self_attn.attn` -> (7, "kv"),
    `model.layers.7.self_attn.indexer.k_cache` -> (7, "indexer.k_cache").
    Names without a layer number get layers after the numbered ones."""
    out: Dict[str, Tuple[int, str]] = {}
    unnumbered = []
    for name in names:
        m = _LAYER.match(name)
        if m is None:
            unnumbered.append(name)
            continue
        rest = m.group(3)
        part = "kv" if rest.endswith("attn") and "indexer" not in rest else rest
        part = part.split("self_attn.", 1)[-1]
        out[name] = (int(m.group(2)), part)
    base = max((l for l, _ in out.values()), default=-1) + 1
    for i, name in enumerate(sorted(unnumbered)):
        out[name] = (base + i, "kv")
    return out


class TierkvConnector(KVConnectorBase_V1):
    """vLLM KV connector on tierkvd (see the module docstring)."""

    def __init__(self, vllm_config, role: KVConnectorRole,
                 kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        self.block_size = int(vllm_config.cache_config.block_size)
        self.namespace = str(extra.get("namespace", "default"))
        self.client = tierkv.connect(
            extra.get("socket", "/run/tierkv/tierkv.sock"),
            namespace=self.namespace, token=extra.get("token"),
            token_file=extra.get("token_file",
                                 f"/run/tierkv/{self.namespace}.token"),
            timeout=float(extra.get("timeout_s", 10.0)))
        self.root = tierkv.root_page_hash(self.namespace)
        model = getattr(vllm_config.model_config, "model", "")
        self.salt_base = str(extra.get("salt", model))
        # Scheduler side: per request, its pages and how many are saved.
        self._pages: Dict[str, np.ndarray] = {}
        self._saved: Dict[str, int] = {}
        self._matched: Dict[str, int] = {}  # leading pages tierkv holds
        self._pending_loads: Dict[str, _Transfer] = {}
        self._warned_no_layout = False
        # Worker side.
        self._caches: Dict[str, "torch.Tensor"] = {}
        self._parts: Dict[str, Tuple[int, int]] = {}  # name -> (layer, part)
        self._loaded: Dict[str, threading.Event] = {}
        self._load_error: Optional[BaseException] = None
        self._saves: "queue.Queue" = queue.Queue()
        self._save_thread: Optional[threading.Thread] = None
        self._save_errors: List[BaseException] = []

    # ---- page naming (both sides) ----

    def _request_pages(self, request) -> Optional[np.ndarray]:
        if getattr(request, "mm_features", None):
            return None  # multimodal: token ids do not name the content
        tokens = request.prompt_token_ids or []
        lora = getattr(getattr(request, "lora_request", None), "lora_name", "")
        salt = f"{self.salt_base}|{lora or ''}|{request.cache_salt or ''}"
        return tierkv.page_hashes(np.asarray(tokens, dtype=np.uint32),
                                  self.block_size, root=self.root,
                                  salt=salt.encode())

    # ---- scheduler side ----

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        pages = self._request_pages(request)
        if pages is None or len(pages) == 0:
            return 0, False
        self._pages[request.request_id] = pages
        # vLLM must compute at least the prompt's last token itself.
        usable = min(len(pages), (len(request.prompt_token_ids) - 1) //
                     self.block_size)
        try:
            hit = self.client.match(pages[:usable]).leading_pages
        except tierkv.InvalidArgumentError as e:
            if not self._warned_no_layout:  # no worker registered yet
                logger.warning("tierkv: no match (%s)", e)
                self._warned_no_layout = True
            return 0, False
        except tierkv.TierkvError as e:
            logger.warning("tierkv: match failed, computing instead: %s", e)
            return 0, False
        self._matched[request.request_id] = hit
        matched = hit * self.block_size
        return max(0, matched - num_computed_tokens), False

    def update_state_after_alloc(self, request, blocks,
                                 num_external_tokens: int):
        if num_external_tokens <= 0:
            return
        pages = self._pages[request.request_id]
        block_ids = blocks.get_block_ids()[0]
        # The external tokens are the last ones tierkv matched: pages
        # [hit - count, hit). (Derived from the match, not from
        # request.num_computed_tokens, which the scheduler may not have
        # advanced past the locally cached prefix yet.)
        count = num_external_tokens // self.block_size
        first = self._matched.get(request.request_id, 0) - count
        if first < 0:  # not what get_num_new_matched_tokens answered
            logger.warning("tierkv: %s: %d external tokens beyond the %d "
                           "matched pages; not loading", request.request_id,
                           num_external_tokens,
                           self._matched.get(request.request_id, 0))
            return
        self._pending_loads[request.request_id] = _Transfer(
            request.request_id, pages[first:first + count],
            list(block_ids[first:first + count]))
        # Loaded pages are stored already: never save them again.
        self._saved[request.request_id] = first + count

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
            full = min(len(pages), done // self.block_size)
            start = self._saved.get(req_id, 0)
            if full <= start:
                continue
            blocks = self._block_ids(req_id)
            if blocks is None or len(blocks) < full:
                continue
            meta.saves.append(_Transfer(req_id, pages[start:full],
                                        list(blocks[start:full])))
            self._saved[req_id] = full
        return meta

    def _block_ids(self, req_id: str) -> Optional[List[int]]:
        manager = self._kv_cache_manager
        if manager is None:
            return None
        return list(manager.get_block_ids(req_id)[0])

    def request_finished(self, request, block_ids):
        self._pages.pop(request.request_id, None)
        self._saved.pop(request.request_id, None)
        self._matched.pop(request.request_id, None)
        self._pending_loads.pop(request.request_id, None)
        return False, None  # saves finished within the step: blocks free

    # ---- worker side ----

    def register_kv_caches(self, kv_caches: Dict[str, "torch.Tensor"]):
        mapping = layer_parts(list(kv_caches))
        layers: Dict[int, Dict[str, int]] = {}
        for name, tensor in kv_caches.items():
            block = tensor[0]
            if not block.is_contiguous():
                raise ValueError(
                    f"tierkv: a block of {name} is not contiguous (shape "
                    f"{tuple(tensor.shape)}, strides {tensor.stride()}); use a "
                    f"block-major KV cache layout")
            block_bytes = block.numel() * block.element_size()
            if block_bytes % self.block_size:
                raise ValueError(f"tierkv: {name}: {block_bytes} bytes per "
                                 f"block for {self.block_size} tokens")
            layer, part = mapping[name]
            layers.setdefault(layer, {})[part] = block_bytes // self.block_size
        order = sorted(layers)
        spec = []
        for layer in order:
            parts = sorted(layers[layer].items(), key=lambda p: (p[0] != "kv",
                                                                  p[0]))
            spec.append(parts)
        self.layout = tierkv.Layout.of(self.block_size, spec)
        self.client.register_layout(self.layout)
        for name, tensor in kv_caches.items():
            layer, part = mapping[name]
            l = order.index(layer)
            self._parts[name] = (l, self.layout.part_index(l, part))
            self._caches[name] = tensor
        # Layers in model order: loads go in this order.
        self._layer_order = sorted(kv_caches, key=lambda n: self._parts[n])

    def _addresses(self, name: str, blocks: List[int]):
        t = self._caches[name]
        stride = t.stride(0) * t.element_size()
        size = t[0].numel() * t.element_size()
        base = t.data_ptr()
        return (base + stride * np.asarray(blocks, dtype=np.uint64),
                np.full(len(blocks), size, dtype=np.uint64), size)

    def _move(self, name: str, transfers: List[_Transfer], load: bool) -> None:
        if not transfers:
            return
        pages = np.concatenate([t.pages for t in transfers])
        blocks = [b for t in transfers for b in t.blocks]
        layer, part = self._parts[name]
        tensor = self._caches[name]
        if tensor.device.type == "cpu":
            addrs, sizes, _ = self._addresses(name, blocks)
            if load:
                st = self.client.get_raw(pages, layer, part, addrs, sizes)
            else:
                _, st = self.client.put_raw(pages, layer, part, addrs, sizes)
        else:  # device memory: through a pinned host copy
            index = torch.as_tensor(blocks, device=tensor.device)
            if load:
                host = torch.empty((len(blocks),) + tuple(tensor.shape[1:]),
                                   dtype=tensor.dtype, pin_memory=True)
                st = self.client.get(pages, layer, part,
                                     host.view(torch.uint8).view(
                                         len(blocks), -1).numpy())
                tensor.index_copy_(0, index, host.to(tensor.device))
            else:
                host = tensor.index_select(0, index).cpu()
                _, st = self.client.put(pages, layer, part,
                                        host.view(torch.uint8).view(
                                            len(blocks), -1).numpy(),
                                        check_items=False)
        bad = np.nonzero(st)[0]
        if load and len(bad):
            raise tierkv.errors.error_for(
                int(st[bad[0]]), f"tierkv: loading {name}: {len(bad)} of "
                f"{len(st)} pages failed", st, int(bad[0]))
        if not load and len(bad):  # a lost save is a future miss, not an error
            logger.warning("tierkv: %d of %d pages of %s not saved (%s)",
                           len(bad), len(st), name, tierkv.errors.error_for(
                               int(st[bad[0]]), "").code)

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        loads = meta.loads if isinstance(meta, TierkvConnectorMetadata) else []
        self._loaded = {name: threading.Event() for name in self._layer_order}
        self._load_error = None
        if not loads:
            for event in self._loaded.values():
                event.set()
            return

        def run():
            try:
                for name in self._layer_order:
                    self._move(name, loads, load=True)
                    self._loaded[name].set()
            except BaseException as e:  # noqa: BLE001 - re-raised in wait
                self._load_error = e
                for event in self._loaded.values():
                    event.set()

        threading.Thread(target=run, name="tierkv-load", daemon=True).start()

    def wait_for_layer_load(self, layer_name: str) -> None:
        event = self._loaded.get(layer_name)
        if event is None:
            return
        event.wait()
        if self._load_error is not None:
            raise self._load_error

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata,
                      **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if not isinstance(meta, TierkvConnectorMetadata) or not meta.saves:
            return
        if layer_name not in self._caches:
            return
        if self._save_thread is None:
            self._save_thread = threading.Thread(
                target=self._save_loop, name="tierkv-save", daemon=True)
            self._save_thread.start()
        self._saves.put((layer_name, meta.saves))

    def _save_loop(self) -> None:
        while True:
            item = self._saves.get()
            try:
                if item is not None:
                    self._move(item[0], item[1], load=False)
            except BaseException as e:  # noqa: BLE001 - reported in wait
                self._save_errors.append(e)
            finally:
                self._saves.task_done()

    def wait_for_save(self):
        self._saves.join()
        if self._save_errors:
            errors, self._save_errors = self._save_errors, []
            logger.warning("tierkv: %d layer saves failed: %s", len(errors),
                           errors[0])

    def shutdown(self):
        self.client.close()
