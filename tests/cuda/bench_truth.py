#!/usr/bin/env python3
"""bench_truth — D-Quant decode attention (libdquant-cuda) against the fastest BF16 attention on the
same GPU in the same run, per layer and inside a whole Qwen3-8B decode step (issue 19).

  python3 tests/cuda/bench_truth.py [--build build-gpu] [--json PATH] [--quick]

What is measured (Qwen3-8B: 32 query heads, 8 KV heads, head_dim 128; profile dq226):

* Attention per layer at (batch, context) = (1, 8K+100), (1, 32K+100), (1, 128K+100), (8, 32K+57),
  (32, 32K+13), (128, 8K+100). D-Quant: one dqcu_attend call, i.e. every kernel the library
  launches for it (query preparation, the sealed windows' containers, the BF16 tail of
  context mod 128 tokens, the log-sum-exp merge). BF16: every attention torch offers here
  (scaled_dot_product_attention with its default choice and with each backend forced through
  torch.nn.attention.sdpa_kernel, the GQA heads passed with enable_gqa or folded into the query
  length, plus flash_attn / flash_attn_interface when importable); each is checked against a
  float64 reference and the fastest correct one is the reference (bf16_backend).
* End to end: one decode step of a Qwen3-8B-shaped model (36 layers of RMSNorm, fused q/k/v
  projection, q/k RMSNorm, RoPE, the new token's K/V appended to the cache, attention, o
  projection, gate/up and down MLP 4096 -> 12288 -> 4096; final norm and the 151,936-word LM head;
  random BF16 weights) at the largest batch whose KV cache fits a fixed budget (100 GB), at 8K+100
  and 32K+100 tokens of context. BF16 KV: 36 x 2 x 8 x 128 x 2 bytes per token. D-Quant: the window
  records (containers + amortized key means, 73,986 B per 128 tokens per layer) plus a BF16 tail
  buffer of R = 128 tokens per sequence and layer. The D-Quant step runs the library's kernels on
  real containers (encoded on the GPU by dqcu_encode_windows from random K/V) on torch's stream,
  inside the same CUDA graph as the GEMMs. The windows sealed while decoding (one per sequence
  and layer every 128 steps) are encoded in a separate graph and their time, amortized per step,
  is added to the D-Quant step (seal_ms): the engine seals after the step, every layer's filled
  windows in one dqcu_encode_windows call (and one transcode); the tail buffer holds their
  tokens until then. seal_ms_per_layer (one call per layer, as each layer's append finds its
  window full) is timed and reported beside it.
* The fixed-width family (--layouts ...,fixed226; opt-in): fixed226 (D-Quant's preprocessing,
  base-M packed levels, no rANS) encoded on the GPU by dqcu_encode_windows, transcoded by
  dqcu_transcode_hot to 3 + 2-bit codes and attended by dqcu_attend_hot: attention rows per shape
  beside dq226's, and its own end-to-end phase (e2e-fixed226: the batch from its hot windows'
  bytes, sealing = its GPU encode + transcode, amortized). Its attention is checked against float64
  attention over its records decoded by libdquant on the host (dqcu_decompress has no fixed-width
  path). Give it time: --time-budget 600 or more.

Timing: GPU time on both sides. Each measurement captures one CUDA graph of many calls
(back-to-back launches; a plain launch loop if capture fails, reported as "loop"), replays it
after warm-up and reports the median replay time divided by the calls. Inputs rotate through
enough sets that every pass reads at least 4x the L2 (60 MB on the H200) from device memory, on
both sides. Each attention side is timed twice (D-Quant before and after the BF16 candidates)
and the pooled replays' median is reported, with both runs. --bf16 picks the candidates (names,
comma-separated); --bf16 none times D-Quant alone (twice, back to back; no ratios), for A/B runs
of D-Quant builds (the BF16 side times every candidate, 8 on the H200, at every shape).

Robustness: each part runs in a child process (attention, BF16 end to end, D-Quant end to end)
with its own time limit; every finished row is written at once, so a failure or a timeout in one
shape or part leaves the others' figures in the JSON. --quick: fewer replays, a small reused
container pool for the end-to-end D-Quant cache. --dry-run prints the plan (no GPU needed);
--self-test checks the planning, orchestration and report logic with fake timings (no GPU).
Output: a table of ratios (BF16 time / D-Quant time, D-Quant tokens/s / BF16 tokens/s) and the
JSON (default tests/bench/results/gpu_attention.json) with one row per attention shape and one
per end-to-end configuration."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

import dqcu_ctypes as dqc  # noqa: E402

# Qwen3-8B
MODEL = {
    "name": "Qwen3-8B",
    "layers": 36,
    "hidden": 4096,
    "q_heads": 32,
    "kv_heads": 8,
    "head_dim": 128,
    "intermediate": 12288,
    "vocab": 151936,
    "rope_theta": 1e6,
    "rms_eps": 1e-6,
}
PROFILE = "dq226"
# dq226 at n = 8 x 128, for --dry-run and --fake when libdquant is not at hand (checked against the
# library whenever it is loaded)
DQ226_WINDOW_BYTES, DQ226_W, DQ226_R = 73986, 128, 128
# the same windows in the hot layout (dquant/hot.h: 3 + 3-bit codes, s/o, the key mean)
DQ226_HOT_BYTES = 100368
# fixed226 at n = 8 x 128: window record and hot window (3 + 2-bit codes), checked like dq226's
FIXED226_WINDOW_BYTES, FIXED226_HOT_BYTES = 71042, 83984
# how the sealed windows are held: "containers" (window records, attention v7 with rANS in its loop),
# "hot" (transcoded to fixed-width codes, dqcu_attend_hot), "fixed226" (the fixed-width profile
# fixed226 encoded on the GPU, transcoded and attended in the hot layout; opt-in) or "containers2"
# (dq226p: format version 2's records, joint-pair rANS in attention v7's loop; opt-in)
LAYOUTS = ("containers", "hot", "fixed226", "containers2")
DEFAULT_LAYOUTS = "containers,hot"
LAYOUT_PROFILE = {"containers": PROFILE, "hot": PROFILE, "fixed226": "fixed226", "containers2": "dq226p"}
# the layouts attended over hot windows (dqcu_attend_hot); the others over window records (dqcu_attend)
HOT_LAYOUTS = ("hot", "fixed226")
# (window record, hot window) bytes per profile, for --dry-run and --fake (dq226p: dq226's containers)
PROFILE_BYTES = {PROFILE: (DQ226_WINDOW_BYTES, DQ226_HOT_BYTES),
                 "fixed226": (FIXED226_WINDOW_BYTES, FIXED226_HOT_BYTES),
                 "dq226p": (DQ226_WINDOW_BYTES, DQ226_HOT_BYTES)}
# profiles whose records only libdquant decodes on the host (dqcu_decompress has no fixed-width path)
HOST_DECODE = ("fixed226",)

DEFAULT_SHAPES = "1:8292,1:32868,1:131172,8:32825,32:32781,128:8292"  # 8K+100, 32K+100, 128K+100, ...
DEFAULT_E2E = "8292,32868"
PHASES = ("attn", "e2e-bf16", "e2e-dq", "e2e-hot", "e2e-fixed226", "e2e-dq2")
# the layout of each end-to-end D-Quant phase (the default phases: attn, e2e-bf16 and these of --layouts)
E2E_LAYOUT = {"e2e-dq": "containers", "e2e-hot": "hot", "e2e-fixed226": "fixed226", "e2e-dq2": "containers2"}
# share of --time-budget a phase may take at most (the last takes what is left)
PHASE_SHARE = {"attn": 0.45, "e2e-bf16": 0.2, "e2e-dq": 0.3, "e2e-hot": 0.25, "e2e-fixed226": 1.0, "e2e-dq2": 1.0}
REL_TOL_BF16 = 2e-2  # a BF16 attention's output against float64 (BF16 rounding: ~4e-3)
REL_TOL_DQ = 1e-3  # dqcu_attend against float64 attention over the decoded containers (checkcuda's)
DEV = "cuda"  # torch device of every tensor ("cpu" in the --sim self-check)


def log(*a: Any) -> None:
    print(*a, flush=True)


# ---------------------------------------------------------------------------------------------
# planning (pure; no torch)


def parse_shapes(text: str) -> List[Tuple[int, int]]:
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            b, c = item.split(":")
            b, c = int(b), int(c)
        except ValueError:
            raise ValueError(f"bad shape {item!r}: want BATCH:CONTEXT")
        if b < 1 or c < 1:
            raise ValueError(f"bad shape {item!r}: batch and context must be >= 1")
        out.append((b, c))
    return out


def parse_contexts(text: str) -> List[int]:
    if text.strip() in ("", "none"):
        return []
    out = []
    for item in text.split(","):
        c = int(item)
        if c < 1:
            raise ValueError(f"bad context {c}")
        out.append(c)
    return out


def parse_layouts(text: str) -> List[str]:
    """--layouts: a comma-separated subset of LAYOUTS, at least one."""
    out = [x for x in text.split(",") if x]
    for x in out:
        if x not in LAYOUTS:
            raise ValueError(f"unknown layout {x!r} (choose from {', '.join(LAYOUTS)})")
    if not out:
        raise ValueError("no layout")
    return out


def default_phases(layouts: Sequence[str]) -> str:
    """attn, e2e-bf16, then the end-to-end phase of each layout asked for (in PHASES order)."""
    return ",".join(["attn", "e2e-bf16"] + [p for p, lay in E2E_LAYOUT.items() if lay in layouts])


def bf16_bytes_per_token(m: Dict[str, Any] = MODEL) -> int:
    """BF16 K and V of one token over all layers."""
    return m["layers"] * 2 * m["kv_heads"] * m["head_dim"] * 2


def dq_bytes_per_seq(ctx: int, window_bytes: int, W: int, R: int, m: Dict[str, Any] = MODEL) -> int:
    """A sequence of ctx tokens held by D-Quant over all layers: its sealed windows' records and a
    BF16 tail buffer of R tokens (K and V) per layer."""
    n = m["kv_heads"] * m["head_dim"]
    return m["layers"] * ((ctx // W) * window_bytes + R * n * 2 * 2)


def budget_batches(ctx: int, budget_bytes: float, window_bytes: int, W: int, R: int,
                   m: Dict[str, Any] = MODEL) -> Tuple[int, int]:
    """(D-Quant batch, BF16 batch): the most sequences of ctx tokens whose KV fits the budget."""
    b_dq = int(budget_bytes // dq_bytes_per_seq(ctx, window_bytes, W, R, m))
    b_bf16 = int(budget_bytes // (ctx * bf16_bytes_per_token(m)))
    return b_dq, b_bf16


def sets_for(per_set_bytes: float, rot_bytes: float, max_sets: int = 256) -> int:
    """Input sets to rotate through so that one pass over them touches at least rot_bytes."""
    if per_set_bytes <= 0:
        return 1
    return int(max(1, min(max_sets, math.ceil(rot_bytes / per_set_bytes))))


def calls_per_graph(est_ms: float, sets: int, target_ms: float, max_calls: int = 4096) -> int:
    """Calls captured in one graph: a whole number of passes over the sets, about target_ms long."""
    est_ms = max(est_ms, 1e-4)
    passes = max(1, math.ceil(target_ms / (est_ms * sets)))
    n = sets * passes
    if n > max_calls:
        n = max(sets, (max_calls // sets) * sets)
    return n


def dq_attn_plan(B: int, T: int, wb: int, W: int, R: int, rot_bytes: float, m: Dict[str, Any] = MODEL):
    n = m["kv_heads"] * m["head_dim"]
    nwin, tail = divmod(T, W)
    per_set = B * nwin * wb + B * tail * n * 2 * 2
    return {"nwin": nwin, "tail": tail, "bytes_per_call": per_set, "sets": sets_for(per_set, rot_bytes),
            "windows_per_set": B * nwin}


def bf16_attn_plan(B: int, T: int, rot_bytes: float, m: Dict[str, Any] = MODEL):
    per_set = 2 * B * m["kv_heads"] * T * m["head_dim"] * 2
    return {"bytes_per_call": per_set, "sets": sets_for(per_set, rot_bytes)}


def weight_bytes(m: Dict[str, Any] = MODEL) -> int:
    H, I, D = m["hidden"], m["intermediate"], m["head_dim"]
    qd, kd = m["q_heads"] * D, m["kv_heads"] * D
    per_layer = H * (qd + 2 * kd) + qd * H + H * 2 * I + I * H
    return 2 * (m["layers"] * per_layer + m["vocab"] * H)


def e2e_plan(ctx: int, budget: float, wb: int, W: int, R: int, m: Dict[str, Any] = MODEL):
    b_dq, b_bf16 = budget_batches(ctx, budget, wb, W, R, m)
    nwin = ctx // W
    return {"context": ctx, "nwin": nwin, "tail": ctx - nwin * W, "batch": b_dq, "bf16_batch": b_bf16,
            "dq_kv_bytes": b_dq * dq_bytes_per_seq(ctx, wb, W, R, m),
            "bf16_kv_bytes": b_bf16 * ctx * bf16_bytes_per_token(m),
            "windows": m["layers"] * b_dq * nwin,
            "dq_bytes_per_token": (m["layers"] * wb) / W}


def fmt_ms(x: Optional[float]) -> str:
    return f"{x:.4f}" if isinstance(x, (int, float)) and x == x else "-"


def fmt_num(x: Optional[float], spec: str) -> str:
    return format(x, spec) if isinstance(x, (int, float)) and x == x else "-"


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def short_error(e: BaseException) -> str:
    s = f"{type(e).__name__}: {e}".strip().replace("\n", " ")
    return s if len(s) < 300 else s[:297] + "..."


# ---------------------------------------------------------------------------------------------
# results: parts written by the phases, merged by the parent


class Part:
    """What one phase has found so far; written to disk after every change."""

    def __init__(self, path: Optional[str], phase: str):
        self.path, self.phase = path, phase
        self.data: Dict[str, Any] = {"phase": phase, "meta": {}, "rows": [], "notes": [], "failures": [],
                                     "done": False}
        self.write()

    def meta(self, **kw: Any) -> None:
        self.data["meta"].update(kw)
        self.write()

    def row(self, r: Dict[str, Any]) -> None:
        self.data["rows"].append(r)
        self.write()

    def note(self, s: str) -> None:
        log("note:", s)
        self.data["notes"].append(s)
        self.write()

    def fail(self, what: str, err: str) -> None:
        log(f"FAILED {what}: {err}")
        self.data["failures"].append({"what": what, "error": err})
        self.write()

    def finish(self) -> None:
        self.data["done"] = True
        self.write()

    def write(self) -> None:
        if self.path:
            write_json(self.path, self.data)


def write_json(path: str, data: Any) -> None:
    p = pathlib.Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=str)
        f.write("\n")
    os.replace(tmp, p)


def read_part(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def merge(args: argparse.Namespace, parts: Dict[str, Optional[Dict[str, Any]]], phase_status: Dict[str, str],
          started: float) -> Dict[str, Any]:
    """The final report: the attention rows, then one e2e row per context with both sides."""
    out: Dict[str, Any] = {
        "tool": "tests/cuda/bench_truth.py",
        "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "quick": bool(args.quick),
        "fake": bool(args.fake),
        "wall_s": round(time.time() - started, 1),
        "model": MODEL,
        "profile": PROFILE,
        "layout_profiles": {lay: LAYOUT_PROFILE[lay] for lay in parse_layouts(args.layouts)},
        "budget_gb": args.budget_gb,
        "method": ("GPU time per call: median over graph replays of N back-to-back calls (one CUDA graph), "
                   "divided by N; inputs rotated over >= max(rot_mb, 4 x L2) bytes on both sides"),
        "phases": phase_status,
        "meta": {},
        "rows": [],
        "notes": [],
        "failures": [],
    }
    for name in PHASES:
        p = parts.get(name)
        if not p:
            continue
        for k, v in p.get("meta", {}).items():
            out["meta"].setdefault(k, v)
        out["notes"] += [f"{name}: {n}" for n in p.get("notes", [])]
        out["failures"] += [dict(f, phase=name) for f in p.get("failures", [])]
    attn = parts.get("attn") or {}
    out["rows"] += [r for r in attn.get("rows", [])]
    bf = {r["context"]: r for r in (parts.get("e2e-bf16") or {}).get("rows", [])}
    for phase, layout in E2E_LAYOUT.items():
        _merge_e2e(args, out, bf, {r["context"]: r for r in (parts.get(phase) or {}).get("rows", [])}, layout,
                   phase in parts)
    return out


def _merge_e2e(args: argparse.Namespace, out: Dict[str, Any], bf: Dict[int, Any], dq: Dict[int, Any], layout: str,
               ran: bool) -> None:
    """One e2e row per context of a D-Quant layout whose phase ran, with the BF16 side."""
    if not ran and not dq:
        return
    for ctx in sorted(set(bf) | set(dq)):
        b, d = bf.get(ctx, {}), dq.get(ctx, {})
        what = "hot windows, dqcu_attend_hot" if layout in HOT_LAYOUTS else "window records, attention v7"
        r: Dict[str, Any] = {"kind": "e2e",
                             "layout": layout,
                             "profile": LAYOUT_PROFILE[layout],
                             "config": f"{MODEL['name']} decode step, {args.budget_gb:g} GB KV budget, "
                                       f"context {ctx}, {LAYOUT_PROFILE[layout]} {what}, sealed once a step",
                             "context": ctx,
                             "batch": d.get("batch"),
                             "tokens_per_s": d.get("tokens_per_s"),
                             "bf16_batch": b.get("bf16_batch"),
                             "bf16_tokens_per_s": b.get("bf16_tokens_per_s"),
                             "ratio": None}
        if isinstance(r["tokens_per_s"], (int, float)) and isinstance(r["bf16_tokens_per_s"], (int, float)) \
                and r["bf16_tokens_per_s"] > 0:
            r["ratio"] = r["tokens_per_s"] / r["bf16_tokens_per_s"]
        for k, v in d.items():
            r.setdefault(k, v)
        for k, v in b.items():
            r.setdefault(k, v)
        errs = [x for x in (d.get("error"), b.get("error")) if x]
        if errs:
            r["error"] = "; ".join(errs)
        out["rows"].append(r)


def print_tables(rep: Dict[str, Any]) -> None:
    meta = rep.get("meta", {})
    dev = meta.get("device", {})
    log("")
    if dev:
        log(f"device {dev.get('name')}, {dev.get('sms')} SMs, L2 {dev.get('l2_mb')} MB; torch {dev.get('torch')}; "
            f"copy bandwidth (read+write, torch) {fmt_num(meta.get('copy_tbps'), '.2f')} TB/s")
    attn = [r for r in rep["rows"] if r.get("kind") == "attention"]
    if attn:
        log(f"Decode attention, one layer ({MODEL['q_heads']} q heads, {MODEL['kv_heads']} kv heads, "
            f"d {MODEL['head_dim']}), {PROFILE} incl. its BF16 tail vs the fastest BF16 attention; GPU ms per call")
        log(f"{'batch':>6} {'context':>8} | {'dq ms':>8} {'bf16 ms':>8} {'bf16/dq':>8} | {'dq GB/s':>8} "
            f"{'bf16 GB/s':>9} | bf16 backend")
        for r in attn:
            if r.get("error") and r.get("ratio") is None:
                log(f"{r['batch']:>6} {r['context']:>8} | FAILED: {r['error']} [{r.get('layout', '-')}]")
                continue
            log(f"{r['batch']:>6} {r['context']:>8} | {fmt_ms(r.get('dq_ms')):>8} {fmt_ms(r.get('bf16_ms')):>8} "
                f"{fmt_num(r.get('ratio'), '.3f'):>8} | {fmt_num(r.get('dq_gbps'), '.0f'):>8} "
                f"{fmt_num(r.get('bf16_gbps'), '.0f'):>9} | {r.get('bf16_backend') or '-'} [{r.get('layout', '-')}]")
    e2e = [r for r in rep["rows"] if r.get("kind") == "e2e"]
    if e2e:
        log(f"\nEnd to end: {MODEL['name']}-shaped decode step ({MODEL['layers']} layers, BF16 weights, LM head), "
            f"largest batch in {rep.get('budget_gb')} GB of KV")
        log(f"{'context':>8} | {'B dq':>5} {'dq tok/s':>9} {'step ms':>8} {'attn':>7} {'seal':>6} | "
            f"{'B bf16':>6} {'bf16 tok/s':>10} {'step ms':>8} {'attn':>7} | {'dq/bf16':>7}")
        for r in e2e:
            log(f"{r['context']:>8} | {fmt_num(r.get('batch'), 'd'):>5} {fmt_num(r.get('tokens_per_s'), '.0f'):>9} "
                f"{fmt_num(r.get('step_ms'), '.2f'):>8} {fmt_num(r.get('attn_ms'), '.2f'):>7} "
                f"{fmt_num(r.get('seal_ms'), '.2f'):>6} | {fmt_num(r.get('bf16_batch'), 'd'):>6} "
                f"{fmt_num(r.get('bf16_tokens_per_s'), '.0f'):>10} {fmt_num(r.get('bf16_step_ms'), '.2f'):>8} "
                f"{fmt_num(r.get('bf16_attn_ms'), '.2f'):>7} | {fmt_num(r.get('ratio'), '.3f'):>7} "
                f"[{r.get('layout', '-')}]"
                + (f"  ERROR: {r['error']}" if r.get("error") else ""))
    for f in rep.get("failures", []):
        log(f"failure [{f.get('phase')}] {f.get('what')}: {f.get('error')}")
    for n in rep.get("notes", []):
        log(f"note: {n}")


# ---------------------------------------------------------------------------------------------
# fake phases (no torch, no GPU): synthetic figures through the same reporting, for --self-test


def fake_phase(args: argparse.Namespace, phase: str, part: Part) -> None:
    fail = set(parse_shapes(args.fake_fail)) if args.fake_fail else set()
    part.meta(device={"name": "fake", "sms": 0, "l2_mb": 60.0, "torch": "none"}, copy_tbps=4.2,
              window_bytes=DQ226_WINDOW_BYTES)
    wb, W, R = DQ226_WINDOW_BYTES, DQ226_W, DQ226_R
    per_token = {"containers": 2.6e-6, "hot": 0.6e-6, "fixed226": 0.5e-6, "containers2": 2.0e-6}
    if phase == "attn":
        for B, T in parse_shapes(args.shapes):
            for layout in parse_layouts(args.layouts):
                per_tok = per_token[layout]
                if (B, T) in fail:
                    part.row({"kind": "attention", "layout": layout, "batch": B, "context": T, "dq_ms": None,
                              "bf16_ms": None, "bf16_backend": None, "ratio": None,
                              "error": "RuntimeError: injected failure"})
                    part.fail(f"attention ({B}, {T}) {layout}", "RuntimeError: injected failure")
                    continue
                dq_ms = 0.02 + B * T * per_tok
                bf_ms = 0.005 + B * T * 0.98e-6
                part.row({"kind": "attention", "layout": layout, "batch": B, "context": T, "dq_ms": dq_ms,
                          "bf16_ms": bf_ms, "bf16_backend": "fake", "ratio": bf_ms / dq_ms})
    elif phase == "e2e-bf16":
        for ctx in parse_contexts(args.e2e):
            _, b = budget_batches(ctx, args.budget_gb * 1e9, wb, W, R)
            step = 3.6 + MODEL["layers"] * b * ctx * 0.98e-6
            part.row({"context": ctx, "bf16_batch": b, "bf16_step_ms": step, "bf16_attn_ms": step - 3.6,
                      "bf16_tokens_per_s": b / (step * 1e-3), "bf16_backend": "fake"})
    elif phase in E2E_LAYOUT:
        layout = E2E_LAYOUT[phase]
        rec_b, hot_b = PROFILE_BYTES[LAYOUT_PROFILE[layout]]
        for ctx in parse_contexts(args.e2e):
            b, _ = budget_batches(ctx, args.budget_gb * 1e9, hot_b if layout in HOT_LAYOUTS else rec_b, W, R)
            attn = MODEL["layers"] * b * ctx * per_token[layout]
            step = 12.0 + attn
            part.row({"context": ctx, "batch": b, "step_ms": step, "attn_ms": attn, "seal_ms": 0.5,
                      "tokens_per_s": b / ((step + 0.5) * 1e-3)})
    part.finish()


# ---------------------------------------------------------------------------------------------
# GPU side (torch imported here only)


class CodecSet:
    """A profile on the device: its host and device codecs, window record and hot window bytes.
    host_decode: the checks decode its records with libdquant on the host (dqcu_decompress has no
    fixed-width path)."""

    def __init__(self, name: str, hc, dc, wb: int, hb: int, host_decode: bool):
        self.name, self.hc, self.dc, self.wb, self.hb, self.host_decode = name, hc, dc, wb, hb, host_decode


class Gpu:
    """torch, the device, libdquant-cuda and a dq226 device codec (others, such as fixed226, on
    demand: cs())."""

    def __init__(self, args: argparse.Namespace, part: Part):
        import torch

        self.torch = torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
        props = torch.cuda.get_device_properties(0)
        l2 = int(getattr(props, "L2_cache_size", 0) or 60 * 1024 * 1024)
        self.dev = {"name": props.name, "sms": props.multi_processor_count, "l2_mb": round(l2 / 2**20, 1),
                    "mem_gb": round(props.total_memory / 1e9, 1), "cc": f"{props.major}.{props.minor}",
                    "torch": torch.__version__, "cuda": torch.version.cuda}
        self.l2 = l2
        self.rot = max(args.rot_mb * 1e6, 4.0 * l2)
        self.lib = dqc.CudaLib(args.build)
        if self.lib.device_count() < 1:
            raise RuntimeError("libdquant-cuda sees no device of compute capability 9.0")
        self.shape_attrs()
        self.hc = dqc.HostCodec(self.lib, PROFILE, self.KVH, self.D)
        self.dc = dqc.DeviceCodec(self.lib, self.hc, args.attend_kernel, args.hot_kernel)
        rc = self.dc.attend_check(self.QH)
        if rc:
            raise RuntimeError(f"dqcu_attend_check({self.QH} q heads): {self.lib.err_name(rc)}")
        self.kernel = self.dc.attend_kernel(self.QH)
        self.W, self.R, self.wb = self.hc.window, self.hc.residual, self.hc.window_bytes
        self.hb = self.dc.hot_window_bytes()
        rc = self.dc.attend_hot_check(self.QH)
        if rc:
            raise RuntimeError(f"dqcu_attend_hot_check({self.QH} q heads): {self.lib.err_name(rc)}")
        self.hot_kernel = self.dc.attend_hot_kernel(self.QH)
        self.kernel_args = (args.attend_kernel, args.hot_kernel)
        self.part = part
        self.codecs: Dict[str, CodecSet] = {PROFILE: CodecSet(PROFILE, self.hc, self.dc, self.wb, self.hb, False)}
        if self.W != DQ226_W or self.wb != DQ226_WINDOW_BYTES:
            part.note(f"{PROFILE}: W {self.W}, window record {self.wb} B (this script's table says "
                      f"{DQ226_W} / {DQ226_WINDOW_BYTES})")
        self.reps = args.reps
        self.target_ms = args.target_ms
        self.copy_tbps = self.copy_bandwidth() / 1e12
        part.meta(device=self.dev, copy_tbps=round(self.copy_tbps, 3), attend_kernel=self.kernel,
                  hot_kernel=self.hot_kernel, window_bytes=self.wb, W=self.W, R=self.R, rot_bytes=self.rot,
                  dq_bytes_per_token_layer=self.wb / self.W, hot_window_bytes=self.hb,
                  hot_bytes_per_token_layer=self.hb / self.W)
        log(f"device {self.dev['name']} ({self.dev['sms']} SMs, L2 {self.dev['l2_mb']} MB, "
            f"{self.dev['mem_gb']} GB), torch {torch.__version__} (CUDA {torch.version.cuda}); libdquant-cuda "
            f"attention v{self.kernel}; copy {self.copy_tbps:.2f} TB/s; inputs rotated over >= "
            f"{self.rot / 1e6:.0f} MB")

    def cs(self, layout: str) -> CodecSet:
        """The codecs of a layout's profile (made at the first call)."""
        name = LAYOUT_PROFILE[layout]
        if name not in self.codecs:
            hc = dqc.HostCodec(self.lib, name, self.KVH, self.D)
            dc = dqc.DeviceCodec(self.lib, hc, *self.kernel_args)
            rc = dc.attend_hot_check(self.QH) if layout in HOT_LAYOUTS else dc.attend_check(self.QH)
            if rc:
                raise RuntimeError(f"{name}: the {layout} layout's attention check ({self.QH} q heads): "
                                   f"{self.lib.err_name(rc)}")
            if hc.window != self.W or hc.residual != self.R:
                raise RuntimeError(f"{name}: W {hc.window}, R {hc.residual}; {PROFILE} has {self.W}, {self.R}")
            cs = CodecSet(name, hc, dc, hc.window_bytes, dc.hot_window_bytes(), name in HOST_DECODE)
            if (cs.wb, cs.hb) != PROFILE_BYTES.get(name, (cs.wb, cs.hb)):
                self.part.note(f"{name}: window record {cs.wb} B, hot window {cs.hb} B (this script's table "
                               f"says {PROFILE_BYTES[name]})")
            self.part.meta(**{f"{name}_window_bytes": cs.wb, f"{name}_hot_window_bytes": cs.hb,
                              f"{name}_hot_kernel": dc.attend_hot_kernel(self.QH)})
            if layout not in HOT_LAYOUTS:  # raises where dqcu_attend refuses the profile
                self.part.meta(**{f"{name}_attend_kernel": dc.attend_kernel(self.QH)})
            log(f"{name}: window record {cs.wb} B, hot window {cs.hb} B per {hc.window} tokens")
            self.codecs[name] = cs
        return self.codecs[name]

    def shape_attrs(self) -> None:
        m = MODEL
        self.QH, self.KVH, self.D = m["q_heads"], m["kv_heads"], m["head_dim"]
        self.G = self.QH // self.KVH
        self.n = self.KVH * self.D
        self.scale = 1.0 / math.sqrt(self.D)

    # -- helpers

    def stream(self) -> int:
        return self.torch.cuda.current_stream().cuda_stream

    def free_bytes(self) -> int:
        return self.torch.cuda.mem_get_info()[0]

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def cleanup(self) -> None:
        gc.collect()
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()

    def copy_bandwidth(self) -> float:
        torch = self.torch
        n = 1 << 30
        bufs = [torch.empty(n, dtype=torch.uint8, device=DEV).random_(0, 255)]
        bufs.append(torch.empty_like(bufs[0]))
        t = self.time_calls(lambda i: bufs[1].copy_(bufs[0]), 1, est_ms=0.5)
        bufs.clear()
        self.cleanup()
        return 2.0 * n / (t["ms"] * 1e-3)

    def loop_ms(self, issue: Callable[[int], Any], n: int) -> float:
        """Events around n back-to-back eager calls, divided (the estimate before a graph)."""
        torch = self.torch
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(n):
            issue(i)
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / n

    def time_calls(self, issue: Callable[[int], Any], sets: int, est_ms: Optional[float] = None,
                   reps: Optional[int] = None, target_ms: Optional[float] = None,
                   warm: Optional[int] = None) -> Dict[str, Any]:
        """GPU ms per call of issue(i) (call i uses input set i mod sets): warm-up on a side stream,
        one CUDA graph of N calls (N a whole number of passes over the sets, ~target_ms), median of
        the replays / N. Falls back to an eager loop of N calls when capture fails."""
        torch = self.torch
        reps = reps or self.reps
        target_ms = target_ms or self.target_ms
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(min(sets, 3) + 1 if warm is None else warm):
                issue(i)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        if est_ms is None:
            est_ms = self.loop_ms(issue, min(max(sets, 2), 8))
        n = calls_per_graph(est_ms, sets, target_ms)
        method, why = "graph", None
        g = None
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, capture_error_mode="relaxed"):
                for i in range(n):
                    issue(i)
            run: Callable[[], Any] = g.replay
        except Exception as e:  # noqa: BLE001 - any capture failure: time the loop instead
            why = short_error(e)
            g = None
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
            method = "loop"

            def run() -> None:
                for i in range(n):
                    issue(i)
        run()
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            run()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) / n)
        del g
        res = {"ms": median(ts), "times": ts, "calls": n, "method": method, "est_ms": est_ms}
        if why:
            res["capture_error"] = why
        return res


