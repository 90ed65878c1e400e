#!/usr/bin/env python3
"""A disaggregated prefill -> decode run of a real model through dquantd (the GPU host: torch and
transformers; the model folders of ../shared/data).

    scripts/disagg_demo.py --dquantd build-gpu/daemon/dquantd --model .models/bytellama-n1024 \
        [--backend cuda] [--prompts 16] [--prompt-tokens 700] [--shared-tokens 512] \
        [--new-tokens 64] [--batch 8] [--json out.json]

Three processes: dquantd (started here, --backend cuda by default), a prefill engine and a decode
engine, each loading the model (bfloat16 on the GPU when there is one). Prompts are byte strings
of the model's held-out text (heldout.txt; the models are byte-level, token = byte).

1. Wave 1: the prefill engine takes N prompts, looks them up (nothing held), runs the prefill and
   stores the KV (new chunks, then each prompt's sequence: chunks + private tail); it hands the
   sequence keys, first tokens and first-token logits to the decode engine through a file, as a
   scheduler would hand over request ids. Wave 2: N prompts sharing their first --shared-tokens
   bytes with wave 1's and going on with other text: LOOKUP hits the common chunks and the
   prefill runs only on the rest. The prefill engine stores four copies of every sequence (the
   copies are all hits: only their private tails are recomputed) so that each decode run below
   starts from the prompt alone (ATTEND appends the tokens it decodes).
2. The decode engine, per wave: the model with its own BF16 cache (DynamicCache, the reference:
   greedy tokens and logits) and the model on dquant in both modes, "attend" (each step's
   attention is ATTEND on the daemon's containers) and "fetch" (the prompt decompressed once,
   local attention), teacher-forced along the reference's greedy tokens: per-position KL(ref ||
   dquant) and greedy-token agreement. Speed: decode tokens/s of model.generate at batch 1 and at
   --batch, BF16 cache vs both modes; time to first token of the decode engine continuing a
   stored sequence vs recomputing the prefill.
3. The daemon's figures (STATS and /metrics): tokens and bytes stored, compression ratio vs BF16,
   LOOKUP hit rate, dedupe.

Prints a report and writes it as JSON (--json). Exit status 1 when greedy agreement is below
--min-agreement (0.95) in either mode or wave 2 does not hit the tier."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
COPIES = ("quality", "speed_batch", "speed_one", "ttft")


# ---- the model, prompts, timing ----

def load_model(path):
    import torch
    from transformers import AutoModelForCausalLM
    import dquant.transformers as dqt
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation=dqt.ATTENTION)
    return model.to(dev).eval(), dev


def make_prompts(path, n, length, shared):
    """Wave 1: n windows of `length` bytes of heldout.txt, spread over the file; wave 2: the first
    `shared` bytes of each wave-1 prompt, then `length - shared` bytes from elsewhere."""
    text = (pathlib.Path(path) / "heldout.txt").read_bytes()
    step = (len(text) // 2) // n
    w1 = [list(text[i * step:i * step + length]) for i in range(n)]
    half = len(text) // 2
    w2 = [w1[i][:shared] + list(text[half + i * step:half + i * step + length - shared]) for i in range(n)]
    return w1, w2


def sync():
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def clock():
    sync()
    return time.perf_counter()


def batches(items, size):
    return [items[i:i + size] for i in range(0, len(items), size)]


def padded(prompts, device):
    import torch
    P = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (P - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts], device=device)
    return ids, mask


def positions(mask):
    pos = mask.long().cumsum(-1) - 1
    return pos.masked_fill(mask == 0, 0)


@__import__("contextlib").contextmanager
def no_grad():
    import torch
    with torch.inference_mode():
        yield


# ---- the prefill engine ----

def prefill_engine(args):
    import torch
    import dquant
    import dquant.transformers as dqt
    model, dev = load_model(args.model)
    w1, w2 = make_prompts(args.model, args.prompts, args.prompt_tokens, args.shared_tokens)
    out = {"waves": {}}

    def prefill(c, wave, bi, batch, copy):
        keys = [f"{args.tag}-{wave}-{bi}-{j}-{copy}" for j in range(len(batch))]
        t0 = clock()
        cache = dqt.DquantCache(c, model, mode="attend", name=args.name, lease_ms=60000)
        ids, mask = cache.prepare(batch, seq_keys=keys)
        n = ids.shape[1] - cache.get_seq_length()
        lg = model(input_ids=ids[:, -n:], attention_mask=mask, position_ids=positions(mask)[:, -n:],
                   past_key_values=cache, use_cache=True).logits[:, -1].float()
        return keys, cache, lg, ids, mask, clock() - t0

    with dquant.Client(args.addr, timeout_ms=120000) as c, no_grad():
        ids, mask = padded(w1[:args.batch], dev)           # warm-up: kernels, allocator
        model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=True)
        # the real prefill of both waves, one sequence per prompt
        for wave, prompts in (("wave1", w1), ("wave2", w2)):
            first, first_logits, t_tier, t_bf16, skipped = [], [], 0.0, 0.0, 0
            calls = __import__("collections").Counter()
            keys = []
            for bi, batch in enumerate(batches(prompts, args.batch)):
                k, cache, lg, ids, mask, dt = prefill(c, wave, bi, batch, COPIES[0])
                keys += k
                t_tier += dt
                calls.update(cache.tier.seconds)
                skipped += cache.skipped_tokens
                first += lg.argmax(-1).tolist()
                first_logits += lg.cpu().tolist()
                t0 = clock()                                # the same batch recomputed with the model's own cache
                model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=True)
                t_bf16 += clock() - t0
            out["waves"][wave] = {"prompts": prompts, "seq_keys": {COPIES[0]: keys}, "first": first,
                                  "first_logits": first_logits, "prefill_s_tier": t_tier,
                                  "prefill_s_tier_calls": dict(calls), "prefill_s_recompute": t_bf16,
                                  "prompt_tokens": sum(map(len, prompts)), "skipped_tokens": skipped}
            print(f"prefill {wave}: {len(prompts)} prompts, {skipped} of {sum(map(len, prompts))} prompt tokens "
                  f"held by the tier, {t_tier * 1e3:.1f} ms with the tier (daemon calls: "
                  + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in sorted(calls.items()))
                  + f") vs {t_bf16 * 1e3:.1f} ms recomputed", flush=True)
        st = c.stats()
        out["stored"] = {k: st["gauges"].get(k) for k in ("tokens_stored", "stored_bytes", "bf16_equivalent_bytes",
                                                            "compression_ratio", "chunks_stored", "sequences")}
        # copies of every sequence for the decode engine's other runs (all chunks held: only the
        # private tails are recomputed)
        for wave, prompts in (("wave1", w1), ("wave2", w2)):
            for copy in COPIES[1:]:
                keys = []
                for bi, batch in enumerate(batches(prompts, args.batch)):
                    keys += prefill(c, wave, bi, batch, copy)[0]
                out["waves"][wave]["seq_keys"][copy] = keys
    pathlib.Path(args.handoff).write_text(json.dumps(out))


# ---- the decode engine ----

def reference(model, prompts, steps, dev, forced=None):
    """The model with its own cache: greedy (or forced) decode after the prompt. Returns (tokens
    [B, steps], logits [B, steps, V] of steps 0..steps-1; step 0's are the prompt's last)."""
    import torch
    from transformers import DynamicCache
    ids, mask = padded(prompts, dev)
    cache = DynamicCache()
    lg = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), past_key_values=cache,
               use_cache=True).logits[:, -1].float()
    toks, logits = [], []
    for s in range(steps):
        logits.append(lg)
        toks.append(lg.argmax(-1))
        if s == steps - 1:
            break
        nxt = toks[-1] if forced is None else forced[:, s]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        lg = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=positions(mask)[:, -1:],
                   past_key_values=cache, use_cache=True).logits[:, -1].float()
    return torch.stack(toks, 1), torch.stack(logits, 1)


def on_dquant(model, c, mode, name, keys, prompts, forced, first_logits):
    """The model on sequences in dquantd, teacher-forced along forced [B, steps] (forced[:, 0] is
    the first token). Logits of steps 1..steps-1; step 0's are the prefill engine's."""
    import torch
    import dquant.transformers as dqt
    cache = dqt.DquantCache(c, model, mode=mode, name=name)
    ids, mask = cache.attach(keys, prompts, next_tokens=forced[:, 0].tolist())
    logits = [first_logits]
    for s in range(1, forced.shape[1]):
        lg = model(input_ids=ids[:, -1:], attention_mask=mask, position_ids=positions(mask)[:, -1:],
                   past_key_values=cache, use_cache=True).logits[:, -1].float()
        logits.append(lg)
        ids = torch.cat([ids, forced[:, s:s + 1]], 1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    return torch.stack(logits, 1)


def kl_rows(p_logits, q_logits):
    import torch
    lp, lq = torch.log_softmax(p_logits, -1), torch.log_softmax(q_logits, -1)
    return (lp.exp() * (lp - lq)).sum(-1)


def generate_tps(model, dev, prompts, steps, cache=None, ids=None, mask=None):
    """Decode tokens/s of model.generate: steps new tokens per row after the prompt (or after the
    attached sequences when cache is a DquantCache)."""
    if ids is None:
        ids, mask = padded(prompts, dev)
    t0 = clock()
    out = model.generate(input_ids=ids, attention_mask=mask, past_key_values=cache, max_new_tokens=steps,
                         min_new_tokens=steps, do_sample=False, pad_token_id=0)
    dt = clock() - t0
    return out.shape[0] * (out.shape[1] - ids.shape[1]) / dt, dt


def decode_engine(args):
    import torch
    import dquant
    import dquant.transformers as dqt
    model, dev = load_model(args.model)
    hand = json.loads(pathlib.Path(args.handoff).read_text())
    report = {}
    with dquant.Client(args.addr, timeout_ms=120000) as c, no_grad():
        for wave, w in hand["waves"].items():
            prompts, keys = w["prompts"], w["seq_keys"]
            first_logits = torch.tensor(w["first_logits"], device=dev)
            r = {"prompts": len(prompts), "prompt_tokens": w["prompt_tokens"], "skipped_tokens": w["skipped_tokens"],
                 "prefill_s_tier": w["prefill_s_tier"], "prefill_s_recompute": w["prefill_s_recompute"],
                 "prefill_s_tier_calls": w["prefill_s_tier_calls"]}
            # quality, teacher-forced along the BF16 cache's greedy tokens
            kls = {m: [] for m in ("attend", "fetch")}
            agree = {m: [] for m in ("attend", "fetch")}
            first_agree = []
            for bi, idx in enumerate(batches(list(range(len(prompts))), args.batch)):
                bp = [prompts[i] for i in idx]
                ref_tok, ref_lg = reference(model, bp, args.new_tokens, dev)
                first_agree += (torch.tensor([w["first"][i] for i in idx], device=dev) == ref_tok[:, 0]).tolist()
                for mode in ("fetch", "attend"):      # fetch first: attend appends to the sequences
                    lg = on_dquant(model, c, mode, args.name, [keys["quality"][i] for i in idx], bp, ref_tok,
                                   first_logits[idx])
                    kls[mode].append(kl_rows(ref_lg, lg))
                    agree[mode].append((lg.argmax(-1) == ref_tok).float())
            for mode in ("attend", "fetch"):
                kl = torch.cat(kls[mode])                   # [prompts, steps]
                ag = torch.cat(agree[mode])
                r[mode] = {"kl_mean": kl.mean().item(), "kl_max": kl.max().item(),
                           "kl_per_position": kl.mean(0).tolist(), "agreement": ag.mean().item(),
                           "agreement_first_token": ag[:, 0].mean().item()}
            r["first_token_agreement_prefill"] = sum(first_agree) / len(first_agree)
            # speed: decode tokens/s, batch of args.batch and of 1
            sp = {}
            for label, size, copy in (("batch", args.batch, "speed_batch"), ("one", 1, "speed_one")):
                bp = prompts[:size]
                bk = keys[copy][:size]
                nxt = w["first"][:size]
                generate_tps(model, dev, bp, args.new_tokens)   # warm-up of this shape
                tps_bf16, _ = generate_tps(model, dev, bp, args.new_tokens)
                res = {"batch": size, "bf16_tokens_per_s": tps_bf16}
                for mode in ("fetch", "attend"):
                    cache = dqt.DquantCache(c, model, mode=mode, name=args.name)
                    ids, mask = cache.attach(bk, bp, next_tokens=nxt)
                    tps, dt = generate_tps(model, dev, bp, args.new_tokens, cache, ids, mask)
                    res[f"{mode}_tokens_per_s"] = tps
                    res[f"{mode}_daemon_share"] = sum(cache.tier.seconds.values()) / dt
                    res[f"{mode}_ratio"] = tps / tps_bf16
                sp[label] = res
            r["decode"] = sp
            # time to first token of the decode engine: continue a stored sequence vs recompute
            tt = {}
            n = min(4, len(prompts))
            t_rec = 0.0
            for i in range(n):
                t0 = clock()
                reference(model, [prompts[i]], 1, dev)
                t_rec += clock() - t0
            tt["recompute_ms"] = t_rec / n * 1e3
            for mode in ("fetch", "attend"):
                t_tier, t_daemon = 0.0, 0.0
                for i in range(n):
                    t0 = clock()
                    cache = dqt.DquantCache(c, model, mode=mode, name=args.name)
                    ids, mask = cache.attach([keys["ttft"][i]], [prompts[i]], next_tokens=[w["first"][i]])
                    model(input_ids=ids[:, -1:], attention_mask=mask, position_ids=positions(mask)[:, -1:],
                          past_key_values=cache, use_cache=True).logits[:, -1].argmax(-1).item()
                    t_tier += clock() - t0
                    t_daemon += sum(cache.tier.seconds.values())
                tt[f"{mode}_ms"] = t_tier / n * 1e3
                tt[f"{mode}_daemon_ms"] = t_daemon / n * 1e3
                tt[f"{mode}_ratio"] = tt["recompute_ms"] / tt[f"{mode}_ms"]
            r["ttft"] = tt
            report[wave] = r
    pathlib.Path(args.result).write_text(json.dumps(report))


# ---- the orchestrator ----

def start_daemon(binary, backend, tmp, metrics_port):
    sock = os.path.join(tmp, "d.sock")
    log = open(os.path.join(tmp, "dquantd.log"), "wb")
    proc = subprocess.Popen([binary, "--listen", f"unix:{sock}", "--backend", backend, "--metrics",
                             f"127.0.0.1:{metrics_port}", "--log-level", "info"], stdout=log, stderr=log)
    deadline = time.time() + 30
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"dquantd exited with {proc.returncode}; log: {tmp}/dquantd.log")
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(sock)
            return proc, f"unix:{sock}"
        except OSError:
            if time.time() > deadline:
                proc.kill()
                raise SystemExit("dquantd did not listen within 30 s")
            time.sleep(0.05)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(port, names):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    got = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            if k.split("{")[0] in names:
                got[k] = float(v)
    return got


def run_role(role, args, extra):
    cmd = [sys.executable, __file__, "--role", role, "--model", args.model, "--addr", args.addr, "--name", args.name,
           "--tag", args.tag, "--prompts", str(args.prompts), "--prompt-tokens", str(args.prompt_tokens),
           "--shared-tokens", str(args.shared_tokens), "--new-tokens", str(args.new_tokens),
           "--batch", str(args.batch)] + extra
    t0 = time.perf_counter()
    r = subprocess.run(cmd)
    if r.returncode:
        raise SystemExit(f"the {role} engine failed ({r.returncode})")
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a model folder (config.json, model.safetensors, heldout.txt)")
    ap.add_argument("--dquantd", help="the dquantd binary (orchestrator)")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=700)
    ap.add_argument("--shared-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--min-agreement", type=float, default=0.95)
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--role", choices=("prefill", "decode"), help=argparse.SUPPRESS)
    ap.add_argument("--addr", help=argparse.SUPPRESS)
    ap.add_argument("--name", help=argparse.SUPPRESS)
    ap.add_argument("--tag", default="disagg", help=argparse.SUPPRESS)
    ap.add_argument("--handoff", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "prefill":
        return prefill_engine(args)
    if args.role == "decode":
        return decode_engine(args)
    if not args.dquantd:
        ap.error("--dquantd is required")
    args.name = args.name or pathlib.Path(args.model).resolve().name
    tmp = tempfile.mkdtemp(prefix="dquant-disagg-")
    port = free_port()
    proc, args.addr = start_daemon(args.dquantd, args.backend, tmp, port)
    try:
        import dquant
        hand, res = os.path.join(tmp, "handoff.json"), os.path.join(tmp, "result.json")
        t_pre = run_role("prefill", args, ["--handoff", hand])
        stored = json.loads(pathlib.Path(hand).read_text())["stored"]
        t_dec = run_role("decode", args, ["--handoff", hand, "--result", res])
        with dquant.Client(args.addr) as c:
            backend = c.server()["backend"]
            st = c.stats()
        m = metrics(port, {"dquant_lookup_hit_rate", "dquant_lookups_total", "dquant_lookup_hit_tokens_total",
                           "dquant_lookup_missed_tokens_total", "dquant_chunk_dedupe_hits_total",
                           "dquant_chunks_put_total", "dquant_compression_ratio"})
        report = {"model": args.name, "backend": backend, "prompts": args.prompts,
                  "prompt_tokens": args.prompt_tokens, "shared_tokens": args.shared_tokens,
                  "new_tokens": args.new_tokens, "batch": args.batch, "prefill_engine_s": t_pre,
                  "decode_engine_s": t_dec, "waves": json.loads(pathlib.Path(res).read_text()),
                  "daemon_after_prefill": stored,
                  "daemon": {**{k: v for k, v in st["counters"].items() if k.startswith(("lookup", "chunk", "attend",
                                                                                          "tokens_"))},
                             **{k: v for k, v in st["gauges"].items() if k in ("lookup_hit_rate", "compression_ratio",
                                                                                "tokens_stored", "stored_bytes",
                                                                                "chunks_stored")}},
                  "metrics": m}
        ok = print_report(report, args.min_agreement)
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        return 0 if ok else 1
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        if os.environ.get("KEEP_TMP"):
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def print_report(rep, min_agreement):
    ok = True
    d = rep["daemon_after_prefill"]
    print(f"\n== {rep['model']} through dquantd ({rep['backend']} backend): {rep['prompts']} prompts x 2 waves, "
          f"{rep['prompt_tokens']} tokens ({rep['shared_tokens']} shared in wave 2), {rep['new_tokens']} decoded")
    print(f"stored after the prefill of both waves: {d['sequences']:.0f} sequences, {d['chunks_stored']:.0f} chunks, "
          f"{d['tokens_stored']:.0f} token-layers, {d['stored_bytes'] / 2**20:.1f} MiB vs "
          f"{d['bf16_equivalent_bytes'] / 2**20:.1f} MiB as BF16: {d['compression_ratio']:.2f}x smaller "
          f"(window records, plus each sequence's BF16 tail of up to 127 tokens)")
    print(f"/metrics: " + ", ".join(f"{k} {v:g}" for k, v in sorted(rep["metrics"].items())))
    for wave, r in rep["waves"].items():
        held = r["skipped_tokens"] / r["prompt_tokens"]
        calls = r["prefill_s_tier_calls"]
        model_s = r["prefill_s_tier"] - sum(calls.values())
        print(f"-- {wave}: prompt tokens held by the tier {r['skipped_tokens']}/{r['prompt_tokens']} ({held:.0%}); "
              f"prefill engine {r['prefill_s_tier'] * 1e3:.1f} ms with the tier: model {model_s * 1e3:.1f} ms vs "
              f"{r['prefill_s_recompute'] * 1e3:.1f} ms on whole prompts, daemon calls "
              + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in sorted(calls.items())))
        for mode in ("attend", "fetch"):
            q = r[mode]
            print(f"   {mode:6s}: greedy agreement {q['agreement']:.4f} (first token {q['agreement_first_token']:.3f}), "
                  f"KL mean {q['kl_mean']:.5f} max {q['kl_max']:.4f} nats")
            ok &= q["agreement"] >= min_agreement
        print("   KL per position (attend): " + " ".join(f"{x:.4f}" for x in r["attend"]["kl_per_position"][:16]) + " ...")
        for label, s in r["decode"].items():
            print(f"   decode batch {s['batch']}: BF16 cache {s['bf16_tokens_per_s']:.0f} tok/s, attend "
                  f"{s['attend_tokens_per_s']:.0f} ({s['attend_ratio']:.2f}x; {s['attend_daemon_share']:.0%} of it in "
                  f"daemon calls), fetch {s['fetch_tokens_per_s']:.0f} ({s['fetch_ratio']:.2f}x)")
        t = r["ttft"]
        print(f"   decode-engine TTFT: recompute {t['recompute_ms']:.2f} ms, tier attend {t['attend_ms']:.2f} ms "
              f"({t['attend_ratio']:.2f}x; daemon calls {t['attend_daemon_ms']:.2f} ms), tier fetch {t['fetch_ms']:.2f} "
              f"ms ({t['fetch_ratio']:.2f}x; daemon calls {t['fetch_daemon_ms']:.2f} ms)")
    if rep["waves"]["wave2"]["skipped_tokens"] == 0:
        print("FAIL: wave 2 did not hit the tier")
        ok = False
    print("PASS" if ok else f"FAIL: greedy agreement below {min_agreement}")
    return ok


if __name__ == "__main__":
    sys.exit(main())
