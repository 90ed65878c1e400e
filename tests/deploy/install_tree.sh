#!/bin/sh
# `meson install --destdir` of the build puts the deployment files where the units and the docs
# say: dquantd and dquant, the systemd units (cpu, gpu) with their sysusers.d snippet, the example
# dquantd.ini, the wire protocol's .proto and the man pages. Lists what was installed, then checks
# that the units start the installed dquantd with the installed configuration, that the installed
# copies equal the sources, that systemd-sysusers makes the user and socket group from the snippet,
# and that the man pages render without warnings and cover every option and subcommand of the
# programs' own --help.
#   install_tree.sh MESON BUILD_ROOT SOURCE_ROOT DQUANTD DQUANT FILE...   (FILE: expected, absolute)
set -eu
MESON=$1 BUILD=$2 SRC=$3 DQUANTD=$4 DQUANT=$5
shift 5
fail() { echo "FAIL: $*" >&2; exit 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/dquant-install-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
DEST=$TMP/dest
"$MESON" install -C "$BUILD" --no-rebuild --destdir "$DEST" > "$TMP/install.log" 2>&1 ||
    { cat "$TMP/install.log" >&2; fail "meson install --destdir"; }
echo "installed (besides headers and libraries):"
(cd "$DEST" && find . -type f | sed 's#^\.##' | grep -v -E '/include/dquant/[a-z_]+\.h$|\.so[.0-9]*$|\.pc$' | sort)

for f in "$@"; do
    [ -f "$DEST$f" ] || fail "$f was not installed"
done
unit=; gpuunit=; ini=; proto=; man8=; man1=; sysusers=
for f in "$@"; do
    case $f in
    */dquantd.service) unit=$f ;;
    */dquantd-gpu.service) gpuunit=$f ;;
    */dquantd.ini) ini=$f ;;
    */dquant.proto) proto=$f ;;
    */dquantd.8) man8=$f ;;
    */dquant.1) man1=$f ;;
    */sysusers.d/*) sysusers=$f ;;
    esac
done
[ -n "$unit" ] && [ -n "$gpuunit" ] && [ -n "$ini" ] && [ -n "$proto" ] && [ -n "$man8" ] && [ -n "$man1" ] &&
    [ -n "$sysusers" ] || fail "the expected list lacks a unit, the ini, the proto, a man page or the sysusers snippet"

cmp "$DEST$ini" "$SRC/deploy/dquantd.ini" || fail "$ini differs from deploy/dquantd.ini"
cmp "$DEST$proto" "$SRC/proto/dquant.proto" || fail "$proto differs from proto/dquant.proto"

# The units run the installed program with the installed configuration, as the sysusers user.
for u in "$unit" "$gpuunit"; do
    exec_line=$(sed -n 's/^ExecStart=//p' "$DEST$u")
    set -- $exec_line
    [ -x "$DEST$1" ] || fail "$u: ExecStart $1 is not the installed dquantd"
    conf=$(echo "$exec_line" | sed -n 's/.*--config \([^ ]*\).*/\1/p')
    [ "$conf" = "$ini" ] || fail "$u: --config ${conf:-(none)} is not the installed $ini"
    grep -qx 'User=dquantd' "$DEST$u" && grep -qx 'Group=dquant' "$DEST$u" || fail "$u: not User=dquantd, Group=dquant"
    echo "$u: ExecStart=$exec_line"
done
if command -v systemd-sysusers >/dev/null 2>&1; then
    mkdir -p "$TMP/root/etc"
    systemd-sysusers --root="$TMP/root" "$DEST$sysusers" > /dev/null 2>&1 || fail "systemd-sysusers $sysusers"
    gid=$(awk -F: '$1 == "dquant" { print $3 }' "$TMP/root/etc/group")
    [ -n "$gid" ] || fail "$sysusers made no group dquant"
    awk -F: -v g="$gid" '$1 == "dquantd" && $4 == g { ok = 1 } END { exit !ok }' "$TMP/root/etc/passwd" ||
        fail "$sysusers made no user dquantd whose primary group is dquant"
    echo "$sysusers: systemd-sysusers creates user dquantd in group dquant (gid $gid)"
else
    echo "note: no systemd-sysusers here; $sysusers not exercised"
fi

# Man pages: clean roff, an index line for whatis, every option and subcommand of --help.
if ! command -v groff >/dev/null 2>&1; then
    echo "note: no groff (apt-get install groff-base); the man pages were installed but not rendered"
    exit 0
fi
for page in "$man8" "$man1"; do
    groff -man -Tutf8 -ww -z "$DEST$page" 2> "$TMP/groff.err" || fail "groff $page"
    [ ! -s "$TMP/groff.err" ] || { cat "$TMP/groff.err" >&2; fail "groff warns about $page"; }
    if command -v lexgrog >/dev/null 2>&1; then
        lexgrog "$DEST$page" | grep -q ': "dquant' || fail "lexgrog finds no NAME line in $page"
    fi
done
MANWIDTH=200 groff -man -Tutf8 -P-cbou "$DEST$man8" > "$TMP/dquantd.txt"
MANWIDTH=200 groff -man -Tutf8 -P-cbou "$DEST$man1" > "$TMP/dquant.txt"
n=0
for opt in $("$DQUANTD" --help | grep -o -E '^ +--[a-z-]+' | tr -d ' '); do
    grep -q -e "$opt" "$TMP/dquantd.txt" || fail "$man8 lacks $opt"
    n=$((n + 1))
done
subs=$("$DQUANT" --help | sed -n '/^SUBCOMMANDS/,/^[A-Z]/p' | awk 'NF && /^ / { print $1 }')
for s in $subs; do
    S=$(echo "$s" | tr a-z A-Z)
    grep -q "^DQUANT $S" "$TMP/dquant.txt" || fail "$man1 has no section for dquant $s"
    for opt in $("$DQUANT" "$s" --help | grep -o -E '^ +--[a-z-]+' | tr -d ' ' | sort -u); do
        grep -q -e "$opt" "$TMP/dquant.txt" || fail "$man1 lacks dquant $s $opt"
    done
done
echo "man pages: $man8 covers dquantd's $n options; $man1 covers $(echo $subs | wc -w) subcommands"