def ref_attention(torch, q, K, V, scale: float, G: int):
    """float64 attention of one sequence: q [QH, D], K/V [T, KVH, D] -> [QH, D] (query head h reads
    KV head h // G)."""
    QH, D = q.shape
    KVH = K.shape[1]
    qg = q.double().view(KVH, G, D)
    s = torch.einsum("hgd,thd->hgt", qg, K.double()) * scale
    p = torch.softmax(s, dim=-1)
    return torch.einsum("hgt,thd->hgd", p, V.double()).reshape(QH, D)


def rel_err(torch, out, ref) -> float:
    out, ref = out.double(), ref.double()
    if not bool(torch.isfinite(out).all()):
        return float("inf")
    return float(torch.linalg.norm(out - ref) / max(float(torch.linalg.norm(ref)), 1e-300))


# -- BF16 attention candidates


def parse_bf16(text: str) -> Optional[List[str]]:
    """--bf16: "all" (None: every candidate), "none" ([]: the BF16 side not timed) or candidate
    names, comma-separated."""
    if text == "all":
        return None
    if text == "none":
        return []
    names = [x for x in text.split(",") if x]
    if not names or any(x in ("all", "none") for x in names):
        raise ValueError(f"--bf16 {text!r}: all, none or candidate names")
    return names


