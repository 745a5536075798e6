#!/usr/bin/env bash
# The yolo8 image on its own: it names LibTorch, CUDA 13.0, cuDNN 9 and NCCL 2 loaded from its own files (no host
# library mounted), every library its binaries need is inside it (only the driver's libcuda comes from a GPU node),
# and it trains 2 epochs on the CPU as user 10001 on a mounted dataset, writing its run folder there.
source "$(dirname "$0")/lib.sh"

step "yolo8 --version in $yolo8_image"
engine run --rm "${label[@]}" --network=none "$yolo8_image" --version > "$work/version.txt" 2>&1 ||
  { cat "$work/version.txt"; fail "yolo8 --version failed in the image"; }
cat "$work/version.txt"
grep -q '^LibTorch 2\.11\.0 (CUDA build) from /opt/torch/torch/lib/libtorch_cuda\.so$' "$work/version.txt" ||
  fail "LibTorch not named, or not from the image's /opt/torch"
grep -q '^CUDA 13\.0.*runtime 13\.0 from /opt/torch/nvidia/cu13/lib/libcudart\.so\.13' "$work/version.txt" ||
  fail "the CUDA 13.0 runtime is not loaded from the image"
grep -q '^cuDNN 9\..* loaded from /opt/torch/nvidia/cudnn/lib/libcudnn\.so\.9$' "$work/version.txt" ||
  fail "cuDNN 9 is not loaded from the image"
grep -q '^NCCL 2\..* loaded from /opt/torch/nvidia/nccl/lib/libnccl\.so\.2$' "$work/version.txt" ||
  fail "NCCL 2 is not loaded from the image"

step "every library of yolo8 and of the kept torch/CUDA files resolves inside the image"
engine run --rm "${label[@]}" --network=none --entrypoint /bin/sh "$yolo8_image" -c \
  'ldd /usr/local/bin/yolo8 /opt/torch/torch/lib/*.so* /opt/torch/nvidia/*/lib/*.so*' > "$work/ldd.txt" 2>&1 ||
  { tail -20 "$work/ldd.txt"; fail "ldd failed in the image"; }
missing=$(grep 'not found' "$work/ldd.txt" | grep -v 'libcuda\.so\.1' | sort -u || true)
[[ -z $missing ]] || fail "libraries missing from the image: $missing"

step "the quotad image has no LibTorch and its quotad starts"
engine run --rm "${label[@]}" --network=none --entrypoint /bin/sh "$quotad_image" -c \
  'ls /opt/torch 2>/dev/null; find / -xdev -name "libtorch*" 2>/dev/null; /usr/local/bin/quotad --help > /dev/null && echo ok' \
  > "$work/quotad.txt" 2>&1
[[ $(cat "$work/quotad.txt") == ok ]] || fail "quotad image: $(cat "$work/quotad.txt")"

step "labels and user"
engine image inspect --format '{{index .Labels "org.opencontainers.image.version"}} {{.Config.User}}' "$yolo8_image" \
  > "$work/inspect.txt"
[[ $(cat "$work/inspect.txt") == "$version 10001:10001" ]] || fail "image label/user: $(cat "$work/inspect.txt")"
engine image inspect --format '{{index .Labels "org.opencontainers.image.revision"}}' "$yolo8_image" |
  grep -Eq '^[0-9a-f]{40}' || fail "no source revision label"

step "2 epochs on the CPU, dataset and run folder on a mounted volume, as user 10001"
make_dataset ds 3
engine run --rm "${label[@]}" --network=none -v "$work:/work" "$yolo8_image" $(train_args two 2) \
  > "$work/train.log" 2>&1 || { tail -30 "$work/train.log"; fail "training in the image failed"; }
grep -q '2 epochs completed' "$work/train.log" || { tail -20 "$work/train.log"; fail "no completion line"; }
for file in weights/last.pt weights/best.pt results.csv args.yaml; do
  [[ -s $work/runs/two/$file ]] || fail "run folder lacks $file"
done
owner=$(stat -c %u "$work/runs/two/weights/last.pt")
[[ $owner == 10001 ]] || fail "last.pt is owned by uid $owner, not 10001"
echo "ok: image $yolo8_image ($(engine image inspect --format '{{.Size}}' "$yolo8_image") bytes)"
