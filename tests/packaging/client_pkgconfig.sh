#!/bin/sh
# Installs the build into a temporary DESTDIR, then checks what a CPU-only engine process sees of
# libdquant-client there: the installed library needs no CUDA and no NCCL (readelf -d), its .pc
# names nothing of CUDA, and a small program built with `pkgconf --cflags --libs libdquant-client`
# against that tree links and runs (cpu_only_client.c). The tree is addressed the way a package
# build does it, PKG_CONFIG_SYSROOT_DIR=DESTDIR (--define-prefix cannot: it takes the prefix two
# folders above the .pc, and a multiarch libdir such as lib/x86_64-linux-gnu is three deep).
#
#   client_pkgconfig.sh MESON PKGCONF BUILD_ROOT CC PREFIX LIBDIR SOURCE [EXTRA_CFLAGS...]
set -eu
MESON=$1 PKGCONF=$2 BUILD=$3 CC=$4 PREFIX=$5 LIBDIR=$6 SRC=$7
shift 7

fail() { echo "FAIL: $*" >&2; exit 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/dquant-packaging-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
DEST=$TMP/dest
case $LIBDIR in /*) ;; *) LIBDIR=$PREFIX/$LIBDIR ;; esac
LIB=$DEST$LIBDIR
PCDIR=$LIB/pkgconfig

"$MESON" install -C "$BUILD" --no-rebuild --destdir "$DEST" > "$TMP/install.log" 2>&1 ||
    { cat "$TMP/install.log" >&2; fail "meson install --destdir"; }

SO=$LIB/libdquant-client.so
[ -e "$SO" ] || fail "$SO not installed"
[ -f "$PCDIR/libdquant-client.pc" ] || fail "$PCDIR/libdquant-client.pc not installed"

echo "readelf -d $SO:"
readelf -d "$SO" | grep -E 'NEEDED|RPATH|RUNPATH' || true
if readelf -d "$SO" | grep -E 'NEEDED|RPATH|RUNPATH' | grep -Ei 'cuda|nccl'; then
    fail "libdquant-client.so depends on CUDA or NCCL"
fi
echo "libdquant-client.pc:"
cat "$PCDIR/libdquant-client.pc"
if grep -Ei 'cuda|nccl' "$PCDIR/libdquant-client.pc"; then
    fail "libdquant-client.pc mentions CUDA or NCCL"
fi

# Where NCCL was found, its data path is the separate libdquant-client-nccl, on top of this one.
if [ -f "$PCDIR/libdquant-client-nccl.pc" ]; then
    grep -q '^Requires:.*libdquant-client = ' "$PCDIR/libdquant-client-nccl.pc" ||
        fail "libdquant-client-nccl.pc does not require libdquant-client"
    echo "libdquant-client-nccl.so:"
    readelf -d "$LIB/libdquant-client-nccl.so" | grep NEEDED
fi

# Only the installed tree and the system's own .pc files (libprotobuf-c, libxxhash).
SYSPC=$("$PKGCONF" --variable pc_path pkg-config 2>/dev/null || true)
FLAGS=$(PKG_CONFIG_PATH= PKG_CONFIG_LIBDIR="$PCDIR${SYSPC:+:$SYSPC}" PKG_CONFIG_SYSROOT_DIR="$DEST" \
        "$PKGCONF" --cflags --libs libdquant-client) || fail "pkgconf libdquant-client"
echo "pkgconf --cflags --libs libdquant-client: $FLAGS"
case $FLAGS in *"$DEST"*) ;; *) fail "pkgconf flags do not point into $DEST" ;; esac
if echo "$FLAGS" | grep -Eqi 'cuda|nccl'; then
    fail "pkgconf flags mention CUDA or NCCL"
fi

# shellcheck disable=SC2086 # FLAGS is a list of words
"$CC" "$@" -o "$TMP/cpu_only_client" "$SRC" $FLAGS || fail "compiling and linking $SRC"
LD_LIBRARY_PATH=$LIB "$TMP/cpu_only_client" || fail "cpu_only_client"
LOADED=$(LD_LIBRARY_PATH=$LIB ldd "$TMP/cpu_only_client")
echo "$LOADED"
echo "$LOADED" | grep -q "$LIB/libdquant-client.so" || fail "the program did not load the installed library"
if echo "$LOADED" | grep -Ei 'cuda|nccl'; then
    fail "the program loads CUDA or NCCL"
fi
echo "OK: a CPU-only program links libdquant-client through pkg-config"
