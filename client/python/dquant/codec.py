"""ctypes binding of libdquant: profiles, codecs, layers and decode attention.

Arrays are numpy arrays or torch tensors shaped [tokens, kv_heads, head_dim] (keys or values of
one layer); queries are [q_heads, head_dim]. Results come back in the input's flavour. A Codec
holds one workspace: use one Codec per thread (profiles are plain data and may be shared).
Failures raise DquantError (.code, .name, message)."""

from __future__ import annotations

import ctypes
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _lib
from . import _tensor as T
from ._errors import DquantError
from ._tensor import Array, DType

__all__ = ["KIND_K", "KIND_V", "Profile", "Codec", "Layer", "DquantError", "builtin_names", "baseline_names",
           "roundtrip", "library"]

#: A kind of stream: KIND_K / "k" (keys) or KIND_V / "v" (values).
Kind = Union[int, str]

DQ_MAX_LEVELS = 32
DQ_PROFILE_NAME_MAX = 32
DQ_PROFILE_SERIALIZED_MAX = 512

KIND_K, KIND_V = 0, 1
CODEC_TYPES = {0: "dquant", 1: "bf16", 2: "int", 3: "kivi", 4: "turbo", 5: "kvq", 6: "fixed"}


class dq_profile(ctypes.Structure):
    _fields_ = [
        ("format_version", ctypes.c_uint32),
        ("name", ctypes.c_char * DQ_PROFILE_NAME_MAX),
        ("kv_heads", ctypes.c_uint32),
        ("head_dim", ctypes.c_uint32),
        ("container_bytes", ctypes.c_uint32 * 2),
        ("levels", ctypes.c_uint32 * 2),
        ("alpha", ctypes.c_float),
        ("window", ctypes.c_uint32),
        ("residual", ctypes.c_uint32),
        ("rotation_seed", ctypes.c_uint64),
        ("freq", (ctypes.c_uint16 * DQ_MAX_LEVELS) * 2),
        ("codec_type", ctypes.c_uint32),
        ("bits", ctypes.c_uint32 * 2),
        ("group", ctypes.c_uint32),
        ("rotate", ctypes.c_uint32),
        ("kvq_variant", ctypes.c_uint32),
        ("kvq_rotation", ctypes.c_uint32),
        ("kvq_outliers", ctypes.c_uint32),
        ("kvq_pq_m", ctypes.c_uint32),
        ("kvq_rank", ctypes.c_uint32),
        ("kvq_anchor", ctypes.c_uint32),
        ("kvq_tau", ctypes.c_float),
        ("kvq_layers", ctypes.c_uint32),
        ("kvq_calib_hash", ctypes.c_uint64),
    ]


class dq_profile_params(ctypes.Structure):
    _fields_ = [
        ("kv_heads", ctypes.c_uint32), ("head_dim", ctypes.c_uint32),
        ("container_bytes", ctypes.c_uint32 * 2), ("levels", ctypes.c_uint32 * 2),
        ("alpha", ctypes.c_float), ("window", ctypes.c_uint32), ("residual", ctypes.c_uint32),
        ("rotation_seed", ctypes.c_uint64), ("name", ctypes.c_char_p),
        ("format_version", ctypes.c_uint32),
    ]


class dq_encode_stats(ctypes.Structure):
    _fields_ = [
        ("streams", ctypes.c_uint64), ("retries", ctypes.c_uint64), ("fallbacks", ctypes.c_uint64),
        ("max_payload_bytes", ctypes.c_uint32), ("payload_bytes", ctypes.c_uint64),
        ("symbols_moved", ctypes.c_uint64), ("max_move", ctypes.c_uint32),
    ]


class dq_attn_item(ctypes.Structure):
    _fields_ = [("layer", ctypes.c_void_p), ("q", ctypes.c_void_p), ("out", ctypes.c_void_p),
                ("lse", ctypes.c_void_p)]


_L = None


