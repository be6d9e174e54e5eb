"""deploy/k8s-cluster/: the Kubernetes cluster example (issue 27), a
kustomize overlay of deploy/k8s with the directory's Redis, the secrets and
the daemons' [cluster] config, checked with what runs on this machine
(deploy/README.md, "Cluster"):

* `kubectl kustomize` (offline) renders it, with secrets from its own
  make-secrets.sh, and every object passes kubernetes-validate (the 1.31
  OpenAPI schemas, strict);
* cross-references no schema checks: the [cluster] keys against the Redis
  Service, its ACL user and key prefix, the secrets the init container
  copies, the peer port, the downward API values the template names;
* the init container's script, run here, writes a config and key files
  tierkvd accepts (0400, the daemon's own);
* the Redis container's script, run here with a real redis-server: the ACL
  user tierkvd may send every command transport/directory sends, on the
  directory's keys only, and nothing else;
* the rendered config through `tierkvd --check-config` (expected to fail
  only while tierkvd predates [cluster]).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import socket
import stat
import subprocess
import time
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from conftest import require_tool
from test_deploy import SERVICEMONITOR_SCHEMA, validate_k8s

CLUSTER = "deploy/k8s-cluster"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def rendered(repo, tmp_path_factory) -> dict[str, list[dict]]:
    """`kubectl kustomize` of a copy of deploy/k8s and deploy/k8s-cluster
    whose secrets make-secrets.sh made (so none is written into the
    checkout), objects by kind."""
    kubectl = require_tool("kubectl")
    root = tmp_path_factory.mktemp("overlay")
    shutil.copytree(repo / "deploy/k8s", root / "k8s")
    shutil.copytree(repo / CLUSTER, root / "k8s-cluster",
                    ignore=shutil.ignore_patterns("*.key", "*.pass"))
    r = subprocess.run(["sh", str(root / "k8s-cluster/make-secrets.sh")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    for f in (root / "k8s-cluster/secrets").iterdir():
        if f.name != ".gitignore":
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    r = subprocess.run([kubectl, "kustomize", str(root / "k8s-cluster")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out: dict[str, list[dict]] = {}
    for d in yaml.safe_load_all(r.stdout):
        if d:
            out.setdefault(d["kind"], []).append(d)
    return out


def one(rendered, kind: str, name: str | None = None) -> dict:
    found = [d for d in rendered[kind]
             if name is None or d["metadata"]["name"].startswith(name)]
    assert len(found) == 1, (kind, name, found)
    return found[0]


def cluster_config(rendered) -> dict:
    return tomllib.loads(one(rendered, "ConfigMap")["data"]["tierkvd.toml"])


def test_secrets_stay_out_of_git(repo):
    ignore = (repo / CLUSTER / "secrets/.gitignore").read_text().split()
    assert ignore[-2:] == ["*", "!.gitignore"]
    r = subprocess.run(["git", "-C", str(repo), "ls-files", CLUSTER],
                       capture_output=True, text=True, check=True)
    tracked = r.stdout.split()
    assert f"{CLUSTER}/secrets/.gitignore" in tracked
    assert not [f for f in tracked if f.endswith((".key", ".pass"))], tracked


def test_cluster_overlay_renders_and_validates(rendered):
    kinds = sorted(k for k, docs in rendered.items() for _ in docs)
    assert kinds == ["ConfigMap", "DaemonSet", "Deployment", "Namespace",
                     "Secret", "Secret", "Service", "Service",
                     "ServiceMonitor"]
    for docs in rendered.values():
        for d in docs:
            if d["kind"] == "ServiceMonitor":
                jsonschema.validate(d, SERVICEMONITOR_SCHEMA)
            else:
                validate_k8s(d)
            if d["kind"] != "Namespace":
                assert d["metadata"]["namespace"] == "tierkv"


def test_cluster_objects_fit_together(rendered):
    config = cluster_config(rendered)
    c = config["cluster"]
    for key in ("name", "node_id", "secret_file", "directory",
                "directory_password_file", "peer_listen"):
        assert c.get(key), key
    assert all(ns.get("shared") is True for ns in config["namespace"])

    ds = one(rendered, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    (daemon,) = spec["containers"]
    init = {i["name"]: i for i in spec["initContainers"]}["cluster-config"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    secrets = {s["metadata"]["name"]: s for s in rendered["Secret"]}

    def secret_at(container: dict, path: str) -> tuple[dict, str]:
        """The Secret and key a file of `container` comes from."""
        for m in container["volumeMounts"]:
            if path.startswith(m["mountPath"].rstrip("/") + "/"):
                secret = secrets[volumes[m["name"]]["secret"]["secretName"]]
                key = path[len(m["mountPath"].rstrip("/")) + 1:]
                assert key in secret["data"], (path, secret["data"].keys())
                # Readable by the daemon's group only (fsGroup), never others.
                assert volumes[m["name"]]["secret"]["defaultMode"] & 0o007 == 0
                return secret, key
        raise AssertionError(f"{path} is on no Secret volume")

    # tierkvd reads the rendered config; the template is the ConfigMap.
    assert daemon["command"][1] == "--config"
    config_path = Path(daemon["command"][2])
    run_dir = str(config_path.parent)
    script = init["command"][-1]
    assert f"out={run_dir}" in script
    assert f'"$out/{config_path.name}"' in script
    mounts = {m["mountPath"]: m for m in daemon["volumeMounts"]}
    init_mounts = {m["mountPath"]: m for m in init["volumeMounts"]}
    assert mounts[run_dir]["name"] == init_mounts[run_dir]["name"]
    assert volumes[mounts[run_dir]["name"]]["emptyDir"]["medium"] == "Memory"
    assert "/etc/tierkv/tierkvd.toml" not in mounts
    template = re.search(r"(/\S+\.toml) >", script).group(1)
    tmpl_mount = init_mounts[str(Path(template).parent)]
    assert volumes[tmpl_mount["name"]]["configMap"]["name"] == "tierkv-config"

    # secret_file and directory_password_file: relative to the config's
    # directory, copied there by the init container from the Secrets.
    copies = dict((dst, src) for src, dst in re.findall(
        r'cp (\S+) "\$out/([^"]+)"', script))
    assert set(copies) == {c["secret_file"], c["directory_password_file"]}
    assert f'chmod 0400 "$out/{c["secret_file"]}" ' \
           f'"$out/{c["directory_password_file"]}"' in script
    key_secret, _ = secret_at(init, copies[c["secret_file"]])
    assert key_secret["metadata"]["name"].startswith("tierkv-cluster")
    redis_secret, redis_key = secret_at(init, copies[c["directory_password_file"]])

    # The directory URL -> the Redis Service -> its pods' port; the URL's
    # user is the ACL user whose password the daemons get, limited to the
    # cluster name's keys.
    url = urlsplit(c["directory"])
    assert url.scheme == "redis" and url.password is None
    svc = one(rendered, "Service", "tierkv-redis")
    host = f'{svc["metadata"]["name"]}.{svc["metadata"]["namespace"]}.svc'
    assert url.hostname == host
    (svc_port,) = svc["spec"]["ports"]
    assert url.port == svc_port["port"]
    redis = one(rendered, "Deployment", "tierkv-redis")
    rspec = redis["spec"]["template"]["spec"]
    assert svc["spec"]["selector"].items() <= \
        redis["spec"]["template"]["metadata"]["labels"].items()
    assert not svc["spec"]["selector"].items() <= \
        ds["spec"]["template"]["metadata"]["labels"].items()
    (rc,) = rspec["containers"]
    rports = {p["name"]: p["containerPort"] for p in rc["ports"]}
    assert rports[svc_port["targetPort"]] == svc_port["port"]
    rscript = rc["args"][0]
    acl = re.search(r"^user (\S+) on >\$\(cat \$auth/(\S+)\) (.*)$", rscript,
                    re.M)
    assert acl, rscript
    assert acl.group(1) == url.username
    assert acl.group(2) == redis_key
    assert f"~tkv:{c['name']}:*" in acl.group(3).split()
    (rvol,) = [v for v in rspec["volumes"] if "secret" in v]
    assert rvol["secret"]["secretName"] == redis_secret["metadata"]["name"]
    assert "requirepass $(cat $auth/requirepass)" in rscript
    assert "requirepass" in redis_secret["data"]
    # No password on a command line: Redis and its probes read files.
    for probe in ("readinessProbe", "livenessProbe"):
        assert "REDISCLI_AUTH=" in rc[probe]["exec"]["command"][-1]

    # Downward API: the node's name (stable across pod restarts) and the
    # pod's IP, substituted into the template's placeholders.
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
           for e in init["env"]}
    assert env == {"NODE_NAME": "spec.nodeName", "POD_IP": "status.podIP"}
    assert c["node_id"] == "@NODE_NAME@"
    assert c["peer_listen"].startswith("@POD_IP@:")
    for var in env:
        assert f"s/@{var}@/${var}/g" in script
    # The peer listener's port is a container port; UCX over TCP.
    ports = {p["name"]: p["containerPort"] for p in daemon["ports"]}
    assert ports["peer"] == int(c["peer_listen"].rsplit(":", 1)[1])
    denv = {e["name"]: e.get("value") for e in daemon["env"]}
    assert denv["UCX_TLS"] == "tcp" and denv["UCX_TCP_CM_REUSEADDR"] == "y"
    # The init container runs as the daemon (the pod's user), unprivileged.
    assert "runAsUser" not in init["securityContext"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert init["securityContext"]["allowPrivilegeEscalation"] is False


def run_init_script(rendered, root: Path, node: str, pod_ip: str) -> Path:
    """The init container's script with its mounts moved under `root`."""
    spec = one(rendered, "DaemonSet")["spec"]["template"]["spec"]
    init = {i["name"]: i for i in spec["initContainers"]}["cluster-config"]
    script = init["command"][-1]
    volumes = {v["name"]: v for v in spec["volumes"]}
    secrets = {s["metadata"]["name"]: s for s in rendered["Secret"]}
    configmap = one(rendered, "ConfigMap")
    for m in init["volumeMounts"]:
        here = root / m["mountPath"].lstrip("/")
        here.mkdir(parents=True, exist_ok=True)
        v = volumes[m["name"]]
        if "secret" in v:
            for key, b64 in secrets[v["secret"]["secretName"]]["data"].items():
                (here / key).write_bytes(base64.b64decode(b64))
                (here / key).chmod(v["secret"]["defaultMode"])
        elif "configMap" in v:
            for key, text in configmap["data"].items():
                (here / key).write_text(text)
        script = script.replace(m["mountPath"], str(here))
    r = subprocess.run(["sh", "-c", script], capture_output=True, text=True,
                       env={"PATH": os.environ["PATH"], "NODE_NAME": node,
                            "POD_IP": pod_ip}, timeout=30)
    assert r.returncode == 0, r.stderr
    daemon = spec["containers"][0]
    return root / daemon["command"][2].lstrip("/")


