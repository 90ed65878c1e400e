#!/usr/bin/env python3
"""Decode attention on D-Quant containers (libdquant-cuda) against PyTorch BF16 attention, same GPU,
same run. Runs bench_cuda (which prints JSON lines), times torch's scaled_dot_product_attention
(enable_gqa=True) on BF16 K/V of the same shapes, and prints the table of ratios, once per attention
kernel of libdquant-cuda (bench_cuda runs once per --attend-kernel value; encode and decompress
are reported from the first run).

  python3 tests/cuda/bench_attn.py --bin build-gpu/tests/cuda/bench_cuda [--json out.json] [--quick]

Shapes: Qwen3-8B (32 query heads, 8 KV heads, head_dim 128), profile dq226, one layer per step.
Timings are CUDA-event medians after warm-up; both sides rotate through several input sets when
one set would fit in L2, so the bytes come from device memory."""
import argparse
import json
import os
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F

QH, KVH, D = 32, 8, 128
# attention kernels compared (bench_cuda --attend-kernel), the default first; --variants picks others
VARIANTS = ["7", "5", "3"]


def time_ms(fn, warm=3, reps=21):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def copy_bw():
    n = 2 << 30
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    x.random_(0, 255)
    y = torch.empty_like(x)
    ms = time_ms(lambda: y.copy_(x), 3, 11)
    del x, y
    torch.cuda.empty_cache()
    return 2.0 * n / (ms * 1e-3)


