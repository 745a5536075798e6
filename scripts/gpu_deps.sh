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
#   libpq (header, library) and its runtime closure: Kerberos/GSSAPI, OpenLDAP, SASL, GnuTLS and what those load
#       quotad's PostgreSQL store, linked into yolo8 through the quota client's local mode; a bare machine has none
#       of them, and the loader needs every DT_NEEDED library even though yolo8 never opens PostgreSQL there.
# After the download every shared library in the packages is checked: each library it needs must be in the
# packages or be glibc/the GCC runtime, so a missing one fails here and not on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(
  libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev libsqlite3-dev libsqlite3-0 libcli11-dev
  libcpp-httplib-dev libcpp-httplib0.11
  libssl-dev libssl3 zlib1g-dev zlib1g libbrotli-dev libbrotli1
  libgtest-dev libgmock-dev
  prometheus-cpp-dev libprometheus-cpp-core1.0
  libhowardhinnant-date-dev
  libpq-dev libpq5
  libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2 libkeyutils1
  libldap-2.5-0 libsasl2-2 libsasl2-modules-db libdb5.3
  libgnutls30 libnettle8 libhogweed6 libgmp10 libidn2-0 libunistring2 libtasn1-6 libp11-kit0 libffi8
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
unpacked=$(mktemp -d)
trap 'rm -rf "$unpacked"' EXIT
for deb in ./*.deb; do dpkg -x "$deb" "$unpacked"; done
python3 - "$unpacked" <<'PY'
import os, re, subprocess, sys

root = sys.argv[1]
base = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libutil.so.1", "libresolv.so.2",
        "ld-linux-x86-64.so.2", "libstdc++.so.6", "libgcc_s.so.1"}
libraries = {}
for folder, _, files in os.walk(root):
    for name in files:
        if re.search(r"\.so(\.\d+)*$", name):
            libraries.setdefault(name, os.path.join(folder, name))
missing = []
for name, path in sorted(libraries.items()):
    if os.path.islink(path) and not os.path.exists(path):
        continue
    dynamic = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    for needed in re.findall(r"\(NEEDED\).*\[(.*)\]", dynamic):
        if needed not in base and needed not in libraries:
            missing.append(f"{needed} (needed by {name})")
if missing:
    sys.exit("gpu_deps: the packages lack libraries they need: " + ", ".join(sorted(set(missing))))
PY
echo "gpu_deps: $count .deb files in .deps/debs, $(du -sh . | cut -f1)"
