#!/usr/bin/env bash
# The NCCL data path on a host with two GPUs: client (nccl_bench) on GPU 0, dquantd (cuda backend)
# on GPU 1, one process per GPU.
#
#   tests/nccl/nccl_gpu.sh            (from anywhere; OUT=/some/dir to collect results there)
#
# Steps (JSON lines in $OUT/results.jsonl, everything logged under $OUT, default build-nccl/nccl-out):
#   1. source .debs/gpu-host-env.sh when present (libuv, protobuf-c, Criterion, ...); find NCCL:
#      /usr/local/cuda, else the pip package nvidia-nccl-* (-Dnccl_root), or $NCCL_ROOT
#   2. meson setup + ninja of build-nccl (-Dcuda=enabled -Dnccl=enabled): dquantd, nccl_bench, dquant
#   3. dquantd --backend cuda --gpu-device 1 on a private Unix socket; HELLO must list "nccl"
#   4. nccl_bench: PUT (dqc_put_dev vs dqc_put), GET (dqc_get_dev vs dqc_get, byte-identical),
#      raw ncclSend/ncclRecv of the same bytes between the GPUs (a peer process on GPU 1), ATTEND
#      (dqc_attend_dev vs dqc_attend, identical; then with appends) -> $OUT/bench.jsonl + a table
#   5. failure tests on a fresh dquantd with nccl_timeout_ms=3000: clients that die after the PUT
#      frame (before any NCCL byte; after k, before v) or stall (k sent, v withheld): the daemon
#      stays up, the sequence does not exist, STATS count the failure, a fresh client sets up NCCL
#      and PUTs again -> $OUT/failure.jsonl
#   6. the daemon exits 0 on SIGTERM; the client suite (client-nccl included) on this build
# The exit status is 0 only if every step passed; the summary at the end says which did not.
#
# Knobs (environment): BUILD, OUT, CLIENT_GPU (0), DAEMON_GPU (1), TOKENS (32768), LAYERS (36),
# GROUPS_LIST (layers per call, "1,12"), REPS (3), BATCHES ("1,32"), ATTEND_STEPS (10),
# NCCL_ROOT (a prefix with include/nccl.h and lib/libnccl.so*), SKIP_BUILD=1, SKIP_SUITE=1,
# DQUANTD_EXTRA (more dquantd arguments); DQUANTD_BIN, NCCL_BENCH_BIN, DQUANT_CLI_BIN run other binaries
# (a dry run without GPUs: SKIP_BUILD=1 BUILD=build-ncl DQUANTD_BIN=some/dquantd; it fails at nccl_setup).
set -uo pipefail

START=$(date +%s)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${BUILD:-$ROOT/build-nccl}
OUT=${OUT:-$BUILD/nccl-out}
CLIENT_GPU=${CLIENT_GPU:-0}
DAEMON_GPU=${DAEMON_GPU:-1}
mkdir -p "$OUT"
LOG="$OUT/nccl_gpu.log"
: > "$LOG"
: > "$OUT/results.jsonl"
# NVLink multicast off: mandatory on the shared GPU hosts (a program using it can take the host's
# GPUs out of service). Every process below inherits it; nccl_bench sets it again itself.
export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

say() { echo "== $(date +%H:%M:%S) $*" | tee -a "$LOG" >&2; }
elapsed() { echo $(( $(date +%s) - START )); }
json() { echo "$1" | tee -a "$OUT/results.jsonl"; }
status=0
failed_steps=()
step_fail() { status=1; failed_steps+=("$1"); say "FAILED: $1${2:+ — $2}"; }