def sdpa_bf16(batch, ctx):
    per_set = 2 * batch * KVH * ctx * D * 2
    sets = 1
    while sets < 64 and sets * per_set < 400e6:
        sets += 1
    ks = [torch.randn(batch, KVH, ctx, D, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    vs = [torch.randn(batch, KVH, ctx, D, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    q = torch.randn(batch, QH, 1, D, device="cuda", dtype=torch.bfloat16)
    it = [0]

    def run():
        s = it[0] % sets
        it[0] += 1
        F.scaled_dot_product_attention(q, ks[s], vs[s], enable_gqa=True)

    reps = 7 if per_set > 2e9 else 21
    ms = time_ms(run, 3, reps)
    del ks, vs, q
    torch.cuda.empty_cache()
    return ms, per_set + 2 * batch * QH * D * 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build-gpu/tests/cuda/bench_cuda")
    ap.add_argument("--json", default=None, help="write all records here")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="bench_cuda --attend-kernel values, comma-separated")
    args = ap.parse_args()

    # every kernel variant in its own bench_cuda process (each run also times the encoders)
    base = [args.bin] + (["--quick"] if args.quick else [])
    variants = args.variants.split(",")
    runs = {}
    for var in variants:
        cmd = base + ["--attend-kernel", var]
        print("running", " ".join(cmd), flush=True)
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        recs = []
        for line in proc.stdout.splitlines():
            line = line.strip()
            if line.startswith("{"):
                recs.append(json.loads(line))
                print("  ", line, flush=True)
            elif line:
                print("  ", line, flush=True)
        if proc.returncode != 0:
            print(f"bench_cuda exited {proc.returncode}", flush=True)
            if proc.returncode == 77:
                return 77
            return 1
        runs[var] = recs
    recs = runs[variants[0]]

    dev = next(r for r in recs if r["kind"] == "device")
    cbw = next(r for r in recs if r["kind"] == "copy")["bytes_per_s"]
    tbw = copy_bw()
    print(f"\ndevice {dev['name']}, {dev['sms']} SMs; copy bandwidth (read+write): "
          f"{cbw / 1e12:.2f} TB/s (CUDA), {tbw / 1e12:.2f} TB/s (torch)", flush=True)

    out = {"device": dev, "copy_bw": cbw, "copy_bw_torch": tbw, "attn": [], "budget": [], "encode": [],
           "decompress": []}
    bf16 = {}

    def sdpa_cached(batch, ctx):
        if (batch, ctx) not in bf16:
            bf16[(batch, ctx)] = sdpa_bf16(batch, ctx)
        return bf16[(batch, ctx)]

    for var in variants:
        vrecs = runs[var]
        print(f"\nDecode attention, one layer (Qwen3-8B: 32 q heads, 8 kv heads, d 128), dq226 vs BF16 SDPA, "
              f"kernel v{var}")
        print(f"{'batch':>6} {'ctx':>7} | {'dq ms':>9} {'bf16 ms':>9} {'bf16/dq':>8} | {'dq GB/s':>8} {'of copy':>7} | "
              f"{'bf16 GB/s':>9} {'of copy':>7}")
        for r in vrecs:
            if r["kind"] != "attn" or r["tag"] != "grid":
                continue
            bms, bbytes = sdpa_cached(r["batch"], r["ctx"])
            row = dict(r, kernel=var, bf16_ms=bms, bf16_bytes=bbytes, speedup=bms / r["ms"])
            out["attn"].append(row)
            print(f"{r['batch']:>6} {r['ctx']:>7} | {r['ms']:>9.4f} {bms:>9.4f} {bms / r['ms']:>8.3f} | "
                  f"{r['gbps']:>8.1f} {r['copy_frac']:>7.3f} | {bbytes / (bms * 1e6):>9.1f} "
                  f"{bbytes / (bms * 1e-3) / cbw:>7.3f}", flush=True)

        budgets = [r for r in vrecs if r["kind"] == "budget"]
        dq_budget = {r["ctx"]: r for r in vrecs if r["kind"] == "attn" and r["tag"] == "budget"}
        if budgets:
            print(f"\nTokens/s at a fixed KV budget ({budgets[0]['budget_gb']:.0f} GB, "
                  f"{budgets[0]['layers']} layers, one decode step = one attention per layer), kernel v{var}")
            print(f"{'ctx':>7} | {'B bf16':>6} {'bf16 tok/s':>11} | {'B dq':>6} {'dq tok/s':>11} | {'dq/bf16':>7}")
        for b in budgets:
            ctx = b["ctx"]
            bms, _ = sdpa_cached(b["batch_bf16"], ctx)
            tok_bf16 = b["batch_bf16"] / (b["layers"] * bms * 1e-3)
            d = dq_budget.get(ctx)
            tok_dq = b["batch_dq"] / (b["layers"] * d["ms"] * 1e-3) if d else float("nan")
            out["budget"].append(dict(b, kernel=var, bf16_ms=bms, dq_ms=d["ms"] if d else None, tok_bf16=tok_bf16,
                                      tok_dq=tok_dq))
            print(f"{ctx:>7} | {b['batch_bf16']:>6} {tok_bf16:>11.0f} | {b['batch_dq']:>6} {tok_dq:>11.0f} | "
                  f"{tok_dq / tok_bf16:>7.2f}", flush=True)

    print("\nEncode (target >= 50 M streams/s) and decompress")
    for r in recs:
        if r["kind"] == "encode_streams":
            out["encode"].append(r)
            print(f"  encode_streams v{r.get('version', '?')} {r['stream']} ({r.get('grid', 'plain')} grid): "
                  f"{r['streams_per_s'] / 1e6:.2f} M streams/s ({r['streams']} streams)")
        elif r["kind"] == "encode_windows":
            out["encode"].append(r)
            print(f"  encode_windows v{r.get('version', '?')} (bf16, rotation + key mean, {r.get('grid', 'plain')} grid): "
                  f"{r['streams_per_s'] / 1e6:.2f} M streams/s")
        elif r["kind"] == "prefill":
            out["encode"].append(r)
            print(f"  prefill {r['tokens']} tokens x {r['layers']} layers on {r['cuda_streams']} CUDA stream(s) "
                  f"({r.get('grid', 'plain')} grid): {r['ms']:.2f} ms, {r['streams_per_s'] / 1e6:.2f} M streams/s")
        elif r["kind"] == "decompress":
            out["decompress"].append(r)
            print(f"  decompress {r['stream']} -> bf16: {r['bf16_gbps']:.1f} GB/s of BF16 written "
                  f"({r['copy_frac']:.3f} of copy bandwidth counting containers read + BF16 written)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
