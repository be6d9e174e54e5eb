#!/usr/bin/env bash
# ops-venv.sh — the small virtualenv the operations tests (tests/ops) and the
# dashboard generator (deploy/grafana/tierkv_dashboard.py) run in.
#
# Usage: scripts/ops-venv.sh [VENV_DIR]      (default: <repo>/build/ops-venv)
#
# Pinned with ==: grafanalib (Grafana dashboards as code), its attrs, pytest,
# PyYAML, kubernetes-validate (Kubernetes manifests against the API's
# OpenAPI schemas, offline) and websocket-client (the status page test drives
# headless Chromium over the DevTools protocol). Debian's interpreter, seeing Debian's packages
# (numpy, which the tierkv Python package imports). Idempotent: a stamp file
# holding the pins makes a later run with the same pins exit at once, with no
# network access.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=/usr/bin/python3
venv=${1:-build/ops-venv}
pins=(
  grafanalib==0.7.1
  attrs==25.3.0
  pytest==8.3.5
  PyYAML==6.0.2
  kubernetes-validate==1.31.0
  websocket-client==1.8.0
)
stamp="$venv/.tierkv-ops-pins"
if [[ -f $stamp && "$(cat "$stamp")" == "system-site ${pins[*]}" ]]; then
  exit 0
fi
"$PYTHON" -m venv --system-site-packages "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "${pins[@]}"
echo "system-site ${pins[*]}" > "$stamp"
echo "ops-venv: $venv ready (${pins[*]})"
