#!/usr/bin/env bash
# Build here, run there: the `yolo8` binary and the CUDA test binary, built on our machines against the same torch
# build the GPU machine has (PyPI's 2.11.0+cu130, .venv/torch), with the non-torch shared libraries they need, in
# one folder that runs against the target machine's own torch libraries. scripts/gpu_check.sh uses it.
#
#   scripts/gpu_bundle.sh                               # configures/builds BUILD_DIR (default build-gpu), -j1
#   NO_BUILD=1 BUILD_DIR=build scripts/gpu_bundle.sh    # assembles from an existing build, builds nothing
#   BUNDLE_DIR=/tmp/b NO_TAR=1 ...                       # elsewhere, unpacked only (tests/scripts/bundle_test.sh)
#   then: run(command="scripts/gpu_check.sh", carry=[".deps/bundle.tar.xz"])
#
# Writes .deps/bundle/ (bin/ lib/ run MANIFEST.txt) and .deps/bundle.tar.xz (what travels). Inside:
#   bin/yolo8, bin/trainer_core_unit_tests (the TrainStepCuda tests: the only executable with tests that need a GPU)
#     stripped, RUNPATH set to $ORIGIN/../lib: our build's RUNPATH names this machine's .venv/torch (and RUNPATH, not
#     RPATH, is what Debian's linker writes, so LD_LIBRARY_PATH would win anyway; the copies name nothing of here)
#   lib/  every library `readelf -d` lists, recursively, that is NOT
#     - glibc (libc, libm, libdl, libpthread, librt, libutil, libresolv, ld-linux) or the GCC runtime (libstdc++,
#       libgcc_s): every base image has them, and torch's own libraries need the target's libstdc++, not ours
#       (MANIFEST.txt records the newest GLIBC_/GLIBCXX_ versions the carried files need);
#     - in the torch wheel's lib folder (libtorch*, libc10*, libgomp ...) or CUDA's (libcudart, libcublas*, libcudnn*,
#       libnccl, libcufft, libcurand, libcusparse*, libnvJitLink, libnvshmem*, libcufile, libcupti, libnvrtc; the
#       driver's libcuda and libnvidia-ml): the target's torch and its nvidia/* packages provide them;
#     - a stubbed library (STUB_LIBS): Debian's OpenCV imgcodecs links GDAL and GDCM (139 libraries, 185 MB) for
#       GeoTIFF and DICOM, which yolo8 never reads (cv::imread uses GDAL only under IMREAD_LOAD_GDAL, and the DICOM
#       decoder calls GDCM only to decode a DICOM file). The bundle carries, under their sonames, stubs defining
#       exactly the symbols the carried files import from them; each stub aborts with a message if ever called.
#     Everything else travels, zlib and OpenSSL included (not every slim base image has them).
#   run   the launcher: `run PROGRAM ARGS...` sets LD_LIBRARY_PATH to lib/, the target's torch/lib and the nvidia/*/lib
#         folders beside it (torch found by python3, or YOLO8_TORCH_DIR=.../site-packages/torch), checks the torch
#         version against the one built with, and execs bin/PROGRAM.
# The carried working tree (tracked files 37.7 MiB on 2026-12-04) and the bundle (15.6 MiB packed from its own build)
# must stay under the device tool's 64 MiB: the script measures both and fails when the sum does not fit. The
# fallback's .deps/debs (15 MiB with libpq's runtime closure) travels instead of the bundle, not beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build_dir=${BUILD_DIR:-build-gpu}
bundle=${BUNDLE_DIR:-$root/.deps/bundle}
tarball=${BUNDLE_TAR:-$root/.deps/bundle.tar.xz}
stub_libs=${STUB_LIBS:-libgdal.so.32 libgdcmMSFF.so.3.0 libgdcmDSED.so.3.0}
# Stub functions that return instead of aborting: OpenCV's GDAL decoder, one of imgcodecs' decoders, calls
# GDALAllRegister when the codec list is built (first imread/imwrite); registering no GDAL driver is what we want.
stub_noop=${STUB_NOOP:-GDALAllRegister}
limit_mib=${CARRY_LIMIT_MIB:-64}
programs=(trainer/yolo8 tests/trainer/core/trainer_core_unit_tests)
# quotad, where built: only to check the measured memory table with `quotad check-policy` there (~2 MB more).
optional=(quota/quotad)

