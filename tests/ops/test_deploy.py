"""deploy/: the systemd unit, the container image and the Kubernetes
manifests, checked with what runs on this machine (deploy/README.md,
"What is validated"):

* systemd: `systemd-analyze verify` of the shipped unit (only ExecStart's
  binary path pointed at build/bin), clean, no output at all;
  `systemd-analyze security --offline`; systemd-sysusers on the user file;
  and tierkvd run from the shipped config the way the unit runs it (non-root,
  its umask) under strace, so that every system call, socket family, written
  path and fixed-buffer byte is checked against the unit's SystemCallFilter,
  RestrictAddressFamilies, ReadWritePaths and LimitMEMLOCK.
* Docker: no daemon here, so the Dockerfile is parsed and checked (stages,
  ARGs, COPY sources against the build context, user, volumes, health
  check), and its runtime-packages.sh is run on the real binaries.
* Kubernetes: kubernetes-validate (the 1.31 OpenAPI schemas, strict) on
  every manifest and on `kubectl kustomize` output; the ServiceMonitor (a
  CRD) against a schema written here; cross-references between the objects;
  the ConfigMap's TOML through `tierkvd --check-config` and a real daemon
  the probes' exact command is run against.
"""

from __future__ import annotations

import copy
import fnmatch
import grp
import json
import os
import pwd
import re
import resource
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import tomllib
import urllib.request
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from conftest import require_tool

K8S_VERSION = "1.31.0"
UNIT_BINARY = "/usr/local/bin/tierkvd"


# --- helpers ---------------------------------------------------------------


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A systemd unit as {section: {key: [values in order]}}."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    text = path.read_text().replace("\\\n", " ")
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def parse_size(text: str) -> int:
    """systemd (64M) and tierkv (8GiB) sizes; Kubernetes quantities (10Gi)."""
    m = re.fullmatch(r"(\d+)\s*([KMGT]?)(i?B?)", text.strip())
    assert m, f"not a size: {text}"
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m.group(2)]


def syscall_groups() -> dict[str, list[str]]:
    out = subprocess.run(["systemd-analyze", "syscall-filter"],
                         capture_output=True, text=True, check=True).stdout
    groups: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        if line.startswith("@"):
            current = groups.setdefault(line.strip(), [])
        elif line.strip() and not line.strip().startswith("#") and current is not None:
            current.append(line.strip())
    return groups


def allowed_syscalls(filters: list[str]) -> set[str]:
    """The allow list systemd builds from SystemCallFilter= lines: the first
    line is an allow list (not ~), later ~lines remove, plain lines add."""
    groups = syscall_groups()

    def expand(names: str) -> set[str]:
        out: set[str] = set()
        for name in names.split():
            if name.startswith("@"):
                out |= expand(" ".join(groups[name]))
            else:
                out.add(name)
        return out

    assert filters and not filters[0].startswith("~"), "expected an allow list"
    allowed: set[str] = set()
    for f in filters:
        if f.startswith("~"):
            allowed -= expand(f[1:])
        else:
            allowed |= expand(f)
    return allowed


def k8s_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def k8s_objects(repo: Path) -> dict[str, dict]:
    objs = {}
    for f in sorted((repo / "deploy/k8s").glob("*.yaml")):
        if f.name == "kustomization.yaml":
            continue
        for d in k8s_docs(f):
            objs[d["kind"]] = d
    return objs


def configmap_toml(repo: Path) -> str:
    return k8s_objects(repo)["ConfigMap"]["data"]["tierkvd.toml"]


