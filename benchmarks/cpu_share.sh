#!/usr/bin/env bash
# Training on a shared CPU: the old sizing (threads = the host's cores, OpenMP's default spinning) against the new
# default (threads=0: the affinity / cgroup share, idle OpenMP threads waiting passively), each alone and beside a
# fixed competing load (one busy-looping process), and inside a one-core affinity (taskset) with that load.
# Usage: benchmarks/cpu_share.sh [IMGSZ=160] [EPOCHS=2] [IMAGES=64]   (after scripts/setup.sh)
# Prints a table and writes benchmarks/results/cpu_share.json.
set -euo pipefail
cd "$(dirname "$0")/.."
imgsz=${1:-160}
epochs=${2:-2}
images=${3:-64}
build=${BUILD_DIR:-build}
work=$(mktemp -d)
load_pid=
cleanup() {
  if [ -n "$load_pid" ]; then kill "$load_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
host_cores=$(nproc --all)

"$build/trainer/yolo8" data synth out="$work/ds" train="$images" val=8 imgsz="$imgsz" seed=0 >/dev/null

# run NAME PREFIX... -- SETTINGS...: seconds of wall clock for one short training.
run() {
  local name=$1
  shift
  local prefix=()
  while [ "$1" != "--" ]; do prefix+=("$1"); shift; done
  shift
  local start end
  start=$(date +%s.%N)
  "${prefix[@]}" "$build/trainer/yolo8" train data="$work/ds/data.yaml" model=yolov8n.yaml imgsz="$imgsz" \
    epochs="$epochs" batch=16 workers=2 quota=off plots=false val=false project="$work/runs" name="$name" \
    exist_ok=true verbose=false "$@" >"$work/$name.log" 2>&1
  end=$(date +%s.%N)
  python3 -c "print($end - $start)"
}

start_load() {
  sh -c 'while :; do :; done' &
  load_pid=$!
}
stop_load() {
  kill "$load_pid"
  wait "$load_pid" 2>/dev/null || true
  load_pid=
}

# Old: the host's core count and libgomp's default spin (GOMP_SPINCOUNT=300000 is its default when
# OMP_WAIT_POLICY is unset; setting it also keeps yolo8 from switching to passive waiting).
old=(env GOMP_SPINCOUNT=300000 --)
new=(env --)
declare -A t
t[old_idle]=$(run old_idle "${old[@]}" threads="$host_cores")
t[new_idle]=$(run new_idle "${new[@]}")
start_load
t[old_load]=$(run old_load "${old[@]}" threads="$host_cores")
t[new_load]=$(run new_load "${new[@]}")
# One core of affinity (as a cpuset would give), the competing load on that core too.
stop_load
taskset -c 0 sh -c 'while :; do :; done' &
load_pid=$!
t[old_pinned]=$(run old_pinned taskset -c 0 "${old[@]}" threads="$host_cores")
t[new_pinned]=$(run new_pinned taskset -c 0 "${new[@]}")
stop_load
chosen=$(grep -m1 '^CPU:' "$work/new_load.log" || true)

python3 - "$imgsz" "$epochs" "$images" "$host_cores" "$chosen" \
  "${t[old_idle]}" "${t[old_load]}" "${t[old_pinned]}" "${t[new_idle]}" "${t[new_load]}" "${t[new_pinned]}" <<'PY'
import json, sys
imgsz, epochs, images, host = (int(x) for x in sys.argv[1:5])
chosen = sys.argv[5]
old_idle, old_load, old_pinned, new_idle, new_load, new_pinned = (float(x) for x in sys.argv[6:12])
rows = [("before: threads=%d, OpenMP spinning" % host, old_idle, old_load, old_pinned),
        ("after: threads=0 (CPU share), passive waiting", new_idle, new_load, new_pinned)]
print(f"{'sizing':<48} {'idle s':>8} {'+1 busy core s':>15} {'slowdown':>9} {'1-core taskset s':>17}")
for name, idle, load, pinned in rows:
    print(f"{name:<48} {idle:>8.1f} {load:>15.1f} {load / idle:>8.2f}x {pinned:>17.1f}")
print(f"new default chose: {chosen}")
result = {"imgsz": imgsz, "epochs": epochs, "images": images, "host_cores": host, "new_default": chosen,
          "before": {"threads": host, "idle_s": old_idle, "loaded_s": old_load, "slowdown": old_load / old_idle,
                     "one_core_affinity_loaded_s": old_pinned},
          "after": {"threads": "0 (share)", "idle_s": new_idle, "loaded_s": new_load, "slowdown": new_load / new_idle,
                    "one_core_affinity_loaded_s": new_pinned}}
json.dump(result, open("benchmarks/results/cpu_share.json", "w"), indent=2)
PY
