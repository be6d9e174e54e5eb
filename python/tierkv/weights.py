"""tierkv.weights: model weights stored in tierkvd's tiers (issue 28).

A client opened on a namespace marked `weights = true` stores a shard (one
engine rank's tensors) as content-addressed chunks, so a tensor that two
versions or two models share is stored once, and loads it back layer by
layer (include/tierkv/weights.h, Client::PutWeights / LoadWeights):

    import tierkv, tierkv.weights as w
    c = tierkv.connect(sock, namespace="weights", token=token)
    w.put(c, "teacher", "slime/rank0-of-8", model.named_parameters())
    w.import_safetensors(c, "glm-5", "hf/bf16/rank0-of-1", "/ckpt/glm-5")
    with w.load(c, "glm-5", "hf/bf16/rank0-of-1") as ld:
        ld.wait_layer(0)                     # layer 0 is in ld.image
    w.hint(c, [w.Hint("glm-5", "hf/bf16/rank0-of-1", next_use_s=30)])
    w.pin(c, "glm-5", "hf/bf16/rank0-of-1", ttl_s=600)
    w.list_weights(c); w.drop(c, "glm-5")

TensorBackuper is a drop-in for slime's `_TensorBackuperNormal`
(slime/utils/tensor_backper.py): each tag is a model in the daemon instead
of a pinned CPU copy, so N tags cost one chunk store (with DRAM above NVMe)
rather than N copies of the rank's weights in pinned memory.

Tensors are numpy arrays or torch tensors (torch is optional: imported only
when a torch tensor is passed or a backup made from them is read back).
"""

from __future__ import annotations

import ctypes
import json
import re
from ctypes import byref, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass
from typing import (Any, Callable, Dict, Iterable, List, Optional, Sequence,
                    Tuple)

import numpy as np

from . import _lib
from ._lib import check, lib
from .client import Client, Pool
from .errors import InvalidArgumentError

# numpy dtypes <-> safetensors dtype strings.
_NUMPY_TO_ST = {
    np.dtype(np.float64): "F64", np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16", np.dtype(np.int64): "I64",
    np.dtype(np.int32): "I32", np.dtype(np.int16): "I16",
    np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8",
    np.dtype(np.uint16): "U16", np.dtype(np.uint32): "U32",
    np.dtype(np.uint64): "U64", np.dtype(np.bool_): "BOOL",
}
_ST_TO_NUMPY = {v: k for k, v in _NUMPY_TO_ST.items()}
# torch dtype names (str(torch.bfloat16) == "torch.bfloat16") <-> strings.
_TORCH_TO_ST = {
    "torch.float64": "F64", "torch.float32": "F32", "torch.float16": "F16",
    "torch.bfloat16": "BF16", "torch.float8_e4m3fn": "F8_E4M3",
    "torch.float8_e5m2": "F8_E5M2", "torch.int64": "I64",
    "torch.int32": "I32", "torch.int16": "I16", "torch.int8": "I8",
    "torch.uint8": "U8", "torch.bool": "BOOL",
}

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def layer_of(name: str) -> Optional[int]:
    """N of the first name component `layers.N` (HF `model.layers.3.mlp`,
    Megatron `decoder.layers.3.mlp`), else None: the rule ImportSafetensors
    uses."""
    m = _LAYER_RE.search(name)
    return int(m.group(1)) if m else None


def layer_groups(names: Sequence[str]) -> List[int]:
    """Layer groups for tensors named `names` (in their order), as
    ImportSafetensors assigns them: `layers.N` -> N renumbered densely from
    0; an unnumbered tensor before the first numbered one -> group 0, any
    other -> the last group."""
    numbers = [layer_of(n) for n in names]
    dense = {n: i for i, n in enumerate(sorted({n for n in numbers
                                                if n is not None}))}
    last = max(len(dense) - 1, 0)
    first = next((i for i, n in enumerate(numbers) if n is not None),
                 len(names))
    return [dense[n] if n is not None else (0 if i < first else last)
            for i, n in enumerate(numbers)]


def _is_torch(t) -> bool:
    return type(t).__module__.startswith("torch")