def test_init_script_writes_files_tierkvd_accepts(rendered, tmp_path):
    config_path = run_init_script(rendered, tmp_path, "gpu-node-7", "10.1.2.3")
    config = tomllib.loads(config_path.read_text())
    c = config["cluster"]
    assert c["node_id"] == "gpu-node-7"
    assert c["peer_listen"] == "10.1.2.3:7400"
    assert "@" not in config_path.read_text().replace(
        c["directory"], "")  # no placeholder left (the URL has user@host)
    for name in (c["secret_file"], c["directory_password_file"]):
        f = config_path.parent / name
        # tierkvd refuses key and password files group or others can read.
        assert stat.S_IMODE(f.stat().st_mode) == 0o400, name
        assert f.stat().st_uid == os.getuid()
    assert len((config_path.parent / c["secret_file"]).read_bytes()) >= 32
    assert stat.S_IMODE(config_path.stat().st_mode) & 0o077 == 0


def test_rendered_config_checks(rendered, bins, tmp_path):
    """`tierkvd --check-config` of the rendered config (its other paths
    moved here). Until tierkvd parses [cluster] (issue 27), an expected
    failure."""
    config_path = run_init_script(rendered, tmp_path, "n1", "127.0.0.1")
    text = config_path.read_text()
    for old, new in {'"/run/tierkv/': f'"{tmp_path}/', '"/var/lib/tierkv/':
                     f'"{tmp_path}/', '"/etc/tierkv/tokens/': f'"{tmp_path}/'
                     }.items():
        assert old in text, old
        text = text.replace(old, new)
    config_path.write_text(text)
    token = tmp_path / "default.token"
    token.write_text("cluster-test-token")
    token.chmod(0o600)
    r = subprocess.run([str(bins / "tierkvd"), "--config", str(config_path),
                        "--check-config"], capture_output=True, text=True,
                       timeout=30)
    if r.returncode != 0 and "cluster: unknown key" in r.stdout + r.stderr:
        pytest.xfail("this tierkvd predates [cluster]: " + r.stderr.strip())
    assert r.returncode == 0, r.stdout + r.stderr


