"""tierkv.Client: the Python face of tierkv::Client (include/tierkv/client.h).

Arguments are numpy arrays (lists and tuples are converted), batches are
struct-of-arrays and bytes move without copies: Put reads straight from the
caller's buffers, Get writes straight into them, acquire() hands out
read-only views of the daemon's mapped arena, and Pool is a memfd the daemon
loads into and stores from. Every failure raises a TierkvError subclass with
the library's message (tierkv.errors); nothing crashes the interpreter:
shapes, dtypes, contiguity, writability and the client's state are checked
here before any pointer reaches C, and sizes are checked by the library
against the registered layout.

Page hashes are numpy arrays of shape (n, 2), dtype uint64: (lo, hi) words
of tierkv's 128-bit chained prefix hash (see page_hashes()).
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import threading
from ctypes import byref, c_size_t, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _lib
from ._lib import check, lib
from .errors import ClientClosedError, InvalidArgumentError

TIER_NAMES = {0: "hbm", 1: "host", 2: "nvme", 3: "peer", 255: "miss"}

# ---- argument conversion ---------------------------------------------------


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _ptr(a: Optional[np.ndarray]):
    return None if a is None or a.size == 0 else _addr(a)


def _int_array(values, n: Optional[int], dtype, name: str) -> np.ndarray:
    """A C-contiguous integer array of `dtype`, broadcast to length n."""
    a = np.asarray(values)
    if a.dtype == object or a.dtype.kind not in "ui" and a.size > 0:
        raise InvalidArgumentError(
            f"{name} must hold integers, got dtype {a.dtype}")
    if a.size and (a.min() < 0 or a.max() > np.iinfo(dtype).max):
        raise InvalidArgumentError(
            f"{name} out of range for {np.dtype(dtype).name}: "
            f"[{a.min()}, {a.max()}]")
    if n is not None:
        if a.ndim == 0:
            a = np.broadcast_to(a, (n,))
        elif a.shape != (n,):
            raise InvalidArgumentError(
                f"{name} must be one value or {n} values, got shape "
                f"{a.shape}")
    return np.ascontiguousarray(a, dtype=dtype)


def as_pages(pages) -> np.ndarray:
    """Validates page hashes: shape (n, 2) (or (2,) for one page), integer."""
    a = np.asarray(pages)
    if a.ndim == 1 and a.shape[0] == 2:
        a = a.reshape(1, 2)
    if a.size == 0:
        return np.zeros((0, 2), dtype=np.uint64)
    if a.dtype == object or a.dtype.kind not in "ui":
        raise InvalidArgumentError(
            f"pages must be an integer array of shape (n, 2) (lo, hi words "
            f"of each page hash), got dtype {a.dtype}")
    if a.ndim != 2 or a.shape[1] != 2:
        raise InvalidArgumentError(
            f"pages must have shape (n, 2) (lo, hi words of each page "
            f"hash), got shape {a.shape}")
    return np.ascontiguousarray(a, dtype=np.uint64)


def _byte_view(obj, writable: bool, name: str) -> np.ndarray:
    """A zero-copy numpy view of a buffer; C-contiguous or an error."""
    if isinstance(obj, np.ndarray):
        a = obj
    elif hasattr(obj, "__array_interface__") or hasattr(obj, "__array__"):
        a = np.asarray(obj)  # a CPU torch tensor: zero-copy
    else:
        try:
            a = np.frombuffer(obj, dtype=np.uint8)
        except TypeError:
            raise InvalidArgumentError(
                f"{name} must be a numpy array or a buffer (bytes, "
                f"bytearray, memoryview), got {type(obj).__name__}") from None
    if not a.flags.c_contiguous:
        raise InvalidArgumentError(
            f"{name} is not C-contiguous (strides {a.strides}); pass "
            f"np.ascontiguousarray(...) or a contiguous slice")
    if writable and not a.flags.writeable:
        raise InvalidArgumentError(f"{name} is read-only; Get needs a "
                                   f"writable destination")
    return a


def _buffers(data, n: int, writable: bool) -> Tuple[np.ndarray, np.ndarray,
                                                     list]:
    """(pointers, sizes, keep-alive) for n buffers.

    `data` is either one array whose first axis has n rows (each row one
    segment), or a sequence of n buffers.
    """
    ptrs = np.empty(n, dtype=np.uint64)
    sizes = np.empty(n, dtype=np.uint64)
    if isinstance(data, np.ndarray) and data.ndim >= 2:
        a = _byte_view(data, writable, "data")
        if a.shape[0] != n:
            raise InvalidArgumentError(
                f"data has {a.shape[0]} rows for {n} segments")
        row = a.strides[0]
        ptrs[:] = _addr(a) + row * np.arange(n, dtype=np.uint64)
        sizes[:] = a[0].nbytes if n else 0
        return ptrs, sizes, [a]
    if isinstance(data, (bytes, bytearray, memoryview, np.ndarray)):
        raise InvalidArgumentError(
            "data must be a sequence of buffers or a 2-D array with one row "
            "per segment")
    items = list(data)
    if len(items) != n:
        raise InvalidArgumentError(
            f"{len(items)} buffers given for {n} segments")
    keep = []
    for i, obj in enumerate(items):
        a = _byte_view(obj, writable, f"data[{i}]")
        ptrs[i] = _addr(a)
        sizes[i] = a.nbytes
        keep.append(a)
    return ptrs, sizes, keep


def _finish(status: int, statuses: np.ndarray, check_items: bool) -> None:
    """Raises for a batch call: always when the call failed as a whole (no
    item has a status), else for the first failing item if check_items."""
    if status != 0 and (check_items or not statuses.any()):
        check(status, statuses if statuses.any() else None)


# ---- page hashes -------------------------------------------------------------


def root_page_hash(namespace: str) -> np.ndarray:
    """h_{-1} of a namespace's chain, shape (2,) uint64."""
    out = _lib.PageHashStruct()
    check(lib.tierkv_root_page_hash(namespace.encode(), byref(out)))
    return np.array([out.lo, out.hi], dtype=np.uint64)


