"""A batch of prompts whose KV lives in dquantd's shared KV tier: what an engine's cache does
between its model and the daemon, with no model framework in it (dquant.transformers adapts it to
Hugging Face transformers; the tests drive it with a small numpy model).

Arrays use an engine's cache layout: per layer, K and V are [batch, kv_heads, tokens, head_dim]
(numpy arrays or torch tensors, CPU or CUDA). A batch of prompts of different lengths is left
padded to the longest, P tokens: row b starts with pads[b] pad positions, then its prompt. All
positions here are in those padded coordinates.

The life of a batch:

1. prepare(prompts): chunk keys of every prompt (dquant.chunk_keys, the tier's hash chain),
   LOOKUP with a lease, and the plan: `skip` leading padded positions whose KV every row already
   has (its pads, or its chunks held by the tier). The model runs on positions [skip, P) only;
   prefix_kv() gives the KV of [0, skip) decompressed from the held chunks (zeros on pads).
2. store(kv): once the model has run, the prompt KV of every layer goes to the tier: the full
   chunks the tier lacked (PUT_CHUNKS: deduped against other engines, chained to their parent),
   then the row's sequence, built on its leading chunks, holding the rest of its prompt as its
   private tail (PUT with prefix_chunks). A sequence owns at least one token, so a prompt that
   ends on a chunk boundary keeps its last chunk in its tail as well.
3. decode, one of two modes:
   - "attend": attend(layer, q, k_new, v_new) appends each new token to the row's sequence and
     returns the attention output computed by the daemon on the containers (ATTEND, one softmax
     over the chunks and the tail, LSE merged inside);
   - "fetch": fetch() decompresses every row's prompt once (chunks + tail); the engine appends
     and attends locally with its own kernel.

attach(seq_keys, prompts) starts a batch at step 3 on sequences another process stored (the
decode engine of a disaggregated deployment)."""

from __future__ import annotations

import collections
import dataclasses
import time
import uuid
from typing import Any, List, Optional, Sequence, Tuple

from . import _tensor as T
from ._errors import ClientError, ErrorCode
from .client import Client, chunk_keys

__all__ = ["ModelShape", "Row", "TierBatch", "MODES"]

