#!/bin/sh
# Lists the Debian packages a runtime image must install for the given binaries: the owners of the shared libraries
# they name (their NEEDED entries), as this (Debian bookworm) build machine resolved them; apt brings the rest. LibTorch and CUDA are not listed: the image takes
# them from the pinned wheels (deploy/docker/torch-runtime-libs.txt). A library that neither a package nor the
# wheels provide is an error: the image would not start.
# Usage: collect-runtime.sh BINARY... > packages.txt
set -eu

if [ "$#" -lt 1 ]; then
  echo "usage: $0 BINARY... > packages.txt" >&2
  exit 2
fi

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

# The sonames the wheels provide (torch's lib/ and CUDA's), resolved on the build machine from .venv/torch or the
# system CUDA toolkit.
from_wheels() {
  case $1 in
    libtorch*|libc10*|libcaffe2*|libgomp.so.1|libshm.so) return 0 ;;
    libcudart.so*|libcublas*|libcufft.so*|libcurand.so*|libcusparse*|libcufile.so*|libnvJitLink.so*) return 0 ;;
    libcupti.so*|libcudnn*|libnccl.so*|libnvshmem*|libnvrtc*) return 0 ;;
    # the NVIDIA driver's own libraries come from the node (NVIDIA container toolkit)
    libcuda.so*|libnvidia-*) return 0 ;;
  esac
  return 1
}

status=0
listed=$(mktemp)
trap 'rm -f "$listed"' EXIT
for binary in "$@"; do
  if [ ! -f "$binary" ]; then
    echo "collect-runtime: no such binary: $binary" >&2
    exit 2
  fi
  needed=" $(readelf -d "$binary" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ') "
  # Lines: "libx.so.1 => /path/libx.so.1 (0x...)", "/lib64/ld-linux-x86-64.so.2 (0x...)", "libx.so => not found".
  ldd "$binary" | while read -r line; do
    case $line in
      *"=> not found"*) name=${line%% *}; path= ;;
      *"=> /"*) name=${line%% *}; path=${line#*=> }; path=${path%% (*} ;;
      *) continue ;;
    esac
    case $needed in *" $name "*) ;; *) continue ;; esac
    from_wheels "$name" && continue
    if [ -n "$path" ] && pkg=$(owner_of "$path"); then
      echo "${pkg%:*}"
    else
      echo "collect-runtime: $binary needs $name (${path:-not found}), which no Debian package here owns" >&2
      echo "!error"
    fi
  done >> "$listed"
done
if grep -q '^!error$' "$listed"; then status=1; fi
grep -v '^!error$' "$listed" | sort -u
exit $status
