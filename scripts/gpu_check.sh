#!/usr/bin/env bash
# The GPU check: one prepared command of about 7 minutes on a lent GPU machine (scripts/gpu_check.md says what it
# writes, how to read each figure and what "pass" means).
#   here:    scripts/gpu_bundle.sh        build yolo8, the CUDA tests and quotad against pip's torch 2.11.0+cu130,
#                                         pack .deps/bundle.tar.xz
#   device:  run(command="scripts/gpu_check.sh", carry=[".deps/bundle.tar.xz"], timeout_s=540)
#   second try, some stages only:  STAGES=auto_batch,nvml TOTAL_SECONDS=200 scripts/gpu_check.sh
#   fallback without a bundle:     scripts/gpu_deps.sh here, carry [".deps/debs"]: builds there, without OpenCV
#   CPU dry run (CI, GpuCheck.DryRun):  OUT=DIR BUILD_DIR=build scripts/gpu_check.sh --dry-run
# It exits at once (3) unless a GPU is seen (nvidia-smi, then `yolo8 --version`: "(CUDA build)", "GPU: N visible").
# Stages, in order of value; each one's JSON goes into WORK/stages/ and is merged into $OUT/summary.json, which is
# rewritten after every stage (a call killed half-way still brings back what finished):
#   preflight   what the target machine has against what the bundle needs (glibc, libstdc++, missing libraries),
#               nvidia-smi -q -d MEMORY
#   cuda_tests  the allocator-order test alone in a fresh process, then every other *Cuda* test
#   vram        yolo8 profile of n..x at 640, AMP then float32: peak allocated, reserved and the process's memory as
#               nvidia-smi counts it; $OUT/memory-table.yaml is the AMP table quotad reads (with the measured
#               per-process overhead), checked by `quotad check-policy`
#   shared      two `yolo8 train shared=true memory_gib=16 batch=auto` on one GPU through quotad: each process within
#               its share plus the measured overhead (nvidia-smi per PID), and the slowdown against one alone
#   auto_batch  batch=auto under 16 and 40 GiB (gpu_mem): verified by real steps and a validation at twice the batch
#   throughput  yolov8s training images/s with the real loader: AMP float16 deterministic and with cuDNN autotuning,
#               AMP bfloat16, float32;
#               against yolo8 profile's synthetic batches (made on the GPU, outside the timer)
#   nvml        a training run's lease heartbeats (NVML utilisation, device and process memory) against nvidia-smi,
#               at a 2 s heartbeat so that at least 8 are compared
#   nccl        a world-size-1 NCCL all-reduce through the target's torch (the libnccl the binaries load)
# 3 files come back: gpu_check.log summary.json memory-table.yaml. Each stage has a time limit; they sum to under
# TOTAL_SECONDS (450).
# The dry run runs the same stages and commands on the CPU at tiny sizes (imgsz 64, yolov8n, budgets of 0.1 GiB,
# Gloo instead of NCCL) against an existing build and writes the same files: a broken path or option fails it.
# Environment: OUT (default build-gpu/out), BUILD_DIR (a build to use; required with --dry-run), BUNDLE (a bundle
# folder or .tar.xz; default .deps/bundle.tar.xz, then .deps/bundle), STAGES, TOTAL_SECONDS, WORK (scratch folder),
# and the sizes below (IMGSZ, VARIANTS, BATCHES, AUTO_VARIANTS, AUTO_BUDGETS, THROUGHPUT_VARIANT, ...).
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
  auto_variants=${AUTO_VARIANTS:-n}; auto_budgets=${AUTO_BUDGETS:-0.12,0.2}
  tp_variant=${THROUGHPUT_VARIANT:-n}; tp_batch=${THROUGHPUT_BATCH:-4}; tp_epochs=${THROUGHPUT_EPOCHS:-2}
  ds_train=${DATASET_TRAIN:-8}; ds_val=${DATASET_VAL:-2}
  share_gib=${SHARE_GIB:-0.3}; share_epochs=${SHARE_EPOCHS:-1}; share_workers=1
  device=cpu; common=(threads=1); workers=1
  limits=(preflight=15 cuda_tests=40 vram=40 shared=60 auto_batch=40 throughput=60 nvml=40 nccl=20)
  nvml_seconds=${NVML_SECONDS:-4}
  # torch.distributed for the Gloo stand-in of the NCCL stage: the project's pinned torch.
  torch_site=$(ls -d "$root"/.venv/torch/lib/python3*/site-packages 2>/dev/null | head -n 1)