def pick_candidates(cands: List[Tuple[str, Callable]], which: Optional[List[str]]) -> List[Tuple[str, Callable]]:
    """The candidates --bf16 names (all for None); a name no candidate has is an error."""
    if which is None:
        return cands
    have = [c[0] for c in cands]
    unknown = [x for x in which if x not in have]
    if unknown:
        raise ValueError(f"--bf16: no candidate {', '.join(unknown)} (have {', '.join(have)})")
    return [c for c in cands if c[0] in which]


def bf16_candidates(gpu: Gpu, which: Optional[List[str]]) -> List[Tuple[str, Callable]]:
    """(name, fn(q [B, QH, 1, D], k [B, KVH, T, D], v) -> tensor of B·QH·D values in (b, h, d) order),
    those of which (parse_bf16)."""
    return pick_candidates(all_bf16_candidates(gpu), which)


def all_bf16_candidates(gpu: Gpu) -> List[Tuple[str, Callable]]:
    import torch.nn.functional as F

    KVH, G, D, scale = gpu.KVH, gpu.G, gpu.D, gpu.scale
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        SDPBackend = sdpa_kernel = None
    backends: List[Tuple[str, Any]] = [("default", None)]
    if SDPBackend is not None:
        for name, attr in (("flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION"),
                           ("efficient", "EFFICIENT_ATTENTION")):
            if hasattr(SDPBackend, attr):
                backends.append((name, getattr(SDPBackend, attr)))
    if isinstance(gpu, SimGpu):
        return sim_candidates(gpu)
    cands: List[Tuple[str, Callable]] = []
    for bname, be in backends:
        for mode in ("gqa", "fold"):
            def fn(q, k, v, be=be, mode=mode):
                cm = sdpa_kernel([be]) if be is not None else contextlib.nullcontext()
                with cm:
                    if mode == "gqa":
                        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
                    # the G query heads of a KV head as G query positions: no K/V expansion
                    return F.scaled_dot_product_attention(q.view(q.shape[0], KVH, G, D), k, v, scale=scale)
            cands.append((f"sdpa-{bname}-{mode}", fn))
    try:
        from flash_attn import flash_attn_with_kvcache as fa2  # type: ignore

        def fn_fa2(q, k, v):
            B = q.shape[0]
            return fa2(q.view(B, 1, q.shape[1], D), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale)
        cands.append(("flash_attn-kvcache", fn_fa2))
    except Exception:  # noqa: BLE001 - not installed, or broken: not a candidate
        pass
    try:
        from flash_attn_interface import flash_attn_with_kvcache as fa3  # type: ignore

        def fn_fa3(q, k, v):
            B = q.shape[0]
            o = fa3(q.view(B, 1, q.shape[1], D), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale)
            return o[0] if isinstance(o, tuple) else o
        cands.append(("flash_attn3-kvcache", fn_fa3))
    except Exception:  # noqa: BLE001
        pass
    return cands


def pick_bf16(gpu: Gpu, cands, q, k, v, nb: int, ref, issue_for: Callable[[Callable], Callable[[int], Any]],
              sets: int) -> Tuple[Optional[str], Dict[str, Any]]:
    """Checks every candidate on set 0 (first nb sequences against ref [nb, QH, D]) and times the
    correct ones; returns (fastest name, {name: result or error})."""
    torch = gpu.torch
    res: Dict[str, Any] = {}
    best, best_ms = None, float("inf")
    for name, fn in cands:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                o = fn(q, k, v)
                gpu.sync()
                err = rel_err(torch, o.reshape(q.shape[0], gpu.QH, gpu.D)[:nb], ref)
                if not err < REL_TOL_BF16:
                    res[name] = {"error": f"wrong result: rel err {err:.3e}"}
                    continue
                t = gpu.time_calls(issue_for(fn), sets)
            res[name] = {"ms": t["ms"], "rel_err": err, "calls": t["calls"], "method": t["method"],
                         "times": t["times"]}
            if t["ms"] < best_ms:
                best, best_ms = name, t["ms"]
        except Exception as e:  # noqa: BLE001 - a backend that cannot run this shape
            res[name] = {"error": short_error(e)}
            with contextlib.suppress(Exception):
                gpu.sync()
    return best, res


# -- D-Quant containers


