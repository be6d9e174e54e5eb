#!/usr/bin/env bash
# Quick start (README, command 1): installs what tierkv needs, builds it,
# starts tierkvd on its embedded defaults plus an NVMe tier on a file, and
# runs the reference GLM-5 executor through it end to end: a random
# glm5-small checkpoint written on the fly, 2 chat sessions x 3 turns that
# share a system prompt, a host tier small enough that some pages come back
# from NVMe, and a check that every turn's logits equal a run without tierkv.
# Exit status 0 only if they all do. Then stops the daemon.
#
# TIERKV_RUN_DIR (socket, token; default /run/tierkv) and TIERKV_WORK_DIR
# (checkpoint and NVMe file, on disk; default /var/tmp/tierkv-quickstart).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh build -- tierkvd tierkv tierkv-run

run_dir=${TIERKV_RUN_DIR:-/run/tierkv}
work_dir=${TIERKV_WORK_DIR:-/var/tmp/tierkv-quickstart}
mkdir -p "$work_dir"
rm -rf "$work_dir/nvme.data" "$work_dir/nvme.data.catalog"
ready=$(mktemp -u /tmp/tierkvd-ready.XXXXXX)
log=$(mktemp /tmp/tierkvd-log.XXXXXX)

echo "== writing a random glm5-small checkpoint to $work_dir/glm5-small"
build/bin/tierkv-run --write-random-model "$work_dir/glm5-small" \
  --preset glm5-small --seed 1

# Embedded defaults, except an NVMe tier and 8 MiB of host DRAM (instead of
# 1 GiB), so that the sessions' pages spill to NVMe and come back from it.
echo
echo "== starting tierkvd (socket $run_dir/tierkv.sock, NVMe tier $work_dir/nvme.data)"
build/bin/tierkvd --socket "$run_dir/tierkv.sock" --ready-file "$ready" \
  --host-bytes 8MiB --nvme-path "$work_dir/nvme.data" --nvme-bytes 256MiB \
  >"$log" 2>&1 &
daemon=$!
trap 'kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null; rm -f "$ready"' EXIT
for _ in $(seq 400); do
  [[ -f $ready ]] && break
  if ! kill -0 "$daemon" 2>/dev/null; then cat "$log"; exit 1; fi
  sleep 0.05
done
[[ -f $ready ]] || { echo "tierkvd did not start:"; cat "$log"; exit 1; }
cat "$log"

echo
echo "== tierkv-run serve-sessions (the executor, its KV cache in tierkvd)"
build/bin/tierkv-run serve-sessions --model "$work_dir/glm5-small" \
  --tierkv "$run_dir/tierkv.sock" --sessions 2 --turns 3 \
  --system-tokens 192 --user-tokens 64 --reply-tokens 8

echo
echo "== tierkv stats"
build/bin/tierkv --socket "$run_dir/tierkv.sock" stats