def page_hashes(tokens, page_tokens: int, *, namespace: Optional[str] = None,
                root=None, salt: bytes = b"") -> np.ndarray:
    """Chained hashes of every full page of `tokens` (uint32 token ids).

    The chain starts at `root` (a (2,) page hash: continue a chain) or at
    the root of `namespace`; exactly one must be given. Returns an (n, 2)
    uint64 array, n = len(tokens) // page_tokens. Equal prefixes give equal
    hashes in every process (the chain is frozen by test vectors).
    """
    if (namespace is None) == (root is None):
        raise InvalidArgumentError("give exactly one of namespace= or root=")
    start = root_page_hash(namespace) if root is None else as_pages(root)[0]
    toks = _int_array(tokens, None, np.uint32, "tokens").reshape(-1)
    if page_tokens <= 0:
        raise InvalidArgumentError("page_tokens must be > 0")
    n = len(toks) // page_tokens
    out = np.empty((n, 2), dtype=np.uint64)
    root_struct = _lib.PageHashStruct(int(start[0]), int(start[1]))
    count = c_size_t()
    salt_bytes = bytes(salt)
    check(lib.tierkv_page_hash_chain(
        byref(root_struct), _ptr(toks), len(toks), page_tokens,
        salt_bytes if salt_bytes else None, len(salt_bytes), _ptr(out), n,
        byref(count)))
    return out


