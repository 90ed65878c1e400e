#!/bin/bash
# Builds libdquant-cuda on the GPU host, runs checkcuda (every kernel against libdquant), a
# compute-sanitizer pass in small mode, and the benchmarks (bench_cuda + PyTorch BF16 reference).
# Run from the repository root:
#   tests/cuda/gpu_bench.sh [OUTDIR]            (OUTDIR defaults to $OUT, else /tmp/dquant-gpu)
# Environment: BUILD_DIR (default build-gpu); SKIP_BUILD=1 uses binaries already in BUILD_DIR;
# SANITIZE=0 skips compute-sanitizer; QUICK=1 runs a shorter benchmark.
set -o pipefail
OUTDIR=${1:-${OUT:-/tmp/dquant-gpu}}
BUILD_DIR=${BUILD_DIR:-build-gpu}
mkdir -p "$OUTDIR"
if [ -f .debs/gpu-host-env.sh ]; then
  # shellcheck disable=SC1091
  source .debs/gpu-host-env.sh
fi
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv \
  > "$OUTDIR/nvidia-smi.csv" 2>&1

status=0
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  if [ ! -f "$BUILD_DIR/build.ninja" ]; then
    meson setup "$BUILD_DIR" -Dcuda=enabled -Dtests=true --buildtype=release 2>&1 | tee "$OUTDIR/setup.log" || exit 1
  fi
  ninja -C "$BUILD_DIR" tests/cuda/checkcuda tests/cuda/bench_cuda 2>&1 | tee "$OUTDIR/build.log" | tail -5 || exit 1
fi

# checkcuda: every registered encoder and attention version, checked and timed in one process
# (CHECK_ARGS may restrict them, e.g. "--attend-kernel 7 --encode-kernel 5")
echo "== checkcuda"
# shellcheck disable=SC2086
timeout 1800 "$BUILD_DIR/tests/cuda/checkcuda" ${CHECK_ARGS:-} 2>&1 | tee "$OUTDIR/checkcuda.log"
rc=${PIPESTATUS[0]}
echo "checkcuda exit $rc"
[ "$rc" = 0 ] || status=1

if [ "${SANITIZE:-1}" = 1 ] && command -v compute-sanitizer > /dev/null; then
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer $tool (small mode)"
    timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 "$BUILD_DIR/tests/cuda/checkcuda" --small \
      --quiet 2>&1 | tail -25 | tee "$OUTDIR/sanitizer-$tool.log"
    rc=${PIPESTATUS[0]}
    echo "compute-sanitizer $tool exit $rc"
    [ "$rc" = 0 ] || status=1
  done
fi

echo "== benchmarks"
QARG=""
[ "${QUICK:-0}" = 1 ] && QARG=--quick
PYTHONUNBUFFERED=1 timeout 900 python3 tests/cuda/bench_attn.py --bin "$BUILD_DIR/tests/cuda/bench_cuda" \
  --json "$OUTDIR/bench.json" $QARG 2>&1 | tee "$OUTDIR/bench.log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
exit $status
