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


WEIGHTS_TOKEN = "python-weights-token"

# A weights namespace (model weights, issue 28): 256 MiB of DRAM is its
# least, and an NVMe tier below it.
WEIGHTS_CONFIG = f"""
[nvme]
path = "{{DIR}}/nvme.data"
capacity_bytes = "64MiB"
[[namespace]]
name = "weights"
token = "{WEIGHTS_TOKEN}"
host_bytes = "256MiB"
weights = true
"""


@pytest.fixture
def weights_daemon(tmp_path):
    d = Tierkvd(tmp_path / "run", WEIGHTS_CONFIG)
    d.start()
    yield d
    d.stop()