class Pool:
    """count window records encoded on the GPU (dqcu_encode_windows) from random BF16 K/V (keys with
    channel offsets), in allocations of ~1 GiB; ptrs() maps window indices (mod count) to addresses."""

    alloc_bytes = 1 << 30

    def __init__(self, gpu: Gpu, count: int, seed: int = 1234, chunk: int = 2048, cs: Optional[CodecSet] = None):
        torch = gpu.torch
        self.cs = cs = cs or gpu.cs("containers")
        self.gpu, self.count, self.wb = gpu, count, cs.wb
        self.per_alloc = max(1, self.alloc_bytes // self.wb)
        self.allocs = []
        for s in range(0, count, self.per_alloc):
            self.allocs.append(torch.empty(min(self.per_alloc, count - s) * self.wb, dtype=torch.uint8,
                                           device=DEV))
        self.bases = torch.tensor([a.data_ptr() for a in self.allocs], dtype=torch.int64, device=DEV)
        W, KVH, D = gpu.W, gpu.KVH, gpu.D
        chunk = min(chunk, count)
        gen = torch.Generator(device=DEV)
        gen.manual_seed(seed)
        kb = torch.empty(chunk, W, KVH, D, dtype=torch.bfloat16, device=DEV)
        vb = torch.empty_like(kb)
        chan = (2.0 * torch.sin(0.37 * torch.arange(KVH * D, device=DEV, dtype=torch.float32))).view(KVH, D)
        status = torch.full((count,), -999, dtype=torch.int32, device=DEV)
        t0 = time.time()
        last = t0
        for s in range(0, count, chunk):
            c = min(chunk, count - s)
            kb.normal_(generator=gen)
            kb.add_(chan.to(torch.bfloat16))
            vb.normal_(generator=gen)
            p = self.ptrs(torch.arange(s, s + c, device=DEV, dtype=torch.int64))
            cs.dc.encode_windows(kb.data_ptr(), vb.data_ptr(), dqc.DTYPE_BF16, c, p.data_ptr(),
                                 status.data_ptr() + 4 * s, gpu.stream())
            if time.time() - last > 5:
                gpu.sync()
                last = time.time()
                log(f"   encoded {s + c} / {count} windows ({last - t0:.1f} s)")
        gpu.sync()
        bad = int((status != 0).sum())
        self.encode_s = time.time() - t0
        if bad:
            raise RuntimeError(f"{bad} of {count} windows failed to encode (status != 0)")
        del kb, vb, status

    @property
    def bytes(self) -> int:
        return self.count * self.wb

    def ptrs(self, idx):
        idx = idx % self.count
        return self.bases[idx // self.per_alloc] + (idx % self.per_alloc) * self.wb

    def host_records(self, ids: Sequence[int]):
        """The records of windows ids (mod count), one after the other, in a CPU uint8 tensor."""
        torch = self.gpu.torch
        parts = []
        for i in ids:
            i %= self.count
            off = (i % self.per_alloc) * self.wb
            parts.append(self.allocs[i // self.per_alloc][off:off + self.wb])
        return torch.cat(parts).cpu() if parts else torch.empty(0, dtype=torch.uint8)


class HotPool:
    """count windows in the hot layout (dqcu_transcode_hot), in allocations of ~1 GiB; ptrs() as Pool's.
    From a Pool (records kept: rec_ptrs for any window) or encoded chunk by chunk into a scratch Pool
    and transcoded (the first chunk's records kept: rec_ptrs for windows below it)."""

    alloc_bytes = 1 << 30

    def __init__(self, gpu: Gpu, count: int, records: Optional[Pool] = None, seed: int = 1234, chunk: int = 2048,
                 cs: Optional[CodecSet] = None):
        torch = gpu.torch
        self.cs = cs = cs or (records.cs if records is not None else gpu.cs("hot"))
        self.gpu, self.count, self.wb = gpu, count, cs.hb
        self.per_alloc = max(1, self.alloc_bytes // self.wb)
        self.allocs = []
        for s in range(0, count, self.per_alloc):
            self.allocs.append(torch.empty(min(self.per_alloc, count - s) * self.wb, dtype=torch.uint8,
                                           device=DEV))
        self.bases = torch.tensor([a.data_ptr() for a in self.allocs], dtype=torch.int64, device=DEV)
        corrupt = torch.zeros(1, dtype=torch.int32, device=DEV)
        t0 = time.time()
        self.records = records
        self.kept = records.count if records is not None else 0
        chunk = min(chunk, count)
        for s in range(0, count, chunk):
            c = min(chunk, count - s)
            if records is not None:
                src = records
                rp = records.ptrs(torch.arange(s, s + c, device=DEV, dtype=torch.int64))
            else:
                src = Pool(gpu, c, seed=seed + s, cs=cs)
                rp = src.ptrs(torch.arange(0, c, device=DEV, dtype=torch.int64))
                if s == 0:
                    self.records, self.kept = src, c
            hp = self.ptrs(torch.arange(s, s + c, device=DEV, dtype=torch.int64))
            cs.dc.transcode_hot(rp.data_ptr(), c, hp.data_ptr(), corrupt.data_ptr(), gpu.stream())
            if records is None and s > 0:
                gpu.sync()
                del src
        gpu.sync()
        bad = int(corrupt.sum())
        if bad:
            raise RuntimeError(f"{bad} corrupt containers while transcoding {count} windows")
        self.transcode_s = time.time() - t0

    @property
    def bytes(self) -> int:
        return self.count * self.wb

    def ptrs(self, idx):
        idx = idx % self.count
        return self.bases[idx // self.per_alloc] + (idx % self.per_alloc) * self.wb

    def rec_ptrs(self, idx):
        """The records the windows idx were transcoded from, None where they are not kept."""
        ri = self.rec_index(idx)
        return None if ri is None else self.records.ptrs(ri)

    def rec_index(self, idx):
        """The indices in self.records of the records windows idx were transcoded from, None where
        they are not kept."""
        idx = idx % self.count
        if idx.numel() and int(idx.max()) >= self.kept:
            return None
        return idx


def seq_table(gpu: Gpu, win, tails_k, tails_v, nwin: int, tail: int):
    """dqcu_attn_seq rows (int64 [..., 4]) for window pointer rows win [..., nwin] (contiguous) and
    tail buffers tails_k/v [..., R, KVH, D] (contiguous, same leading shape)."""
    torch = gpu.torch
    lead = tuple(win.shape[:-1])
    cnt = int(math.prod(lead))
    i = torch.arange(cnt, device=DEV, dtype=torch.int64).view(lead)
    tail_stride = int(tails_k[(0,) * len(lead)].numel()) * 2
    t = torch.empty(lead + (4,), dtype=torch.int64, device=DEV)
    t[..., 0] = win.data_ptr() + i * (nwin * 8)
    t[..., 1] = tails_k.data_ptr() + i * tail_stride
    t[..., 2] = tails_v.data_ptr() + i * tail_stride
    t[..., 3] = nwin | (tail << 32)
    assert t.element_size() * 4 == dqc.ATTN_SEQ_BYTES
    return t


def dq_check(gpu: Gpu, cs: CodecSet, win_row, tk, tv, nwin: int, tail: int, q, out, nb: int) -> float:
    """dqcu_attend's output for nb sequences (already computed into out) against float64 attention
    over the same containers (cs's records) decoded by dqcu_decompress (f32) and the tail."""
    torch = gpu.torch
    T = nwin * gpu.W + tail
    worst = 0.0
    for b in range(nb):
        K = torch.empty(T, gpu.KVH, gpu.D, dtype=torch.float32, device=DEV)
        V = torch.empty_like(K)
        for kind, dst, tl in ((dqc.KIND_K, K, tk), (dqc.KIND_V, V, tv)):
            cs.dc.decompress(kind, win_row[b].data_ptr(), nwin, tl[b].data_ptr(), tail, 0, T, dst.data_ptr(),
                              dqc.DTYPE_F32, gpu.stream())
        ref = ref_attention(torch, q[b], K, V, gpu.scale, gpu.G)
        worst = max(worst, rel_err(torch, out[b], ref))
        del K, V
    return worst


def host_check(gpu: Gpu, cs: CodecSet, records: Pool, idx, tk, tv, nwin: int, tail: int, q, out, nb: int) -> float:
    """dq_check for a profile without a device decoder (cs.host_decode): the records of windows idx
    [nb, nwin] of records decoded by libdquant on the host (dq_tokens_decode), then the tail."""
    torch = gpu.torch
    W, n = gpu.W, gpu.n
    T = nwin * W + tail
    worst = 0.0
    for b in range(nb):
        K = torch.empty(T, gpu.KVH, gpu.D, dtype=torch.float32)
        V = torch.empty_like(K)
        blob = records.host_records([int(i) for i in idx[b, :nwin].tolist()] if nwin else [])
        for w in range(nwin):
            cs.hc.decode_window(blob[w * cs.wb:(w + 1) * cs.wb].data_ptr(), K[w * W].data_ptr(),
                                V[w * W].data_ptr())
        K[nwin * W:] = tk[b, :tail].float().cpu()
        V[nwin * W:] = tv[b, :tail].float().cpu()
        assert K.numel() == T * n
        ref = ref_attention(torch, q[b], K.to(DEV), V.to(DEV), gpu.scale, gpu.G)
        worst = max(worst, rel_err(torch, out[b], ref))
        del K, V
    return worst


# -- phase: attention per layer


def phase_attn(args: argparse.Namespace, part: Part, deadline: float) -> None:
    gpu = (SimGpu if args.sim else Gpu)(args, part)
    shapes = parse_shapes(args.shapes)
    cands = bf16_candidates(gpu, parse_bf16(args.bf16))
    part.meta(bf16_candidates=[c[0] for c in cands])
    log(f"BF16 candidates: {', '.join(c[0] for c in cands) or 'none (--bf16 none: D-Quant timed alone)'}")
    plans = {s: dq_attn_plan(s[0], s[1], gpu.wb, gpu.W, gpu.R, gpu.rot) for s in shapes}
    pool_n = max(p["windows_per_set"] * p["sets"] for p in plans.values())
    pool_n = max(1, min(pool_n, max(args.attn_pool, max(p["windows_per_set"] for p in plans.values()))))
    layouts = parse_layouts(args.layouts)
    pools: Dict[str, Any] = {}  # per layout, the windows its rows attend over
    if "containers" in layouts or "hot" in layouts:
        log(f"encoding a pool of {pool_n} windows ({pool_n * gpu.wb / 1e9:.2f} GB) ...")
        pool = Pool(gpu, pool_n, seed=77)
        log(f"   {pool.encode_s:.2f} s ({pool_n * gpu.W * 2 / pool.encode_s / 1e6:.1f} M streams/s incl. generation)")
        pools["containers"] = pool
        if "hot" in layouts:
            pools["hot"] = HotPool(gpu, pool_n, records=pool)
            log(f"   transcoded to the hot layout: {pool_n * gpu.hb / 1e9:.2f} GB in {pools['hot'].transcode_s:.2f} s")
    if "containers2" in layouts:
        cs = gpu.cs("containers2")
        log(f"encoding a pool of {pool_n} {cs.name} windows ({pool_n * cs.wb / 1e9:.2f} GB) ...")
        pools["containers2"] = Pool(gpu, pool_n, seed=77, cs=cs)
        log(f"   {pools['containers2'].encode_s:.2f} s")
    if "fixed226" in layouts:
        cs = gpu.cs("fixed226")
        log(f"encoding a pool of {pool_n} {cs.name} windows on the GPU and transcoding them "
            f"({pool_n * cs.hb / 1e9:.2f} GB hot) ...")
        pools["fixed226"] = HotPool(gpu, pool_n, seed=77, cs=cs)
        log(f"   {pools['fixed226'].transcode_s:.2f} s (encode + transcode incl. generation)")
    part.meta(attn_pool_windows=pool_n)
    for si, (B, T) in enumerate(shapes):
        rows: Dict[str, Dict[str, Any]] = {}
        for lay in layouts:
            rows[lay] = {"kind": "attention", "layout": lay, "batch": B, "context": T, "dq_ms": None,
                         "bf16_ms": None, "bf16_backend": None, "ratio": None}
        pl = plans[(B, T)]
        if time.time() > deadline - 10:
            for row in rows.values():
                row["error"] = "skipped: time budget spent"
                part.row(row)
            continue
        log(f"\n== attention {si + 1}/{len(shapes)}: batch {B}, context {T} = {pl['nwin']} windows + "
            f"{pl['tail']} tail tokens")
        try:
            attn_shape(gpu, pools, B, T, pl, cands, rows)
        except Exception as e:  # noqa: BLE001 - report and go on with the next shape
            for row in rows.values():
                if row.get("ratio") is None:
                    row["error"] = row.get("error") or short_error(e)
            part.fail(f"attention ({B}, {T})", short_error(e))
            traceback.print_exc()
        for row in rows.values():
            part.row(row)
        gpu.cleanup()
    part.finish()


def dq_times(row: Dict[str, Any], sd: Dict[str, Any], d2: Dict[str, Any]) -> None:
    """A layout's row from its two timings (sd["d1"] before the BF16 side, d2 after it)."""
    d1 = sd["d1"]
    row["dq_ms_runs"] = [d1["ms"], d2["ms"]]
    row["dq_ms"] = median(d1["times"] + d2["times"])
    row["dq_method"] = d1["method"]
    row["dq_calls_per_graph"] = d1["calls"]
    row["dq_gbps"] = sd["plan"]["bytes_per_call"] / (row["dq_ms"] * 1e6)


def attn_shape(gpu: Gpu, pools: Dict[str, Any], B: int, T: int, pl: Dict[str, Any], cands,
               rows: Dict[str, Dict[str, Any]]) -> None:
    """One shape: every layout of rows (containers: dqcu_attend on the pool's records; hot:
    dqcu_attend_hot on the same windows transcoded; fixed226: dqcu_attend_hot on fixed226 windows
    encoded on the GPU and transcoded), each checked and timed twice around the BF16 side, against
    the fastest correct BF16 attention."""
    torch = gpu.torch
    QH, KVH, D, R = gpu.QH, gpu.KVH, gpu.D, gpu.R
    nwin, tail = pl["nwin"], pl["tail"]
    if tail > R:
        raise ValueError(f"tail {tail} > R {R}")
    bplan = bf16_attn_plan(B, T, gpu.rot)
    sides: Dict[str, Dict[str, Any]] = {}
    for lay, row in rows.items():
        hot = lay in HOT_LAYOUTS
        cs = gpu.cs(lay)
        src = pools[lay]
        lp = dq_attn_plan(B, T, cs.hb if hot else cs.wb, gpu.W, R, gpu.rot)
        S = lp["sets"]
        wsb = cs.dc.hot_workspace_size(QH, B, T) if hot else cs.dc.workspace_size(QH, B, T)
        need = S * B * (R * gpu.n * 4 + nwin * 8 + QH * D * 4) + wsb
        need += bplan["sets"] * bplan["bytes_per_call"] + 2 * 2 * KVH * T * D * 8  # + the float64 reference
        if need > gpu.free_bytes() * 0.95:
            raise MemoryError(f"needs ~{need / 1e9:.1f} GB, {gpu.free_bytes() / 1e9:.1f} GB free")
        # S sets of B sequences, each its own windows (rotating through the pool) and tail
        idx = torch.arange(S * B * max(nwin, 1), device=DEV, dtype=torch.int64).view(S, B, max(nwin, 1))
        win = src.ptrs(idx).contiguous()
        rec = None if cs.host_decode else (src.records if hot else src).ptrs(idx).contiguous()
        tk = torch.randn(S, B, R, KVH, D, device=DEV, dtype=torch.bfloat16)
        tv = torch.randn_like(tk)
        seqs = seq_table(gpu, win, tk, tv, nwin, tail)
        q = torch.randn(S, B, QH, D, device=DEV, dtype=torch.float32)
        out = torch.empty(B, QH, D, device=DEV, dtype=torch.float32)
        ws = torch.empty(max(wsb, 16), dtype=torch.uint8, device=DEV)
        seq_p = [seqs[s].data_ptr() for s in range(S)]
        q_p = [q[s].data_ptr() for s in range(S)]
        out_p, ws_p = out.data_ptr(), ws.data_ptr()
        fn = cs.dc.attend_hot if hot else cs.dc.attend

        def dq_issue(i: int, S=S, seq_p=seq_p, q_p=q_p, out_p=out_p, ws_p=ws_p, wsb=wsb, fn=fn) -> None:
            s = i % S
            fn(QH, gpu.scale, seq_p[s], B, T, q_p[s], out_p, None, ws_p, wsb, gpu.stream())

        dq_issue(0)
        gpu.sync()
        nb = min(B, 2)
        # the hot layout is lossless: the reference is the records' decoded values either way
        if cs.host_decode:
            ridx = src.rec_index(idx[0, :nb])
            if ridx is None:
                raise RuntimeError(f"[{lay}] the records of the checked windows are not kept")
            row["dq_rel_err"] = host_check(gpu, cs, src.records, ridx, tk[0], tv[0], nwin, tail, q[0], out, nb)
        else:
            row["dq_rel_err"] = dq_check(gpu, cs, rec[0], tk[0], tv[0], nwin, tail, q[0], out, nb)
        distinct = min(S * B * nwin, src.count)
        row.update(profile=cs.name, dq_kernel="hot" if hot else cs.dc.attend_kernel(QH), nwin=nwin, tail=tail, dq_sets=S,
                   dq_bytes_per_call=lp["bytes_per_call"], dq_distinct_windows=distinct)
        log(f"   dq [{lay}] check: rel err {row['dq_rel_err']:.2e} vs float64 over the decoded containers "
            f"({nb} sequences)")
        if not row["dq_rel_err"] < REL_TOL_DQ:
            raise RuntimeError(f"[{lay}] attention differs from the decoded containers: rel err "
                               f"{row['dq_rel_err']:.3e}")
        d1 = gpu.time_calls(dq_issue, S)
        log(f"   dq [{lay}]: {d1['ms']:.4f} ms/call ({d1['method']} of {d1['calls']} calls over {S} sets, "
            f"{len(d1['times'])} replays)")
        sides[lay] = {"issue": dq_issue, "S": S, "d1": d1, "plan": lp,
                      "keep": (win, rec, tk, tv, seqs, q, out, ws)}

    if not cands:  # --bf16 none: D-Quant alone, timed twice back to back
        for lay, sd in sides.items():
            dq_times(rows[lay], sd, gpu.time_calls(sd["issue"], sd["S"]))
            log(f"   [{lay}] dq {rows[lay]['dq_ms']:.4f} ms (runs {rows[lay]['dq_ms_runs'][0]:.4f} / "
                f"{rows[lay]['dq_ms_runs'][1]:.4f}), BF16 not timed")
        return
    # BF16: S' sets of K/V [B, KVH, T, D] and queries
    Sb = bplan["sets"]
    kk = torch.randn(Sb, B, KVH, T, D, device=DEV, dtype=torch.bfloat16)
    vv = torch.randn_like(kk)
    qq = torch.randn(Sb, B, QH, 1, D, device=DEV, dtype=torch.bfloat16)
    nbb = min(B, 2)
    ref = torch.stack([ref_attention(torch, qq[0, b, :, 0], kk[0, b].transpose(0, 1), vv[0, b].transpose(0, 1),
                                     gpu.scale, gpu.G) for b in range(nbb)])

    def issue_for(fn):
        def issue(i: int):
            s = i % Sb
            return fn(qq[s], kk[s], vv[s])
        return issue

    best, res = pick_bf16(gpu, cands, qq[0], kk[0], vv[0], nbb, ref, issue_for, Sb)
    for name, r in res.items():
        msg = f"{r['ms']:.4f} ms/call ({r['method']} of {r['calls']} calls)" if "ms" in r else r["error"]
        log(f"   bf16 {name:<22} {msg}")
    for lay, sd in sides.items():
        dq_times(rows[lay], sd, gpu.time_calls(sd["issue"], sd["S"]))
    if best is None:
        raise RuntimeError("no BF16 attention ran correctly at this shape")
    b2 = gpu.time_calls(issue_for(dict(cands)[best]), Sb)
    b1 = res[best]
    bf_ms = median(b1["times"] + b2["times"])
    for r in res.values():
        r.pop("times", None)
    for lay, row in rows.items():
        row["bf16_candidates"] = res
        row["bf16_backend"] = best
        row["bf16_ms_runs"] = [b1["ms"], b2["ms"]]
        row["bf16_ms"] = bf_ms
        row["bf16_method"] = b2["method"]
        row["bf16_sets"] = Sb
        row["bf16_bytes_per_call"] = bplan["bytes_per_call"]
        row["bf16_gbps"] = bplan["bytes_per_call"] / (row["bf16_ms"] * 1e6)
        row["bf16_rel_err"] = b1["rel_err"]
        row["ratio"] = row["bf16_ms"] / row["dq_ms"]
        log(f"   [{lay}] dq {row['dq_ms']:.4f} ms (runs {row['dq_ms_runs'][0]:.4f} / {row['dq_ms_runs'][1]:.4f}), "
            f"bf16 {best} {row['bf16_ms']:.4f} ms (runs {b1['ms']:.4f} / {b2['ms']:.4f}): bf16/dq {row['ratio']:.3f}")


# -- the model of the end-to-end step


def rms_norm(torch, F, x, w, eps: float):
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


class Model:
    """Random BF16 weights of the model's shapes (m: MODEL or a smaller dict of the same keys) and
    one decode step for a batch of single tokens; attend(layer, q, k, v) appends k/v to the cache
    and returns the attention output [B, q_heads·head_dim]."""

    def __init__(self, torch, m: Dict[str, Any], device: str = DEV, seed: int = 5):
        self.torch, self.m = torch, m
        H, I, D = m["hidden"], m["intermediate"], m["head_dim"]
        qd, kd = m["q_heads"] * D, m["kv_heads"] * D
        g = torch.Generator(device=device)
        g.manual_seed(seed)
        bf = torch.bfloat16

        def w(*shape, std=0.02):
            return (torch.randn(*shape, device=device, dtype=bf, generator=g) * std)

        def ln(d):
            return (1.0 + 0.1 * torch.randn(d, device=device, generator=g)).to(bf)
        self.layers = []
        for _ in range(m["layers"]):
            self.layers.append({"qkv": w(qd + 2 * kd, H), "o": w(H, qd), "gu": w(2 * I, H), "down": w(H, I),
                                "ln1": ln(H), "ln2": ln(H), "qn": ln(D), "kn": ln(D)})
        self.lnf = ln(H)
        self.lm = w(m["vocab"], H)

    def rope(self, positions):
        """cos, sin [B, 1, D] (BF16) of the given positions (int64 [B])."""
        torch, D = self.torch, self.m["head_dim"]
        j = torch.arange(0, D, 2, device=positions.device, dtype=torch.float64)
        inv = 1.0 / (self.m["rope_theta"] ** (j / D))
        f = positions.double()[:, None] * inv[None, :]
        emb = torch.cat([f, f], dim=-1)
        return emb.cos().to(torch.bfloat16)[:, None, :], emb.sin().to(torch.bfloat16)[:, None, :]

    @staticmethod
    def apply_rope(torch, x, cos, sin):
        h = x.shape[-1] // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
        return x * cos + rot * sin

    def forward(self, x, cos, sin, attend: Callable):
        torch = self.torch
        import torch.nn.functional as F
        m = self.m
        B = x.shape[0]
        I, D, QH, KVH, eps = m["intermediate"], m["head_dim"], m["q_heads"], m["kv_heads"], m["rms_eps"]
        qd, kd = QH * D, KVH * D
        for li, w in enumerate(self.layers):
            h = rms_norm(torch, F, x, w["ln1"], eps)
            qkv = F.linear(h, w["qkv"])
            q = rms_norm(torch, F, qkv[:, :qd].reshape(B, QH, D), w["qn"], eps)
            k = rms_norm(torch, F, qkv[:, qd:qd + kd].reshape(B, KVH, D), w["kn"], eps)
            v = qkv[:, qd + kd:].reshape(B, KVH, D)
            q = self.apply_rope(torch, q, cos, sin)
            k = self.apply_rope(torch, k, cos, sin)
            a = attend(li, q, k, v)
            x = x + F.linear(a, w["o"])
            h = rms_norm(torch, F, x, w["ln2"], eps)
            gu = F.linear(h, w["gu"])
            x = x + F.linear(F.silu(gu[:, :I]) * gu[:, I:], w["down"])
        x = rms_norm(torch, F, x, self.lnf, eps)
        return F.linear(x, self.lm)


def e2e_check_memory(gpu: Gpu, need: float, what: str) -> None:
    free = gpu.free_bytes()
    if need > free * 0.97:
        raise MemoryError(f"{what} needs ~{need / 1e9:.1f} GB, {free / 1e9:.1f} GB free")


def time_step(gpu: Gpu, fn: Callable[[], Any], reps: int) -> Dict[str, Any]:
    """One call of fn (a whole step) per graph replay."""
    return gpu.time_calls(lambda i: fn(), 1, est_ms=1e9, reps=reps, warm=1)


def phase_e2e_bf16(args: argparse.Namespace, part: Part, deadline: float) -> None:
    gpu = (SimGpu if args.sim else Gpu)(args, part)
    log(f"building the model's weights ({weight_bytes() / 1e9:.1f} GB) ...")
    model = Model(gpu.torch, MODEL, device=DEV)
    cands = bf16_candidates(gpu, parse_bf16(args.bf16))
    for ctx in parse_contexts(args.e2e):
        pl = e2e_plan(ctx, args.budget_gb * 1e9, gpu.wb, gpu.W, gpu.R)
        row: Dict[str, Any] = {"context": ctx, "bf16_batch": pl["bf16_batch"], "bf16_kv_bytes": pl["bf16_kv_bytes"]}
        if time.time() > deadline - 10:
            row["error"] = "BF16 skipped: time budget spent"
            part.row(row)
            continue
        log(f"\n== e2e BF16, context {ctx}: batch {pl['bf16_batch']} ({pl['bf16_kv_bytes'] / 1e9:.1f} GB of KV)")
        try:
            e2e_bf16_context(gpu, model, cands, ctx, pl["bf16_batch"], args.reps, row)
        except Exception as e:  # noqa: BLE001
            row["error"] = "BF16: " + short_error(e)
            part.fail(f"e2e BF16 context {ctx}", row["error"])
            traceback.print_exc()
        part.row(row)
        gpu.cleanup()
    part.finish()


def e2e_bf16_context(gpu: Gpu, model: Model, cands, ctx: int, B: int, reps: int, row: Dict[str, Any]) -> None:
    """The BF16 step at one context: cache [B, KVH, ctx, D] per layer (the new token at ctx - 1)."""
    torch = gpu.torch
    m = MODEL
    L, QH, KVH, D = m["layers"], gpu.QH, gpu.KVH, gpu.D
    if B < 1:
        raise ValueError("the budget holds no sequence")
    e2e_check_memory(gpu, B * ctx * bf16_bytes_per_token() + 2e9, "the BF16 cache")
    kc = [torch.randn(B, KVH, ctx, D, device=DEV, dtype=torch.bfloat16) for _ in range(L)]
    vc = [torch.randn(B, KVH, ctx, D, device=DEV, dtype=torch.bfloat16) for _ in range(L)]
    pos = ctx - 1
    qs = torch.randn(L, B, QH, 1, D, device=DEV, dtype=torch.bfloat16)
    nb = min(B, 2)
    ref = torch.stack([ref_attention(torch, qs[0, b, :, 0], kc[0][b].transpose(0, 1), vc[0][b].transpose(0, 1),
                                     gpu.scale, gpu.G) for b in range(nb)])

    def issue_for(fn):
        return lambda i: fn(qs[i % L], kc[i % L], vc[i % L])

    best, res = pick_bf16(gpu, cands, qs[0], kc[0], vc[0], nb, ref, issue_for, L)
    row["bf16_candidates"] = res
    for name, r in res.items():
        log(f"   bf16 {name:<22} " + (f"{r['ms']:.4f} ms/layer" if "ms" in r else r["error"]))
    if best is None:
        raise RuntimeError("no BF16 attention ran correctly")
    fn = dict(cands)[best]
    row["bf16_backend"] = best
    row["bf16_attn_ms"] = res[best]["ms"] * L
    for r in res.values():
        r.pop("times", None)

    def attend(li, q, k, v):
        kc[li][:, :, pos] = k
        vc[li][:, :, pos] = v
        return fn(q.view(B, QH, 1, D), kc[li], vc[li]).reshape(B, QH * D)

    x0 = torch.randn(B, m["hidden"], device=DEV, dtype=torch.bfloat16)
    cos, sin = model.rope(torch.full((B,), pos, device=DEV, dtype=torch.int64))
    t = time_step(gpu, lambda: model.forward(x0, cos, sin, attend), reps)
    row["bf16_step_ms"] = t["ms"]
    row["bf16_step_ms_runs"] = t["times"]
    row["bf16_method"] = t["method"]
    row["bf16_tokens_per_s"] = B / (t["ms"] * 1e-3)
    log(f"   step {t['ms']:.2f} ms ({t['method']}; attention {row['bf16_attn_ms']:.2f} ms with {best}): "
        f"{row['bf16_tokens_per_s']:.0f} tokens/s")


def phase_e2e_dq(args: argparse.Namespace, part: Part, deadline: float, layout: str = "containers") -> None:
    """The D-Quant decode step at the budget's batch, windows held as records (containers, v7) or in
    the hot layout (the batch from the hot windows' bytes)."""
    gpu = (SimGpu if args.sim else Gpu)(args, part)
    L, W, R = MODEL["layers"], gpu.W, gpu.R
    hot = layout in HOT_LAYOUTS
    cs = gpu.cs(layout)
    wbx = cs.hb if hot else cs.wb
    plans = [e2e_plan(c, args.budget_gb * 1e9, wbx, W, R) for c in parse_contexts(args.e2e)]
    log(f"building the model's weights ({weight_bytes() / 1e9:.1f} GB) ...")
    model = Model(gpu.torch, MODEL, device=DEV)
    gpu.cleanup()
    want = max([p["windows"] for p in plans] + [1])
    tails_max = max([L * p["batch"] * R * gpu.n * 2 * 2 for p in plans] + [0])
    # hot: the scratch records of a chunk besides
    fit = int(max(0, gpu.free_bytes() - tails_max - 4e9 - (2 * 2048 * cs.wb if hot else 0)) // wbx)
    count = want if args.e2e_pool <= 0 else min(want, args.e2e_pool)
    if count > fit:
        part.note(f"only {fit} of the {count} windows fit next to the tails and the weights: containers reused")
        count = fit
    if count < 1:
        raise MemoryError("no room for the D-Quant cache")
    if count < want:
        part.note(f"D-Quant cache [{layout}]: {count} distinct windows ({count * wbx / 1e6:.0f} MB, "
                  f"{count * wbx / gpu.l2:.0f}x L2) reused across layers and sequences for up to {want}")
    else:
        part.note(f"D-Quant cache [{layout}]: every window distinct ({count} windows, {count * wbx / 1e9:.1f} GB)")
    log(f"encoding {count} {cs.name} windows ({count * wbx / 1e9:.1f} GB, {layout}) on the GPU ...")
    t0 = time.time()
    pool = HotPool(gpu, count, seed=99, cs=cs) if hot else Pool(gpu, count, seed=99, cs=cs)
    enc_s = time.time() - t0
    log(f"   {enc_s:.1f} s")
    part.meta(e2e_pool_windows=count, e2e_pool_distinct=count >= want, e2e_pool_encode_s=enc_s, e2e_layout=layout,
              e2e_profile=cs.name)
    for pl in plans:
        ctx, B = pl["context"], pl["batch"]
        row: Dict[str, Any] = {"context": ctx, "batch": B, "nwin": pl["nwin"], "tail": pl["tail"],
                               "dq_kv_bytes": pl["dq_kv_bytes"], "dq_bytes_per_token": pl["dq_bytes_per_token"],
                               "pool_windows": count, "pool_distinct": count >= pl["windows"]}
        if time.time() > deadline - 10:
            row["error"] = "D-Quant skipped: time budget spent"
            part.row(row)
            continue
        log(f"\n== e2e D-Quant, context {ctx}: batch {B} ({pl['dq_kv_bytes'] / 1e9:.1f} GB: {pl['nwin']} windows + "
            f"{pl['tail']} tail tokens per sequence and layer)")
        try:
            e2e_dq_context(gpu, model, pool, pl, args.reps, row, part, layout)
        except Exception as e:  # noqa: BLE001
            row["error"] = "D-Quant: " + short_error(e)
            part.fail(f"e2e D-Quant context {ctx}", row["error"])
            traceback.print_exc()
        part.row(row)
        gpu.cleanup()
    part.finish()


def e2e_dq_context(gpu: Gpu, model: Model, pool, pl: Dict[str, Any], reps: int, row: Dict[str, Any],
                   part: Part, layout: str = "containers") -> None:
    """The D-Quant step at one context: per layer and sequence nwin windows of the pool and a BF16
    tail buffer of R tokens holding tail tokens (the new token's K/V written at tail - 1)."""
    torch = gpu.torch
    m = MODEL
    L, QH, KVH, D, W, R = m["layers"], gpu.QH, gpu.KVH, gpu.D, gpu.W, gpu.R
    ctx, B, nwin, tail = pl["context"], pl["batch"], pl["nwin"], pl["tail"]
    if B < 1:
        raise ValueError("the budget holds no sequence")
    if tail < 1 or tail > R:
        raise ValueError(f"tail {tail} outside 1..R: the step appends its token to the tail")
    e2e_check_memory(gpu, L * B * R * gpu.n * 4 + L * B * nwin * 8 + 1e9, "the tails")
    hot = layout in HOT_LAYOUTS
    cs = gpu.cs(layout)
    row["profile"] = cs.name
    idx = torch.arange(L * B * nwin, device=DEV, dtype=torch.int64).view(L, B, nwin)
    win = pool.ptrs(idx).contiguous()
    tk = torch.randn(L, B, R, KVH, D, device=DEV, dtype=torch.bfloat16)
    tv = torch.randn_like(tk)
    seqs = seq_table(gpu, win, tk, tv, nwin, tail)
    seq_p = [seqs[li].data_ptr() for li in range(L)]
    qf = torch.randn(B, QH, D, device=DEV, dtype=torch.float32)
    outf = torch.empty(B, QH, D, device=DEV, dtype=torch.float32)
    wsb = cs.dc.hot_workspace_size(QH, B, ctx) if hot else cs.dc.workspace_size(QH, B, ctx)
    ws = torch.empty(max(wsb, 16), dtype=torch.uint8, device=DEV)
    qf_p, outf_p, ws_p = qf.data_ptr(), outf.data_ptr(), ws.data_ptr()
    fn = cs.dc.attend_hot if hot else cs.dc.attend

    def dq_attn(li: int) -> None:
        fn(QH, gpu.scale, seq_p[li % L], B, ctx, qf_p, outf_p, None, ws_p, wsb, gpu.stream())

    dq_attn(0)
    gpu.sync()
    nb = min(B, 2)
    if cs.host_decode:
        ridx = pool.rec_index(idx[0, :nb])
        if ridx is None:
            raise RuntimeError("the records of the checked windows are not kept")
        row["dq_rel_err"] = host_check(gpu, cs, pool.records, ridx, tk[0], tv[0], nwin, tail, qf, outf, nb)
    else:
        rec0 = pool.rec_ptrs(idx[0, :nb]) if hot else win[0]
        if rec0 is None:
            raise RuntimeError("the records of the checked windows are not kept")
        row["dq_rel_err"] = dq_check(gpu, cs, rec0.contiguous(), tk[0], tv[0], nwin, tail, qf, outf, nb)
    log(f"   check: rel err {row['dq_rel_err']:.2e} vs float64 over the decoded containers")
    if not row["dq_rel_err"] < REL_TOL_DQ:
        raise RuntimeError(f"dqcu_attend differs from the decoded containers: {row['dq_rel_err']:.3e}")
    a = gpu.time_calls(dq_attn, L)
    row["attn_ms"] = a["ms"] * L
    log(f"   attention alone {row['attn_ms']:.2f} ms per step ({a['ms']:.4f} ms/layer, {a['method']})")

    # windows sealed while decoding: B/W per layer per step on average; nw per layer timed, scaled
    row["seal_ms"] = None
    if W == R:
        nw = max(1, min(B, round(B / W)))
        seal = torch.empty(L * nw * cs.wb, dtype=torch.uint8, device=DEV)
        seal_ptr = seal.data_ptr() + torch.arange(L * nw, device=DEV, dtype=torch.int64) * cs.wb
        st = torch.full((L * nw,), -999, dtype=torch.int32, device=DEV)
        # hot: each sealed window is transcoded too (its records then go to the host tier)
        hseal = torch.empty(L * nw * cs.hb if hot else 1, dtype=torch.uint8, device=DEV)
        hseal_ptr = hseal.data_ptr() + torch.arange(L * nw, device=DEV, dtype=torch.int64) * cs.hb

        def seal_layers(_i: int) -> None:
            for li in range(L):
                cs.dc.encode_windows(tk[li].data_ptr(), tv[li].data_ptr(), dqc.DTYPE_BF16, nw,
                                     seal_ptr.data_ptr() + 8 * li * nw, st.data_ptr() + 4 * li * nw, gpu.stream())
            if hot:
                cs.dc.transcode_hot(seal_ptr.data_ptr(), L * nw, hseal_ptr.data_ptr(), None, gpu.stream())

        def seal_step(_i: int) -> None:
            # the step's filled windows of every layer in one call: tk is [L, B, R, KVH, D], so the
            # first L * nw of its L * B tails are L * nw contiguous windows of the same data
            cs.dc.encode_windows(tk.data_ptr(), tv.data_ptr(), dqc.DTYPE_BF16, L * nw, seal_ptr.data_ptr(),
                                 st.data_ptr(), gpu.stream())
            if hot:
                cs.dc.transcode_hot(seal_ptr.data_ptr(), L * nw, hseal_ptr.data_ptr(), None, gpu.stream())
        for name, seal_fn in (("seal_ms_per_layer", seal_layers), ("seal_ms", seal_step)):
            st.fill_(-999)
            s = gpu.time_calls(seal_fn, 1, est_ms=1e9, warm=1)
            gpu.sync()
            if int((st != 0).sum()):
                raise RuntimeError("a sealed window failed to encode")
            row[name] = s["ms"] * (B / W) / nw
            log(f"   sealing {L} x {nw} windows ({name}) {s['ms']:.3f} ms: {row[name]:.3f} ms per step amortized")
        row["seal_windows_timed"] = L * nw
    else:
        part.note(f"W {W} != R {R}: window sealing not timed")

    def attend(li, q, k, v):
        tk[li][:, tail - 1] = k
        tv[li][:, tail - 1] = v
        qf.copy_(q)
        dq_attn(li)
        return outf.to(torch.bfloat16).view(B, QH * D)

    x0 = torch.randn(B, m["hidden"], device=DEV, dtype=torch.bfloat16)
    cos, sin = model.rope(torch.full((B,), ctx - 1, device=DEV, dtype=torch.int64))
    t = time_step(gpu, lambda: model.forward(x0, cos, sin, attend), reps)
    row["step_ms"] = t["ms"]
    row["step_ms_runs"] = t["times"]
    row["method"] = t["method"]
    row["tokens_per_s"] = B / ((t["ms"] + (row["seal_ms"] or 0.0)) * 1e-3)
    log(f"   step {t['ms']:.2f} ms ({t['method']}) + sealing {row['seal_ms'] or 0:.2f} ms: "
        f"{row['tokens_per_s']:.0f} tokens/s")


# ---------------------------------------------------------------------------------------------
# --sim: the GPU phases on the CPU (torch CPU), for the self-test. A fake codec stands in for
# libdquant-cuda: it "encodes" a window by remembering its K/V under the record's address and
# computes attention in float64 from whatever the pointer tables point to, so the script's
# pointer plumbing (sequence rows, window pointer arrays, pool allocations, tails, queries, outputs,
# status words) is exercised for real; timings are constants.

TINY = {"name": "tiny", "layers": 2, "hidden": 64, "q_heads": 4, "kv_heads": 2, "head_dim": 16,
        "intermediate": 96, "vocab": 50, "rope_theta": 1e4, "rms_eps": 1e-6}
SIM_WB = 1000  # bytes of a fake window record
SIM_SHAPES = "2:300,1:428,3:256,2:100"
SIM_E2E = "300,429"
SIM_BUDGET_GB = 0.0005


class FakeCodec:
    def __init__(self, gpu: "SimGpu"):
        self.gpu = gpu
        self.store: Dict[int, Any] = {}

    def _read(self, addr: int, count: int, dtype):
        torch = self.gpu.torch
        esz = torch.tensor([], dtype=dtype).element_size()
        if count == 0:
            return torch.empty(0, dtype=dtype)
        raw = bytearray((ctypes_mod().c_char * (count * esz)).from_address(addr))
        return torch.frombuffer(raw, dtype=dtype)

    def _write(self, addr: int, t) -> None:
        t = t.contiguous()
        ctypes_mod().memmove(addr, t.data_ptr(), t.numel() * t.element_size())

    def attend_check(self, q_heads: int) -> int:
        return 0

    def attend_kernel(self, q_heads: int) -> int:
        return 0

    def workspace_size(self, q_heads: int, nseq: int, max_tokens: int) -> int:
        return 64 * nseq + max_tokens

    def encode_windows(self, k, v, dtype, nwin, windows, status, stream) -> None:
        torch, g = self.gpu.torch, self.gpu
        assert dtype == dqc.DTYPE_BF16
        per = g.W * g.n
        ptrs = self._read(windows, nwin, torch.int64)
        for w in range(nwin):
            K = self._read(k + 2 * w * per, per, torch.bfloat16).view(g.W, g.KVH, g.D)
            V = self._read(v + 2 * w * per, per, torch.bfloat16).view(g.W, g.KVH, g.D)
            self.store[int(ptrs[w])] = (K, V)
            # the record's first bytes name it, so that a copy of it can be decoded (FakeHostCodec)
            self._write(int(ptrs[w]), ptrs[w:w + 1].clone())
        self._write(status, torch.zeros(nwin, dtype=torch.int32))

    def _layer(self, windows, nwin, tail_k, tail_v, tail):
        torch, g = self.gpu.torch, self.gpu
        ptrs = self._read(windows, nwin, torch.int64)
        ks = [self.store[int(p)][0] for p in ptrs]  # KeyError: a pointer to no window
        vs = [self.store[int(p)][1] for p in ptrs]
        ks.append(self._read(tail_k, tail * g.n, torch.bfloat16).view(tail, g.KVH, g.D))
        vs.append(self._read(tail_v, tail * g.n, torch.bfloat16).view(tail, g.KVH, g.D))
        return torch.cat(ks).float(), torch.cat(vs).float()

    def decompress(self, kind, windows, nwin, tail, tail_tokens, first, count, out, dtype, stream) -> None:
        assert dtype == dqc.DTYPE_F32
        K, V = self._layer(windows, nwin, tail, tail, tail_tokens)
        self._write(out, (K if kind == dqc.KIND_K else V)[first:first + count])

    # the hot layout: a hot window stands for the record it was transcoded from
    def hot_window_bytes(self) -> int:
        return SIM_WB

    def transcode_hot(self, windows, nwin, hot, corrupt, stream) -> None:
        torch = self.gpu.torch
        src, dst = self._read(windows, nwin, torch.int64), self._read(hot, nwin, torch.int64)
        for w in range(nwin):
            self.store[int(dst[w])] = self.store[int(src[w])]

    def attend_hot_check(self, q_heads: int) -> int:
        return 0

    def hot_workspace_size(self, q_heads: int, nseq: int, max_tokens: int) -> int:
        return self.workspace_size(q_heads, nseq, max_tokens)

    def attend_hot(self, *a) -> None:
        self.attend(*a)

    def attend(self, q_heads, scale, seqs, nseq, max_tokens, q, out, lse, ws, ws_bytes, stream) -> None:
        torch, g = self.gpu.torch, self.gpu
        assert ws_bytes >= self.workspace_size(q_heads, nseq, max_tokens) and q_heads == g.QH
        rows = self._read(seqs, nseq * 4, torch.int64).view(nseq, 4)
        qs = self._read(q, nseq * g.QH * g.D, torch.float32).view(nseq, g.QH, g.D)
        for b in range(nseq):
            win, tk, tv, packed = (int(x) for x in rows[b])
            nwin, tail = packed & 0xFFFFFFFF, packed >> 32
            K, V = self._layer(win, nwin, tk, tv, tail)
            assert K.shape[0] <= max_tokens
            o = ref_attention(torch, qs[b], K, V, scale, g.G).float()
            self._write(out + 4 * b * g.QH * g.D, o)


class FakeHostCodec:
    """libdquant's host decoding of a window record (HostCodec.decode_window) for the fake codec: a
    record's first 8 bytes hold the address it was encoded at (FakeCodec.encode_windows)."""

    def __init__(self, fake: FakeCodec):
        self.fake = fake

    def decode_window(self, rec: int, k_out: int, v_out: int) -> None:
        torch = self.fake.gpu.torch
        K, V = self.fake.store[int(self.fake._read(rec, 1, torch.int64)[0])]
        self.fake._write(k_out, K.float())
        self.fake._write(v_out, V.float())


def ctypes_mod():
    import ctypes
    return ctypes


class SimGpu(Gpu):
    def __init__(self, args: argparse.Namespace, part: Part):
        import torch

        self.torch = torch
        self.dev = {"name": "sim (CPU, fake codec)", "sms": 0, "l2_mb": 0.0, "torch": torch.__version__}
        self.l2 = 1 << 16
        self.rot = max(args.rot_mb * 1e6, 4.0 * self.l2)
        self.shape_attrs()
        self.dc = FakeCodec(self)
        self.kernel = 0
        self.W, self.R, self.wb = DQ226_W, DQ226_R, SIM_WB
        self.hb = SIM_WB
        # the fixed-width profile's checks decode its records on the host, as on the GPU
        self.codecs = {PROFILE: CodecSet(PROFILE, None, self.dc, SIM_WB, SIM_WB, False),
                       "fixed226": CodecSet("fixed226", FakeHostCodec(self.dc), self.dc, SIM_WB, SIM_WB, True),
                       "dq226p": CodecSet("dq226p", None, self.dc, SIM_WB, SIM_WB, False)}
        self.reps, self.target_ms = args.reps, args.target_ms
        self.copy_tbps = 0.0
        part.meta(device=self.dev, copy_tbps=0.0, attend_kernel=0, window_bytes=self.wb, W=self.W, R=self.R,
                  rot_bytes=self.rot)

    def cs(self, layout: str) -> CodecSet:
        return self.codecs[LAYOUT_PROFILE[layout]]

    def stream(self) -> int:
        return 0

    def free_bytes(self) -> int:
        return 1 << 40

    def sync(self) -> None:
        pass

    def cleanup(self) -> None:
        gc.collect()

    def time_calls(self, issue, sets, est_ms=None, reps=None, target_ms=None, warm=None):
        n = max(1, min(sets, 3))
        for i in range(n):
            issue(i)
        reps = reps or self.reps
        return {"ms": 1.0, "times": [1.0] * reps, "calls": n, "method": "sim", "est_ms": 1.0}


def sim_candidates(gpu: Gpu) -> List[Tuple[str, Callable]]:
    torch = gpu.torch
    KVH, G, D, scale = gpu.KVH, gpu.G, gpu.D, gpu.scale

    def fold(q, k, v):
        B = q.shape[0]
        qg = q.float().view(B, KVH, G, D)
        p = torch.softmax(qg @ k.float().transpose(-1, -2) * scale, dim=-1)
        return (p @ v.float()).to(torch.bfloat16)

    def wrong(q, k, v):
        return fold(q, k, v) * 2

    def broken(q, k, v):
        raise RuntimeError("No available kernel")
    return [("sim-fold", fold), ("sim-wrong", wrong), ("sim-broken", broken)]


# ---------------------------------------------------------------------------------------------
# driver


def run_phase(args: argparse.Namespace, phase: str) -> int:
    part = Part(args.part, phase)
    deadline = args.deadline or (time.time() + args.time_budget)
    try:
        if args.fake:
            fake_phase(args, phase, part)
        elif phase == "attn":
            phase_attn(args, part, deadline)
        elif phase == "e2e-bf16":
            phase_e2e_bf16(args, part, deadline)
        elif phase in E2E_LAYOUT:
            phase_e2e_dq(args, part, deadline, E2E_LAYOUT[phase])
        else:
            raise ValueError(f"unknown phase {phase}")
    except Exception as e:  # noqa: BLE001 - whatever stops a phase is in its part
        part.fail(f"phase {phase}", short_error(e))
        traceback.print_exc()
        return 1
    return 0


def child_args(args: argparse.Namespace, phase: str, part_path: str, deadline: float) -> List[str]:
    a = [sys.executable, str(pathlib.Path(__file__).resolve()), "--phase", phase, "--part", part_path,
         "--deadline", f"{deadline:.3f}", "--build", args.build, "--shapes", args.shapes, "--e2e", args.e2e,
         "--budget-gb", str(args.budget_gb), "--attend-kernel", str(args.attend_kernel),
         "--hot-kernel", str(args.hot_kernel), "--reps", str(args.reps),
         "--target-ms", str(args.target_ms), "--rot-mb", str(args.rot_mb), "--e2e-pool", str(args.e2e_pool),
         "--attn-pool", str(args.attn_pool), "--layouts", args.layouts, "--bf16", args.bf16]
    if args.sim:
        a.append("--sim")
    if args.fake:
        a.append("--fake")
        if args.fake_fail:
            a += ["--fake-fail", args.fake_fail]
        if args.fake_crash:
            a += ["--fake-crash", args.fake_crash]
    return a


def orchestrate(args: argparse.Namespace) -> int:
    started = time.time()
    end = started + args.time_budget
    phases = [p for p in args.phases.split(",") if p]
    for p in phases:
        if p not in PHASES:
            raise SystemExit(f"unknown phase {p!r} (choose from {', '.join(PHASES)})")
    tmp = tempfile.mkdtemp(prefix="bench_truth.")
    parts: Dict[str, Optional[Dict[str, Any]]] = {}
    status: Dict[str, str] = {}
    if not args.fake and not args.sim:
        try:
            dqc.lib_path(pathlib.Path(args.build), "cuda", "dquant-cuda")
        except OSError as e:
            log(f"bench_truth: {e}")
            rep = merge(args, parts, {p: "not run: no libdquant-cuda" for p in phases}, started)
            rep["failures"].append({"what": "setup", "error": str(e)})
            write_json(args.json, rep)
            return 2
    for i, ph in enumerate(phases):
        left = end - time.time()
        if left < 20:
            status[ph] = "skipped: time budget spent"
            log(f"== {ph}: skipped (time budget spent)")
            continue
        limit = left if i == len(phases) - 1 else min(left, PHASE_SHARE[ph] * args.time_budget)
        path = os.path.join(tmp, f"{ph}.json")
        log(f"\n======== {ph} (at most {limit:.0f} s)")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        t0 = time.time()
        try:
            if args.fake and args.fake_crash == ph:
                raise subprocess.CalledProcessError(139, "fake crash")
            proc = subprocess.run(child_args(args, ph, path, t0 + limit - 15), env=env, timeout=limit)
            status[ph] = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            status[ph] = f"killed after {limit:.0f} s"
        except subprocess.CalledProcessError as e:
            status[ph] = f"exit {e.returncode}"
        parts[ph] = read_part(path)
        if parts[ph] is not None and not parts[ph].get("done"):
            status[ph] += " (incomplete)"
        log(f"== {ph}: {status[ph]} in {time.time() - t0:.1f} s")
        rep = merge(args, parts, status, started)
        write_json(args.json, rep)
    shutil.rmtree(tmp, ignore_errors=True)
    rep = merge(args, parts, status, started)
    write_json(args.json, rep)
    print_tables(rep)
    log(f"\nwrote {args.json} ({len(rep['rows'])} rows) in {time.time() - started:.0f} s")
    bad = [p for p, s in status.items() if s != "ok"] or [r for r in rep["rows"] if r.get("error")]
    return 1 if bad else 0


def dry_run(args: argparse.Namespace) -> int:
    """The plan without a GPU: shapes, sets, bytes, batches, memory."""
    wb, W, R, hb = DQ226_WINDOW_BYTES, DQ226_W, DQ226_R, DQ226_HOT_BYTES
    fx_hb = FIXED226_HOT_BYTES
    src = "built-in table"
    try:
        host = dqc.HostLib(args.build)
        hc = dqc.HostCodec(host, PROFILE, MODEL["kv_heads"], MODEL["head_dim"])
        wb, W, R, src = hc.window_bytes, hc.window, hc.residual, f"libdquant in {args.build}"
        hb = hc.hot_window_bytes
        fx_hb = dqc.HostCodec(host, "fixed226", MODEL["kv_heads"], MODEL["head_dim"]).hot_window_bytes
    except OSError:
        pass
    fixed = "fixed226" in parse_layouts(args.layouts)
    rot = max(args.rot_mb * 1e6, 4 * 60 * 2**20)
    log(f"{PROFILE}: window record {wb} B per {W} tokens, hot window {hb} B, tail buffer R = {R} ({src}); "
        f"rotation >= {rot / 1e6:.0f} MB")
    log(f"{'batch':>6} {'context':>8} {'nwin':>5} {'tail':>5} | {'dq MB/call':>10} {'sets':>5} | "
        f"{'bf16 MB/call':>12} {'sets':>5}")
    for B, T in parse_shapes(args.shapes):
        d = dq_attn_plan(B, T, wb, W, R, rot)
        b = bf16_attn_plan(B, T, rot)
        log(f"{B:>6} {T:>8} {d['nwin']:>5} {d['tail']:>5} | {d['bytes_per_call'] / 1e6:>10.1f} {d['sets']:>5} | "
            f"{b['bytes_per_call'] / 1e6:>12.1f} {b['sets']:>5}")
    log(f"end to end, {args.budget_gb:g} GB of KV; weights {weight_bytes() / 1e9:.2f} GB")
    for ctx in parse_contexts(args.e2e):
        p = e2e_plan(ctx, args.budget_gb * 1e9, wb, W, R)
        ph = e2e_plan(ctx, args.budget_gb * 1e9, hb, W, R)
        log(f"  context {ctx}: D-Quant batch {p['batch']} ({p['dq_kv_bytes'] / 1e9:.1f} GB, {p['windows']} windows, "
            f"{p['dq_bytes_per_token']:.1f} B/token of containers), hot batch {ph['batch']} "
            f"({ph['dq_bytes_per_token']:.1f} B/token), BF16 batch {p['bf16_batch']} "
            f"({p['bf16_kv_bytes'] / 1e9:.1f} GB)")
        if fixed:
            pf = e2e_plan(ctx, args.budget_gb * 1e9, fx_hb, W, R)
            log(f"    fixed226 hot batch {pf['batch']} ({pf['dq_bytes_per_token']:.1f} B/token, hot window {fx_hb} B)")
    log(f"phases: {args.phases}")
    return 0


# ---------------------------------------------------------------------------------------------
# self-test (no GPU): planning figures, the orchestration with fake phases, the report


def decode_window_check(check: Callable[[bool, str], None], hc) -> None:
    """HostCodec.decode_window (host_check's reference decoding) on a record of known content: a
    zero key mean, every key record s = 0, o = 1 and every value record s = 0, o = -2 (all levels
    0). Every token then decodes to the same vector, the inverse rotation of a constant stream, and
    the values are exactly -2 times the keys (the rotation is linear and scaling by 2 is exact)."""
    import ctypes
    import struct
    W, n = hc.window, hc.kv_heads * hc.head_dim
    rk, rv = hc.record_bytes
    buf = bytearray(hc.window_bytes)  # mean scale 0, means 0, every level 0
    for t in range(W):
        struct.pack_into("<HH", buf, hc.mean_bytes + t * rk, 0, 0x3C00)  # s = 0, o = 1.0
        struct.pack_into("<HH", buf, hc.mean_bytes + W * rk + t * rv, 0, 0xC000)  # s = 0, o = -2.0
    rec = (ctypes.c_uint8 * len(buf)).from_buffer(buf)
    k = (ctypes.c_float * (W * n))()
    v = (ctypes.c_float * (W * n))()
    hc.decode_window(ctypes.addressof(rec), ctypes.addressof(k), ctypes.addressof(v))
    # every token decodes to the same vector (the inverse rotation of all-1 / all-(-2) streams)
    k0, v0 = list(k[:n]), list(v[:n])
    same = all(list(k[t * n:(t + 1) * n]) == k0 and list(v[t * n:(t + 1) * n]) == v0 for t in range(W))
    ratio = all(abs(b + 2.0 * a) <= 1e-5 * (1.0 + abs(b)) for a, b in zip(k0, v0))
    check(same and ratio and any(x != 0 for x in k0),
          f"decode_window of constant records ({hc.profile}): tokens alike {same}, V = -2 K {ratio}")


def self_test(args: argparse.Namespace) -> int:
    failures = []

    def check(cond: bool, what: str) -> None:
        if not cond:
            failures.append(what)
            log("FAIL:", what)

    # planning figures worked out by hand
    check(bf16_bytes_per_token() == 147456, "BF16 bytes per token")
    check(dq_bytes_per_seq(8292, 73986, 128, 128) == 36 * (64 * 73986 + 128 * 4096), "dq bytes per sequence")
    b_dq, b_bf = budget_batches(8292, 100e9, 73986, 128, 128)
    check(b_bf == 81 and b_dq == 528, f"budget 8K+100: {b_dq}/{b_bf}, want 528/81")
    b_dq, b_bf = budget_batches(32868, 100e9, 73986, 128, 128)
    check(b_bf == 20 and b_dq == 142, f"budget 32K+100: {b_dq}/{b_bf}, want 142/20")
    # the hot layout: 36 x (64 x 100368 + 128 x 4096) B per sequence at 8K+100, 256 windows at 32K+100
    b_hot, _ = budget_batches(8292, 100e9, DQ226_HOT_BYTES, 128, 128)
    check(b_hot == 399, f"hot budget 8K+100: {b_hot}, want 399")
    b_hot, _ = budget_batches(32868, 100e9, DQ226_HOT_BYTES, 128, 128)
    check(b_hot == 105, f"hot budget 32K+100: {b_hot}, want 105")
    # fixed226 hot: 36 x (64 x 83984 + 128 x 4096) = 212,373,504 B per sequence at 8K+100 -> 470;
    # 36 x (256 x 83984 + 128 x 4096) = 792,870,912 B at 32K+100 -> 126
    b_fx, _ = budget_batches(8292, 100e9, FIXED226_HOT_BYTES, 128, 128)
    check(b_fx == 470, f"fixed226 budget 8K+100: {b_fx}, want 470")
    b_fx, _ = budget_batches(32868, 100e9, FIXED226_HOT_BYTES, 128, 128)
    check(b_fx == 126, f"fixed226 budget 32K+100: {b_fx}, want 126")
    check(default_phases(["containers", "hot"]) == "attn,e2e-bf16,e2e-dq,e2e-hot"
          and default_phases(["fixed226", "hot"]) == "attn,e2e-bf16,e2e-hot,e2e-fixed226", "default phases")
    for bad in ("", "hot,cold"):
        try:
            parse_layouts(bad)
            check(False, f"parse_layouts accepted {bad!r}")
        except ValueError:
            pass
    check(sets_for(34e6, 400e6) == 12 and sets_for(5e9, 400e6) == 1 and sets_for(1, 1e12) == 256, "sets_for")
    check(calls_per_graph(0.15, 78, 20) == 156 and calls_per_graph(3.0, 1, 20) == 7, "calls_per_graph")
    check(calls_per_graph(1e-3, 200, 20, max_calls=1000) == 1000 and calls_per_graph(0.01, 3, 20, 1000) == 999,
          "calls_per_graph cap")
    p = dq_attn_plan(128, 8292, 73986, 128, 128, 400e6)
    check(p["nwin"] == 64 and p["tail"] == 100 and p["sets"] == 1, "dq plan (128, 8K+100)")
    p = dq_attn_plan(1, 8292, 73986, 128, 128, 400e6)
    check(p["sets"] == math.ceil(400e6 / (64 * 73986 + 100 * 4096)), "dq plan (1, 8K+100) sets")
    check(weight_bytes() == 2 * (36 * (4096 * 6144 + 4096 * 4096 + 4096 * 24576 + 12288 * 4096) + 151936 * 4096),
          "weight bytes")
    check(parse_shapes(DEFAULT_SHAPES) == [(1, 8292), (1, 32868), (1, 131172), (8, 32825), (32, 32781),
                                           (128, 8292)], "default shapes: 8K+100, 32K+100, 128K+100, ...")
    for bad in ("1", "0:5", "x:1"):
        try:
            parse_shapes(bad)
            check(False, f"parse_shapes accepted {bad!r}")
        except ValueError:
            pass
    check(parse_contexts("none") == [] and parse_contexts("8292,32868") == [8292, 32868], "parse_contexts")
    check(parse_bf16("all") is None and parse_bf16("none") == [] and parse_bf16("a,b") == ["a", "b"], "parse_bf16")
    for bad in ("", ",", "all,a", "none,a"):
        try:
            parse_bf16(bad)
            check(False, f"parse_bf16 accepted {bad!r}")
        except ValueError:
            pass
    two = [("a", len), ("b", len)]
    check(pick_candidates(two, None) == two and pick_candidates(two, ["b"]) == [("b", len)]
          and pick_candidates(two, []) == [], "pick_candidates")
    try:
        pick_candidates(two, ["a", "c"])
        check(False, "pick_candidates took an unknown name")
    except ValueError as e:
        check("no candidate c" in str(e), f"pick_candidates error: {e}")
    proc = subprocess.run([sys.executable, str(pathlib.Path(__file__).resolve()), "--bf16", "none", "--phases",
                           "attn,e2e-bf16", "--dry-run"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=60)
    check(proc.returncode == 2 and "--bf16 none leaves phase e2e-bf16" in proc.stdout,
          f"--bf16 none with e2e-bf16 refused: exit {proc.returncode}\n{proc.stdout}")

    # the binding against libdquant, when a build is at hand
    if args.build and (pathlib.Path(args.build) / "lib").is_dir():
        try:
            hc = dqc.HostCodec(dqc.HostLib(args.build), PROFILE, 8, 128)
            check(hc.window_bytes == DQ226_WINDOW_BYTES and hc.window == DQ226_W and hc.residual == DQ226_R
                  and hc.container_bytes == (331, 231), f"dq226 via libdquant: {hc.window_bytes} {hc.window} "
                                                        f"{hc.residual} {hc.container_bytes}")
            check(hc.hot_window_bytes == DQ226_HOT_BYTES, f"dq226 hot window via libdquant: {hc.hot_window_bytes}")
            log(f"libdquant: dq226 window record {hc.window_bytes} B, W {hc.window}, R {hc.residual}")
            fx = dqc.HostCodec(hc.host, "fixed226", 8, 128)
            check((fx.window_bytes, fx.hot_window_bytes) == (FIXED226_WINDOW_BYTES, FIXED226_HOT_BYTES)
                  and (fx.window, fx.residual) == (DQ226_W, DQ226_R),
                  f"fixed226 via libdquant: {fx.window_bytes} {fx.hot_window_bytes} {fx.window} {fx.residual}")
            decode_window_check(check, fx)
        except OSError as e:
            log(f"libdquant not loadable from {args.build}, binding check skipped: {e}")

    # the orchestration with fake phases: one shape fails (with the fixed-width layout too), then a
    # phase crashes
    with tempfile.TemporaryDirectory() as d:
        for crash, lays in (("", "containers,hot,fixed226,containers2"), ("e2e-bf16", DEFAULT_LAYOUTS)):
            out = os.path.join(d, f"r{crash}.json")
            cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--fake", "--fake-fail", "8:32825",
                   "--json", out, "--time-budget", "120", "--layouts", lays]
            if crash:
                cmd += ["--fake-crash", crash]
            layouts = parse_layouts(lays)
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
            text = proc.stdout
            check(proc.returncode == 1, f"fake run (crash {crash!r}) exit {proc.returncode}, want 1:\n{text}")
            rep = read_part(out) or {}
            rows = rep.get("rows", [])
            attn = [r for r in rows if r.get("kind") == "attention"]
            e2e = [r for r in rows if r.get("kind") == "e2e"]
            for lay in layouts:
                check(len([r for r in attn if r.get("layout") == lay]) == 6, f"fake: attention rows of {lay}")
                check(len([r for r in e2e if r.get("layout") == lay]) == 2, f"fake: e2e rows of {lay}")
            check(len(attn) == 6 * len(layouts), f"fake: {len(attn)} attention rows")
            for r in attn:
                for k in ("batch", "context", "dq_ms", "bf16_ms", "bf16_backend", "ratio"):
                    check(k in r, f"attention row lacks {k}")
                if (r["batch"], r["context"]) == (8, 32825):
                    check(r.get("error") and r["ratio"] is None, "the failing shape is reported as failed")
                else:
                    check(abs(r["ratio"] - r["bf16_ms"] / r["dq_ms"]) < 1e-12, "attention ratio")
            check(len(e2e) == 2 * len(layouts), f"fake: {len(e2e)} e2e rows")
            for r in e2e:
                for k in ("config", "context", "batch", "tokens_per_s", "bf16_tokens_per_s", "ratio"):
                    check(k in r, f"e2e row lacks {k}")
                if crash:
                    check(r["ratio"] is None and r["bf16_tokens_per_s"] is None and r["tokens_per_s"] > 0,
                          "e2e with the BF16 phase crashed: D-Quant kept, no ratio")
                else:
                    check(abs(r["ratio"] - r["tokens_per_s"] / r["bf16_tokens_per_s"]) < 1e-12, "e2e ratio")
                    want = {"containers": (528, 142), "hot": (399, 105), "fixed226": (470, 126),
                            "containers2": (528, 142)}[r["layout"]]
                    check(r["batch"] in want and r["bf16_batch"] in (81, 20), "e2e batches")
                    check(r["profile"] == LAYOUT_PROFILE[r["layout"]] and r["profile"] in r["config"],
                          f"e2e row's profile: {r.get('profile')} in {r.get('config')}")
            check("bf16/dq" in text and "dq/bf16" in text, "the tables are printed")
            check(("FAILED: RuntimeError: injected failure" in text), "the failed shape is in the table")
            if crash:
                check(rep.get("phases", {}).get(crash, "").startswith("exit"), "the crashed phase is reported")

    # CPU checks of the torch parts, where torch is installed
    try:
        import torch
    except ImportError:
        torch = None
        log("torch not installed: CPU checks of the model and the references skipped")
    if torch is not None:
        g = torch.Generator().manual_seed(3)
        QH, KVH, D, T = 8, 2, 16, 37
        q = torch.randn(QH, D, generator=g)
        K = torch.randn(T, KVH, D, generator=g)
        V = torch.randn(T, KVH, D, generator=g)
        ref = ref_attention(torch, q, K, V, 0.25, QH // KVH)
        naive = torch.empty(QH, D, dtype=torch.float64)
        for h in range(QH):
            s = (K[:, h // (QH // KVH)].double() @ q[h].double()) * 0.25
            naive[h] = torch.softmax(s, 0) @ V[:, h // (QH // KVH)].double()
        check(rel_err(torch, ref, naive) < 1e-12, "ref_attention vs per-head loop")
        # the fold trick: query heads of a KV head as query positions
        qg = q.view(KVH, QH // KVH, D)
        kt = K.transpose(0, 1)
        fold = torch.softmax(qg @ kt.transpose(1, 2) * 0.25, -1) @ V.transpose(0, 1)
        check(rel_err(torch, fold.reshape(QH, D), naive) < 1e-6, "GQA fold order (b, h, d)")
        tiny = dict(MODEL, layers=2, hidden=64, q_heads=4, kv_heads=2, head_dim=16, intermediate=96, vocab=50)
        model = Model(torch, tiny, device="cpu")
        B, ctx = 3, 20
        kc = [torch.randn(B, 2, ctx, 16).to(torch.bfloat16) for _ in range(2)]
        vc = [torch.randn(B, 2, ctx, 16).to(torch.bfloat16) for _ in range(2)]

        def attend(li, qq, k, v):
            kc[li][:, :, ctx - 1] = k
            vc[li][:, :, ctx - 1] = v
            o = torch.stack([ref_attention(torch, qq[b].float(), kc[li][b].transpose(0, 1).float(),
                                           vc[li][b].transpose(0, 1).float(), 0.25, 2) for b in range(B)])
            return o.to(torch.bfloat16).reshape(B, 4 * 16)

        cos, sin = model.rope(torch.full((B,), ctx - 1, dtype=torch.int64))
        logits = model.forward(torch.randn(B, 64).to(torch.bfloat16), cos, sin, attend)
        check(tuple(logits.shape) == (B, 50) and bool(torch.isfinite(logits.float()).all()), "tiny model step")
        check(bool((kc[1][:, :, ctx - 1].float().abs().sum() > 0)), "the step appended its K")
        # rope: a rotation (norm kept) at position 0 is the identity
        c0, s0 = model.rope(torch.zeros(1, dtype=torch.int64))
        x = torch.randn(1, 4, 16).to(torch.bfloat16)
        check(torch.equal(Model.apply_rope(torch, x, c0, s0), x), "rope at 0")
    if torch is not None:
        sim_checks(check)
    log(f"self-test: {'FAILED ' + str(len(failures)) if failures else 'passed'}")
    return 1 if failures else 0


def sim_checks(check: Callable[[bool, str], None]) -> None:
    """The GPU phases on the CPU against the fake codec (subprocesses: --sim changes the model)."""
    with tempfile.TemporaryDirectory() as d:
        for extra in (["--layouts", "containers,hot,fixed226,containers2"], ["--quick", "--e2e-pool", "7"]):
            out = os.path.join(d, "sim.json")
            cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--sim", "--json", out,
                   "--time-budget", "300"] + extra
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
            text = proc.stdout
            check(proc.returncode == 0, f"sim run {extra} exit {proc.returncode}:\n{text}")
            rep = read_part(out) or {}
            rows = rep.get("rows", [])
            attn = [r for r in rows if r.get("kind") == "attention"]
            e2e = [r for r in rows if r.get("kind") == "e2e"]
            nlay = len(parse_layouts(extra[1] if extra[0] == "--layouts" else DEFAULT_LAYOUTS))
            check(len(attn) == nlay * len(parse_shapes(SIM_SHAPES)) and len(e2e) == 2 * nlay,
                  f"sim rows {len(attn)}/{len(e2e)}")
            for r in attn:
                check(not r.get("error") and r.get("dq_rel_err", 1) < 1e-6 and r.get("bf16_backend") == "sim-fold"
                      and r.get("ratio") == 1.0, f"sim attention row {r}")
                c = r.get("bf16_candidates", {})
                check("wrong result" in c.get("sim-wrong", {}).get("error", "")
                      and "No available kernel" in c.get("sim-broken", {}).get("error", ""), "sim candidates")
            for r in e2e:
                check(not r.get("error") and r.get("dq_rel_err", 1) < 1e-6 and r.get("tokens_per_s", 0) > 0
                      and r.get("bf16_tokens_per_s", 0) > 0 and r.get("ratio") is not None
                      and r.get("seal_ms") is not None, f"sim e2e row {r}")
                check(r.get("pool_distinct") is ("--quick" not in extra),
                      f"sim e2e pool distinct: {r.get('pool_distinct')}")
            log(f"sim run {' '.join(extra) or '(default)'}: {len(attn)} attention and {len(e2e)} e2e rows checked")
        # --bf16 none (A/B runs): D-Quant timed alone, no BF16 figures, no ratio, no error
        out = os.path.join(d, "sim-none.json")
        proc = subprocess.run([sys.executable, str(pathlib.Path(__file__).resolve()), "--sim", "--json", out,
                               "--time-budget", "300", "--bf16", "none", "--phases", "attn", "--layouts", "hot"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
        check(proc.returncode == 0, f"sim run --bf16 none exit {proc.returncode}:\n{proc.stdout}")
        attn = [r for r in (read_part(out) or {}).get("rows", []) if r.get("kind") == "attention"]
        check(len(attn) == len(parse_shapes(SIM_SHAPES)), f"sim --bf16 none: {len(attn)} rows")
        for r in attn:
            check(not r.get("error") and r.get("dq_ms", 0) > 0 and len(r.get("dq_ms_runs", [])) == 2
                  and r.get("bf16_ms") is None and r.get("ratio") is None and "bf16_candidates" not in r,
                  f"sim --bf16 none row {r}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(REPO / "build-gpu"), help="meson build folder with libdquant-cuda")
    ap.add_argument("--json", default=str(REPO / "tests" / "bench" / "results" / "gpu_attention.json"))
    ap.add_argument("--quick", action="store_true", help="fewer replays; a small reused pool for the e2e cache")
    ap.add_argument("--shapes", default=None, help=f"attention shapes BATCH:CONTEXT,... (default {DEFAULT_SHAPES})")
    ap.add_argument("--e2e", default=None, help=f"end-to-end contexts, comma-separated, or none (default "
                                                f"{DEFAULT_E2E})")
    ap.add_argument("--budget-gb", type=float, default=None, help="KV budget of the end-to-end step (default 100 GB)")
    ap.add_argument("--phases", default=None,
                    help=f"which parts to run, of {', '.join(PHASES)} (default: attn, e2e-bf16 and the end-to-end "
                         "phase of each layout)")
    ap.add_argument("--layouts", default=DEFAULT_LAYOUTS,
                    help=f"layouts of the D-Quant rows, of {', '.join(LAYOUTS)} (default {DEFAULT_LAYOUTS}; "
                         "containers: dq226 records + v7; hot: dq226 hot windows, dqcu_attend_hot; fixed226: "
                         "fixed226 encoded on the GPU, hot windows, dqcu_attend_hot)")
    ap.add_argument("--bf16", default="all",
                    help="BF16 candidates to time: all, none (A/B runs of D-Quant builds: no BF16 side, no "
                         "ratios; not with phase e2e-bf16) or names, comma-separated")
    ap.add_argument("--attend-kernel", default="auto", help="dqcu_settings.attend_kernel: auto or a version")
    ap.add_argument("--hot-kernel", default="auto", help="dqcu_settings.hot_kernel: auto, 1 (block) or 2 (warp)")
    ap.add_argument("--reps", type=int, default=0, help="graph replays timed per measurement (default 7, quick 3)")
    ap.add_argument("--target-ms", type=float, default=0.0, help="length of one graph (default 20 ms, quick 8)")
    ap.add_argument("--rot-mb", type=float, default=400.0,
                    help="bytes the input rotation covers at least (MB; never under 4x L2)")
    ap.add_argument("--attn-pool", type=int, default=16384, help="windows encoded for the attention shapes")
    ap.add_argument("--e2e-pool", type=int, default=-1,
                    help="distinct windows of the e2e D-Quant cache (0: every window distinct; default 0, quick 8192)")
    ap.add_argument("--time-budget", type=float, default=420.0, help="seconds for all parts together")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit (no GPU)")
    ap.add_argument("--self-test", action="store_true", help="check the logic with fake timings (no GPU)")
    ap.add_argument("--sim", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--fake", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--fake-fail", default="", help=argparse.SUPPRESS)
    ap.add_argument("--fake-crash", default="", help=argparse.SUPPRESS)
    ap.add_argument("--phase", default="", help=argparse.SUPPRESS)
    ap.add_argument("--part", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.sim:
        global DEV
        DEV = "cpu"
        MODEL.update(TINY)
        Pool.alloc_bytes = 5 * SIM_WB
    if args.shapes is None:
        args.shapes = SIM_SHAPES if args.sim else DEFAULT_SHAPES
    if args.e2e is None:
        args.e2e = SIM_E2E if args.sim else DEFAULT_E2E
    if args.budget_gb is None:
        args.budget_gb = SIM_BUDGET_GB if args.sim else 100.0
    if args.reps <= 0:
        args.reps = 3 if args.quick else 7
    if args.target_ms <= 0:
        args.target_ms = 8.0 if args.quick else 20.0
    if args.e2e_pool < 0:
        args.e2e_pool = 8192 if args.quick else 0
    args.attend_kernel = 0 if args.attend_kernel == "auto" else int(args.attend_kernel)
    args.hot_kernel = 0 if args.hot_kernel == "auto" else int(args.hot_kernel)
    # check the arguments before anything runs
    try:
        parse_shapes(args.shapes)
        parse_contexts(args.e2e)
        layouts = parse_layouts(args.layouts)
        bf16 = parse_bf16(args.bf16)
    except ValueError as e:
        ap.error(str(e))
    if args.phases is None:
        args.phases = default_phases(layouts)
    if bf16 == [] and not args.phase and "e2e-bf16" in args.phases.split(","):
        ap.error("--bf16 none leaves phase e2e-bf16 nothing to time: leave it out of --phases")
    if args.budget_gb <= 0 or args.time_budget <= 0:
        ap.error("--budget-gb and --time-budget must be positive")
    if args.self_test:
        return self_test(args)
    if args.dry_run:
        return dry_run(args)
    if args.phase:
        return run_phase(args, args.phase)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
