#!/usr/bin/env bash
# Throughput of the multi-node client against 1, 2, 3 ... dquantd on this machine (a benchmark, not
# a test): for each N in NODES, N daemons on loopback TCP ports, then `dquant bench` through one
# dqc_cluster per connection (R = REPLICAS) for SECONDS; prints requests/s, GB/s of tensor payload,
# and per-node efficiency = (throughput with N) / (N x throughput with 1). The daemons share the
# machine's cores with each other and with the bench, so on a small machine the figures show the
# CPU bound, not the network's. Writes RESULT_JSON (default tests/bench/results/cluster-scaling.json).
#   tests/bench/cluster_scaling.sh [BUILD_DIR]
#   NODES="1 2 3" SECONDS_EACH=10 CONNECTIONS=8 REPLICAS=1 MIX=put=30,get=40,attend=30
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
NODES=${NODES:-"1 2 3"}
SECS=${SECONDS_EACH:-10}
CONN=${CONNECTIONS:-8}
REPL=${REPLICAS:-1}
MIX=${MIX:-put=30,get=40,attend=30}
OUT=${RESULT_JSON:-tests/bench/results/cluster-scaling.json}
DQUANTD=$BUILD/daemon/dquantd
DQUANT=$BUILD/client/tool/dquant
[ -x "$DQUANTD" ] && [ -x "$DQUANT" ] || { echo "build $BUILD first (ninja -C $BUILD)" >&2; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

rows=()
base_rps=""
base_gbs=""
for n in $NODES; do
  members=()
  for ((i = 0; i < n; i++)); do
    port=$(free_port)
    "$DQUANTD" --listen "tcp://127.0.0.1:$port" --listen "unix:$tmp/n$n-$i.sock" --metrics off \
      --log-level warn >"$tmp/n$n-$i.log" 2>&1 &
    pids+=($!)
    members+=(--connect "tcp://127.0.0.1:$port")
  done
  for ((i = 0; i < n; i++)); do
    for _ in $(seq 100); do [ -S "$tmp/n$n-$i.sock" ] && break; sleep 0.05; done
  done
  "$DQUANT" bench "${members[@]}" --replicas "$REPL" -c "$CONN" --duration "$SECS" --mix "$MIX" \
    --model "scale$n" --quiet >"$tmp/bench$n.txt"
  total=$(grep '^total ' "$tmp/bench$n.txt")
  rps=$(echo "$total" | awk '{print $5}')
  gbs=$(echo "$total" | awk '{printf "%.4f", $6 / 1000}')
  errs=$(echo "$total" | awk '{print $3}')
  [ -z "$base_rps" ] && base_rps=$rps && base_gbs=$gbs
  eff=$(awk -v r="$rps" -v b="$base_rps" -v n="$n" 'BEGIN { printf "%.3f", r / (n * b) }')
  printf 'nodes %d: %10.1f req/s  %7.3f GB/s  per-node efficiency %s  errors %s\n' "$n" "$rps" "$gbs" "$eff" "$errs"
  rows+=("{\"nodes\": $n, \"requests_per_s\": $rps, \"gb_per_s\": $gbs, \"per_node_efficiency\": $eff, \"errors\": $errs}")
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
done
{
  echo "{"
  echo "  \"command\": \"tests/bench/cluster_scaling.sh (NODES=\\\"$NODES\\\" SECONDS_EACH=$SECS CONNECTIONS=$CONN REPLICAS=$REPL MIX=$MIX)\","
  echo "  \"cpus\": $(nproc), \"load_average_at_end\": \"$(cut -d' ' -f1-3 /proc/loadavg)\","
  echo "  \"shape\": \"dquant bench defaults: 1 layer, 8 kv heads x 128, 128 tokens per PUT, bf16\","
  echo "  \"runs\": ["
  for i in "${!rows[@]}"; do
    sep=","; [ "$i" -eq $((${#rows[@]} - 1)) ] && sep=""
    echo "    ${rows[$i]}$sep"
  done
  echo "  ]"
  echo "}"
} >"$OUT"
echo "wrote $OUT"
