#!/usr/bin/env bash
# The main job on the embedded default: set up and build, start dquantd (CPU backend, a local Unix
# socket), push a real prefill's KV through the client, run decode steps through ATTEND, read the
# cache back with GET, print STATS and what was achieved; then stop the daemon cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --demo

DATA="${DQ_DATA_DIR:-../shared/data}"
# From a bare clone (no ../shared): the real sample shipped for the demo (tests/data/demo/README.md).
[ -f "$DATA/bytellama-19m/kv_f16.bin" ] || DATA=tests/data/demo
RUN=$(mktemp -d /tmp/dquant-demo.XXXXXX)
SOCK="$RUN/dquantd.sock"
METRICS_PORT=$((20000 + RANDOM % 20000))
build/daemon/dquantd --backend cpu --listen "unix:$SOCK" --metrics "127.0.0.1:$METRICS_PORT" \
  --host-memory 1G --log-level info 2>"$RUN/dquantd.log" &
DAEMON=$!
cleanup() { kill "$DAEMON" 2>/dev/null || true; rm -rf "$RUN"; }
trap cleanup EXIT
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.05; done

echo "== codec on the real KV (libdquant, in process)"
build/client/tool/dquant codec demo --data "$DATA"
echo
echo "== dquantd (cpu backend) on $SOCK: prefill, decode steps, GET, STATS"
build/client/tool/dquant demo --connect "unix:$SOCK" --data "$DATA"
echo
echo "== metrics (http://127.0.0.1:$METRICS_PORT/metrics, excerpt)"
if command -v curl >/dev/null; then
  curl -fsS "http://127.0.0.1:$METRICS_PORT/metrics" | grep -E '^dquant_(requests_total|stored_bytes|bf16_equivalent_bytes|tokens_stored)' | head -12 || true
fi
kill -TERM "$DAEMON"
wait "$DAEMON" && echo "dquantd stopped cleanly (SIGTERM, exit 0)"
trap - EXIT
rm -rf "$RUN"