def library() -> ctypes.CDLL:
    """The loaded libdquant (ctypes.CDLL) with its prototypes declared."""
    global _L
    if _L is not None:
        return _L
    lib = _lib.load("dquant", "lib")
    P, VP, U32, SZ, I = ctypes.POINTER, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_int
    protos = {
        "dq_strerror": (ctypes.c_char_p, [I]),
        "dq_err_name": (ctypes.c_char_p, [I]),
        "dq_profile_params_default": (None, [P(dq_profile_params)]),
        "dq_profile_make": (I, [P(dq_profile_params), P(dq_profile)]),
        "dq_profile_builtin": (I, [ctypes.c_char_p, U32, U32, P(dq_profile)]),
        "dq_profile_builtin_names": (P(ctypes.c_char_p), []),
        "dq_profile_fixed_matched": (I, [P(dq_profile), ctypes.c_char_p, P(dq_profile)]),
        "dq_profile_baseline_names": (P(ctypes.c_char_p), []),
        "dq_profile_validate": (I, [P(dq_profile)]),
        "dq_profile_bits_per_value": (ctypes.c_double, [P(dq_profile), I]),
        "dq_profile_bits_per_value_mean": (ctypes.c_double, [P(dq_profile)]),
        "dq_profile_serialize": (I, [P(dq_profile), P(ctypes.c_uint8), SZ, P(SZ)]),
        "dq_profile_deserialize": (I, [P(ctypes.c_uint8), SZ, P(dq_profile)]),
        "dq_codec_create": (I, [P(dq_profile), VP, P(VP)]),
        "dq_codec_free": (None, [VP]),
        "dq_codec_stream_len": (U32, [VP]),
        "dq_codec_record_bytes": (SZ, [VP, I]),
        "dq_codec_mean_bytes": (SZ, [VP]),
        "dq_codec_window_bytes": (SZ, [VP]),
        "dq_workspace_create": (I, [VP, P(VP)]),
        "dq_workspace_free": (None, [VP]),
        "dq_rotate": (None, [VP, VP]),
        "dq_unrotate": (None, [VP, VP]),
        "dq_tokens_encode": (I, [VP, VP, I, VP, I, SZ, VP, VP, SZ, P(dq_encode_stats)]),
        "dq_tokens_decode": (I, [VP, VP, I, VP, VP, SZ, SZ, VP, I]),
        "dq_window_encode": (I, [VP, VP, VP, VP, I, VP, P(dq_encode_stats)]),
        "dq_window_check": (I, [VP, VP]),
        "dq_layer_create": (I, [VP, P(VP)]),
        "dq_layer_free": (None, [VP]),
        "dq_layer_append": (I, [VP, VP, VP, VP, I, SZ, P(dq_encode_stats)]),
        "dq_layer_tokens": (SZ, [VP]),
        "dq_layer_sealed_tokens": (SZ, [VP]),
        "dq_layer_tail_tokens": (SZ, [VP]),
        "dq_layer_stored_bytes": (SZ, [VP]),
        "dq_layer_decode": (I, [VP, VP, I, SZ, SZ, VP, I]),
        "dq_layer_window_count": (SZ, [VP]),
        "dq_layer_window": (VP, [VP, SZ]),
        "dq_layer_tail": (VP, [VP, I]),
        "dq_layer_restore": (I, [VP, VP, SZ, VP, VP, SZ, P(VP)]),
        "dq_attend": (I, [VP, VP, U32, ctypes.c_float, P(dq_attn_item), SZ]),
        "dq_attend_reference": (I, [VP, VP, U32, ctypes.c_float, P(dq_attn_item), SZ]),
    }
    for name, (res, args) in protos.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    _L = lib
    return lib


_KVQ_PROTOS = None


def _kvq_fn(name: str):
    """A function of libdquant's KVQuant++ family (dquant/kvq.h), prototypes declared on first use;
    UnsupportedError from a libdquant without it."""
    global _KVQ_PROTOS
    lib = library()
    if _KVQ_PROTOS is None:
        P, VP, U32, SZ, I = ctypes.POINTER, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_int
        _KVQ_PROTOS = {
            "dq_profile_kvq": (I, [ctypes.c_char_p, U32, U32, P(dq_profile)]),
            "dq_profile_needs_calibration": (I, [P(dq_profile)]),
            "dq_kvq_calibrate": (I, [P(dq_profile), U32, VP, VP, SZ, ctypes.c_uint64, P(P(ctypes.c_uint8)), P(SZ)]),
            "dq_kvq_free": (None, [VP]),
            "dq_kvq_calibration_check": (I, [P(dq_profile), P(ctypes.c_uint8), SZ, P(U32)]),
            "dq_codec_create_calibrated": (I, [P(dq_profile), P(ctypes.c_uint8), SZ, VP, P(VP)]),
            "dq_codec_layer": (VP, [VP, U32]),
        }
    if name not in _KVQ_PROTOS:
        raise KeyError(name)
    fn = getattr(lib, name, None)
    if fn is None:
        from ._errors import UnsupportedError
        raise UnsupportedError(name, "this libdquant has no KVQuant++ codecs (dquant/kvq.h)")
    fn.restype, fn.argtypes = _KVQ_PROTOS[name]
    return fn