# A real call, with the arguments transport/directory sends, for every
# command it sends, its write script's calls included (the test fails when
# the code sends one not listed here: the ACL in redis.yaml must then allow
# it). {script} is that script's text, {sha} its SHA1; the calls run in
# this order, so SCRIPT LOAD comes before EVALSHA.
DIRECTORY_CALLS = {
    "PING": [["PING"]],
    "SELECT": [["SELECT", "0"]],
    "HSET": [["HSET", "{p}node:a", "addr", "10.0.0.1:7400", "epoch", "1"]],
    "HMGET": [["HMGET", "{p}node:a", "addr", "epoch"]],
    "PEXPIRE": [["PEXPIRE", "{p}node:a", "10000"]],
    "SADD": [["SADD", "{p}nodes", "a"]],
    "SREM": [["SREM", "{p}nodes", "a"]],
    "SMEMBERS": [["SMEMBERS", "{p}nodes"]],
    "SCRIPT": [["SCRIPT", "LOAD", "{script}"]],
    # Publish a and b, then a again (GET, SET, EXPIRE), unpublish both (DEL).
    "EVALSHA": [["EVALSHA", "{sha}", "2", "{p}ns@00:h:00", "{p}ns@00:h:01",
                 "86400", "+a", "+b"],
                ["EVALSHA", "{sha}", "1", "{p}ns@00:h:00", "86400", "+a"],
                ["EVALSHA", "{sha}", "2", "{p}ns@00:h:00", "{p}ns@00:h:01",
                 "86400", "-a", "-b"]],
    "MGET": [["MGET", "{p}ns@00:h:00", "{p}ns@00:h:01"]],
    "EXPIRE": [["EXPIRE", "{p}ns@00:h:00", "86400"]],
    "SET": [["SET", "{p}dir_epoch", "42", "NX"]],
    "GET": [["GET", "{p}dir_epoch"]],
    "DEL": [["DEL", "{p}nodes"]],
    "MULTI": [],  # MULTI and EXEC: the transaction below
    "EXEC": [],
    "AUTH": [],  # redis-cli authenticates itself
}