torch_cmake=$(ls -d "$root"/.venv/torch/lib/python3*/site-packages/torch/share/cmake/Torch 2>/dev/null | head -1 || true)
if [[ -z ${NO_BUILD:-} ]]; then
  if [[ ! -f $build_dir/CMakeCache.txt ]]; then
    [[ -n $torch_cmake ]] || { echo "gpu_bundle: no .venv/torch (scripts/pyenv.sh torch)" >&2; exit 1; }
    torch_dir=$(cd "$torch_cmake/../../.." && pwd -P)
    # Caffe2_DIR and three libraries by path: TorchConfig.cmake's find_package(Caffe2 PATHS) and find_library(PATHS)
    # search the system first, and Debian's libtorch-dev (1.13) in /usr/lib would be mixed with the wheel.
    # (CMAKE_PREFIX_PATH=torch would also make FindProtobuf take the wheel's protobuf 3.13 headers for libonnx.)
    # Without ONNX (export and OpenCV DNN's .onnx predict, which the check never runs): 10 MB of libonnx, protobuf
    # and opencv_dnn less to carry, so the build-there fallback's packages fit beside the bundle.
    cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DYOLO8_REQUIRE_CUDA=ON \
      -DYOLO8_BUILD_BENCHMARKS=OFF -DCMAKE_DISABLE_FIND_PACKAGE_ONNX=ON -DTorch_DIR="$torch_dir/share/cmake/Torch" \
      -DCaffe2_DIR="$torch_dir/share/cmake/Caffe2" \
      -DTORCH_LIBRARY="$torch_dir/lib/libtorch.so" -Dc10_LIBRARY="$torch_dir/lib/libc10.so" \
      -DC10_CUDA_LIBRARY="$torch_dir/lib/libc10_cuda.so"
  fi
  nice -n 10 cmake --build "$build_dir" --target yolo8 trainer_core_unit_tests quotad -- -j"${BUILD_JOBS:-1}"
fi
for p in "${programs[@]}"; do
  [[ -x $build_dir/$p ]] || { echo "gpu_bundle: $build_dir/$p is missing (build it, or unset NO_BUILD)" >&2; exit 1; }
done
version=$("$build_dir/trainer/yolo8" --version)
echo "$version"
grep -q "(CUDA build)" <<<"$version" || { echo "gpu_bundle: $build_dir/trainer/yolo8 is not a CUDA build" >&2; exit 1; }
torch_version=$(sed -n 's/^LibTorch \([0-9.]*\).*/\1/p' <<<"$version")
# The torch the binaries were linked with: its lib folder decides which needed libraries are torch's.
torch_lib=$(readelf -d "$build_dir/trainer/yolo8" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p' | tr ':' '\n' |
  while read -r d; do [[ -f $d/libtorch_cpu.so ]] && { echo "$d"; break; }; done || true)
[[ -n $torch_lib ]] || { echo "gpu_bundle: no torch lib folder in the RUNPATH of $build_dir/trainer/yolo8" >&2; exit 1; }
command -v patchelf >/dev/null || { echo "gpu_bundle: needs patchelf (Debian: apt-get install patchelf)" >&2; exit 1; }

for p in "${optional[@]}"; do [[ -x $build_dir/$p ]] && programs+=("$p"); done
rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
for p in "${programs[@]}"; do
  cp "$build_dir/$p" "$bundle/bin/"
  strip --strip-unneeded "$bundle/bin/$(basename "$p")"
  patchelf --set-rpath '$ORIGIN/../lib' "$bundle/bin/$(basename "$p")"
done

# The libraries: a walk over DT_NEEDED from the binaries, resolved as this machine's loader would (ldconfig's cache),
# then stubs for STUB_LIBS generated from the real libraries' symbol tables.
python3 - "$bundle" "$torch_lib" "$stub_libs" "$stub_noop" <<'PY'
import os, re, shutil, subprocess, sys

