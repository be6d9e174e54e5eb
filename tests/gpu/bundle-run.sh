#!/usr/bin/env bash
# run.sh — the GPU check, from the bundle tests/gpu/bundle.sh made (this
# file is copied there as run.sh). Runs from the bundle alone: its bin/ and
# lib/, the machine's glibc and NVIDIA driver, python3 if there is one (for
# the ratio checks), nothing installed.
#
#   run.sh [--no-gpu] [--out DIR]
#     --no-gpu  here, without a GPU: prove every carried binary starts from
#               the bundle (ldd clean against lib/, each one run), and the
#               daemon serves with [hbm] backend = "auto" (emulated)
#     --out     where logs and JSON go (default: a temporary folder; on the
#               device machine pass $OUT so they come back)
#
# One line per check, `gpu: PASS|FAIL <check> <figures>`; exit 0 only when
# every check passed. With a GPU, in order: the device and driver, tierkvd
# serving with [hbm] backend = "cuda" and a host arena registered, the CUDA
# tests (a skip is a failure; they include the daemon path: a real tierkvd
# on the GPU and this process as an engine whose tensors inside one
# allocation are loaded from DRAM, NVMe and HBM with its stream waiting on
# the device, a Store ordered after its stream, an engine killed with
# pools registered; and the working set with a consumer on another
# stream), compute-sanitizer memcheck and racecheck where present, and
# tierkv-bench hbm with its acceptance ratios (pinned page loads, batched
# as the daemon issues them, >= 0.8x and row gather >= 0.6x of one
# contiguous pinned cudaMemcpyAsync; batched device->device pages >= 0.25x
# of one contiguous device copy; same run) and its WaitEvent and
# registration figures. Meant
# to finish within 5 minutes on an H200 machine.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
gpu=1
out=
while (($#)); do
  case $1 in
    --no-gpu) gpu=0 ;;
    --out) out=$2; shift ;;
    *) echo "usage: $0 [--no-gpu] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
out=${out:-$(mktemp -d /tmp/tierkv-gpu.XXXXXX)}
mkdir -p "$out"
export LD_LIBRARY_PATH=$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
bin=$here/bin
fail=0
start=$(date +%s)
say() { echo "gpu: $*" | tee -a "$out/summary.txt"; }
check() {  # check NAME COMMAND...: PASS/FAIL on the exit status, log kept
  local name=$1 log=$out/$1.log
  shift
  if "$@" > "$log" 2>&1; then
    say "PASS $name"
  else
    say "FAIL $name (exit $?): $(tail -3 "$log" | tr '\n' ' ')"
    fail=1
  fi
}
: > "$out/summary.txt"
head -3 "$here/MANIFEST" | sed 's/^/gpu: bundle: /'

