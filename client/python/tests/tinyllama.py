"""A Llama-architecture decoder in numpy for the tests of dquant.kvtier (CI has no torch or
transformers): token embedding, per layer RMSNorm, Q/K/V projections with grouped-query heads,
rotary position embedding (keys are cached after RoPE, as engines cache them), attention,
output projection, SwiGLU MLP, final norm and LM head. Random weights, float32.

Engine is the generation loop an engine runs around such a model on a left-padded batch:
`reference` keeps an exact local cache; `tier` keeps the KV in dquantd through a TierBatch
(prefill on the positions the tier did not hold, then decode by ATTEND or by a local cache of the
decompressed prompt), which is what dquant.transformers.DquantCache does inside transformers."""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from dquant.kvtier import TierBatch


class TinyLlama:
    def __init__(self, layers=2, q_heads=4, kv_heads=2, head_dim=64, vocab=97, mlp=256, seed=0,
                 theta=10000.0):
        rng = np.random.default_rng(seed)
        self.layers, self.q_heads, self.kv_heads, self.head_dim, self.vocab = layers, q_heads, kv_heads, head_dim, vocab
        hidden = q_heads * head_dim
        self.hidden = hidden

        def w(*shape, scale=1.0):
            return (rng.standard_normal(shape) * scale / np.sqrt(shape[0])).astype(np.float32)

        self.embed = rng.standard_normal((vocab, hidden)).astype(np.float32)
        self.blocks = [dict(wq=w(hidden, hidden), wk=w(hidden, kv_heads * head_dim), wv=w(hidden, kv_heads * head_dim),
                            wo=w(hidden, hidden), wg=w(hidden, mlp), wu=w(hidden, mlp), wd=w(mlp, hidden))
                       for _ in range(layers)]
        self.head = w(hidden, vocab, scale=4.0)
        self.inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)

    @staticmethod
    def _norm(x):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)

    def _rope(self, x, pos):
        """x [B, heads, n, D], pos [B, n] -> rotated (rotate-half convention)."""
        ang = pos[:, None, :, None].astype(np.float64) * self.inv_freq[None, None, None, :]
        cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
        cos, sin = np.concatenate([cos, cos], -1), np.concatenate([sin, sin], -1)
        h = x.shape[-1] // 2
        rot = np.concatenate([-x[..., h:], x[..., :h]], -1)
        return x * cos + rot * sin

    def forward(self, ids: np.ndarray, pos: np.ndarray,
                attend: Callable[[int, np.ndarray, np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
        """ids, pos [B, n]; attend(layer, q [B,Hq,n,D], k [B,Hkv,n,D], v) -> [B, n, Hq, D] is the
        cache: it sees the new tokens' K/V and returns their attention. Returns logits [B, n, V]."""
        B, n = ids.shape
        x = self.embed[ids]
        for li, p in enumerate(self.blocks):
            h = self._norm(x)
            q = (h @ p["wq"]).reshape(B, n, self.q_heads, self.head_dim).transpose(0, 2, 1, 3)
            k = (h @ p["wk"]).reshape(B, n, self.kv_heads, self.head_dim).transpose(0, 2, 1, 3)
            v = (h @ p["wv"]).reshape(B, n, self.kv_heads, self.head_dim).transpose(0, 2, 1, 3)
            q, k = self._rope(q, pos), self._rope(k, pos)
            o = attend(li, q.astype(np.float32), k.astype(np.float32), v.astype(np.float32))
            x = x + o.reshape(B, n, self.hidden) @ p["wo"]
            h = self._norm(x)
            g = h @ p["wg"]
            x = x + ((g / (1 + np.exp(-g))) * (h @ p["wu"])) @ p["wd"]
        return self._norm(x) @ self.head


def local_attention(q, k, v, q_start, pads):
    """Causal attention over a left-padded batch: q [B,Hq,n,D] at padded positions
    [q_start, q_start+n), k/v [B,Hkv,T,D] at [0, T); key j of row b is visible to query i when
    pads[b] <= j <= i. Returns [B, n, Hq, D]."""
    B, Hq, n, D = q.shape
    g = Hq // k.shape[1]
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q, kk) / np.sqrt(D)
    qi = q_start + np.arange(n)[:, None]
    kj = np.arange(k.shape[2])[None, :]
    vis = (kj <= qi)[None, None] & (kj >= np.asarray(pads)[:, None, None, None])
    s = np.where(vis, s, -np.inf)
    s = np.where(vis.any(-1, keepdims=True), s, 0.0)     # a pad query sees no key: keep it finite
    s = s - s.max(-1, keepdims=True)
    w = np.exp(s)
    w /= w.sum(-1, keepdims=True)
    return np.einsum("bhij,bhjd->bhid", w, vv).transpose(0, 2, 1, 3)


class Engine:
    """Greedy generation on a left-padded batch, with the model's KV either local (reference) or
    in dquantd (tier). Records each step's logits [B, V] and tokens."""

    def __init__(self, model: TinyLlama):
        self.model = model

    def reference(self, prompts: Sequence[Sequence[int]], steps: int,
                  forced: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
        """Exact local cache. forced [B, steps]: feed these tokens instead of the argmax
        (teacher forcing), to compare logits position by position. Returns (tokens, logits)."""
        P = max(len(p) for p in prompts)
        pads = [P - len(p) for p in prompts]
        ids = np.array([[0] * pads[b] + list(p) for b, p in enumerate(prompts)])
        cache = [None] * self.model.layers

        def attend(start):
            def f(li, q, k, v):
                if cache[li] is None:
                    cache[li] = (k, v)
                else:
                    cache[li] = (np.concatenate([cache[li][0], k], 2), np.concatenate([cache[li][1], v], 2))
                return local_attention(q, cache[li][0], cache[li][1], start, pads)
            return f

        return self._loop(ids, pads, 0, attend, steps, forced)

    def tier(self, batch: TierBatch, prompts: Sequence[Sequence[int]], steps: int,
             forced: Optional[np.ndarray] = None, seq_keys=None) -> Tuple[np.ndarray, np.ndarray]:
        """Through dquantd: prepare (LOOKUP), prefill of [skip, P) over the decompressed held prefix,
        store, then decode by ATTEND (attend mode) or over the fetched prompt (fetch mode)."""
        ids_l, _ = batch.prepare(prompts, seq_keys=seq_keys)
        ids = np.array(ids_l)
        pads = [r.pad for r in batch.rows]
        like = np.zeros(0, np.float32)
        pre = batch.prefix_kv(like)
        cache = [None] * self.model.layers if pre is None else list(pre)
        self.prefill_positions = ids.shape[1] - batch.skip

        def attend(start):
            def f(li, q, k, v):
                if not batch.stored:                                  # prefill: local attention
                    cache[li] = (k, v) if cache[li] is None else \
                        (np.concatenate([cache[li][0], k], 2), np.concatenate([cache[li][1], v], 2))
                    out = local_attention(q, cache[li][0], cache[li][1], start, pads)
                    if li == self.model.layers - 1:
                        batch.store(cache)
                        if batch.mode == "fetch":
                            cache[:] = batch.fetch(like)
                    return out
                if batch.mode == "attend":
                    return batch.attend(li, q, k, v)[0]
                cache[li] = (np.concatenate([cache[li][0], k], 2), np.concatenate([cache[li][1], v], 2))
                return local_attention(q, cache[li][0], cache[li][1], start, pads)
            return f

        return self._loop(ids, pads, batch.skip, attend, steps, forced)

    def attached(self, batch: TierBatch, seq_keys, prompts, first: Sequence[int], steps: int,
                 forced: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
        """The decode engine of a disaggregated run: continues sequences stored elsewhere from the
        prefill engine's first tokens. Returns (tokens, logits) of steps - 1 decode steps after
        the first token (the first token's logits are the prefill engine's)."""
        ids_l, _ = batch.attach(seq_keys, prompts)
        pads = [r.pad for r in batch.rows]
        like = np.zeros(0, np.float32)
        cache = batch.fetch(like) if batch.mode == "fetch" else None
        P = len(ids_l[0])

        def attend(start):
            def f(li, q, k, v):
                if batch.mode == "attend":
                    return batch.attend(li, q, k, v)[0]
                cache[li] = (np.concatenate([cache[li][0], k], 2), np.concatenate([cache[li][1], v], 2))
                return local_attention(q, cache[li][0], cache[li][1], start, pads)
            return f

        tok = np.asarray(first)[:, None]
        toks, logits = [], []
        for s in range(steps - 1):
            pos = np.array([[P + s - pads[b]] for b in range(len(pads))])
            lg = self.model.forward(tok, pos, attend(P + s))[:, -1]
            logits.append(lg)
            nxt = lg.argmax(-1) if forced is None else forced[:, s + 1]
            toks.append(lg.argmax(-1))
            tok = np.asarray(nxt)[:, None]
        return np.stack(toks, 1), np.stack(logits, 1)

    def _loop(self, ids, pads, start, attend, steps, forced):
        B, P = ids.shape
        pos = np.maximum(np.arange(P)[None, :] - np.asarray(pads)[:, None], 0)
        lg = self.model.forward(ids[:, start:], pos[:, start:], attend(start))[:, -1]
        toks, logits = [lg.argmax(-1)], [lg]
        for s in range(1, steps):
            prev = toks[-1] if forced is None else forced[:, s - 1]
            p = np.array([[P + s - 1 - pads[b]] for b in range(B)])
            lg = self.model.forward(np.asarray(prev)[:, None], p, attend(P + s - 1))[:, -1]
            toks.append(lg.argmax(-1))
            logits.append(lg)
        return np.stack(toks, 1), np.stack(logits, 1)


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    """KL(p || q) in nats per position, from logits [..., V]."""
    lp = p_logits - p_logits.max(-1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
    lq = q_logits - q_logits.max(-1, keepdims=True)
    lq = lq - np.log(np.exp(lq).sum(-1, keepdims=True))
    return (np.exp(lp) * (lp - lq)).sum(-1)


def prompts_of(rng: np.random.Generator, lengths: Sequence[int], vocab: int) -> List[List[int]]:
    return [rng.integers(1, vocab, size=n).tolist() for n in lengths]
