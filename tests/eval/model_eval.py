#!/usr/bin/env python3
"""End-to-end model evaluation of the KV codecs (seed Appendix B / Table 4 protocol, small models).

For each model (bytellama-19m, tinystories-656k; Hugging Face Llama folders) and each document:
full-precision (fp32) prefill of a context (bytellama 1,024 tokens, tinystories 256), then for each
codec the cached K/V of every layer are replaced by the codec's reconstruction (through the Python
binding, client/python/dquant) — the most recent 128 tokens kept in BF16 for every method — and the
next 256 positions are scored teacher-forced with the modified cache: token-wise forward
KL(p_unquantized || p_codec) and perplexity. Per codec it reports the geometric mean over documents
of the per-document KL ratio against D-Quant (dq226), with a 95% paired-bootstrap interval (20,000
resamples over documents), as the seed's Table 4, plus mean KL and perplexity, and the
matched-storage fixed-width rows (fixed226, fixed196). Keys in HF Llama caches are post-RoPE; the
codecs take them as they are.

Documents: bytellama-19m — disjoint 1,280-byte windows of heldout.txt at fixed, evenly spaced
offsets (token = byte); tinystories-656k — stories sampled from the model itself (fixed seeds, nine
seed prompts × three samples, tokenized with its tokenizer.json; stories are concatenated, each
opened by <|start_story|>, up to 512 tokens).

Run on the GPU host (PyTorch, transformers, tokenizers, numpy; libdquant.so built for that host):
    python3 tests/eval/model_eval.py [--models bytellama-19m,tinystories-656k] [--docs 27]
Data: --data DIR, else $DQ_DATA_DIR, else .data/ in the repository (git-ignored; copy the model
folders there and carry it), else ../shared/data. libdquant.so: $DQUANT_LIB_DIR or the repository's
build folders. Prints a markdown table per model; writes JSON to --json or $OUT/model_eval.json.
`--check` runs the statistics and cache-replacement logic on synthetic tensors (no model needed)."""

import argparse
import copy
import json
import math
import os
import pathlib
import sys
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "client" / "python"))

from dquant import evalcodecs  # noqa: E402

DEFAULT_CODECS = "dq226,dq196,fixed226,fixed196,int2,quarot2,kivi2,turbo2,bf16,dq226@2.25,dq196@2.5"
REFERENCE = "dq226"

MODELS = {
    # name: context tokens, scored positions
    "bytellama-19m": {"context": 1024, "score": 256},
    "tinystories-656k": {"context": 256, "score": 256},
}

TINY_PROMPTS = [
    "Once upon a time", "One day, a little girl named Lily", "Tom had a red ball", "The sun was hot and",
    "Sam and his dog", "There was a big tree in the park", "Mia wanted to bake a cake", "A little bird",
    "Ben found a shiny box",
]


# ---- statistics (numpy only) ----

def geomean_ratio(kl, kl_ref, resamples=20000, seed=0):
    """Geometric mean over documents of kl / kl_ref, with a 95% paired percentile-bootstrap interval
    (documents resampled with replacement, the same indices for both)."""
    r = np.log(np.asarray(kl, dtype=np.float64)) - np.log(np.asarray(kl_ref, dtype=np.float64))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(r), size=(resamples, len(r)))
    boot = np.exp(r[idx].mean(axis=1))
    return float(np.exp(r.mean())), float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))


def mean_ci(x, resamples=20000, seed=0):
    x = np.asarray(x, dtype=np.float64)
    rng = np.random.default_rng(seed)
    boot = x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)
    return float(x.mean()), float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))


# ---- documents ----

def bytellama_docs(folder, n_docs, length):
    text = (folder / "heldout.txt").read_bytes()
    if len(text) < n_docs * length:
        raise SystemExit(f"heldout.txt holds {len(text)} bytes, fewer than {n_docs} x {length}")
    step = (len(text) - length) // max(1, n_docs - 1)
    return [list(text[i * step:i * step + length]) for i in range(n_docs)]


def tinystories_docs(model, folder, n_docs, length, device, seed):
    import torch
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    bos, eos = model.config.bos_token_id, model.config.eos_token_id
    docs = []
    for i in range(n_docs):
        prompt = TINY_PROMPTS[i % len(TINY_PROMPTS)]
        ids = tok.encode(prompt).ids
        if not ids or ids[0] != bos:
            ids = [bos] + ids
        torch.manual_seed(seed + i)
        while len(ids) < length:
            inp = torch.tensor([ids], device=device)
            out = model.generate(inp, do_sample=True, top_k=0, top_p=1.0, temperature=1.0,
                                 max_new_tokens=length - len(ids), eos_token_id=eos, pad_token_id=eos)
            ids = out[0].tolist()
            if len(ids) < length and ids[-1] == eos:
                ids.append(bos)   # the next story follows, as in the training stream
        docs.append(ids[:length])
    return docs


# ---- the KV cache ----