# ---- value types ---------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """A namespace's KV layout: page_tokens and, per layer, (name, bytes per
    token) parts. Segment (layer, part) holds page_tokens * bytes_per_token
    bytes."""

    page_tokens: int
    layers: Tuple[Tuple[Tuple[str, int], ...], ...]

    @staticmethod
    def uniform(page_tokens: int, num_layers: int,
                parts: Sequence[Tuple[str, int]]) -> "Layout":
        layer = tuple((str(n), int(b)) for n, b in parts)
        return Layout(int(page_tokens), tuple(layer for _ in range(num_layers)))

    @staticmethod
    def of(page_tokens: int,
           layers: Iterable[Sequence[Tuple[str, int]]]) -> "Layout":
        return Layout(int(page_tokens), tuple(
            tuple((str(n), int(b)) for n, b in parts) for parts in layers))

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def part_index(self, layer: int, name: str) -> int:
        for i, (part, _) in enumerate(self.layers[layer]):
            if part == name:
                return i
        raise InvalidArgumentError(f"layer {layer} has no part {name!r}")

    def segment_bytes(self, layer: int, part: Union[int, str]) -> int:
        if isinstance(part, str):
            part = self.part_index(layer, part)
        return self.page_tokens * self.layers[layer][part][1]


@dataclass(frozen=True)
class MatchResult:
    leading_pages: int  # pages [0, leading_pages) are fully stored
    tiers: List[str]  # per asked page: "hbm", "host", "nvme" or "miss"


class Pool:
    """An engine KV pool in a sealable memfd: slot_count slots of slot_bytes.

    `array` is a writable (slot_count, slot_bytes) uint8 view of it;
    `tensor()` the same memory as a torch tensor (DLPack) when torch is
    installed. Register it with Client.register_pool. Close (or let the
    garbage collector close) it only after every transfer using it ended.
    """

    def __init__(self, slot_bytes: int, slot_count: int, *,
                 name: str = "tierkv-pool"):
        if slot_bytes <= 0 or slot_count <= 0:
            raise InvalidArgumentError("slot_bytes and slot_count must be > 0")
        self.slot_bytes = int(slot_bytes)
        self.slot_count = int(slot_count)
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, self.slot_bytes * self.slot_count)
            self._map = mmap.mmap(self.fd, self.slot_bytes * self.slot_count)
        except BaseException:
            os.close(self.fd)
            raise
        self.array = np.frombuffer(self._map, dtype=np.uint8).reshape(
            self.slot_count, self.slot_bytes)

    def tensor(self):
        import torch  # optional dependency
        return torch.from_dlpack(self.array)

    def close(self) -> None:
        if self.fd >= 0:
            self.array = None
            try:
                self._map.close()
            except BufferError:
                pass  # views still exported: the mapping lives on with them
            os.close(self.fd)
            self.fd = -1

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


# ---- handles ---------------------------------------------------------------------


class ReadLease:
    """Zero-copy access to leased segments of the mapped arena.

    lease[i] is a read-only uint8 view of segment i, or None for a miss;
    `statuses` holds one status number per key (0 = OK, 1 = not found).
    Views stay readable after release(), but the daemon may then reuse the
    bytes: finish reading first (a `with` block releases on exit).
    """

    def __init__(self, handle: int, n: int):
        self._h = handle
        self._released = False
        self._views: List[Optional[np.ndarray]] = []
        statuses = np.zeros(n, dtype=np.uint8)
        data = c_void_p()
        size = c_uint64()
        for i in range(n):
            st = lib.tierkv_read_lease_item(self._h, i, byref(data),
                                            byref(size))
            statuses[i] = st
            if st == 0 and size.value:
                buf = (ctypes.c_uint8 * size.value).from_address(data.value)
                buf._lease = self  # the mapping lives while a view does
                view = np.frombuffer(buf, dtype=np.uint8)
                view.flags.writeable = False
                self._views.append(view)
            else:
                self._views.append(None)
        self.statuses = statuses

    def __len__(self) -> int:
        return len(self._views)

    def __getitem__(self, i: int) -> Optional[np.ndarray]:
        return self._views[i]

    def release(self) -> None:
        """Gives the segments back to the daemon (idempotent)."""
        if self._h and not self._released:
            self._released = True
            check(lib.tierkv_read_lease_release(self._h))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        # Only once no view is left (each view holds this object).
        if getattr(self, "_h", None):
            lib.tierkv_read_lease_free(self._h)
            self._h = None


class Transfer:
    """A Load or Store in flight (tierkv::TransferHandle).

    wait_layer(l) blocks (without the GIL) until layer l is in place (Load)
    or saved (Store); wait() until every layer is. Both raise the first
    failing page's error unless check=False, and return one status number
    per page. close() (or the `with` block's end) waits until the daemon is
    done with the pools.
    """

    def __init__(self, handle: int, pages: int):
        self._h = handle
        self.pages = pages

    def _handle(self) -> int:
        if not self._h:
            raise ClientClosedError("transfer is closed")
        return self._h

    def wait_layer(self, layer: int, *, check_pages: bool = True) -> np.ndarray:
        statuses = np.zeros(self.pages, dtype=np.uint8)
        st = lib.tierkv_transfer_wait_layer(self._handle(), int(layer),
                                            _ptr(statuses))
        if check_pages or np.all(statuses == 0):
            check(st, statuses)
        return statuses

    def wait(self, *, check_pages: bool = True) -> np.ndarray:
        statuses = np.zeros(self.pages, dtype=np.uint8)
        st = lib.tierkv_transfer_wait(self._handle(), _ptr(statuses))
        if check_pages or np.all(statuses == 0):
            check(st, statuses)
        return statuses

    @property
    def layers_done(self) -> int:
        return lib.tierkv_transfer_layers_done(self._h) if self._h else 0

    def close(self) -> None:
        if self._h:
            lib.tierkv_transfer_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


# ---- the client ------------------------------------------------------------------


class Client:
    """One connection to tierkvd, bound to one namespace (open_namespace).

    Thread-safe like the C++ client: calls from many threads are in flight
    at once and none holds the GIL while it waits. close() waits for calls
    in flight, then closes; later calls raise ClientClosedError. Leases and
    transfers made before close() stay usable until they are freed.
    """

    def __init__(self, socket: Optional[str] = None, *, timeout: float = 10.0,
                 prefault_arena: bool = True,
                 max_transfers_in_flight: int = 64):
        opts = _lib.ClientOptions(
            socket.encode() if socket else None,
            max(1, int(timeout * 1000)), 1 if prefault_arena else 0,
            int(max_transfers_in_flight))
        handle = c_void_p()
        check(lib.tierkv_client_connect(byref(opts), byref(handle)))
        self._h = handle.value
        self._calls = 0
        self._idle = threading.Condition()
        self._layout: Optional[Layout] = None
        self.namespace: Optional[str] = None

    # Every call holds a use count so close() never frees the C client under
    # a call in flight on another thread.
    class _Use:
        __slots__ = ("c",)

        def __init__(self, c: "Client"):
            self.c = c

        def __enter__(self) -> int:
            c = self.c
            with c._idle:
                if not c._h:
                    raise ClientClosedError("client is closed")
                c._calls += 1
                return c._h

        def __exit__(self, *exc):
            c = self.c
            with c._idle:
                c._calls -= 1
                if c._calls == 0:
                    c._idle.notify_all()

    def _use(self) -> "Client._Use":
        return Client._Use(self)

    def close(self) -> None:
        with self._idle:
            while self._calls:
                self._idle.wait()
            h, self._h = self._h, None
        if h:
            lib.tierkv_client_close(h)

    @property
    def closed(self) -> bool:
        return not self._h

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_h", None):
            lib.tierkv_client_close(self._h)
            self._h = None

    # -- namespace and layout --

    def open_namespace(self, name: str, token: str) -> None:
        with self._use() as h:
            check(lib.tierkv_open_namespace(h, name.encode(), token.encode()))
        self.namespace = name
        self._layout = None

    def register_layout(self, layout: Layout) -> None:
        counts = np.array([len(parts) for parts in layout.layers],
                          dtype=np.uint32)
        names = [n.encode() for parts in layout.layers for n, _ in parts]
        sizes = np.array([b for parts in layout.layers for _, b in parts],
                         dtype=np.uint32)
        name_array = (ctypes.c_char_p * max(1, len(names)))(*names)
        with self._use() as h:
            check(lib.tierkv_register_layout(
                h, int(layout.page_tokens), len(layout.layers), _ptr(counts),
                name_array, _ptr(sizes)))
        self._layout = layout

    @property
    def layout(self) -> Optional[Layout]:
        """The namespace's layout, or None when none is registered."""
        if self._layout is None:
            with self._use() as h:
                try:
                    text = _lib.read_string(lib.tierkv_layout_json, h)
                except Exception as e:  # noqa: BLE001
                    if getattr(e, "code", "") == "not_found":
                        return None
                    raise
            j = json.loads(text)
            self._layout = Layout.of(j["page_tokens"], j["layers"])
        return self._layout

    def _keys(self, pages, layers, parts):
        p = as_pages(pages)
        n = len(p)
        l = _int_array(layers, n, np.uint16, "layers")
        if isinstance(parts, str):
            layout = self.layout
            if layout is None:
                raise InvalidArgumentError("part names need a layout")
            try:
                parts = [layout.part_index(int(x), parts) for x in l]
            except IndexError:
                raise InvalidArgumentError(
                    "a layer is outside the layout") from None
        return p, l, _int_array(parts, n, np.uint8, "parts")

    # -- the cache --

    def match(self, pages) -> MatchResult:
        p = as_pages(pages)
        tiers = np.zeros(len(p), dtype=np.uint8)
        leading = c_uint32()
        with self._use() as h:
            check(lib.tierkv_match(h, _ptr(p), len(p), byref(leading),
                                   _ptr(tiers)))
        return MatchResult(leading.value,
                           [TIER_NAMES.get(int(t), "miss") for t in tiers])

    def put(self, pages, layers, parts, data, *,
            check_items: bool = True) -> np.ndarray:
        """Stores segments (pages[i], layers[i], parts[i]) from data[i].

        layers / parts may be one value for all items; parts may be a part
        name. data: a sequence of buffers, or one array with a row per
        segment. Returns already_stored (bool per item: deduplicated). With
        check_items=False, failures do not raise: see statuses_of_last...
        instead the return value is (already_stored, statuses).
        """
        p, l, q = self._keys(pages, layers, parts)
        n = len(p)
        ptrs, sizes, keep = _buffers(data, n, writable=False)
        statuses = np.zeros(n, dtype=np.uint8)
        dedup = np.zeros(n, dtype=np.uint8)
        with self._use() as h:
            st = lib.tierkv_put(h, _ptr(p), _ptr(l), _ptr(q), _ptr(ptrs),
                                _ptr(sizes), n, _ptr(statuses), _ptr(dedup))
        del keep
        _finish(st, statuses, check_items)
        if check_items:
            return dedup.astype(bool)
        return dedup.astype(bool), statuses

    def get(self, pages, layers, parts, out, *,
            check_items: bool = True) -> np.ndarray:
        """Copies segments into out[i] (writable buffers of exactly the
        segment's size, or one array with a row per segment). Returns one
        status per item; raises the first failure (NotFoundError for a miss)
        unless check_items=False."""
        p, l, q = self._keys(pages, layers, parts)
        n = len(p)
        ptrs, sizes, keep = _buffers(out, n, writable=True)
        statuses = np.zeros(n, dtype=np.uint8)
        with self._use() as h:
            st = lib.tierkv_get(h, _ptr(p), _ptr(l), _ptr(q), _ptr(ptrs),
                                _ptr(sizes), n, _ptr(statuses))
        del keep
        _finish(st, statuses, check_items)
        return statuses

    # -- raw addresses: for engines that hand out pointers into their own
    # pools (SGLang's get_page_buffer_meta, vLLM's kv_caches data_ptr) --

    def put_raw(self, pages, layers, parts, addresses, sizes) -> np.ndarray:
        """Put from raw addresses: segment i is sizes[i] bytes at
        addresses[i]. The caller guarantees that memory is readable for the
        call's duration (no check is possible). Returns (already_stored,
        statuses), never raises per item."""
        p, l, q = self._keys(pages, layers, parts)
        n = len(p)
        ptrs = _int_array(addresses, n, np.uint64, "addresses")
        lens = _int_array(sizes, n, np.uint64, "sizes")
        statuses = np.zeros(n, dtype=np.uint8)
        dedup = np.zeros(n, dtype=np.uint8)
        with self._use() as h:
            st = lib.tierkv_put(h, _ptr(p), _ptr(l), _ptr(q), _ptr(ptrs),
                                _ptr(lens), n, _ptr(statuses), _ptr(dedup))
        _finish(st, statuses, False)
        return dedup.astype(bool), statuses

    def get_raw(self, pages, layers, parts, addresses, sizes) -> np.ndarray:
        """Get into raw addresses (writable memory of sizes[i] bytes, which
        the caller guarantees). Returns one status per item; never raises
        per item (only for a malformed call as a whole)."""
        p, l, q = self._keys(pages, layers, parts)
        n = len(p)
        ptrs = _int_array(addresses, n, np.uint64, "addresses")
        lens = _int_array(sizes, n, np.uint64, "sizes")
        statuses = np.zeros(n, dtype=np.uint8)
        with self._use() as h:
            st = lib.tierkv_get(h, _ptr(p), _ptr(l), _ptr(q), _ptr(ptrs),
                                _ptr(lens), n, _ptr(statuses))
        _finish(st, statuses, False)
        return statuses

    def flush(self, pages, layers, parts, *,
              check_items: bool = True) -> np.ndarray:
        """Makes segments durable on the NVMe tier (see Client::Flush)."""
        p, l, q = self._keys(pages, layers, parts)
        statuses = np.zeros(len(p), dtype=np.uint8)
        with self._use() as h:
            st = lib.tierkv_flush(h, _ptr(p), _ptr(l), _ptr(q), len(p),
                                  _ptr(statuses))
        _finish(st, statuses, check_items)
        return statuses

    def acquire(self, pages, layers, parts) -> ReadLease:
        """Leases segments for zero-copy reads (see ReadLease)."""
        p, l, q = self._keys(pages, layers, parts)
        handle = c_void_p()
        with self._use() as h:
            check(lib.tierkv_acquire(h, _ptr(p), _ptr(l), _ptr(q), len(p),
                                     byref(handle)))
        return ReadLease(handle.value, len(p))

    # -- registered pools and per-layer transfers --

    def register_pool(self, pool: Union[Pool, int], *, layer: int,
                      part: Union[int, str], slot_bytes: Optional[int] = None,
                      slot_count: Optional[int] = None,
                      offset: int = 0) -> None:
        """Registers a Pool (or a raw memfd with slot_bytes/slot_count) as
        the slots of segment (layer, part)."""
        if isinstance(pool, Pool):
            if pool.fd < 0:
                raise InvalidArgumentError("pool is closed")
            fd = pool.fd
            slot_bytes = pool.slot_bytes if slot_bytes is None else slot_bytes
            slot_count = pool.slot_count if slot_count is None else slot_count
        else:
            fd = int(pool)
            if slot_bytes is None or slot_count is None:
                raise InvalidArgumentError(
                    "a raw fd needs slot_bytes and slot_count")
        if isinstance(part, str):
            layout = self.layout
            if layout is None:
                raise InvalidArgumentError("part names need a layout")
            part = layout.part_index(layer, part)
        for name, v, hi in (("layer", layer, 0xFFFF), ("part", part, 0xFF),
                            ("slot_count", slot_count, 0xFFFFFFFF)):
            if not 0 <= int(v) <= hi:
                raise InvalidArgumentError(f"{name} out of range: {v}")
        with self._use() as h:
            check(lib.tierkv_register_pool(h, fd, int(offset), int(slot_bytes),
                                           int(slot_count), int(layer),
                                           int(part)))

    def _transfer(self, fn, pages, slots, first_layer: int,
                  layer_count: int) -> Transfer:
        p = as_pages(pages)
        s = _int_array(slots, len(p), np.uint32, "slots")
        if not (0 <= first_layer <= 0xFFFF and 0 <= layer_count <= 0xFFFF):
            raise InvalidArgumentError("layer range out of range")
        handle = c_void_p()
        with self._use() as h:
            check(fn(h, _ptr(p), _ptr(s), len(p), first_layer, layer_count,
                     byref(handle)))
        return Transfer(handle.value, len(p))

    def load(self, pages, slots, *, first_layer: int = 0,
             layer_count: int = 0) -> Transfer:
        """Loads pages[i] into slot slots[i] of every layer's pools, layer
        by layer; returns at once (see Transfer)."""
        return self._transfer(lib.tierkv_load, pages, slots, first_layer,
                              layer_count)

    def store(self, pages, slots, *, first_layer: int = 0,
              layer_count: int = 0) -> Transfer:
        """Saves slot slots[i] of every layer's pools as pages[i]."""
        return self._transfer(lib.tierkv_store, pages, slots, first_layer,
                              layer_count)

    def prefetch(self, pages) -> None:
        p = as_pages(pages)
        with self._use() as h:
            check(lib.tierkv_prefetch(h, _ptr(p), len(p)))

    def report_topk(self, pages, layers, counts) -> None:
        p = as_pages(pages)
        l = _int_array(layers, len(p), np.uint16, "layers")
        c = _int_array(counts, len(p), np.uint32, "counts")
        with self._use() as h:
            check(lib.tierkv_report_topk(h, _ptr(p), _ptr(l), _ptr(c),
                                         len(p)))

    # -- introspection --

    def ping(self) -> dict:
        with self._use() as h:
            return json.loads(_lib.read_string(lib.tierkv_ping, h))

    def stats(self) -> dict:
        with self._use() as h:
            return json.loads(_lib.read_string(lib.tierkv_stats_json, h))


def connect(socket: Optional[str] = None, *, namespace: Optional[str] = None,
            token: Optional[str] = None, token_file: Optional[str] = None,
            **options) -> Client:
    """Client(socket, **options), then open_namespace when one is given
    (token directly or read from token_file)."""
    client = Client(socket, **options)
    if namespace is not None:
        if token is None and token_file is not None:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
        try:
            client.open_namespace(namespace, token or "")
        except BaseException:
            client.close()
            raise
    return client
