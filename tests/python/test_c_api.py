"""The C API used from C: tests/c_api/c_api_smoke.c against a real tierkvd."""

import subprocess

from conftest import TOKEN, WEIGHTS_TOKEN
from tierkv.testing import bin_dir


def test_a_c_program_stores_and_reads_through_the_c_api(daemon):
    run = subprocess.run([str(bin_dir() / "c_api_smoke"), daemon.socket, TOKEN],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok ok"


def test_a_c_program_stores_loads_lists_and_drops_weights(weights_daemon):
    run = subprocess.run([str(bin_dir() / "c_api_weights"),
                          weights_daemon.socket, WEIGHTS_TOKEN],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"
