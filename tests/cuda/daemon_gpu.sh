#!/usr/bin/env bash
# dquantd's cuda backend on a GPU host: build with CUDA, check it end to end against in-process
# libdquant, then benchmark it against in-process libdquant-cuda.
#
#   tests/cuda/daemon_gpu.sh            (from anywhere; OUT=/some/dir to collect results there)
#
# Steps (each prints JSON lines; everything is also logged under $OUT, default build-gpu/gpu-out):
#   1. source .debs/gpu-host-env.sh (libuv, protobuf-c, Criterion, ... from the repository's .debs/)
#   2. meson setup + ninja of build-gpu (-Dcuda=enabled): libdquant-cuda, dquantd with the cuda
#      backend, tests/daemon/gpu_e2e
#   3. gpu_e2e check: dquantd --backend cuda on a Unix socket; PUT/GET/GET_RAW/ATTEND byte-identical
#      to (ATTEND within 1e-3 of) in-process libdquant on the same inputs; bad input refused with
#      libdquant's codes; small --gpu-memory: sequences move to host memory and back unchanged,
#      pinned ones stay, small host memory too: evictions counted
#   3b. tests/daemon/test_dqd_fixed against the daemon: format version 2 (dq226p/dq196p) on the
#      GPU tier with every layout (with containers ATTEND reads its records: attention v7 decoding
#      the pairs), the fixed-width family there with hot and hot-only (on the host with
#      containers): PUT/GET/GET_RAW bit-identical, ATTEND within 1e-3
#   4. gpu_e2e bench: PUT of a 32K-token, 36-layer prefill (Qwen3-8B shape: 8 KV heads x 128, 32
#      query heads) and decode steps (36 sequential ATTEND calls, batch 1 and 32), through the daemon
#      and in-process with libdquant-cuda; the batch-32 context shrinks if the time budget requires
#      (the JSON says which context ran)
#   5. meson test --suite daemon (the CPU backend and the fallback, unchanged on a GPU host)
# The exit status is 0 only if the build, the checks and the bench all passed.
#
# Knobs (environment): BUILD (build dir), OUT, TIME_BUDGET (seconds for the whole script, default
# 570), BENCH_TOKENS (32768), BENCH_LAYERS (36), BENCH_BATCHES (1,32), BENCH_STEPS (10),
# PUT_CONNS (8), BENCH_TRACE (0; 1: the daemon's per-stage ATTEND medians, at debug level),
# CHECK_SCALE (full), SKIP_BUILD=1, SKIP_SUITE=1, SKIP_CHECK=1; ATTEND_KERNEL (auto|7|5|3),
# ENCODE_KERNEL (auto|5|4), ENCODE_SCHEDULE (planned|plain): the daemon's --attend-kernel,
# --encode-kernel, --encode-schedule in the check and the bench (default auto, auto, planned);
# ATTEND_LAYOUT (containers|hot|hot-only): the daemon's --gpu-attention-layout in the check and the
# bench (default containers; hot and hot-only also compare such a daemon with a containers one in
# the check; hot-only also checks its GPU memory against hot's and a restart from the disk tier);
# DQUANTD_BIN and GPU_E2E_BIN run other
# binaries (e.g. a dry run without a GPU: SKIP_BUILD=1 BUILD=build-h6
# DQUANTD_BIN=build-h6/tests/daemon/dquantd-fakecuda GPU_E2E_BIN=build-h6/tests/daemon/gpu_e2e_fake).
set -euo pipefail

START=$(date +%s)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${BUILD:-$ROOT/build-gpu}
OUT=${OUT:-$BUILD/gpu-out}
TIME_BUDGET=${TIME_BUDGET:-570}
mkdir -p "$OUT"
LOG="$OUT/daemon_gpu.log"
: > "$LOG"
: > "$OUT/results.jsonl"

say() { echo "== $(date +%H:%M:%S) $*" | tee -a "$LOG" >&2; }
elapsed() { echo $(( $(date +%s) - START )); }
json() { echo "$1" | tee -a "$OUT/results.jsonl"; }
status=0

say "dquant cuda backend e2e: root $ROOT, build $BUILD, output $OUT"

# 1. environment
if [ -f "$ROOT/.debs/gpu-host-env.sh" ]; then
    set +u
    repo_root=$ROOT   # gpu-host-env.sh uses ROOT for its own folder
    # shellcheck disable=SC1091
    source "$ROOT/.debs/gpu-host-env.sh"
    ROOT=$repo_root
    set -u
    say "sourced .debs/gpu-host-env.sh"
