"""ctypes declarations of libtierkv_c.so (include/tierkv/c_api.h).

Why ctypes over a pybind11/nanobind extension: the C API is the one ABI
tierkv promises to other languages, so binding exactly it means every Python
test exercises the C API too; the package has no compiled code tied to one
CPython version; and ctypes releases the GIL around every foreign call, so
blocking calls (Match, Get, WaitLayer) never stall other Python threads.
Per-call overhead is a few microseconds, paid once per batch, not per byte
(bench/python_client_bench.py measures it against the C++ client).

Only this module touches ctypes; client.py wraps it in a Pythonic API.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import (POINTER, Structure, c_char, c_char_p, c_int, c_int32,
                    c_int64, c_size_t, c_uint8, c_uint16, c_uint32, c_uint64,
                    c_void_p)
from pathlib import Path

from . import errors


class PageHashStruct(Structure):
    _fields_ = [("lo", c_uint64), ("hi", c_uint64)]


class ClientOptions(Structure):
    _fields_ = [("socket_path", c_char_p), ("timeout_ms", c_uint32),
                ("prefault_arena", c_int32),
                ("max_transfers_in_flight", c_uint32)]


class WeightsTensorStruct(Structure):
    _fields_ = [("name", c_char_p), ("dtype", c_char_p),
                ("shape", c_void_p), ("ndim", c_uint32), ("layer", c_uint32),
                ("data", c_void_p), ("bytes", c_uint64)]


class WeightsStoredStruct(Structure):
    _fields_ = [("version", PageHashStruct), ("image_bytes", c_uint64),
                ("num_layers", c_uint32), ("tensors", c_uint32),
                ("chunks", c_uint32), ("chunks_stored", c_uint32),
                ("chunks_deduplicated", c_uint32),
                ("bytes_stored", c_uint64), ("bytes_deduplicated", c_uint64)]


class WeightsHintStruct(Structure):
    _fields_ = [("model", c_char_p), ("layout", c_char_p),
                ("version", c_void_p), ("next_use_ms", c_int64)]


ABI_VERSION = 1
_status = c_int
_u8p = POINTER(c_uint8)
_hashp = c_void_p  # (n, 2) uint64 numpy arrays, passed by address


def _library_path() -> str:
    override = os.environ.get("TIERKV_C_LIBRARY")
    if override:
        return override
    return str(Path(__file__).resolve().parent / "libtierkv_c.so")


def _load() -> ctypes.CDLL:
    path = _library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(
            f"tierkv: cannot load the C library {path} ({e}); build it with "
            "`scripts/build.sh build` (then PYTHONPATH=build/python) or "
            "install the package with `pip install .`") from e
    sigs = {
        "tierkv_abi_version": (c_uint32, []),
        "tierkv_last_error": (c_char_p, []),
        "tierkv_status_name": (c_char_p, [c_int]),
        "tierkv_root_page_hash": (_status, [c_char_p, c_void_p]),
        "tierkv_page_hash_chain": (_status, [
            c_void_p, c_void_p, c_size_t, c_uint32, c_void_p, c_size_t,
            c_void_p, c_size_t, POINTER(c_size_t)]),
        "tierkv_client_connect": (_status, [
            POINTER(ClientOptions), POINTER(c_void_p)]),
        "tierkv_client_close": (None, [c_void_p]),
        "tierkv_open_namespace": (_status, [c_void_p, c_char_p, c_char_p]),
        "tierkv_register_layout": (_status, [
            c_void_p, c_uint32, c_uint32, c_void_p, POINTER(c_char_p),
            c_void_p]),
        "tierkv_layout_json": (_status, [
            c_void_p, POINTER(c_char), c_size_t, POINTER(c_size_t)]),
        "tierkv_match": (_status, [
            c_void_p, _hashp, c_size_t, POINTER(c_uint32), c_void_p]),
        "tierkv_put": (_status, [
            c_void_p, _hashp, c_void_p, c_void_p, c_void_p, c_void_p,
            c_size_t, c_void_p, c_void_p]),
        "tierkv_get": (_status, [
            c_void_p, _hashp, c_void_p, c_void_p, c_void_p, c_void_p,
            c_size_t, c_void_p]),
        "tierkv_flush": (_status, [
            c_void_p, _hashp, c_void_p, c_void_p, c_size_t, c_void_p]),
        "tierkv_acquire": (_status, [
            c_void_p, _hashp, c_void_p, c_void_p, c_size_t,
            POINTER(c_void_p)]),
        "tierkv_read_lease_item": (_status, [
            c_void_p, c_size_t, POINTER(c_void_p), POINTER(c_uint64)]),
        "tierkv_read_lease_release": (_status, [c_void_p]),
        "tierkv_read_lease_free": (None, [c_void_p]),
        "tierkv_register_pool": (_status, [
            c_void_p, c_int, c_uint64, c_uint64, c_uint32, c_uint16,
            c_uint8]),
        "tierkv_load": (_status, [
            c_void_p, _hashp, c_void_p, c_size_t, c_uint16, c_uint16,
            POINTER(c_void_p)]),
        "tierkv_store": (_status, [
            c_void_p, _hashp, c_void_p, c_size_t, c_uint16, c_uint16,
            POINTER(c_void_p)]),
        "tierkv_transfer_wait_layer": (_status, [c_void_p, c_uint16,
                                                 c_void_p]),
        "tierkv_transfer_wait": (_status, [c_void_p, c_void_p]),
        "tierkv_transfer_layers_done": (c_uint16, [c_void_p]),
        "tierkv_transfer_free": (None, [c_void_p]),
        "tierkv_prefetch": (_status, [c_void_p, _hashp, c_size_t]),
        "tierkv_report_topk": (_status, [
            c_void_p, _hashp, c_void_p, c_void_p, c_size_t]),
        "tierkv_weights_put": (_status, [
            c_void_p, c_char_p, c_char_p, c_void_p, c_size_t,
            POINTER(WeightsStoredStruct)]),
        "tierkv_weights_plan_json": (_status, [
            c_char_p, c_char_p, c_void_p, c_size_t, POINTER(c_char),
            c_size_t, POINTER(c_size_t)]),
        "tierkv_weights_put_from_pool": (_status, [
            c_void_p, c_char_p, c_char_p, c_void_p, c_size_t,
            POINTER(WeightsStoredStruct)]),
        "tierkv_weights_import_safetensors": (_status, [
            c_void_p, c_char_p, c_char_p, c_char_p,
            POINTER(WeightsStoredStruct)]),
        "tierkv_weights_manifest_json": (_status, [
            c_void_p, c_char_p, c_char_p, c_void_p, POINTER(c_char),
            c_size_t, POINTER(c_size_t)]),
        "tierkv_weights_load_start": (_status, [
            c_void_p, c_char_p, c_char_p, c_void_p, c_void_p, c_uint64,
            c_uint16, c_uint16, POINTER(c_void_p)]),
        "tierkv_weights_load_to_pool_start": (_status, [
            c_void_p, c_char_p, c_char_p, c_void_p, c_uint16, c_uint16,
            POINTER(c_void_p)]),
        "tierkv_weights_load_wait_layer": (_status, [c_void_p, c_uint32]),
        "tierkv_weights_load_wait": (_status, [c_void_p]),
        "tierkv_weights_load_layers_done": (c_uint32, [c_void_p]),
        "tierkv_weights_load_version": (_status, [c_void_p, c_void_p]),
        "tierkv_weights_load_free": (None, [c_void_p]),
        "tierkv_weights_prefetch": (_status, [
            c_void_p, c_char_p, c_char_p, c_void_p, c_uint16, c_uint16]),
        "tierkv_weights_hint": (_status, [
            c_void_p, POINTER(WeightsHintStruct), c_size_t]),
        "tierkv_weights_pin": (_status, [
            c_void_p, c_char_p, c_char_p, c_void_p, c_uint64]),
        "tierkv_weights_list_json": (_status, [
            c_void_p, c_char_p, POINTER(c_char), c_size_t,
            POINTER(c_size_t)]),
        "tierkv_weights_drop": (_status, [
            c_void_p, c_char_p, c_char_p, c_void_p, POINTER(c_uint32),
            POINTER(c_uint64)]),
        "tierkv_ping": (_status, [
            c_void_p, POINTER(c_char), c_size_t, POINTER(c_size_t)]),
        "tierkv_stats_json": (_status, [
            c_void_p, POINTER(c_char), c_size_t, POINTER(c_size_t)]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    version = lib.tierkv_abi_version()
    if version != ABI_VERSION:
        raise ImportError(f"tierkv: {path} has C ABI version {version}, "
                          f"this package needs {ABI_VERSION}")
    return lib


lib = _load()


def last_error() -> str:
    return lib.tierkv_last_error().decode("utf-8", "replace")


def check(status: int, statuses=None) -> None:
    """Raises the typed error for a non-OK status of the call just made."""
    if status == 0:
        return
    index = None
    if statuses is not None:
        failing = (statuses != 0).nonzero()[0]
        index = int(failing[0]) if len(failing) else None
    raise errors.error_for(status, last_error(), statuses=statuses,
                           index=index)


def read_string(fn, *args) -> str:
    """Calls a (buf, cap, *len) string getter, growing the buffer once."""
    cap = 4096
    while True:
        buf = ctypes.create_string_buffer(cap)
        length = c_size_t()
        check(fn(*args, buf, cap, ctypes.byref(length)))
        if length.value < cap:
            return buf.value.decode("utf-8")
        cap = length.value + 1
