#!/usr/bin/env bash
# The README's main command: fresh clone -> setup -> synthetic dataset -> train yolov8n on CPU -> validate -> predict.
# Env: DEMO_EPOCHS (default 40), DEMO_IMGSZ (160), DEMO_TRAIN (256), DEMO_VAL (64).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
yolo8=build/trainer/yolo8
data=datasets/synth-defects
epochs=${DEMO_EPOCHS:-40}
imgsz=${DEMO_IMGSZ:-160}

echo "== 1/4 synthetic defect dataset"
if [[ ! -f $data/data.yaml ]]; then
  $yolo8 data synth out=$data train="${DEMO_TRAIN:-256}" val="${DEMO_VAL:-64}" imgsz="$imgsz" seed=0
fi
$yolo8 data check data=$data/data.yaml

echo "== 2/4 train yolov8n from scratch on CPU ($epochs epochs at imgsz $imgsz)"
$yolo8 train data=$data/data.yaml model=yolov8n.yaml imgsz="$imgsz" epochs="$epochs" batch=16 \
  name=demo exist_ok=true quota=off plots=true

echo "== 3/4 validate best.pt (data and imgsz come from the training run)"
$yolo8 val model=runs/detect/demo/weights/best.pt

echo "== 4/4 predict on validation images"
$yolo8 predict model=runs/detect/demo/weights/best.pt source=$data/images/val name=demo-predict exist_ok=true save_txt
echo "Run folder: runs/detect/demo   predictions: runs/detect/demo-predict"
