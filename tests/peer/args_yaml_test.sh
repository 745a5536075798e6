#!/bin/sh
# A tiny yolo8 training run, then its args.yaml through the peer (scripts/peer/args_check.py): Ultralytics'
# get_cfg takes it, it holds exactly Ultralytics' keys, the values are ours, and Ultralytics' trainer built from
# it finds the dataset and writes the same values back. Skipped (77) without .venv/peer.
# Usage: args_yaml_test.sh REPO YOLO8 WORKDIR
set -u
repo=$1
yolo8=$2
work=$3
if [ ! -x "$repo/.venv/peer/bin/python" ]; then
  echo "SKIP: .venv/peer missing (scripts/setup.sh installs the peer)"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work" || exit 1
"$yolo8" data synth out="$work/ds" train=8 val=4 imgsz=64 seed=2 > /dev/null 2>&1 || { echo "data synth failed"; exit 1; }
"$yolo8" train data="$work/ds/data.yaml" model=yolov8n.yaml imgsz=64 epochs=1 batch=4 workers=1 threads=1 device=cpu \
  quota=off team=vision lr0=0.02 close_mosaic=0 project="$work/runs" name=run exist_ok=true > "$work/train.txt" 2>&1
rc=$?
echo "train exit=$rc"
[ "$rc" -eq 0 ] || { tail -20 "$work/train.txt"; exit 1; }
"$repo/scripts/peer.sh" python "$repo/scripts/peer/args_check.py" "$work/runs/run" "$work/replay" 2>&1 | tail -3
