#!/usr/bin/env bash
# Bounded soak (issue 18): `dquant bench` mixed load (PUT / GET / ATTEND and PREFIX requests with
# --prefix-share) against a dquantd whose VmRSS is sampled every second. Fails when the bench
# reports a failed request, when the daemon does not exit cleanly, or when its RSS grows after the
# warm-up by more than SOAK_RSS_PCT percent AND more than SOAK_RSS_MIB MiB (both, so that a few
# pages of allocator noise on a small RSS do not fail it), comparing SOAK_WINDOW-second medians.
# The store fills its --host-memory budget of 64 MiB in ~10 s and evicts from then on, but the RSS
# settles for longer: the allocator's arenas grow towards their working set for ~140 s (one run on
# 2 cores, sampled every 10 s: 99 MiB at 40 s, 101 at 60, 105 at 80-120, 107-109 at 140-240, then
# 107-112 until 330 s, swinging by a few MiB). A baseline at 40 s read 7-10 MiB of that settling
# as growth; from 90 s on, what remains is the swing, and a leak still moves the medians.
#   SOAK_SECONDS  measured run (default 180; a longer soak: SOAK_SECONDS=1800 tests/tool/soak.sh,
#                 with DQUANTD and DQUANT_CLI pointing at build/daemon/dquantd, build/client/tool/dquant)
#   SOAK_WARMUP   seconds after which the RSS baseline is taken (default 90)
#   SOAK_WINDOW   seconds of samples in each median (default 20)
#   SOAK_RSS_PCT, SOAK_RSS_MIB   tolerance (default 5 and 8)
set -euo pipefail
: "${DQUANTD:?DQUANTD must name the dquantd binary}" "${DQUANT_CLI:?DQUANT_CLI must name the dquant tool}"
SECONDS_RUN=${SOAK_SECONDS:-180}
WARMUP=${SOAK_WARMUP:-90}
WINDOW=${SOAK_WINDOW:-20}
PCT=${SOAK_RSS_PCT:-5}
MIB=${SOAK_RSS_MIB:-8}
if [ "$WINDOW" -lt 1 ] || [ $((WARMUP + 2 * WINDOW)) -gt "$SECONDS_RUN" ]; then
  echo "soak: SOAK_WARMUP ($WARMUP) + 2 x SOAK_WINDOW ($WINDOW) must not exceed SOAK_SECONDS ($SECONDS_RUN)" >&2
  exit 2
fi
dir=$(mktemp -d /tmp/dqd-soak-XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

"$DQUANTD" --listen "unix:$dir/d.sock" --metrics off --log-level warn --host-memory 64M >"$dir/d.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$dir/d.sock" ] && break; sleep 0.1; done
[ -S "$dir/d.sock" ] || { echo "soak: dquantd did not start" >&2; cat "$dir/d.log" >&2; exit 1; }

rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status"; }
"$DQUANT_CLI" bench --connect "unix:$dir/d.sock" -c 2 --duration "$SECONDS_RUN" --quiet \
  --mix put=3,get=3,attend=3,prefix=1 --prefix-share 0.5 --prompts 8 --prompt-tokens 1024 --lease-ms 500 \
  --get-hit --batch 4 --max-seq-tokens 8192 >"$dir/bench.out" 2>&1 &
bench=$!
: >"$dir/rss"
t=0
while kill -0 "$bench" 2>/dev/null; do
  echo "$t $(rss_kb)" >>"$dir/rss"
  sleep 1
  t=$((t + 1))
done
brc=0
wait "$bench" || brc=$?
cat "$dir/bench.out"
kill -TERM "$pid"
drc=0
wait "$pid" || drc=$?
pid=

# The baseline: the median of the WINDOW samples from the warm-up on (the bench's setup comes first,
# so t counts from the start of the bench process); the end: the median of the last WINDOW samples.
# Medians, not single samples: the RSS of this load swings by ~7 MiB second to second (buffers of
# in-flight requests), and one sample at the top of a swing is not growth; a leak moves the median.
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }
warm=$(awk -v w="$WARMUP" -v n="$WINDOW" '$1 >= w && $1 < w + n { print $2 }' "$dir/rss" | median)
end=$(tail -n "$WINDOW" "$dir/rss" | awk '{ print $2 }' | median)
peak=$(awk 'BEGIN { m = 0 } $2 > m { m = $2 } END { print m }' "$dir/rss")
n=$(wc -l <"$dir/rss")
echo "soak: ${n} RSS samples over ${SECONDS_RUN} s; median after warm-up (${WARMUP} s) ${warm} KiB, median" \
  "at the end ${end} KiB, peak ${peak} KiB; tolerance ${PCT}% and ${MIB} MiB"
[ "$brc" -eq 0 ] || { echo "soak: dquant bench failed ($brc)" >&2; exit 1; }
[ "$drc" -eq 0 ] || { echo "soak: dquantd exited with $drc" >&2; cat "$dir/d.log" >&2; exit 1; }
[ -n "$warm" ] || { echo "soak: no RSS sample after the warm-up" >&2; exit 1; }
growth=$((end - warm))
if [ "$growth" -gt $((warm * PCT / 100)) ] && [ "$growth" -gt $((MIB * 1024)) ]; then
  echo "soak: RSS grew by ${growth} KiB after the warm-up (over ${PCT}% and ${MIB} MiB)" >&2
  exit 1
fi
echo "soak: RSS growth after the warm-up ${growth} KiB: within the tolerance"