else
    say "warning: $ROOT/.debs/gpu-host-env.sh not found; using the system's packages"
fi
if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG" >&2 || true
    gpu=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1 || true)
    json "{\"step\":\"gpu\",\"name\":\"${gpu//\"/}\",\"nproc\":$(nproc)}"
else
    say "warning: nvidia-smi not found"
fi
command -v nvcc > /dev/null || export PATH="/usr/local/cuda/bin:$PATH"

# 2. build
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    t0=$(date +%s)
    if [ ! -f "$BUILD/build.ninja" ]; then
        say "meson setup $BUILD -Dcuda=enabled"
        meson setup "$BUILD" "$ROOT" -Dcuda=enabled -Dbuildtype=release >> "$LOG" 2>&1 || {
            say "meson setup failed; tail of the log:"; tail -40 "$LOG" >&2
            json "{\"step\":\"build\",\"ok\":false,\"stage\":\"setup\"}"; exit 1; }
    else
        meson configure "$BUILD" -Dcuda=enabled >> "$LOG" 2>&1 || true
    fi
    say "ninja (dquantd, libdquant-cuda, gpu_e2e, the daemon tests)"
    if ! ninja -C "$BUILD" -j "$(nproc)" >> "$LOG" 2>&1; then
        say "full build failed; trying the targets this script needs"
        grep -E "error|FAILED" "$LOG" | tail -20 >&2 || true
        ninja -C "$BUILD" -j "$(nproc)" daemon/dquantd tests/daemon/gpu_e2e >> "$LOG" 2>&1 || {
            say "build failed; tail of the log:"; tail -60 "$LOG" >&2
            json "{\"step\":\"build\",\"ok\":false,\"stage\":\"ninja\"}"; exit 1; }
        status=1
    fi
    json "{\"step\":\"build\",\"ok\":true,\"seconds\":$(( $(date +%s) - t0 ))}"
fi
case "${ATTEND_LAYOUT:-containers}" in
containers | hot | hot-only) ;;
*)
    say "ATTEND_LAYOUT=${ATTEND_LAYOUT} is not one of containers, hot, hot-only"
    json "{\"step\":\"config\",\"ok\":false,\"attend_layout\":\"${ATTEND_LAYOUT//\"/}\"}"
    exit 1
    ;;
esac
DQUANTD=${DQUANTD_BIN:-$BUILD/daemon/dquantd}
# the kernel versions of the daemon's cuda backend, passed to every dquantd the steps start
KERNEL_ARGS=(--daemon-arg "--attend-kernel=${ATTEND_KERNEL:-auto}" --daemon-arg "--encode-kernel=${ENCODE_KERNEL:-auto}"
    --daemon-arg "--encode-schedule=${ENCODE_SCHEDULE:-planned}" --layout "${ATTEND_LAYOUT:-containers}")
E2E=${GPU_E2E_BIN:-$BUILD/tests/daemon/gpu_e2e}
for f in "$DQUANTD" "$E2E"; do
    [ -x "$f" ] || { say "missing $f (was CUDA found? see $LOG)"; json "{\"step\":\"build\",\"ok\":false,\"missing\":\"$f\"}"; exit 1; }
done
ldd "$DQUANTD" | grep -E "dquant-cuda|cudart" | tee -a "$LOG" >&2 || say "warning: dquantd is not linked with libdquant-cuda"

# 3. correctness
if [ "${SKIP_CHECK:-0}" != 1 ]; then
    say "gpu_e2e check (logs in $OUT/check)"
    t0=$(date +%s)
    set +e
    "$E2E" check --dquantd "$DQUANTD" --workdir "$OUT/check" --scale "${CHECK_SCALE:-full}" --expect-backend cuda \
        "${KERNEL_ARGS[@]}" \
        2> >(tee -a "$LOG" >&2) | tee "$OUT/check.jsonl"
    rc=${PIPESTATUS[0]}
    set -e
    fails=$(grep -c '"ok":false' "$OUT/check.jsonl" || true)
    json "{\"step\":\"check\",\"ok\":$([ "$rc" = 0 ] && echo true || echo false),\"exit\":$rc,\"failed_checks\":$fails,\"seconds\":$(( $(date +%s) - t0 ))}"
    [ "$rc" = 0 ] || { status=1; say "CHECK FAILED ($fails failed checks); daemon logs: $OUT/check/*.log"; grep '"ok":false' "$OUT/check.jsonl" >&2 || true; }