# 1. Every carried binary resolves every library from the bundle or the
#    machine's glibc/driver, and starts.
for b in "$bin"/*; do
  name=$(basename "$b")
  if ldd "$b" | grep -q "not found"; then
    say "FAIL ldd $name: $(ldd "$b" | grep "not found" | tr -s ' \n' ' ')"
    fail=1
  else
    say "PASS ldd $name: $(ldd "$b" | grep -c "$here/lib") libraries from the bundle"
  fi
done
check start-tierkvd "$bin/tierkvd" --help
check start-tierkv "$bin/tierkv" --help
check start-tierkv-bench "$bin/tierkv-bench" --help
check start-gpu_tests "$bin/gpu_tests" --gtest_list_tests

if ((gpu)); then
  if smi=$(nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,pci.bus_id \
      --format=csv,noheader 2>&1); then
    say "PASS device: $smi"
    nvidia-smi -q > "$out/nvidia-smi.txt" 2>&1
    say "info: $(grep -E 'CUDA Version|Compute Mode' "$out/nvidia-smi.txt" | tr -s ' \n' ' ')"
  else
    say "FAIL device: nvidia-smi: $smi"
    fail=1
  fi
fi

# 2. The daemon serves from the bundle, with the HBM tier on the GPU (or
#    emulated without one) and a host arena registered with the device.
daemon_dir=$(mktemp -d /tmp/tierkv-gpu-daemon.XXXXXX)
backend=$([ $gpu = 1 ] && echo cuda || echo auto)
cat > "$daemon_dir/tierkvd.toml" <<EOF
[server]
socket = "$daemon_dir/tierkv.sock"
[hbm]
backend = "$backend"
capacity_bytes = "256MiB"
[nvme]
path = "$daemon_dir/nvme.data"
capacity_bytes = "256MiB"
[[namespace]]
name = "default"
token = "gpu-check-token"
host_bytes = "64MiB"
EOF
"$bin/tierkvd" -c "$daemon_dir/tierkvd.toml" --metrics off \
  --ready-file "$daemon_dir/ready.json" > "$out/tierkvd.log" 2>&1 &
daemon=$!
for _ in $(seq 300); do
  [[ -s $daemon_dir/ready.json ]] && break
  kill -0 "$daemon" 2>/dev/null || break
  sleep 0.1
done
if [[ -s $daemon_dir/ready.json ]] &&
    "$bin/tierkv" --socket "$daemon_dir/tierkv.sock" --token gpu-check-token \
      demo > "$out/demo.log" 2>&1; then
  say "PASS tierkvd [hbm] backend=$backend: $(grep -m1 -i 'HBM tier' "$out/tierkvd.log" | cut -c1-160)"
else
  say "FAIL tierkvd [hbm] backend=$backend: $(tail -3 "$out/tierkvd.log" "$out/demo.log" 2>/dev/null | tr '\n' ' ')"
  fail=1
fi
kill "$daemon" 2>/dev/null
wait "$daemon" 2>/dev/null
rm -rf "$daemon_dir"

# 3. On the GPU: the CUDA unit tests (every one must run) and the benchmark.
if ((gpu)); then
  # TIERKV_BIN_DIR: the daemon-path tests start the bundle's tierkvd.
  if TIERKV_REQUIRE_GPU=1 TIERKV_BIN_DIR=$bin "$bin/gpu_tests" --gtest_brief=0 \
      --gtest_output="json:$out/gpu_tests.json" > "$out/gpu_tests.log" 2>&1; then
    say "PASS gpu_tests: $(grep -E '^\[  PASSED  \]' "$out/gpu_tests.log")"
  else
    say "FAIL gpu_tests: $(grep -E 'Failure|FAILED' "$out/gpu_tests.log" | head -5 | tr '\n' ' ')"
    fail=1
  fi
  # compute-sanitizer (memcheck, then racecheck on the kernels) over the
  # backend and working-set tests, where the machine has one; bounded so
  # the whole check stays within its time. The test that asks for more
  # device memory than there is stays out: memcheck counts the
  # cudaMalloc error it provokes (and checks) as an error.
  sanitizer=$(command -v compute-sanitizer ||
    ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  if [[ -n $sanitizer ]]; then
    for tool in memcheck racecheck; do
      if TIERKV_REQUIRE_GPU=1 timeout 150 "$sanitizer" --tool "$tool" \
          --error-exitcode 9 "$bin/gpu_tests" \
          --gtest_filter='CudaBackendTest.*:CudaWorkingSetTest.*:-CudaBackendTest.AnAllocationTooLargeIsExhaustedAndNotSticky' \
          > "$out/sanitizer-$tool.log" 2>&1; then
        say "PASS compute-sanitizer $tool: $(grep -m1 -E 'ERROR SUMMARY' "$out/sanitizer-$tool.log")"
      else
        say "FAIL compute-sanitizer $tool (exit $?): $(grep -E 'ERROR SUMMARY|Invalid|Race|Failure' "$out/sanitizer-$tool.log" | head -4 | tr '\n' ' ')"
        fail=1
      fi
    done
  else
    say "info: no compute-sanitizer on this machine"
  fi
  if "$bin/tierkv-bench" hbm --backend cuda --json "$out/hbm.json" > "$out/hbm.log" 2>&1; then
    sed 's/^/gpu:   /' "$out/hbm.log"
    if command -v python3 > /dev/null; then
      python3 - "$out/hbm.json" <<'PY' | tee -a "$out/summary.txt" || fail=1
import json, sys
cases = {c["case"]: c for c in json.load(open(sys.argv[1]))["cases"]}
bad = 0
pinned = "one contiguous pinned copy"
for name, floor, reference in [
        ("pages host->device pinned batched", 0.8, pinned),
        ("pages device->device batched", 0.25, "one contiguous device copy"),
        ("gather 656-B rows pinned", 0.6, pinned),
        ("gather 1152-B rows pinned", 0.6, pinned)]:
    c = cases.get(name)
    if c is None:
        print(f"gpu: FAIL hbm {name}: missing"); bad = 1; continue
    ok = c["ratio"] >= floor
    bad |= not ok
    print(f"gpu: {'PASS' if ok else 'FAIL'} hbm {name}: {c['gbps']:.2f} GB/s = "
          f"{c['ratio']:.2f}x {reference}, {c['reference_gbps']:.2f} GB/s "
          f"(needs >= {floor}x)")
for name in ["pages host->device pinned", "pages device->device",
             "wait 4 KiB copy + WaitEvent, us"]:
    c = cases.get(name)
    if c is None:
        print(f"gpu: FAIL hbm {name}: missing"); bad = 1; continue
    print(f"gpu: info hbm {name}: ratio {c['ratio']:.2f}x (same-run reference)")
for name, c in cases.items():
    if name.startswith("register "):
        print(f"gpu: info hbm {name}: {c['value']:.1f} ms/GiB, "
              f"{c['ratio']:.2f}x a memset of the same bytes")
sys.exit(bad)
PY
    else
      say "info: no python3: ratios not checked (see $out/hbm.json)"
    fi
  else
    say "FAIL hbm bench: $(tail -3 "$out/hbm.log" | tr '\n' ' ')"
    fail=1
  fi
fi

say "$([ $fail = 0 ] && echo PASS || echo FAIL) all checks in $(($(date +%s) - start)) s (logs in $out)"
exit $fail
