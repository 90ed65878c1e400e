#!/bin/bash
# Profiles the default attention and encode kernels with Nsight Compute on the GPU host and dumps
# their SASS, for the notes in tests/bench/GPU_NOTES.md. Run from the repository root:
#   tests/cuda/ncu_profile.sh [OUTDIR]     (OUTDIR defaults to $OUT, else /tmp/dquant-ncu)
# Environment: BUILD_DIR (default build-gpu); SKIP_BUILD=1; ATTN="B:CTX ..." (default "1:131072
# 32:32768"); ATTEND_KERNEL (bench_cuda --attend-kernel: auto, 7, 5 or 3; default auto);
# KERNEL_RE (default attend7_kernel, the kernel auto runs); SET (ncu section set, default full).
# Text pages, raw metrics as CSV and SASS land in OUTDIR/ncu.tar.gz, the reports in reps.tar.gz.
set -o pipefail
OUTDIR=${1:-${OUT:-/tmp/dquant-ncu}}
BUILD_DIR=${BUILD_DIR:-build-gpu}
WORK=$(mktemp -d)
mkdir -p "$OUTDIR"
if [ -f .debs/gpu-host-env.sh ]; then
  # shellcheck disable=SC1091
  source .debs/gpu-host-env.sh
fi
export PATH=/usr/local/cuda/bin:$PATH
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  if [ ! -f "$BUILD_DIR/build.ninja" ]; then
    meson setup "$BUILD_DIR" -Dcuda=enabled -Dtests=true --buildtype=release >"$WORK/setup.log" 2>&1 || {
      cat "$WORK/setup.log"
      exit 1
    }
  fi
  ninja -C "$BUILD_DIR" tests/cuda/bench_cuda >"$WORK/build.log" 2>&1 || {
    tail -30 "$WORK/build.log"
    exit 1
  }
fi
BENCH=$BUILD_DIR/tests/cuda/bench_cuda
LIB=$(find "$BUILD_DIR/cuda" -name 'libdquant-cuda.so*' -type f | head -1)
cuobjdump -res-usage "$LIB" >"$WORK/res-usage.txt" 2>&1
cuobjdump -sass "$LIB" >"$WORK/all.sass" 2>&1
SET=${SET:-full}
KRE=${KERNEL_RE:-attend7_kernel}
AKERN=${ATTEND_KERNEL:-auto}
for cfg in ${ATTN:-1:131072 32:32768}; do
  tag=attn_${cfg/:/_}
  echo "== ncu $KRE at $cfg"
  ncu --set "$SET" --import-source yes -k "regex:$KRE" --launch-skip 2 --launch-count 1 -f -o "$WORK/$tag" \
    "$BENCH" --quick --attend-kernel "$AKERN" --attn "$cfg" >"$WORK/$tag.run.log" 2>&1 || tail -20 "$WORK/$tag.run.log"
  ncu -i "$WORK/$tag.ncu-rep" --page details >"$WORK/$tag.details.txt" 2>&1
  ncu -i "$WORK/$tag.ncu-rep" --page raw --csv >"$WORK/$tag.raw.csv" 2>&1
  ncu -i "$WORK/$tag.ncu-rep" --page source --csv --print-source sass >"$WORK/$tag.source.csv" 2>&1
  grep -E "Duration|Warp Cycles Per Issued|Issued Ipc|Achieved Occupancy|Stall|Registers Per|Shared Memory Config" \
    "$WORK/$tag.details.txt" | head -40
done
if [ "${ENCODE:-1}" = 1 ]; then
  echo "== ncu encode_kernel (the default encoder, K streams)"
  ncu --set "$SET" --import-source yes -k regex:encode_kernel --launch-skip 1 --launch-count 1 -f -o "$WORK/encode" \
    "$BENCH" --quick --attn 1:8192 >"$WORK/encode.run.log" 2>&1 || tail -20 "$WORK/encode.run.log"
  ncu -i "$WORK/encode.ncu-rep" --page details >"$WORK/encode.details.txt" 2>&1
  ncu -i "$WORK/encode.ncu-rep" --page raw --csv >"$WORK/encode.raw.csv" 2>&1
  ncu -i "$WORK/encode.ncu-rep" --page source --csv --print-source sass >"$WORK/encode.source.csv" 2>&1
  grep -E "Duration|Warp Cycles Per Issued|Issued Ipc|Achieved Occupancy|Registers Per" "$WORK/encode.details.txt" | head
fi
(cd "$WORK" && tar -czf "$OUTDIR/ncu.tar.gz" --exclude='*.ncu-rep' . && tar -czf "$OUTDIR/reps.tar.gz" ./*.ncu-rep)
ls -la "$OUTDIR"
