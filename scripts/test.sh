#!/usr/bin/env bash
# The README's test command: install what is missing, build, run every CTest test.
# Extra arguments go to ctest (e.g. -L unit, -R Loss).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build_dir=${BUILD_DIR:-build}
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" --timeout 600 "$@"
