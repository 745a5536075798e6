#!/usr/bin/env bash
# `make images`: builds the two images a department deploys, tagged as deploy/ names them:
#   yolo8:VERSION          the trainer: yolo8, LibTorch 2.11.0+cu130 and the CUDA 13.0 runtime from pinned wheels;
#                          runs on CPU nodes as it is, on GPU nodes with the NVIDIA container toolkit
#   yolo8-quotad:VERSION   the quota service: quotad, no LibTorch
# with podman, else docker (CONTAINER_ENGINE=docker to choose). The binaries come from this machine's build
# (BUILD_DIR, default build; built first when missing), see deploy/docker/Dockerfile for why.
# Env: BASE_IMAGE (default: debian:bookworm with docker; with podman, localhost/debian:bookworm made by
# scripts/container_base.sh when no registry is reachable), IMAGE_TAG (default the project's version).
# Prints a table of the images and their sizes and writes it to .deps/images.json.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
source scripts/container_env.sh
build_dir=${BUILD_DIR:-build}
version=$(sed -n 's/^project(yolo8 VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
tag=${IMAGE_TAG:-$version}

if [[ ! -x $build_dir/trainer/yolo8 || ! -x $build_dir/quota/quotad ]]; then
  BUILD_DIR=$build_dir scripts/setup.sh
fi

base=${BASE_IMAGE:-}
if [[ -z $base ]]; then
  if [[ $container_engine == podman ]]; then base=$(scripts/container_base.sh); else base=debian:bookworm; fi
fi

context=$root/.deps/image-context
rm -rf "$context"
mkdir -p "$context/bin" "$context/locks"
cp "$build_dir/trainer/yolo8" "$build_dir/quota/quotad" "$context/bin/"
strip --strip-unneeded "$context/bin/yolo8" "$context/bin/quotad"
# The build's RUNPATH names this machine's .venv and CUDA toolkit; in the image both live under /opt/torch.
patchelf --set-rpath /opt/torch/torch/lib:/opt/torch/nvidia/cu13/lib "$context/bin/yolo8"
deploy/docker/collect-runtime.sh "$build_dir/trainer/yolo8" > "$context/yolo8.packages"
deploy/docker/collect-runtime.sh "$build_dir/quota/quotad" > "$context/quotad.packages"
cp scripts/locks/torch.txt scripts/locks/cuda-runtime.txt "$context/locks/"
# The wheels for the image's Python (bookworm's 3.11), fetched here where pip knows the proxy and its CA, kept in
# YOLO8_WHEEL_CACHE (default ~/.cache/yolo8/wheels, shared by every checkout) between builds (pip skips a file already
# there when its hash matches), linked (or copied) into the context.
wheels=${YOLO8_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/yolo8/wheels}
mkdir -p "$wheels"
python3 -m pip download --quiet --disable-pip-version-check --no-input --require-hashes --no-deps \
  --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 --abi none \
  $(printf -- '--platform manylinux_2_%s_x86_64 ' 28 27 25 24 18 17 12 5) \
  --platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64 -d "$wheels" -r scripts/locks/torch.txt -r scripts/locks/cuda-runtime.txt
mkdir -p "$context/wheels"
for lock in scripts/locks/torch.txt scripts/locks/cuda-runtime.txt; do
  for name in $(sed -n 's/^\([A-Za-z0-9_.-]*\)==\([^ ]*\).*/\1-\2/p' "$lock" | tr '-' '_' | sed 's/_\([0-9][^_]*\)$/-\1/'); do
    for file in "$wheels"/"$name"-*.whl; do
      [[ -e $file ]] || { echo "images: no wheel $name-*.whl in $wheels" >&2; exit 1; }
      ln "$file" "$context/wheels/" 2>/dev/null || cp "$file" "$context/wheels/"
    done
  done
done
cp deploy/docker/torch-runtime-libs.txt "$context/"
cp -r configs "$context/configs"

revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
[[ -z $(git status --porcelain --untracked-files=no 2>/dev/null) ]] || revision="$revision-dirty"
log_dir=$root/.deps/image-logs
mkdir -p "$log_dir"
for target in quotad yolo8; do
  name=$([[ $target == yolo8 ]] && echo "yolo8:$tag" || echo "yolo8-quotad:$tag")
  echo "images: building $name from $base ($container_engine; log $log_dir/$target.log)" >&2
  start=$(date +%s)
  if ! engine build --network=host --target "$target" --build-arg BASE_IMAGE="$base" \
      --build-arg VERSION="$version" --build-arg REVISION="$revision" \
      -t "$name" -f deploy/docker/Dockerfile "$context" > "$log_dir/$target.log" 2>&1; then
    tail -30 "$log_dir/$target.log" >&2
    echo "images: building $name failed (whole log: $log_dir/$target.log)" >&2
    exit 1
  fi
  echo "images: $name built in $(( $(date +%s) - start )) s" >&2
done

printf '%-22s %10s  %s\n' IMAGE "SIZE (MB)" REVISION
json="[]"
for name in "yolo8:$tag" "yolo8-quotad:$tag"; do
  size=$(engine image inspect --format '{{.Size}}' "$name")
  printf '%-22s %10d  %s\n' "$name" $(( size / 1000000 )) "$revision"
  json=$(python3 -c 'import json,sys; l=json.loads(sys.argv[1]); l.append({"image":sys.argv[2],"size_bytes":int(sys.argv[3]),"revision":sys.argv[4],"engine":sys.argv[5],"base":sys.argv[6]}); print(json.dumps(l))' \
    "$json" "$name" "$size" "$revision" "$container_engine" "$base")
done
echo "$json" | python3 -m json.tool > "$root/.deps/images.json"
