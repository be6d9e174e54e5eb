#!/usr/bin/env bash
# The CUDA checks on a machine that has both a GPU and this project's build
# dependencies: builds the bundle (tests/gpu/bundle.sh) and runs it
# (gpu-bundle/run.sh). A bare GPU machine, which cannot build, gets the
# bundle built elsewhere: tests/gpu/README.md.
#
#   tests/gpu/run.sh [BUILD_DIR]    ($OUT, when set, receives the logs and JSON)
set -euo pipefail
cd "$(dirname "$0")/../.."
tests/gpu/bundle.sh "${1:-build-gpu}" gpu-bundle
exec gpu-bundle/run.sh ${OUT:+--out "$OUT"}
