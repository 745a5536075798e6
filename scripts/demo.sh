#!/usr/bin/env bash
# The README's main command. Until the trainer lands: build, then describe every model size.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
for size in n s m l x; do
  build/trainer/yolo8 info model=yolov8${size}.yaml
done
