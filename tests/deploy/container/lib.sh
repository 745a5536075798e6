# Sourced by the container tests: the images `make images` built, a scratch folder the containers' user (10001) can
# write, and clean-up of every container, volume and network a test made (all labelled with the test's prefix).
# A missing engine or image fails the test (CI must not pass without running them).
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $(date +%H:%M:%S) $*"; }
source "$src/scripts/container_env.sh" || fail "no container engine (podman or docker)"
version=$(sed -n 's/^project(yolo8 VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
yolo8_image=yolo8:$version
quotad_image=yolo8-quotad:$version
for image in "$yolo8_image" "$quotad_image"; do
  engine image inspect "$image" > /dev/null 2>&1 || fail "image $image is missing: build it with make images"
done
prefix=yolo8t-$(basename "$0" .sh | tr '_' '-')-$$
work=$(mktemp -d "${TMPDIR:-/tmp}/$prefix.XXXXXX")
chmod 0777 "$work"
cleanup() {
  local ids
  ids=$(engine ps -aq --filter "label=yolo8-test=$prefix" 2>/dev/null || true)
  [[ -z $ids ]] || engine rm -f $ids > /dev/null 2>&1 || true
  # kube play's pods carry the manifest's labels, not ours: they go by name.
  ids=$(engine pod ps -q --filter "name=$prefix" 2>/dev/null || true)
  [[ -z $ids ]] || engine pod rm -f $ids > /dev/null 2>&1 || true
  for volume in $(engine volume ls -q --filter "label=yolo8-test=$prefix" 2>/dev/null || true) \
                $(engine volume ls -q 2>/dev/null | grep "^$prefix-" || true); do
    engine volume rm -f "$volume" > /dev/null 2>&1 || true
  done
  for network in $(engine network ls -q --filter "label=yolo8-test=$prefix" 2>/dev/null || true); do
    engine network rm -f "$network" > /dev/null 2>&1 || true
  done
  # Files the containers' user wrote (uid 10001) are removable by whoever ran the test.
  rm -rf "$work"
}
trap cleanup EXIT
label=(--label "yolo8-test=$prefix")

# A small dataset on the scratch folder, written by the image itself.
make_dataset() {  # make_dataset DIR_UNDER_WORK SEED
  engine run --rm "${label[@]}" --network=none -v "$work:/work" "$yolo8_image" \
    data synth out="/work/$1" train=16 val=4 imgsz=64 seed="$2" > "$work/synth-$1.log" 2>&1 ||
    { cat "$work/synth-$1.log"; fail "data synth in the image failed"; }
}

# The training arguments every test uses: tiny, CPU, deterministic, resumable.
train_args() {  # train_args NAME EPOCHS
  echo train data=/work/ds/data.yaml model=yolov8n.yaml imgsz=64 batch=4 epochs="$2" workers=1 threads=1 device=cpu \
    quota=off pretrained=false plots=false val=false project=/work/runs name="$1" exist_ok=true resume=auto
}

# Waits until FILE exists (a container wrote it) or SECONDS pass.
wait_for_file() {  # wait_for_file FILE SECONDS
  local deadline=$((SECONDS + $2))
  until [[ -e $1 ]]; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

# The state_dict export of a weights file, for comparing weights bit for bit (the export is deterministic).
export_state_dict() {  # export_state_dict WEIGHTS_UNDER_WORK OUT_UNDER_WORK
  engine run --rm "${label[@]}" --network=none -v "$work:/work" "$yolo8_image" \
    export model="/work/$1" format=state_dict out="/work/$2" > "$work/export.log" 2>&1 ||
    { cat "$work/export.log"; fail "export of $1 failed"; }
}

# The exit code of a container once it has stopped.
exit_code_of() { engine wait "$1" | tail -n 1; }