def _tensor_bytes(t) -> Tuple[int, int, str, Tuple[int, ...], Any, bool]:
    """(address, nbytes, dtype string, shape, object keeping the bytes
    alive, is_torch) of a numpy array or a torch tensor (a device tensor is
    copied to the CPU first)."""
    if _is_torch(t):
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        dtype = _TORCH_TO_ST.get(str(t.dtype))
        if dtype is None:
            raise InvalidArgumentError(f"invalid_argument: torch dtype "
                                       f"{t.dtype} has no safetensors name")
        return (t.data_ptr(), t.numel() * t.element_size(), dtype,
                tuple(t.shape), t, True)
    a = np.ascontiguousarray(t)
    dtype = _NUMPY_TO_ST.get(a.dtype)
    if dtype is None:
        raise InvalidArgumentError(f"invalid_argument: numpy dtype {a.dtype} "
                                   f"has no safetensors name")
    return (a.__array_interface__["data"][0], a.nbytes, dtype, a.shape, a,
            False)


def _tensor_meta(t) -> Tuple[str, Tuple[int, ...], int]:
    """(dtype string, shape, nbytes) of a numpy array or a torch tensor,
    read from its metadata alone (a device tensor stays where it is)."""
    if _is_torch(t):
        dtype = _TORCH_TO_ST.get(str(t.dtype))
        if dtype is None:
            raise InvalidArgumentError(f"invalid_argument: torch dtype "
                                       f"{t.dtype} has no safetensors name")
        return dtype, tuple(t.shape), t.numel() * t.element_size()
    a = np.asarray(t)
    dtype = _NUMPY_TO_ST.get(a.dtype)
    if dtype is None:
        raise InvalidArgumentError(f"invalid_argument: numpy dtype {a.dtype} "
                                   f"has no safetensors name")
    return dtype, a.shape, a.nbytes


def _version_arg(version: Optional[str]):
    """A tierkv_page_hash for `version` (32 hex digits), or None (newest)."""
    if not version:
        return None
    if len(version) != 32:
        raise InvalidArgumentError("invalid_argument: a version is 32 hex "
                                   "digits")
    return _lib.PageHashStruct(int(version[16:], 16), int(version[:16], 16))


def _ptr_of(struct) -> Optional[int]:
    return ctypes.addressof(struct) if struct is not None else None


@dataclass
class Stored:
    """What put / import_safetensors sealed."""
    version: str  # 32 hex digits: WeightsVersionOf the manifest
    image_bytes: int
    num_layers: int
    tensors: int
    chunks: int
    chunks_stored: int
    chunks_deduplicated: int
    bytes_stored: int
    bytes_deduplicated: int


def _stored(s: _lib.WeightsStoredStruct) -> Stored:
    return Stored(f"{s.version.hi:016x}{s.version.lo:016x}", s.image_bytes,
                  s.num_layers, s.tensors, s.chunks, s.chunks_stored,
                  s.chunks_deduplicated, s.bytes_stored,
                  s.bytes_deduplicated)


def put(client: Client, model: str, layout: str,
        tensors: Iterable[Tuple[str, Any]],
        layers: Optional[Sequence[int]] = None) -> Stored:
    """Stores (name, tensor) pairs as shard (model, layout) and seals it.

    `layers`: the layer group of each tensor; default layer_groups(names).
    Tensors are stored ordered by (group, given order). Chunks the daemon
    holds already are not copied again (Stored.chunks_deduplicated)."""
    structs, n, keep = _tensor_structs(tensors, layers)
    out = _lib.WeightsStoredStruct()
    with client._use() as h:
        check(lib.tierkv_weights_put(h, model.encode(), layout.encode(),
                                     ctypes.addressof(structs), n,
                                     byref(out)))
    del keep
    return _stored(out)


def _tensor_structs(tensors: Iterable[Tuple[str, Any]],
                    layers: Optional[Sequence[int]], with_data: bool = True):
    """(structs, count, keep) for the C calls: (name, tensor) pairs ordered
    by (layer group, given order); `keep` owns what the structs point at.
    Without data, only the tensors' metadata is read (data pointers NULL:
    no device tensor is copied to the host)."""
    items = list(tensors)
    names = [n for n, _ in items]
    groups = list(layers) if layers is not None else layer_groups(names)
    if len(groups) != len(items):
        raise InvalidArgumentError("invalid_argument: one layer per tensor")
    order = sorted(range(len(items)), key=lambda i: (groups[i], i))
    structs = (_lib.WeightsTensorStruct * max(len(items), 1))()
    keep = []  # bytes, names and shapes referenced by `structs`
    for slot, i in enumerate(order):
        name, t = items[i]
        if with_data:
            addr, nbytes, dtype, shape, owner, _ = _tensor_bytes(t)
        else:
            (dtype, shape, nbytes), addr, owner = _tensor_meta(t), None, None
        shape_arr = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        enc = (name.encode(), dtype.encode())
        keep.append((owner, shape_arr, enc))
        structs[slot] = _lib.WeightsTensorStruct(
            enc[0], enc[1], ctypes.addressof(shape_arr), len(shape),
            int(groups[i]), addr, nbytes)
    return structs, len(items), keep


