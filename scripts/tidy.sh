#!/usr/bin/env bash
# clang-tidy with .clang-tidy's checks over the project's own sources (not tests), using build/'s compile database.
# Usage: scripts/tidy.sh [PATH_REGEX]   e.g. scripts/tidy.sh quota/   Env: BUILD_DIR (default build), JOBS.
# About 25 minutes for the whole tree on 2 cores (LibTorch's headers dominate), so it is not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
filter=${1:-'(models|data|trainer|quota)/'}
[[ -f $build_dir/compile_commands.json ]] || scripts/setup.sh
# The precompiled header flags are GCC's; clang-tidy parses the headers itself.
sed -e 's/-include [^ ]*cmake_pch\.hxx//g' -e 's/-Winvalid-pch//g' -e 's/-fpch-preprocess//g' \
  "$build_dir/compile_commands.json" > "$build_dir/compile_commands.tidy.json"
mkdir -p "$build_dir/tidy"
cp "$build_dir/compile_commands.tidy.json" "$build_dir/tidy/compile_commands.json"
run-clang-tidy -quiet -p "$build_dir/tidy" -j "${JOBS:-$(nproc)}" "$PWD/($filter)[^/]*(/[^/]*)?\.cpp$"
