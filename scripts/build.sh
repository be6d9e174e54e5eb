#!/usr/bin/env bash
# Configures and builds tierkv with CMake + Ninja.
#   scripts/build.sh [BUILD_DIR] [extra cmake args...] [-- ninja targets...]
# Defaults: build/, RelWithDebInfo, every target, test-only sync points
# compiled in (the developer and CI build). A build to ship or install
# passes -DTIERKV_SYNC_POINTS=OFF, as deploy/docker/Dockerfile does:
#   scripts/build.sh build-release -DTIERKV_SYNC_POINTS=OFF -- tierkvd tierkv
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
cmake_args=()
targets=()
while (($#)); do
  if [[ $1 == -- ]]; then shift; targets=("$@"); break; fi
  cmake_args+=("$1"); shift
done
# ccache keys on paths relative to the checkout (base_dir, and no working
# directory in the hash), so a clone elsewhere (CI's) reuses this one's
# objects.
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=true
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${cmake_args[@]}" > "$dir.cmake.log" 2>&1 \
  || { cat "$dir.cmake.log"; exit 1; }
ninja -C "$dir" -j"${TIERKV_JOBS:-2}" "${targets[@]}"