fi

# 3b. format version 2 (every layout) and the fixed-width family (hot and hot-only) on the GPU tier:
# test_dqd_fixed against this daemon, ATTEND within 1e-3 of dq_attend, the rest bit-identical to
# libdquant
if [ "${SKIP_CHECK:-0}" != 1 ]; then
    FIXED_TEST=${FIXED_TEST_BIN:-$BUILD/tests/daemon/test_dqd_fixed}
    layout=${ATTEND_LAYOUT:-containers}
    say "test_dqd_fixed on the GPU tier (--gpu-attention-layout $layout)"
    t0=$(date +%s)
    set +e
    DQUANTD=$DQUANTD DQ_FIXED_BACKEND=cuda DQ_FIXED_LAYOUT=$layout DQ_FIXED_ATTEND_TOL=1e-3 \
        "$FIXED_TEST" -j1 >> "$LOG" 2>&1
    rc=$?
    set -e
    json "{\"step\":\"fixed_family\",\"ok\":$([ "$rc" = 0 ] && echo true || echo false),\"layout\":\"$layout\",\"exit\":$rc,\"seconds\":$(( $(date +%s) - t0 ))}"
    [ "$rc" = 0 ] || { status=1; say "FIXED-WIDTH CHECK FAILED; see $LOG"; }
fi

# 4. benchmark
left=$(( TIME_BUDGET - $(elapsed) - 45 ))
if [ "$left" -lt 60 ]; then
    say "only ${left}s left of TIME_BUDGET=$TIME_BUDGET: skipping the benchmark"
    json "{\"step\":\"bench\",\"ok\":false,\"skipped\":\"time\"}"
    status=1
else
    say "gpu_e2e bench (time budget ${left}s; logs in $OUT/bench)"
    t0=$(date +%s)
    set +e
    timeout --signal=TERM $(( left + 30 )) "$E2E" bench --dquantd "$DQUANTD" --workdir "$OUT/bench" \
        --tokens "${BENCH_TOKENS:-32768}" --layers "${BENCH_LAYERS:-36}" --batches "${BENCH_BATCHES:-1,32}" \
        --steps "${BENCH_STEPS:-10}" --put-conns "${PUT_CONNS:-8}" --time-budget "$left" --trace "${BENCH_TRACE:-0}" \
        "${KERNEL_ARGS[@]}" \
        2> >(tee -a "$LOG" >&2) | tee "$OUT/bench.jsonl"
    rc=${PIPESTATUS[0]}
    set -e
    json "{\"step\":\"bench\",\"ok\":$([ "$rc" = 0 ] && echo true || echo false),\"exit\":$rc,\"seconds\":$(( $(date +%s) - t0 ))}"
    [ "$rc" = 0 ] || { status=1; say "BENCH FAILED (exit $rc); daemon log: $OUT/bench/bench.log"; }
fi

# 5. the daemon's test suite on this host (CPU backend, fallback, CUDA emulation)
if [ "${SKIP_SUITE:-0}" != 1 ] && [ $(( TIME_BUDGET - $(elapsed) )) -gt 40 ]; then
    say "meson test --suite daemon"
    set +e
    timeout $(( TIME_BUDGET - $(elapsed) - 5 )) meson test -C "$BUILD" --suite daemon --num-processes 4 \
        --no-rebuild >> "$LOG" 2>&1
    rc=$?
    set -e
    cp "$BUILD/meson-logs/testlog.txt" "$OUT/testlog.txt" 2>/dev/null || true
    json "{\"step\":\"daemon_suite\",\"ok\":$([ "$rc" = 0 ] && echo true || echo false),\"exit\":$rc}"
    grep -E "^ *[0-9]+/[0-9]+ " "$BUILD/meson-logs/testlog.txt" 2>/dev/null | tail -20 >&2 || true
    [ "$rc" = 0 ] || status=1
fi

json "{\"step\":\"done\",\"ok\":$([ "$status" = 0 ] && echo true || echo false),\"seconds\":$(elapsed)}"
say "done in $(elapsed)s, status $status; results: $OUT/results.jsonl, $OUT/check.jsonl, $OUT/bench.jsonl"
exit "$status"
