#!/usr/bin/env bash
# Host emulation of libdquant-cuda's format-version-2 device code, for machines without a GPU:
# the real cuda/src/rans2_cuda.cuh and rans_cuda.cuh (their two PTX statements swapped for C),
# the codec's table repack (codec_cuda.cu kind_tab2, div_magic) and the encoder's pair_argmin and
# in-place pair rANS (encode_kernel.cuh rans2_row), compiled for the host against a shim of
# cuda_internal.cuh and checked against libdquant (dq__rans2_encode, dq__rans2_decode, drift.c's
# pair_assign) under ASan and UBSan: decoded levels and corrupt verdicts of valid and damaged
# containers (exact-size buffers: a read past a container is an ASan error), encoded containers
# (the rebuild's step and the encoder's rans2_row), pair assignments and their costs.
# checkcuda is the test on a GPU; this catches mistakes of the ported arithmetic without one.
#   tests/cuda/emu/run.sh [BUILD_DIR]   (default build; needs its lib/libdquant_internal.a)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$root/cuda/src/rans_cuda.cuh" "$root/cuda/src/rans2_cuda.cuh" "$here/cuda_internal.cuh" "$tmp/"
python3 - "$root" "$tmp" <<'PY'
import sys
root, tmp = sys.argv[1], sys.argv[2]
def cut(text, a, b):
    i = text.index(a)
    return text[i:text.index(b, i)]
s = open(tmp + '/rans_cuda.cuh').read()
s = s.replace('asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));', 'r = emu_prmt(a, b, sel);')
i = s.index('    asm("{\\n\\t.reg .pred p;')
j = s.index(';', s.index('"r"((uint32_t)adv));'))
s = s[:i] + '    if (adv) in.n2 = *a;' + s[j + 1:]
open(tmp + '/rans_cuda.cuh', 'w').write(s)
c = open(root + '/cuda/src/codec_cuda.cu').read()
e = open(root + '/cuda/src/encode_kernel.cuh').read()
d = open(root + '/lib/src/drift.c').read()
open(tmp + '/extract_codec.inc', 'w').write(
    cut(c, '/* x / f == (x · magic)', 'static void kind_tab(') +
    cut(c, "/* Version 2's tables of one kind", "/* Uploads version 2's tables"))
open(tmp + '/extract_argmin.inc', 'w').write(cut(e, '/* The argmin pair a·M + b of (y1, y2)', '/* drift.c pair_assign over the warp') +
                                            cut(e, "/* Version 2's rANS encode of row[0..n)", '/* One warp, a group of G streams'))
open(tmp + '/extract_pair_assign.inc', 'w').write(cut(d, 'static int64_t pair_assign(', 'dq__drift_result dq__drift('))
PY
g++ -std=c++17 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -ffp-contract=off \
  -I"$tmp" -I"$root/lib/include" -I"$root/lib/src" -I"$build/lib/include" -o "$tmp/emu" -x c++ "$here/emu_rans2.cu" -x none \
  "$build/lib/libdquant_internal.a" -lm -lpthread -lxxhash
"$tmp/emu"
