#!/usr/bin/env bash
# The GPU check: one prepared command of at most 8 minutes on a lent GPU machine (scripts/gpu_check.md says what it
# writes and how to read it).
#   here:    scripts/gpu_bundle.sh        build yolo8 + the CUDA tests against pip's torch 2.11.0+cu130, pack
#                                         .deps/bundle.tar.xz (~15 MiB)
#   device:  run(command="scripts/gpu_check.sh", carry=[".deps/bundle.tar.xz"], timeout_s=540)
#   second try, some stages only:  STAGES=auto_batch,nvml scripts/gpu_check.sh
#   fallback without a bundle:     scripts/gpu_deps.sh here, carry [".deps/debs"]: builds there, without OpenCV
#   CPU dry run (CI, GpuCheck.DryRun):  OUT=DIR BUILD_DIR=build scripts/gpu_check.sh --dry-run
# It exits at once (3) unless a GPU is seen (nvidia-smi, then `yolo8 --version`: "(CUDA build)", "GPU: N visible").
# Stages, in order of value, each writing $OUT/STAGE.json (and appending to $OUT/gpu_check.log) when it finishes,
# and summary.json rebuilt after each one:
#   vram        yolo8 profile of n..x at 640 over a few batches, AMP and float32: peak allocated and reserved;
#               $OUT/memory-table.yaml is the AMP table quotad reads (checked with `quotad check-policy`)
#   auto_batch  batch=auto under 16, 40 and 80 GiB (gpu_mem): each verified by real steps and a validation at
#               twice the batch, the allocator capped at the budget, 0 OOM
#   throughput  training images/s of n and s at 640, AMP, channels-last: yolo8 train on a synthetic image dataset
#               (the real loader, JPEG decode included) against yolo8 profile's synthetic batches
#   cuda_tests  trainer_core_unit_tests --gtest_filter='*Cuda*' with its output
#   nvml        a training run's lease heartbeats (quota=local: NVML utilisation and memory) against nvidia-smi
# 8 files come back at most: gpu_check.log summary.json vram.json memory-table.yaml auto_batch.json
# throughput.json cuda_tests.json nvml.json. Each stage has a time limit; they sum to under TOTAL_SECONDS (480).
# The dry run runs the same stages and commands on the CPU at tiny sizes (imgsz 64, yolov8n, budgets of 0.1 GiB)
# against an existing build and writes the same files: a broken path or option fails it.
# Environment: OUT (default build-gpu/out), BUILD_DIR (a build to use; required with --dry-run), BUNDLE (a bundle
# folder or .tar.xz; default .deps/bundle.tar.xz, then .deps/bundle), STAGES, TOTAL_SECONDS, WORK (scratch folder),
# and the sizes below (IMGSZ, VARIANTS, BATCHES, AUTO_VARIANTS, AUTO_BUDGETS, THROUGHPUT_VARIANTS, ...).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dry=0
for arg in "$@"; do
  case $arg in
    --dry-run) dry=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument $arg (--dry-run, --help)" >&2; exit 2 ;;
  esac
done

