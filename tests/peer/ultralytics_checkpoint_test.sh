#!/bin/sh
# Our best.pt and last.pt open in Ultralytics' YOLO() and predict what `yolo8 predict` does: a real 1-epoch yolov8n
# run started from the val case's Ultralytics weights (tests/fixtures/val_case: 32 photos 320 px wide, 240 to 320
# tall, so the boxes and confidences are those of a trained model and the letterbox is rectangular), then
# `yolo8 predict ... save_txt save_conf` on those photos with each checkpoint, then the peer
# (tests/peer/yolo_opens_checkpoint.py) loads both files and compares box by box.
# Usage: ultralytics_checkpoint_test.sh YOLO8 REPO WORKDIR. Exit 77 (skip) without .venv/peer.
set -u
yolo8=$1
repo=$2
work=$3
[ -x "$repo/.venv/peer/bin/python" ] || { echo "SKIP: .venv/peer missing (scripts/setup.sh installs the peer)"; exit 77; }
case=$repo/tests/fixtures/val_case
conf=0.05
rm -rf "$work" && mkdir -p "$work" || exit 1
export YOLO8_CACHE_DIR="$work/cache"  # nothing is written beside the fixture's images
printf 'path: %s\ntrain: images/val\nval: images/val\nnames: {0: circle, 1: rectangle, 2: triangle, 3: scratch}\n' \
  "$case" > "$work/data.yaml"
"$yolo8" train data="$work/data.yaml" model="$case/yolov8n-val-case.pt" imgsz=160 epochs=1 batch=16 workers=1 \
  threads=1 device=cpu quota=off plots=false project="$work/runs" name=t exist_ok=true > "$work/train.txt" 2>&1 ||
  { tail -20 "$work/train.txt"; exit 1; }
specs=
for w in best last; do
  "$yolo8" predict model="$work/runs/t/weights/$w.pt" source="$case/images/val" imgsz=160 conf=$conf threads=1 \
    save_txt save_conf save=false project="$work/pred" name=$w exist_ok=true > "$work/predict_$w.txt" 2>&1 ||
    { tail -20 "$work/predict_$w.txt"; exit 1; }
  specs="$specs $work/runs/t/weights/$w.pt:$work/pred/$w/labels"
done
# shellcheck disable=SC2086
YOLO8_THREADS=1 "$repo/scripts/peer.sh" python "$repo/tests/peer/yolo_opens_checkpoint.py" "$case/images/val" 160 \
  $conf $specs
