#!/usr/bin/env bash
# yolo8 beside Ultralytics 8.0.232, in one run on this machine with the same compute threads:
#   1. data pipeline: augmented images per CPU-second at 640 and 320, one worker and all workers;
#   2. end to end: yolov8n from scratch, 160 px, batch 16, EPOCHS (40) with validation, SEEDS (2) seeds each side,
#      interleaved: wall time launch to exit and final mAP50-95, mean and min-max;
#   3. val (batch 16) and predict (batch 1) throughput at 640, the same Ultralytics weights and photos;
#   4. start-up: launch to the first training step.
# Prints one table (workload | Ultralytics | yolo8 | ratio), writes benchmarks/results/peer_compare.json and
# rewrites the README's table between its peer_compare markers. Without the peer (.venv/peer, installed from
# scripts/locks/peer.txt by scripts/pyenv.sh peer; never installed here) it says so and gives our figures only.
# Usage: benchmarks/peer_compare.sh [--quick] [--no-peer] [--work DIR] [--keep] [--only pipeline,end_to_end,inference,startup]
#        [--json FILE] [--readme FILE|'']   (defaults: benchmarks/results/peer_compare.json, README.md)
#   --quick: few images and 2 epochs (EPOCHS overrides), a smoke run of every path (a few minutes on 2 cores).
# Env: EPOCHS, SEEDS, YOLO8_THREADS (default: the cores this process may use, as threads=0), BUILD_DIR (build),
#      YOLO8_SHARED (../shared: holds reference/ultralytics-8.0.232/val_case for 3).
# Needs build/trainer/yolo8 and build/benchmarks/data_pipeline_bench (ninja -C build yolo8 data_pipeline_bench).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
for bin in "$build/trainer/yolo8" "$build/benchmarks/data_pipeline_bench"; do
  [[ -x $bin ]] || { echo "peer_compare: $bin missing (ninja -C $build yolo8 data_pipeline_bench)" >&2; exit 2; }
done
command -v stdbuf >/dev/null || { echo "peer_compare: stdbuf (coreutils) missing" >&2; exit 2; }
exec python3 benchmarks/peer_compare.py "$@"
