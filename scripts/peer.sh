#!/usr/bin/env bash
# Runs a command in the peer's environment: Ultralytics 8.0.232 on torch 2.11.0, .venv/peer from
# scripts/locks/peer.txt (installed by scripts/pyenv.sh peer when the lock changed; about 45 s and 2.2 GB cold).
#   scripts/peer.sh yolo val model=M.pt data=D.yaml imgsz=160 device=cpu plots=False
#   scripts/peer.sh python -c 'import ultralytics; ultralytics.checks()'
# What it sets, for every command:
# - TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1: 8.0.232 calls torch.load(file) on pickled model objects, which torch 2.6
#   and later refuse by default (weights_only=True). Only for files we trust: the val case and our own checkpoints.
# - No network: Ultralytics' settings in $YOLO_CONFIG_DIR (default build/peer/config, rewritten at every call)
#   with sync (analytics, crash reports) and every integration off, YOLO_AUTOINSTALL=False (no pip install of a
#   missing package), the fonts it would download (Arial.ttf, Arial.Unicode.ttf) linked to matplotlib's bundled
#   DejaVuSans.ttf, and scripts/peer/sitecustomize.py refusing any connection beyond the loopback (8.0.232 has no
#   offline switch of its own; YOLO_OFFLINE is read only by later releases, set here for them).
# - Threads as our trainer's threads=0 picks them: YOLO8_THREADS if set, else the cores this process may use
#   (affinity and cgroup quota, scripts/peer/cpu_share.py), as OMP_NUM_THREADS and MKL_NUM_THREADS, which set
#   torch's intra-op threads. OMP_WAIT_POLICY / GOMP_SPINCOUNT pass through as set (unset: libgomp's default, as
#   for yolo8). Give Ultralytics' `workers=` yourself when timing: its default is 8 loader processes.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
(( $# )) || { echo "usage: scripts/peer.sh COMMAND [ARGS...]" >&2; exit 2; }
env_dir=$("$repo/scripts/pyenv.sh" peer)
py=$env_dir/bin/python

threads=${YOLO8_THREADS:-0}
[[ $threads =~ ^[0-9]+$ ]] || { echo "peer.sh: YOLO8_THREADS must be a whole number, got '$threads'" >&2; exit 2; }
(( threads > 0 )) || threads=$("$py" "$repo/scripts/peer/cpu_share.py")
export OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads YOLO8_THREADS=$threads

export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
export YOLO_CONFIG_DIR=${YOLO_CONFIG_DIR:-$repo/build/peer/config}
export YOLO_AUTOINSTALL=False YOLO_OFFLINE=1
export PYTHONPATH=$repo/scripts/peer${PYTHONPATH:+:$PYTHONPATH} PYTHONDONTWRITEBYTECODE=1  # none in scripts/peer
export PATH=$env_dir/bin:$PATH
mkdir -p "$YOLO_CONFIG_DIR"
# Ultralytics resets a settings file whose keys, types or version (0.0.4) differ from its defaults, with a warning.
cat >"$YOLO_CONFIG_DIR/settings.yaml" <<EOF
settings_version: 0.0.4
datasets_dir: $YOLO_CONFIG_DIR/datasets
weights_dir: $YOLO_CONFIG_DIR/weights
runs_dir: $YOLO_CONFIG_DIR/runs
uuid: yolo8-peer
sync: false
api_key: ''
clearml: false
comet: false
dvc: false
hub: false
mlflow: false
neptune: false
raytune: false
tensorboard: false
wandb: false
EOF
font=$(echo "$env_dir"/lib/python3*/site-packages/matplotlib/mpl-data/fonts/ttf/DejaVuSans.ttf)
for name in Arial.ttf Arial.Unicode.ttf; do ln -sf "$font" "$YOLO_CONFIG_DIR/$name"; done
exec "$@"