bundle, torch_lib, stubs, noop = sys.argv[1], sys.argv[2], set(sys.argv[3].split()), set(sys.argv[4].split())
SYSTEM = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libutil.so.1", "libresolv.so.2",
          "ld-linux-x86-64.so.2", "libstdc++.so.6", "libgcc_s.so.1"}
CUDA = re.compile(r"^lib(cuda|cudart|cublas|cublasLt|cudnn\w*|nccl|cufft\w*|curand|cusparse\w*|cusolver\w*|nvJitLink|"
                  r"nvrtc\w*|nvshmem\w*|cufile\w*|cupti|nvToolsExt|nvidia-ml|nvperf\w*|torch\w*|c10\w*|gomp)[.-]")

def needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\).*\[(.*)\]", out)

cache = {}
for line in subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout.splitlines():
    m = re.match(r"\s+(\S+) \(libc6,x86-64[^)]*\) => (\S+)", line)
    if m:
        cache.setdefault(m.group(1), m.group(2))

def excluded(name):
    return name in SYSTEM or os.path.exists(os.path.join(torch_lib, name)) or CUDA.match(name)

carried, stubbed, todo = {}, {}, [os.path.join(bundle, "bin", b) for b in os.listdir(os.path.join(bundle, "bin"))]
importers = {}  # stub name -> files that import from it
while todo:
    path = todo.pop()
    for name in needed(path):
        if excluded(name):
            continue
        if name in stubs:
            importers.setdefault(name, set()).add(path)
            continue
        if name in carried:
            continue
        if name not in cache:
            sys.exit(f"gpu_bundle: {name} (needed by {path}) is not known to ldconfig here")
        carried[name] = os.path.realpath(cache[name])
        shutil.copy2(carried[name], os.path.join(bundle, "lib", name))
        todo.append(os.path.join(bundle, "lib", name))

def dynsyms(path, defined):
    flag = "--defined-only" if defined else "--undefined-only"
    out = subprocess.run(["nm", "-D", flag, path], capture_output=True, text=True, check=True).stdout
    syms = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            syms[parts[-1].split("@")[0]] = parts[-2] if defined else "U"
    return syms

lib_dir = os.path.join(bundle, "lib")
for name, users in sorted(importers.items()):
    real = cache.get(name)
    if not real:
        sys.exit(f"gpu_bundle: cannot stub {name}: the real library is not installed here (its symbol table decides)")
    provided = dynsyms(real, True)
    wanted = set()
    for user in users:
        wanted |= set(dynsyms(user, False)) & set(provided)
    # Only functions can be stubbed this way; a data symbol would need its real size and contents.
    data = sorted(s for s in wanted if provided[s] not in "TtWwi")
    if data:
        sys.exit(f"gpu_bundle: {name}: data symbols cannot be stubbed: {data}")
    src = os.path.join(lib_dir, name + ".c")
    with open(src, "w") as f:
        f.write("#include <stdio.h>\n#include <stdlib.h>\n"
                "static void fail(const char* s) {\n"
                f"  fprintf(stderr, \"yolo8 bundle: %s called, but {name} is a stub (scripts/gpu_bundle.sh)\\n\", s);\n"
                "  abort();\n}\n")
        for i, s in enumerate(sorted(wanted)):
            body = "" if s in noop else f"fail(\"{s}\");"
            f.write(f"void stub{i}(void) __asm__(\"{s}\");\nvoid stub{i}(void) {{ {body} }}\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-s", f"-Wl,-soname,{name}", "-o", os.path.join(lib_dir, name),
                    src], check=True)
    os.remove(src)
    stubbed[name] = sorted(wanted)

with open(os.path.join(bundle, "libs.txt"), "w") as f:
    for name, real in sorted(carried.items()):
        f.write(f"{name}\t{real}\t{os.path.getsize(real)}\n")
    for name, syms in sorted(stubbed.items()):
        f.write(f"{name}\tSTUB ({len(syms)} functions, {' '.join(s + (' (no-op)' if s in noop else '') for s in syms)})\t{os.path.getsize(os.path.join(lib_dir, name))}\n")
