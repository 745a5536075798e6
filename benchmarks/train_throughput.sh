#!/usr/bin/env bash
# End-to-end training throughput vs the bare training step, measured in one run on this machine.
# Usage: benchmarks/train_throughput.sh [IMGSZ=320] [EPOCHS=3] [IMAGES=256]   (after scripts/setup.sh)
# Prints a table and writes benchmarks/results/train_throughput_<imgsz>.json.
set -euo pipefail
cd "$(dirname "$0")/.."
imgsz=${1:-320}
epochs=${2:-3}
images=${3:-256}
build=${BUILD_DIR:-build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$build/benchmarks/train_step_bench" imgsz="$imgsz" batch=16 steps=5 --json "$work/step.json" >/dev/null
"$build/trainer/yolo8" data synth out="$work/ds" train="$images" val=32 imgsz="$imgsz" seed=0 >/dev/null
start=$(date +%s.%N)
"$build/trainer/yolo8" train data="$work/ds/data.yaml" model=yolov8n.yaml imgsz="$imgsz" epochs="$epochs" batch=16 \
  quota=off plots=false project="$work/runs" name=bench verbose=false >"$work/train.log"
end=$(date +%s.%N)

python3 - "$work" "$imgsz" "$epochs" "$images" "$start" "$end" <<'PY'
import csv, json, sys
work, imgsz, epochs, images, start, end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
step = json.load(open(f"{work}/step.json"))
rows = list(csv.reader(open(f"{work}/runs/bench/results.csv")))
header = [h.strip() for h in rows[0]]
last = dict(zip(header, (c.strip() for c in rows[-1])))
train_ips = float(last["images_per_s"])
wall_ips = images * epochs / (end - start)
bare = step["channels_last"]["images_per_s"]
result = {"imgsz": imgsz, "epochs": epochs, "images": images, "threads": step["threads"],
          "bare_step_images_per_s": bare, "bare_step_contiguous_images_per_s": step["contiguous"]["images_per_s"],
          "train_loop_images_per_s": train_ips, "end_to_end_images_per_s": wall_ips,
          "train_loop_vs_bare": train_ips / bare, "end_to_end_vs_bare": wall_ips / bare}
print(f"{'imgsz':>6} {'threads':>7} {'bare step':>10} {'train loop':>11} {'end to end':>11} {'loop/bare':>10} {'e2e/bare':>9}")
print(f"{imgsz:>6} {step['threads']:>7} {bare:>10.1f} {train_ips:>11.1f} {wall_ips:>11.1f} {train_ips/bare:>10.2f} {wall_ips/bare:>9.2f}")
print("(images/s; bare step = forward+loss+backward+optimizer+EMA on ready channels-last tensors;")
print(" train loop = the same with loading and augmentation; end to end = wall clock incl. start-up and validation)")
json.dump(result, open(f"benchmarks/results/train_throughput_{imgsz}.json", "w"), indent=2)
PY
echo "docs/performance.md: python3 benchmarks/render_performance.py renders its tables from this JSON"
