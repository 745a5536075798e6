#!/usr/bin/env bash
# A two-process data-parallel run (two CPU ranks over Gloo, started as torchrun or an indexed Job would: RANK,
# WORLD_SIZE, MASTER_ADDR/PORT) in one container, stopped the kubelet's way: tini (-g) passes SIGTERM to every
# process, both ranks stop at the same step, the container exits 75 with one checkpoint, and a new container resumes
# it to the same weights as an uninterrupted two-process run.
source "$(dirname "$0")/lib.sh"
epochs=12
make_dataset ds 9

# The container's command: both ranks, then the exit code they agree on (a shell between tini and the ranks must not
# die of the SIGTERM it also receives, hence the trap; the ranks keep the default action).
ranks_script='
RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 YOLO8_DIST_TIMEOUT=120 /usr/local/bin/yolo8 "$@" &
p0=$!
RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 YOLO8_DIST_TIMEOUT=120 /usr/local/bin/yolo8 "$@" > /work/rank1-$$.log 2>&1 &
p1=$!
trap "true" TERM
while :; do wait $p0; r0=$?; kill -0 $p0 2>/dev/null || break; done
while :; do wait $p1; r1=$?; kill -0 $p1 2>/dev/null || break; done
echo "ranks exited $r0 $r1"
[ "$r0" = "$r1" ] && exit "$r0"
exit 1'
run_ddp() {  # run_ddp [ENGINE RUN OPTIONS...] -- NAME
  local options=()
  while [[ $1 != -- ]]; do options+=("$1"); shift; done
  engine run "${options[@]}" "${label[@]}" --network=none -v "$work:/work" --entrypoint /usr/bin/tini "$yolo8_image" \
    -g -- /bin/sh -c "$ranks_script" ranks $(train_args "$2" $epochs | sed 's/batch=4/batch=8/')
}

step "uninterrupted two-rank run"
run_ddp --rm -- straight > "$work/straight.log" 2>&1 || { tail -20 "$work/straight.log"; fail "the uninterrupted run failed"; }
grep -q 'ranks exited 0 0' "$work/straight.log" || fail "ranks did not both complete"

step "two-rank run stopped once epoch 1 is checkpointed"
name=$prefix-chain
run_ddp -d --name "$name" -- chain > /dev/null
wait_for_file "$work/runs/chain/weights/last.pt" 180 || { engine logs "$name" | tail; fail "epoch 1 never ended"; }
engine stop -t 30 "$name" > /dev/null
code=$(exit_code_of "$name")
engine logs "$name" > "$work/chain-1.log" 2>&1
engine rm "$name" > /dev/null
grep -q 'ranks exited 75 75' "$work/chain-1.log" || { tail -20 "$work/chain-1.log"; fail "the ranks did not both exit 75"; }
[[ $code == 75 ]] || fail "the container exited $code, not 75"
# One checkpoint for the whole run, written by rank 0 (best.pt is the best epoch's weights, not a checkpoint).
checkpoints=$(cd "$work/runs/chain" && find . -name '*.pt' ! -path ./weights/best.pt | sort | tr '\n' ' ')
[[ $checkpoints == "./weights/last.pt " ]] || fail "checkpoints in the run folder: $checkpoints; expected only last.pt"

step "resumed in a new container"
run_ddp --rm -- chain > "$work/chain-2.log" 2>&1 || { tail -20 "$work/chain-2.log"; fail "the resumed run failed"; }
grep -q 'ranks exited 0 0' "$work/chain-2.log" || fail "ranks did not both complete after resuming"

step "final weights, bit for bit"
export_state_dict runs/straight/weights/last.pt straight.pt
export_state_dict runs/chain/weights/last.pt chain.pt
cmp -s "$work/straight.pt" "$work/chain.pt" || fail "the resumed two-rank run's weights differ from the uninterrupted one's"
echo "ok: both ranks stopped with 75 at one checkpoint, resumed, weights equal to the uninterrupted run"
