#!/usr/bin/env bash
# quotad in its container as the Deployment runs it: database on a named volume, the policy mounted as a file (as
# the ConfigMap is), HTTPS with a certificate mounted (as the Secret is). A trainer container on the same network
# acquires, heartbeats and releases over HTTPS with the CA mounted; quotad is killed (SIGKILL) mid-run and started
# again within the lease's ttl: the trainer keeps its lease and finishes, its release is acknowledged, and the audit
# chain on the volume is intact.
source "$(dirname "$0")/lib.sh"
quotad_name=$prefix-quotad
network=$prefix-net

step "certificates, policy, network, volume"
mkdir -p "$work/tls" "$work/policy"
(
  cd "$work/tls"
  printf 'subjectAltName=DNS:%s\n' "$quotad_name" > san.ext
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=yolo8-test-ca -keyout ca.key -out ca.pem
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$quotad_name" -keyout tls.key -out tls.csr
  openssl x509 -req -in tls.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext -out tls.crt
) > "$work/openssl.log" 2>&1 || { cat "$work/openssl.log"; fail "openssl"; }
chmod 0644 "$work"/tls/*
alice_hash=$(printf %s alice-token | sha256sum | cut -d' ' -f1)
admin_hash=$(printf %s admin-token | sha256sum | cut -d' ' -f1)
# ttl 20 s with a heartbeat every second: the trainer fences 19 s after its last acknowledged heartbeat.
cat > "$work/policy/quota-policy.yaml" <<POLICY
inventory:
  nodes:
    - {name: n1, gpus: 1, memory_gib: 24}
emergency_pool: 0
users:
  admin: {role: admin, token_sha256: $admin_hash}
  alice: {token_sha256: $alice_hash}
teams:
  ta: {base: 1, burst: 1, members: [alice]}
credits: {monthly_gpu_hours: 0}
leases: {ttl_s: 20, heartbeat_interval_s: 1, expiry_grace_s: 5}
tiers: {self_service: [yolov8n]}
POLICY
chmod 0644 "$work/policy/quota-policy.yaml"
# quotad keeps one address across its restart, as a Kubernetes Service's does, and trainers find it by /etc/hosts:
# podman's DNS on this network answered slowly or stale right after a container was killed (seen: tens of seconds),
# and a restarted container with the same IP but a new MAC stays unreachable while the bridge's neighbours hold
# the old MAC (seen: over 10 s), which a cluster's Service address does not suffer from. So: static IP and MAC.
octet=$((20 + $$ % 200))
quotad_ip=10.99.$octet.10
quotad_mac=02:42:0a:63:$(printf %02x "$octet"):0a
engine network create "${label[@]}" --subnet "10.99.$octet.0/24" "$network" > /dev/null
engine volume create "${label[@]}" "$prefix-state" > /dev/null
make_dataset ds 11
# Long enough to go on well past quotad's return on an idle machine (an epoch takes about 0.2 s there).
epochs=150

start_quotad() {
  engine run -d --name "$quotad_name" "${label[@]}" --network "$network" --ip "$quotad_ip" --mac-address "$quotad_mac" --read-only --tmpfs /tmp \
    -v "$prefix-state:/var/lib/quotad" -v "$work/policy:/etc/quotad/policy:ro" -v "$work/tls:/etc/quotad/tls:ro" \
    "$quotad_image" serve --policy /etc/quotad/policy/quota-policy.yaml --db /var/lib/quotad/quotad.db \
    --listen 0.0.0.0:8443 --tls-cert /etc/quotad/tls/tls.crt --tls-key /etc/quotad/tls/tls.key > /dev/null
}
# quotad is up once its log says it serves for the Nth time (curl is not in the image: nothing but quotad is).
wait_for_quotad() {  # wait_for_quotad N
  local deadline=$((SECONDS + 30))
  until (($(engine logs "$quotad_name" 2>&1 | grep -c '^quotad: serving') >= $1)); do
    ((SECONDS < deadline)) || { engine logs "$quotad_name" | tail; fail "quotad did not start"; }
    sleep 0.2
  done
}

step "quotad with HTTPS, its database on a named volume"
start_quotad
wait_for_quotad 1

step "a trainer over HTTPS; quotad killed once epoch 1 is checkpointed, restarted 3 s later"
trainer=$prefix-trainer
engine run -d --name "$trainer" "${label[@]}" --network "$network" --add-host "$quotad_name:$quotad_ip" -v "$work:/work" \
  -v "$work/tls/ca.pem:/etc/yolo8/ca.pem:ro" -e YOLO8_QUOTA_TOKEN=alice-token -e YOLO8_QUOTA_CA_FILE=/etc/yolo8/ca.pem \
  "$yolo8_image" $(train_args run $epochs | sed "s|quota=off|quota=https://$quotad_name:8443 team=ta user=alice|") > /dev/null
wait_for_file "$work/runs/run/weights/last.pt" 180 || { engine logs "$trainer" | tail -20; fail "epoch 1 never ended"; }
engine logs "$trainer" > "$work/trainer-early.log" 2>&1
grep -q 'granted' "$work/trainer-early.log" || { tail "$work/trainer-early.log"; fail "no lease was granted"; }
engine kill -s KILL "$quotad_name" > /dev/null
killed_at=$SECONDS
[[ $(exit_code_of "$quotad_name") == 137 ]] || fail "quotad was not killed"
sleep 3
engine logs "$quotad_name" > "$work/quotad-1.log" 2>&1
engine start "$quotad_name" > /dev/null
wait_for_quotad 2
echo "quotad was away for $((SECONDS - killed_at)) s"
[[ $(engine inspect -f '{{.State.Running}}' "$trainer") == true ]] ||
  fail "the training ended before quotad came back: the restart was not tested under a running lease"
code=$(exit_code_of "$trainer")
engine logs "$trainer" > "$work/trainer.log" 2>&1
engine logs "$quotad_name" > "$work/quotad-2.log" 2>&1
show_logs() { echo "--- quotad before the kill"; cat "$work/quotad-1.log"; echo "--- quotad after the restart";
  cat "$work/quotad-2.log"; echo "--- trainer"; grep -v ' box ' "$work/trainer.log" | tail -40; }
[[ $code == 0 ]] || { show_logs; fail "the trainer exited $code, not 0"; }
grep -q "$epochs epochs completed" "$work/trainer.log" || fail "the run did not complete"
grep -Eq 'Lease [0-9]+.* released' "$work/trainer.log" || { show_logs; fail "the release was not acknowledged"; }
if grep -Eiq 'lease (lost|revoked)|expired' "$work/trainer.log"; then fail "the trainer lost its lease"; fi

step "the audit chain on the volume"
engine exec "$quotad_name" /usr/local/bin/quotad audit --verify --db /var/lib/quotad/quotad.db > "$work/verify.txt" 2>&1 ||
  { cat "$work/verify.txt"; fail "audit --verify failed"; }
cat "$work/verify.txt"
grep -q 'chain intact' "$work/verify.txt" || fail "audit chain not intact"
echo "ok: the lease survived quotad's SIGKILL and restart; release acknowledged"