def plan(model: str, layout: str, tensors: Iterable[Tuple[str, Any]],
         layers: Optional[Sequence[int]] = None) -> dict:
    """Where each of (name, tensor) pairs lives in the shard's image, as
    put() would lay it out (tierkv::PlanWeightsImage; the tensors' bytes are
    not read): the manifest dict (chunk keys zero). An engine writes its
    tensors at these offsets of an image_pool before put_from_pool."""
    structs, n, keep = _tensor_structs(tensors, layers, with_data=False)
    out = json.loads(_lib.read_string(
        lib.tierkv_weights_plan_json, model.encode(), layout.encode(),
        ctypes.addressof(structs), n))
    del keep
    return out


def put_from_pool(client: Client, model: str, layout: str,
                  tensors: Iterable[Tuple[str, Any]],
                  layers: Optional[Sequence[int]] = None) -> Stored:
    """Stores and seals shard (model, layout) whose tensors (described by
    the pairs, as for plan) the engine wrote into the connection's
    registered image pool at plan()'s offsets: the daemon copies, hashes and
    stores the chunks (Client::PutWeightsFromPool); this process reads none
    of them (nor the tensors': only their metadata). The same bytes give the
    same version as put() when the pool's bytes between tensors inside a
    pack are zero (a zeroed pool has them)."""
    structs, n, keep = _tensor_structs(tensors, layers, with_data=False)
    out = _lib.WeightsStoredStruct()
    with client._use() as h:
        check(lib.tierkv_weights_put_from_pool(
            h, model.encode(), layout.encode(), ctypes.addressof(structs), n,
            byref(out)))
    del keep
    return _stored(out)


def import_safetensors(client: Client, model: str, layout: str,
                       path: str) -> Stored:
    """Stores a .safetensors file or checkpoint directory as one shard
    (tierkv::ImportSafetensors: layer groups from the names)."""
    out = _lib.WeightsStoredStruct()
    with client._use() as h:
        check(lib.tierkv_weights_import_safetensors(
            h, model.encode(), layout.encode(), str(path).encode(),
            byref(out)))
    return _stored(out)


def manifest(client: Client, model: str, layout: str,
             version: Optional[str] = None) -> dict:
    """The sealed manifest (newest version unless `version` is given) as a
    dict: model, layout, version, num_layers, image_bytes, tensors (name,
    dtype, shape, layer, offset, bytes) and chunks (key, offset, bytes,
    layer)."""
    v = _version_arg(version)
    with client._use() as h:
        return json.loads(_lib.read_string(
            lib.tierkv_weights_manifest_json, h, model.encode(),
            layout.encode(), _ptr_of(v)))


class Load:
    """A shard loading into `image` (numpy uint8) layer by layer
    (tierkv::WeightsLoad): on a loader thread of this process (load), or by
    the daemon into a registered image pool (load_to_pool). wait_layer(l) returns once layer l's
    bytes are in place and raises the layer's error otherwise (NotFoundError
    "chunk ... of layer l is in no tier"). close() (or leaving the `with`)
    stops the loader and waits for it: nothing writes `image` afterwards."""

    def __init__(self, handle: int, image: np.ndarray, client: Client,
                 first_layer: int, layer_count: int, manifest: dict):
        self._h = handle
        self.image = image
        # The manifest of the version being loaded: its tensors' offsets
        # are where their bytes land in `image`.
        self.manifest = manifest
        self.version = manifest["version"]
        self._client = client  # the C handle keeps the C client alive too
        self.first_layer = first_layer
        self.layer_count = layer_count

    def _handle(self) -> int:
        if not self._h:
            raise InvalidArgumentError("invalid_argument: load is closed")
        return self._h

    def wait_layer(self, layer: int) -> None:
        check(lib.tierkv_weights_load_wait_layer(self._handle(), int(layer)))

    def wait(self) -> None:
        check(lib.tierkv_weights_load_wait(self._handle()))

    def layers_done(self) -> int:
        return lib.tierkv_weights_load_layers_done(self._h) if self._h else 0

    def close(self) -> None:
        if self._h:
            lib.tierkv_weights_load_free(self._h)
            self._h = None

    def __enter__(self) -> "Load":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self.close()


