#!/bin/sh
# Runs one of the node checkers of this folder with the packages scripts/setup.sh installed
# (npm ci into tests/deploy/node_modules). Without them the test is skipped (exit 77), except in
# CI (CI=true), where setup.sh must have installed them.
#   node_check.sh SCRIPT.mjs ARGS...
set -eu
here=$(cd "$(dirname "$0")" && pwd)
missing=
command -v node >/dev/null 2>&1 || missing="node"
[ -d "$here/node_modules/kubernetes-models" ] || missing="${missing:+$missing, }$here/node_modules (npm ci)"
if [ -n "$missing" ]; then
    if [ "${CI:-}" = true ]; then
        echo "FAIL: missing $missing; scripts/setup.sh installs them" >&2
        exit 1
    fi
    echo "SKIP: missing $missing; run scripts/setup.sh"
    exit 77
fi
script=$1
shift
exec node "$here/$script" "$@"
