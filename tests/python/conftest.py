"""Fixtures for the Python package's tests: a real tierkvd per test."""

from __future__ import annotations

import pytest

from tierkv.testing import Tierkvd

TOKEN = "python-test-token"

# One namespace with an NVMe tier (write-back), 16 MiB of DRAM.
CONFIG = f"""
[nvme]
path = "{{DIR}}/nvme.data"
capacity_bytes = "64MiB"
[[namespace]]
name = "default"
token = "{TOKEN}"
host_bytes = "16MiB"
shards = 1
"""


@pytest.fixture
def daemon(tmp_path):
    d = Tierkvd(tmp_path / "run", CONFIG)
    d.start()
    yield d
    d.stop()
