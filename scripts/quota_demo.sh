#!/usr/bin/env bash
# quotad demo on loopback: two teams train, a critical job preempts one, the preempted job resumes after.
# The trainer side is simulated with curl (heartbeat, release); the admin side uses quotad's verbs.
# Usage: scripts/quota_demo.sh [BUILD_DIR]   (needs the quotad target: ninja -C build quotad)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-${BUILD_DIR:-build}}
quotad="$build_dir/quota/quotad"
[[ -x "$quotad" ]] || { echo "missing $quotad: run 'ninja -C $build_dir quotad' first" >&2; exit 1; }

work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
# The example department, with a 2 s minimum runtime so the demo need not wait 10 minutes before preempting.
sed -e 's/min_runtime_s: [0-9]*/min_runtime_s: 2/' -e 's/grace_s: 120/grace_s: 30/' \
  configs/quota-policy.yaml > "$work/policy.yaml"
cp configs/memory-table.yaml "$work/"

"$quotad" serve --policy "$work/policy.yaml" --db "$work/quota.db" --listen 127.0.0.1:0 > "$work/quotad.log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "on http://" "$work/quotad.log" && break; sleep 0.05; done
url=$(sed -n 's/.* on \(http:\/\/[0-9.]*:[0-9]*\),.*/\1/p' "$work/quotad.log")
echo "== $(cat "$work/quotad.log")"

say() { printf '\n== %s\n' "$*"; }
api() {  # api TOKEN METHOD PATH [BODY] -> prints "HTTP_CODE BODY"
  local token=$1 method=$2 path=$3 body=${4:-}
  curl -s -X "$method" -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
    ${body:+--data "$body"} -w ' HTTP%{http_code}' "$url$path"
}
field() {  # field KEY < JSON: the first string or number value of KEY (no jq needed)
  local json; json=$(cat)
  local v; v=$(sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p" <<< "$json" | head -1)
  [[ -n "$v" ]] || v=$(sed -n "s/.*\"$1\":\([-0-9.]*\).*/\1/p" <<< "$json" | head -1)
  echo "$v"
}
admin() { "$quotad" "$@" --server "$url" --token admin-token; }

say "team-cv (alice) starts a low-priority nightly run on 8 GPUs"
out=$(api alice-token POST /v1/leases '{"job":"cv-nightly","model":"yolov8s","gpus":8,"priority":"low"}')
cv_lease=$(field lease_id <<< "$out"); echo "${out##* } lease $cv_lease $(field status <<< "$out")"
say "team-robotics (erin) trains on 6 GPUs"
out=$(api erin-token POST /v1/leases '{"job":"robo-grasp","model":"yolov8n","gpus":6}')
robo_lease=$(field lease_id <<< "$out"); echo "${out##* } lease $robo_lease $(field status <<< "$out")"
admin teams
admin leases

sleep 3  # both jobs pass the minimum runtime
api alice-token POST "/v1/leases/$cv_lease/heartbeat" \
  "{\"step\":1200,\"epoch\":3,\"gpu_util\":0.91,\"last_checkpoint_ms\":$(date +%s%3N)}" > /dev/null

say "team-robotics (dave) needs 8 GPUs NOW: priority critical, from the emergency pool"
out=$(api dave-token POST /v1/leases \
  '{"job":"hotfix","model":"yolov8s","gpus":8,"priority":"critical","justification":"production regression"}')
crit_lease=$(field lease_id <<< "$out")
echo "${out##* } lease $crit_lease $(field status <<< "$out"): $(field reason <<< "$out")"

say "alice's trainer learns on its next heartbeat that its lease is revoked"
out=$(api alice-token POST "/v1/leases/$cv_lease/heartbeat" '{"step":1250,"epoch":3}')
echo "${out##* } state $(field state <<< "$out"), release within $(( $(field deadline_in_ms <<< "$out") / 1000 )) s"
say "the critical job still waits: GPUs are handed over only after the victim releases"
out=$(api dave-token GET "/v1/leases/$crit_lease"); echo "lease $crit_lease: $(field state <<< "$out")"

say "alice's trainer checkpoints and releases with outcome 'preempted'"
out=$(api alice-token POST "/v1/leases/$cv_lease/release" '{"outcome":"preempted"}'); echo "lease $cv_lease: $(field state <<< "$out")"
out=$(api dave-token GET "/v1/leases/$crit_lease"); echo "lease $crit_lease: $(field state <<< "$out")"

say "alice asks again to resume from the checkpoint; she waits in the queue"
out=$(api alice-token POST /v1/leases '{"job":"cv-nightly-resume","model":"yolov8s","gpus":8,"priority":"low"}')
resume_lease=$(field lease_id <<< "$out")
echo "${out##* } lease $resume_lease $(field status <<< "$out"), position $(field position <<< "$out"): $(field reason <<< "$out")"
admin leases

say "the hotfix finishes; alice's queued request is granted and her training resumes"
api dave-token POST "/v1/leases/$crit_lease/release" '{"outcome":"completed"}' > /dev/null
out=$(api alice-token GET "/v1/leases/$resume_lease"); echo "lease $resume_lease: $(field state <<< "$out")"

say "a large model needs a lead's approval (bob asks for yolov8x, carol approves)"
api erin-token POST "/v1/leases/$robo_lease/release" '{"outcome":"completed"}' > /dev/null
api alice-token POST "/v1/leases/$resume_lease/release" '{"outcome":"completed"}' > /dev/null
out=$(api bob-token POST /v1/leases '{"job":"big","model":"yolov8x","batch":32,"justification":"accuracy study"}')
approval=$(field approval_id <<< "$out"); echo "${out##* } $(field status <<< "$out"), approval $approval"
"$quotad" approve "$approval" --server "$url" --token carol-token --note "ok for this week"

say "admission check: a batch that cannot fit is refused before anything starts"
out=$(api bob-token POST /v1/leases '{"job":"too-big","model":"yolov8m","batch":512}')
echo "${out##* } $(field reason <<< "$out")"

say "audit log"
admin audit
say "metrics (excerpt)"
curl -s "$url/metrics" | grep -E '^quotad_(team_gpus_in_use|preemptions_total|emergency_grants_total)'
