#!/bin/bash
# Builds libdquant-cuda on the GPU host, runs checkcuda (every kernel against libdquant), a
# compute-sanitizer pass in small mode, and the benchmarks: bench_cuda (encoders, prefill,
# decompression) and bench_truth.py (decode attention against the fastest BF16 attention, per
# layer and in a whole Qwen3-8B decode step; GPU time on both sides in the same run).
# Run from the repository root:
#   tests/cuda/gpu_bench.sh [OUTDIR]            (OUTDIR defaults to $OUT, else /tmp/dquant-gpu)
# Environment: BUILD_DIR (default build-gpu); SKIP_BUILD=1 uses binaries already in BUILD_DIR;
# CHECK=0 skips checkcuda and compute-sanitizer; SANITIZE=0 skips compute-sanitizer; ENCODE=0 skips
# bench_cuda; TRUTH=0 skips bench_truth.py; QUICK=1 runs shorter benchmarks; TRUTH_ARGS adds
# bench_truth.py arguments; TRUTH_BUDGET its time budget in seconds (default 420).
# Outputs in OUTDIR: nvidia-smi.csv, build logs, checkcuda.log, sanitizer-*.log, bench_cuda.jsonl,
# bench_truth.log and gpu_attention.json (copy it to tests/bench/results/).
set -o pipefail
OUTDIR=${1:-${OUT:-/tmp/dquant-gpu}}
BUILD_DIR=${BUILD_DIR:-build-gpu}
CHECK=${CHECK:-1}
ENCODE=${ENCODE:-1}
TRUTH=${TRUTH:-1}
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
  targets=""
  [ "$CHECK" = 1 ] && targets="$targets tests/cuda/checkcuda"
  [ "$ENCODE" = 1 ] && targets="$targets tests/cuda/bench_cuda"
  # shellcheck disable=SC2086
  [ -z "$targets" ] || ninja -C "$BUILD_DIR" $targets 2>&1 | tee "$OUTDIR/build.log" | tail -5 || exit 1
  # bench_truth.py loads the shared libraries through ctypes
  [ "$TRUTH" = 1 ] && { meson compile -C "$BUILD_DIR" dquant-cuda 2>&1 | tee "$OUTDIR/build-lib.log" | tail -3 || exit 1; }
fi

if [ "$CHECK" = 1 ]; then
  # checkcuda: every registered encoder and attention version, checked and timed in one process
  # (CHECK_ARGS may restrict them, e.g. "--attend-kernel 7 --encode-kernel 5")
  echo "== checkcuda"
  # shellcheck disable=SC2086
  timeout 1800 "$BUILD_DIR/tests/cuda/checkcuda" ${CHECK_ARGS:-} 2>&1 | tee "$OUTDIR/checkcuda.log"
  rc=${PIPESTATUS[0]}
  echo "checkcuda exit $rc"
  [ "$rc" = 0 ] || status=1
fi

if [ "$CHECK" = 1 ] && [ "${SANITIZE:-1}" = 1 ] && command -v compute-sanitizer > /dev/null; then
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer $tool (small mode)"
    timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 "$BUILD_DIR/tests/cuda/checkcuda" --small \
      --quiet 2>&1 | tail -25 | tee "$OUTDIR/sanitizer-$tool.log"
    rc=${PIPESTATUS[0]}
    echo "compute-sanitizer $tool exit $rc"
    [ "$rc" = 0 ] || status=1
  done
fi

QARG=""
[ "${QUICK:-0}" = 1 ] && QARG=--quick
if [ "$ENCODE" = 1 ]; then
  echo "== bench_cuda (encoders, prefill, decompression)"
  timeout 600 "$BUILD_DIR/tests/cuda/bench_cuda" $QARG 2>&1 | tee "$OUTDIR/bench_cuda.jsonl"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [ "$TRUTH" = 1 ]; then
  echo "== bench_truth.py (decode attention and a decode step against BF16)"
  budget=${TRUTH_BUDGET:-420}
  # shellcheck disable=SC2086
  PYTHONUNBUFFERED=1 timeout $((budget + 60)) python3 tests/cuda/bench_truth.py --build "$BUILD_DIR" \
    --json "$OUTDIR/gpu_attention.json" --time-budget "$budget" $QARG ${TRUTH_ARGS:-} 2>&1 | tee "$OUTDIR/bench_truth.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
exit $status
