#!/usr/bin/env bash
# The manifests run, not only validate: `podman kube play` of quotad's Deployment (+ PVC + policy ConfigMap) starts
# quotad with the manifest's args, env, volumes and security context (read-only root, user 10001), and it answers
# /healthz; then each single-pod Job template of deploy/ (the Job's pod template taken into a Pod) trains a tiny run
# against that quotad with the template's own command, env, volumes and security context, and writes its run folder
# on the runs volume. kube_play.py says what is changed and why. Image names in deploy/ are checked by
# DeployImages.NamesAreTheOnesMakeImagesBuilds.
source "$(dirname "$0")/lib.sh"
[[ $container_engine == podman ]] || fail "kube play needs podman (engine: $container_engine)"
python=$src/.venv/tools/bin/python
[[ -x $python ]] || fail "no $python (scripts/setup.sh installs it)"
cd "$src"
network=$prefix-net
engine network create "${label[@]}" "$network" > /dev/null

step "secrets as files, volumes"
secrets=$work/secrets
mkdir -p "$secrets/quotad-tokens" "$secrets/quotad-tls" "$secrets/yolo8-quota-token"
"$python" - "$secrets" <<'PY'
import sys, yaml
secrets = sys.argv[1]
for path, name in [("deploy/k8s/quotad/secret-tokens.yaml", "quotad-tokens"),
                   ("deploy/k8s/teams/team-cv.yaml", "yolo8-quota-token")]:
    for doc in yaml.safe_load_all(open(path)):
        if doc and doc["kind"] == "Secret" and doc["metadata"]["name"] == name:
            for key, value in doc["stringData"].items():
                open(f"{secrets}/{name}/{key}", "w").write(value)
PY
chmod -R a+rX "$secrets"
for claim in yolo8-runs yolo8-datasets; do  # kube play creates quotad-state from its PVC
  engine volume create "${label[@]}" "$prefix-$claim" > /dev/null
  # What fsGroup does on a cluster: the pod's group owns the volume (podman ignores fsGroup).
  engine run --rm "${label[@]}" --network=none --user 0 --entrypoint /bin/chown -v "$prefix-$claim:/v" \
    "$yolo8_image" 10001:10001 /v
done
engine run --rm "${label[@]}" --network=none -v "$prefix-yolo8-datasets:/datasets" "$yolo8_image" \
  data synth out=/datasets/ds train=16 val=4 imgsz=64 seed=13 > "$work/synth.log" 2>&1 || { cat "$work/synth.log"; fail "synth"; }

step "kube play: quotad's Deployment"
"$python" tests/deploy/container/kube_play.py quotad "$prefix" "$work/quotad.yaml" "$secrets"
engine kube play --network "$network" "$work/quotad.yaml" > "$work/play-quotad.log" 2>&1 ||
  { cat "$work/play-quotad.log"; fail "kube play of the quotad Deployment failed"; }
quotad_container=$(engine ps -a --filter "label=app.kubernetes.io/name=quotad" --filter "name=$prefix" --format "{{.Names}}" | head -1 || true)
[[ -n $quotad_container ]] || fail "no quotad container in pod $prefix-quotad-pod"
ip=$(engine inspect --format '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$quotad_container")
deadline=$((SECONDS + 30))
until curl -fsS "http://$ip:8080/healthz" > "$work/healthz.txt" 2>/dev/null; do
  ((SECONDS < deadline)) || { engine logs "$quotad_container" | tail; fail "quotad at $ip:8080 never answered /healthz"; }
  sleep 0.5
done
echo "quotad /healthz: $(cat "$work/healthz.txt")"
engine inspect --format '{{.Config.User}} {{.HostConfig.ReadonlyRootfs}}' "$quotad_container" > "$work/quotad-inspect.txt"
[[ $(cat "$work/quotad-inspect.txt") == "10001:10001 true" || $(cat "$work/quotad-inspect.txt") == "10001 true" ]] ||
  fail "quotad's container does not run as the manifest says (user 10001, read-only root): $(cat "$work/quotad-inspect.txt")"
engine logs "$quotad_container" > "$work/quotad.log" 2>&1
grep -q '^quotad: serving /etc/quotad/policy/quota-policy.yaml' "$work/quotad.log" ||
  fail "quotad did not start with the manifest's args"

for job in deploy/k8s/jobs/train-job.yaml deploy/k8s/kueue/train-job-kueue.yaml; do
  step "kube play: the pod template of $job"
  "$python" tests/deploy/container/kube_play.py job "$prefix" "$job" "http://$ip:8080" "$work/job.yaml" "$secrets"
  engine kube play --network "$network" "$work/job.yaml" > "$work/play-job.log" 2>&1 ||
    { cat "$work/play-job.log"; fail "kube play of $job failed"; }
  trainer=$(engine ps -a --filter "name=$prefix-train-" --format '{{.Names}}' | head -1 || true)
  [[ -n $trainer ]] || fail "no trainer container in pod $prefix-train"
  code=$(exit_code_of "$trainer")
  engine logs "$trainer" > "$work/train.log" 2>&1
  [[ $code == 0 ]] || { tail -30 "$work/train.log"; fail "the trainer of $job exited $code"; }
  grep -Eq 'Lease [0-9]+ granted' "$work/train.log" || { head -30 "$work/train.log"; fail "no lease from quotad"; }
  grep -q '2 epochs completed' "$work/train.log" || fail "the run of $job did not complete"
  run_name=$(sed -n 's/^ *- name=//p' "$job" | head -1)
  engine run --rm "${label[@]}" --network=none --entrypoint /bin/ls -v "$prefix-yolo8-runs:/runs" "$yolo8_image" \
    "/runs/$run_name/weights/last.pt" > /dev/null || fail "no /runs/$run_name/weights/last.pt on the runs volume"
  engine pod rm -f "$prefix-train" > /dev/null
done
echo "ok: quotad's Deployment and the Job templates ran under podman kube play"
