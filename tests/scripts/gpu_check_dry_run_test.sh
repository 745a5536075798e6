#!/usr/bin/env bash
# GpuCheck.DryRun: scripts/gpu_check.sh --dry-run against BUILD_DIR on the CPU writes every file the GPU run
# writes, each JSON parses, and every stage that can run on a CPU ran ("ok"); a stage whose command fails (a
# broken path or option) fails the check and this test.
#   tests/scripts/gpu_check_dry_run_test.sh BUILD_DIR
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?usage: gpu_check_dry_run_test.sh BUILD_DIR}" && pwd)
command -v python3 >/dev/null || { echo "SKIPPED: no python3"; exit 77; }
[[ -x $build/trainer/yolo8 ]] || { echo "SKIPPED: no $build/trainer/yolo8"; exit 77; }
out=$(mktemp -d /tmp/yolo8-gpu-dry.XXXXXX)
work=$(mktemp -d /tmp/yolo8-gpu-dry-work.XXXXXX)
trap 'rm -rf "$out" "$work"' EXIT
start=$(date +%s)
OUT=$out WORK=$work BUILD_DIR=$build bash "$src/scripts/gpu_check.sh" --dry-run > "$work/stdout.txt" 2>&1
rc=$?
echo "gpu_check.sh --dry-run: exit $rc after $(( $(date +%s) - start )) s"
if (( rc != 0 )); then
  tail -40 "$work/stdout.txt"
  exit 1
fi
python3 - "$out" <<'PY'
import json, os, re, sys
out = sys.argv[1]
expected = ["gpu_check.log", "summary.json", "vram.json", "memory-table.yaml", "auto_batch.json", "throughput.json",
            "cuda_tests.json", "nvml.json"]
files = sorted(os.listdir(out))
problems = []
missing = [f for f in expected if f not in files]
if missing:
    problems.append(f"missing: {missing}")
if len(files) > 8:  # the device tool brings back 8 files at most
    problems.append(f"{len(files)} files, the device tool returns 8: {files}")
problems += [f"name the device tool refuses: {f}" for f in files if not re.fullmatch(r"[A-Za-z0-9._-]+", f)]
for f in files:
    if f.endswith(".json"):
        try:
            json.load(open(os.path.join(out, f)))
        except ValueError as e:
            problems.append(f"{f} does not parse: {e}")
summary = json.load(open(os.path.join(out, "summary.json")))
for stage in ["vram", "auto_batch", "throughput"]:  # what a CPU can run in full
    if summary["stages"].get(stage, {}).get("status") != "ok":
        problems.append(f"stage {stage}: {summary['stages'].get(stage)}")
for stage in ["cuda_tests", "nvml"]:
    if summary["stages"].get(stage, {}).get("status") not in ("ok", "skipped"):
        problems.append(f"stage {stage}: {summary['stages'].get(stage)}")
table = open(os.path.join(out, "memory-table.yaml")).read()
for key in ("reference_imgsz:", "provenance:", "models:", "yolov8n:"):
    if key not in table:
        problems.append(f"memory-table.yaml has no {key}")
# A build without OpenCV cannot train from images: then the real loader and the training run are skipped.
decode = summary["image_decoding"]
nvml = json.load(open(os.path.join(out, "nvml.json")))
if decode and not nvml.get("heartbeats"):
    problems.append("nvml.json: the CPU lease recorded no heartbeat")
throughput = json.load(open(os.path.join(out, "throughput.json")))
for name, v in throughput["variants"].items():
    if not v.get("synthetic_images_per_second") or (decode and not v.get("real_loader_images_per_second")):
        problems.append(f"throughput.json: {name} lacks a figure: {v}")
if problems:
    print("FAILED:\n  " + "\n  ".join(problems))
    sys.exit(1)
print(f"ok: {len(files)} files, every JSON parses; stages " +
      ", ".join(f"{k} {v['status']}" for k, v in summary["stages"].items()))
PY
