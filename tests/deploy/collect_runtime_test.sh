#!/bin/sh
# deploy/docker/collect-runtime.sh: the libraries a binary names become Debian package names; a library no package
# owns is an error naming it; LibTorch's and CUDA's come from the image's wheels and are not listed.
# Usage: collect_runtime_test.sh COLLECT_SCRIPT BINARY   (BINARY links yaml-cpp dynamically)
set -eu
script=$1
binary=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Where yaml-cpp is not a Debian package's file (the GPU check unpacks .deb files into /tmp), the package half of
# the contract cannot be observed: skip (exit 77) rather than fail.
resolved=$(ldd "$binary" | sed -n 's/^[[:space:]]*libyaml-cpp[^ ]* => \([^ ]*\).*/\1/p' | head -n 1)
if ! command -v dpkg >/dev/null || ! dpkg -S "$(readlink -f "$resolved")" >/dev/null 2>&1 &&
   ! dpkg -S "$resolved" >/dev/null 2>&1; then
  echo "skip: yaml-cpp ($resolved) does not come from a Debian package here"
  exit 77
fi

sh "$script" "$binary" > "$work/packages.txt" || fail "collector failed on $binary"
grep -q '^libc6$' "$work/packages.txt" || fail "libc6 not listed (or listed with an architecture)"
grep -q '^libyaml-cpp' "$work/packages.txt" || fail "yaml-cpp package not listed"
if grep -q -e '^libtorch' -e '^libnvidia' -e '^libcudart' "$work/packages.txt"; then fail "LibTorch or CUDA listed"; fi
# Only what the binary names: yaml-cpp's own dependencies are apt's business.
[ "$(wc -l < "$work/packages.txt")" -le "$(readelf -d "$binary" | grep -c NEEDED)" ] || fail "more packages than NEEDED"

# The same library from a folder no package owns: the image could not start, so the collector fails naming it.
yaml=$(ldd "$binary" | sed -n 's/^[[:space:]]*\(libyaml-cpp[^ ]*\) => \([^ ]*\).*/\1 \2/p' | head -n 1)
soname=${yaml%% *}
path=${yaml#* }
[ -n "$soname" ] || fail "$binary does not link yaml-cpp dynamically"
mkdir -p "$work/lib"
cp "$(readlink -f "$path")" "$work/lib/$soname"
if LD_LIBRARY_PATH="$work/lib" sh "$script" "$binary" > "$work/other.txt" 2> "$work/other.err"; then
  fail "a library no package owns was accepted"
fi
grep -q "$soname" "$work/other.err" || fail "the error does not name $soname: $(cat "$work/other.err")"

# A binary that cannot be resolved is an error, not an empty list.
if sh "$script" "$work/no-such-binary" > /dev/null 2>&1; then fail "missing binary accepted"; fi
echo "collect-runtime: ok"
