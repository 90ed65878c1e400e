#!/usr/bin/env bash
# transfer_netns.sh [BUILD_DIR]: bench_transfer across a rate-limited link. As root it makes two
# network namespaces joined by a veth pair (a private /30 that exists only inside them: the daemon
# at .1, the prefill and decode processes at .2), limits both directions with tc tbf at each RATE,
# starts dquantd (cpu backend, TCP on the namespace address, so with a shared secret) in one and
# runs the prefill then the decode process in the other, for the bf16 and the raw path, and prints
# a table: rate, path, prefill s, decode s, total s, and the ratios bf16 / raw. Everything it made
# is removed on exit (trap). Each process is bounded by STEP_TIMEOUT seconds.
#
# Environment: RATES ("10gbit 100gbit unlimited"), PATHS ("bf16 raw"), TOKENS (32768), LAYERS (36), KV_HEADS (8),
# HEAD_DIM (128), Q_HEADS (32), PROFILE (dq226), PUT_LAYERS (4), THREADS (nproc), MTU (9000),
# STEP_TIMEOUT (600), RESULT_JSON (a file to write the rows and ratios to; default none).
# Exit 77 (skipped) when not root or when `ip netns` / tc's tbf is unavailable.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-$root/build}
bench=$build/tests/bench/bench_transfer
dquantd=$build/daemon/dquantd
RATES=${RATES:-"10gbit 100gbit unlimited"}
PATHS=${PATHS:-"bf16 raw"}
TOKENS=${TOKENS:-32768}
LAYERS=${LAYERS:-36}
KV_HEADS=${KV_HEADS:-8}
HEAD_DIM=${HEAD_DIM:-128}
Q_HEADS=${Q_HEADS:-32}
PROFILE=${PROFILE:-dq226}
PUT_LAYERS=${PUT_LAYERS:-4}
THREADS=${THREADS:-$(nproc)}
MTU=${MTU:-9000}
STEP_TIMEOUT=${STEP_TIMEOUT:-600}
RESULT_JSON=${RESULT_JSON:-}

skip() {
    echo "transfer_netns: SKIP: $*"
    exit 77
}
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, tc)"
command -v ip >/dev/null && ip netns list >/dev/null 2>&1 || skip "ip netns is unavailable"
command -v tc >/dev/null || skip "tc is unavailable"
command -v python3 >/dev/null || skip "python3 is needed for the table"
[ -x "$bench" ] && [ -x "$dquantd" ] || {
    echo "transfer_netns: build first: $bench, $dquantd" >&2
    exit 1
}

tag=dqx$$
nsd=$tag-d
nsc=$tag-c
addr_d=10.253.77.1
addr_c=10.253.77.2
port=7733
work=$(mktemp -d /tmp/transfer_netns.XXXXXX)
dpid=