else
  total=${TOTAL_SECONDS:-450}
  imgsz=${IMGSZ:-640}; variants=${VARIANTS:-n,s,m,l,x}; batches=${BATCHES:-2,4,8,16,32}
  auto_variants=${AUTO_VARIANTS:-n,m,x}; auto_budgets=${AUTO_BUDGETS:-16,40}
  tp_variant=${THROUGHPUT_VARIANT:-s}; tp_batch=${THROUGHPUT_BATCH:-64}; tp_epochs=${THROUGHPUT_EPOCHS:-3}
  ds_train=${DATASET_TRAIN:-512}; ds_val=${DATASET_VAL:-32}
  share_gib=${SHARE_GIB:-16}; share_epochs=${SHARE_EPOCHS:-3}; share_workers=$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))
  device=0; common=(); workers=$(nproc)
  limits=(preflight=15 cuda_tests=50 vram=100 shared=70 auto_batch=70 throughput=60 nvml=35 nccl=20)
  nvml_seconds=${NVML_SECONDS:-24}
fi
all_stages=(preflight cuda_tests vram shared auto_batch throughput nvml nccl)
stages=${STAGES:-$(IFS=,; echo "${all_stages[*]}")}
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
bundle_dir=""
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
  bundle_dir=$b
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
  vram_precisions=amp,fp32 auto_budgets="$auto_budgets" throughput_variant="$tp_variant" \
  throughput_imgsz="$imgsz" throughput_batch="$tp_batch" share_gib="$share_gib" decode=1 decode_reason=""

# --------------------------------------------------------------------------------------------- stages
failures=0
stage_limit() { local s; for s in "${limits[@]}"; do [[ ${s%%=*} == "$1" ]] && echo "${s#*=}"; done; }
selected() { [[ ",$stages," == *",$1,"* ]]; }
stage_start=0
stage_deadline=0
stage_timeout=0
begin_stage() {  # begin_stage NAME: its time limit, leaving 10 s to each selected stage after it
  local name=$1 reserve=0 later=0 s
  for s in "${all_stages[@]}"; do
    [[ $s == "$name" ]] && { later=1; continue; }
    (( later )) && selected "$s" && reserve=$(( reserve + 10 ))
  done
  stage_timeout=$(stage_limit "$name")
  local left=$(( total - $(elapsed) - reserve ))
  (( left < stage_timeout )) && stage_timeout=$left
  stage_start=$(date +%s)
  stage_deadline=$(( stage_start + stage_timeout ))
  rm -f "$WORK/$name.cmds"
  say ""
  say "== $(elapsed) s: stage $name (limit $stage_timeout s)"
  (( stage_timeout >= 8 ))
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
  status=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["status"])' "$WORK/stages/$name.json")
  [[ $status == failed || $status == timeout ]] && failures=$(( failures + 1 ))
}
run_stage() {  # run_stage NAME: begin, run stage_NAME, end
  local name=$1
  selected "$name" || return 0
  if begin_stage "$name"; then
    current_stage=$name
    "stage_$name"
    end_stage "$name"
  else
    end_stage "$name" status=skipped reason="no time left ($(elapsed) s of $total used)"
  fi
}
record() {  # record STAGE EXIT COMMAND: a step of the shell's own that the verdict counts like a command
  printf '%s\t%s\t%s\n' "$2" 0 "$3" >> "$WORK/$1.cmds"
}

stage_preflight() {
  # What the bundle needs of the target (MANIFEST.txt) against what it has; the loader's view of every program.
  if [[ -n ${bundle_dir:-} ]]; then
    run_cmd preflight preflight 10 "$bundle_dir/run" --preflight
  else
    say "  (not a bundle: $runner)"
  fi
  if (( ! dry )); then
    nvidia-smi -q -d MEMORY > "$WORK/smi_memory.txt" 2>&1
    record preflight $? "nvidia-smi -q -d MEMORY"
    cat "$WORK/smi_memory.txt" >> "$log"
  fi
}

