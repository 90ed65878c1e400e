"""Codecs by the names `dquant eval` takes, for quality evaluations in Python (needs numpy).

    c = evalcodecs.get("fixed226", kv_heads=2, head_dim=128)
    khat = c.roundtrip(k, "k")          # k: [tokens, kv_heads, head_dim]; every token encoded
    c.bits_per_value()                  # stored (library codecs) or charged (fixed-width) bits

Names: any library profile ("dq226", "dq196", "bf16", "intB", "quarotB", "kiviB", "turboB"),
"dq226@BITS" (Profile.matched), and "fixed226" / "fixed196" / "fixed226@BITS": fixed-width coding
at the storage of that D-Quant profile (seed Appendix B) — the same rotation and INT8 key window
mean as D-Quant, a per-token min–max grid of M = floor(2^(8·C/n)) levels, nearest rounding, a
least-squares refit of (s, o), fp16 s and o, nearest rounding again on the fp16 grid; charged
log2(M) bits per symbol plus the same metadata. It produces reconstructions only (eval-only, like
client/eval/fixedwidth.c, which it follows operation for operation)."""

import math

import numpy as np

from .codec import KIND_K, Codec, Profile, _kind


def _profile_for(name, kv_heads, head_dim):
    if "@" in name:
        base, bits = name.split("@", 1)
        return Profile.matched(base, kv_heads, head_dim, float(bits), name=name)
    return Profile.builtin(name, kv_heads, head_dim)


class LibraryCodec:
    """A libdquant profile, stored as the library stores it."""

    def __init__(self, name, kv_heads, head_dim):
        self.name = name
        self.profile = _profile_for(name, kv_heads, head_dim)
        self._codec = Codec(self.profile)

    def bits_per_value(self, kind=None):
        return self.profile.bits_per_value(kind)

    def roundtrip(self, x, kind):
        return self._codec.roundtrip(x, kind)[0]


def _half(x):
    return np.float32(np.float16(x))


class FixedWidth:
    """Fixed-width min–max coding at the storage of a D-Quant profile (eval only)."""

    def __init__(self, name, kv_heads, head_dim):
        self.name = name
        self.profile = _profile_for("dq" + name[len("fixed"):], kv_heads, head_dim)
        if self.profile.codec_type != "dquant":
            raise ValueError(f"{name}: fixed-width is matched to a D-Quant profile")
        self._codec = Codec(self.profile)
        self.n = kv_heads * head_dim
        self.levels_ = tuple(self._levels(k) for k in (0, 1))
        if min(self.levels_) < 2:
            raise ValueError(f"{name}: fewer than 2 fixed-width levels")

    def _levels(self, kind):
        rate = 8.0 * self.profile.container_bytes[kind] / self.n
        return 256 if rate >= 8 else int(math.floor(2.0 ** rate))

    def bits_per_value(self, kind=None):
        if kind is None:
            return 0.5 * (self.bits_per_value(0) + self.bits_per_value(1))
        kind = _kind(kind)
        bits = math.log2(self.levels_[kind]) + 32.0 / self.n
        if kind == KIND_K:
            bits += 8.0 * (2.0 + self.n) / (self.n * self.profile.window)
        return bits

    def window_mean(self, y):
        """The dequantized INT8 mean of rotated tokens y ([cnt, n] float32), computed in float32 in
        the same order as libdquant (tokens summed one after another), and the mean block bytes."""
        acc = np.zeros(y.shape[1], dtype=np.float32)
        for t in range(y.shape[0]):
            acc += y[t]
        m = acc / np.float32(y.shape[0])
        sh = np.float16(np.abs(m).max() / np.float32(127.0))
        sf = np.float32(sh)
        q = np.clip(np.rint(m / sf), -127, 127) if sf > 0 else np.zeros_like(m)
        block = sh.tobytes() + q.astype(np.int8).tobytes()
        return q.astype(np.float32) * sf, block

    def _code(self, y, M):
        """Rows of y ([tokens, n]) on M levels each; returns the reconstructions."""
        top = M - 1
        lo, hi = y.min(axis=1, keepdims=True).astype(np.float64), y.max(axis=1, keepdims=True).astype(np.float64)
        yd = y.astype(np.float64)
        s = (hi - lo) / top
        with np.errstate(divide="ignore", invalid="ignore"):
            m = np.where(s > 0, np.clip(np.rint((yd - lo) / s), 0, top), 0.0)
        n = y.shape[1]
        sm, sy = m.sum(axis=1, keepdims=True), yd.sum(axis=1, keepdims=True)
        smm, smy = (m * m).sum(axis=1, keepdims=True), (m * yd).sum(axis=1, keepdims=True)
        var = smm - sm * sm / n
        with np.errstate(divide="ignore", invalid="ignore"):
            s2 = np.where(var > 0, (smy - sm * sy / n) / var, 0.0)
        o2 = np.where(var > 0, (sy - s2 * sm) / n, sy / n)
        sh, oh = _half(s2), _half(o2)
        with np.errstate(divide="ignore", invalid="ignore"):
            m = np.where(sh > 0, np.clip(np.rint((yd - oh.astype(np.float64)) / sh.astype(np.float64)), 0, top), 0.0)
        return (oh + sh * m.astype(np.float32)).astype(np.float32)

    def roundtrip(self, x, kind):
        kind = _kind(kind)
        torch_in = type(x).__module__.startswith("torch")
        xa = x.detach().float().cpu().numpy() if torch_in else np.asarray(x, dtype=np.float32)
        shape = xa.shape
        if len(shape) != 3 or shape[1] * shape[2] != self.n:
            raise ValueError(f"{self.name}: shape {shape}, expected [tokens, {self.profile.kv_heads}, "
                             f"{self.profile.head_dim}]")
        y = self._codec.rotate(xa).reshape(shape[0], self.n)
        out = np.empty_like(y)
        W = self.profile.window
        for first in range(0, shape[0], W):
            yw = y[first:first + W]
            mu = self.window_mean(yw)[0] if kind == KIND_K else np.zeros(self.n, np.float32)
            out[first:first + W] = self._code(yw - mu, self.levels_[kind]) + mu
        xh = self._codec.rotate(out.reshape(shape), inverse=True)
        if torch_in:
            import torch
            return torch.from_numpy(xh).to(device=x.device, dtype=x.dtype)
        return xh


def get(name, kv_heads, head_dim):
    """A codec by `dquant eval` name for kv_heads × head_dim (see the module doc)."""
    if name.startswith("fixed"):
        return FixedWidth(name, kv_heads, head_dim)
    return LibraryCodec(name, kv_heads, head_dim)
