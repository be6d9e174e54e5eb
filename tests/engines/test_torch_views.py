"""The Python package with torch (present in the engines' environment):
pools as torch tensors through DLPack (no copy), and torch CPU tensors as
Put sources and Get destinations (no copy)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402

import tierkv  # noqa: E402
from conftest import TOKEN  # noqa: E402


def test_a_pool_is_a_torch_tensor_on_the_same_memory():
    pool = tierkv.Pool(4096, 3)
    t = pool.tensor()
    assert t.shape == (3, 4096) and t.dtype == torch.uint8
    t[1, 7] = 201
    assert pool.array[1, 7] == 201
    assert t.data_ptr() == pool.array.__array_interface__["data"][0]


def test_torch_tensors_are_put_and_got_in_place(daemon):
    c = tierkv.connect(daemon.socket, namespace="default", token=TOKEN)
    c.register_layout(tierkv.Layout.uniform(16, 1, [("kv", 64)]))
    pages = tierkv.page_hashes(np.arange(64), 16, namespace="default")
    src = torch.randint(0, 256, (4, 16 * 64), dtype=torch.uint8)
    c.put(pages, 0, 0, src)
    dst = torch.zeros_like(src)
    c.get(pages, 0, 0, dst)
    assert torch.equal(dst, src)
    with pytest.raises(tierkv.InvalidArgumentError, match="contiguous"):
        c.get(pages, 0, 0, torch.zeros(16 * 64, 4, dtype=torch.uint8).T)