stage_cuda_tests() {
  # The allocator-order test proves something only as the first CUDA call of its process: alone, first.
  local first=MemoryMeterCudaTest.AllocatorCallsInitialiseCudaBeforeTheFirstTensor
  run_cmd cuda_tests cuda_tests_first 20 "${tests[@]}" --gtest_filter="$first" \
    --gtest_output=json:"$WORK/gtest_first.json"
  run_cmd cuda_tests cuda_tests "$(left_in_stage)" "${tests[@]}" --gtest_filter="*Cuda*:-$first" \
    --gtest_output=json:"$WORK/gtest.json"
}

stage_vram() {
  local precision amp parts=2
  start_smi_apps "$WORK/smi_apps_vram.csv"  # nvidia-smi's own view of the profiles' processes, beside NVML's
  for precision in amp fp32; do
    [[ $precision == amp ]] && amp=true || amp=false
    # The AMP half first and with more of the time: it is the table quotad reads.
    run_cmd vram "vram_$precision" "$(( $(left_in_stage 1) * (parts == 2 ? 55 : 100) / 100 ))" "${yolo8[@]}" \
      profile variants="$variants" imgsz="$imgsz" batch="$batches" amp=$amp device=$device "${common[@]}" \
      project="$WORK/runs" name="vram_$precision" exist_ok=true
    parts=1
  done
  stop_smi "$smi_apps_pid"
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
  dataset_ready=0
  record "$current_stage" 1 "yolo8 data synth out=$WORK/ds"  # a failure of the stage that needed the data
  return 1
}

# quotad for the stages that take leases: a policy of one node with this machine's GPU, sharing on, heartbeats every
# 2 s (nvml compares each with nvidia-smi). Without quotad (the build-there fallback), the local quota.
quotad_url=""
quotad_pid=""
ensure_quotad() {
  [[ -n $quotad_url ]] && return 0
  [[ -n ${quotad[*]} ]] || return 1
  local gib
  if (( dry )); then gib=4; else
    gib=$(nvidia-smi -i 0 --query-gpu=memory.total --format=csv,noheader,nounits | awk '{print int($1 / 1024)}')
  fi
  mkdir -p "$WORK/quotad"
  cp configs/memory-table.yaml "$WORK/quotad/memory-table.yaml"
  # The measured table where the vram stage made one: the per-process overhead it measured places the shares.
  if [[ -f $OUT/memory-table.yaml ]] && grep -q "yolov8n:" "$OUT/memory-table.yaml" &&
     { (( dry )) || grep -q "yolov8s:" "$OUT/memory-table.yaml"; }; then
    cp "$OUT/memory-table.yaml" "$WORK/quotad/memory-table.yaml"
  fi
  cat > "$WORK/quotad/policy.yaml" <<EOF
inventory:
  nodes:
    - {name: gpu-node, gpus: 1, memory_gib: $gib}
emergency_pool: 0
users:
  alice: {token_sha256: 9c220f200955d76c0a38d308225e0ef10c5f971acaf2f8d1d8f732affa5bd1dc}
teams:
  team-check: {base: 1, burst: 1, members: [alice]}
tiers: {self_service: [yolov8n, yolov8s, yolov8m, yolov8l, yolov8x]}
credits: {monthly_gpu_hours: 0}
leases: {ttl_s: 30, heartbeat_interval_s: 2}
sharing: {enabled: true, max_leases_per_gpu: 4, models: [yolov8n, yolov8s]}
memory_table: memory-table.yaml
EOF
  "${quotad[@]}" serve --policy "$WORK/quotad/policy.yaml" --db "$WORK/quotad/quota.db" --listen 127.0.0.1:0 \
    > "$WORK/quotad/quotad.log" 2>&1 &
  quotad_pid=$!
  local i
  for i in $(seq 100); do grep -q "on http://" "$WORK/quotad/quotad.log" && break; sleep 0.1; done
  quotad_url=$(sed -n 's/.* on \(http:\/\/[0-9.]*:[0-9]*\),.*/\1/p' "$WORK/quotad/quotad.log" | head -n 1)
  cat "$WORK/quotad/quotad.log" >> "$log"
  [[ -n $quotad_url ]] || { say "  quotad did not start"; return 1; }
  report context "$OUT" "$WORK" quota_db="$WORK/quotad/quota.db"
}
stop_quotad() { [[ -n $quotad_pid ]] && { kill "$quotad_pid" 2>/dev/null; wait "$quotad_pid" 2>/dev/null; }; }
trap stop_quotad EXIT
use_quota() {  # quotad where it starts, else the local quota; says which database holds the heartbeats
  ensure_quotad && return 0
  report context "$OUT" "$WORK" quota_db="$WORK/local_quota.db"
}
lease_args() {  # the settings that take a lease from it (call use_quota first, in this shell)
  if [[ -n $quotad_url ]]; then echo "quota=$quotad_url user=alice team=team-check"; else echo "quota=local quota_db=$WORK/local_quota.db"; fi
}
export NODE_NAME=gpu-node YOLO8_QUOTA_TOKEN=alice-token

