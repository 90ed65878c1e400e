#!/bin/sh
# The kustomize overlays render to exactly the objects checked in under
# deploy/kubernetes/rendered/ (which k8s-manifests validates). Skipped (exit 77) without kubectl or
# kustomize, neither of which Debian packages.
#   kustomize.sh SOURCE_ROOT
set -eu
src=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dquant-kustomize-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
rc=0
"$src/deploy/kubernetes/render.sh" "$tmp" || rc=$?
if [ $rc -eq 77 ]; then
    echo "SKIP: neither kustomize nor kubectl is installed; deploy/kubernetes/rendered/ not compared with the overlays"
    exit 77
fi
[ $rc -eq 0 ] || exit $rc
status=0
for v in cpu gpu; do
    rc=0
    "$here/node_check.sh" check_manifests.mjs same "$tmp/$v.yaml" "$src/deploy/kubernetes/rendered/$v.yaml" || rc=$?
    [ $rc -ne 77 ] || exit 77
    [ $rc -eq 0 ] || status=1
done
[ $status -eq 0 ] || echo "FAIL: deploy/kubernetes/rendered/ is stale; run deploy/kubernetes/render.sh" >&2
exit $status
