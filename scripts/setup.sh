#!/usr/bin/env bash
# Installs the missing Debian packages (idempotent) and the pinned Python environments, then configures and builds yolo8 into build/.
# Usage: scripts/setup.sh [--no-build]   Env: BUILD_DIR (default build), BUILD_TYPE (default Release).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(cmake g++ ninja-build ccache pkg-config libopencv-dev libcli11-dev libyaml-cpp-dev
          libgtest-dev libgmock-dev nlohmann-json3-dev libcpp-httplib-dev libmicrohttpd-dev libsqlite3-dev libbenchmark-dev libgloo-dev libjpeg-dev
          libhowardhinnant-date-dev libonnx-dev libprotobuf-dev protobuf-compiler prometheus-cpp-dev prometheus chromium
          patchelf   # patchelf: scripts/gpu_bundle.sh sets the bundle's RUNPATH (GpuBundle.CleanEnvironment)
          faketime   # faketime: QuotadUnderFaketime.* steps quotad's wall clock by 2 h
          libpq-dev postgresql-15   # quotad's PostgreSQL store; its tests start a throwaway cluster
          podman runc debootstrap curl openssl jq)  # make images and the container tests (tests/deploy/container)

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

# LibTorch: PyPI's CUDA torch wheel, pinned with hashes (scripts/locks/torch.txt), into .venv/torch, only when the
# lock changed (cmake/Yolo8Torch.cmake finds it there); the test tools (ONNX Runtime, the Kubernetes schema
# validator) likewise into .venv/tools from scripts/locks/tools.txt, and the peer, Ultralytics 8.0.232, into
# .venv/peer (scripts/locks/peer.txt; run with scripts/peer.sh).
scripts/pyenv.sh torch tools peer >/dev/null

[[ "${1:-}" == "--no-build" ]] && exit 0

build_dir=${BUILD_DIR:-build}
# YOLO8_REQUIRE_CUDA: the CUDA path (YOLO8_WITH_CUDA, libtorch_cuda, c10d NCCL) is compiled in every build; a
# configure that would leave it out fails.
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" -DYOLO8_REQUIRE_CUDA=ON >/dev/null
# Two LibTorch compilers at a time fit the 2-core / 24 GiB machines; more only thrash.
cmake --build "$build_dir" -- -j "${BUILD_JOBS:-$(nproc)}"
