#!/usr/bin/env bash
# Preemption the kubelet's way, in containers: `stop -t 30` (SIGTERM, SIGKILL 30 s later) during training makes the
# trainer finish its step, write last.pt on the volume and exit 75 (not 143, not 137); a new container with
# resume=auto finishes the run, and its final weights equal an uninterrupted run's bit for bit.
source "$(dirname "$0")/lib.sh"
epochs=12
make_dataset ds 5

step "uninterrupted run"
engine run --rm "${label[@]}" --network=none -v "$work:/work" "$yolo8_image" $(train_args straight $epochs) \
  > "$work/straight.log" 2>&1 || { tail -20 "$work/straight.log"; fail "the uninterrupted run failed"; }

step "interrupted run: stopped once epoch 1 is checkpointed"
name=$prefix-chain
engine run -d --name "$name" "${label[@]}" --network=none -v "$work:/work" "$yolo8_image" \
  $(train_args chain $epochs) > /dev/null
wait_for_file "$work/runs/chain/weights/last.pt" 180 || { engine logs "$name" | tail; fail "epoch 1 never ended"; }
engine stop -t 30 "$name" > /dev/null
code=$(exit_code_of "$name")
engine logs "$name" > "$work/chain-1.log" 2>&1
engine rm "$name" > /dev/null
[[ $code == 75 ]] || { tail -20 "$work/chain-1.log"; fail "the stopped container exited $code, not 75"; }
grep -q 'completed' "$work/chain-1.log" && fail "the run completed before the stop: nothing was tested"
[[ -s $work/runs/chain/weights/last.pt ]] || fail "no last.pt on the volume after the stop"

step "resumed in a new container"
engine run --rm "${label[@]}" --network=none -v "$work:/work" "$yolo8_image" $(train_args chain $epochs) \
  > "$work/chain-2.log" 2>&1 || { tail -20 "$work/chain-2.log"; fail "the resumed run failed"; }
grep -qi 'resum' "$work/chain-2.log" || { head -20 "$work/chain-2.log"; fail "the second container did not resume"; }

step "final weights, bit for bit"
export_state_dict runs/straight/weights/last.pt straight.pt
export_state_dict runs/chain/weights/last.pt chain.pt
cmp -s "$work/straight.pt" "$work/chain.pt" || fail "the resumed run's weights differ from the uninterrupted run's"
echo "ok: stopped with exit 75, resumed, weights equal to the uninterrupted run ($(sha256sum < "$work/chain.pt" | cut -c1-16))"
