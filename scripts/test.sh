#!/usr/bin/env bash
# The README's test command: install what is missing, build, build the images (the `container` tests run them), run
# every CTest test. Extra arguments go to ctest (e.g. -L unit, -R Loss, -LE container).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build} scripts/images.sh
build_dir=${BUILD_DIR:-build}
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" --timeout 600 "$@"
