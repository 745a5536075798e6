#!/usr/bin/env bash
# The GPU check, prepared to run once on a lent GPU machine (issue #8's table, CUDA tests, AMP):
#   here:   scripts/gpu_deps.sh
#   device: run(command="bash scripts/gpu_check.sh", carry=[".deps"], timeout_s=600)
# Builds with PyTorch's CUDA LibTorch and the unpacked .deb files (no OpenCV: data/ and image modes are skipped),
# runs the unit and golden tests (the CUDA ones included), profiles every variant at 640 on synthetic batches and
# sizes batch=auto under two budgets. Results land in $OUT (default build-gpu/out): at most 8 files.
# Each stage has its own time limit so that a slow one still leaves the others their turn.
# A dry run on a CPU machine: OUT=/tmp/gpu IMGSZ=128 VARIANTS=n,s BATCHES=1,2 BUDGETS=0.5 BUILD_TIMEOUT=1500 \
#   TOTAL_SECONDS=3000 bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/build-gpu/out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
start=$(date +%s)
imgsz=${IMGSZ:-640}
variants=${VARIANTS:-n,s,m,l,x}
batches=${BATCHES:-1,2,4,8,16,32}
budgets=${BUDGETS:-16 40}
build_timeout=${BUILD_TIMEOUT:-330}
total=${TOTAL_SECONDS:-570}  # the device tool stops a command at 600 s
# limit MAX RESERVE: a stage's timeout, at most MAX and leaving RESERVE seconds for the stages after it.
limit() {
  local left=$(( total - ($(date +%s) - start) - $2 ))
  (( left > $1 )) && left=$1
  (( left < 5 )) && left=5
  echo "$left"
}
stage() { echo "== $(( $(date +%s) - start )) s: $*"; }

stage "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt" || echo "no nvidia-smi"
nproc

stage "unpack .deps"
deps=/tmp/yolo8-deps
mkdir -p "$deps"
for deb in .deps/*.deb; do
  if command -v dpkg >/dev/null; then
    dpkg -x "$deb" "$deps"
  else
    # No dpkg: a .deb is an ar archive whose data.tar.* member holds the files.
    python3 - "$deb" "$deps" <<'PY'
import io, sys, tarfile
data = open(sys.argv[1], 'rb').read()
pos = 8
while pos < len(data):
    name = data[pos:pos + 16].decode().strip().rstrip('/')
    size = int(data[pos + 48:pos + 58].decode().strip())
    body = data[pos + 60:pos + 60 + size]
    if name.startswith('data.tar'):
        tarfile.open(fileobj=io.BytesIO(body)).extractall(sys.argv[2])
    pos += 60 + size + (size & 1)
PY
  fi
done
export LD_LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}

stage "configure"
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null ||
  echo "no PyTorch in python3: CMake looks for LibTorch in the usual places"
# NCCL's header comes with its pip package (nvidia-nccl-*), not with LibTorch; without it NCCL is left out.
nccl_include=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "include"))' \
  2>/dev/null || true)
if [[ -n $nccl_include && -f $nccl_include/nccl.h ]]; then export CPATH=$nccl_include${CPATH:+:$CPATH}; fi
echo "nccl.h: ${nccl_include:-not found}"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$torch_prefix;$deps/usr" \
  -DYOLO8_BUILD_BENCHMARKS=OFF -DCMAKE_DISABLE_FIND_PACKAGE_OpenCV=ON || { stage "configure failed"; exit 1; }
grep -q "YOLO8_WITH_CUDA:.*ON\|CUDA=ON" build-gpu/CMakeCache.txt || true

# The order is by value: the binary and the issue's figures first, the test suite with the time that is left.
stage "build yolo8"
# -k 0: every error of this compiler in one run (LibTorch 2.x API differences show up only here).
timeout "$(limit "$build_timeout" 200)" ninja -C build-gpu -k 0 yolo8 2>&1 |
  grep -E "error|FAILED|^\[[0-9]+/[0-9]+\] Linking" | head -80
if [[ ! -x build-gpu/trainer/yolo8 ]]; then stage "build failed"; exit 1; fi
yolo8=build-gpu/trainer/yolo8

stage "profile $variants at $imgsz"
timeout "$(limit 150 150)" $yolo8 profile variants=$variants imgsz=$imgsz batch=$batches device=0 \
  project=/tmp/yolo8-runs name=variants exist_ok=true
cp /tmp/yolo8-runs/variants/profile.json "$OUT/profile_$imgsz.json" 2>/dev/null
cp /tmp/yolo8-runs/variants/memory-table.yaml "$OUT/memory-table.yaml" 2>/dev/null

for budget in $budgets; do
  stage "batch=auto under gpu_mem=$budget GiB"
  timeout "$(limit 75 90)" $yolo8 profile variants=$variants imgsz=$imgsz batch=auto gpu_mem=$budget device=0 \
    project=/tmp/yolo8-runs name=auto$budget exist_ok=true | grep -v "auto-batch:"
  cp /tmp/yolo8-runs/auto$budget/auto_batch.json "$OUT/auto_batch_${budget}gib.json" 2>/dev/null
done

stage "build and run the unit and golden tests (CUDA ones included) in the time left"
timeout "$(limit 600 60)" ninja -C build-gpu -k 0 2>&1 | grep -E "error|FAILED" | head -40
# The CUDA-only tests first, with their printed figures (ctest shows output only on failure).
timeout "$(limit 60 30)" build-gpu/tests/trainer/test_trainer_unit --gtest_filter='*Cuda*:*CUDA*'
timeout "$(limit 120 5)" ctest --test-dir build-gpu -L "unit|golden" -j 8 --timeout 100 --output-on-failure \
  > "$OUT/ctest.log" 2>&1
tail -15 "$OUT/ctest.log"
stage "done"
