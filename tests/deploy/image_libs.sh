#!/bin/sh
# The images' runtime stages install what the programs load: for every shared library that
# dquantd, dquant and our libraries need (readelf -d), the Debian 12 package holding it here
# (dpkg -S; the cpu image is Debian 12 too) must be installed by deploy/Dockerfile's stage cpu,
# and stage cuda (Ubuntu 24.04) must install the same set under Ubuntu's names (libuv1 is
# libuv1t64 there). Left out: our own libraries (copied in), libc/libm/libresolv/libgcc/libstdc++ (in every
# base image), CUDA and NCCL (the cuda base image), libsystemd (the images build -Dsystemd=disabled).
#   image_libs.sh SOURCE_ROOT FILE...
set -eu
SRC=$1
shift
fail() { echo "FAIL: $*" >&2; exit 1; }
for t in readelf dpkg ldconfig; do
    command -v $t >/dev/null 2>&1 || { echo "SKIP: no $t (a Debian machine is needed)"; exit 77; }
done
here=$(cd "$(dirname "$0")" && pwd)
DF=$SRC/deploy/Dockerfile
[ "$(grep -c -- '-Dsystemd=disabled' "$DF")" -ge 2 ] || fail "the Dockerfile's builds no longer pass -Dsystemd=disabled"
rc=0
cpu=$("$here/node_check.sh" check_dockerfile.mjs --apt "$DF" cpu) || rc=$?
[ $rc -ne 77 ] || exit 77
[ $rc -eq 0 ] || fail "reading stage cpu's packages"
cuda=$("$here/node_check.sh" check_dockerfile.mjs --apt "$DF" cuda)

needed=$(for f in "$@"; do readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; done | sort -u |
    grep -v -E '^(libdquant|libcudart|libcuda\.|libnccl|libsystemd|libc\.so|libm\.so|libresolv\.so|libgcc_s|libstdc\+\+|ld-linux)' || true)
[ -n "$needed" ] || fail "no libraries found to check"
pkgs=
for so in $needed; do
    p=$(ldconfig -p | awk -v s="$so" '$1 == s { print $NF; exit }')
    [ -n "$p" ] || fail "$so is not known to ldconfig"
    owner=
    for cand in "$p" "$(readlink -f "$p")" "$(echo "$p" | sed 's#^/usr/lib/#/lib/#')" "$(echo "$p" | sed 's#^/lib/#/usr/lib/#')"; do
        owner=$(dpkg -S "$cand" 2>/dev/null | head -1 | cut -d: -f1) && [ -n "$owner" ] && break
    done
    [ -n "$owner" ] || fail "no Debian package holds $so ($p)"
    echo "$so: $owner"
    pkgs="$pkgs $owner"
    echo "$cpu" | grep -q -x "$owner" || fail "stage cpu does not install $owner (for $so)"
done
want=$(echo $pkgs | tr ' ' '\n' | sort -u)
have_cpu=$(echo "$cpu" | sort -u)
have_cuda=$(echo "$cuda" | sed -e 's/^libuv1t64$/libuv1/' -e 's/^libssl3t64$/libssl3/' | sort -u)
[ "$want" = "$have_cpu" ] || fail "stage cpu installs $(echo $have_cpu), the programs need $(echo $want)"
[ "$want" = "$have_cuda" ] || fail "stage cuda installs $(echo $cuda), expected the Ubuntu names of $(echo $want)"
echo "stages cpu and cuda install exactly the libraries the programs load: $(echo $want)"
