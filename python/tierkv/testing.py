"""tierkv.testing: a real tierkvd for tests and benchmarks (the Python twin
of tests/testing/daemon_process.h), e.g. in an engine's own test suite:

    with tierkv.testing.Tierkvd(tmp_path, config_toml) as d:
        client = tierkv.connect(d.socket, namespace="default", token=...)

It starts on a socket in the given directory, is ready when it has written
its --ready-file, and stops with SIGTERM (then SIGKILL). The binary comes
from $TIERKV_BIN_DIR, else `tierkvd` on PATH, else the source tree's
build/bin."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, Optional, Sequence

def bin_dir() -> Path:
    """Where tierkvd (and the other tierkv binaries) are."""
    if os.environ.get("TIERKV_BIN_DIR"):
        return Path(os.environ["TIERKV_BIN_DIR"])
    on_path = shutil.which("tierkvd")
    if on_path:
        return Path(on_path).parent
    # build/python/tierkv/testing.py -> build/bin
    return Path(__file__).resolve().parents[2] / "bin"


class Tierkvd:
    """One daemon. `config` is TOML text ("{DIR}" becomes the directory);
    None runs on embedded defaults plus `args`."""

    def __init__(self, directory: Path, config: Optional[str] = None,
                 args: Sequence[str] = (), env: Optional[Dict[str, str]] = None):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.socket = str(self.dir / "tierkv.sock")
        self.config = config
        self.args = list(args)
        self.env = env or {}
        self.proc: Optional[subprocess.Popen] = None
        self.metrics_port = 0

    def start(self, timeout: float = 30.0) -> "Tierkvd":
        binary = bin_dir() / "tierkvd"
        if not os.access(binary, os.X_OK):
            raise FileNotFoundError(
                f"no tierkvd at {binary} (build it, or set TIERKV_BIN_DIR)")
        if self.proc is not None:
            raise RuntimeError("this Tierkvd is running already")
        ready = self.dir / "ready.json"
        ready.unlink(missing_ok=True)
        argv = [str(binary), "--socket", self.socket, "--metrics",
                "127.0.0.1:0", "--ready-file", str(ready), "--log-level",
                "info"]
        if self.config is not None:
            path = self.dir / "tierkvd.toml"
            path.write_text(self.config.replace("{DIR}", str(self.dir)))
            argv += ["--config", str(path)]
        argv += self.args
        self._log = open(self.dir / "tierkvd.log", "ab")
        self.proc = subprocess.Popen(argv, stdout=self._log,
                                     stderr=subprocess.STDOUT,
                                     env={**os.environ, **self.env})
        # The ready file is the daemon's only "serving" signal: wait for it
        # (or for the process to die) up to `timeout`.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tierkvd exited during start-up "
                                   f"({self.proc.returncode}):\n{self.log()}")
            try:
                self.metrics_port = json.loads(ready.read_text()).get(
                    "metrics_port", 0)
                return self
            except (FileNotFoundError, json.JSONDecodeError):
                time.sleep(0.01)
        self.stop(signal.SIGKILL)
        raise RuntimeError(f"tierkvd did not become ready:\n{self.log()}")

    def token(self, namespace: str = "default") -> str:
        """The token of a namespace the embedded defaults created."""
        return (self.dir / f"{namespace}.token").read_text().strip()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc is None:
            return -1
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        self._log.close()
        return code

    def log(self) -> str:
        try:
            return (self.dir / "tierkvd.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> "Tierkvd":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