def load(client: Client, model: str, layout: str,
         image: Optional[np.ndarray] = None, *, version: Optional[str] = None,
         first_layer: int = 0, layer_count: int = 0) -> Load:
    """Starts loading a sealed shard into `image` (a writable, contiguous
    uint8 array of at least the manifest's image_bytes; allocated when
    None). Returns at once; see Load."""
    # Resolved once: the load and the caller then use one version even if
    # another is sealed meanwhile (its offsets would differ).
    m = manifest(client, model, layout, version)
    if image is None:
        image = np.empty(m["image_bytes"], dtype=np.uint8)
    if (not isinstance(image, np.ndarray) or image.dtype != np.uint8 or
            not image.flags.c_contiguous or not image.flags.writeable):
        raise InvalidArgumentError("invalid_argument: image must be a "
                                   "writable, contiguous uint8 numpy array")
    v = _version_arg(m["version"])
    handle = c_void_p()
    with client._use() as h:
        check(lib.tierkv_weights_load_start(
            h, model.encode(), layout.encode(), _ptr_of(v),
            image.__array_interface__["data"][0], image.nbytes,
            int(first_layer), int(layer_count), byref(handle)))
    return Load(handle.value, image, client, first_layer, layer_count, m)


def image_pool(client: Client, nbytes: int) -> Pool:
    """A sealable memfd of `nbytes` registered as this connection's image
    pool (one per connection) for load_to_pool: the engine's weights buffer.
    Close it only after every load into it ended."""
    pool = Pool(nbytes, 1, name="tierkv-weights-image")
    try:
        client.register_pool(pool, layer=0, part=0)
    except BaseException:
        pool.close()
        raise
    return pool


def load_to_pool(client: Client, model: str, layout: str, pool: Pool, *,
                 version: Optional[str] = None, first_layer: int = 0,
                 layer_count: int = 0) -> Load:
    """Starts loading a sealed shard into the connection's registered image
    pool `pool` (image_pool) with the daemon's per-layer Load machinery:
    the daemon moves the bytes, this process copies none. Returns at once;
    Load.image is the pool's bytes, Load.manifest the version's offsets."""
    m = manifest(client, model, layout, version)
    if m["image_bytes"] > pool.slot_bytes:
        raise InvalidArgumentError(
            f"invalid_argument: the pool holds {pool.slot_bytes} bytes, the "
            f"shard's image needs {m['image_bytes']}")
    v = _version_arg(m["version"])
    handle = c_void_p()
    with client._use() as h:
        check(lib.tierkv_weights_load_to_pool_start(
            h, model.encode(), layout.encode(), _ptr_of(v),
            int(first_layer), int(layer_count), byref(handle)))
    return Load(handle.value, pool.array.reshape(-1), client, first_layer,
                layer_count, m)


def prefetch(client: Client, model: str, layout: str, *,
             version: Optional[str] = None, first_layer: int = 0,
             layer_count: int = 0) -> None:
    """Asks the daemon to bring the shard's chunks from NVMe into DRAM."""
    v = _version_arg(version)
    with client._use() as h:
        check(lib.tierkv_weights_prefetch(h, model.encode(), layout.encode(),
                                          _ptr_of(v), int(first_layer),
                                          int(layer_count)))


# Past ~31 years is forever in practice; it keeps milliseconds in int64.
_MAX_SECONDS = 1e9


def _millis(seconds: float) -> int:
    """Whole milliseconds, at least 1 for a positive time (a pin of 0.1 ms
    is a pin, not an unpin)."""
    ms = int(round(seconds * 1000))
    return max(ms, 1) if seconds > 0 else ms


@dataclass(frozen=True)
class Hint:
    """When shard (model, layout, version) is next used, in seconds from
    now (None: no known next use; clears its hint). version None: the
    newest sealed now."""
    model: str
    layout: str
    next_use_s: Optional[float]
    version: Optional[str] = None