OUT=${OUT:-$root/build-gpu/out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
WORK=${WORK:-$(mktemp -d /tmp/yolo8-gpu-check.XXXXXX)}
mkdir -p "$WORK/runs" && WORK=$(cd "$WORK" && pwd)
log=$OUT/gpu_check.log
: > "$log"
py=${PYTHON:-python3}
report() { "$py" "$root/scripts/gpu_check_report.py" "$@"; }
start=$(date +%s)
started_epoch=$(date +%s.%N)
say() { printf '%s\n' "$*" | tee -a "$log"; }
elapsed() { echo $(( $(date +%s) - start )); }

if (( dry )); then
  total=${TOTAL_SECONDS:-300}
  imgsz=${IMGSZ:-64}; variants=${VARIANTS:-n}; batches=${BATCHES:-1,2}
  auto_variants=${AUTO_VARIANTS:-n}; auto_budgets=${AUTO_BUDGETS:-0.08,0.12,0.2}
  tp_variants=${THROUGHPUT_VARIANTS:-n}; tp_batch=${THROUGHPUT_BATCH:-4}; tp_epochs=${THROUGHPUT_EPOCHS:-2}
  ds_train=${DATASET_TRAIN:-8}; ds_val=${DATASET_VAL:-2}
  device=cpu; common=(threads=1); workers=1
  limits=(vram=60 auto_batch=60 throughput=60 cuda_tests=30 nvml=40)
  nvml_seconds=${NVML_SECONDS:-2}
else
  total=${TOTAL_SECONDS:-480}
  imgsz=${IMGSZ:-640}; variants=${VARIANTS:-n,s,m,l,x}; batches=${BATCHES:-8,16,32,64}
  auto_variants=${AUTO_VARIANTS:-n,m,x}; auto_budgets=${AUTO_BUDGETS:-16,40,80}
  tp_variants=${THROUGHPUT_VARIANTS:-n,s}; tp_batch=${THROUGHPUT_BATCH:-64}; tp_epochs=${THROUGHPUT_EPOCHS:-3}
  ds_train=${DATASET_TRAIN:-512}; ds_val=${DATASET_VAL:-32}
  device=0; common=(); workers=$(nproc)
  limits=(vram=150 auto_batch=120 throughput=85 cuda_tests=45 nvml=60)
  nvml_seconds=${NVML_SECONDS:-32}
fi
stages=${STAGES:-vram,auto_batch,throughput,cuda_tests,nvml}
export USER=${USER:-gpucheck} YOLO8_CACHE_DIR=$WORK/cache  # quota=local needs a user; the dataset index cache
say "gpu_check: $( ((dry)) && echo "dry run on the CPU" || echo "on the GPU machine"), OUT=$OUT, WORK=$WORK," \
    "stages $stages, at most $total s"

stop() {  # stop STATUS EXIT REASON: an early end, with summary.json saying why
  say "gpu_check: $3"
  "$py" -c 'import json, sys; print(json.dumps({"check": "scripts/gpu_check.sh", "status": sys.argv[1], "reason": sys.argv[2]}))' \
    "$1" "$3" > "$OUT/summary.json" 2>/dev/null ||
    printf '{"check": "scripts/gpu_check.sh", "status": "%s"}\n' "$1" > "$OUT/summary.json"
  exit "$2"
}
no_gpu() { stop no_gpu 3 "$1: no GPU, nothing measured (the CPU dry run is --dry-run)"; }
setup_failed() { stop setup_failed 2 "$1"; }
if (( ! dry )); then
  smi=$(nvidia-smi -L 2>&1) || no_gpu "nvidia-smi fails: $smi"
  grep -q "^GPU [0-9]" <<<"$smi" || no_gpu "nvidia-smi lists no GPU"
  say "$smi"
  machine=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1)
else
  machine="CPU dry run: $(uname -m)"
fi
machine="$machine; $(nproc) cores; $(uname -sr)"

# --------------------------------------------------------------------------------------------- the runner
# Commands of a stage: run_cmd STAGE NAME SECONDS COMMAND... logs it, records `exit ms command` in WORK/STAGE.cmds
# and keeps its output in WORK/NAME.out.
run_cmd() {
  local stage=$1 name=$2 secs=$3
  shift 3
  (( secs < 5 )) && secs=5
  say "\$ $* (limit ${secs} s)"
  : > "$WORK/$name.out"
  local t0
  t0=$(date +%s%N)
  timeout -k 5 "$secs" "$@" 2>&1 | tee -a "$log" "$WORK/$name.out"
  local rc=${PIPESTATUS[0]}
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%s\t%s\t%s\n' "$rc" "$ms" "$*" >> "$WORK/$stage.cmds"
  say "  -> exit $rc after $(( ms / 1000 )) s"
  return "$rc"
}

