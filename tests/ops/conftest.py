"""Fixtures for the operations tests (tests/ops): the repository, the built
binaries, and real tierkvd processes (tierkv.testing.Tierkvd).

Run by scripts/test.sh in the ops virtualenv (scripts/ops-venv.sh):
    PYTHONPATH=build/python TIERKV_BIN_DIR=build/bin \
        build/ops-venv/bin/python -m pytest -q tests/ops
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tierkv.testing import Tierkvd, bin_dir

REPO = Path(__file__).resolve().parents[2]

TOKEN = "ops-test-token"

# A daemon with every tier: an emulated HBM tier, 8 MiB of DRAM per
# namespace (so a demo workload evicts and spills) and an NVMe tier on a file.
ALL_TIERS_CONFIG = f"""
[nvme]
path = "{{DIR}}/nvme.data"
capacity_bytes = "256MiB"
sync = false
[hbm]
backend = "emulated"
capacity_bytes = "16MiB"
[[namespace]]
name = "default"
token = "{TOKEN}"
host_bytes = "8MiB"
[[namespace]]
name = "batch"
token = "{TOKEN}-batch"
host_bytes = "8MiB"
"""


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def bins() -> Path:
    d = bin_dir()
    for name in ("tierkvd", "tierkv"):
        if not os.access(d / name, os.X_OK):
            pytest.fail(f"no {name} in {d}: build first (scripts/build.sh)")
    return d


def require_tool(name: str) -> str:
    """The path of a program the test needs; a clear failure when missing
    (scripts/install-deps.sh installs every one of them)."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: run scripts/install-deps.sh")
    return path


def stop_process(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    """SIGTERM, then SIGKILL if it has not exited within `timeout`."""
    proc.terminate()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def artifacts_dir() -> Path:
    """Where tests leave what a person should look at (screenshots, screen
    captures): $TIERKV_OPS_ARTIFACTS, default build/ops-artifacts."""
    d = Path(os.environ.get("TIERKV_OPS_ARTIFACTS",
                            REPO / "build" / "ops-artifacts"))
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture
def all_tiers_daemon(tmp_path, bins):
    """A real tierkvd with HBM (emulated), host and NVMe tiers and two
    namespaces, "default" and "batch" (tokens TOKEN, TOKEN + "-batch")."""
    d = Tierkvd(tmp_path / "run", ALL_TIERS_CONFIG)
    d.start()
    yield d
    d.stop()
