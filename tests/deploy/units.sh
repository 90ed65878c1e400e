#!/bin/sh
# The installed systemd units pass `systemd-analyze verify` (syntax, every setting known, the
# ExecStart program executable) and keep their sandbox: `systemd-analyze security --offline`
# exposure at most 1.5 (cpu) and 2.0 (gpu) out of 10, and the settings issue 17 asks for.
# Skipped (exit 77, with the reason) where systemd-analyze is missing or cannot run here.
#   units.sh MESON BUILD_ROOT UNITDIR
set -eu
MESON=$1 BUILD=$2 UNITDIR=$3
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v systemd-analyze >/dev/null 2>&1 || { echo "SKIP: no systemd-analyze (apt-get install systemd)"; exit 77; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/dquant-units-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
# Can systemd-analyze verify anything in this environment (some containers lack what it needs)?
mkdir "$TMP/probe"
printf '[Service]\nExecStart=/bin/true\n' > "$TMP/probe/probe.service"
if ! systemd-analyze verify --man=no "$TMP/probe/probe.service" > "$TMP/probe.log" 2>&1; then
    echo "SKIP: systemd-analyze verify cannot run here (even a trivial unit fails):"
    cat "$TMP/probe.log"
    exit 77
fi

DEST=$TMP/dest
"$MESON" install -C "$BUILD" --no-rebuild --destdir "$DEST" > "$TMP/install.log" 2>&1 ||
    { cat "$TMP/install.log" >&2; fail "meson install --destdir"; }
# verify checks that ExecStart's program exists: point it into DESTDIR, change nothing else.
mkdir "$TMP/units"
for u in dquantd dquantd-gpu; do
    sed "s#^ExecStart=#ExecStart=$DEST#" "$DEST$UNITDIR/$u.service" > "$TMP/units/$u.service"
done
systemd-analyze verify --man=no "$TMP/units/dquantd.service" "$TMP/units/dquantd-gpu.service" ||
    fail "systemd-analyze verify"
echo "systemd-analyze verify: dquantd.service, dquantd-gpu.service clean"

exposure() {
    systemd-analyze security --offline=yes "$1" 2>/dev/null | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p'
}
for pair in dquantd:1.5 dquantd-gpu:2.0; do
    u=${pair%%:*} max=${pair#*:}
    e=$(exposure "$TMP/units/$u.service")
    [ -n "$e" ] || fail "systemd-analyze security gave no exposure for $u"
    awk -v e="$e" -v m="$max" 'BEGIN { exit !(e <= m) }' || fail "$u.service: exposure $e > $max"
    echo "$u.service: exposure $e (at most $max)"
done

has() { grep -q -x -e "$2" "$TMP/units/$1.service" || fail "$1.service lacks $2"; }
hasnt() { ! grep -q -e "$2" "$TMP/units/$1.service" || fail "$1.service has $2"; }
for u in dquantd dquantd-gpu; do
    has $u 'Type=notify'
    has $u 'User=dquantd'
    has $u 'Group=dquant'
    has $u 'RuntimeDirectory=dquantd'
    has $u 'UMask=0007'
    has $u 'ProtectProc=invisible'
    has $u 'SystemCallFilter=@system-service'
    has $u 'NoNewPrivileges=yes'
done
has dquantd 'PrivateDevices=yes'
has dquantd 'MemoryDenyWriteExecute=yes'
has dquantd-gpu 'DevicePolicy=closed'
has dquantd-gpu 'DeviceAllow=char-nvidia\* rw'
hasnt dquantd-gpu '^PrivateDevices='
echo "both units: notify, user dquantd, socket group dquant, ProtectProc, SystemCallFilter; gpu: NVIDIA devices only"
