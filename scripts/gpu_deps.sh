#!/usr/bin/env bash
# Run here, where Debian's registry is reachable: downloads into .deps/debs/ (ignored by git) the Debian packages a
# bare GPU machine lacks to BUILD yolo8 there without OpenCV: the fallback of scripts/gpu_check.sh when no bundle
# (scripts/gpu_bundle.sh, the usual way: build here, run there) was carried. gpu_check.sh unpacks them there into
# /tmp/yolo8-deps (dpkg -x, or Python where dpkg is missing); the device tool carries the folder:
#   run(command="scripts/gpu_check.sh", carry=[".deps/debs"])
#
# What each group is for (the configure or the compile fails without it):
#   yaml-cpp, nlohmann-json, SQLite, CLI11, GoogleTest/GoogleMock   find_package(... REQUIRED) of the project
#   cpp-httplib (header + Debian's shared library 0.11)              quota client (part of yolo8), quotad
#   OpenSSL 3, zlib, Brotli: headers (-dev) AND the runtime libraries  httplib.h includes openssl/*.h, zlib.h and
#       brotli/*.h (Debian built the library with CPPHTTPLIB_{OPENSSL,ZLIB,BROTLI}_SUPPORT, which the project
#       defines too: the macros change class layouts); tests/quota/server needs find_package(ZLIB REQUIRED).
#       The -dev packages' libX.so links are relative (libssl.so -> libssl.so.3), so the runtime package must be
#       unpacked beside them; openssl's configuration.h lives in usr/include/x86_64-linux-gnu (gpu_check.sh puts
#       it on CPATH).
#   prometheus-cpp core                                              quotad's /metrics (found on its own)
#   Howard Hinnant's date (date.h, header-only)                      the quota calendar (quota/core/calendar.cpp)
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(
  libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev libsqlite3-dev libsqlite3-0 libcli11-dev
  libcpp-httplib-dev libcpp-httplib0.11
  libssl-dev libssl3 zlib1g-dev zlib1g libbrotli-dev libbrotli1
  libgtest-dev libgmock-dev
  prometheus-cpp-dev libprometheus-cpp-core1.0
  libhowardhinnant-date-dev
)
mkdir -p .deps/debs
cd .deps/debs
rm -f ./*.deb
# A package that cannot be downloaded fails the script: a missing header shows up only on the GPU machine.
apt-get download "${packages[@]}" 2> >(grep -v '^W: Download is performed unsandboxed' >&2)
count=$(ls -1 ./*.deb | wc -l)
if (( count != ${#packages[@]} )); then
  echo "gpu_deps: expected ${#packages[@]} .deb files, got $count" >&2
  exit 1
fi
echo "gpu_deps: $count .deb files in .deps/debs, $(du -sh . | cut -f1)"
