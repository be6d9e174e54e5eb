"""The built-in status page (daemon/status_page.html) in a real browser:
Debian's Chromium, headless, driven over the DevTools protocol, loads
/status from a real tierkvd with every tier, shows both namespaces, tiers and
NVMe health, and updates when the daemon's counters move; the page fetches
nothing but this daemon's /metrics. The screenshot is kept under
$TIERKV_OPS_ARTIFACTS (default build/ops-artifacts) as status-page.png."""

from __future__ import annotations

import base64
import itertools
import json
import re
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import websocket

from conftest import TOKEN, artifacts_dir, require_tool, stop_process


def run_demo(bins: Path, sock: str, namespace: str, token: str):
    r = subprocess.run(
        [str(bins / "tierkv"), "--socket", sock, "-n", namespace, "--token",
         token, "demo", "--sessions", "4", "--prefix-tokens", "1024",
         "--session-tokens", "512"],
        capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


class Chromium:
    """Headless Chromium with the DevTools protocol on a loopback port."""

    def __init__(self, workdir: Path):
        profile = workdir / "chromium-profile"
        self.log = open(workdir / "chromium.log", "wb")
        self.proc = subprocess.Popen(
            [require_tool("chromium"), "--headless=new", "--no-sandbox",
             "--disable-gpu", "--no-first-run", "--disable-extensions",
             "--remote-debugging-address=127.0.0.1",
             "--remote-debugging-port=0", f"--user-data-dir={profile}",
             "--window-size=1280,800", "about:blank"],
            stdout=self.log, stderr=subprocess.STDOUT)
        # Chromium's only signal that its DevTools endpoint listens: a
        # bounded poll for the port file.
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("chromium did not start: " +
                            Path(self.log.name).read_text(errors="replace"))
            time.sleep(0.1)
        self.port = int(port_file.read_text().split()[0])

    def new_page(self) -> "Page":
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/json/new?about:blank", method="PUT")
        with urllib.request.urlopen(req, timeout=30) as r:
            target = json.loads(r.read())
        return Page(target["webSocketDebuggerUrl"])

    def stop(self):
        stop_process(self.proc)
        self.log.close()


class Page:
    """One tab: commands over its DevTools websocket; events are kept."""

    def __init__(self, ws_url: str):
        self.ws = websocket.create_connection(ws_url, timeout=30,
                                              suppress_origin=True)
        self.ids = itertools.count(1)
        self.events: list[dict] = []

    def cmd(self, method: str, **params):
        msg_id = next(self.ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method,
                                 "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == msg_id:
                assert "error" not in msg, (method, msg)
                return msg["result"]
            self.events.append(msg)

    def eval(self, expr: str):
        r = self.cmd("Runtime.evaluate", expression=expr, returnByValue=True)
        assert "exceptionDetails" not in r, (expr, r)
        return r["result"].get("value")

    def wait_for(self, what: str, expr: str, timeout: float = 30.0):
        """Polls a condition on the page's DOM until it holds (an exception
        counts as "not yet": the page may still be loading). A bounded poll
        of the page itself: an in-page observer would die with the document
        while a navigation replaces it."""
        deadline = time.monotonic() + timeout
        guarded = f"(() => {{ try {{ return {expr}; }} catch (e) {{ return false; }} }})()"
        while time.monotonic() < deadline:
            if self.eval(guarded):
                return
            time.sleep(0.1)
        pytest.fail(f"status page: {what} not within {timeout} s; page text:\n"
                    + str(self.eval("document.body.innerText")))


def test_status_page_is_static_and_self_contained(all_tiers_daemon):
    url = f"http://127.0.0.1:{all_tiers_daemon.metrics_port}"
    for path in ("/", "/status"):
        with urllib.request.urlopen(url + path, timeout=10) as r:
            assert r.status == 200
            assert r.headers["Content-Type"] == "text/html; charset=utf-8"
            csp = r.headers["Content-Security-Policy"]
            assert "default-src 'none'" in csp and "connect-src 'self'" in csp
            html = r.read().decode()
        assert "<title>tierkvd status</title>" in html
        # No asset from anywhere: no absolute URL, no src/href but ./metrics.
        assert not re.search(r"https?://", html), "an absolute URL"
        assert re.findall(r'(?:src|href)="([^"]*)"', html) == ["metrics"]
    # Anything else on the listener is still prometheus-cpp's.
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        assert b"tierkv_tier_bytes" in r.read()
    req = urllib.request.Request(url + "/status", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 405


def test_status_page_in_headless_chromium(all_tiers_daemon, bins, tmp_path):
    d = all_tiers_daemon
    run_demo(bins, d.socket, "default", TOKEN)
    run_demo(bins, d.socket, "batch", TOKEN + "-batch")
    origin = f"http://127.0.0.1:{d.metrics_port}"
    browser = Chromium(tmp_path)
    try:
        page = browser.new_page()
        page.cmd("Network.enable")
        page.cmd("Page.enable")
        page.cmd("Page.navigate", url=origin + "/status")
        page.wait_for("two refreshes", "Number(document.getElementById("
                      "'refreshes').textContent) >= 2")
        row = "document.querySelector('tr[data-namespace=\"default\"]')"
        before = page.eval(f"Number({row}.dataset.tokens)")
        assert before > 0
        # The daemon's counters move; the page follows within a refresh.
        run_demo(bins, d.socket, "default", TOKEN)
        page.wait_for("the new lookups",
                      f"Number({row}.dataset.tokens) > {before}")
        # A few more refreshes under load, so the chart (and the
        # screenshot) shows hit shares over time.
        refreshes = page.eval(
            "Number(document.getElementById('refreshes').textContent)")
        stop = threading.Event()

        def load():
            while not stop.is_set():
                run_demo(bins, d.socket, "default", TOKEN)

        loader = threading.Thread(target=load)
        loader.start()
        try:
            page.wait_for("four refreshes under load",
                          "Number(document.getElementById('refreshes')"
                          f".textContent) >= {refreshes + 4}")
        finally:
            stop.set()
            loader.join()

        namespaces = page.eval(
            "[...document.querySelectorAll('#namespaces tbody tr')]"
            ".map(r => [r.dataset.namespace, r.querySelector('.hit')"
            ".textContent, r.querySelector('.share-nvme').textContent])")
        assert sorted(n for n, _, _ in namespaces) == ["batch", "default"]
        for name, hit, nvme in namespaces:
            # Both namespaces ran a demo: a second turn over the same prompt.
            assert re.fullmatch(r"\d+\.\d%", hit), (name, hit)
            assert 0 < float(hit[:-1]) <= 100, (name, hit)
            assert re.fullmatch(r"\d+\.\d%", nvme), (name, nvme)
        tiers = page.eval(
            "[...document.querySelectorAll('#tiers tbody tr')]"
            ".map(r => [r.dataset.tier, r.querySelector('.used')"
            ".textContent])")
        assert [t for t, _ in tiers] == ["hbm", "host", "nvme"]
        nvme_state = page.eval(
            "document.querySelector('#nvme tbody td').textContent")
        assert nvme_state == "writable"
        assert page.eval("document.getElementById('error').textContent") == ""
        # The chart drew something for the namespace that just looked up.
        painted = page.eval(
            f"(() => {{ const c = {row}.querySelector('canvas');"
            " const px = c.getContext('2d').getImageData(0, 0, c.width,"
            " c.height).data; let n = 0; for (let i = 0; i < px.length;"
            " i += 4) if (px[i] !== 0xf3 || px[i + 1] !== 0xf4) n++;"
            " return n; })()")
        assert painted > 0

        shot = page.cmd("Page.captureScreenshot", format="png")
        png = base64.b64decode(shot["data"])
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        (tmp_path / "status-page.png").write_bytes(png)
        (artifacts_dir() / "status-page.png").write_bytes(png)

        requested = {e["params"]["request"]["url"] for e in page.events
                     if e.get("method") == "Network.requestWillBeSent"}
        assert requested, "no request seen"
        assert all(u.startswith(origin + "/") for u in requested), requested
        assert origin + "/metrics" in requested
        print("status page:", namespaces, tiers)
    finally:
        browser.stop()
