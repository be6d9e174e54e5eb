"""The package's distribution name and the unrelated PyPI project that owns
the name `tierkv` (and installs a top-level package `tierkv` too)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tierkv


def import_in_subprocess(extra_path: Path) -> subprocess.CompletedProcess:
    package_root = Path(tierkv.__file__).resolve().parents[1]
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(package_root), str(extra_path)])}
    return subprocess.run(
        [sys.executable, "-W", "always", "-c", "import tierkv"],
        env=env, capture_output=True, text=True, timeout=60)


def test_importing_warns_when_the_unrelated_tierkv_distribution_is_installed(
        tmp_path):
    # What `pip install tierkv` leaves besides its files: its metadata.
    info = tmp_path / "tierkv-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tierkv\nVersion: 0.1.0\n")
    result = import_in_subprocess(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "unrelated PyPI package 'tierkv' 0.1.0" in result.stderr
    assert "pip uninstall tierkv" in result.stderr


def test_importing_is_quiet_without_it(tmp_path):
    result = import_in_subprocess(tmp_path)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert tierkv.DISTRIBUTION == "tierkvd-client"
