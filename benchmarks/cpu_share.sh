#!/usr/bin/env bash
# Training on a shared CPU: the old sizing (threads = the host's cores) against the default (threads=0: the affinity /
# cgroup share), with libgomp's own waiting (the default) and with OMP_WAIT_POLICY=PASSIVE, each alone, beside a
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

# Three configurations: the old sizing (threads = the host's cores), and the default share (threads=0) with
# libgomp's own waiting (a short spin, then sleep) and with OMP_WAIT_POLICY=PASSIVE (sleep at once).
configs=(host_cores share_spin share_passive)
declare -A prefix_of=([host_cores]="env -u OMP_WAIT_POLICY --" [share_spin]="env -u OMP_WAIT_POLICY --"
                      [share_passive]="env OMP_WAIT_POLICY=PASSIVE --")
declare -A threads_of=([host_cores]="threads=$host_cores" [share_spin]="threads=0" [share_passive]="threads=0")
declare -A t
# measure SITUATION [PREFIX...]: every configuration once, under PREFIX (taskset) in SITUATION.
measure() {
  local situation=$1 c prefix
  shift
  for c in "${configs[@]}"; do
    read -r -a prefix <<<"${prefix_of[$c]}"
    t[${c}_$situation]=$(run "${c}_$situation" "$@" "${prefix[@]}" "${threads_of[$c]}")
  done
}
measure idle
start_load
measure load
# One core of affinity (as a cpuset would give), the competing load on that core too.
stop_load
taskset -c 0 sh -c 'while :; do :; done' &
load_pid=$!
measure pinned taskset -c 0
stop_load
chosen=$(grep -m1 '^CPU:' "$work/share_spin_load.log" || true)

args=()
for c in "${configs[@]}"; do args+=("${t[${c}_idle]}" "${t[${c}_load]}" "${t[${c}_pinned]}"); done
python3 - "$imgsz" "$epochs" "$images" "$host_cores" "$chosen" "${args[@]}" <<'PY'
import json, sys
imgsz, epochs, images, host = (int(x) for x in sys.argv[1:5])
chosen = sys.argv[5]
times = [float(x) for x in sys.argv[6:]]
names = [("host_cores", "threads=%d (the host's cores), libgomp's waiting" % host),
         ("share_spin", "threads=0 (CPU share), libgomp's waiting (default)"),
         ("share_passive", "threads=0 (CPU share), OMP_WAIT_POLICY=PASSIVE")]
print(f"{'configuration':<52} {'idle s':>8} {'+1 busy core s':>15} {'slowdown':>9} {'1-core taskset s':>17}")
result = {"imgsz": imgsz, "epochs": epochs, "images": images, "host_cores": host, "default_chose": chosen}
for k, (key, name) in enumerate(names):
    idle, load, pinned = times[3 * k:3 * k + 3]
    print(f"{name:<52} {idle:>8.1f} {load:>15.1f} {load / idle:>8.2f}x {pinned:>17.1f}")
    result[key] = {"label": name, "idle_s": idle, "loaded_s": load, "slowdown": load / idle,
                   "one_core_affinity_loaded_s": pinned}
print(f"threads=0 chose: {chosen}")
json.dump(result, open("benchmarks/results/cpu_share.json", "w"), indent=2)
PY
echo "docs/performance.md: python3 benchmarks/render_performance.py renders its tables from this JSON"