def cache_layers(cache):
    """The (key, value) tensors of every layer, [batch, kv_heads, tokens, head_dim], as stored in
    the cache object (transformers' DynamicCache, old or new layout, or legacy tuples)."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    if hasattr(cache, "key_cache"):
        return list(zip(cache.key_cache, cache.value_cache))
    return [(kv[0], kv[1]) for kv in cache]


def replace_kv(cache, codec, residual):
    """Replaces, in place, every layer's cached K and V except the last `residual` tokens by the
    codec's reconstruction (all tokens encoded window by window from position 0); the last
    `residual` tokens are rounded to BF16 (the tail every method keeps)."""
    import torch
    for k, v in cache_layers(cache):
        T = k.shape[2]
        q = max(0, T - residual)
        for t, kind in ((k, "k"), (v, "v")):
            if q:
                x = t[0, :, :q, :].permute(1, 0, 2).contiguous().float().cpu()   # [tokens, kv_heads, head_dim]
                xh = codec.roundtrip(x, kind)
                t[0, :, :q, :] = xh.permute(1, 0, 2).to(device=t.device, dtype=t.dtype)
            t[0, :, q:, :] = t[0, :, q:, :].to(torch.bfloat16).to(t.dtype)


def token_kl(ref_logp, logp):
    """Forward KL(p_ref || p) per position (nats); inputs [positions, vocab] log-probabilities."""
    return (ref_logp.exp() * (ref_logp - logp)).sum(dim=-1)


# ---- one model ----

def evaluate_model(name, folder, args, device):
    import torch
    from transformers import LlamaForCausalLM

    spec = MODELS[name]
    ctx = args.context or spec["context"]
    score = spec["score"]
    try:
        model = LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    except TypeError:   # transformers < 4.56 spells it torch_dtype
        model = LlamaForCausalLM.from_pretrained(str(folder), torch_dtype=torch.float32)
    model = model.to(device).eval()
    cfg = model.config
    kv_heads = cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    t0 = time.time()
    with torch.no_grad():
        if name == "bytellama-19m":
            docs = bytellama_docs(folder, args.docs, ctx + score)
        else:
            docs = tinystories_docs(model, folder, args.docs, ctx + score, device, args.seed)

    codecs, skipped = [], {}
    for cname in args.codecs.split(","):
        try:
            codecs.append((cname, evalcodecs.get(cname, kv_heads, head_dim)))
        except Exception as e:   # e.g. a container too small at this n: reported, not fatal
            skipped[cname] = str(e)
    names = [c for c, _ in codecs]
    if REFERENCE not in names:
        raise SystemExit(f"the codec list must contain {REFERENCE} (the ratio reference)")

    kl = {c: [] for c in names}
    nll = {c: [] for c in names}
    ref_nll = []
    with torch.no_grad():
        for d, ids in enumerate(docs):
            ids_t = torch.tensor([ids], device=device)
            pre = model(ids_t[:, :ctx], use_cache=True)
            ref_cache = pre.past_key_values
            cont = ids_t[:, ctx:ctx + score]
            targets = cont[0, 1:]

            def logprobs(cache):
                out = model(cont, past_key_values=cache, use_cache=True)
                return out.logits[0].float().log_softmax(dim=-1)

            ref_lp = logprobs(copy.deepcopy(ref_cache))
            ref_nll.append(float(-ref_lp[:-1].gather(1, targets[:, None]).mean()))
            for cname, codec in codecs:
                cache = copy.deepcopy(ref_cache)
                replace_kv(cache, codec, args.residual)
                lp = logprobs(cache)
                kl[cname].append(float(token_kl(ref_lp, lp).mean()))
                nll[cname].append(float(-lp[:-1].gather(1, targets[:, None]).mean()))
            if args.verbose:
                print(f"  {name} doc {d + 1}/{len(docs)}: KL " +
                      ", ".join(f"{c} {kl[c][-1]:.4g}" for c in names), file=sys.stderr)

    rows = {}
    for c, codec in codecs:
        g = geomean_ratio(kl[c], kl[REFERENCE], args.resamples, args.seed)
        m = mean_ci(kl[c], args.resamples, args.seed)
        rows[c] = {
            "bits_per_value": codec.bits_per_value(),
            "kl_mean": m[0], "kl_mean_ci": [m[1], m[2]],
            "kl_ratio_geomean_vs_dq226": g[0], "kl_ratio_ci": [g[1], g[2]],
            "ppl": math.exp(float(np.mean(nll[c]))),
            "docs_worse_than_dq226": int(sum(a > b for a, b in zip(kl[c], kl[REFERENCE]))),
            "per_doc_kl": kl[c], "per_doc_nll": nll[c],
        }
    return {
        "model": name, "documents": len(docs), "context": ctx, "scored_positions": score,
        "bf16_residual": args.residual, "kv_heads": kv_heads, "head_dim": head_dim,
        "stream_values": kv_heads * head_dim, "reference_ppl": math.exp(float(np.mean(ref_nll))),
        "resamples": args.resamples, "seconds": time.time() - t0, "codecs": rows, "skipped": skipped,
    }


def print_table(res):
    print(f"\n### {res['model']}: {res['documents']} documents, {res['context']}-token context, "
          f"{res['scored_positions']} scored positions, last {res['bf16_residual']} tokens BF16 "
          f"(n = {res['stream_values']} values per stream)\n")
    print(f"Unquantized perplexity {res['reference_ppl']:.4f}. KL ratio: geometric mean over documents of "
          f"KL(codec) / KL(dq226), 95% paired bootstrap ({res['resamples']} resamples).\n")
    print("| codec | bits/value | KL vs unquantized, nats/token [95% CI] | KL ratio vs dq226 [95% CI] | "
          "perplexity | docs worse than dq226 |")
    print("|---|---:|---|---|---:|---:|")
    for c, r in res["codecs"].items():
        print(f"| {c} | {r['bits_per_value']:.4f} | {r['kl_mean']:.4g} [{r['kl_mean_ci'][0]:.4g}, "
              f"{r['kl_mean_ci'][1]:.4g}] | {r['kl_ratio_geomean_vs_dq226']:.3f} [{r['kl_ratio_ci'][0]:.3f}, "
              f"{r['kl_ratio_ci'][1]:.3f}] | {r['ppl']:.4f} | {r['docs_worse_than_dq226']}/{res['documents']} |")
    for c, why in res["skipped"].items():
        print(f"\n{c}: not evaluated at n = {res['stream_values']}: {why}")


def data_root(arg):
    for cand in [arg, os.environ.get("DQ_DATA_DIR"), REPO / ".data", REPO.parent / "shared" / "data"]:
        if cand and pathlib.Path(cand).is_dir():
            return pathlib.Path(cand)
    raise SystemExit("no data folder: pass --data DIR (the folder holding bytellama-19m/ and tinystories-656k/)")


# ---- --check: the logic above on synthetic tensors, no model ----

def self_check():
    rng = np.random.default_rng(1)
    ref = rng.uniform(0.01, 0.02, 27)
    g = geomean_ratio(2.0 * ref, ref, 2000)
    assert abs(g[0] - 2.0) < 1e-12 and g[1] <= 2.0 <= g[2], g
    g = geomean_ratio(ref * rng.uniform(1.5, 2.5, 27), ref, 2000)
    assert 1.5 < g[1] < g[0] < g[2] < 2.5, g
    m = mean_ci(ref, 2000)
    assert m[1] <= m[0] <= m[2]
    print("statistics: ok")
    try:
        import torch
    except ImportError:
        print("torch not installed: cache replacement not checked")
        return
    T, kvh, hd = 300, 2, 64
    k = torch.randn(1, kvh, T, hd)
    v = torch.randn(1, kvh, T, hd)
    k0, v0 = k.clone(), v.clone()
    cache = [(k, v)]
    codec = evalcodecs.get("dq226", kvh, hd)
    replace_kv(cache, codec, 128)
    q = T - 128
    direct = codec.roundtrip(k0[0, :, :q].permute(1, 0, 2).contiguous(), "k")
    assert torch.equal(k[0, :, :q], direct.permute(1, 0, 2)), "quantized part differs from the codec's roundtrip"
    assert torch.equal(k[0, :, q:], k0[0, :, q:].to(torch.bfloat16).float()), "tail is not BF16-rounded"
    e = float(((v - v0) ** 2).sum() / (v0 ** 2).sum())
    assert 0.01 < e < 0.2, e
    lp = torch.randn(5, 11).log_softmax(-1)
    assert float(token_kl(lp, lp).abs().max()) < 1e-6
    assert float(token_kl(lp, torch.randn(5, 11).log_softmax(-1)).min()) >= 0
    print("cache replacement and KL: ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="bytellama-19m,tinystories-656k")
    ap.add_argument("--data", default=None)
    ap.add_argument("--codecs", default=DEFAULT_CODECS)
    ap.add_argument("--docs", type=int, default=27)
    ap.add_argument("--context", type=int, default=0, help="override the context length (tokens)")
    ap.add_argument("--residual", type=int, default=128, help="most recent tokens kept BF16")
    ap.add_argument("--resamples", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--check", action="store_true", help="check the logic on synthetic tensors and exit")
    args = ap.parse_args()
    if args.check:
        self_check()
        return
    import torch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    root = data_root(args.data)
    results = []
    for name in args.models.split(","):
        if name not in MODELS:
            raise SystemExit(f"unknown model {name!r} ({', '.join(MODELS)})")
        res = evaluate_model(name, root / name, args, device)
        print_table(res)
        sys.stdout.flush()
        results.append(res)
    out = args.json or (os.path.join(os.environ["OUT"], "model_eval.json") if os.environ.get("OUT") else None)
    if out:
        with open(out, "w") as f:
            json.dump({"device": device, "torch": torch.__version__, "results": results}, f, indent=1)
        print(f"\nJSON: {out}")


if __name__ == "__main__":
    main()
