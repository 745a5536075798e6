#!/usr/bin/env bash
# The peer check: installs the peer if needed (scripts/peer.sh), runs Ultralytics 8.0.232 `val` on the reference val
# case and compares its precision, recall, mAP50, mAP50-95 and per-class APs with the figures stored in the case
# (computed by the same Ultralytics on torch 1.13.1). Prints a table, writes build/peer/peer_val.json.
#   scripts/peer_check.sh            YOLO8_SHARED (default REPO/../shared) holds reference/ultralytics-8.0.232/val_case;
#                                    YOLO8_VAL_CASE names the case folder directly; YOLO8_PEER_OUT the JSON file.
# The case is copied to a temporary folder and validated there (Ultralytics writes label caches next to the labels).
# Fails when val fails, when anything tried to reach the network beyond Ultralytics' start-up probe (a font or
# weight download, an update check: see scripts/peer/sitecustomize.py) or, with YOLO8_PEER_STRICT=1, when a figure
# differs from the stored one by more than YOLO8_PEER_TOLERANCE (default 1e-3; otherwise that is printed as a note).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
shared=${YOLO8_SHARED:-$repo/../shared}
case_dir=${YOLO8_VAL_CASE:-$shared/reference/ultralytics-8.0.232/val_case}
out=${YOLO8_PEER_OUT:-$repo/build/peer/peer_val.json}
[[ -f $case_dir/val_case.pt && -f $case_dir/data.yaml ]] || {
  echo "peer_check: no val case at $case_dir (set YOLO8_SHARED or YOLO8_VAL_CASE)" >&2; exit 2; }
case_dir=$(cd "$case_dir" && pwd)

start=$(date +%s)
"$repo/scripts/pyenv.sh" peer >/dev/null
echo "peer_check: environment ready in $(( $(date +%s) - start )) s ($(du -sh "$repo/.venv/peer" | cut -f1))"

work=$(mktemp -d "${TMPDIR:-/tmp}/yolo8-peer-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
export YOLO8_PEER_NETLOG=$work/refused.log YOLO_CONFIG_DIR=$work/config
: >"$YOLO8_PEER_NETLOG"
"$repo/scripts/peer.sh" python "$repo/scripts/peer/val_check.py" "$case_dir" "$work" "$out"

probes=$(grep -cE '^(1\.1\.1\.1|8\.8\.8\.8|223\.5\.5\.5):53 ' "$YOLO8_PEER_NETLOG" || true)
others=$(grep -vcE '^(1\.1\.1\.1|8\.8\.8\.8|223\.5\.5\.5):53 ' "$YOLO8_PEER_NETLOG" || true)
echo "peer_check: network: $probes start-up probes refused (ultralytics.utils.is_online), $others other attempts"
if (( others > 0 )); then
  grep -vE '^(1\.1\.1\.1|8\.8\.8\.8|223\.5\.5\.5):53 ' "$YOLO8_PEER_NETLOG" | sed 's/^/  refused: /' >&2
  echo "peer_check: FAILED, the peer tried to download something" >&2
  exit 1
fi
if [[ ${YOLO8_PEER_STRICT:-0} == 1 ]] && grep -q '"note": "' "$out"; then
  echo "peer_check: FAILED, beyond the tolerance (YOLO8_PEER_STRICT=1)" >&2
  exit 1
fi
echo "peer_check: OK"
