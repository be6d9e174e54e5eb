#!/usr/bin/env bash
# Crash test of the NVMe tier: SIGKILLs tierkvd N times at random moments
# under a write_through writer and checks, after every restart, that each
# segment acknowledged as persisted reads back bit-exact.
#   scripts/crash_test.sh [--kills N] [--seed S]
set -euo pipefail
cd "$(dirname "$0")/.."
kills=10
seed=""
while (($#)); do
  case $1 in
    --kills) kills=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    *) echo "usage: $0 [--kills N] [--seed S]" >&2; exit 2 ;;
  esac
done
[[ -x build/bin/client_tests && -x build/bin/tierkvd ]] || scripts/build.sh build -- client_tests tierkvd
export TIERKV_BIN_DIR=$PWD/build/bin TIERKV_CRASH_KILLS=$kills
[[ -n $seed ]] && export TIERKV_CRASH_SEED=$seed
exec build/bin/client_tests --gtest_filter='CrashTest.*'
