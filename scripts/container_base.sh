#!/usr/bin/env bash
# Makes the base image the Dockerfile builds FROM when no image registry is reachable: Debian bookworm, debootstrap'ed
# from the Debian mirror apt already uses, imported as localhost/debian:bookworm. Does nothing when that image exists.
# Prints the image's name. Needs podman (or docker), debootstrap and root (debootstrap creates device nodes).
#   scripts/container_base.sh            # localhost/debian:bookworm
#   BASE_IMAGE_NAME=... MIRROR=... scripts/container_base.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/container_env.sh
name=${BASE_IMAGE_NAME:-localhost/debian:bookworm}
if engine image exists "$name" 2>/dev/null || engine image inspect "$name" >/dev/null 2>&1; then
  echo "$name"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "container_base: debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }
mirror=${MIRROR:-$(apt-get indextargets --format '$(REPO_URI)' 2>/dev/null | grep -v security | head -1)}
mirror=${mirror:-http://deb.debian.org/debian/}
rootfs=$(mktemp -d "${TMPDIR:-/tmp}/yolo8-base.XXXXXX")
trap 'rm -rf "$rootfs"' EXIT
echo "container_base: debootstrap bookworm from $mirror (about a minute)" >&2
debootstrap --variant=minbase bookworm "$rootfs" "$mirror" > "$rootfs.log" 2>&1 || {
  tail -20 "$rootfs.log" >&2; rm -f "$rootfs.log"; exit 1; }
rm -f "$rootfs.log"
# The image's apt must not need the build machine's proxy or keys beyond what debootstrap put there.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | engine import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  - "$name" >/dev/null
echo "$name"