MODES = ("attend", "fetch")


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the daemon needs of a model: its name there and its attention shape."""

    name: str
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int


@dataclasses.dataclass
class Row:
    """One prompt of the batch. keys: its full chunks' keys; hits: leading chunks the tier held at
    LOOKUP; prefix: chunks its sequence is built on; seq: its sequence key; pad: pad positions
    before it in the batch."""

    tokens: List[int]
    keys: List[bytes]
    seq: str
    hits: int = 0
    prefix: int = 0
    pad: int = 0
    lease_id: int = 0

    @property
    def length(self) -> int:
        return len(self.tokens)


def prefix_chunks(ntokens: int, nkeys: int, chunk_tokens: int) -> int:
    """How many leading chunks a sequence of ntokens prompt tokens is built on: every full chunk,
    but the sequence keeps at least one token of its own (PUT needs one)."""
    return min(nkeys, max(0, ntokens - 1) // chunk_tokens)


class TierBatch:
    """The tier side of one batch of prompts (see the module's text). client: a dquant.Client used
    from this thread only; model: the model's shape (registered with the daemon here, profile
    and chunk_tokens as given; a model registered before with another spec is an EXISTS error);
    mode: "attend" or "fetch"; ns: the tenant namespace (chunks are shared within it)."""

    def __init__(self, client: Client, model: ModelShape, mode: str = "attend", ns: Optional[str] = None,
                 profile: Any = "dq226", chunk_tokens: Optional[int] = None, lease_ms: int = 30000,
                 seq_prefix: str = "dq-") -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.client, self.model, self.mode, self.ns = client, model, mode, ns
        self.lease_ms, self.seq_prefix = lease_ms, seq_prefix
        info = client.register_model(model.name, layers=model.layers, q_heads=model.q_heads,
                                     kv_heads=model.kv_heads, head_dim=model.head_dim, profile=profile,
                                     chunk_tokens=chunk_tokens)
        if not info["chunk_tokens"]:
            raise ClientError(ErrorCode.UNSUPPORTED, "TierBatch", "the daemon's library has no chunk tokens "
                              "(a libdquant-client older than the shared KV tier)")
        self.chunk_tokens = int(info["chunk_tokens"])
        self.bits_per_value = float(info["bits_per_value"])
        self.rows: List[Row] = []
        self.padded = 0       # P: the padded prompt length
        self.skip = 0         # leading padded positions the model need not run
        self.stored = False   # the prompts' KV is in the tier
        self.steps = 0        # tokens appended after the prompt (attend mode)
        #: seconds spent in each call to the daemon: lookup, prefix, store, fetch, attend
        self.seconds: collections.Counter = collections.Counter()

    # ---- 1. prepare ----

    def prepare(self, prompts: Sequence[Sequence[int]], seq_keys: Optional[Sequence[str]] = None,
                pad_id: int = 0) -> Tuple[List[List[int]], List[List[int]]]:
        """LOOKUP of every prompt (token id lists, non-empty) and the padded batch. Returns
        (input_ids, attention_mask) as lists of P ints per row (left padded with pad_id / 0).
        The chunks found are leased until store() (or lease_ms)."""
        self._rows(prompts, seq_keys)
        t0 = time.perf_counter()
        for r in self.rows:
            if r.keys:
                res = self.client.lookup(r.keys, self.model.name, ns=self.ns, lease_ms=self.lease_ms)
                r.hits, r.lease_id = res.hits, res.lease_id
        C = self.chunk_tokens
        self.skip = min(r.pad + min(r.hits, r.prefix) * C for r in self.rows)
        self.seconds["lookup"] += time.perf_counter() - t0
        return self._padded(pad_id)

    def _rows(self, prompts: Sequence[Sequence[int]], seq_keys: Optional[Sequence[str]]) -> None:
        if self.rows:
            raise ValueError("this batch is prepared already: use one TierBatch per batch")
        prompts = [[int(t) for t in p] for p in prompts]
        if not prompts or any(not p for p in prompts):
            raise ValueError("prompts: a non-empty list of non-empty token id lists")
        if seq_keys is not None and len(seq_keys) != len(prompts):
            raise ValueError(f"seq_keys: {len(seq_keys)} keys for {len(prompts)} prompts")
        self.padded = max(len(p) for p in prompts)
        C = self.chunk_tokens
        for b, p in enumerate(prompts):
            keys = chunk_keys(self.ns or "", p, C)
            seq = seq_keys[b] if seq_keys is not None else f"{self.seq_prefix}{uuid.uuid4().hex}"
            self.rows.append(Row(tokens=p, keys=keys, seq=seq, prefix=prefix_chunks(len(p), len(keys), C),
                                 pad=self.padded - len(p)))

    def _padded(self, pad_id: int) -> Tuple[List[List[int]], List[List[int]]]:
        ids = [[pad_id] * r.pad + r.tokens for r in self.rows]
        mask = [[0] * r.pad + [1] * r.length for r in self.rows]
        return ids, mask

    def prefix_kv(self, like: Any) -> Optional[List[Tuple[Any, Any]]]:
        """The KV of padded positions [0, skip) per layer, (k, v) [batch, kv_heads, skip, head_dim]
        in like's flavour, dtype and device: each row's held chunks decompressed, zeros on its pads.
        None when skip is 0."""
        if self.skip == 0:
            return None
        t0 = time.perf_counter()
        L, H, D = self.model.layers, self.model.kv_heads, self.model.head_dim
        k = _zeros((L, len(self.rows), H, self.skip, D), like)
        v = _zeros((L, len(self.rows), H, self.skip, D), like)
        C = self.chunk_tokens
        for b, r in enumerate(self.rows):
            n = self.skip - r.pad        # this row's own tokens within [0, skip)
            if n <= 0:
                continue
            nchunks = -(-n // C)
            kc, vc = self.client.get_chunks(r.keys[:nchunks], ns=self.ns, dtype=_dtype_name(like), like=like)
            k[:, b, :, r.pad:] = _heads_first(kc[:, :n])
            v[:, b, :, r.pad:] = _heads_first(vc[:, :n])
        self.seconds["prefix"] += time.perf_counter() - t0
        return [(k[i], v[i]) for i in range(L)]

    # ---- 2. store ----

    def store(self, kv: Sequence[Tuple[Any, Any]]) -> None:
        """Stores the prompts' KV: kv per layer (k, v) [batch, kv_heads, >= P, head_dim] covering
        padded positions [0, P) (positions before skip may hold anything: they are not read).
        Then ends the leases of prepare()."""
        if self.stored:
            raise ValueError("store: the prompts are stored already")
        if len(kv) != self.model.layers:
            raise ValueError(f"store: {len(kv)} layers of KV for a model of {self.model.layers}")
        t_start = time.perf_counter()
        kv = [(_host(k), _host(v)) for k, v in kv]        # one copy per layer from a GPU
        C = self.chunk_tokens
        for b, r in enumerate(self.rows):
            own = slice(r.pad, self.padded)
            k = _stack([_tokens_first(lk[b, :, own]) for lk, _ in kv])   # [layers, tokens, kv_heads, D]
            v = _stack([_tokens_first(lv[b, :, own]) for _, lv in kv])
            nfull = len(r.keys)
            if nfull > r.hits:
                parent = r.keys[r.hits - 1] if r.hits else None
                self.client.put_chunks(r.keys[r.hits:], k[:, r.hits * C:nfull * C], v[:, r.hits * C:nfull * C],
                                       model=self.model.name, ns=self.ns, parent=parent)
            t0 = r.prefix * C
            self.client.put(r.seq, k[:, t0:], v[:, t0:], model=self.model.name, ns=self.ns,
                            prefix_chunks=r.keys[:r.prefix] or None)
        self.stored = True
        self.release()
        self.seconds["store"] += time.perf_counter() - t_start

    def release(self) -> None:
        """Ends the leases of prepare() (those that expired already are skipped)."""
        for r in self.rows:
            if r.lease_id:
                try:
                    self.client.release_lease(r.lease_id)
                except ClientError as e:
                    if e.code != ErrorCode.NOT_FOUND:
                        raise
                r.lease_id = 0

    # ---- 3. decode ----

    def attach(self, seq_keys: Sequence[str], prompts: Sequence[Sequence[int]],
               pad_id: int = 0) -> Tuple[List[List[int]], List[List[int]]]:
        """A batch on sequences stored by another process (store() there, same model, namespace and
        prompts): nothing is run or stored here. Returns the padded (input_ids, attention_mask) of
        the prompts, as prepare()."""
        self._rows(prompts, seq_keys)
        self.skip = self.padded
        self.stored = True
        return self._padded(pad_id)

    def fetch(self, like: Any) -> List[Tuple[Any, Any]]:
        """Every row's stored prompt decompressed (its chunks, then its own tokens), per layer (k, v)
        [batch, kv_heads, P, head_dim] in like's flavour, zeros on pads ("fetch" mode)."""
        self._need_stored("fetch")
        t_start = time.perf_counter()
        L, H, D = self.model.layers, self.model.kv_heads, self.model.head_dim
        k = _zeros((L, len(self.rows), H, self.padded, D), like)
        v = _zeros((L, len(self.rows), H, self.padded, D), like)
        C, dt = self.chunk_tokens, _dtype_name(like)
        for b, r in enumerate(self.rows):
            t0 = r.pad
            if r.prefix:
                kc, vc = self.client.get_chunks(r.keys[:r.prefix], ns=self.ns, dtype=dt, like=like)
                k[:, b, :, t0:t0 + r.prefix * C] = _heads_first(kc)
                v[:, b, :, t0:t0 + r.prefix * C] = _heads_first(vc)
                t0 += r.prefix * C
            ks, vs = self.client.get(r.seq, ns=self.ns, dtype=dt, like=like, tokens=r.length - r.prefix * C)
            k[:, b, :, t0:] = _heads_first(ks)
            v[:, b, :, t0:] = _heads_first(vs)
        self.seconds["fetch"] += time.perf_counter() - t_start
        return [(k[i], v[i]) for i in range(L)]

    def attend(self, layer: int, q: Any, k_new: Optional[Any] = None, v_new: Optional[Any] = None,
               scale: float = 0.0) -> Tuple[Any, Any]:
        """Decode attention of one new token per row on the daemon ("attend" mode): q [batch,
        q_heads, 1, head_dim]; k_new, v_new [batch, kv_heads, 1, head_dim] appended to each row's
        sequence first (None: attend without appending). Returns (out [batch, 1, q_heads,
        head_dim] in q's dtype, lse [batch, q_heads] f32), one ATTEND request for the batch."""
        self._need_stored("attend")
        B = len(self.rows)
        if tuple(q.shape) != (B, self.model.q_heads, 1, self.model.head_dim):
            raise ValueError(f"attend: q {tuple(q.shape)} is not [{B}, {self.model.q_heads}, 1, "
                             f"{self.model.head_dim}] (one new token per row)")
        kv_shape = (B, self.model.kv_heads, 1, self.model.head_dim)
        if (k_new is None) != (v_new is None):
            raise ValueError("attend: k_new and v_new go together")
        if k_new is not None and (tuple(k_new.shape) != kv_shape or tuple(v_new.shape) != kv_shape):
            raise ValueError(f"attend: k_new {tuple(k_new.shape)} / v_new {tuple(v_new.shape)} are not {kv_shape}")
        t0 = time.perf_counter()
        qh, kh, vh = _host(q), _host(k_new), _host(v_new)       # one copy each from a GPU, not one per row
        items = []
        for b, r in enumerate(self.rows):
            ak = _tokens_first(kh[b]) if kh is not None else None    # [1, kv_heads, D]
            av = _tokens_first(vh[b]) if vh is not None else None
            items.append((r.seq, layer, qh[b, :, 0], ak, av))
        out, lse = self.client.attend_batch(items, scale=scale, ns=self.ns, kv_heads=self.model.kv_heads)
        if layer == self.model.layers - 1 and k_new is not None:
            self.steps += 1
        out = _cast(out, q)[:, None]
        self.seconds["attend"] += time.perf_counter() - t0
        return out, lse

    def delete(self) -> None:
        """Deletes the batch's sequences (their chunks stay in the shared tier)."""
        self.release()
        for r in self.rows:
            try:
                self.client.delete(r.seq, ns=self.ns)
            except ClientError as e:
                if e.code != ErrorCode.NOT_FOUND:
                    raise

    def _need_stored(self, what: str) -> None:
        if not self.stored:
            raise ValueError(f"{what}: the batch's prompts are not stored (store() or attach() first)")


