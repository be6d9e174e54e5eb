"""Engine adapter tests: tierkv.sglang and tierkv.vllm against the engines'
real classes (sglang 0.5.23, vllm 0.33.0) and real tierkvd processes.

Run in the engines virtualenv (scripts/engines-venv.sh; scripts/test.sh
does it): build/engines-venv/bin/python -m pytest tests/engines. A machine
where an engine does not import skips that engine's tests and says why.
"""

from __future__ import annotations

import os

import pytest

from tierkv.testing import Tierkvd

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TOKEN = "engine-test-token"


def namespace_config(write_policy: str = "write_through") -> str:
    # write_through: every page is on NVMe once stored, so a daemon restart
    # between store and load still hits.
    return f"""
[nvme]
path = "{{DIR}}/nvme.data"
capacity_bytes = "256MiB"
[[namespace]]
name = "default"
token = "{TOKEN}"
host_bytes = "64MiB"
shards = 1
write_policy = "{write_policy}"
"""


@pytest.fixture
def daemon(tmp_path):
    d = Tierkvd(tmp_path / "run", namespace_config())
    d.start()
    yield d
    d.stop()
