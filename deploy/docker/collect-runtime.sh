#!/bin/sh
# Lists what a runtime image needs to run the given binaries, from what the build stage linked them to:
#   OUTDIR/packages.txt   the Debian packages owning their shared libraries (for apt-get install)
#   OUTDIR/rootfs/...     copies of the libraries no package owns (e.g. a CUDA LibTorch), at their
#                         original absolute paths so RPATHs keep working
# Usage: collect-runtime.sh OUTDIR BINARY...
# Driver libraries injected at run time by the NVIDIA container toolkit may be missing at build time.
set -eu

if [ "$#" -lt 2 ]; then
  echo "usage: $0 OUTDIR BINARY..." >&2
  exit 2
fi
out=$1
shift
mkdir -p "$out/rootfs"
: > "$out/packages.unsorted"

# dpkg knows a file by the path its package shipped; with merged /usr that may differ from what ldd prints.
owner_of() {
  for candidate in "$1" "$(readlink -f "$1")"; do
    case $candidate in
      /usr/*) alt=${candidate#/usr} ;;
      *) alt=/usr$candidate ;;
    esac
    for p in "$candidate" "$alt"; do
      pkg=$(dpkg-query -S "$p" 2>/dev/null | grep -v '^diversion by' | sed -n 's/^\([^ ,]*\): .*/\1/p' | head -n 1)
      if [ -n "$pkg" ]; then
        echo "$pkg"
        return 0
      fi
    done
  done
  return 1
}

status=0
for binary in "$@"; do
  if [ ! -f "$binary" ]; then
    echo "collect-runtime: no such binary: $binary" >&2
    exit 2
  fi
  # Lines: "libx.so.1 => /path/libx.so.1 (0x...)", "/lib64/ld-linux-x86-64.so.2 (0x...)", "libx.so => not found".
  ldd "$binary" > "$out/ldd.txt"
  while read -r line; do
    case $line in
      *"=> not found"*)
        lib=${line%% *}
        case $lib in
          libcuda.so*|libnvidia-*|libnvcuvid.so*) echo "collect-runtime: $lib comes with the driver at run time" >&2 ;;
          *) echo "collect-runtime: $binary needs $lib, which is not found" >&2; status=1 ;;
        esac
        continue ;;
      *"=> /"*) path=${line#*=> }; path=${path%% (*} ;;
      /*) path=${line%% (*} ;;
      *) continue ;;
    esac
    if pkg=$(owner_of "$path"); then
      echo "$pkg" >> "$out/packages.unsorted"
    else
      # Keep both the name ldd resolved and the file it points to.
      real=$(readlink -f "$path")
      mkdir -p "$out/rootfs$(dirname "$path")" "$out/rootfs$(dirname "$real")"
      cp -a "$path" "$out/rootfs$path"
      [ "$real" = "$path" ] || cp -a "$real" "$out/rootfs$real"
    fi
  done < "$out/ldd.txt"
done
sort -u "$out/packages.unsorted" > "$out/packages.txt"
rm -f "$out/packages.unsorted" "$out/ldd.txt"
exit $status