def hint(client: Client, hints: Sequence[Hint]) -> None:
    """Tells the daemon when shards are next used: it evicts the farthest
    next use first and brings the shards due within its horizon from NVMe
    into DRAM ahead of their loads (Client::HintWeights)."""
    versions = [_version_arg(h.version) for h in hints]  # kept alive
    items = (_lib.WeightsHintStruct * max(len(hints), 1))()
    for i, h in enumerate(hints):
        if h.next_use_s is not None and not 0 <= h.next_use_s <= _MAX_SECONDS:
            raise InvalidArgumentError(
                f"hint {i}: next_use_s must be None or in [0, {_MAX_SECONDS}]"
                f", not {h.next_use_s}")
        next_ms = -1 if h.next_use_s is None else _millis(h.next_use_s)
        items[i] = _lib.WeightsHintStruct(h.model.encode(), h.layout.encode(),
                                          _ptr_of(versions[i]), next_ms)
    with client._use() as h:
        check(lib.tierkv_weights_hint(h, items, len(hints)))


def pin(client: Client, model: str, layout: str, ttl_s: float, *,
        version: Optional[str] = None) -> None:
    """Keeps the shard in DRAM for `ttl_s` seconds (0: unpins it)."""
    if not 0 <= ttl_s <= _MAX_SECONDS:
        raise InvalidArgumentError(
            f"ttl_s must be in [0, {_MAX_SECONDS}], not {ttl_s}")
    v = _version_arg(version)
    with client._use() as h:
        check(lib.tierkv_weights_pin(h, model.encode(), layout.encode(),
                                     _ptr_of(v), _millis(ttl_s)))


def unpin(client: Client, model: str, layout: str, *,
          version: Optional[str] = None) -> None:
    """Ends the shard's pin (a no-op when it was not pinned)."""
    pin(client, model, layout, 0, version=version)


def list_weights(client: Client, model: str = "") -> List[dict]:
    """The sealed shards (of `model`, or all): model, layout, version,
    image_bytes, tensors, chunks, num_layers, sealed_unix_ms,
    chunks_in_dram, chunks_on_nvme, chunks_missing, unique_bytes."""
    with client._use() as h:
        return json.loads(_lib.read_string(lib.tierkv_weights_list_json, h,
                                           model.encode()))


def drop(client: Client, model: str, layout: str = "",
         version: Optional[str] = None) -> Tuple[int, int]:
    """Unseals shards of `model` (of `layout` only unless empty, of
    `version` only unless None); returns (shards dropped, bytes freed)."""
    v = _version_arg(version)
    shards, freed = c_uint32(), c_uint64()
    with client._use() as h:
        check(lib.tierkv_weights_drop(h, model.encode(), layout.encode(),
                                      _ptr_of(v), byref(shards),
                                      byref(freed)))
    return shards.value, freed.value


def _view(image: np.ndarray, t: dict, as_torch: bool):
    """Tensor `t` of a manifest as a view of `image` (numpy, or torch when
    `as_torch`)."""
    raw = image[t["offset"]:t["offset"] + t["bytes"]]
    if as_torch:
        import torch
        dtype = {v: k for k, v in _TORCH_TO_ST.items()}[t["dtype"]]
        return torch.frombuffer(raw, dtype=getattr(
            torch, dtype.split(".")[1])).view(tuple(t["shape"]))
    return raw.view(_ST_TO_NUMPY[t["dtype"]]).reshape(t["shape"])


def _copy_into(param, value) -> None:
    if _is_torch(param):
        import torch
        with torch.no_grad():  # parameters that require grad, as slime's
            param.copy_(value)
    else:
        np.copyto(param, value)


