"""Hugging Face transformers on dquantd: a Cache whose KV lives in the daemon's shared KV tier, and
the attention function "dquant" that runs decode attention on the daemon's containers.

    import dquant, dquant.transformers as dqt
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=dqt.ATTENTION)
    with dquant.Client("unix:/tmp/dquantd.sock") as client:
        cache = dqt.DquantCache(client, model, mode="attend")
        ids, mask = cache.prepare(prompts)        # token id lists; LOOKUP, left padded batch
        out = model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=64)

prepare() looks every prompt's chunks up in the tier: held chunks are fetched decompressed and the
model runs only on the rest of the prompt. When the prefill has run, the prompts' KV goes to the
tier (new chunks deduped, then each prompt's sequence on its chunks). Decoding then runs in one
of two modes:
- "attend": each step's attention is computed by dquantd on the containers (ATTEND with the new
  token appended; on the GPU where the daemon has one), the model's attention only for prefill;
- "fetch": the prompts are decompressed once after prefill and decoding attends locally with the
  model's own kernel (SDPA).
A decode engine of a disaggregated deployment continues sequences another process stored:
`ids, mask = cache.attach(seq_keys, prompts, first_tokens)` then model.generate as above.

Errors of the daemon raise dquant.ClientError out of model.generate; nothing falls back silently.
The model must be loaded with attn_implementation="dquant" (ATTENTION) for "attend" mode; "fetch"
mode works with any attention implementation. Importing this module registers "dquant" with
transformers' attention and mask interfaces."""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, List, Optional, Sequence, Tuple

import torch
from transformers import DynamicCache
try:
    from transformers import AttentionInterface
except ImportError:  # older 4.x releases export it from modeling_utils only
    from transformers.modeling_utils import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from .client import Client
from .kvtier import ModelShape, TierBatch

__all__ = ["ATTENTION", "DquantCache", "dquant_attention", "model_shape"]

#: The attn_implementation name to load a model with.
ATTENTION = "dquant"

# The cache whose update() ran last on this thread: the attention call that follows an update in
# the same layer forward reads the new token's K/V from it.
_active = threading.local()


