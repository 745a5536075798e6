#!/bin/sh
# Every image deploy/ names is one `make images` builds: yolo8:VERSION or yolo8-quotad:VERSION (VERSION: the project's,
# from CMakeLists.txt), and scripts/images.sh tags exactly those two.
# Usage (from the repository root): image_names_test.sh VERSION
set -eu
version=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
found=0
for name in $(grep -rhoE '^[[:space:]]*(- )?image:[[:space:]]*[^[:space:]]+' deploy/k8s | sed 's/.*image:[[:space:]]*//'); do
  case $name in
    "yolo8:$version"|"yolo8-quotad:$version") found=$((found + 1)) ;;
    *) fail "deploy/k8s names image $name; make images builds yolo8:$version and yolo8-quotad:$version" ;;
  esac
done
[ "$found" -ge 4 ] || fail "only $found image references found in deploy/k8s (expected the Deployment and 3 Jobs)"
grep -q "newTag: $version\$" deploy/k8s/kustomization.yaml || fail "deploy/k8s/kustomization.yaml's newTag is not $version"
grep -q '"yolo8:$tag"' scripts/images.sh || fail "scripts/images.sh does not tag yolo8:\$tag"
grep -q '"yolo8-quotad:$tag"' scripts/images.sh || fail "scripts/images.sh does not tag yolo8-quotad:\$tag"
grep -q "^project(yolo8 VERSION $version " CMakeLists.txt || fail "CMakeLists.txt's version is not $version"
echo "ok: $found image references, all yolo8:$version or yolo8-quotad:$version"