def directory_script(repo: Path) -> str:
    """The write script transport/directory loads (SCRIPT LOAD)."""
    source = (repo / "transport/directory/redis_directory.cc").read_text()
    (script,) = re.findall(r'R"lua\((.*?)\)lua"', source, re.S)
    return script


def test_redis_acl_allows_the_directory_and_nothing_else(repo, rendered,
                                                          tmp_path):
    redis_server = require_tool("redis-server")
    redis_cli = require_tool("redis-cli")
    source = "".join(
        p.read_text() for p in (repo / "transport/directory").glob("*.cc"))
    sent = set(re.findall(r'\{"([A-Z]+)"', source))
    sent |= set(re.findall(r"redis\.p?call\('([A-Z]+)'", source))  # script
    assert sent == set(DIRECTORY_CALLS), (
        "transport/directory sends other commands than the test (and the "
        f"ACL in {CLUSTER}/redis.yaml) knows: {sorted(sent)}")

    redis = one(rendered, "Deployment", "tierkv-redis")
    (rc,) = redis["spec"]["template"]["spec"]["containers"]
    script = rc["args"][0]
    secret = one(rendered, "Secret", "tierkv-redis")
    auth = tmp_path / "auth"
    auth.mkdir()
    passwords = {}
    for key, b64 in secret["data"].items():
        passwords[key] = base64.b64decode(b64).decode()
        (auth / key).write_text(passwords[key])
    run = tmp_path / "run"
    run.mkdir()
    port = free_port()
    script = (script.replace("/etc/redis-auth", str(auth))
              .replace("/run/redis", str(run))
              .replace("port 6379", f"port {port}")
              .replace("bind 0.0.0.0", "bind 127.0.0.1")
              .replace("exec redis-server", f"exec {redis_server}"))
    assert str(port) in script and "127.0.0.1" in script
    log = open(tmp_path / "redis.log", "wb")
    proc = subprocess.Popen(["sh", "-c", script], stdout=log,
                            stderr=subprocess.STDOUT, cwd=tmp_path)
    cfg = tomllib.loads(one(rendered, "ConfigMap")["data"]["tierkvd.toml"])
    user = urlsplit(cfg["cluster"]["directory"]).username
    prefix = f"tkv:{cfg['cluster']['name']}:"

    def cli(*argv: str, as_user: str | None = user) -> str:
        env = dict(os.environ)
        args = [redis_cli, "-h", "127.0.0.1", "-p", str(port)]
        if as_user == "default":
            env["REDISCLI_AUTH"] = passwords["requirepass"]
        elif as_user is not None:
            env["REDISCLI_AUTH"] = passwords["tierkvd"]
            args += ["--user", as_user]
        r = subprocess.run(args + list(argv), capture_output=True, text=True,
                           env=env, timeout=10)
        return (r.stdout + r.stderr).strip()

    try:
        # redis-server announces readiness to no one: poll PING (bounded).
        deadline = time.monotonic() + 20
        while cli("PING", as_user="default") != "PONG":
            assert proc.poll() is None, (tmp_path / "redis.log").read_text()
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
        assert stat.S_IMODE((run / "redis.conf").stat().st_mode) == 0o600
        # The passwords reached Redis through the file, not argv.
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert not any(p.encode() in cmdline for p in passwords.values())

        script = directory_script(repo)
        sha = hashlib.sha1(script.encode()).hexdigest()
        for command, calls in DIRECTORY_CALLS.items():
            for call in calls:
                argv = [a.replace("{p}", prefix).replace("{sha}", sha)
                        .replace("{script}", script) for a in call]
                out = cli(*argv)
                assert "NOPERM" not in out and "ERR" not in out, (argv, out)
                if command == "SCRIPT":
                    assert out == sha, out
                if command == "EVALSHA":  # it ran: it returns #KEYS
                    assert out == argv[2], (argv, out)
        # MULTI/EXEC with a directory write inside, as the publisher sends.
        out = subprocess.run(
            [redis_cli, "-h", "127.0.0.1", "-p", str(port), "--user", user],
            input=f"MULTI\nSADD {prefix}x a\nEXPIRE {prefix}x 10\nEXEC\n",
            capture_output=True, text=True, timeout=10,
            env=dict(os.environ, REDISCLI_AUTH=passwords["tierkvd"])).stdout
        assert "NOPERM" not in out and "ERR" not in out, out

        # The script's calls are bound by the same ACL: a key elsewhere is
        # refused, whether passed in KEYS or not (Redis 7.0 words the
        # latter "can't access", later versions NOPERM).
        assert cli("SET", "unrelated", "not-yours", as_user="default") == "OK"
        assert "NOPERM" in cli("EVALSHA", sha, "1", "unrelated", "1", "+a")
        reader = "return redis.call('GET', 'unrelated')"
        other = hashlib.sha1(reader.encode()).hexdigest()
        assert cli("SCRIPT", "LOAD", reader) == other
        out = cli("EVALSHA", other, "0")
        assert "not-yours" not in out, out
        assert "NOPERM" in out or "can't access" in out, out
        # Nothing outside the directory's keys, no admin, no scripting but
        # loading and running scripts (EVAL, SCRIPT FLUSH/KILL, functions).
        for argv in (["SADD", "tkv:othercluster:nodes", "a"],
                     ["GET", "unrelated"], ["FLUSHALL"], ["CONFIG", "GET", "*"],
                     ["KEYS", "*"], ["EVAL", "return 1", "0"],
                     ["SCRIPT", "FLUSH"], ["SCRIPT", "KILL"],
                     ["FUNCTION", "LIST"], ["FCALL", "f", "0"],
                     ["ACL", "LIST"], ["CLIENT", "LIST"],
                     ["SUBSCRIBE", f"{prefix}events"]):
            assert "NOPERM" in cli(*argv), argv
        # Without a password: nothing at all.
        assert "NOAUTH" in cli("GET", f"{prefix}dir_epoch", as_user=None)
        r = subprocess.run(
            [redis_cli, "-h", "127.0.0.1", "-p", str(port), "--user", user,
             "GET", f"{prefix}dir_epoch"], capture_output=True, text=True,
            timeout=10, env=dict(os.environ, REDISCLI_AUTH="wrong"))
        assert "WRONGPASS" in r.stdout + r.stderr, r
        assert "NOAUTH" in r.stdout + r.stderr, r
        # The default user (operators) has the requirepass password.
        assert cli("DBSIZE", as_user="default").isdigit()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
