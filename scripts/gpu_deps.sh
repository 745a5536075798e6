#!/usr/bin/env bash
# Run here, where Debian's registry is reachable: downloads into .deps/ (ignored by git) the packages that a bare
# GPU machine lacks to build yolo8 without OpenCV. scripts/gpu_check.sh unpacks them there; the device tool
# carries the folder (carry: [".deps"]), about 3 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps
cd .deps
apt-get download libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev libsqlite3-dev libsqlite3-0 libcli11-dev \
  libcpp-httplib-dev libcpp-httplib0.11 libbrotli1 libgtest-dev libgmock-dev prometheus-cpp-dev libprometheus-cpp-core1.0 2>&1 | grep -v '^W: Download is performed unsandboxed' || true
ls -1 *.deb | wc -l | xargs echo "gpu_deps: .deb files in .deps:"
