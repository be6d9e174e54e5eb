#!/usr/bin/env bash
# check-install.sh — the README's `pip install .`, as a new user runs it, from
# a clean tree: the checkout's files (tracked, plus untracked ones git does
# not ignore; no build folder, so no library built earlier can hide a broken
# install) are copied to a scratch directory, then
#   1. `pip install SRC` into a new virtualenv of Debian's /usr/bin/python3;
#   2. `pip wheel SRC`, and that wheel installed into a second new virtualenv;
# and in each, from /tmp (outside the source tree), `import tierkv` must come
# from the virtualenv and talk to a real tierkvd (TIERKV_BIN_DIR, default
# build/bin): connect, register a layout, put and get a page bit-exact.
#
# Usage: scripts/check-install.sh   (needs PyPI for scikit-build-core and numpy;
# pip's cache makes later runs fast)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
bin_dir=$(cd "${TIERKV_BIN_DIR:-build/bin}" && pwd)
PYTHON=/usr/bin/python3
scratch=$(mktemp -d /tmp/tierkv-install.XXXXXX)
trap 'rm -rf "$scratch"' EXIT

start=$(date +%s)
src=$scratch/src
mkdir -p "$src"
git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [[ -e $f ]] && printf '%s\0' "$f"; done |
  tar --null -T - -cf - | tar -xf - -C "$src"
echo "check-install: clean tree of $(find "$src" -type f | wc -l) files in $src"

# Runs in an installed environment, from /tmp: the package must be the
# installed one, and its C library must work against a real daemon.
smoke=$(cat <<'EOF'
import os, sys, tempfile, pathlib
import numpy as np
import tierkv
from tierkv.testing import Tierkvd
pkg = pathlib.Path(tierkv.__file__).resolve()
assert pkg.is_relative_to(pathlib.Path(sys.prefix).resolve()), pkg
from importlib import metadata
dist = metadata.distribution("tierkvd-client")
token = "install-check"
with tempfile.TemporaryDirectory() as d:
    cfg = f'[[namespace]]\nname = "default"\ntoken = "{token}"\nhost_bytes = "8MiB"\n'
    with Tierkvd(pathlib.Path(d), cfg) as daemon:
        with tierkv.connect(daemon.socket, namespace="default", token=token) as c:
            c.register_layout(tierkv.Layout.uniform(16, 2, [("kv", 64)]))
            pages = tierkv.page_hashes(np.arange(32, dtype=np.uint32), 16,
                                       namespace="default")
            data = np.random.default_rng(0).integers(0, 256, (2, 1024), dtype=np.uint8)
            c.put(pages, 1, "kv", data)
            out = np.zeros_like(data)
            c.get(pages, 1, "kv", out)
            assert (out == data).all()
            assert c.match(pages).leading_pages == 0  # layer 0 not stored
print(f"{dist.metadata['Name']} {dist.version} imported from {pkg.parent} "
      f"(python {sys.version.split()[0]}): put/get through tierkvd bit-exact")
EOF
)

check() {  # check VENV: the smoke test with VENV's python, from /tmp
  (cd /tmp && TIERKV_BIN_DIR=$bin_dir "$1/bin/python" -c "$smoke")
}

pip_quiet=(--no-input --disable-pip-version-check -q)
"$PYTHON" -m venv "$scratch/venv-src"
"$scratch/venv-src/bin/pip" install "${pip_quiet[@]}" "$src"
echo -n "check-install: pip install SRC: "
check "$scratch/venv-src"

"$PYTHON" -m venv "$scratch/venv-wheel"
"$scratch/venv-src/bin/pip" wheel "${pip_quiet[@]}" --no-deps -w "$scratch/dist" "$src"
wheel=$(ls "$scratch"/dist/*.whl)
"$scratch/venv-wheel/bin/pip" install "${pip_quiet[@]}" "$wheel"
echo -n "check-install: pip install $(basename "$wheel"): "
check "$scratch/venv-wheel"
echo "check-install: both installs work ($(( $(date +%s) - start )) s)"
