"""The KVQuant++ codec family of libdquant (dquant/kvq.h), over ctypes: profiles by name, per-layer
calibration, and local encode/decode/attention through the calibrated codec's per-layer views.

    from dquant import kvq
    p = kvq.profile("pq16x8", kv_heads=8, head_dim=128)        # needs a calibration
    p, calib = kvq.calibrate(p, k, v)                          # k, v [layers, tokens, kv_heads, head_dim]
    with kvq.codec(p, calib) as c:
        records, means = c.view(3).encode(k[3, :256], "k")    # layer 3's codebooks
    client.register_model("m", layers, q_heads, 8, 128, profile=p, calibration=calib)

Profile names (dq_profile_kvq): "lmB" (Lloyd–Max on the Beta marginal, Hadamard), "lmhB" (Haar
rotation), "ipB" (keys: Lloyd–Max at B−1 bits + 1-bit QJL), "olB" (outlier channels; needs a
calibration), "pqMxB" (product quantization; needs a calibration), suffixes "+lrR" (low-rank
correction) and "+dN" (delta coding within windows). A calibrated profile and its calibration go
together: the daemon checks one against the other (REGISTER_MODEL) and uses calibration layer L
for every sequence's layer L."""

from __future__ import annotations

import ctypes
from typing import Optional, Tuple

from . import _tensor as T
from ._tensor import Array
from .codec import Codec, Profile, _check, _kvq_fn, dq_profile

__all__ = ["profile", "needs_calibration", "calibrate", "check_calibration", "codec"]


def profile(name: str, kv_heads: int, head_dim: int) -> Profile:
    """A KVQ profile by name for a shape (dq_profile_kvq). DquantError PROFILE for an unknown name or
    a parameter out of range ("pq0x8", "lm9", "ip1"). A profile that needs a calibration comes with
    its calibration hash 0: calibrate() fills it."""
    p = dq_profile()
    _check(_kvq_fn("dq_profile_kvq")(name.encode(), kv_heads, head_dim, ctypes.byref(p)), name)
    return Profile(p)


def needs_calibration(p: Profile) -> bool:
    """Whether a codec of p needs a calibration (outlier channels, product quantization)."""
    return bool(_kvq_fn("dq_profile_needs_calibration")(ctypes.byref(p._p)))


def calibrate(p: Profile, k: Array, v: Array, seed: int = 0) -> Tuple[Profile, bytes]:
    """Per-layer calibration from sample keys and values (dq_kvq_calibrate): k and v
    [layers, tokens, kv_heads, head_dim] (a few sequences concatenated along tokens; converted to
    float32). Returns (the calibrated profile: p with the calibration's layer count and hash, the
    serialized calibration). DquantError INVALID_ARGUMENT for too few tokens, NONFINITE for
    NaN/Inf; ValueError for a wrong shape."""
    kin = T.Input(k, want=T.F32)
    vin = T.Input(v, want=T.F32)
    if len(kin.shape) != 4 or kin.shape[2:] != (p.kv_heads, p.head_dim):
        raise ValueError(f"calibrate: k {kin.shape}, expected [layers, tokens, {p.kv_heads}, {p.head_dim}]")
    if vin.shape != kin.shape:
        raise ValueError(f"calibrate: v {vin.shape} differs from k {kin.shape}")
    out = dq_profile()
    ctypes.memmove(ctypes.byref(out), ctypes.byref(p._p), ctypes.sizeof(out))
    buf = ctypes.POINTER(ctypes.c_uint8)()
    n = ctypes.c_size_t()
    _check(_kvq_fn("dq_kvq_calibrate")(ctypes.byref(out), kin.shape[0], kin.c_void_p(), vin.c_void_p(), kin.shape[1],
                                       seed, ctypes.byref(buf), ctypes.byref(n)), "calibrate")
    try:
        data = ctypes.string_at(buf, n.value)
    finally:
        _kvq_fn("dq_kvq_free")(ctypes.cast(buf, ctypes.c_void_p))
    return Profile(out), data


def check_calibration(p: Profile, calibration: bytes) -> int:
    """Checks a serialized calibration against a profile (shape, layer count, hash, checksum):
    returns its layer count; DquantError CORRUPT, TRUNCATED or PROFILE when they do not go
    together."""
    data = bytes(calibration)
    buf = (ctypes.c_uint8 * max(1, len(data))).from_buffer_copy(data or b"\0")
    layers = ctypes.c_uint32()
    _check(_kvq_fn("dq_kvq_calibration_check")(ctypes.byref(p._p), buf, len(data), ctypes.byref(layers)),
           "check_calibration")
    return int(layers.value)


def codec(p: Profile, calibration: Optional[bytes] = None) -> Codec:
    """A codec of p with its calibration (dq_codec_create_calibrated; None for a profile without
    one): Codec.view(layer) is layer `layer`'s codec, whose encode/decode/layer()/attend give what
    dquantd gives for that layer of a model registered with (p, calibration)."""
    return Codec(p, calibration=calibration)