def check_config(bins: Path, path: Path) -> str:
    r = subprocess.run([str(bins / "tierkvd"), "-c", str(path), "--check-config"],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, f"{path}: {r.stdout}{r.stderr}"
    return r.stdout


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined."""
    out = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "Dockerfile ends in a continuation"
    return out


def dockerignored(rel: str, patterns: list[str]) -> bool:
    """Whether BuildKit leaves `rel` (or a directory above it) out of the
    context: last matching pattern wins, ! re-includes."""
    parts = rel.split("/")
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        p = pattern[1:] if negate else pattern
        p = p.lstrip("/")
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            if fnmatch.fnmatchcase(prefix, p) or (
                    p.startswith("**/") and fnmatch.fnmatchcase(parts[i - 1], p[3:])):
                ignored = not negate
                break
    return ignored


class SandboxDir:
    """A directory a non-root daemon can use (pytest's tmp dirs are 0700)."""

    def __init__(self):
        self.path = Path(tempfile.mkdtemp(prefix="tierkv-deploy-", dir="/tmp"))
        self.path.chmod(0o755)

    def make(self, name: str, mode: int = 0o750, uid: int = -1, gid: int = -1) -> Path:
        d = self.path / name
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(mode)
        os.chown(d, uid, gid)
        return d

    def cleanup(self):
        shutil.rmtree(self.path, ignore_errors=True)


@pytest.fixture
def sandbox():
    if os.geteuid() != 0:
        pytest.fail("these tests switch to an unprivileged user: run as root")
    s = SandboxDir()
    yield s
    s.cleanup()


NOBODY = pwd.getpwnam("nobody")
NOGROUP = grp.getgrgid(NOBODY.pw_gid)


def as_unit_user(memlock: int, umask: int):
    """preexec_fn: what User=, LimitMEMLOCK= and UMask= do, with nobody as
    the unprivileged user. RLIMIT_MEMLOCK is only lowered: raising it needs
    CAP_SYS_RESOURCE, which the sandbox these tests run in may not grant."""
    def drop():
        os.umask(umask)
        _, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        limit = memlock if hard == resource.RLIM_INFINITY else min(memlock, hard)
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (limit, limit))
        os.setgroups([])
        os.setgid(NOBODY.pw_gid)
        os.setuid(NOBODY.pw_uid)
    return drop


def start_daemon(argv, log: Path, ready: Path, preexec, timeout=30.0):
    ready.unlink(missing_ok=True)  # a stopped daemon leaves its own
    f = open(log, "wb")
    proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT,
                            preexec_fn=preexec)
    f.close()
    # The ready file is tierkvd's only "serving" signal: a bounded poll for
    # it (and for the process's death).
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"tierkvd exited ({proc.returncode}):\n"
                                 f"{log.read_text(errors='replace')}")
        try:
            return proc, json.loads(ready.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            time.sleep(0.02)
    proc.kill()
    proc.wait()
    raise AssertionError(f"tierkvd not ready:\n{log.read_text(errors='replace')}")


def stop_daemon(proc: subprocess.Popen, pid: int | None = None) -> int:
    """SIGTERM to tierkvd (`pid` when `proc` is strace, which would detach
    rather than pass it on); its exit status."""
    if pid is None:
        proc.send_signal(signal.SIGTERM)
    else:
        os.kill(pid, signal.SIGTERM)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


# --- systemd ---------------------------------------------------------------


@pytest.fixture(scope="module")
def unit(repo):
    return parse_unit(repo / "deploy/systemd/tierkvd.service")


@pytest.fixture(scope="module")
def unit_config(repo):
    return tomllib.loads((repo / "deploy/systemd/tierkvd.toml").read_text())


def test_systemd_verify_is_clean(repo, bins, tmp_path):
    """`systemd-analyze verify` on the shipped unit with one change, the
    binary's path (verify requires it to exist): exit 0 and not one line of
    output (it exits 0 on warnings too)."""
    bins = bins.resolve()  # unit files and strace name absolute paths
    require_tool("systemd-analyze")
    shipped = (repo / "deploy/systemd/tierkvd.service").read_text()
    copy_text = shipped.replace(f"ExecStart={UNIT_BINARY} ",
                                f"ExecStart={bins / 'tierkvd'} ")
    changed = [(a, b) for a, b in zip(shipped.splitlines(), copy_text.splitlines())
               if a != b]
    assert len(changed) == 1 and changed[0][0].startswith("ExecStart="), changed
    checked = tmp_path / "tierkvd.service"
    checked.write_text(copy_text)
    r = subprocess.run(["systemd-analyze", "verify", str(checked)],
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout + r.stderr) == (0, "")

    # The same check sees a broken unit: a misspelt key and a bad value.
    broken = tmp_path / "broken" / "tierkvd.service"
    broken.parent.mkdir()
    broken.write_text(copy_text.replace("ProtectSystem=strict",
                                        "ProtectSystem=strictest\nProtectSytem=yes"))
    r = subprocess.run(["systemd-analyze", "verify", str(broken)],
                       capture_output=True, text=True, timeout=60)
    assert "ProtectSytem" in r.stderr and "strictest" in r.stderr, r.stderr


def test_systemd_security_exposure(repo, bins, tmp_path):
    """`systemd-analyze security --offline` scores the unit file itself:
    at most 2.0 ("OK"), with the items this deployment relies on passing."""
    bins = bins.resolve()  # unit files and strace name absolute paths
    require_tool("systemd-analyze")
    text = (repo / "deploy/systemd/tierkvd.service").read_text().replace(
        f"ExecStart={UNIT_BINARY} ", f"ExecStart={bins / 'tierkvd'} ")
    path = tmp_path / "tierkvd.service"
    path.write_text(text)
    r = subprocess.run(["systemd-analyze", "security", "--offline=true",
                        "--threshold=20", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    level = float(re.search(r"Overall exposure level for tierkvd.service: ([\d.]+)",
                            r.stdout).group(1))
    assert level <= 2.0
    r = subprocess.run(["systemd-analyze", "security", "--offline=true",
                        "--json=short", str(path)],
                       capture_output=True, text=True, timeout=60, check=True)
    items = {i["name"]: i for i in json.loads(r.stdout)}
    for name in ("User=/DynamicUser=", "NoNewPrivileges=", "AmbientCapabilities=",
                 "CapabilityBoundingSet=~CAP_SYS_ADMIN", "ProtectSystem=",
                 "ProtectHome=", "PrivateTmp=", "SystemCallArchitectures=",
                 "RestrictAddressFamilies=~AF_PACKET", "UMask="):
        assert items[name]["set"] and items[name]["exposure"] is None, items[name]


def test_systemd_unit_matches_config(unit, unit_config):
    """The sandbox's writable paths are where the shipped config writes,
    the daemon runs unprivileged, and no capability is handed to it."""
    svc = unit["Service"]
    socket = Path(unit_config["server"]["socket"])
    nvme = Path(unit_config["nvme"]["path"])
    assert svc["User"] == ["tierkv"] and svc["Group"] == ["tierkv"]
    assert svc["ProtectSystem"] == ["strict"]
    writable = [Path(p) for v in svc["ReadWritePaths"] for p in v.split()]
    assert socket.parent in writable and nvme.parent in writable
    assert Path("/run") / svc["RuntimeDirectory"][0] == socket.parent
    assert Path("/var/lib") / svc["StateDirectory"][0] == nvme.parent
    assert svc["RuntimeDirectoryMode"] == ["0750"]  # group tierkv reaches the socket
    assert parse_size(svc["LimitMEMLOCK"][0]) >= 32 << 20
    assert svc["CapabilityBoundingSet"] == [""]
    assert "AmbientCapabilities" not in svc
    assert svc["NoNewPrivileges"] == ["yes"]
    exec_start = shlex.split(svc["ExecStart"][0])
    assert exec_start[0] == UNIT_BINARY
    assert exec_start[1:] == ["--config", "/etc/tierkv/tierkvd.toml"]
    # ExecStartPost waits for the same socket the config serves on.
    assert f"--socket {socket} status" in svc["ExecStartPost"][0]
    # Secure defaults in the config: 0660 socket, loopback metrics, the
    # token from a file (not inline) the daemon cannot write (/etc).
    assert unit_config["server"]["socket_mode"] == "0660"
    assert unit_config["metrics"]["listen"].startswith("127.0.0.1:")
    assert svc["IPAddressAllow"] == ["localhost"] and svc["IPAddressDeny"] == ["any"]
    for ns in unit_config["namespace"]:
        assert "token" not in ns and ns["token_file"].startswith("/etc/tierkv/")
    # Stopping leaves time to persist dirty DRAM.
    assert int(svc["TimeoutStopSec"][0]) * 1000 > unit_config["nvme"]["shutdown_persist_ms"]


def test_systemd_config_checks(repo, bins):
    out = check_config(bins, repo / "deploy/systemd/tierkvd.toml")
    assert "socket = /run/tierkv/tierkv.sock (mode 660)" in out
    assert "metrics = 127.0.0.1:9400" in out
    assert "nvme = /var/lib/tierkv/nvme.data" in out
    assert "token=/etc/tierkv/default.token" in out


def test_systemd_sysusers(repo, tmp_path):
    """The sysusers file creates the unit's user and group."""
    require_tool("systemd-sysusers")
    (tmp_path / "etc").mkdir()
    subprocess.run(["systemd-sysusers", f"--root={tmp_path}",
                    str(repo / "deploy/systemd/tierkv.sysusers")],
                   capture_output=True, check=True, timeout=30)
    users = {l.split(":")[0]: l.split(":") for l in
             (tmp_path / "etc/passwd").read_text().splitlines()}
    groups = {l.split(":")[0]: l.split(":") for l in
              (tmp_path / "etc/group").read_text().splitlines()}
    user = users["tierkv"]
    assert user[3] == groups["tierkv"][2]            # primary group tierkv
    assert user[5] == "/var/lib/tierkv" and user[6].endswith("nologin")
    assert int(user[2]) != 0


def unit_run_config(repo: Path, root: Path) -> str:
    """The shipped config with the unit's directories moved under `root`,
    sizes shrunk for a test, the socket group an existing one and the
    metrics port picked by the kernel. Nothing else changes."""
    text = (repo / "deploy/systemd/tierkvd.toml").read_text()
    subs = {'"/run/tierkv/': f'"{root}/run/', '"/var/lib/tierkv/': f'"{root}/state/',
            '"/etc/tierkv/': f'"{root}/etc/',
            'socket_group = "tierkv"': f'socket_group = "{NOGROUP.gr_name}"',
            'listen = "127.0.0.1:9400"': 'listen = "127.0.0.1:0"',
            'capacity_bytes = "64GiB"': 'capacity_bytes = "256MiB"',
            'host_bytes = "8GiB"': 'host_bytes = "16MiB"'}
    for old, new in subs.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


def test_systemd_sandbox_covers_a_real_run(repo, bins, unit, sandbox):
    """tierkvd from the shipped config, run as the unit runs it (a non-root
    user, UMask, LimitMEMLOCK as far as this sandbox lets the test raise
    RLIMIT_MEMLOCK; the token file 0640 root:<its group> as
    deploy/README.md makes it), under strace through a workload that puts,
    evicts to NVMe, reads back, is scraped, stops and recovers. Then every
    system call must be in the unit's SystemCallFilter, every socket in
    RestrictAddressFamilies, every written path under ReadWritePaths (moved
    here), every device node in DevicePolicy=closed, and the io_uring fixed
    buffers it registers must fit in LimitMEMLOCK."""
    bins = bins.resolve()  # unit files and strace name absolute paths
    require_tool("strace")
    svc = unit["Service"]
    memlock = parse_size(svc["LimitMEMLOCK"][0])
    umask = int(svc["UMask"][0], 8)
    root = sandbox.path
    run_dir = sandbox.make("run", 0o750, NOBODY.pw_uid, NOBODY.pw_gid)
    state = sandbox.make("state", 0o750, NOBODY.pw_uid, NOBODY.pw_gid)
    etc = sandbox.make("etc", 0o750, 0, NOBODY.pw_gid)
    trace_dir = sandbox.make("trace", 0o700, NOBODY.pw_uid, NOBODY.pw_gid)
    token = "deploy-test-token"
    (etc / "default.token").write_text(token + "\n")
    (etc / "default.token").chmod(0o640)
    os.chown(etc / "default.token", 0, NOBODY.pw_gid)
    config = etc / "tierkvd.toml"
    config.write_text(unit_run_config(repo, root))
    config.chmod(0o640)
    os.chown(config, 0, NOBODY.pw_gid)

    # ExecStartPost's readiness loop, with the same path moves.
    post = svc["ExecStartPost"][0].replace("/usr/local/bin/tierkv ", f"{bins / 'tierkv'} ")
    post = post.replace("/run/tierkv/", f"{run_dir}/")
    assert str(bins) in post and str(run_dir) in post, post
    post_argv = shlex.split(post)
    socket = run_dir / "tierkv.sock"
    tierkv = [str(bins / "tierkv"), "--socket", str(socket), "--token", token]

    traces = []
    for round_ in range(2):  # the second start recovers the NVMe catalog
        trace = trace_dir / f"strace.{round_}"
        traces.append(trace)
        ready = run_dir / "ready.json"
        proc, info = start_daemon(
            ["strace", "-f", "-qq", "-o", str(trace), str(bins / "tierkvd"),
             "--config", str(config), "--ready-file", str(ready)],
            trace_dir / f"log.{round_}", ready, as_unit_user(memlock, umask))
        try:
            subprocess.run(post_argv, check=True, timeout=20)
            if round_ == 0:
                demo = subprocess.run(tierkv + ["demo", "--sessions", "4", "--prefix-tokens",
                                                "2048", "--session-tokens", "1024",
                                                "--layers", "2"],
                                      capture_output=True, text=True, timeout=60)
                assert demo.returncode == 0, demo.stdout + demo.stderr
                assert "0 read-back mismatches" in demo.stdout
            stats = subprocess.run(tierkv + ["stats"], capture_output=True,
                                   text=True, timeout=20, check=True).stdout
            assert "io_uring" in stats, stats
            with urllib.request.urlopen(
                    f"http://127.0.0.1:{info['metrics_port']}/metrics", timeout=10) as r:
                assert b"tierkv_tier_bytes" in r.read()
            st = socket.stat()
            assert (st.st_mode & 0o777, st.st_gid) == (0o660, NOGROUP.gr_gid)
        finally:
            code = stop_daemon(proc, info["pid"])
        assert code == 0, (trace_dir / f"log.{round_}").read_text()
    # The second start found the first one's segments on NVMe.
    assert re.search(r"recovered [1-9]\d* segments",
                     (trace_dir / "log.1").read_text()), (trace_dir / "log.1").read_text()
    # UMask=0077: the data file and catalog are the daemon's alone.
    assert (state / "nvme.data").stat().st_mode & 0o077 == 0

    lines = []
    for trace in traces:
        text = trace.read_text()
        start = text.index(f'execve("{bins / "tierkvd"}"')
        lines += text[start:].splitlines()

    call = re.compile(r"^\d+\s+(?:<\.\.\. )?([a-z_0-9]+)[( ]")
    used = {m.group(1) for l in lines if (m := call.match(l))}
    assert {"io_uring_setup", "memfd_create", "accept"} <= used  # the trace is complete
    allowed = allowed_syscalls(svc["SystemCallFilter"])
    assert used - allowed == set(), "system calls the unit's SystemCallFilter refuses"

    families = set(re.findall(r"\bsocket\((AF_[A-Z0-9]+)", "\n".join(lines)))
    assert families and families <= set(svc["RestrictAddressFamilies"][0].split())

    writable = [Path(str(p).replace("/run/tierkv", str(run_dir))
                     .replace("/var/lib/tierkv", str(state)))
                for v in svc["ReadWritePaths"] for p in v.split()]
    written = set()
    for l in lines:
        if re.search(r"\b(openat|open)\(", l) and re.search(r"O_WRONLY|O_RDWR|O_CREAT", l) \
                and "= -1" not in l:
            written.add(re.search(r'"([^"]+)"', l).group(1))
        elif re.search(r"\b(mkdir|unlink|rename|chmod|chown|fchownat|renameat2?|unlinkat|mkdirat)\(", l) \
                and "= -1" not in l:
            written.update(re.findall(r'"([^"]+)"', l))
    for path in written:
        if path.startswith(("/proc/self/", "/proc/thread-self/")):
            continue  # thread names: /proc stays writable for the process itself
        p = Path(path)
        assert any(p == w or w in p.parents for w in writable), \
            f"{path} is written outside ReadWritePaths {writable}"

    devices = set(re.findall(r'"(/dev/[^"]+)"', "\n".join(lines)))
    closed_policy = {"/dev/null", "/dev/zero", "/dev/full", "/dev/random",
                     "/dev/urandom", "/dev/tty", "/dev/ptmx"}
    assert devices <= closed_policy, devices

    setups = [l for l in lines if "io_uring_setup(" in l]
    assert setups and all(" = -1" not in l for l in setups), "io_uring unavailable"
    # Fixed buffers: what each start asked to register (successfully or
    # not: this sandbox may not let the test raise RLIMIT_MEMLOCK to the
    # unit's value) fits in LimitMEMLOCK, so under the unit all register.
    for trace in traces:
        asked = sum(int(n) for n in re.findall(
            r"IORING_REGISTER_BUFFERS, \[\{iov_base=\w+, iov_len=(\d+)\}", trace.read_text()))
        assert 0 < asked <= memlock, f"{asked} bytes of fixed buffers, LimitMEMLOCK {memlock}"


def test_systemd_memlock_matters(repo, bins, sandbox):
    """Why LimitMEMLOCK is in the unit: a non-root tierkvd with 8 MiB of
    RLIMIT_MEMLOCK (a common default) cannot register its fixed buffers
    and says so in its log."""
    root = sandbox.path
    run_dir = sandbox.make("run", 0o750, NOBODY.pw_uid, NOBODY.pw_gid)
    sandbox.make("state", 0o750, NOBODY.pw_uid, NOBODY.pw_gid)
    etc = sandbox.make("etc", 0o750, 0, NOBODY.pw_gid)
    (etc / "default.token").write_text("deploy-test-token\n")
    (etc / "default.token").chmod(0o640)
    os.chown(etc / "default.token", 0, NOBODY.pw_gid)
    config = etc / "tierkvd.toml"
    config.write_text(unit_run_config(repo, root))
    config.chmod(0o644)
    ready = run_dir / "ready.json"
    log = root / "log"
    proc, _ = start_daemon([str(bins / "tierkvd"), "--config", str(config),
                            "--ready-file", str(ready)], log, ready,
                           as_unit_user(8 << 20, 0o077))
    try:
        tierkv = [str(bins / "tierkv"), "--socket", str(run_dir / "tierkv.sock"),
                  "--token", "deploy-test-token"]
        subprocess.run(tierkv + ["demo", "--sessions", "2", "--prefix-tokens", "1024",
                                 "--session-tokens", "1024", "--layers", "2"],
                       capture_output=True, timeout=60, check=True)
    finally:
        stop_daemon(proc)
    assert "using unregistered buffers" in log.read_text()


# --- Docker ----------------------------------------------------------------


@pytest.fixture(scope="module")
def dockerfile(repo):
    return dockerfile_instructions(repo / "deploy/docker/Dockerfile")


def dockerfile_stages(instructions):
    """[(name, base, [instructions of the stage])], and the ARGs before the
    first FROM."""
    global_args = {}
    stages = []
    for word, rest in instructions:
        if word == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.IGNORECASE)
            stages.append((m.group(2), m.group(1), []))
        elif not stages:
            assert word == "ARG", f"{word} before the first FROM"
            name, _, default = rest.partition("=")
            global_args[name] = default
        else:
            stages[-1][2].append((word, rest))
    return global_args, stages


def json_or_shell(rest: str) -> list[str]:
    return json.loads(rest) if rest.startswith("[") else shlex.split(rest)


def test_dockerfile_structure(repo, dockerfile):
    global_args, stages = dockerfile_stages(dockerfile)
    names = [s[0] for s in stages]
    assert names == ["build", "runtime"]
    # Both bases are build arguments, Debian 12 by default; the runtime one
    # is the CUDA-runtime hook (cudart is static, so slim Debian suffices).
    assert stages[0][1] == "${BUILD_BASE}" and global_args["BUILD_BASE"] == "debian:12"
    assert stages[1][1] == "${RUNTIME_BASE}"
    assert global_args["RUNTIME_BASE"].startswith("debian:12")

    ignore = [l.strip() for l in
              (repo / "deploy/docker/Dockerfile.dockerignore").read_text().splitlines()
              if l.strip() and not l.strip().startswith("#")]
    # The context must not carry a host build tree or .git...
    assert dockerignored("build/CMakeCache.txt", ignore)
    assert dockerignored(".git/HEAD", ignore)
    # ...but everything the build needs.
    for needed in ("CMakeLists.txt", "scripts/build.sh", "storage/nvme/uring_device.cc",
                   "deploy/docker/runtime-packages.sh", "deploy/docker/tierkvd.toml"):
        assert not dockerignored(needed, ignore), needed

    seen_stages = set()
    copied_to = {}
    for name, _, body in stages:
        for word, rest in body:
            if word == "COPY":
                args = rest.split()
                opts = [a for a in args if a.startswith("--")]
                paths = [a for a in args if not a.startswith("--")]
                srcs, dest = paths[:-1], paths[-1]
                src_stage = [o.split("=", 1)[1] for o in opts if o.startswith("--from=")]
                if src_stage:
                    assert src_stage[0] in seen_stages, f"COPY --from={src_stage[0]}"
                else:
                    for src in srcs:
                        assert (repo / src).exists(), f"COPY source {src} is not in the repo"
                        if src != ".":
                            assert not dockerignored(src, ignore), f"{src} is .dockerignored"
                for src in srcs:
                    target = dest if not dest.endswith("/") else dest + Path(src).name
                    copied_to[target] = (name, src)
            if word == "RUN":
                for script in re.findall(r"((?:scripts|deploy)/[\w./-]+\.sh)", rest):
                    assert (repo / script).is_file(), script
        seen_stages.add(name)

    runtime = dict()
    for word, rest in stages[1][2]:
        runtime.setdefault(word, []).append(rest)
    user = runtime["USER"][-1].split(":")
    assert user[0] not in ("0", "root") and int(user[0]) > 0
    volumes = json.loads(runtime["VOLUME"][0])
    assert "/run/tierkv" in volumes and "/var/lib/tierkv" in volumes
    assert runtime["EXPOSE"] == ["9400"]
    entry = json_or_shell(runtime["ENTRYPOINT"][0])
    cmd = json_or_shell(runtime["CMD"][0])
    assert entry == ["/usr/local/bin/tierkvd"]
    assert copied_to["/usr/local/bin/tierkvd"] == ("runtime", "/src/build/bin/tierkvd")
    assert copied_to["/usr/local/bin/tierkv"] == ("runtime", "/src/build/bin/tierkv")
    assert cmd[0] == "--config" and copied_to[cmd[1]] == ("runtime",
                                                          "deploy/docker/tierkvd.toml")
    health = runtime["HEALTHCHECK"][0]
    probe = json_or_shell(health.split(" CMD ", 1)[1])
    config = tomllib.loads((repo / "deploy/docker/tierkvd.toml").read_text())
    assert probe == ["/usr/local/bin/tierkv", "--socket", config["server"]["socket"], "status"]
    # The socket and the NVMe file live in the volumes.
    assert str(Path(config["server"]["socket"]).parent) in volumes
    assert str(Path(config["nvme"]["path"]).parent) in volumes
    assert config["metrics"]["listen"].endswith(":9400")
    assert config["server"]["socket_mode"] == "0660"


def test_release_artifacts_leave_out_sync_points(repo, dockerfile):
    """The image's binaries and the pip wheel are built without the
    test-only sync points (and so without TIERKV_TEST_STALL_LAYER), while
    the developer build keeps them (CMake's default)."""
    _, stages = dockerfile_stages(dockerfile)
    builds = [rest for word, rest in stages[0][2]
              if word == "RUN" and "scripts/build.sh" in rest]
    assert len(builds) == 1
    assert "-DTIERKV_SYNC_POINTS=OFF" in builds[0].split(" -- ")[0]
    pyproject = tomllib.loads((repo / "pyproject.toml").read_text())
    defines = pyproject["tool"]["scikit-build"]["cmake"]["define"]
    assert defines["TIERKV_SYNC_POINTS"] == "OFF"
    cmake = (repo / "CMakeLists.txt").read_text()
    assert re.search(r"option\(TIERKV_SYNC_POINTS .* ON\)", cmake)


def test_docker_config_checks(repo, bins):
    out = check_config(bins, repo / "deploy/docker/tierkvd.toml")
    assert "socket = /run/tierkv/tierkv.sock (mode 660)" in out
    assert "nvme = /var/lib/tierkv/nvme.data" in out


def test_runtime_packages(repo, bins, tmp_path):
    """runtime-packages.sh names the Debian packages of every library the
    binaries load, no -dev package; it fails on a library no package owns.
    And the binaries need no CUDA runtime library (cudart is static), which
    is why the runtime image may be plain Debian."""
    script = repo / "deploy/docker/runtime-packages.sh"
    r = subprocess.run(["sh", str(script), str(bins / "tierkvd"), str(bins / "tierkv")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    pkgs = r.stdout.split()
    assert {"liburing2", "libc6", "libstdc++6"} <= set(pkgs)
    assert any(p.startswith("librocksdb") for p in pkgs)
    assert not [p for p in pkgs if p.endswith("-dev")]
    assert pkgs == sorted(set(pkgs))
    ldd = subprocess.run(["ldd", str(bins / "tierkvd")], capture_output=True,
                         text=True, check=True).stdout
    assert "libcudart" not in ldd

    # A library that no package owns.
    gcc = require_tool("gcc")
    lib = tmp_path / "libz.so.1"
    shutil.copy(os.path.realpath("/lib/x86_64-linux-gnu/libz.so.1"), lib)
    (tmp_path / "x.c").write_text("int main(void) { return 0; }\n")
    subprocess.run([gcc, str(tmp_path / "x.c"), "-o", str(tmp_path / "x"),
                    "-Wl,--no-as-needed", str(lib), f"-Wl,-rpath,{tmp_path}"],
                   check=True, timeout=60)
    r = subprocess.run(["sh", str(script), str(tmp_path / "x")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "no package owns" in r.stderr


# --- Kubernetes ------------------------------------------------------------


SERVICEMONITOR_SCHEMA = {
    # The fields this deployment uses, typed as in the Prometheus Operator's
    # CRD (monitoring.coreos.com_servicemonitors.yaml); unknown fields are
    # errors, as with the API server's strict field validation.
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object", "required": ["name", "namespace"],
            "properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
                           "labels": {"type": "object",
                                      "additionalProperties": {"type": "string"}}}},
        "spec": {
            "type": "object", "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "selector": {
                    "type": "object", "additionalProperties": False,
                    "properties": {
                        "matchLabels": {"type": "object",
                                        "additionalProperties": {"type": "string"}},
                        "matchExpressions": {"type": "array"}}},
                "namespaceSelector": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"any": {"type": "boolean"},
                                   "matchNames": {"type": "array",
                                                  "items": {"type": "string"}}}},
                "endpoints": {
                    "type": "array", "minItems": 1,
                    "items": {
                        "type": "object", "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"type": ["string", "integer"]},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                            "interval": {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
                            "scrapeTimeout": {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
                            "honorLabels": {"type": "boolean"},
                            "relabelings": {
                                "type": "array",
                                "items": {
                                    "type": "object", "additionalProperties": False,
                                    "properties": {
                                        "sourceLabels": {"type": "array", "items": {
                                            "type": "string",
                                            "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
                                        "separator": {"type": "string"},
                                        "targetLabel": {"type": "string"},
                                        "regex": {"type": "string"},
                                        "replacement": {"type": "string"},
                                        "action": {"enum": [
                                            "replace", "Replace", "keep", "Keep",
                                            "drop", "Drop", "labelmap", "LabelMap",
                                            "labeldrop", "LabelDrop", "labelkeep",
                                            "LabelKeep"]}}}},
                        }}}}}},
}


def validate_k8s(doc: dict) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_k8s_manifests_validate(repo):
    """Every object against the Kubernetes 1.31 OpenAPI schemas (strict:
    unknown fields fail); the ServiceMonitor against SERVICEMONITOR_SCHEMA."""
    files = sorted((repo / "deploy/k8s").glob("*.yaml")) + \
        sorted((repo / "deploy/k8s/examples").glob("*.yaml"))
    kinds = []
    for f in files:
        if f.name == "kustomization.yaml":
            continue
        for doc in k8s_docs(f):
            kinds.append(doc["kind"])
            if doc["kind"] == "ServiceMonitor":
                jsonschema.validate(doc, SERVICEMONITOR_SCHEMA)
            else:
                validate_k8s(doc)
    assert sorted(kinds) == ["ConfigMap", "DaemonSet", "Namespace", "Pod",
                             "Service", "ServiceMonitor"]


def test_k8s_validators_catch_mistakes(repo):
    """The validators used above fail on a misspelt field and a wrong type."""
    objs = k8s_objects(repo)
    ds = copy.deepcopy(objs["DaemonSet"])
    c = ds["spec"]["template"]["spec"]["containers"][0]
    c["readinesProbe"] = c.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_k8s(ds)
    ds = copy.deepcopy(objs["DaemonSet"])
    ds["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["periodSeconds"] = "20"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_k8s(ds)
    sm = copy.deepcopy(objs["ServiceMonitor"])
    sm["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(sm, SERVICEMONITOR_SCHEMA)
    sm = copy.deepcopy(objs["ServiceMonitor"])
    sm["spec"]["endpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(sm, SERVICEMONITOR_SCHEMA)


def test_k8s_kustomize_renders(repo):
    """`kubectl kustomize` (offline) renders the set; each rendered object
    validates and lands in the tierkv namespace."""
    kubectl = require_tool("kubectl")
    r = subprocess.run([kubectl, "kustomize", str(repo / "deploy/k8s")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "DaemonSet", "Namespace",
                                               "Service", "ServiceMonitor"]
    for d in docs:
        if d["kind"] == "ServiceMonitor":
            jsonschema.validate(d, SERVICEMONITOR_SCHEMA)
        else:
            validate_k8s(d)
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "tierkv"


def test_k8s_objects_fit_together(repo):
    """Cross-references no schema checks: selectors, ports, mounts, the
    config's paths, the probes' socket, the image's user and paths."""
    objs = k8s_objects(repo)
    ds, svc, sm, cm = objs["DaemonSet"], objs["Service"], objs["ServiceMonitor"], objs["ConfigMap"]
    config = tomllib.loads(cm["data"]["tierkvd.toml"])
    pod = ds["spec"]["template"]
    spec = pod["spec"]
    labels = pod["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # Service -> pods -> container port; ServiceMonitor -> Service.
    assert svc["spec"]["selector"].items() <= labels.items()
    (container,) = spec["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    (svc_port,) = svc["spec"]["ports"]
    listen_port = int(config["metrics"]["listen"].rsplit(":", 1)[1])
    assert ports[svc_port["targetPort"]] == listen_port == svc_port["port"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == svc_port["name"]
    assert svc["metadata"]["namespace"] in sm["spec"]["namespaceSelector"]["matchNames"]
    # job is what deploy/prometheus's rules and alerts select on.
    scrape = yaml.safe_load((repo / "deploy/prometheus/prometheus.yml").read_text())
    job = svc["metadata"]["labels"][sm["spec"]["jobLabel"]]
    assert job in {c["job_name"] for c in scrape["scrape_configs"]}
    # Prometheus must reach the listener: not loopback in a pod.
    assert config["metrics"]["listen"].split(":")[0] == "0.0.0.0"
    assert not spec.get("hostNetwork", False)

    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}

    def volume_at(path: str) -> dict:
        for mount_path, m in mounts.items():
            if path == mount_path or path.startswith(mount_path.rstrip("/") + "/"):
                return volumes[m["name"]]
        raise AssertionError(f"{path} is on no volume")

    # The command reads the ConfigMap's TOML.
    assert container["command"][1:] == ["--config", "/etc/tierkv/tierkvd.toml"]
    cfg_mount = mounts["/etc/tierkv/tierkvd.toml"]
    assert volumes[cfg_mount["name"]]["configMap"]["name"] == cm["metadata"]["name"]
    assert cfg_mount["subPath"] in cm["data"]
    # The socket directory is the host's, shared with engine pods.
    socket = config["server"]["socket"]
    sock_vol = volume_at(socket)
    assert sock_vol["hostPath"]["path"] == str(Path(socket).parent)
    engine = objs_examples(repo)["Pod"]
    engine_vols = {v["name"]: v for v in engine["spec"]["volumes"]}
    assert any(v.get("hostPath", {}).get("path") == sock_vol["hostPath"]["path"]
               for v in engine_vols.values())
    # NVMe on a hostPath; tokens from a Secret, none inline.
    assert "hostPath" in volume_at(config["nvme"]["path"])
    for ns in config["namespace"]:
        assert "token" not in ns
        secret = volume_at(ns["token_file"])["secret"]
        assert secret["defaultMode"] & 0o007 == 0  # tierkvd refuses others-readable
        assert any(v.get("secret", {}).get("secretName") == secret["secretName"]
                   for v in engine_vols.values())
    # Probes: `tierkv status` on the config's socket, from the image.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["exec"]["command"] == [
            "/usr/local/bin/tierkv", "--socket", socket, "status"], probe
    # Non-root as in the image, no capabilities, no escalation.
    sc, psc = container["securityContext"], spec["securityContext"]
    _, stages = dockerfile_stages(dockerfile_instructions(repo / "deploy/docker/Dockerfile"))
    image_user = [r for w, r in stages[1][2] if w == "USER"][-1]
    assert f"{psc['runAsUser']}:{psc['runAsGroup']}" == image_user
    assert psc["runAsNonRoot"] and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"]
    assert engine["spec"]["securityContext"]["fsGroup"] == psc["runAsGroup"]
    # Resources: memory for every namespace's DRAM arena; time to persist.
    limit = parse_size(container["resources"]["limits"]["memory"])
    assert limit >= sum(parse_size(ns["host_bytes"]) for ns in config["namespace"]) + (1 << 30)
    assert spec["terminationGracePeriodSeconds"] * 1000 > config["nvme"]["shutdown_persist_ms"]
    # The init container only chowns/chmods the hostPath directories.
    (init,) = spec["initContainers"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"],
                                                       "add": ["CHOWN", "FOWNER"]}
    assert {m["mountPath"] for m in init["volumeMounts"]} == {
        str(Path(socket).parent), str(Path(config["nvme"]["path"]).parent)}


def objs_examples(repo: Path) -> dict[str, dict]:
    return {d["kind"]: d for f in sorted((repo / "deploy/k8s/examples").glob("*.yaml"))
            for d in k8s_docs(f)}


def test_k8s_config_checks(repo, bins, tmp_path):
    path = tmp_path / "tierkvd.toml"
    path.write_text(configmap_toml(repo))
    out = check_config(bins, path)
    assert "metrics = 0.0.0.0:9400" in out
    assert "token=/etc/tierkv/tokens/default.token" in out


def test_k8s_probe_command_against_the_configmap_daemon(repo, bins, sandbox):
    """The ConfigMap's TOML served by a non-root tierkvd with the pod's
    mounts moved here (token file 0440 as the Secret mounts it, sizes
    shrunk, metrics port picked by the kernel): the probes' exact command
    exits 0 while it serves and fails once it is stopped."""
    objs = k8s_objects(repo)
    container = objs["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]
    probe = container["readinessProbe"]["exec"]["command"]
    root = sandbox.path
    run_dir = sandbox.make("run", 0o750, NOBODY.pw_uid, NOBODY.pw_gid)
    sandbox.make("nvme", 0o750, NOBODY.pw_uid, NOBODY.pw_gid)
    tokens = sandbox.make("tokens", 0o755)
    (tokens / "default.token").write_text("k8s-secret-token")
    (tokens / "default.token").chmod(0o440)
    os.chown(tokens / "default.token", 0, NOBODY.pw_gid)
    text = configmap_toml(repo)
    subs = {'"/run/tierkv/': f'"{run_dir}/', '"/var/lib/tierkv/': f'"{root}/nvme/',
            '"/etc/tierkv/tokens/': f'"{tokens}/', '"0.0.0.0:9400"': '"0.0.0.0:0"',
            '"64GiB"': '"256MiB"', '"8GiB"': '"16MiB"'}
    for old, new in subs.items():
        assert old in text, old
        text = text.replace(old, new)
    config = root / "tierkvd.toml"
    config.write_text(text)
    config.chmod(0o644)
    ready = run_dir / "ready.json"
    argv = [str(bins / "tierkvd"), "--config", str(config), "--ready-file", str(ready)]
    cmd = [str(bins / "tierkv") if a == "/usr/local/bin/tierkv" else
           a.replace("/run/tierkv/", f"{run_dir}/") for a in probe]
    assert cmd != probe
    proc, info = start_daemon(argv, root / "log", ready, as_unit_user(64 << 20, 0o077))
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "default" in r.stdout
        # An engine with the Secret's token gets in.
        r = subprocess.run([str(bins / "tierkv"), "--socket", str(run_dir / "tierkv.sock"),
                            "--token-file", str(tokens / "default.token"), "stats"],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == 0, r.stdout + r.stderr
        with urllib.request.urlopen(
                f"http://127.0.0.1:{info['metrics_port']}/metrics", timeout=10) as m:
            metrics = m.read().decode()
    finally:
        assert stop_daemon(proc) == 0
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    assert r.returncode != 0
    # The series carry a `namespace` label of their own, so the
    # ServiceMonitor must keep Kubernetes' from displacing it.
    assert re.search(r'^tierkv_\w+\{[^}]*namespace="default"', metrics, re.M)
    endpoint = objs["ServiceMonitor"]["spec"]["endpoints"][0]
    assert endpoint.get("honorLabels") or {"action": "labeldrop", "regex": "namespace"} in \
        endpoint.get("relabelings", [])