bundle_run=()
runner=""
use_bundle() {  # use_bundle DIR-or-TARBALL
  local b=$1
  if [[ -f $b ]]; then
    mkdir -p "$WORK/bundle"
    if command -v xz >/dev/null; then tar -xJf "$b" -C "$WORK/bundle"; else
      "$py" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$b" "$WORK/bundle"; fi || return 1
    b=$WORK/bundle/$(ls "$WORK/bundle" | head -n 1)
  fi
  [[ -x $b/run ]] || return 1
  bundle_run=("$b/run")
  yolo8=("$b/run" yolo8)
  tests=("$b/run" trainer_core_unit_tests)
  quotad=(); [[ -x $b/bin/quotad ]] && quotad=("$b/run" quotad)
  runner="bundle $b ($(head -n 1 "$b/MANIFEST.txt" 2>/dev/null))"
}
use_build() {  # use_build DIR
  [[ -x $1/trainer/yolo8 ]] || return 1
  yolo8=("$1/trainer/yolo8")
  tests=("$1/tests/trainer/core/trainer_core_unit_tests")
  quotad=(); [[ -x $1/quota/quotad ]] && quotad=("$1/quota/quotad")
  runner="build $1"
}
build_there() {  # the fallback: Debian's -dev packages from .deps/debs, PyTorch's LibTorch, no OpenCV
  local deps=/tmp/yolo8-deps
  mkdir -p "$deps"
  ls .deps/debs/*.deb >/dev/null 2>&1 || { say "gpu_check: no bundle and no .deps/debs (scripts/gpu_deps.sh)"; return 1; }
  say "gpu_check: no bundle: building here with .deps/debs"
  for deb in .deps/debs/*.deb; do
    if command -v dpkg >/dev/null; then dpkg -x "$deb" "$deps"; else
      # No dpkg: a .deb is an ar archive whose data.tar.* member holds the files.
      "$py" - "$deb" "$deps" <<'PY'
import io, sys, tarfile
data = open(sys.argv[1], 'rb').read()
pos = 8
while pos < len(data):
    name = data[pos:pos + 16].decode().strip().rstrip('/')
    size = int(data[pos + 48:pos + 58].decode().strip())
    if name.startswith('data.tar'):
        tarfile.open(fileobj=io.BytesIO(data[pos + 60:pos + 60 + size])).extractall(sys.argv[2])
    pos += 60 + size + (size & 1)
PY
    fi
  done
  export LD_LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # openssl's configuration.h sits in the multiarch folder; NCCL's header comes with its pip package.
  local cpath=$deps/usr/include/x86_64-linux-gnu
  local nccl
  nccl=$("$py" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "include"))' 2>/dev/null)
  [[ -n $nccl && -f $nccl/nccl.h ]] && cpath=$cpath:$nccl
  export CPATH=$cpath${CPATH:+:$CPATH}
  local torch_prefix
  torch_prefix=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)') || return 1
  local dir=$root/build-gpu
  run_cmd build configure 120 cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$torch_prefix;$deps/usr" -DYOLO8_BUILD_BENCHMARKS=OFF -DCMAKE_DISABLE_FIND_PACKAGE_OpenCV=ON ||
    return 1
  local left=$(( total - $(elapsed) - 200 ))
  (( left > 330 )) && left=330
  # -k 0: every error of this compiler in one run. The whole output goes to WORK/build.out (no pipe into head: a
  # closed pipe would kill ninja), its errors to the log.
  say "\$ cmake --build $dir --target yolo8 trainer_core_unit_tests -- -k 0 (limit $left s)"
  timeout -k 5 "$left" cmake --build "$dir" --target yolo8 trainer_core_unit_tests -- -k 0 > "$WORK/build.out" 2>&1
  local rc=$?
  grep -E "error|FAILED" "$WORK/build.out" | tail -n 60 | tee -a "$log"
  say "  -> exit $rc after $(elapsed) s in all"
  (( rc == 0 )) && use_build "$dir"
}

if [[ -n ${BUILD_DIR:-} ]]; then
  use_build "$BUILD_DIR" || setup_failed "no $BUILD_DIR/trainer/yolo8"
elif [[ -n ${BUNDLE:-} ]]; then
  use_bundle "$BUNDLE" || setup_failed "$BUNDLE is no bundle (scripts/gpu_bundle.sh)"
elif (( dry )); then
  setup_failed "--dry-run needs BUILD_DIR=<a build> (or BUNDLE=<a bundle>)"
elif [[ -f .deps/bundle.tar.xz ]]; then
  use_bundle .deps/bundle.tar.xz || setup_failed ".deps/bundle.tar.xz does not unpack into a bundle"
elif [[ -x .deps/bundle/run ]]; then
  use_bundle .deps/bundle
else
  build_there || setup_failed "no bundle, and the build here failed (see gpu_check.log)"
fi
say "gpu_check: runner: $runner"
version=$("${yolo8[@]}" --version 2>&1) || { say "$version"; setup_failed "yolo8 --version fails: $(tail -n 3 <<<"$version")"; }
say "$version"
if (( ! dry )); then
  grep -q "(CUDA build)" <<<"$version" || no_gpu "yolo8 is not a CUDA build"
  grep -q "^GPU: [1-9][0-9]* visible" <<<"$version" || no_gpu "yolo8 sees no GPU ($(grep '^GPU' <<<"$version"))"
fi
[[ -n ${bundle_run[*]} ]] && say "$("${bundle_run[@]}" --env)"

report context "$OUT" "$WORK" dry_run=$dry started="$(date -u +%FT%TZ)" started_epoch="$started_epoch" \
  runner="$runner" version="$version" machine="$machine" total_seconds="$total" stages="$stages" \
  vram_precisions=amp,fp32 auto_budgets="$auto_budgets" throughput_variants="$tp_variants" \
  throughput_imgsz="$imgsz" throughput_batch="$tp_batch" decode=1 decode_reason=""

# --------------------------------------------------------------------------------------------- stages
failures=0
stage_limit() { local s; for s in "${limits[@]}"; do [[ ${s%%=*} == "$1" ]] && echo "${s#*=}"; done; }
selected() { [[ ",$stages," == *",$1,"* ]]; }
stage_start=0
stage_deadline=0
stage_timeout=0
begin_stage() {  # begin_stage NAME: its time limit, leaving 15 s to each selected stage after it
  local name=$1 reserve=0 later=0 s
  for s in vram auto_batch throughput cuda_tests nvml; do
    [[ $s == "$name" ]] && { later=1; continue; }
    (( later )) && selected "$s" && reserve=$(( reserve + 15 ))
  done
  stage_timeout=$(stage_limit "$name")
  local left=$(( total - $(elapsed) - reserve ))
  (( left < stage_timeout )) && stage_timeout=$left
  stage_start=$(date +%s)
  stage_deadline=$(( stage_start + stage_timeout ))
  rm -f "$WORK/$name.cmds"
  say ""
  say "== $(elapsed) s: stage $name (limit $stage_timeout s)"
  (( stage_timeout >= 10 ))
}
left_in_stage() {  # left_in_stage [PARTS]: this stage's seconds left, split among PARTS commands still to run
  local left=$(( stage_deadline - $(date +%s) ))
  echo $(( left / ${1:-1} ))
}
end_stage() {  # end_stage NAME [status=skipped reason=...]
  local name=$1
  shift
  report "$name" "$OUT" "$WORK" seconds=$(( $(date +%s) - stage_start )) timeout_s="$stage_timeout" "$@" |
    tee -a "$log"
  local status
  status=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["status"])' "$OUT/$name.json")
  [[ $status == failed || $status == timeout ]] && failures=$(( failures + 1 ))
}
run_stage() {  # run_stage NAME: begin, run stage_NAME, end
  local name=$1
  selected "$name" || return 0
  if begin_stage "$name"; then
    "stage_$name"
    end_stage "$name"
  else
    end_stage "$name" status=skipped reason="no time left ($(elapsed) s of $total used)"
  fi
}

stage_vram() {
  local precision amp parts=2
  for precision in amp fp32; do
    [[ $precision == amp ]] && amp=true || amp=false
    run_cmd vram "vram_$precision" "$(left_in_stage $parts)" "${yolo8[@]}" profile variants="$variants" \
      imgsz="$imgsz" batch="$batches" amp=$amp device=$device "${common[@]}" project="$WORK/runs" \
      name="vram_$precision" exist_ok=true
    parts=1
  done
  local table=$WORK/runs/vram_amp/memory-table.yaml
  if [[ -f $table ]]; then
    cp "$table" "$OUT/memory-table.yaml"
    # The schema quotad reads: its own check of the table (where quotad was built or carried).
    if [[ -n ${quotad[*]} ]]; then
      run_cmd vram quotad_check 20 "${quotad[@]}" check-policy configs/quota-policy.yaml --memory-table "$table"
    else
      say "  (no quotad here: the memory table is not checked by quotad)"
    fi
  fi
}

stage_auto_batch() {
  local budget parts
  parts=$(tr ',' '\n' <<<"$auto_budgets" | grep -c .)
  for budget in ${auto_budgets//,/ }; do
    run_cmd auto_batch "auto_$budget" "$(left_in_stage "$parts")" "${yolo8[@]}" profile variants="$auto_variants" \
      imgsz="$imgsz" batch=auto gpu_mem="$budget" amp=true device=$device "${common[@]}" project="$WORK/runs" \
      name="auto_$budget" exist_ok=true
    parts=$(( parts - 1 ))
  done
}

dataset_ready=0
ensure_dataset() {  # a synthetic image dataset for the real loader; decides whether this build decodes images
  (( dataset_ready )) && return 0
  dataset_ready=1
  local seconds
  seconds=$(left_in_stage 3)
  say "\$ yolo8 data synth out=$WORK/ds train=$ds_train val=$ds_val imgsz=$imgsz (limit $seconds s)"
  if timeout -k 5 "$seconds" "${yolo8[@]}" data synth out="$WORK/ds" train="$ds_train" val="$ds_val" \
      imgsz="$imgsz" seed=1 > "$WORK/synth.out" 2>&1; then
    cat "$WORK/synth.out" >> "$log"
    report context "$OUT" "$WORK" dataset="$WORK/ds: $ds_train training and $ds_val validation images at $imgsz"
    return 0
  fi
  cat "$WORK/synth.out" | tee -a "$log"
  if grep -q "needs OpenCV" "$WORK/synth.out"; then
    report context "$OUT" "$WORK" decode=0 \
      decode_reason="this yolo8 was built without OpenCV (no image decoding): no training from images"
    return 1
  fi
  # Any other failure is a failure of the stage that needed the data.
  printf '%s\t%s\t%s\n' 1 0 "yolo8 data synth out=$WORK/ds" >> "$WORK/$current_stage.cmds"
  return 1
}

current_stage=""
stage_throughput() {
  current_stage=throughput
  run_cmd throughput synthetic "$(left_in_stage 3)" "${yolo8[@]}" profile variants="$tp_variants" imgsz="$imgsz" \
    batch="$tp_batch" amp=true channels_last=true device=$device "${common[@]}" project="$WORK/runs" \
    name=synthetic exist_ok=true
  ensure_dataset || return 0
  local v parts
  parts=$(tr ',' '\n' <<<"$tp_variants" | grep -c .)
  for v in ${tp_variants//,/ }; do
    run_cmd throughput "train_real_$v" "$(left_in_stage "$parts")" "${yolo8[@]}" train data="$WORK/ds/data.yaml" \
      model="yolov8$v.yaml" imgsz="$imgsz" batch="$tp_batch" epochs="$tp_epochs" amp=true channels_last=true \
      workers="$workers" device=$device "${common[@]}" quota=off pretrained=false plots=false val=false \
      close_mosaic=0 project="$WORK/runs" name="real_$v" exist_ok=true
    parts=$(( parts - 1 ))
  done
}

stage_cuda_tests() {
  run_cmd cuda_tests cuda_tests "$(left_in_stage)" "${tests[@]}" --gtest_filter='*Cuda*' \
    --gtest_output=json:"$WORK/gtest.json"
}

stage_nvml() {
  current_stage=nvml
  ensure_dataset || return 0
  local hours smi_pid="" extra
  hours=$("$py" -c "print(round($nvml_seconds / 3600, 6))")
  if (( dry )); then
    # No GPU: a CPU lease (shared=true takes one on the CPU too) still records heartbeats, so the run, the database
    # and the query are exercised; NVML and nvidia-smi are not.
    extra=(model=yolov8n.yaml device=cpu shared=true)
  else
    extra=(model=yolov8s.yaml device=0)
    # Line-buffered (stdbuf) so that the samples reach the file before nvidia-smi is stopped.
    local buffered=(); command -v stdbuf >/dev/null && buffered=(stdbuf -oL)
    TZ=UTC "${buffered[@]}" nvidia-smi -i 0 --query-gpu=timestamp,utilization.gpu,memory.used,memory.total \
      --format=csv,noheader,nounits -lms 500 > "$WORK/smi.csv" 2>&1 &
    smi_pid=$!
  fi
  run_cmd nvml train_nvml "$(left_in_stage)" "${yolo8[@]}" train data="$WORK/ds/data.yaml" "${extra[@]}" \
    imgsz="$imgsz" batch="$tp_batch" epochs=1000 time="$hours" amp=true workers="$workers" "${common[@]}" \
    quota=local quota_db="$WORK/quota.db" pretrained=false plots=false val=false close_mosaic=0 \
    project="$WORK/runs" name=nvml exist_ok=true
  if [[ -n $smi_pid ]]; then
    kill -INT "$smi_pid" 2>/dev/null
    wait "$smi_pid" 2>/dev/null
    say "  nvidia-smi: $(wc -l < "$WORK/smi.csv") samples"
  fi
}

for name in vram auto_batch throughput cuda_tests nvml; do run_stage "$name"; done
say ""
say "== $(elapsed) s: done, $failures stage(s) failed or timed out; $(report summary "$OUT" "$WORK")"
say "files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
(( failures == 0 ))
