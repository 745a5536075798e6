#!/usr/bin/env bash
# GpuBundle.CleanEnvironment: the bundle of scripts/gpu_bundle.sh runs `yolo8 profile` (and decodes images) where
# only torch's libraries of the same version are present, as on the GPU machine.
#   tests/scripts/bundle_test.sh BUILD_DIR [BUNDLE_DIR]
# Assembles a bundle from BUILD_DIR (NO_BUILD, NO_TAR) into a temporary folder unless BUNDLE_DIR is given, makes a
# stand-in for the GPU machine's site-packages (/tmp/fake-gpu-site.*/torch/lib, .../nvidia: hard links to the pip
# torch of .venv/torch, so nothing is copied and no path of here is named), and runs with `env -i`:
#   yolo8 --version, yolo8 profile at imgsz 64 on the CPU, yolo8 data synth + one epoch of yolo8 train (imwrite and
#   imread through the stubbed imgcodecs), the CUDA test binary, quotad's check of the measured memory table, and the
#   launcher's torch version check.
# Every library the loader initialises (LD_DEBUG=libs) must come from the bundle, the fake site, the CUDA toolkit
# (which plays the role of the GPU machine's nvidia/* packages here) or glibc / the GCC runtime; libtorch_cpu.so
# from the fake site. Exit 77 (skipped) when a prerequisite is missing: a CUDA build, .venv/torch, patchelf.
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:?usage: bundle_test.sh BUILD_DIR [BUNDLE_DIR]}
build=$(cd "$build" && pwd)
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*"; exit 1; }

[[ -x $build/trainer/yolo8 && -x $build/tests/trainer/core/trainer_core_unit_tests ]] ||
  skip "no yolo8 / trainer_core_unit_tests in $build"
"$build/trainer/yolo8" --version | grep -q "(CUDA build)" || skip "$build is not built against a CUDA LibTorch"
for tool in patchelf readelf nm cc python3 strip; do command -v $tool >/dev/null || skip "no $tool"; done
torch_lib=$(readelf -d "$build/trainer/yolo8" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p' | tr ':' '\n' |
  while read -r d; do [[ -f $d/libtorch_cpu.so ]] && { echo "$d"; break; }; done)
[[ -n $torch_lib ]] || skip "no torch lib folder in yolo8's RUNPATH"
site=$(cd "$torch_lib/../.." && pwd)

tmp=$(mktemp -d /tmp/yolo8-bundle-test.XXXXXX)
fake=$(mktemp -d /tmp/fake-gpu-site.XXXXXX)
trap 'rm -rf "$tmp" "$fake"' EXIT
bundle=${2:-}
if [[ -z $bundle ]]; then
  bundle=$tmp/bundle
  NO_BUILD=1 NO_TAR=1 BUILD_DIR=$build BUNDLE_DIR=$bundle bash "$src/scripts/gpu_bundle.sh" > "$tmp/bundle.log" 2>&1 ||
    { cat "$tmp/bundle.log"; fail "scripts/gpu_bundle.sh"; }
  tail -1 "$tmp/bundle.log"
fi
[[ -x $bundle/run ]] || fail "no launcher $bundle/run"

# The GPU machine's site-packages: torch/lib, torch/version.py and nvidia/*, hard-linked (same file system) or, where
# that fails, symbolic links would name this machine's paths, so skip instead.
mkdir -p "$fake/torch"
cp -al "$site/torch/lib" "$fake/torch/lib" 2>/dev/null || skip "cannot hard-link $site/torch/lib into /tmp"
cp "$site/torch/version.py" "$fake/torch/"
[[ -d $site/nvidia ]] && { cp -al "$site/nvidia" "$fake/nvidia" || skip "cannot hard-link $site/nvidia"; }

clean() {  # a clean environment: no LD_LIBRARY_PATH, no venv, a fresh HOME
  env -i PATH=/usr/bin:/bin HOME="$tmp/home" USER=bundletest YOLO8_TORCH_DIR="$fake/torch" "$@"
}
mkdir -p "$tmp/home"
status=0
check() {  # check NAME COMMAND...: runs it in the clean environment, LD_DEBUG=libs to a file per process
  local name=$1
  shift
  if clean LD_DEBUG=libs LD_DEBUG_OUTPUT="$tmp/ld.$name" "$@" > "$tmp/$name.log" 2>&1; then
    echo "ok: $name"
  else
    echo "FAILED: $name (exit $?):"
    tail -20 "$tmp/$name.log"
    status=1
  fi
}

check version "$bundle/run" yolo8 --version
grep -q "^LibTorch $(cat "$bundle/torch_version") (CUDA build)" "$tmp/version.log" || { cat "$tmp/version.log"; status=1; }
check profile "$bundle/run" yolo8 profile variants=n imgsz=64 batch=1,2 device=cpu threads=1 \
  project="$tmp/runs" name=profile exist_ok=true
[[ -f $tmp/runs/profile/memory-table.yaml ]] || { echo "FAILED: profile wrote no memory table"; status=1; }
if clean "$bundle/run" yolo8 data synth out="$tmp/nocv" train=1 val=1 imgsz=32 2>&1 | grep -q "needs OpenCV"; then
  echo "(this build has no OpenCV: no images to decode, data synth and train not run)"
  programs_expected=3
else
  check synth "$bundle/run" yolo8 data synth out="$tmp/ds" train=8 val=2 imgsz=64 seed=3
  check train "$bundle/run" yolo8 train data="$tmp/ds/data.yaml" model=yolov8n.yaml imgsz=64 batch=4 epochs=1 \
    workers=1 threads=1 device=cpu quota=off pretrained=false plots=false project="$tmp/runs" name=train exist_ok=true
  programs_expected=5
