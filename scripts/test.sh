#!/usr/bin/env bash
# The whole test suite (README, command 2; CI runs it through .ci/run):
#   1. RelWithDebInfo build, every test (real tierkvd processes, RocksDB,
#      io_uring);
#   2. ThreadSanitizer build of the storage and transport tests;
#   3. AddressSanitizer + UBSan build, every test (the daemon the tests start
#      is instrumented too).
# Set TIERKV_SKIP_SANITIZERS=1 for a quick local run of step 1 only.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/install-deps.sh

echo "== [1/3] build + tests ($(( $(date +%s) - start )) s so far)"
scripts/build.sh build
ctest --test-dir build -j2 --output-on-failure --timeout 600

if [[ ${TIERKV_SKIP_SANITIZERS:-0} != 1 ]]; then
  echo "== [2/3] ThreadSanitizer: storage and transport ($(( $(date +%s) - start )) s so far)"
  scripts/build.sh build-tsan -DTIERKV_SANITIZE=thread -DTIERKV_BUILD_EXECUTOR=OFF \
    -- storage_tests transport_tests
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" build-tsan/bin/storage_tests --gtest_brief=1
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" build-tsan/bin/transport_tests --gtest_brief=1

  echo "== [3/3] AddressSanitizer + UBSan: every test ($(( $(date +%s) - start )) s so far)"
  scripts/build.sh build-asan -DTIERKV_SANITIZE=address,undefined
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
    ctest --test-dir build-asan -j2 --output-on-failure --timeout 900
fi