# ---- arrays: numpy or torch, the caller's flavour ----

def _is_torch(x: Any) -> bool:
    return T.is_torch(x)


def _dtype_name(like: Any) -> str:
    if _is_torch(like):
        return str(like.dtype).replace("torch.", "")
    return "f16" if str(like.dtype) == "float16" else "f32"


def _zeros(shape: Tuple[int, ...], like: Any) -> Any:
    if _is_torch(like):
        return like.new_zeros(shape)
    return T._np.zeros(shape, dtype=like.dtype if str(like.dtype) in ("float16", "float32") else T._np.float32)


def _stack(xs: List[Any]) -> Any:
    if _is_torch(xs[0]):
        import torch
        return torch.stack(xs)
    return T._np.stack(xs)


def _heads_first(x: Any) -> Any:
    """[layers, tokens, kv_heads, D] (GET's layout) -> [layers, kv_heads, tokens, D]."""
    return x.permute(0, 2, 1, 3) if _is_torch(x) else x.transpose(0, 2, 1, 3)


def _tokens_first(x: Any) -> Any:
    """[kv_heads, tokens, D] (a cache row) -> [tokens, kv_heads, D] (PUT's layout)."""
    return x.permute(1, 0, 2) if _is_torch(x) else x.transpose(1, 0, 2)


def _host(x: Any) -> Any:
    """x on the host (a torch tensor copied once from its GPU; numpy and None as they are)."""
    if x is not None and _is_torch(x) and x.device.type != "cpu":
        return x.to("cpu")
    return x


def _cast(x: Any, like: Any) -> Any:
    if _is_torch(like):
        return x.to(dtype=like.dtype, device=like.device)
    return x.astype(like.dtype, copy=False)