def model_shape(model: Any, name: Optional[str] = None) -> ModelShape:
    """A transformers model's attention shape and its name for the daemon (name, else the
    basename of its config's _name_or_path)."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    name = name or os.path.basename(str(getattr(cfg, "_name_or_path", "") or "").rstrip("/")) or cfg.model_type
    return ModelShape(name=name, layers=cfg.num_hidden_layers, q_heads=heads,
                      kv_heads=getattr(cfg, "num_key_value_heads", None) or heads, head_dim=head_dim)


class DquantCache(DynamicCache):
    """A transformers Cache for one batch of prompts backed by dquantd (see the module's text).
    client: a dquant.Client (this thread's); model: the transformers model; mode: "attend" or
    "fetch"; ns, profile, chunk_tokens, lease_ms, name: as dquant.kvtier.TierBatch and
    model_shape. One cache per batch, as with DynamicCache."""

    def __init__(self, client: Client, model: Any, mode: str = "attend", ns: Optional[str] = None,
                 profile: Any = "dq226", chunk_tokens: Optional[int] = None, lease_ms: int = 30000,
                 name: Optional[str] = None) -> None:
        impl = getattr(model.config, "_attn_implementation", None)
        if mode == "attend" and impl != ATTENTION:
            raise ValueError(f"DquantCache: attend mode needs the model loaded with attn_implementation="
                             f"{ATTENTION!r} (dquant.transformers.ATTENTION), not {impl!r}")
        super().__init__()
        self.shape = model_shape(model, name)
        self.tier = TierBatch(client, self.shape, mode=mode, ns=ns, profile=profile, chunk_tokens=chunk_tokens,
                              lease_ms=lease_ms)
        self.mode = mode
        self._device = next(model.parameters()).device
        self._dtype = next(model.parameters()).dtype
        self._length = 0      # padded positions the cache covers (what get_seq_length reports)
        self._pending: dict = {}

    @property
    def like(self) -> torch.Tensor:
        return torch.empty(0, dtype=self._dtype, device=self._device)

    # ---- the batch ----

    def prepare(self, prompts: Sequence[Sequence[int]], seq_keys: Optional[Sequence[str]] = None,
                pad_id: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
        """LOOKUP of the prompts (token id lists); the held prefix is loaded so that generate runs
        the model on the rest only. Returns (input_ids, attention_mask), left padded, on the
        model's device: pass both and this cache to model.generate (or the model's forward)."""
        ids, mask = self.tier.prepare(prompts, seq_keys=seq_keys, pad_id=pad_id)
        pre = self.tier.prefix_kv(self.like)
        if pre is not None:
            self._load(pre)
        self._length = self.tier.skip
        return self._tensors(ids, mask)

    def attach(self, seq_keys: Sequence[str], prompts: Sequence[Sequence[int]],
               next_tokens: Optional[Sequence[int]] = None, pad_id: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
        """Continues sequences another process stored (its DquantCache.seq_keys, for the same
        prompts): nothing is recomputed. next_tokens: each row's next token (the prefill engine's
        first generated token), appended as the last column. Returns (input_ids, attention_mask)
        for model.generate, which then runs from the next tokens on."""
        ids, mask = self.tier.attach(seq_keys, prompts, pad_id=pad_id)
        if self.mode == "fetch":
            self._load(self.tier.fetch(self.like))
        self._length = self.tier.padded
        if next_tokens is not None:
            if len(next_tokens) != len(ids):
                raise ValueError(f"attach: {len(next_tokens)} next tokens for {len(ids)} prompts")
            ids = [row + [int(t)] for row, t in zip(ids, next_tokens)]
            mask = [row + [1] for row in mask]
        return self._tensors(ids, mask)

    @property
    def seq_keys(self) -> List[str]:
        """The batch's sequence keys in the daemon, one per row (for attach() elsewhere)."""
        return [r.seq for r in self.tier.rows]

    @property
    def skipped_tokens(self) -> int:
        """Prompt tokens the model did not run because the tier held their KV (pads excluded)."""
        return sum(max(0, self.tier.skip - r.pad) for r in self.tier.rows)

    def delete(self) -> None:
        """Deletes the batch's sequences from the daemon (shared chunks stay)."""
        self.tier.delete()

    def _tensors(self, ids: List[List[int]], mask: List[List[int]]) -> Tuple[torch.Tensor, torch.Tensor]:
        return (torch.tensor(ids, dtype=torch.long, device=self._device),
                torch.tensor(mask, dtype=torch.long, device=self._device))

    def _load(self, kv: Sequence[Tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Replaces the local layers by kv (per layer [batch, kv_heads, tokens, head_dim])."""
        self.layers = []
        for i, (k, v) in enumerate(kv):
            DynamicCache.update(self, k.contiguous(), v.contiguous(), i)

    # ---- transformers' Cache interface ----

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               cache_kwargs: Optional[dict] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        if not self.tier.rows:
            raise RuntimeError("DquantCache: call prepare(prompts) or attach(...) before running the model")
        _active.cache = weakref.ref(self)
        last = layer_idx == self.shape.layers - 1
        if not self.tier.stored:                      # prefill: local attention over prefix + prompt
            k, v = DynamicCache.update(self, key_states, value_states, layer_idx, cache_kwargs)
            if last:
                self._length += key_states.shape[-2]
                if self._length != self.tier.padded:
                    raise RuntimeError(f"DquantCache: the prefill covered {self._length} positions of a "
                                       f"{self.tier.padded}-position batch (run the whole prompt at once)")
                self.tier.store([(layer.keys, layer.values) for layer in self.layers])
                if self.mode == "fetch":
                    self._load(self.tier.fetch(self.like))
                else:
                    self.layers = []                  # the daemon holds the KV now
            return k, v
        if self.mode == "fetch":
            k, v = DynamicCache.update(self, key_states, value_states, layer_idx, cache_kwargs)
            if last:
                self._length += key_states.shape[-2]
            return k, v
        if layer_idx in self._pending:
            raise RuntimeError(f"DquantCache: layer {layer_idx}'s previous token never reached the daemon (its "
                               f"attention did not run through the {ATTENTION!r} implementation)")
        self._pending[layer_idx] = (key_states, value_states)
        if last:
            self._length += key_states.shape[-2]
        return key_states, value_states

    def attending(self, layer_idx: int) -> bool:
        """Whether the attention of layer_idx's current step is the daemon's (attend mode, after
        prefill, its new K/V handed over by update())."""
        return self.mode == "attend" and self.tier.stored and layer_idx in self._pending

    def attend(self, layer_idx: int, query: torch.Tensor, scaling: Optional[float]) -> torch.Tensor:
        k, v = self._pending.pop(layer_idx)
        out, _ = self.tier.attend(layer_idx, query, k, v, scale=float(scaling or 0.0))
        return out

    def get_seq_length(self, layer_idx: Optional[int] = 0) -> int:
        return self._length

    def get_mask_sizes(self, *args: Any, **kwargs: Any) -> Tuple[int, int]:
        # (kv_length, kv_offset) of the mask transformers builds. Decoding in attend mode keeps no
        # local layers: the mask spans the positions the daemon holds (ATTEND needs none).
        if self.mode == "attend" and self.tier.stored:
            q = args[0] if args else next(iter(kwargs.values()))
            return self._length + (q.shape[0] if hasattr(q, "shape") else int(q)), 0
        return super().get_mask_sizes(*args, **kwargs)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("DquantCache: beam search is not supported (the daemon's sequences are per row)")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("DquantCache: batch selection is not supported")

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("DquantCache: the daemon's sequences are append-only")


def dquant_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: Optional[torch.Tensor], scaling: Optional[float] = None, dropout: float = 0.0,
                     **kwargs: Any) -> Tuple[torch.Tensor, None]:
    """The "dquant" attention implementation: a decode step of a DquantCache in attend mode is
    ATTEND on the daemon (the new token appended there); everything else (prefill, fetch mode,
    other caches) is transformers' SDPA. Returns (out [batch, q_len, q_heads, head_dim], None)."""
    ref = getattr(_active, "cache", None)
    cache = ref() if ref is not None else None
    layer_idx = getattr(module, "layer_idx", None)
    if cache is not None and layer_idx is not None and cache.attending(layer_idx):
        return cache.attend(layer_idx, query, scaling), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                  **kwargs)


def _register() -> None:
    AttentionInterface.register(ATTENTION, dquant_attention)
    # Masks are built per attention implementation under the same name: "dquant" takes SDPA's (an
    # unregistered name would build no causal mask for prefill).
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


_register()
