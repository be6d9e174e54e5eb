"""`tierkv stats --watch` in a real terminal: tmux runs it full-screen
against a real tierkvd, the test reads the screen with capture-pane while a
workload moves the counters, then quits it with `q` (send-keys). The last
captures (during the workload, after it) are kept under $TIERKV_OPS_ARTIFACTS
(default build/ops-artifacts) as stats-watch-live.txt and stats-watch.txt."""

from __future__ import annotations

import os
import re
import select
import subprocess
import time
from pathlib import Path

import pytest

from conftest import TOKEN, artifacts_dir, require_tool


class Tmux:
    """A tmux server of its own (socket in the test's directory)."""

    def __init__(self, workdir: Path):
        self.tmux = require_tool("tmux")
        self.socket = str(workdir / "tmux.sock")

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([self.tmux, "-S", self.socket, *args],
                              capture_output=True, text=True, timeout=30)

    def capture(self) -> str:
        r = self.run("capture-pane", "-p", "-t", "watch")
        return r.stdout if r.returncode == 0 else ""

    def wait_for(self, what: str, pred, timeout: float = 30.0) -> str:
        """Polls the screen until `pred(screen)` holds: a bounded poll of
        the real screen, as tmux tells no outside client that a pane
        changed."""
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.capture()
            if pred(screen):
                return screen
            time.sleep(0.1)
        pytest.fail(f"tierkv stats --watch: {what} not within {timeout} s; "
                    f"screen:\n{screen}")

    def kill(self):
        self.run("kill-server")


def exit_status_fifo(tmp_path: Path) -> Path:
    """A FIFO the watched command's shell writes its exit status to
    (`echo $? > fifo`), for exit_status()."""
    fifo = tmp_path / "exit-status"
    os.mkfifo(fifo)
    return fifo


def exit_status(fifo: Path, timeout: float = 10.0) -> str:
    """The exit status the shell writes to `fifo`, waiting for the write
    itself (select on the FIFO) rather than polling for a file that may
    exist before its contents do. "" if nothing came within `timeout`."""
    # Non-blocking: opening the read end waits for no writer, and until one
    # has come and gone, select reports nothing (Linux: no EOF before the
    # first writer), so it wakes on the shell's write.
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        data = b""
        deadline = time.monotonic() + timeout
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                break
            chunk = os.read(fd, 64)
            if not chunk:
                break  # the shell closed it
            data += chunk
        return data.decode().strip()
    finally:
        os.close(fd)


def refresh_of(screen: str) -> int:
    m = re.search(r"refresh (\d+) every", screen)
    return int(m.group(1)) if m else 0


