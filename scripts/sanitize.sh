#!/usr/bin/env bash
# The quota, data and loader tests under AddressSanitizer + UndefinedBehaviorSanitizer, then under ThreadSanitizer.
# Usage: scripts/sanitize.sh [asan|tsan|all]   (default all). Builds into build-asan/ and build-tsan/.
# LibTorch and OpenCV are not instrumented: what is checked is our code and what it does with them.
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-all}
jobs=${BUILD_JOBS:-$(nproc)}
targets=(quota_core_unit_tests quota_store_unit_tests quota_store_backend_tests quota_service_unit_tests
         quota_service_postgres_tests quota_client_unit_tests quota_server_unit_tests
         quota_server_integration_tests quota_chaos_tests quotad yolo_data_unit_tests yolo_data_integration_tests)
# The tests that exercise quotad, the store, the client, the data pipeline and the loader's threads.
test_regex='^(Data|Engine\.|Policy\.|PolicyValidation\.|Quota|Sha256|RenderK8s)'
# Chromium screenshots and kill -9 loops are slow under sanitizers and test no code of ours beyond the rest.
exclude_regex='HeadlessChromium'

run() {
  local name=$1 sanitizers=$2
  local dir=build-$name
  echo "== $name: -fsanitize=$sanitizers"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DYOLO8_SANITIZE="$sanitizers" \
    -DYOLO8_BUILD_BENCHMARKS=OFF >/dev/null
  cmake --build "$dir" --target "${targets[@]}" -- -j "$jobs"
  # ctest only sees the test executables that were built; the rest are reported as not run, so filter to ours.
  ctest --test-dir "$dir" -R "$test_regex" -E "$exclude_regex" --output-on-failure -j "$jobs" --timeout 900
}

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/scripts/lsan.supp}
case $which in
  asan) run asan address,undefined ;;
  tsan) run tsan thread ;;
  all) run asan address,undefined; run tsan thread ;;
  *) echo "usage: $0 [asan|tsan|all]" >&2; exit 2 ;;
esac
