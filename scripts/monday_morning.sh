#!/usr/bin/env bash
# A department's Monday morning, played in containers with the images `make images` built (yolo8, yolo8-quotad):
#
#   quotad serves a small department (one node of 4 GPUs; the policy mounted as a file, as the ConfigMap is) and
#   three teams start at once: vision (alice) trains a yolov8n, self-service; perception (bob) trains a yolov8l,
#   which needs approval: the trainer waits while pending until the team's lead (carol) approves; the interns (ivy)
#   launch a grid search of three lr0 values at low priority, and the third run queues at the team's burst limit.
#   Then vision's lead (dave) sends a critical request: quotad revokes the lowest-priority run (the interns' run
#   granted over their base), which checkpoints and exits 75; it is restarted as a Job would restart it (same
#   arguments, resume=auto), waits in the queue and resumes: its final weights equal, bit for bit, an uninterrupted
#   run of the same arguments with quota=off made beforehand. Every other run completes (exit 0).
#
# At the end `quotad report` must name each team, quotad's status page must render (fetched from the host) and
# the timeline of the morning is printed: who asked, who got, who was pending and approved, who queued, who was
# preempted, who resumed, who finished, with seconds since the teams started, from the trainers' logs and
# quotad's audit log. Any lost lease, inexact resume or exit code outside the contract fails (non-zero exit).
#
# CPU training on tiny models (imgsz 64, 16 images, threads=1): the leases are quotad's bookkeeping of GPUs the
# runs do not touch, so the whole morning fits in a few minutes on a small machine.
#
# Usage: scripts/monday_morning.sh   (needs podman or docker and the images; tests/deploy/container/
# monday_morning_test.sh runs it). Everything it creates is labelled and removed at exit by lib.sh.
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../tests/deploy/container/lib.sh"
quotad_name=$prefix-quotad
network=$prefix-net
quotad_url=http://$quotad_name:8080
events=$work/events.tsv  # what the script itself did, for the timeline: ms, who, what
: > "$events"
# MONDAY_MORNING_LOGS=DIR keeps every container's log (with timestamps), the audit log, the report and the status
# page there, pass or fail (lib.sh removes the scratch folder and the containers at exit).
keep_logs() {
  local dir=${MONDAY_MORNING_LOGS:-} name
  if [[ -n $dir ]]; then
    mkdir -p "$dir"
    for name in $(engine ps -a --filter "label=yolo8-test=$prefix" --format '{{.Names}}' 2>/dev/null || true); do
      engine logs -t "$name" > "$dir/${name#"$prefix-"}.log" 2>&1 || true
    done
    q admin-token audit --limit 1000 > "$dir/audit.txt" 2>&1 || true
    cp "$work"/*.json "$work"/*.md "$work"/*.html "$work"/*.tsv "$dir/" 2>/dev/null || true
    echo "logs kept in $dir"
  fi
  cleanup
}
trap keep_logs EXIT
now_ms() { date +%s%3N; }
note() { printf '%s\t%s\t%s\n' "$(now_ms)" "$1" "$2" >> "$events"; }

step "policy (one node of 4 GPUs, three teams), network, volume, dataset"
mkdir -p "$work/policy"
hash_of() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
# Demo tokens: <user>-token. Short lease times so the morning happens in seconds: a heartbeat every second, a
# lease lost after 20 s without one (the trainer fences itself after 14 s); a run may be preempted after 1 s and
# has 30 s to checkpoint and release.
# No emergency pool, so the critical request must preempt; its channel allows one GPU per request.
# The interns' burst window is always open: base 1, burst 2, so their third run queues.
cat > "$work/policy/quota-policy.yaml" <<POLICY
inventory:
  nodes:
    - {name: node-1, gpus: 4, memory_gib: 24}
emergency_pool: 0
emergency: {max_gpus_per_request: 1}
users:
  admin: {role: admin, token_sha256: $(hash_of admin-token)}
  alice: {token_sha256: $(hash_of alice-token)}
  dave: {token_sha256: $(hash_of dave-token)}
  bob: {token_sha256: $(hash_of bob-token)}
  carol: {token_sha256: $(hash_of carol-token)}
  ivy: {token_sha256: $(hash_of ivy-token)}
  ian: {token_sha256: $(hash_of ian-token)}
teams:
  vision: {base: 1, burst: 1, leads: [dave], members: [alice]}
  perception: {base: 1, burst: 1, leads: [carol], members: [bob]}
  interns:
    base: 1
    burst: 2
    burst_windows:
      - {days: [mon, tue, wed, thu, fri, sat, sun], from: "00:00", to: "24:00", timezone: UTC}
    leads: [ian]
    members: [ivy]
credits: {monthly_gpu_hours: 0}
tiers:
  self_service: [yolov8n]
  approval: [yolov8l]
leases: {ttl_s: 20, heartbeat_interval_s: 1, expiry_grace_s: 2}
preemption: {min_runtime_s: 1, grace_s: 30}
waste: {after_s: 5, gpu_util_below: 0.2}
POLICY
chmod 0644 "$work/policy/quota-policy.yaml"
engine network create "${label[@]}" "$network" > /dev/null
engine volume create "${label[@]}" "$prefix-state" > /dev/null
make_dataset ds 21

# The runs' arguments (each run's array is what a Job's pod template would hold; a restart reuses it as is).
common=(train data=/work/ds/data.yaml imgsz=64 batch=4 workers=1 threads=1 device=cpu pretrained=false plots=false
  val=false project=/work/runs exist_ok=true resume=auto "quota=$quotad_url")
vision=("${common[@]}" model=yolov8n.yaml epochs=60 name=vision-detector team=vision user=alice)
perception=("${common[@]}" model=yolov8l.yaml epochs=3 name=perception-large team=perception user=bob
  "justification=larger backbone for the new lidar-camera detector")
grid_lr0=(0.01 0.02 0.005)
intern_args() {  # intern_args K: the grid search's run K (1..3), as words (none has a space)
  echo "${common[@]}" model=yolov8n.yaml epochs=40 "lr0=${grid_lr0[$1 - 1]}" name="interns-grid-$1" team=interns \
    user=ivy priority=low
}
critical=("${common[@]}" model=yolov8n.yaml epochs=10 name=vision-hotfix team=vision user=dave priority=critical
  "justification=production detector regressed after the weekend release")
victim=2  # the grid search's second run: granted over the interns' base, at low priority, so the first to go

step "the victim's reference: the same arguments, quota=off, uninterrupted"
# shellcheck disable=SC2046  # intern_args has no spaces inside its words
engine run --rm "${label[@]}" --network=none -v "$work:/work" "$yolo8_image" \
  $(intern_args $victim | sed "s|quota=[^ ]*|quota=off|; s|name=[^ ]*|name=reference|") > "$work/reference.log" 2>&1 ||
  { tail -20 "$work/reference.log"; fail "the reference run failed"; }

step "quotad in its container (HTTP on the network, database on a volume, the policy as a file)"
engine run -d --name "$quotad_name" "${label[@]}" --network "$network" --read-only --tmpfs /tmp \
  -v "$prefix-state:/var/lib/quotad" -v "$work/policy:/etc/quotad/policy:ro" "$quotad_image" \
  serve --policy /etc/quotad/policy/quota-policy.yaml --db /var/lib/quotad/quotad.db --listen 0.0.0.0:8080 > /dev/null
deadline=$((SECONDS + 30))
until engine logs "$quotad_name" 2>&1 | grep -q '^quotad: serving'; do
  ((SECONDS < deadline)) || { engine logs "$quotad_name" | tail; fail "quotad did not start"; }
  sleep 0.2
done
# The trainers find quotad by its name through /etc/hosts rather than the network's DNS server: the quota client
# resolves the name for every request, and on a busy machine (other containers starting and stopping) lookups
# through podman's aardvark-dns were seen to hang for 11 s, and trainers to lose quotad for up to 30 s: long
# enough to fence them and expire their leases.
quotad_ip=$(engine inspect --format '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$quotad_name")
[[ -n $quotad_ip ]] || fail "quotad's container has no address on $network"
# The quotad CLI inside quotad's container, as a lead or an admin runs it: q TOKEN VERB ARGS...
q() {
  local token=$1
  shift
  engine exec -e QUOTAD_TOKEN="$token" "$quotad_name" /usr/local/bin/quotad "$@" --server http://127.0.0.1:8080
}

# Trainer containers: start_trainer WHO TOKEN ARGS... (WHO names the container and the timeline's line).
start_trainer() {
  local who=$1 token=$2
  shift 2
  engine run -d --name "$prefix-$who" "${label[@]}" --network "$network" --add-host "$quotad_name:$quotad_ip" \
    -v "$work:/work" -e YOLO8_QUOTA_TOKEN="$token" "$yolo8_image" "$@" > /dev/null || fail "$who's container did not start"
  note "$who" "container started"
}
# exited WHO: waits for the container to stop, notes when it did (for the timeline) and prints its exit code.
exited() {
  local code finished
  code=$(exit_code_of "$prefix-$1")
  finished=$(engine inspect --format '{{.State.FinishedAt}}' "$prefix-$1")
  printf '%s\t%s\t%s\n' "$(date -d "${finished% UTC}" +%s%3N)" "$1" "exits $code" >> "$events"
  echo "$code"
}
running() { [[ $(engine inspect --format '{{.State.Running}}' "$prefix-$1" 2>/dev/null) == true ]]; }
# wait_for_log WHO REGEX SECONDS: until the trainer's log matches; fails if it stops first or time runs out.
wait_for_log() {
  local deadline=$((SECONDS + $3))
  until engine logs "$prefix-$1" 2>&1 | grep -Eq "$2"; do
    if ! running "$1" && ! engine logs "$prefix-$1" 2>&1 | grep -Eq "$2"; then
      engine logs "$prefix-$1" 2>&1 | tail -20
      fail "$1 stopped before its log said /$2/"
    fi
    ((SECONDS < deadline)) || { engine logs "$prefix-$1" 2>&1 | tail -20; fail "$1's log never said /$2/ in $3 s"; }
    sleep 0.3
  done
}
answered='Lease [0-9]+ granted|waiting \('

step "09:00: three teams start at once"
t0_ms=$(now_ms)
start_trainer vision-alice alice-token "${vision[@]}"
start_trainer perception-bob bob-token "${perception[@]}"
# The grid search submits its runs one after the other (each once quotad has answered the previous one), so the
# order of the interns' leases, and with it the run that is granted over their base, is known.
for k in 1 2 3; do
  # shellcheck disable=SC2046
  start_trainer "interns-ivy-$k" ivy-token $(intern_args $k)
  wait_for_log "interns-ivy-$k" "$answered" 120
done
engine logs "$prefix-interns-ivy-3" 2>&1 | grep -q 'waiting (queued' ||
  fail "the interns' third run was not queued at their burst limit: $(engine logs "$prefix-interns-ivy-3" 2>&1 | grep -E "$answered" | head -1)"

step "perception's yolov8l waits for approval; its lead carol approves"
wait_for_log perception-bob 'waiting \(needs_approval' 120
approvals=$(q carol-token approvals --json) || fail "quotad approvals as carol failed"
approval_id=$(jq -r '[.approvals[] | select(.state == "pending")][0].id // empty' <<< "$approvals")
[[ -n $approval_id ]] || fail "no pending approval for perception: $approvals"
q carol-token approve "$approval_id" --note "ok for this week" > "$work/approve.txt" ||
  { cat "$work/approve.txt"; fail "carol could not approve $approval_id"; }
note "carol (perception's lead)" "quotad approve $approval_id: $(cat "$work/approve.txt")"
wait_for_log perception-bob 'Lease [0-9]+ granted' 120

step "every GPU is held; the victim has a checkpoint to lose; the critical request arrives"
wait_for_file "$work/runs/interns-grid-$victim/weights/last.pt" 180 || fail "the interns' run $victim never checkpointed"
for who in vision-alice perception-bob interns-ivy-1 "interns-ivy-$victim"; do
  running "$who" || fail "$who ended before the critical request: the morning is too short to preempt anyone"
done
engine logs "$prefix-interns-ivy-3" 2>&1 | grep -Eq 'Lease [0-9]+ granted' &&
  fail "the interns' third run was granted before the critical request: another run ended too soon"
start_trainer vision-dave-critical dave-token "${critical[@]}"

step "the interns' run $victim yields: exit 75, checkpoint written"
victim_who=interns-ivy-$victim
code=$(exited "$victim_who")
engine logs "$prefix-$victim_who" > "$work/$victim_who.log" 2>&1
[[ $code == 75 ]] || { tail -20 "$work/$victim_who.log"; fail "the preempted run exited $code, not 75"; }
grep -q 'Stopped (lease revoked)' "$work/$victim_who.log" || fail "the preempted run did not stop for its revoked lease"
grep -Eq 'Lease [0-9]+ released \(preempted\)' "$work/$victim_who.log" ||
  { tail "$work/$victim_who.log"; fail "the preempted run's release (preempted) was not acknowledged"; }
grep -q 'epochs completed' "$work/$victim_who.log" && fail "the preempted run completed: nothing was preempted"

step "restarted as a Job would: same arguments, resume=auto; it waits in the queue"
# shellcheck disable=SC2046
start_trainer "$victim_who-restart" ivy-token $(intern_args $victim)
note "$victim_who-restart" "restarted with the same arguments (resume=auto)"
wait_for_log "$victim_who-restart" "$answered" 120
engine logs "$prefix-$victim_who-restart" 2>&1 | grep -q 'waiting (queued' ||
  fail "the restarted run was granted at once: it did not wait in the queue"

step "quotad's status page, from the host, while the restarted run waits"
# The page needs no token (it shows names and figures, never tokens); the host reaches the container's address.
status_page() {  # status_page FILE: fetches / and checks it is HTML naming every team
  curl -fsS --max-time 10 "http://$quotad_ip:8080/" > "$1" || fail "no status page at http://$quotad_ip:8080/"
  grep -qi '<html' "$1" || fail "the status page is not HTML: $(head -c 200 "$1")"
  for team in vision perception interns; do
    grep -q "$team" "$1" || fail "the status page does not name team $team"
  done
}
status_page "$work/status-morning.html"
grep -q "interns-grid-$victim" "$work/status-morning.html" ||
  fail "the status page does not show the restarted run interns-grid-$victim (queued)"
note "status page" "renders (HTML naming the three teams); its queue shows interns-grid-$victim waiting"

step "the morning runs to its end"
all=(vision-alice perception-bob interns-ivy-1 interns-ivy-3 vision-dave-critical "$victim_who-restart")
for who in "${all[@]}"; do
  code=$(exited "$who")
  engine logs "$prefix-$who" > "$work/$who.log" 2>&1
  [[ $code == 0 ]] || { tail -20 "$work/$who.log"; fail "$who exited $code, not 0 (only the preempted run may exit 75)"; }
  grep -q 'epochs completed' "$work/$who.log" || fail "$who did not complete its epochs"
  grep -Eq 'Lease [0-9]+ released \(completed\)' "$work/$who.log" ||
    { tail "$work/$who.log"; fail "$who's release (completed) was not acknowledged"; }
done
grep -q '^Resuming ' "$work/$victim_who-restart.log" || fail "the restarted run did not resume from its checkpoint"
# A lost lease: a run stopped for its lease although quotad did not preempt it, or a lease quotad had already
# ended (expired) when its trainer released it, or a release quotad never acknowledged.
for who in "${all[@]}" "$victim_who"; do
  if [[ $who != "$victim_who" ]] && grep -q 'Stopped (lease revoked)' "$work/$who.log"; then
    fail "$who lost its lease (stopped for it without being preempted)"
  fi
  if grep -Eq 'had already ended on quotad|release not acknowledged|release refused|quotad unavailable' "$work/$who.log"; then
    fail "$who lost its lease or quotad: $(grep -E 'had already ended|not acknowledged|refused|unavailable' "$work/$who.log" | head -1)"
  fi
done

step "the resumed run's final weights equal the uninterrupted reference's, bit for bit"
export_state_dict runs/reference/weights/last.pt reference.pt
export_state_dict "runs/interns-grid-$victim/weights/last.pt" resumed.pt
cmp -s "$work/reference.pt" "$work/resumed.pt" ||
  fail "the resumed run's weights differ from the uninterrupted run's (the resume was not exact)"
note "$victim_who-restart" "final weights equal the uninterrupted reference's ($(sha256sum < "$work/resumed.pt" | cut -c1-16))"

step "quotad's audit log: a preemption, an emergency grant, an approval, no lease expired"
q admin-token audit --json --limit 1000 > "$work/audit.json" || fail "quotad audit failed"
audit_count() { jq --arg action "$1" '[.audit[] | select(.action == $action)] | length' "$work/audit.json"; }
(($(audit_count preempt.revoke) == 1)) || fail "the audit log has $(audit_count preempt.revoke) preemptions, not 1"
(($(audit_count emergency.granted) == 1)) || fail "the audit log has no emergency grant"
(($(audit_count approval.approved) == 1)) || fail "the audit log has no approval"
(($(audit_count lease.expired) == 0)) || fail "a lease expired: $(jq -c '.audit[] | select(.action == "lease.expired")' "$work/audit.json")"
revoked_lease=$(jq -r '.audit[] | select(.action == "preempt.revoke") | .lease_id' "$work/audit.json")
grep -Eq "Lease $revoked_lease granted" "$work/$victim_who.log" ||
  fail "quotad revoked lease $revoked_lease, not the interns' run $victim's"

step "quotad report: GPU-hours per team and the waste list"
# The report reads quotad's database (read-only, quotad keeps serving): run where the database is, in quotad's
# container. Markdown to read, CSV to check (GPU-hours to 3 decimals: the morning is a few GPU-minutes).
month=$(date -u -d "@$((t0_ms / 1000))" +%Y-%m)
for format in md csv; do
  engine exec "$quotad_name" /usr/local/bin/quotad report --month "$month" --format "$format" \
    --db /var/lib/quotad/quotad.db --policy /etc/quotad/policy/quota-policy.yaml > "$work/report.$format" \
    2> "$work/report.err" || { cat "$work/report.err"; fail "quotad report --format $format failed"; }
done
for team in vision perception interns; do
  hours=$(python3 -c 'import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["record"] == "team" and r["team"] == sys.argv[2]]
print(rows[0]["gpu_hours"] if rows else "")' "$work/report.csv" "$team")
  [[ -n $hours ]] || fail "quotad report has no GPU-hours for team $team"
  awk -v h="$hours" 'BEGIN { exit !(h > 0) }' || fail "quotad report gives team $team $hours GPU-hours"
  echo "  $team: $hours GPU-hours"
done
grep -q '^## Waste leaderboard' "$work/report.md" || fail "quotad report has no waste list"
sed -n '/^## Waste leaderboard/,/^## /p' "$work/report.md" | sed '$d'

step "quotad's status page at the end"
status_page "$work/status.html"

step "the timeline"
for who in "${all[@]}" "$victim_who"; do engine logs -t "$prefix-$who" > "$work/$who.tlog" 2>&1; done
python3 - "$t0_ms" "$work/audit.json" "$events" "$work"/*.tlog <<'PY'
import datetime, json, os, re, sys

t0 = int(sys.argv[1]) / 1000.0
audit, events_file, logs = sys.argv[2], sys.argv[3], sys.argv[4:]
events = []  # (seconds since t0, who, what)

def add(ts, who, what):
    events.append((ts - t0, who, what))

stamp = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:?\d\d)? (.*)$")
for path in logs:
    who = os.path.basename(path)[: -len(".tlog")]
    last_wait = None
    for line in open(path, errors="replace"):
        m = stamp.match(line.rstrip("\n"))
        if not m:
            continue
        when = datetime.datetime.fromisoformat(m.group(1) + (m.group(2) or "")[:7] + "+00:00")
        offset = m.group(3) or "Z"
        if offset != "Z":  # a local-time stamp: to UTC
            sign = 1 if offset[0] == "+" else -1
            hours, minutes = int(offset[1:3]), int(offset[-2:])
            when -= sign * datetime.timedelta(hours=hours, minutes=minutes)
        ts, text = when.timestamp(), m.group(4)
        if (a := re.match(r"Asking \S+ for a lease: team (\S+), (\S+), (\d+) GPU, priority (\w+)", text)):
            add(ts, who, f"asks for {a.group(3)} GPU ({a.group(2)}, priority {a.group(4)})")
        elif (a := re.match(r"\s*waiting \((\w+), position (\d+)\): (.*)", text)):
            if a.group(1) != last_wait:
                what = "pending approval" if a.group(1) == "needs_approval" else f"{a.group(1)} at position {a.group(2)}"
                add(ts, who, f"{what}: {a.group(3)}")
            last_wait = a.group(1)
        elif (a := re.match(r"Lease (\d+) granted", text)):
            add(ts, who, f"lease {a.group(1)} granted")
        elif (a := re.match(r"Resuming \S+ \((.*?)\)", text)):
            add(ts, who, f"resumes from its checkpoint ({a.group(1)})")
        elif (a := re.match(r"Stopped \((.*?)\) (in epoch \d+ after batch \d+|at the end of epoch \d+)", text)):
            add(ts, who, f"yields ({a.group(1)}) {a.group(2)}: checkpoint written")
        elif (a := re.match(r"Lease (\d+) (released \(\w+\)|had already ended.*|release .*)", text)):
            add(ts, who, f"lease {a.group(1)} {a.group(2)}")
        elif (a := re.match(r"(\d+) epochs completed", text)):
            add(ts, who, f"finished ({a.group(1)} epochs completed in this container)")

for line in open(events_file):
    ms, who, what = line.rstrip("\n").split("\t", 2)
    if what != "container started":  # the trainer's own "asks" follows within a second or two
        add(int(ms) / 1000.0, who, what)

for entry in json.load(open(audit))["audit"]:
    action = entry["action"]
    # the rest (grants, queueing, releases) the trainers' own lines already say
    if action in ("approval.requested", "preempt.revoke", "emergency.granted", "lease.expired", "lease.orphaned"):
        detail = f": {entry['detail']}" if entry.get("detail") else ""
        add(entry["ts_ms"] / 1000.0, "quotad audit",
            f"{action} lease {entry['lease_id']} ({entry['team']}, by {entry['actor']}){detail}")

width = max(len(who) for _, who, _ in events)
for at, who, what in sorted(events, key=lambda e: e[0]):
    print(f"  +{at:6.1f} s  {who:<{width}}  {what}")
PY
echo "ok: a Monday morning of three teams: approval, burst queue, critical preemption, exact resume ($SECONDS s)"
