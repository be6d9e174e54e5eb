#!/usr/bin/env bash
# Installs every Debian 12 package that tierkv's build, tests and benchmarks need.
# Idempotent; run as root. DESIGN.md §12 lists why each is here.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
pkgs=(
  build-essential cmake ninja-build pkg-config ccache git ca-certificates
  clang-14 clang-format
  liburing-dev librocksdb-dev libboost-dev libucx-dev ucx-utils prometheus-cpp-dev
  libhiredis-dev redis-server libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev libxxhash-dev nlohmann-json3-dev
  libcli11-dev libspdlog-dev libfmt-dev libtomlplusplus-dev
  python3 python3-dev python3-numpy python3-pytest python3-matplotlib
  fio curl procps
  prometheus tmux chromium systemd python3-venv python3-yaml strace
)
# tests/ops renders deploy/k8s with `kubectl kustomize` (offline): Debian's
# kubectl unless one is installed already (e.g. Google's kubectl package).
command -v kubectl > /dev/null || pkgs+=(kubernetes-client)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all ${#pkgs[@]} packages present"
fi
