#!/bin/sh
# The configurations the images and pods run (deploy/container/dquantd.ini,
# deploy/kubernetes/base/dquantd.ini, deploy/kubernetes/overlays/gpu/dquantd.ini) work with the
# real dquantd: each is loaded, and from a private network namespace with a non-loopback address
# (what a pod's IP is) /healthz answers on the metrics port, as the kubelet's probes need, and
# `dquant ping` with the shared secret gets through the client port. The secret lies where the
# INIs expect it, /run/secrets/dquantd/secret, on a tmpfs over /run in a private mount namespace.
# Needs root and unshare (exit 77 otherwise).
#   ini_netns.sh DQUANTD DQUANT SOURCE_ROOT
set -eu
DQUANTD=$1 DQUANT=$2 SRC=$3
if [ "$(id -u)" -ne 0 ] || ! command -v unshare >/dev/null 2>&1 || ! command -v ip >/dev/null 2>&1 ||
    ! command -v curl >/dev/null 2>&1; then
    echo "SKIP: needs root, unshare, ip and curl"
    exit 77
fi
if [ "${DQ_IN_NETNS:-}" != 1 ]; then
    if ! unshare --net --mount true 2>/dev/null; then
        echo "SKIP: cannot make network and mount namespaces here (unshare --net --mount)"
        exit 77
    fi
    DQ_IN_NETNS=1 exec unshare --net --mount "$0" "$@"
fi

fail() { echo "FAIL: $*" >&2; exit 1; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/dquant-ini-XXXXXX")
pid=
cleanup() { [ -z "$pid" ] || kill -KILL "$pid" 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
# This namespace's own address (TEST-NET-1, never routed): a veth pair, both ends here.
ip link set lo up
ip link add dq0 type veth peer name dq1
ip addr add 192.0.2.10/24 dev dq0
ip link set dq0 up
ip link set dq1 up
ADDR=192.0.2.10
mount -t tmpfs -o mode=0755 dquant-test-run /run
mkdir -p /run/secrets/dquantd
printf 'netns-test-secret\n' > /run/secrets/dquantd/secret

for ini in deploy/container/dquantd.ini deploy/kubernetes/base/dquantd.ini deploy/kubernetes/overlays/gpu/dquantd.ini; do
    mport=$(sed -n 's/^listen *= *0\.0\.0\.0:\([0-9]*\)$/\1/p' "$SRC/$ini")
    cport=$(sed -n 's#^listen *= *tcp://0\.0\.0\.0:\([0-9]*\)$#\1#p' "$SRC/$ini")
    [ -n "$mport" ] && [ -n "$cport" ] || fail "$ini: no 0.0.0.0 listeners for clients and metrics"
    "$DQUANTD" --config "$SRC/$ini" --log-level warn > "$TMP/log" 2>&1 &
    pid=$!
    ok=
    for _ in $(seq 1 100); do
        if [ "$(curl -s --max-time 1 "http://$ADDR:$mport/healthz" 2>/dev/null)" = ok ]; then ok=1; break; fi
        kill -0 "$pid" 2>/dev/null || { cat "$TMP/log" >&2; fail "$ini: dquantd exited"; }
        sleep 0.1
    done
    [ -n "$ok" ] || { cat "$TMP/log" >&2; fail "$ini: no /healthz on $ADDR:$mport"; }
    curl -s --max-time 5 "http://$ADDR:$mport/metrics" | grep -q '^dquant_' || fail "$ini: no dquant_ metrics on $ADDR:$mport"
    "$DQUANT" ping --quiet --connect "tcp://$ADDR:$cport" --secret-file /run/secrets/dquantd/secret --timeout 5000 ||
        fail "$ini: dquant ping tcp://$ADDR:$cport"
    if "$DQUANT" ping --quiet --connect "tcp://$ADDR:$cport" --secret wrong --timeout 5000 2>/dev/null; then
        fail "$ini: a wrong secret was accepted"
    fi
    kill -TERM "$pid"
    rc=0
    wait "$pid" || rc=$?
    pid=
    [ $rc -eq 0 ] || { cat "$TMP/log" >&2; fail "$ini: dquantd exited $rc on SIGTERM"; }
    echo "$ini: /healthz and /metrics on $ADDR:$mport, ping with the secret on $ADDR:$cport, clean SIGTERM"
done
