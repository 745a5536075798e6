#!/bin/sh
# A training run given quota_token= on the command line: the token reaches neither its output nor any file it
# writes (args.yaml, results, plots, last.pt/best.pt, cost.json), and the run warns about the command line.
# Usage: token_leak_test.sh YOLO8 WORKDIR
set -u
yolo8=$1
work=$2
token=tok-$$-leak-probe
rm -rf "$work" && mkdir -p "$work" || exit 1
"$yolo8" data synth out="$work/ds" train=8 val=4 imgsz=64 seed=1 > /dev/null 2>&1 || { echo "data synth failed"; exit 1; }
"$yolo8" train data="$work/ds/data.yaml" model=yolov8n.yaml imgsz=64 epochs=1 batch=4 workers=1 threads=1 device=cpu \
  quota=off quota_token="$token" project="$work/runs" name=leak exist_ok=true > "$work/output.txt" 2>&1
rc=$?
echo "train exit=$rc"
[ "$rc" -eq 0 ] || { tail -20 "$work/output.txt"; exit 1; }
grep -q "quota_token= on the command line" "$work/output.txt" && echo "warned"
files=$(find "$work/runs" -type f | wc -l)
echo "files written: $files"
# -a: binary files too (the checkpoints are zip archives, stored uncompressed)
if grep -a -r -l -F "$token" "$work/runs" "$work/output.txt"; then
  echo "LEAK: the token is in the files above"
  exit 1
fi
[ "$files" -ge 5 ] && test -s "$work/runs/leak/weights/last.pt" && echo "no file holds the token"