print(f"gpu_bundle: {len(carried)} libraries carried, {len(stubbed)} stubbed")
PY
for f in "$bundle"/lib/*; do
  if readelf -d "$f" | grep -q "R\(UN\)\{0,1\}PATH"; then patchelf --remove-rpath "$f"; fi
done

# The newest symbol versions needed from what the target must provide (glibc, libstdc++).
glibc_max=$(for f in "$bundle"/bin/* "$bundle"/lib/*; do objdump -T "$f"; done | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
glibcxx_max=$(for f in "$bundle"/bin/* "$bundle"/lib/*; do objdump -T "$f"; done | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -1)
echo "$torch_version" > "$bundle/torch_version"
printf '%s\n%s\n' "${glibc_max#GLIBC_}" "${glibcxx_max#GLIBCXX_}" > "$bundle/needs"
cat > "$bundle/run" <<'SH'
#!/usr/bin/env bash
# Launcher of the yolo8 bundle (scripts/gpu_bundle.sh): run PROGRAM [ARGS...] with this folder's libraries and the
# target machine's torch. YOLO8_TORCH_DIR=.../site-packages/torch overrides python3's torch. `run --env` prints the
# library path it would use; `run --ldd PROGRAM` shows what the loader resolves; `run --preflight` says what this
# machine lacks (glibc, libstdc++, libraries) and exits 1 when anything is.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
torch_dir=${YOLO8_TORCH_DIR:-}
if [[ -z $torch_dir ]]; then
  # find_spec locates the package without importing it (no CUDA initialisation, no second of import time).
  torch_dir=$("${PYTHON:-python3}" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("torch").origin))' 2>/dev/null) ||
    { echo "yolo8 bundle: python3 has no torch; set YOLO8_TORCH_DIR=.../site-packages/torch" >&2; exit 127; }
fi
[[ -f $torch_dir/lib/libtorch_cpu.so ]] || { echo "yolo8 bundle: no libtorch_cpu.so in $torch_dir/lib" >&2; exit 127; }
want=$(cat "$here/torch_version")
have=$(sed -n "s/^__version__ = '\([0-9.]*\).*/\1/p" "$torch_dir/version.py" 2>/dev/null || true)
if [[ $have != "$want" && -z ${YOLO8_BUNDLE_ANY_TORCH:-} ]]; then
  echo "yolo8 bundle: built against torch $want, but $torch_dir is torch ${have:-of unknown version}" \
       "(YOLO8_BUNDLE_ANY_TORCH=1 runs it anyway)" >&2
  exit 127
