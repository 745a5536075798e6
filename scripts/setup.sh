#!/usr/bin/env bash
# Installs the missing Debian packages (idempotent), then configures and builds yolo8 into build/.
# Usage: scripts/setup.sh [--no-build]   Env: BUILD_DIR (default build), BUILD_TYPE (default Release).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(cmake g++ ninja-build ccache pkg-config libtorch-dev libopencv-dev libcli11-dev libyaml-cpp-dev
          libgtest-dev libgmock-dev nlohmann-json3-dev libcpp-httplib-dev libsqlite3-dev libbenchmark-dev libgloo-dev libjpeg-dev
          libonnx-dev prometheus-cpp-dev prometheus chromium)

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi

# The Kubernetes schema validator of tests/deploy (node + the npm packages its lock file pins). Debian's nodejs and
# npm only where the machine has no npm of its own (a Node.js from elsewhere bundles it; the two conflict).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "setup: installing nodejs npm"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends nodejs npm
fi
schema_dir=tests/deploy/k8s-schema
# npm ci deletes node_modules and installs again: only when the lock file changed since the last install.
if ! cmp -s "$schema_dir/package-lock.json" "$schema_dir/node_modules/.yolo8-installed-lock.json"; then
  echo "setup: installing the Kubernetes schema validator's npm packages"
  (cd "$schema_dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
  cp "$schema_dir/package-lock.json" "$schema_dir/node_modules/.yolo8-installed-lock.json"
fi
# ONNX Runtime for the export tests (tests/trainer/export): onnxruntime-node ships its CPU library in the package,
# so its download script stays off.
ort_dir=tests/trainer/export/onnxruntime
if ! cmp -s "$ort_dir/package-lock.json" "$ort_dir/node_modules/.yolo8-installed-lock.json"; then
  echo "setup: installing ONNX Runtime's npm package for the export tests"
  (cd "$ort_dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
  cp "$ort_dir/package-lock.json" "$ort_dir/node_modules/.yolo8-installed-lock.json"
fi

[[ "${1:-}" == "--no-build" ]] && exit 0

build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" >/dev/null
# Two LibTorch compilers at a time fit the 2-core / 24 GiB machines; more only thrash.
cmake --build "$build_dir" -- -j "${BUILD_JOBS:-$(nproc)}"