def _check(rc: int, what: str = "") -> None:
    if rc != 0:
        lib = library()
        raise DquantError(rc, what, lib.dq_strerror(rc).decode(), lib.dq_err_name(rc).decode())


def _kind(kind: Kind) -> int:
    if kind in (KIND_K, "k", "K", "keys", "key"):
        return KIND_K
    if kind in (KIND_V, "v", "V", "values", "value"):
        return KIND_V
    raise ValueError(f"kind must be 'k' or 'v', not {kind!r}")


def _names(ptr):
    out, i = [], 0
    while ptr[i]:
        out.append(ptr[i].decode())
        i += 1
    return out


def builtin_names() -> List[str]:
    """Names of the built-in D-Quant profiles ("dq226", "dq196")."""
    return _names(library().dq_profile_builtin_names())


def baseline_names() -> List[str]:
    """The 2-bit baselines compared in the seed, and "bf16"."""
    return _names(library().dq_profile_baseline_names())


class Profile:
    """A codec profile (plain data; copy freely)."""

    def __init__(self, raw):
        self._p = raw

    @classmethod
    def builtin(cls, name: str, kv_heads: int, head_dim: int) -> "Profile":
        """"dq226", "dq196", a baseline ("bf16", "int2", "quarot2", "kivi2", "turbo2", any B in 1..8),
        or a fixed-width profile ("fixed226", "fixed196", "fixedkAvB")."""
        p = dq_profile()
        _check(library().dq_profile_builtin(name.encode(), kv_heads, head_dim, ctypes.byref(p)), name)
        return cls(p)

    @classmethod
    def make(cls, kv_heads: int, head_dim: int, container_bytes: Tuple[int, int] = (331, 231),
             levels: Tuple[int, int] = (8, 6), alpha: float = 1.4, window: int = 128, residual: Optional[int] = None,
             rotation_seed: int = 0x5eed, name: str = "custom", format_version: int = 1) -> "Profile":
        """A custom D-Quant profile: any containers (bytes), levels (2..32) and sharpening alpha;
        format_version 2: joint two-symbol rANS containers (as "dq226p")."""
        lib = library()
        pp = dq_profile_params()
        lib.dq_profile_params_default(ctypes.byref(pp))
        pp.kv_heads, pp.head_dim = kv_heads, head_dim
        pp.container_bytes[0], pp.container_bytes[1] = container_bytes
        pp.levels[0], pp.levels[1] = levels
        pp.alpha, pp.window = alpha, window
        pp.residual = window if residual is None else residual
        pp.rotation_seed = rotation_seed
        pp.format_version = format_version
        name_b = name.encode()
        pp.name = name_b
        p = dq_profile()
        _check(lib.dq_profile_make(ctypes.byref(pp), ctypes.byref(p)), name)
        return cls(p)

    @classmethod
    def scaled(cls, base: str, kv_heads: int, head_dim: int, scale: float = 1.0,
               name: Optional[str] = None) -> "Profile":
        """A built-in D-Quant profile's levels, alpha and K/V payload rates, both containers scaled:
        C = round((rate · scale · n + 32) / 8) with rate = (8·C_1024 − 32) / 1024 (scale 1: the
        built-in itself)."""
        ref = cls.builtin(base, 8, 128)
        if ref.codec_type != "dquant":
            raise ValueError(f"{base!r} is not a D-Quant profile")
        c = _scaled_containers(ref.container_bytes, kv_heads * head_dim, scale)
        return cls.make(kv_heads, head_dim, c, ref.levels, ref.alpha, ref.window, ref.residual, ref.rotation_seed,
                        name or f"{base}x{scale:g}", ref._p.format_version)

    @classmethod
    def matched(cls, base: str, kv_heads: int, head_dim: int, bits: float, name: Optional[str] = None) -> "Profile":
        """Profile.scaled at the largest scale whose stored mean bits/value is <= bits (what
        `dquant eval --codecs BASE@BITS` uses)."""
        ref = cls.builtin(base, 8, 128)
        n = kv_heads * head_dim
        lo, hi = 0.0, 16.0
        if _dq_bits(_scaled_containers(ref.container_bytes, n, 1e-9), n, ref.window) > bits:
            raise ValueError(f"{base}@{bits}: below the metadata alone")
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if _dq_bits(_scaled_containers(ref.container_bytes, n, mid), n, ref.window) <= bits:
                lo = mid
            else:
                hi = mid
        return cls.scaled(base, kv_heads, head_dim, lo, name or f"{base}@{bits:g}")

    def fixed(self, name: Optional[str] = None) -> "Profile":
        """The fixed-width profile at this D-Quant profile's storage (dq_profile_fixed_matched): per kind
        M = floor(2^(8·C/n)) levels, base-M packed containers, the same window and rotation."""
        p = dq_profile()
        label = name or "fixed"
        _check(library().dq_profile_fixed_matched(ctypes.byref(self._p), label.encode(), ctypes.byref(p)), label)
        return Profile(p)

    @classmethod
    def deserialize(cls, data: bytes) -> "Profile":
        """A profile from dq_profile_serialize's bytes (checked: version, checksum, validity)."""
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(bytes(data))
        p = dq_profile()
        _check(library().dq_profile_deserialize(buf, len(data), ctypes.byref(p)), "deserialize")
        return cls(p)

    def serialize(self) -> bytes:
        """The profile's wire form ("DQPF", fields little endian, FNV-1a checksum)."""
        buf = (ctypes.c_uint8 * DQ_PROFILE_SERIALIZED_MAX)()
        n = ctypes.c_size_t()
        _check(library().dq_profile_serialize(ctypes.byref(self._p), buf, len(buf), ctypes.byref(n)), "serialize")
        return bytes(buf[:n.value])

    def bits_per_value(self, kind: Optional[Kind] = None) -> float:
        """Stored bits per value, every byte counted; kind None: the mean of keys and values."""
        lib = library()
        if kind is None:
            return lib.dq_profile_bits_per_value_mean(ctypes.byref(self._p))
        return lib.dq_profile_bits_per_value(ctypes.byref(self._p), _kind(kind))

    name = property(lambda s: s._p.name.decode())
    kv_heads = property(lambda s: s._p.kv_heads)
    head_dim = property(lambda s: s._p.head_dim)
    stream_len = property(lambda s: s._p.kv_heads * s._p.head_dim)
    codec_type = property(lambda s: CODEC_TYPES.get(s._p.codec_type, "?"))
    container_bytes = property(lambda s: tuple(s._p.container_bytes))
    levels = property(lambda s: tuple(s._p.levels))
    alpha = property(lambda s: s._p.alpha)
    window = property(lambda s: s._p.window)
    residual = property(lambda s: s._p.residual)
    rotation_seed = property(lambda s: s._p.rotation_seed)

    @property
    def freq(self) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
        """The rANS frequency tables of keys and values (empty for the baselines)."""
        return tuple(tuple(self._p.freq[k][m] for m in range(self._p.levels[k])) if self._p.codec_type == 0 else ()
                     for k in range(2))

    def __repr__(self):
        return (f"Profile({self.name!r}, {self.codec_type}, {self.kv_heads}x{self.head_dim}, "
                f"C={self.container_bytes}, M={self.levels}, {self.bits_per_value():.4f} bits/value)")


