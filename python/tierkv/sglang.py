"""tierkv as SGLang's HiCache L3 storage (sglang 0.5.23, HiCacheStorage).

Start SGLang with:

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "tierkv",
        "module_path": "tierkv.sglang", "class_name": "TierkvHiCacheStorage",
        "interface_v1": 1, "socket": "/run/tierkv/tierkv.sock",
        "namespace": "default", "token_file": "/run/tierkv/default.token"}'

How SGLang's pages become tierkv segments. SGLang names a page by a string
key (a chained hash of its tokens) and keeps it in one or more host pools:
`kv` always, `indexer` too for DSA models (DeepSeek-V3.2, GLM-5). Each pool
describes a page's bytes as a list of contiguous pieces
(`get_page_buffer_meta`: one piece per layer for the `layer_first` host
layout, one per page for `page_first`); a pool that cannot (the DSA indexer
pool in `layer_first`) is read whole through `get_data_page`. Piece j of pool
P is tierkv segment (page, layer j, part P), so the namespace layout is
derived from the pools themselves (layer j carries one part per pool with a
j-th piece) and tierkv's Match answers "all pools present" in one call. KV
and index keys are parts of the same tierkv page: they are stored, evicted,
persisted and found together (no empty index keys after a hit,
sgl-project/sglang#17085). Pieces move with zero copies in Python: Put reads
SGLang's pinned host memory in place and Get writes into it.

Keys. A page hash is BLAKE2b-128 of SGLang's key plus the same rank suffix
SGLang's own file backend uses (HiCacheFile): MLA KV is identical on every
TP rank, so MLA keys carry only the model and, with pipeline or context
parallelism, the stage and CP rank (TP ranks share pages: stored once);
non-MLA keys also carry tp_rank/tp_size. The namespace layout is per
pipeline stage: with pp_size > 1 give `namespace` a `{pp_rank}` field, e.g.
"glm5-pp{pp_rank}".

Persistence: pages reach NVMe when tierkvd evicts them (write_back) or at
once (write_through, or extra config `"flush": true`, which calls Flush
after every set); either way they survive a daemon restart.

Supported pools: `kv` and `indexer`, and speculative decoding's `draft` and
`draft_indexer` (EAGLE/MTP draft KV, stored as further parts of the same
page; hit policy all_pages). Pools whose pages are only needed at the tail
of a prefix (Mamba, SWA, draft_swa) or in block groups (DeepSeek-V4's
compressed pools) are refused at registration with a clear error; HiSparse
needs no L3 support (it serves from the host pool).

Metrics (`--enable-metrics`): get_stats() returns SGLang's StorageMetrics
(pages and GB/s of every get and set batch since the last call), which
SGLang's StorageMetricsCollector turns into its sglang:*storage* histograms.

Failures: a lost tierkvd is a miss (exists answers 0, get and set report
every page failed) while tierkv.session reconnects; SGLang recomputes.
clear() returns False: tierkvd has no operation that drops a namespace
(pages age out by eviction; restarting tierkvd without NVMe empties it).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Any, Dict, List, Optional

import numpy as np

import tierkv
from tierkv.session import Session, raise_if_disconnected

try:  # Imported lazily by SGLang's factory; fail with a clear message.
    from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage,
                                                      HiCacheStorageConfig,
                                                      HiCacheStorageExtraInfo,
                                                      PoolHitPolicy, PoolName,
                                                      PoolTransfer,
                                                      PoolTransferResult)
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(f"tierkv.sglang needs SGLang (pip install sglang): {e}")

import torch

logger = logging.getLogger(__name__)

KV = str(PoolName.KV)
SUPPORTED_POOLS = tuple(str(p) for p in (PoolName.KV, PoolName.INDEXER,
                                         PoolName.DRAFT,
                                         PoolName.DRAFT_INDEXER))


def page_hash_of(key: str, suffix: str) -> np.ndarray:
    """tierkv page hash (lo, hi) of SGLang key `key` on this rank."""
    digest = hashlib.blake2b((key + suffix).encode(), digest_size=16).digest()
    return np.frombuffer(digest, dtype="<u8").astype(np.uint64)


class _PoolGeometry:
    """How one host pool's page maps onto tierkv segments."""

    def __init__(self, name: str, pool: Any):
        self.name = name
        self.pool = pool
        self.page_size = int(getattr(pool, "page_size", 1) or 1)
        probe = torch.arange(0, self.page_size, dtype=torch.int64)
        try:
            _, sizes = pool.get_page_buffer_meta(probe)
            self.zero_copy = True
            self.piece_bytes = [int(s) for s in sizes]
        except (ValueError, NotImplementedError, AttributeError, AssertionError):
            # No pointer view for this layout: whole flat pages, copied.
            self.zero_copy = False
            dummy = pool.get_dummy_flat_data_page()
            self.piece_bytes = [dummy.numel() * dummy.element_size()]
        for size in self.piece_bytes:
            if size % self.page_size:
                raise ValueError(
                    f"tierkv: pool {name!r} has a {size}-byte piece, not a "
                    f"multiple of its page size {self.page_size}")

    @property
    def pieces(self) -> int:
        return len(self.piece_bytes)


