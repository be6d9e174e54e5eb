#!/usr/bin/env bash
# Quick start (README, command 1): installs what tierkv needs, builds it,
# starts tierkvd on its embedded defaults and runs the demo workload through
# the client library, then stops the daemon.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh build -- tierkvd tierkv

run_dir=${TIERKV_RUN_DIR:-/run/tierkv}
ready=$(mktemp -u /tmp/tierkvd-ready.XXXXXX)
log=$(mktemp /tmp/tierkvd-log.XXXXXX)
echo "== starting tierkvd (embedded defaults; socket $run_dir/tierkv.sock, metrics 127.0.0.1:9400)"
build/bin/tierkvd --socket "$run_dir/tierkv.sock" --ready-file "$ready" >"$log" 2>&1 &
daemon=$!
trap 'kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null; rm -f "$ready"' EXIT
for _ in $(seq 200); do
  [[ -f $ready ]] && break
  if ! kill -0 "$daemon" 2>/dev/null; then cat "$log"; exit 1; fi
  sleep 0.05
done
[[ -f $ready ]] || { echo "tierkvd did not start:"; cat "$log"; exit 1; }
cat "$log"
echo
build/bin/tierkv --socket "$run_dir/tierkv.sock" demo
echo
echo "== tierkv stats"
build/bin/tierkv --socket "$run_dir/tierkv.sock" stats