fi
path=$here/lib:$torch_dir/lib
for d in "$(dirname "$torch_dir")"/nvidia/*/lib; do [[ -d $d ]] && path=$path:$d; done
export LD_LIBRARY_PATH=$path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
preflight() {  # what this machine lacks for the bundle: glibc, libstdc++, any library the loader cannot find
  local lacks=0 need_glibc need_glibcxx have_glibc libstdcxx have_glibcxx p missing
  { read -r need_glibc; read -r need_glibcxx; } < "$here/needs"
  have_glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  echo "glibc: needs >= $need_glibc, has ${have_glibc:-unknown}"
  if [[ -z $have_glibc || $(printf '%s\n%s\n' "$need_glibc" "$have_glibc" | sort -V | head -n 1) != "$need_glibc" ]]; then
    echo "  LACKS: glibc $need_glibc"; lacks=1
  fi
  libstdcxx=$(/sbin/ldconfig -p 2>/dev/null | sed -n 's/.*libstdc++.so.6 (libc6,x86-64) => //p' | head -n 1)
  have_glibcxx=$( { [[ -n $libstdcxx ]] && grep -ao 'GLIBCXX_[0-9.]*' "$libstdcxx" || true; } 2>/dev/null | sort -uV | tail -n 1)
  echo "libstdc++: needs >= GLIBCXX_$need_glibcxx, has ${have_glibcxx:-none} (${libstdcxx:-not found})"
  if [[ -z $have_glibcxx || $(printf '%s\n%s\n' "$need_glibcxx" "${have_glibcxx#GLIBCXX_}" | sort -V | head -n 1) != "$need_glibcxx" ]]; then
    echo "  LACKS: libstdc++ with GLIBCXX_$need_glibcxx"; lacks=1
  fi
  echo "torch: $torch_dir (${have:-unknown version}); nvidia/*/lib: $(ls -d "$(dirname "$torch_dir")"/nvidia/*/lib 2>/dev/null | wc -l) folders"
  for p in "$here"/bin/*; do
    missing=$( (ldd "$p" 2>&1 || true) | awk '/not found/ {print $1}' | sort -u | tr '\n' ' ')
    if [[ -n $missing ]]; then echo "$(basename "$p"): LACKS $missing"; lacks=1; else echo "$(basename "$p"): every library found"; fi
  done
  (( lacks == 0 )) && echo "preflight: nothing lacking" || echo "preflight: the target lacks what is marked LACKS"
  return "$lacks"
}
case ${1:-} in
  --env) echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; exit 0 ;;
  --preflight) preflight; exit $? ;;
  --ldd) exec ldd "$here/bin/$2" ;;
  ''|-h|--help) echo "usage: $0 PROGRAM [ARGS...]   programs: $(ls "$here/bin" | tr '\n' ' ')"; exit 2 ;;
esac
program=$here/bin/$1
shift
[[ -x $program ]] || { echo "yolo8 bundle: no program $program" >&2; exit 127; }
exec "$program" "$@"
SH
chmod +x "$bundle/run"

size=$(du -sb "$bundle" | cut -f1)
# What else travels with a carried path: tracked files plus untracked ones git does not ignore.
tree=$( (git ls-files -z --cached --others --exclude-standard 2>/dev/null || true) | xargs -0 -r stat -c %s 2>/dev/null |
  awk '{s += $1} END {print s + 0}')
commit=$(git rev-parse --short HEAD 2>/dev/null || echo "no git")
if git rev-parse -q HEAD >/dev/null 2>&1 && ! git diff --quiet HEAD; then commit="$commit+changes"; fi
{
  echo "yolo8 bundle, made $(date -u +%FT%TZ) by scripts/gpu_bundle.sh from $commit"
  echo "build dir: $(cd "$build_dir" && pwd -P)"
  echo "$version" | sed 's/^/  /'
  echo "torch built against: $torch_version ($torch_lib)"
  echo "needs from the target: glibc >= ${glibc_max#GLIBC_}, libstdc++ >= ${glibcxx_max#GLIBCXX_}, torch $torch_version with its nvidia/* libraries"
  echo "size: $size bytes unpacked"
  echo "programs:"; ls -l "$bundle/bin" | tail -n +2 | awk '{print "  " $5 "\t" $9}'
  echo "libraries (soname, copied from, bytes):"; sed 's/^/  /' "$bundle/libs.txt"
} > "$bundle/MANIFEST.txt"
cat "$bundle/MANIFEST.txt"
if [[ -n ${NO_TAR:-} ]]; then
  echo "gpu_bundle: $(( size / 1048576 )) MiB unpacked in $bundle (NO_TAR: nothing packed)"
  exit 0
fi
rm -f "$tarball"
tar -C "$(dirname "$bundle")" -cf - "$(basename "$bundle")" | xz -T2 -6 > "$tarball"
packed=$(stat -c %s "$tarball")
total=$(( packed + tree ))
echo "gpu_bundle: $(( size / 1048576 )) MiB unpacked, $(( packed / 1048576 )) MiB packed; with the working tree" \
     "$(( total / 1048576 )) MiB of the device tool's $limit_mib MiB"
if (( total > limit_mib * 1048576 )); then
  echo "gpu_bundle: too large to carry" >&2
  exit 1
fi
# The build-there fallback's packages (scripts/gpu_deps.sh) travel instead of the bundle: say whether both would fit.
if [[ -d $root/.deps/debs ]]; then
  debs=$(du -sb "$root/.deps/debs" | cut -f1)
  fits=$(( total + debs <= limit_mib * 1048576 ))
  echo "gpu_bundle: with the fallback's .deps/debs ($(( debs / 1048576 )) MiB): $(( (total + debs) / 1048576 )) MiB of" \
       "$limit_mib MiB ($( ((fits)) && echo "both fit in one call" || echo "carry one or the other"))"
fi