def _scaled_containers(c1024, n, scale):
    """Container bytes keeping the n = 1024 payload rates of c1024, times scale (as libdquant
    instantiates its built-ins)."""
    return tuple(_lround(((8.0 * c - 32.0) / 1024.0 * scale * n + 32.0) / 8.0) for c in c1024)


def _lround(x):
    """C's lround: halves away from zero (Python's round() goes to even)."""
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


def _dq_bits(containers, n, window):
    """Stored mean bits/value of D-Quant containers (dquant/profile.h accounting)."""
    k = 8.0 * (4 + containers[0]) / n + 8.0 * (2.0 + n) / (n * window)
    v = 8.0 * (4 + containers[1]) / n
    return 0.5 * (k + v)


def _profile(profile: Union[str, Profile], kv_heads: Optional[int] = None, head_dim: Optional[int] = None) -> Profile:
    if isinstance(profile, Profile):
        return profile
    if kv_heads is None or head_dim is None:
        raise ValueError("a profile name needs kv_heads and head_dim")
    return Profile.builtin(profile, kv_heads, head_dim)


class Codec:
    """A codec for one profile, with one workspace (use from one thread at a time).

    A KVQuant++ profile with a calibration (dquant.kvq.calibrate) is made with it
    (calibration=bytes) and serves each model layer through view(layer): the layer's own
    codebooks, as dquantd encodes, decodes and attends layer L of a model registered with that
    calibration."""

    def __init__(self, profile: Union[str, Profile], kv_heads: Optional[int] = None,
                 head_dim: Optional[int] = None, calibration: Optional[bytes] = None) -> None:
        """profile: a Profile, or a built-in name with the shape (kv_heads, head_dim); calibration:
        the serialized KVQ calibration of a calibrated profile (dq_codec_create_calibrated)."""
        lib = library()
        self.profile = _profile(profile, kv_heads, head_dim)
        self._c, self._ws = ctypes.c_void_p(), ctypes.c_void_p()
        self._parent, self._views = None, {}
        self.calibration = bytes(calibration) if calibration else None
        if self.calibration:
            fn = _kvq_fn("dq_codec_create_calibrated")
            buf = (ctypes.c_uint8 * len(self.calibration)).from_buffer_copy(self.calibration)
            _check(fn(ctypes.byref(self.profile._p), buf, len(self.calibration), None, ctypes.byref(self._c)),
                   "codec_create_calibrated")
        else:
            _check(lib.dq_codec_create(ctypes.byref(self.profile._p), None, ctypes.byref(self._c)), "codec_create")
        self._v = self._c
        rc = lib.dq_workspace_create(self._c, ctypes.byref(self._ws))
        if rc:
            lib.dq_codec_free(self._c)
            self._c = self._v = None
            _check(rc, "workspace_create")
        self._layers = []

    def view(self, layer: int) -> "Codec":
        """The codec of model layer `layer` (dq_codec_layer): with a per-layer calibration, that
        layer's codebooks (IndexError outside the calibration's layers); else this codec itself.
        A view shares this codec's workspace and lives as long as it (use it from the same thread)."""
        if self._parent is not None:
            return self._parent.view(layer)
        if not self.calibration:
            return self  # one codec for every layer (dq_codec_layer answers the codec itself)
        if layer in self._views:
            return self._views[layer]
        if layer < 0:
            raise IndexError(f"view: layer {layer}")
        ptr = _kvq_fn("dq_codec_layer")(self._c, layer)
        if not ptr:
            raise IndexError(f"view: layer {layer} outside the codec's calibration")
        if ptr == self._c.value:
            self._views[layer] = self
            return self
        v = Codec.__new__(Codec)
        v.profile, v.calibration, v._parent, v._views, v._layers = self.profile, self.calibration, self, {}, []
        v._c, v._v, v._ws = None, ctypes.c_void_p(ptr), self._ws
        self._views[layer] = v
        return v

    def close(self) -> None:
        """Frees the codec and its workspace (again: nothing). Layers of it and of its views must be
        closed first; a view frees nothing (its codec does)."""
        if getattr(self, "_c", None):
            lib = library()
            self._views = {}
            lib.dq_workspace_free(self._ws)
            lib.dq_codec_free(self._c)
            self._c = self._v = self._ws = None

    __del__ = close

    def __enter__(self) -> "Codec":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def stream_len(self) -> int:
        return library().dq_codec_stream_len(self._v)

    @property
    def window_bytes(self) -> int:
        """Bytes of one window record: W tokens of keys and values (dquant/codec.h's layout), the
        unit PUT_RAW and GET_RAW carry."""
        return library().dq_codec_window_bytes(self._v)

    def encode_window(self, k: Array, v: Array) -> bytes:
        """One window record (window_bytes bytes) of W tokens: k and v [W, kv_heads, head_dim] of one
        dtype (dq_window_encode). A layer seals its windows from BF16-rounded tokens, so BF16 input
        gives the records a Layer (and the daemon's PUT) makes; f32 input is encoded as it is."""
        kin = T.Input(k)
        vin = T.Input(v, want=kin.dtype)
        self._shape_ok(kin.shape, "encode_window k")
        if vin.shape != kin.shape or kin.shape[0] != self.profile.window:
            raise ValueError(f"encode_window: k {kin.shape} and v {vin.shape} must both be "
                             f"[{self.profile.window}, {self.profile.kv_heads}, {self.profile.head_dim}]")
        out = ctypes.create_string_buffer(self.window_bytes)
        _check(library().dq_window_encode(self._v, self._ws, kin.c_void_p(), vin.c_void_p(), kin.dtype, out, None),
               "encode_window")
        return out.raw

    def check_window(self, record: bytes) -> None:
        """Checks one window record (window_bytes bytes) against the container's decode invariants,
        as dquantd does before storing PUT_RAW records (dq_window_check). Raises DquantError CORRUPT
        when it fails them (baseline codecs have no redundancy and always pass)."""
        if len(record) != self.window_bytes:
            raise ValueError(f"check_window: {len(record)} bytes, a window record is {self.window_bytes}")
        buf = ctypes.create_string_buffer(bytes(record), len(record))
        _check(library().dq_window_check(self._v, buf), "check_window")

    def _shape_ok(self, shape, what):
        p = self.profile
        if len(shape) != 3 or shape[1] != p.kv_heads or shape[2] != p.head_dim:
            raise ValueError(f"{what}: shape {shape}, expected [tokens, {p.kv_heads}, {p.head_dim}]")

    def roundtrip(self, x: Array, kind: Kind = "k", out_dtype: Optional[DType] = None) -> Tuple[Array, Dict[str, Any]]:
        """Encodes x ([tokens, kv_heads, head_dim]) as one layer's keys or values, window by window
        (W tokens, the last partial window with its own statistics, no BF16 tail), decodes it.
        Returns (reconstruction in x's flavour and dtype unless out_dtype, stats dict)."""
        lib = library()
        kind = _kind(kind)
        xin = T.Input(x)
        self._shape_ok(xin.shape, "roundtrip")
        ntok = xin.shape[0]
        n = self.stream_len
        W = self.profile.window
        rb = lib.dq_codec_record_bytes(self._v, kind)
        mb = lib.dq_codec_mean_bytes(self._v)
        header = kind == KIND_K and mb > 0
        nwin = (ntok + W - 1) // W
        records = ctypes.create_string_buffer(max(1, ntok * rb))
        means = ctypes.create_string_buffer(max(1, nwin * mb))
        odt = T.parse_dtype(out_dtype) if out_dtype is not None else xin.dtype
        out = T.Output(xin.shape, odt, xin)
        st = dq_encode_stats()
        esz, osz = T.DTYPE_SIZES[xin.dtype], T.DTYPE_SIZES[odt]
        base_r, base_m = ctypes.addressof(records), ctypes.addressof(means)
        for w in range(nwin):
            first = w * W
            cnt = min(W, ntok - first)
            mean = ctypes.c_void_p(base_m + w * mb) if header else None
            _check(lib.dq_tokens_encode(self._v, self._ws, kind, ctypes.c_void_p(xin.ptr + first * n * esz),
                                        xin.dtype, cnt, mean, ctypes.c_void_p(base_r + first * rb), rb,
                                        ctypes.byref(st)), "encode")
            _check(lib.dq_tokens_decode(self._v, self._ws, kind, mean, ctypes.c_void_p(base_r + first * rb), rb,
                                        cnt, ctypes.c_void_p(out.ptr + first * n * osz), odt), "decode")
        stored = ntok * rb + (nwin * mb if header else 0)
        stats = {"streams": st.streams, "retries": st.retries, "fallbacks": st.fallbacks,
                 "max_payload_bytes": st.max_payload_bytes, "symbols_moved": st.symbols_moved,
                 "max_move": st.max_move, "stored_bytes": stored,
                 "bits_per_value": 8.0 * stored / (ntok * n) if ntok else 0.0}
        return out.result(), stats

    def rotate(self, x: Array, inverse: bool = False) -> Array:
        """The codec's per-head rotation (y = H·D·x/sqrt(d), the profile's seed) of every token of x
        ([..., kv_heads, head_dim], numpy); a new float32 array. inverse: the un-rotation."""
        xin = T.Input(x, want=T.F32)
        n = self.stream_len
        out = T.Output(xin.shape, T.F32, xin)
        ctypes.memmove(out.ptr, xin.ptr, xin.nbytes)
        fn = library().dq_unrotate if inverse else library().dq_rotate
        for t in range(xin.nbytes // (4 * n)):
            fn(self._v, ctypes.c_void_p(out.ptr + t * n * 4))
        return out.result()

    def encode(self, x: Array, kind: Kind = "k") -> Tuple[bytes, bytes]:
        """Encodes x ([tokens, kv_heads, head_dim]) window by window as one layer's keys or values:
        returns (records: bytes, tokens × record_bytes; means: bytes, one window header per W tokens
        for keys when the codec has one, else b"")."""
        lib = library()
        kind = _kind(kind)
        xin = T.Input(x)
        self._shape_ok(xin.shape, "encode")
        ntok, n, W = xin.shape[0], self.stream_len, self.profile.window
        rb, mb = lib.dq_codec_record_bytes(self._v, kind), lib.dq_codec_mean_bytes(self._v)
        header = kind == KIND_K and mb > 0
        nwin = (ntok + W - 1) // W
        records = ctypes.create_string_buffer(max(1, ntok * rb))
        means = ctypes.create_string_buffer(max(1, nwin * mb))
        esz = T.DTYPE_SIZES[xin.dtype]
        for w in range(nwin):
            first, cnt = w * W, min(W, ntok - w * W)
            mean = ctypes.c_void_p(ctypes.addressof(means) + w * mb) if header else None
            _check(lib.dq_tokens_encode(self._v, self._ws, kind, ctypes.c_void_p(xin.ptr + first * n * esz),
                                        xin.dtype, cnt, mean, ctypes.c_void_p(ctypes.addressof(records) + first * rb),
                                        rb, None), "encode")
        return records.raw[:ntok * rb], (means.raw[:nwin * mb] if header else b"")

    def decode(self, records: bytes, means: bytes, kind: Kind = "k", dtype: DType = "f32",
               like: Optional[Array] = None) -> Array:
        """Inverse of encode: [tokens, kv_heads, head_dim] of dtype."""
        lib = library()
        kind = _kind(kind)
        rb, mb, W = lib.dq_codec_record_bytes(self._v, kind), lib.dq_codec_mean_bytes(self._v), self.profile.window
        header = kind == KIND_K and mb > 0
        if len(records) % rb:
            raise ValueError(f"decode: {len(records)} bytes is not a whole number of {rb}-byte records")
        ntok = len(records) // rb
        nwin = (ntok + W - 1) // W
        if header and len(means) != nwin * mb:
            raise ValueError(f"decode: {len(means)} bytes of window headers, expected {nwin * mb}")
        rbuf = ctypes.create_string_buffer(bytes(records), max(1, len(records)))
        mbuf = ctypes.create_string_buffer(bytes(means), max(1, len(means)))
        odt = T.parse_dtype(dtype)
        p = self.profile
        out = T.Output((ntok, p.kv_heads, p.head_dim), odt, like)
        osz = T.DTYPE_SIZES[odt]
        for w in range(nwin):
            first, cnt = w * W, min(W, ntok - w * W)
            mean = ctypes.c_void_p(ctypes.addressof(mbuf) + w * mb) if header else None
            rec = ctypes.c_void_p(ctypes.addressof(rbuf) + first * rb)
            _check(lib.dq_tokens_decode(self._v, self._ws, kind, mean, rec, rb, cnt,
                                        ctypes.c_void_p(out.ptr + first * self.stream_len * osz), odt), "decode")
        return out.result()

    def layer(self) -> "Layer":
        """A new, empty layer (sealed windows + BF16 tail) of this codec."""
        return Layer(self)

    def attend(self, layers: Union["Layer", Sequence["Layer"]], q: Array, scale: Optional[float] = None,
               reference: bool = False) -> Tuple[Array, Array]:
        """Decode attention over layers (one Layer or a list) with queries q ([q_heads, head_dim], or
        [items, q_heads, head_dim] for a list). Returns (out [.., q_heads, head_dim] f32, lse [.., q_heads])."""
        lib = library()
        single = isinstance(layers, Layer)
        layers = [layers] if single else list(layers)
        qin = T.Input(q, want=T.F32)
        shape = qin.shape if not single else (1,) + qin.shape
        if len(shape) != 3 or shape[0] != len(layers) or shape[2] != self.profile.head_dim:
            raise ValueError(f"attend: queries {qin.shape} for {len(layers)} layer(s), head_dim {self.profile.head_dim}")
        items_n, qh, hd = shape
        out = T.Output((items_n, qh, hd), T.F32, qin)
        lse = T.Output((items_n, qh), T.F32, qin)
        items = (dq_attn_item * items_n)()
        for i, l in enumerate(layers):
            if l.codec is not self:
                raise ValueError("attend: a layer of another codec")
            items[i].layer = l._l
            items[i].q = qin.ptr + i * qh * hd * 4
            items[i].out = out.ptr + i * qh * hd * 4
            items[i].lse = lse.ptr + i * qh * 4
        fn = lib.dq_attend_reference if reference else lib.dq_attend
        sc = 1.0 / math.sqrt(hd) if scale is None else scale
        _check(fn(self._v, self._ws, qh, sc, items, items_n), "attend")
        o, s = out.result(), lse.result()
        return (o[0], s[0]) if single else (o, s)


class Layer:
    """One layer of one sequence: append K/V tokens, decode any range, attend (Codec.attend)."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self._l = ctypes.c_void_p()
        _check(library().dq_layer_create(codec._v, ctypes.byref(self._l)), "layer_create")

    def close(self) -> None:
        """Frees the layer (again: nothing)."""
        if getattr(self, "_l", None):
            library().dq_layer_free(self._l)
            self._l = None

    __del__ = close

    def __enter__(self) -> "Layer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def append(self, k: Array, v: Array) -> Dict[str, int]:
        """Appends tokens: k and v [tokens, kv_heads, head_dim] of one dtype. Returns encoder stats."""
        kin = T.Input(k)
        vin = T.Input(v, want=kin.dtype)
        self.codec._shape_ok(kin.shape, "append k")
        if vin.shape != kin.shape:
            raise ValueError(f"append: v {vin.shape} differs from k {kin.shape}")
        st = dq_encode_stats()
        _check(library().dq_layer_append(self._l, self.codec._ws, kin.c_void_p(), vin.c_void_p(), kin.dtype,
                                         kin.shape[0], ctypes.byref(st)), "append")
        return {"streams": st.streams, "retries": st.retries, "symbols_moved": st.symbols_moved}

    def decode(self, kind: Kind, first: int = 0, count: Optional[int] = None, dtype: DType = "f32",
               like: Optional[Array] = None) -> Array:
        """Tokens [first, first + count) of K or V as [count, kv_heads, head_dim] (numpy, or torch when
        like is a torch tensor)."""
        kind = _kind(kind)
        if count is None:
            count = self.tokens - first
        odt = T.parse_dtype(dtype)
        p = self.codec.profile
        out = T.Output((count, p.kv_heads, p.head_dim), odt, like)
        _check(library().dq_layer_decode(self._l, self.codec._ws, kind, first, count, out.c_void_p(), odt), "decode")
        return out.result()

    @classmethod
    def restore(cls, codec: Codec, records: bytes = b"", tail_k: bytes = b"", tail_v: bytes = b"") -> "Layer":
        """A layer rebuilt from raw parts (dq_layer_restore; copied): whole window records back to back
        (codec.window_bytes each), then a BF16 tail of fewer than R tokens ([tail, kv_heads,
        head_dim], little endian; tail_k and tail_v of one length). Every record is checked first:
        DquantError CORRUPT for a record that fails the container's invariants or a NaN/Inf tail
        value, SHAPE for a tail of R tokens or more."""
        wb, row = codec.window_bytes, 2 * codec.stream_len
        if len(records) % wb:
            raise ValueError(f"restore: {len(records)} record bytes are not whole {wb}-byte window records")
        if len(tail_k) != len(tail_v) or len(tail_k) % row:
            raise ValueError(f"restore: tails of {len(tail_k)} and {len(tail_v)} bytes, expected one length in "
                             f"whole {row}-byte BF16 tokens")
        rbuf = ctypes.create_string_buffer(bytes(records), max(1, len(records)))
        tk = (ctypes.c_uint16 * max(1, len(tail_k) // 2)).from_buffer_copy(bytes(tail_k) or bytes(2))
        tv = (ctypes.c_uint16 * max(1, len(tail_v) // 2)).from_buffer_copy(bytes(tail_v) or bytes(2))
        self = cls.__new__(cls)
        self.codec = codec
        self._l = ctypes.c_void_p()
        _check(library().dq_layer_restore(codec._v, rbuf, len(records) // wb, tk, tv, len(tail_k) // row,
                                          ctypes.byref(self._l)), "layer_restore")
        return self

    @property
    def window_count(self) -> int:
        """Sealed windows (sealed_tokens / W)."""
        return library().dq_layer_window_count(self._l)

    def window(self, i: int) -> bytes:
        """A copy of sealed window i's record (codec.window_bytes bytes, dquant/codec.h's layout)."""
        if not 0 <= i < self.window_count:
            raise IndexError(f"window {i} of a layer of {self.window_count}")
        return ctypes.string_at(library().dq_layer_window(self._l, i), self.codec.window_bytes)

    def tail(self, kind: Kind) -> bytes:
        """A copy of the BF16 tail of K or V: tail_tokens × kv_heads × head_dim little-endian BF16."""
        n = self.tail_tokens * self.codec.stream_len * 2
        return ctypes.string_at(library().dq_layer_tail(self._l, _kind(kind)), n) if n else b""

    tokens = property(lambda s: library().dq_layer_tokens(s._l))
    sealed_tokens = property(lambda s: library().dq_layer_sealed_tokens(s._l))
    tail_tokens = property(lambda s: library().dq_layer_tail_tokens(s._l))
    stored_bytes = property(lambda s: library().dq_layer_stored_bytes(s._l))


def roundtrip(x: Array, codec: Union[str, Profile] = "dq226", kind: Kind = "k",
              out_dtype: Optional[DType] = None) -> Tuple[Array, Dict[str, Any]]:
    """Reconstruction of x ([tokens, kv_heads, head_dim]) through a codec by name or Profile:
    returns (x_hat, stats). Every token is encoded (no BF16 tail)."""
    shape = tuple(x.shape)
    if len(shape) != 3:
        raise ValueError(f"roundtrip: shape {shape}, expected [tokens, kv_heads, head_dim]")
    with Codec(codec, shape[1], shape[2]) as c:
        return c.roundtrip(x, kind, out_dtype)
