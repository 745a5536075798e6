#!/bin/sh
# deploy/docker/collect-runtime.sh: Debian libraries become package names, others are copied at their path.
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

sh "$script" "$work/debian" "$binary" || fail "collector failed on $binary"
grep -q '^libc6\(:.*\)\{0,1\}$' "$work/debian/packages.txt" || fail "libc6 not listed"
grep -q '^libyaml-cpp' "$work/debian/packages.txt" || fail "yaml-cpp package not listed"
[ -z "$(find "$work/debian/rootfs" -type f)" ] || fail "Debian libraries were copied"

# The same library from a folder no package owns is copied, symlink and target, at its own path.
yaml=$(ldd "$binary" | sed -n 's/^[[:space:]]*\(libyaml-cpp[^ ]*\) => \([^ ]*\).*/\1 \2/p' | head -n 1)
soname=${yaml%% *}
path=${yaml#* }
[ -n "$soname" ] || fail "$binary does not link yaml-cpp dynamically"
mkdir -p "$work/lib"
cp "$(readlink -f "$path")" "$work/lib/real-$soname"
ln -s "real-$soname" "$work/lib/$soname"
LD_LIBRARY_PATH="$work/lib" sh "$script" "$work/other" "$binary" || fail "collector failed with LD_LIBRARY_PATH"
[ -L "$work/other/rootfs$work/lib/$soname" ] || fail "symlink $soname not kept"
[ -f "$work/other/rootfs$work/lib/real-$soname" ] || fail "library file not copied"
if grep -q '^libyaml-cpp' "$work/other/packages.txt"; then fail "copied library also listed as a package"; fi
grep -q '^libc6' "$work/other/packages.txt" || fail "libc6 lost"

# A binary that cannot be resolved is an error, not an empty list.
if sh "$script" "$work/none" "$work/no-such-binary" 2>/dev/null; then fail "missing binary accepted"; fi
echo "collect-runtime: ok"