def test_stats_watch_under_tmux(all_tiers_daemon, bins, tmp_path):
    d = all_tiers_daemon
    tmux = Tmux(tmp_path)
    done = exit_status_fifo(tmp_path)
    command = (f"{bins / 'tierkv'} --socket {d.socket} --token {TOKEN} "
               f"stats --watch --interval 0.5; echo $? > {done}")
    r = tmux.run("new-session", "-d", "-s", "watch", "-x", "120", "-y", "30",
                 command)
    assert r.returncode == 0, r.stderr
    try:
        first = tmux.wait_for("the first frame",
                              lambda s: refresh_of(s) >= 1)
        assert "namespace default" in first
        # No rates before a second Stats.
        assert re.search(r"lookups +-/s", first), first
        # A workload moves the counters: demo runs until a frame's rates
        # show its lookups.
        def lookups_per_s(screen: str) -> float:
            m = re.search(r"lookups +([0-9.]+)/s", screen)
            return float(m.group(1)) if m else 0.0

        deadline = time.monotonic() + 60
        screen = ""
        while lookups_per_s(screen) <= 0:
            assert time.monotonic() < deadline, screen
            demo = subprocess.Popen(
                [str(bins / "tierkv"), "--socket", d.socket, "--token", TOKEN,
                 "demo", "--sessions", "6", "--prefix-tokens", "2048",
                 "--session-tokens", "1024"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            # A bounded poll of the screen (tmux has no change event),
            # ended by the demo's exit at the latest.
            while demo.poll() is None and lookups_per_s(screen) <= 0:
                screen = tmux.capture()
                time.sleep(0.05)
            assert demo.wait(120) == 0, demo.stderr.read()
        assert re.search(r"tokens +[1-9][0-9]*/s", screen), screen
        (artifacts_dir() / "stats-watch-live.txt").write_text(screen)
        # The workload has stopped (demo.wait above): two refreshes later
        # every rate is 0 and the shares are those since start.
        after = refresh_of(tmux.capture())
        screen = tmux.wait_for("two refreshes after the workload",
                               lambda s: refresh_of(s) >= after + 2)
        assert lookups_per_s(screen) == 0.0, screen

        # The view: every tier with an occupancy bar, hit shares that add up
        # to 100%, and host DRAM as full as the daemon says.
        for tier in ("hbm", "host", "nvme"):
            assert re.search(rf"^  {tier} +\S+ \S+ / ", screen, re.M), screen
        shares = {m.group(1): float(m.group(2)) for m in re.finditer(
            r"^  (hbm|host|nvme|miss) +(\d+\.\d)% \|[#.]+\|", screen, re.M)}
        assert set(shares) == {"hbm", "host", "nvme", "miss"}, screen
        assert sum(shares.values()) == pytest.approx(100.0, abs=0.3)
        # The demo's second turn re-reads its prompts: some tokens hit.
        assert shares["miss"] < 100.0, screen
        host = re.search(r"^  host +\S+ \S+ / \S+ \S+ +(\d+\.\d)% \|(#*)",
                         screen, re.M)
        assert float(host.group(1)) > 90.0, screen  # 8 MiB, overfilled
        assert len(host.group(2)) > 0
        assert "nvme health: 0 checksum failures, 0 demotions failed" in screen

        (artifacts_dir() / "stats-watch.txt").write_text(screen)

        # q quits at once, restores the screen and exits 0.
        tmux.run("send-keys", "-t", "watch", "q")
        assert exit_status(done) == "0", tmux.capture()
        print(screen)
    finally:
        tmux.kill()


def test_stats_watch_rides_out_a_daemon_restart(all_tiers_daemon, bins,
                                                tmp_path):
    d = all_tiers_daemon
    tmux = Tmux(tmp_path)
    done = exit_status_fifo(tmp_path)
    command = (f"{bins / 'tierkv'} --socket {d.socket} --token {TOKEN} "
               f"stats --watch --interval 0.2; echo $? > {done}")
    assert tmux.run("new-session", "-d", "-s", "watch", "-x", "120", "-y",
                    "30", command).returncode == 0
    try:
        tmux.wait_for("the first frame", lambda s: "namespace default" in s)
        d.stop()
        down = tmux.wait_for("the daemon's absence",
                             lambda s: "tierkvd unreachable" in s)
        assert "retrying every 0.2 s" in down, down
        d.start()  # same socket, same NVMe file
        up = tmux.wait_for("frames again after the restart",
                           lambda s: "namespace default" in s)
        # The whole view is back (the client reconnected by itself).
        assert re.search(r"^  host +\S+ \S+ / ", up, re.M), up
        tmux.run("send-keys", "-t", "watch", "q")
        assert exit_status(done) == "0", tmux.capture()
    finally:
        tmux.kill()


def test_stats_watch_count_without_a_terminal(all_tiers_daemon, bins):
    # Piped (no terminal): plain frames one after another, no escapes.
    r = subprocess.run(
        [str(bins / "tierkv"), "--socket", all_tiers_daemon.socket, "--token",
         TOKEN, "stats", "--watch", "--interval", "0.1", "--count", "3"],
        capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout
    assert [int(n) for n in re.findall(r"refresh (\d+) every", r.stdout)] == [
        1, 2, 3]
    bad = subprocess.run(
        [str(bins / "tierkv"), "--socket", all_tiers_daemon.socket, "--token",
         TOKEN, "stats", "--watch", "--interval", "0.01"],
        capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert "--interval must be at least 0.1 s" in bad.stderr
    # A daemon that is not there at the start is an error, not a wait.
    absent = subprocess.run(
        [str(bins / "tierkv"), "--socket", str(all_tiers_daemon.dir / "no"),
         "--token", TOKEN, "stats", "--watch"],
        capture_output=True, text=True, timeout=60)
    assert absent.returncode == 1
    assert "tierkv:" in absent.stderr and absent.stdout == ""