class TensorBackuper:
    """slime's `_TensorBackuperNormal` (slime/utils/tensor_backper.py) over
    a tierkvd weights namespace.

    `source_getter()` yields (name, tensor) for every tensor of this rank,
    as slime's does (numpy arrays, or torch tensors on any device). Each
    tag is stored as model `model_prefix + tag`, layout `layout` (say which
    rank and engine: "slime/megatron/tp0-pp1-of-8"), a new version per
    backup (the previous one dropped; unchanged chunks are not copied).

      backup(tag):  stores the getter's tensors as the tag's new version.
      restore(tag): copies the tag's tensors back into the getter's tensors,
                    layer by layer as they arrive (every name must have
                    been backed up: AssertionError otherwise, as in slime).
      get(tag):     {name: tensor} of fresh CPU copies ({} for a tag never
                    backed up; slime's defaultdict would also list it).
      copy(src_tag=, dst_tag=): dst's tensors take src's values.
      backup_tags:  tags backed up, in order.
      hint(tag, next_use_s): (tierkv only) when tag is restored next, so
                    the daemon brings it from NVMe into DRAM in time.

    Not thread-safe (nor is slime's). The client must stay open.
    """

    @staticmethod
    def create(source_getter: Callable[[], Iterable[Tuple[str, Any]]],
               single_tag: Optional[str] = None, *, client: Client,
               layout: str, model_prefix: str = "") -> "TensorBackuper":
        # slime's single_tag selects a no-op variant that keeps no copy at
        # all (removed upstream): a storage-backed copy is what this is for.
        del single_tag
        return TensorBackuper(source_getter, client=client, layout=layout,
                              model_prefix=model_prefix)

    def __init__(self, source_getter, *, client: Client, layout: str,
                 model_prefix: str = ""):
        self._source_getter = source_getter
        self._client = client
        self._layout = layout
        self._prefix = model_prefix
        self._versions: Dict[str, str] = {}
        self._torch: Dict[str, bool] = {}
        self._image: Optional[np.ndarray] = None  # reused by restore

    def _model(self, tag: str) -> str:
        return self._prefix + tag

    @property
    def backup_tags(self) -> List[str]:
        return list(self._versions)

    def _store(self, tag: str, tensors: List[Tuple[str, Any]],
               as_torch: bool) -> None:
        stored = put(self._client, self._model(tag), self._layout, tensors)
        old = self._versions.get(tag)
        self._versions[tag] = stored.version
        self._torch[tag] = as_torch
        if old is not None and old != stored.version:
            drop(self._client, self._model(tag), self._layout, old)

    def backup(self, tag: str) -> None:
        tensors = list(self._source_getter())
        self._store(tag, tensors, any(_is_torch(t) for _, t in tensors))

    def _manifest(self, tag: str) -> dict:
        return manifest(self._client, self._model(tag), self._layout,
                        self._versions[tag])

    def _load_all(self, tag: str) -> Tuple[dict, np.ndarray]:
        m = self._manifest(tag)
        image = np.empty(m["image_bytes"], dtype=np.uint8)
        with load(self._client, self._model(tag), self._layout, image,
                  version=self._versions[tag]) as ld:
            ld.wait()
        return m, image

    def get(self, tag: str) -> Dict[str, Any]:
        if tag not in self._versions:
            return {}
        m, image = self._load_all(tag)
        return {t["name"]: _view(image, t, self._torch[tag])
                for t in m["tensors"]}

    def restore(self, tag: str) -> None:
        assert tag in self._versions, f"tag {tag!r} was never backed up"
        m = self._manifest(tag)
        by_name = {t["name"]: t for t in m["tensors"]}
        if self._image is None or self._image.nbytes < m["image_bytes"]:
            self._image = np.empty(m["image_bytes"], dtype=np.uint8)
        with load(self._client, self._model(tag), self._layout, self._image,
                  version=self._versions[tag]) as ld:
            for name, param in self._source_getter():
                assert name in by_name, f"{name} was not backed up in {tag!r}"
                t = by_name[name]
                # Blocks only until this tensor's layer is in place: later
                # layers keep loading while this one is copied.
                ld.wait_layer(t["layer"])
                _copy_into(param, _view(self._image, t, _is_torch(param)))

    def hint(self, tag: str, next_use_s: Optional[float]) -> None:
        """Not in slime's interface: when `tag` is restored next, in seconds
        from now (None: unknown), so the daemon has it in DRAM by then."""
        if tag not in self._versions:
            raise KeyError(f"tag {tag!r} was never backed up")
        hint(self._client, [Hint(self._model(tag), self._layout, next_use_s,
                                 self._versions[tag])])

    def copy(self, *, src_tag: str, dst_tag: str) -> None:
        if dst_tag not in self._versions:
            return  # slime copies the names dst has: none
        src_m, src_image = self._load_all(src_tag)
        src = {t["name"]: t for t in src_m["tensors"]}
        dst_names = [t["name"] for t in self._manifest(dst_tag)["tensors"]]
        self._store(dst_tag,
                    [(n, _view(src_image, src[n], self._torch[src_tag]))
                     for n in dst_names],
                    self._torch[dst_tag])
