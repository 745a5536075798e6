#!/bin/sh
# The platform with quotad's HA variant swapped in, as deploy/README.md says (the lines quotad/pvc.yaml and
# quotad/deployment.yaml of deploy/k8s/kustomization.yaml replaced by quotad-ha), builds: one Deployment quotad
# of two replicas, its PodDisruptionBudget, no SQLite volume.
# Usage (from the repository root): quotad_ha_swap_test.sh KUBECTL
set -eu
kubectl=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r deploy/k8s "$work/k8s"
grep -q '^  - quotad/pvc.yaml$' "$work/k8s/kustomization.yaml" || fail "kustomization.yaml lists no quotad/pvc.yaml"
grep -q '^  - quotad/deployment.yaml$' "$work/k8s/kustomization.yaml" || fail "kustomization.yaml lists no quotad/deployment.yaml"
sed -i -e 's|^  - quotad/pvc.yaml$|  - quotad-ha|' -e '/^  - quotad\/deployment.yaml$/d' "$work/k8s/kustomization.yaml"
"$kubectl" kustomize "$work/k8s" > "$work/out.yaml" || fail "the platform with quotad-ha does not build"
[ "$(grep -c '^kind: Deployment$' "$work/out.yaml")" -eq 1 ] || fail "not exactly one Deployment"
grep -q '^  replicas: 2$' "$work/out.yaml" || fail "the Deployment is not two replicas"
grep -q '^kind: PodDisruptionBudget$' "$work/out.yaml" || fail "no PodDisruptionBudget"
! grep -q 'quotad-state' "$work/out.yaml" || fail "the SQLite volume is still there"
echo "ok: the platform with quotad-ha builds ($(grep -c '^kind:' "$work/out.yaml") objects)"
