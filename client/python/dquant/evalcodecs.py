"""Codecs by the names `dquant eval` takes, for quality evaluations in Python (needs numpy).

    c = evalcodecs.get("fixed226", kv_heads=2, head_dim=128)
    khat = c.roundtrip(k, "k")          # k: [tokens, kv_heads, head_dim]; every token encoded
    c.bits_per_value()                  # stored bits, every byte counted

Names: any library profile ("dq226", "dq196", "bf16", "intB", "quarotB", "kiviB", "turboB",
"fixedkAvB"), "dq226@BITS" (Profile.matched), and "fixed226" / "fixed196" / "fixed226@BITS": the
library's fixed-width profile at the storage of that D-Quant profile (Profile.fixed,
dq_profile_fixed_matched; seed Appendix B) — the same rotation and INT8 key window mean as D-Quant,
a per-token min–max grid of M = floor(2^(8·C/n)) levels, nearest rounding, a least-squares refit of
(s, o), fp16 s and o, nearest rounding again on the fp16 grid, base-M packed containers."""

from .codec import Codec, Profile


def _profile_for(name, kv_heads, head_dim):
    if name.startswith("fixed") and not name.startswith("fixedk"):
        return _profile_for("dq" + name[len("fixed"):], kv_heads, head_dim).fixed(name)
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


def get(name, kv_heads, head_dim):
    """A codec by `dquant eval` name for kv_heads × head_dim (see the module doc)."""
    return LibraryCodec(name, kv_heads, head_dim)
