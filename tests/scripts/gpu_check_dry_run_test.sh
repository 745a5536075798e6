#!/usr/bin/env bash
# GpuCheck.DryRun: scripts/gpu_check.sh --dry-run against BUILD_DIR on the CPU writes every file the GPU run
# writes (at most 6), summary.json holds every stage in order, and every stage that can run on a CPU ran ("ok"): the
# two shared leases, the four throughput modes, the Gloo stand-in of the NCCL stage; a stage whose command fails (a
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
expected = ["gpu_check.log", "summary.json", "memory-table.yaml"]
files = sorted(os.listdir(out))
problems = []
missing = [f for f in expected if f not in files]
if missing:
    problems.append(f"missing: {missing}")
if len(files) > 6:  # the device tool brings back 8 files at most; the check keeps to 6
    problems.append(f"{len(files)} files, the check keeps to 6: {files}")
problems += [f"name the device tool refuses: {f}" for f in files if not re.fullmatch(r"[A-Za-z0-9._-]+", f)]
for f in files:
    if f.endswith(".json"):
        try:
            json.load(open(os.path.join(out, f)))
        except ValueError as e:
            problems.append(f"{f} does not parse: {e}")
summary = json.load(open(os.path.join(out, "summary.json")))
stages = summary["stages"]
every = ["preflight", "cuda_tests", "vram", "shared", "auto_batch", "throughput", "nvml", "nccl"]
if list(stages) != every:
    problems.append(f"stages {list(stages)}, expected {every}")
for stage in ["preflight", "vram", "shared", "auto_batch", "throughput", "nccl"]:  # what a CPU can run in full
    if stages.get(stage, {}).get("status") != "ok":
        problems.append(f"stage {stage}: {stages.get(stage, {}).get('status')}: {stages.get(stage, {}).get('reason')}")
for stage in ["cuda_tests", "nvml"]:
    if stages.get(stage, {}).get("status") not in ("ok", "skipped"):
        problems.append(f"stage {stage}: {stages.get(stage, {}).get('status')}: {stages.get(stage, {}).get('reason')}")
table = open(os.path.join(out, "memory-table.yaml")).read()
for key in ("reference_imgsz:", "provenance:", "models:", "yolov8n:"):
    if key not in table:
        problems.append(f"memory-table.yaml has no {key}")
# A build without OpenCV cannot train from images: then the real loader and the training runs are skipped.
decode = summary["image_decoding"]
if decode and not stages["nvml"].get("heartbeats"):
    problems.append("nvml: the CPU lease recorded no heartbeat")
throughput = stages["throughput"]
if not throughput.get("synthetic_images_per_second"):
    problems.append("throughput: no synthetic figure")
for mode, v in throughput.get("modes", {}).items():
    if decode and not v.get("images_per_second"):
        problems.append(f"throughput: {mode} lacks a figure: {v}")
if decode and len(throughput.get("modes", {})) != 4:
    problems.append(f"throughput: modes {list(throughput.get('modes', {}))}")
shared = stages["shared"]
if decode:
    runs = shared.get("runs", {})
    for name in ("shared_alone", "shared_0", "shared_1"):
        r = runs.get(name, {})
        if not r.get("granted_a_share") or r.get("peak_allocated_gib") is None:
            problems.append(f"shared: {name}: {r}")
    if "slowdown" not in shared:
        problems.append("shared: no slowdown figure")
nccl = stages["nccl"].get("result") or {}
if not nccl.get("sum_correct") and "skipped" not in nccl:
    problems.append(f"nccl: {nccl}")
if problems:
    print("FAILED:\n  " + "\n  ".join(problems))
    sys.exit(1)
print(f"ok: {len(files)} files, every JSON parses; stages " +
      ", ".join(f"{k} {v['status']}" for k, v in stages.items()))
PY
