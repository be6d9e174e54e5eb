#!/usr/bin/env bash
# Soak (issue 12): a real tierkvd with an NVMe tier and a small host tier,
# many clients running mixed load (`tierkv soak`: Put, verified Get,
# zero-copy leases, Match, Flush, reconnects) for a given time; then checks
# that the daemon's active leases and open fds are back at their baseline
# and its RSS is within 5% of where it started. Exit 0 only if the load saw
# no errors and all three hold. Assumes a build (scripts/build.sh build).
#
#   scripts/soak.sh [--minutes M | --seconds S] [--clients N] [--json FILE]
#
# Defaults: 10 minutes, 64 clients. TIERKV_BIN_DIR overrides build/bin;
# TIERKV_SOAK_DIR (default: a new directory under /var/tmp) holds the
# socket, token and NVMe file.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=600 clients=64 json=
while [[ $# -gt 0 ]]; do
  case $1 in
    --minutes) seconds=$(($2 * 60)); shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    *) echo "usage: $0 [--minutes M | --seconds S] [--clients N] [--json FILE]" >&2; exit 2 ;;
  esac
done
bin=${TIERKV_BIN_DIR:-build/bin}
dir=${TIERKV_SOAK_DIR:-$(mktemp -d /var/tmp/tierkv-soak.XXXXXX)}
mkdir -p "$dir"
cat >"$dir/tierkvd.toml" <<TOML
[server]
socket = "$dir/tierkv.sock"
[metrics]
listen = ""
[nvme]
path = "$dir/nvme.data"
capacity_bytes = "512MiB"
[[namespace]]
name = "default"
token_file = "$dir/default.token"
host_bytes = "128MiB"
shards = 4
TOML

"$bin/tierkvd" --config "$dir/tierkvd.toml" --ready-file "$dir/ready" \
  >"$dir/tierkvd.log" 2>&1 &
daemon=$!
# The 512 MiB NVMe file always goes; the logs stay where a run failed.
trap 'kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null || true
      rm -rf "$dir/nvme.data" "$dir/nvme.data.catalog"' EXIT
for _ in $(seq 600); do
  [[ -f $dir/ready ]] && break
  kill -0 "$daemon" 2>/dev/null || { cat "$dir/tierkvd.log"; exit 1; }
  sleep 0.05
done
[[ -f $dir/ready ]] || { echo "tierkvd did not start"; cat "$dir/tierkvd.log"; exit 1; }

cli=("$bin/tierkv" --socket "$dir/tierkv.sock")
leases() { "${cli[@]}" stats --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["active_leases"])'; }
# Open fds other than the catalog's own files: RocksDB keeps its SST files
# open, and how many there are follows flushes and compactions, not clients.
fd_targets() {
  for fd in /proc/"$daemon"/fd/*; do readlink "$fd" || true; done |
    grep -v "^$dir/nvme.data.catalog/" | sort
}
fds() { fd_targets | wc -l; }
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$daemon/status"; }

base_leases=$(leases) base_fds=$(fds) base_rss=$(rss_kib)
fd_targets >"$dir/fds.before"
echo "== baseline: leases $base_leases, fds $base_fds, RSS $((base_rss / 1024)) MiB"
echo "== soak: $clients clients for $seconds s"
soak_json=${json:-$dir/soak.json}
soak_rc=0
"${cli[@]}" soak --clients "$clients" --seconds "$seconds" \
  --json "$soak_json" || soak_rc=$?

# Connections close asynchronously in the daemon: give its cleanup up to
# 10 s to finish (polled, not slept on).
for _ in $(seq 200); do
  [[ $(leases) == "$base_leases" && $(fds) == "$base_fds" ]] && break
  sleep 0.05
done
end_leases=$(leases) end_fds=$(fds) end_rss=$(rss_kib)
rss_change=$(/usr/bin/python3 -c "print(f'{($end_rss - $base_rss) / $base_rss * 100:+.1f}')")
echo "== after: leases $end_leases, fds $end_fds, RSS $((end_rss / 1024)) MiB ($rss_change%)"
kill -0 "$daemon" 2>/dev/null || { echo "FAIL: tierkvd exited"; exit 1; }

fail=0
[[ $soak_rc == 0 ]] || { echo "FAIL: the load saw errors (see $soak_json)"; fail=1; }
[[ $end_leases == "$base_leases" ]] || { echo "FAIL: leases $end_leases, baseline $base_leases"; fail=1; }
if [[ $end_fds != "$base_fds" ]]; then
  echo "FAIL: fds $end_fds, baseline $base_fds; opened and not closed:"
  fd_targets | diff "$dir/fds.before" - || true
  fail=1
fi
/usr/bin/python3 -c "import sys; sys.exit(abs($end_rss - $base_rss) > 0.05 * $base_rss)" ||
  { echo "FAIL: RSS moved $rss_change%, more than 5%"; fail=1; }
if [[ $fail == 0 ]]; then
  echo "== soak passed"
  [[ -n ${TIERKV_SOAK_DIR:-} ]] || rm -rf "$dir"
else
  echo "(daemon log and report in $dir)"
fi
exit "$fail"