cleanup() {
    if [ -n "$dpid" ] && kill -0 "$dpid" 2>/dev/null; then
        kill -TERM "$dpid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$dpid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$dpid" 2>/dev/null || true
    fi
    ip netns del "$nsd" 2>/dev/null || true
    ip netns del "$nsc" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$nsd"
ip netns add "$nsc"
ip link add "$tag"d type veth peer name "$tag"c
ip link set "$tag"d netns "$nsd"
ip link set "$tag"c netns "$nsc"
ip -n "$nsd" addr add $addr_d/30 dev "$tag"d
ip -n "$nsc" addr add $addr_c/30 dev "$tag"c
for ns in "$nsd" "$nsc"; do
    dev=$tag${ns##*-}
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "$dev" mtu "$MTU" up
done
ip -n "$nsc" route get $addr_d >/dev/null

# The daemon's side first: it listens only on the namespace address.
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/secret"
ip netns exec "$nsd" "$dquantd" --backend cpu --listen "tcp://$addr_d:$port" --secret-file "$work/secret" \
    --host-memory 16G --max-payload 2G --max-frame 3G --metrics off --log-level warn >"$work/dquantd.log" 2>&1 &
dpid=$!
for _ in $(seq 100); do
    if ip netns exec "$nsc" bash -c "exec 3<>/dev/tcp/$addr_d/$port" 2>/dev/null; then break; fi
    kill -0 "$dpid" 2>/dev/null || { cat "$work/dquantd.log" >&2; exit 1; }
    sleep 0.1
done

shape=(--tokens "$TOKENS" --layers "$LAYERS" --kv-heads "$KV_HEADS" --head-dim "$HEAD_DIM" --q-heads "$Q_HEADS"
    --profile "$PROFILE" --put-layers "$PUT_LAYERS" --threads "$THREADS")
common=(--connect "tcp://$addr_d:$port" --secret-file "$work/secret" "${shape[@]}")

set_rate() {
    for ns in "$nsd" "$nsc"; do
        dev=$tag${ns##*-}
        tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null || true
        if [ "$1" != unlimited ]; then
            # burst: 1 ms at the rate (at least 64 KiB, one GSO packet), queue: 10 ms.
            bits=$(python3 -c "import sys; s=sys.argv[1].lower(); m={'gbit':1e9,'mbit':1e6}; \
print(int(float(s[:-4])*m[s[-4:]]))" "$1")
            burst=$((bits / 8 / 1000 > 65536 ? bits / 8 / 1000 : 65536))
            tc -n "$ns" qdisc add dev "$dev" root tbf rate "$1" burst "$burst" latency 10ms ||
                skip "tc tbf is unavailable"
        fi
    done
}

rows=$work/rows.jsonl
: >"$rows"
for rate in $RATES; do
    set_rate "$rate"
    for path in $PATHS; do
        for role in prefill decode; do
            echo "transfer_netns: rate $rate, $path, $role" >&2
            out=$(ip netns exec "$nsc" timeout "$STEP_TIMEOUT" "$bench" --role $role --path $path "${common[@]}") || {
                echo "transfer_netns: bench_transfer --role $role --path $path failed at $rate" >&2
                cat "$work/dquantd.log" >&2
                exit 1
            }
            echo "$out" >&2
            echo "$out" | python3 -c 'import sys, json
for l in sys.stdin:
    r = json.loads(l); r["rate"] = sys.argv[1]; print(json.dumps(r))' "$rate" >>"$rows"
        done
    done
done

cmd="RATES=\"$RATES\" PATHS=\"$PATHS\" TOKENS=$TOKENS LAYERS=$LAYERS PUT_LAYERS=$PUT_LAYERS THREADS=$THREADS MTU=$MTU tests/bench/transfer_netns.sh"
python3 - "$rows" "$RESULT_JSON" "$cmd" "$MTU" <<'EOF'
import json, os, platform, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out, cmd, mtu = sys.argv[2], sys.argv[3], int(sys.argv[4])
table, ratios, ok = [], [], True
rates = list(dict.fromkeys(r["rate"] for r in rows))
for rate in rates:
    got = {}
    for path in ("bf16", "raw"):
        sel = [r for r in rows if r["rate"] == rate and r.get("path") == path]
        if not sel:
            continue
        pre = next(r for r in sel if r["role"] == "prefill" and "seconds" in r)
        dec = next(r for r in sel if r["role"] == "decode" and "seconds" in r)
        chk = next(r for r in sel if r["role"] == "decode" and "check" in r)
        ok &= chk["identical"]
        row = {"rate": rate, "path": path, "prefill_s": pre["seconds"], "decode_s": dec["seconds"],
               "total_s": round(pre["seconds"] + dec["seconds"], 4), "sent_bytes": pre["sent_bytes"],
               "received_bytes": dec["received_bytes"], "stored_bytes": pre["stored_bytes"],
               "check": chk["check"], "identical": chk["identical"], "digest": chk["digest"]}
        if "encode_wait_s" in pre:
            row["prefill_encode_wait_s"] = pre["encode_wait_s"]
        got[path] = row
        table.append(row)
    if len(got) < 2:
        continue
    b, r = got["bf16"], got["raw"]
    same = b["digest"] == r["digest"]
    ok &= same
    ratios.append({"rate": rate, "prefill": round(b["prefill_s"] / r["prefill_s"], 3),
                   "decode": round(b["decode_s"] / r["decode_s"], 3),
                   "total": round(b["total_s"] / r["total_s"], 3), "digests_equal": same})
print("%-10s %-5s %10s %10s %10s" % ("rate", "path", "prefill s", "decode s", "total s"))
for t in table:
    print("%-10s %-5s %10.3f %10.3f %10.3f" % (t["rate"], t["path"], t["prefill_s"], t["decode_s"], t["total_s"]))
print("ratio bf16_s / raw_s:")
print("%-10s %10s %10s %10s %8s" % ("rate", "prefill", "decode", "total", "digests"))
for q in ratios:
    print("%-10s %10.3f %10.3f %10.3f %8s" % (q["rate"], q["prefill"], q["decode"], q["total"],
                                             "equal" if q["digests_equal"] else "DIFFER"))
s = rows[0]
doc = {"bench": "bench_transfer over a veth pair between two network namespaces, tc tbf on both ends",
       "command": cmd, "shape": {k: s[k] for k in ("tokens", "layers", "kv_heads", "head_dim", "q_heads", "profile")},
       "threads": s["threads"], "put_layers": s["put_layers"], "mtu": mtu, "cpus": os.cpu_count(),
       "kernel": platform.release(), "rows": table, "ratios_bf16_over_raw": ratios, "all_checks_passed": ok}
if out:
    with open(out, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
sys.exit(0 if ok else 1)
EOF