smi_apps_pid=""
start_smi_apps() {  # per-process memory as nvidia-smi lists it, every 500 ms
  (( dry )) && return 0
  local buffered=(); command -v stdbuf >/dev/null && buffered=(stdbuf -oL)
  "${buffered[@]}" nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -lms 500 > "$1" 2>&1 &
  smi_apps_pid=$!
}
stop_smi() { [[ -n $1 ]] && { kill -INT "$1" 2>/dev/null; wait "$1" 2>/dev/null; }; }

stage_shared() {
  ensure_dataset || return 0
  local -a lease
  use_quota
  read -r -a lease <<<"$(lease_args)"
  local -a train=("${yolo8[@]}" train data="$WORK/ds/data.yaml" model=yolov8n.yaml imgsz="$imgsz" batch=auto
                  epochs="$share_epochs" amp=true workers="$share_workers" "${common[@]}" "${lease[@]}" shared=true
                  memory_gib="$share_gib" pretrained=false plots=false val=false close_mosaic=0 project="$WORK/runs"
                  exist_ok=true)
  (( dry )) && train+=(device=cpu) || train+=(device=0)
  # One alone first: the yardstick of the slowdown.
  run_cmd shared shared_alone "$(left_in_stage 2)" "${train[@]}" name=shared_alone
  # Then two at once on the same GPU, nvidia-smi sampling each process's memory.
  start_smi_apps "$WORK/smi_apps.csv"
  local seconds pids=() i rc
  seconds=$(left_in_stage)
  (( seconds < 5 )) && seconds=5
  for i in 0 1; do
    say "\$ ${train[*]} name=shared_$i (limit $seconds s, in the background)"
    timeout -k 5 "$seconds" "${train[@]}" name="shared_$i" > "$WORK/shared_$i.out" 2>&1 &
    pids+=($!)
  done
  local t0; t0=$(date +%s%N)
  for i in 0 1; do
    wait "${pids[$i]}"; rc=$?
    cat "$WORK/shared_$i.out" >> "$log"
    printf '%s\t%s\t%s\n' "$rc" $(( ($(date +%s%N) - t0) / 1000000 )) "${train[*]} name=shared_$i" >> "$WORK/shared.cmds"
    say "  -> shared_$i exit $rc"
  done
  stop_smi "$smi_apps_pid"
  [[ -f $WORK/smi_apps.csv ]] && say "  nvidia-smi: $(wc -l < "$WORK/smi_apps.csv") process samples"
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

# name amp deterministic amp_dtype: the training modes whose images/s the throughput stage compares.
throughput_modes=("amp_deterministic true true float16" "amp_autotuned true false float16"
                  "amp_bfloat16 true false bfloat16" "fp32 false false float16")
stage_throughput() {
  run_cmd throughput synthetic "$(left_in_stage 4)" "${yolo8[@]}" profile variants="$tp_variant" imgsz="$imgsz" \
    batch="$tp_batch" amp=true channels_last=true device=$device "${common[@]}" project="$WORK/runs" \
    name=synthetic exist_ok=true
  ensure_dataset || return 0
  local mode name amp deterministic dtype parts=${#throughput_modes[@]}
  for mode in "${throughput_modes[@]}"; do
    read -r name amp deterministic dtype <<<"$mode"
    run_cmd throughput "train_$name" "$(left_in_stage "$parts")" "${yolo8[@]}" train data="$WORK/ds/data.yaml" \
      model="yolov8$tp_variant.yaml" imgsz="$imgsz" batch="$tp_batch" epochs="$tp_epochs" amp="$amp" \
      amp_dtype="$dtype" deterministic="$deterministic" channels_last=true workers="$workers" device=$device "${common[@]}" quota=off \
      pretrained=false plots=false val=false close_mosaic=0 project="$WORK/runs" name="tp_$name" exist_ok=true
    parts=$(( parts - 1 ))
  done
}

stage_nvml() {
  ensure_dataset || return 0
  local hours smi_pid="" extra lease
  use_quota
  read -r -a lease <<<"$(lease_args)"
  hours=$("$py" -c "print(round($nvml_seconds / 3600, 6))")
  if (( dry )); then
    # No GPU: a CPU lease (shared=true takes one on the CPU too) still records heartbeats, so the run, the database
    # and the query are exercised; NVML and nvidia-smi are not.
    extra=(model=yolov8n.yaml device=cpu shared=true memory_gib="$share_gib")
  else
    extra=(model=yolov8s.yaml device=0)
    # Line-buffered (stdbuf) so that the samples reach the file before nvidia-smi is stopped.
    local buffered=(); command -v stdbuf >/dev/null && buffered=(stdbuf -oL)
    TZ=UTC "${buffered[@]}" nvidia-smi -i 0 --query-gpu=timestamp,utilization.gpu,memory.used,memory.total \
      --format=csv,noheader,nounits -lms 500 > "$WORK/smi.csv" 2>&1 &
    smi_pid=$!
    start_smi_apps "$WORK/smi_apps_nvml.csv"
  fi
  run_cmd nvml train_nvml "$(left_in_stage)" "${yolo8[@]}" train data="$WORK/ds/data.yaml" "${extra[@]}" \
    imgsz="$imgsz" batch="$tp_batch" epochs=1000 time="$hours" amp=true workers="$workers" "${common[@]}" \
    "${lease[@]}" pretrained=false plots=false val=false close_mosaic=0 project="$WORK/runs" name=nvml exist_ok=true
  if [[ -n $smi_pid ]]; then
    stop_smi "$smi_pid"
    stop_smi "$smi_apps_pid"
    say "  nvidia-smi: $(wc -l < "$WORK/smi.csv") samples"
  fi
}

stage_nccl() {
  # The NCCL that yolo8's data-parallel runs load (the target torch's nvidia/nccl), through torch.distributed: one
  # rank, one all-reduce of 256 MiB, timed. The dry run does the same with Gloo on the CPU.
  local backend=nccl
  (( dry )) && backend=gloo
  run_cmd nccl nccl "$(left_in_stage)" env PYTHONPATH="${torch_site:-}${PYTHONPATH:+:$PYTHONPATH}" "$py" - "$backend" \
    "$WORK/nccl.json" <<'PY'
import json, os, socket, sys, time
backend, out = sys.argv[1], sys.argv[2]
try:
    import torch
    import torch.distributed as dist
except ImportError as error:
    json.dump({"skipped": f"no torch in python3: {error}"}, open(out, "w"))
    sys.exit(0)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
x = torch.ones(64 << 20, device=device)  # 256 MiB of float32
dist.all_reduce(x)
if device.type == "cuda":
    torch.cuda.synchronize()
start = time.perf_counter()
for _ in range(5):
    dist.all_reduce(x)
if device.type == "cuda":
    torch.cuda.synchronize()
seconds = (time.perf_counter() - start) / 5
result = {"backend": backend, "world_size": 1, "bytes": x.numel() * 4, "seconds_per_all_reduce": seconds,
          "sum_correct": bool(torch.all(x == 1).item()), "torch": torch.__version__}
if backend == "nccl":
    version = torch.cuda.nccl.version()
    result["nccl_version"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
dist.destroy_process_group()
json.dump(result, open(out, "w"))
print(json.dumps(result))
PY
}

current_stage=""
for name in "${all_stages[@]}"; do run_stage "$name"; done
stop_quotad
say ""
say "== $(elapsed) s: done, $failures stage(s) failed or timed out; $(report summary "$OUT" "$WORK")"
say "files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
(( failures == 0 ))