DAEMON_PID=
cleanup() {
    if [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
        kill -TERM "$DAEMON_PID" 2>/dev/null; sleep 2; kill -KILL "$DAEMON_PID" 2>/dev/null || true
    fi
}
trap cleanup EXIT

say "dquant NCCL data path: root $ROOT, build $BUILD, output $OUT, client GPU $CLIENT_GPU, daemon GPU $DAEMON_GPU"

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
command -v nvcc > /dev/null || export PATH="/usr/local/cuda/bin:$PATH"
if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG" >&2 || true
    ngpu=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
    nvidia-smi topo -m >> "$LOG" 2>&1 || true
    json "{\"step\":\"gpu\",\"count\":$ngpu,\"name\":\"$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)\"}"
    if [ "$ngpu" -lt 2 ]; then
        say "this needs two GPUs; nvidia-smi lists $ngpu"
        json "{\"step\":\"gpu\",\"ok\":false,\"error\":\"fewer than 2 GPUs\"}"; exit 1
    fi
else
    say "warning: nvidia-smi not found"
fi

# NCCL: the toolkit's, else a pip package's (its lib/ holds only libnccl.so.2; meson handles that).
nccl_args=()
if [ -n "${NCCL_ROOT:-}" ]; then
    nccl_args=(-Dnccl_root="$NCCL_ROOT")
elif [ -f /usr/local/cuda/include/nccl.h ] && ls /usr/local/cuda/lib64/libnccl.so* > /dev/null 2>&1; then
    NCCL_ROOT=
else
    NCCL_ROOT=$(python3 - 2>/dev/null <<'EOF'
import importlib, os
for name in ("nvidia.nccl",):
    try:
        m = importlib.import_module(name)
    except Exception:
        continue
    for p in list(getattr(m, "__path__", [])):
        if os.path.isfile(os.path.join(p, "include", "nccl.h")):
            print(p); raise SystemExit
EOF
)
    if [ -z "$NCCL_ROOT" ]; then
        say "NCCL not found: no /usr/local/cuda/include/nccl.h and no pip nvidia-nccl package; set NCCL_ROOT"
        json "{\"step\":\"nccl\",\"ok\":false,\"error\":\"NCCL not found\"}"; exit 1
    fi
    nccl_args=(-Dnccl_root="$NCCL_ROOT")
fi
if [ -n "${NCCL_ROOT:-}" ]; then
    export LD_LIBRARY_PATH="$NCCL_ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    say "NCCL from $NCCL_ROOT ($(grep -m1 -E '^#define NCCL_VERSION_CODE' "$NCCL_ROOT/include/nccl.h" 2>/dev/null))"
else
    say "NCCL from /usr/local/cuda ($(grep -m1 -E '^#define NCCL_VERSION_CODE' /usr/local/cuda/include/nccl.h))"
fi

# 2. build
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    t0=$(date +%s)
    if [ ! -f "$BUILD/build.ninja" ]; then
        say "meson setup $BUILD -Dcuda=enabled -Dnccl=enabled ${nccl_args[*]}"
        meson setup "$BUILD" "$ROOT" -Dcuda=enabled -Dnccl=enabled ${nccl_args[@]+"${nccl_args[@]}"} -Dbuildtype=release >> "$LOG" 2>&1 || {
            say "meson setup failed; tail of the log:"; tail -40 "$LOG" >&2
            json "{\"step\":\"build\",\"ok\":false,\"stage\":\"setup\"}"; exit 1; }
    else
        meson configure "$BUILD" -Dcuda=enabled -Dnccl=enabled ${nccl_args[@]+"${nccl_args[@]}"} >> "$LOG" 2>&1 || true
    fi
    say "ninja: dquantd, nccl_bench, dquant, the client tests"
    if ! ninja -C "$BUILD" -j "$(nproc)" daemon/dquantd tests/nccl/nccl_bench client/tool/dquant \
            tests/client/test_nccl_client tests/client/test_client_faults >> "$LOG" 2>&1; then
        say "build failed; errors:"; grep -E "error|FAILED" "$LOG" | tail -30 >&2
        json "{\"step\":\"build\",\"ok\":false,\"stage\":\"ninja\"}"; exit 1
    fi
    json "{\"step\":\"build\",\"ok\":true,\"seconds\":$(( $(date +%s) - t0 ))}"
fi
DQUANTD=${DQUANTD_BIN:-$BUILD/daemon/dquantd}
BENCH=${NCCL_BENCH_BIN:-$BUILD/tests/nccl/nccl_bench}
CLI=${DQUANT_CLI_BIN:-$BUILD/client/tool/dquant}
for f in "$DQUANTD" "$BENCH" "$CLI"; do
    [ -x "$f" ] || { say "missing $f (was NCCL found? see $LOG)"; json "{\"step\":\"build\",\"ok\":false,\"missing\":\"$f\"}"; exit 1; }
done
ldd "$BENCH" | grep -E "nccl|cudart|dquant-client" | tee -a "$LOG" >&2
ldd "$DQUANTD" | grep -E "nccl|cudart|dquant-cuda" | tee -a "$LOG" >&2
ldd "$DQUANTD" | grep -q nccl || say "warning: dquantd is not linked with NCCL: it will not offer the nccl feature"

# 3. the daemon
SOCKDIR=$(mktemp -d /tmp/dq-nccl-XXXXXX)
SOCK=$SOCKDIR/d.sock
ADDR=unix:$SOCK
HELP=$("$DQUANTD" --help 2>&1 || true)

# start_daemon NAME [extra args...]: dquantd on DAEMON_GPU, log $OUT/NAME.log; waits until it answers.
start_daemon() {
    local name=$1; shift
    rm -f "$SOCK"
    local args=(--listen "$ADDR" --metrics off --backend cuda --gpu-device "$DAEMON_GPU" --max-payload 8G
                --log-level info "$@")
    # shellcheck disable=SC2206
    [ -n "${DQUANTD_EXTRA:-}" ] && args+=($DQUANTD_EXTRA)
    say "dquantd ${args[*]} (log $OUT/$name.log)"
    "$DQUANTD" "${args[@]}" > "$OUT/$name.log" 2>&1 &
    DAEMON_PID=$!
    for _ in $(seq 1 600); do
        if ! kill -0 "$DAEMON_PID" 2>/dev/null; then
            say "dquantd exited at start; its log:"; tail -30 "$OUT/$name.log" >&2; DAEMON_PID=; return 1
        fi
        [ -S "$SOCK" ] && "$CLI" ping --connect "$ADDR" --quiet > /dev/null 2>&1 && return 0
        sleep 0.1
    done
    say "dquantd did not answer within 60 s; its log:"; tail -30 "$OUT/$name.log" >&2
    return 1
}

# stop_daemon NAME: SIGTERM; the exit status must be 0.
stop_daemon() {
    local name=$1 rc
    [ -n "$DAEMON_PID" ] || return 1
    if ! kill -0 "$DAEMON_PID" 2>/dev/null; then
        wait "$DAEMON_PID"; rc=$?
        say "dquantd ($name) had already exited with status $rc"; DAEMON_PID=; return 1
    fi
    kill -TERM "$DAEMON_PID"
    for _ in $(seq 1 300); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$DAEMON_PID" 2>/dev/null; then
        say "dquantd ($name) still running 30 s after SIGTERM; killing it"; kill -KILL "$DAEMON_PID"
    fi
    wait "$DAEMON_PID"; rc=$?
    DAEMON_PID=
    json "{\"step\":\"daemon_exit_$name\",\"ok\":$([ "$rc" = 0 ] && echo true || echo false),\"exit\":$rc}"
    [ "$rc" = 0 ]
}

if ! start_daemon bench_daemon; then
    json "{\"step\":\"daemon\",\"ok\":false}"; exit 1
fi
say "daemon up (pid $DAEMON_PID)"

# 4. the benchmark
say "nccl_bench (JSON: $OUT/bench.jsonl)"
t0=$(date +%s)
"$BENCH" --addr "$ADDR" --device "$CLIENT_GPU" --peer-device "$DAEMON_GPU" --tokens "${TOKENS:-32768}" \
    --layers "${LAYERS:-36}" --groups "${GROUPS_LIST:-1,12}" --reps "${REPS:-3}" --batches "${BATCHES:-1,32}" \
    --attend-steps "${ATTEND_STEPS:-10}" 2> >(tee -a "$LOG" >&2) | tee "$OUT/bench.jsonl"
rc=${PIPESTATUS[0]}
json "{\"step\":\"bench\",\"ok\":$([ "$rc" = 0 ] && echo true || echo false),\"exit\":$rc,\"seconds\":$(( $(date +%s) - t0 ))}"
if [ "$rc" != 0 ]; then
    step_fail bench "exit $rc; failed checks:"
    grep '"ok":false' "$OUT/bench.jsonl" >&2 || true
    say "daemon log tail ($OUT/bench_daemon.log):"; tail -20 "$OUT/bench_daemon.log" >&2
fi
kill -0 "$DAEMON_PID" 2>/dev/null || step_fail bench_daemon "dquantd died during the benchmark"
"$CLI" stats --connect "$ADDR" > "$OUT/stats_after_bench.txt" 2>&1 || true
grep -i nccl "$OUT/stats_after_bench.txt" >&2 || say "(no nccl counters in STATS)"
stop_daemon bench_daemon || step_fail bench_daemon_exit "dquantd did not exit cleanly; see $OUT/bench_daemon.log"

# 5. failure tests on a fresh daemon with a short transfer deadline
timeout_args=()
if grep -q -- "--nccl-timeout-ms" <<< "$HELP"; then
    timeout_args=(--nccl-timeout-ms 3000)
elif grep -q -- "--nccl-timeout" <<< "$HELP"; then
    timeout_args=(--nccl-timeout 3000)   # config key nccl_timeout_ms
else
    say "warning: dquantd --help shows no --nccl-timeout; the failure tests wait for the default deadline"
fi
if start_daemon failure_daemon ${timeout_args[@]+"${timeout_args[@]}"}; then
    say "nccl_bench --failure-tests (JSON: $OUT/failure.jsonl)"
    t0=$(date +%s)
    timeout --signal=TERM 400 "$BENCH" --failure-tests --addr "$ADDR" --device "$CLIENT_GPU" \
        --tokens "${TOKENS:-32768}" --layers "${LAYERS:-36}" 2> >(tee -a "$LOG" >&2) | tee "$OUT/failure.jsonl"
    rc=${PIPESTATUS[0]}
    alive=true
    kill -0 "$DAEMON_PID" 2>/dev/null || alive=false
    json "{\"step\":\"failure_tests\",\"ok\":$([ "$rc" = 0 ] && [ $alive = true ] && echo true || echo false),\"exit\":$rc,\"daemon_alive\":$alive,\"seconds\":$(( $(date +%s) - t0 ))}"
    [ "$rc" = 0 ] || { step_fail failure_tests "exit $rc"; grep '"ok":false' "$OUT/failure.jsonl" >&2 || true; }
    [ $alive = true ] || step_fail failure_daemon "dquantd died during the failure tests; log: $OUT/failure_daemon.log"
    "$CLI" stats --connect "$ADDR" > "$OUT/stats_after_failures.txt" 2>&1 || true
    grep -i nccl "$OUT/stats_after_failures.txt" >&2 || true
    grep -iE "nccl|abort" "$OUT/failure_daemon.log" | tail -20 >&2 || true
    stop_daemon failure_daemon || step_fail failure_daemon_exit "dquantd did not exit cleanly; see $OUT/failure_daemon.log"
else
    step_fail failure_daemon "could not start"
fi
rm -rf "$SOCKDIR"

# 6. the client suite on this build (CPU daemon paths, client-nccl included)
if [ "${SKIP_SUITE:-0}" != 1 ]; then
    say "meson test client-nccl client-faults"
    if meson test -C "$BUILD" --no-rebuild client-nccl client-faults --print-errorlogs >> "$LOG" 2>&1; then
        json "{\"step\":\"client_suite\",\"ok\":true}"
    else
        json "{\"step\":\"client_suite\",\"ok\":false}"; step_fail client_suite "see $BUILD/meson-logs/testlog.txt"
    fi
fi

json "{\"step\":\"done\",\"ok\":$([ "$status" = 0 ] && echo true || echo false),\"seconds\":$(elapsed)}"
if [ "$status" = 0 ]; then
    say "all passed in $(elapsed)s; results: $OUT/results.jsonl, $OUT/bench.jsonl, $OUT/failure.jsonl"
else
    say "FAILED steps: ${failed_steps[*]} (logs under $OUT)"
fi
exit "$status"