class TierkvHiCacheStorage(HiCacheStorage):
    """HiCacheStorage on tierkvd. Thread-safe: SGLang calls it from its
    prefetch and backup threads at once; the tierkv client multiplexes."""

    def __init__(self, storage_config: HiCacheStorageConfig,
                 kwargs: Optional[dict] = None):
        extra = dict(storage_config.extra_config or {})
        self.config = storage_config
        self.flush = bool(extra.get("flush", False))
        namespace = str(extra.get("namespace", "default")).format(
            pp_rank=storage_config.pp_rank, tp_rank=storage_config.tp_rank)
        self.session = Session(
            extra.get("socket", "/run/tierkv/tierkv.sock"),
            namespace=namespace, token=extra.get("token"),
            token_file=extra.get("token_file",
                                 f"/run/tierkv/{namespace}.token"),
            timeout=float(extra.get("timeout_s", 10.0)),
            retry_s=float(extra.get("retry_s", 1.0)))
        self._metrics_lock = threading.Lock()
        self._metrics = self._new_metrics()
        self.namespace = namespace
        self.suffix = self._rank_suffix(storage_config)
        self._geometry: Dict[str, _PoolGeometry] = {}
        self._part_of: Dict[tuple, int] = {}  # (piece, pool) -> part index
        self._layout_lock = threading.Lock()
        self._layout_ready = False
        logger.info("tierkv HiCache storage: namespace %s, key suffix %r",
                    namespace, self.suffix)

    @staticmethod
    def _rank_suffix(c: HiCacheStorageConfig) -> str:
        # As sglang's HiCacheFile (hicache_storage.py): MLA KV is replicated
        # across TP ranks (one copy per page); other models shard heads.
        model = "-".join(c.model_name.split("/")) if c.model_name else ""
        shard = f"_{c.pp_size}_{c.pp_rank}" if c.pp_size > 1 else ""
        if c.attn_cp_size > 1:
            shard += f"_cp{c.attn_cp_rank}_{c.attn_cp_size}"
        if getattr(c, "dcp_size", 1) > 1:
            shard += (f"_tp{c.tp_size}_dcp{c.dcp_rank}_{c.dcp_size}"
                      f"_page{c.logical_page_size}")
        if c.is_mla_model:
            return f"_{model}{shard}"
        return f"_{model}_{c.tp_rank}_{c.tp_size}{shard}"

    # ---- pool registration and the namespace layout ----

    def register_mem_pool_host(self, mem_pool_host):
        super().register_mem_pool_host(mem_pool_host)
        self._add_pool(KV, mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        self._add_pool(str(host_pool_name), host_pool)

    def _add_pool(self, name: str, pool) -> None:
        if name not in SUPPORTED_POOLS:
            raise ValueError(
                f"tierkv HiCache storage does not support host pool {name!r}; "
                f"supported: {', '.join(SUPPORTED_POOLS)} (Mamba/SWA state and "
                f"DeepSeek-V4 compressed pools are not stored by tierkv yet)")
        with self._layout_lock:
            if self._layout_ready and name not in self._geometry:
                raise ValueError(f"tierkv: pool {name!r} registered after the "
                                 f"layout was fixed")
            if name not in self._geometry:  # the KV anchor comes twice
                self._geometry[name] = _PoolGeometry(name, pool)

    def on_host_pools_registered(self) -> None:
        self._ensure_layout()

    def _ensure_layout(self) -> None:
        with self._layout_lock:
            if self._layout_ready:
                return
            if KV not in self._geometry:
                raise RuntimeError("tierkv: no KV host pool registered")
            page_size = self._geometry[KV].page_size
            names = sorted(self._geometry, key=lambda n: (n != KV, n))
            layers = max(g.pieces for g in self._geometry.values())
            spec = []
            for j in range(layers):
                parts = []
                for name in names:
                    g = self._geometry[name]
                    if j < g.pieces:
                        if g.page_size != page_size:
                            raise ValueError(
                                f"tierkv: pool {name!r} has page size "
                                f"{g.page_size}, the KV pool {page_size}")
                        self._part_of[j, name] = len(parts)
                        parts.append((name, g.piece_bytes[j] // page_size))
                spec.append(parts)
            self.layout = tierkv.Layout.of(page_size, spec)
            # Identical re-registration is OK; a different one (another
            # model or host layout in the same namespace) is refused.
            self.session.register_layout(self.layout)
            self._layout_ready = True
            logger.info("tierkv layout: %d layers, pools %s", layers, names)

    # ---- keys ----

    def _pages(self, keys: List[str]) -> np.ndarray:
        out = np.empty((len(keys), 2), dtype=np.uint64)
        for i, key in enumerate(keys):
            out[i] = page_hash_of(key, self.suffix)
        return out

    def _segments(self, name: str, pages: np.ndarray):
        """(pages, layers, parts) of every piece of `pages` in pool `name`,
        page-major as get_page_buffer_meta lists its pointers."""
        g = self._geometry[name]
        n, k = len(pages), g.pieces
        seg_pages = np.repeat(pages, k, axis=0)
        layers = np.tile(np.arange(k, dtype=np.uint16), n)
        parts = np.tile(np.array([self._part_of[j, name] for j in range(k)],
                                 dtype=np.uint8), n)
        return seg_pages, layers, parts

    # ---- the data path ----

    def _transfer(self, name: str, keys: List[str], host_indices,
                  load: bool) -> List[bool]:
        self._ensure_layout()
        if name not in self._geometry:
            logger.error("tierkv: pool %s was never registered", name)
            return [False] * len(keys)
        g = self._geometry[name]
        if host_indices is None or host_indices.numel() != len(keys) * g.page_size:
            logger.error("tierkv: %s: %d host indices for %d pages of %d",
                         name, 0 if host_indices is None else
                         host_indices.numel(), len(keys), g.page_size)
            return [False] * len(keys)
        if not keys:
            return []
        pages = self._pages(keys)
        start = time.perf_counter()
        try:
            ok = self.session.call(lambda c: self._transfer_with(
                c, g, pages, host_indices, load))
        except tierkv.TierkvError as e:
            logger.warning("tierkv: %s of %d %s pages failed: %s",
                           "get" if load else "set", len(keys), name, e)
            return [False] * len(keys)
        done = int(ok.sum())
        self._observe(load, done, sum(g.piece_bytes) * done,
                      time.perf_counter() - start)
        return [bool(x) for x in ok]

    def _transfer_with(self, client: "tierkv.Client", g: _PoolGeometry,
                       pages: np.ndarray, host_indices, load: bool
                       ) -> np.ndarray:
        if g.zero_copy:
            ptrs, sizes = g.pool.get_page_buffer_meta(host_indices.cpu())
            seg = self._segments(g.name, pages)
            if load:
                statuses = client.get_raw(*seg, ptrs, sizes)
            else:
                _, statuses = client.put_raw(*seg, ptrs, sizes)
            raise_if_disconnected(client, statuses)
            ok = (statuses.reshape(len(pages), g.pieces) == 0).all(axis=1)
        else:
            ok = self._transfer_flat(client, g, pages, host_indices, load)
        if not load and self.flush and ok.any():
            seg = self._segments(g.name, pages[ok])
            flushed = raise_if_disconnected(
                client, client.flush(*seg, check_items=False))
            ok[ok] = (flushed.reshape(-1, g.pieces) == 0).all(axis=1)
        return ok

    def _transfer_flat(self, client: "tierkv.Client", g: _PoolGeometry,
                       pages: np.ndarray, host_indices, load: bool
                       ) -> np.ndarray:
        """Pools without a pointer view: one flat page per key, copied
        through a staging tensor (SGLang's own generic path does the same)."""
        ok = np.zeros(len(pages), dtype=bool)
        part = self._part_of[0, g.name]
        for i in range(len(pages)):
            index = int(host_indices[i * g.page_size])
            if load:
                page = g.pool.get_dummy_flat_data_page()
                view = page.view(torch.uint8).numpy()
                st = raise_if_disconnected(client, client.get(
                    pages[i:i + 1], 0, part, [view], check_items=False))
                if st[0] == 0:
                    g.pool.set_from_flat_data_page(index, page)
                    ok[i] = True
            else:
                page = g.pool.get_data_page(index, flat=True).contiguous()
                _, st = client.put(pages[i:i + 1], 0, part,
                                   [page.view(torch.uint8).numpy()],
                                   check_items=False)
                raise_if_disconnected(client, st)
                ok[i] = st[0] == 0
        return ok

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> List[bool]:
        return self._transfer(KV, keys, host_indices, load=True)

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> List[bool]:
        return self._transfer(KV, keys, host_indices, load=False)

    def batch_get_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> Dict[str, List[bool]]:
        return {str(t.name): self._transfer(str(t.name), t.keys or [],
                                            t.host_indices, load=True)
                for t in transfers}

    def batch_set_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> Dict[str, List[bool]]:
        return {str(t.name): self._transfer(str(t.name), t.keys or [],
                                            t.host_indices, load=False)
                for t in transfers}

    # ---- lookups ----

    def _leading(self, keys: List[str]) -> int:
        if not keys:
            return 0
        self._ensure_layout()
        pages = self._pages(keys)
        try:
            return self.session.call(lambda c: c.match(pages)).leading_pages
        except tierkv.TierkvError as e:
            logger.warning("tierkv: exists failed, a miss: %s", e)
            return 0

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> int:
        return self._leading(keys)

    def batch_exists_v2(self, keys: List[str],
                        pool_transfers: Optional[List[PoolTransfer]] = None,
                        extra_info: Optional[HiCacheStorageExtraInfo] = None
                        ) -> PoolTransferResult:
        for t in pool_transfers or []:
            if t.hit_policy != PoolHitPolicy.ALL_PAGES:
                raise ValueError(f"tierkv: hit policy {t.hit_policy} of pool "
                                 f"{t.name} is not supported")
        # One Match: a page counts only when every pool's pieces are there.
        hit = self._leading(keys)
        extra = {str(t.name): hit for t in pool_transfers or []} if hit else {}
        result = PoolTransferResult(hit, {KV: hit, **extra} if hit else {})
        result.restorable_prefix_pages = list(range(1, hit + 1))
        return result

    def exists(self, key: str) -> bool:
        return self._leading([key]) == 1

    # ---- the pre-v1 tensor interface (SGLang uses it only without
    # interface_v1; tierkv's data path is the zero-copy one) ----

    def _unsupported(self, *_args, **_kwargs):
        raise NotImplementedError(
            "tierkv HiCache storage moves pages zero-copy: set "
            "\"interface_v1\": 1 in --hicache-storage-backend-extra-config")

    get = batch_get = set = batch_set = _unsupported

    def clear(self) -> bool:
        """tierkvd cannot drop a namespace's pages on request: returns False
        (nothing was cleared) and says so."""
        logger.warning("tierkv: clear() cleared nothing: tierkvd has no "
                       "operation that drops namespace %s; its pages age out "
                       "by eviction (restart tierkvd without NVMe to empty "
                       "it)", self.namespace)
        return False

    # ---- metrics ----

    @staticmethod
    def _new_metrics():
        from sglang.srt.observability.metrics_collector import StorageMetrics
        return StorageMetrics()

    def _observe(self, load: bool, pages: int, nbytes: int,
                 seconds: float) -> None:
        if pages == 0:
            return
        gbps = nbytes / max(seconds, 1e-9) / 1e9
        with self._metrics_lock:
            m = self._metrics
            if load:
                m.prefetch_pgs.append(pages)
                m.prefetch_bandwidth.append(gbps)
            else:
                m.backup_pgs.append(pages)
                m.backup_bandwidth.append(gbps)

    def get_stats(self):
        """SGLang's StorageMetrics since the last call (then reset), as
        --enable-metrics expects (unified_radix_cache.py: the scheduler
        passes it to StorageMetricsCollector.log_storage_metrics)."""
        with self._metrics_lock:
            out, self._metrics = self._metrics, self._new_metrics()
        return out

    @property
    def client(self) -> "tierkv.Client":
        """The connected client (reconnects if tierkvd came back)."""
        return self.session.client()

    def close(self) -> None:
        self.session.close()