fi
check cuda_tests "$bundle/run" trainer_core_unit_tests --gtest_filter='*Cuda*'
if [[ -x $bundle/bin/quotad ]]; then  # quotad reads the measured table (its libraries: httplib, SQLite, prometheus)
  check quotad "$bundle/run" quotad check-policy "$src/configs/quota-policy.yaml" \
    --memory-table "$tmp/runs/profile/memory-table.yaml"
fi

# Which files the loader initialised, in every process (the loader's workers are threads; synth/train may fork).
python3 - "$tmp" "$bundle" "$fake" "$programs_expected" <<'PY' || status=1
import glob, os, re, sys
tmp, bundle, fake, expected = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
allowed_system = re.compile(r"/(libc|libm|libdl|libpthread|librt|libutil|libresolv|ld-linux-x86-64|libstdc\+\+|libgcc_s)"
                            r"\.so[.0-9]*$")
bad, torch_from = [], set()
files = glob.glob(os.path.join(tmp, "ld.*"))
if not files:
    sys.exit("FAILED: LD_DEBUG wrote nothing")
programs = 0
for path in files:
    text = open(path, errors="replace").read()
    # Only our programs: the launcher's bash, sed and cat read the same LD_DEBUG, and bash execs the program in the
    # same process (file): what our program loads starts after the previous program's "transferring control".
    ours = re.search(r"transferring control: \S*/bin/(yolo8|trainer_core_unit_tests|quotad)\b", text)
    if not ours:
        continue
    programs += 1
    before = [m.end() for m in re.finditer(r"transferring control: .*", text[:ours.start()])]
    for line in text[before[-1] if before else 0:].splitlines():
        m = re.search(r"calling init: (\S+)", line)
        if not m:
            continue
        lib = os.path.normpath(m.group(1))
        if "libtorch_cpu.so" in lib:
            torch_from.add(lib)
        if lib.startswith((os.path.realpath(bundle) + "/", bundle + "/", fake + "/")):
            continue
        if os.path.realpath(lib).startswith("/usr/local/cuda"):  # here: the GPU machine's nvidia/* packages
            continue
        if allowed_system.search(lib):
            continue
        bad.append(f"{lib} ({os.path.basename(path)})")
if programs < expected:
    sys.exit(f"FAILED: LD_DEBUG output of {programs} runs of our programs, expected {expected}")
print("libtorch_cpu.so loaded from:", ", ".join(sorted(torch_from)) or "nowhere")
if torch_from != {os.path.join(fake, "torch/lib/libtorch_cpu.so")}:
    sys.exit("FAILED: libtorch_cpu.so did not come from the fake GPU site")
if bad:
    sys.exit("FAILED: loaded from outside the bundle and the fake site:\n  " + "\n  ".join(sorted(set(bad))))
print("ok: every initialised library came from the bundle, the fake site, the CUDA toolkit or glibc/libstdc++")
PY

# As on the GPU machine: no YOLO8_TORCH_DIR, python3 finds torch (find_spec, no import) and the launcher adds every
# nvidia/*/lib beside it; its preflight finds nothing lacking.
touch "$fake/torch/__init__.py"
found=$(env -i PATH=/usr/bin:/bin PYTHONPATH="$fake" "$bundle/run" --env 2>&1)
if [[ $found != *":$fake/torch/lib"* ]]; then
  echo "FAILED: find_spec did not lead the launcher to $fake/torch: $found"; status=1
else
  echo "ok: python3's find_spec found the fake site's torch"
fi
for d in "$fake"/nvidia/*/lib; do
  [[ -d $d && $found != *"$d"* ]] && { echo "FAILED: $d is not on the launcher's library path"; status=1; }
done
[[ -d $site/nvidia ]] && echo "ok: $(ls -d "$fake"/nvidia/*/lib | wc -l) nvidia/*/lib folders on the path"
if env -i PATH=/usr/bin:/bin:/sbin PYTHONPATH="$fake" "$bundle/run" --preflight > "$tmp/preflight.log" 2>&1; then
  echo "ok: preflight: $(tail -n 1 "$tmp/preflight.log")"
else
  cat "$tmp/preflight.log"; echo "FAILED: the preflight says this machine lacks something"; status=1
fi
# A library the target lacks is named: a copy of the bundle whose yolo8 needs one that exists nowhere fails it.
cp -a "$bundle" "$tmp/lacking"
patchelf --add-needed libyolo8-absent-for-test.so.1 "$tmp/lacking/bin/yolo8"
if env -i PATH=/usr/bin:/bin:/sbin PYTHONPATH="$fake" "$tmp/lacking/run" --preflight > "$tmp/lacking.log" 2>&1; then
  echo "FAILED: the preflight missed a library nowhere to be found"; status=1
elif grep -q "^yolo8: LACKS libyolo8-absent-for-test.so.1" "$tmp/lacking.log"; then
  echo "ok: the preflight names a library the target lacks"
else
  cat "$tmp/lacking.log"; echo "FAILED: the preflight failed without naming the library"; status=1
fi

# The launcher refuses a torch of another version.
mkdir -p "$tmp/other/torch/lib"
ln -s "$fake/torch/lib/libtorch_cpu.so" "$tmp/other/torch/lib/libtorch_cpu.so"
echo "__version__ = '2.10.0+cu130'" > "$tmp/other/torch/version.py"
if env -i PATH=/usr/bin:/bin YOLO8_TORCH_DIR="$tmp/other/torch" "$bundle/run" yolo8 --version > "$tmp/other.log" 2>&1; then
  echo "FAILED: the launcher ran against torch 2.10.0"; status=1
elif grep -q "built against torch" "$tmp/other.log"; then
  echo "ok: another torch version is refused"
else
  cat "$tmp/other.log"; echo "FAILED: the launcher failed for another reason"; status=1
fi
exit $status
