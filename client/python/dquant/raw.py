"""KV as stored: window records and BF16 tails, encoded and decoded in-process by libdquant.

dquantd keeps each layer of a sequence as whole window records (W tokens of keys and values,
dquant/codec.h's layout) followed by a BF16 tail of fewer than W tokens. GET_RAW returns that as
it is, and PUT_RAW / PUT_CHUNKS_RAW store records a client encoded itself, so the daemon does no
encoding and the wire carries the compressed bytes (about 2.3 bits per value for dq226 instead of
BF16's 16):

    raw = RawKV.encode(k, v, profile)        # k, v [layers, tokens, kv_heads, head_dim]
    client.put_raw("req-1", raw, model="m")  # stored as is (the daemon checks every record)
    raw2 = client.get_raw("req-1")           # == raw, byte for byte
    k2, v2 = raw2.decode()                   # what client.get("req-1") returns, bit-exact

The records are libdquant's own: RawKV.encode appends each layer's tokens to a dquant.codec.Layer
(as the daemon's PUT does) and takes its sealed windows, so the records equal those a PUT of the
same K/V builds. A Codec (one workspace) belongs to one thread; RawKV objects are plain data."""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Any, Optional, Tuple, Union

from . import _tensor as T
from .codec import KIND_K, KIND_V, Codec, Layer, Profile
from .codec import _check as check
from .codec import library as codec_library
from ._tensor import Array, DType

__all__ = ["RawLayer", "RawKV"]


@dataclasses.dataclass(frozen=True)
class RawLayer:
    """One layer as stored (dqc_raw_layer): `windows` whole window records back to back in
    `records` (windows × window_bytes bytes), then `tail_tokens` tokens of K and V in BF16
    ([tail_tokens, kv_heads, head_dim], little endian) in tail_k / tail_v. layer: the model's layer
    index; tokens: windows × W + tail_tokens (what GET_RAW reports; PUT_RAW ignores both)."""

    layer: int
    tokens: int
    windows: int
    records: bytes
    tail_tokens: int = 0
    tail_k: bytes = b""
    tail_v: bytes = b""

    @property
    def nbytes(self) -> int:
        """Bytes this layer takes on the wire (records and both tails)."""
        return len(self.records) + len(self.tail_k) + len(self.tail_v)


@dataclasses.dataclass(frozen=True)
class RawKV:
    """Consecutive layers as stored (dqc_raw_result): `profile` is the serialized profile the records
    were made with (dquant.Profile.deserialize reads it; PUT_RAW requires the model's), `layers`
    the layers in order. Made by RawKV.encode or returned by Client.get_raw / get_chunks_raw; taken
    by Client.put_raw / put_chunks_raw."""

    profile: bytes
    layers: Tuple[RawLayer, ...]

    @property
    def first_layer(self) -> int:
        return self.layers[0].layer if self.layers else 0

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def tokens(self) -> int:
        """Tokens of the first layer (every layer of a RawKV from encode or GET_RAW holds as many)."""
        return self.layers[0].tokens if self.layers else 0

    @property
    def nbytes(self) -> int:
        """Bytes of records and tails over every layer (what PUT_RAW sends besides its header)."""
        return sum(layer.nbytes for layer in self.layers)

    def codec(self) -> Codec:
        """A new Codec of the records' profile (close it, or use it in a with block)."""
        return Codec(Profile.deserialize(self.profile))

    @classmethod
    def encode(cls, k: Array, v: Array, profile: Union[Profile, bytes, Codec], first_layer: int = 0) -> "RawKV":
        """Encodes k and v ([layers, tokens, kv_heads, head_dim], f32 / f16 / bf16, numpy or torch)
        into the records PUT_RAW takes: per layer, the tokens' whole windows (tokens // W records)
        and the remaining tokens % W as a BF16 tail. profile: a Profile, its serialized bytes (e.g.
        Client.register_model(...)["profile"], which PUT_RAW requires), or a Codec to encode with
        (its workspace: one thread at a time; a calibrated KVQ codec encodes layer L with its view
        of layer L). first_layer numbers the layers. For
        put_chunks_raw, tokens must be whole chunks (no tail). Raises DquantError NONFINITE or
        RANGE for input the codec refuses (as PUT would), ValueError for shapes."""
        own = not isinstance(profile, Codec)
        codec = Codec(Profile.deserialize(profile) if isinstance(profile, (bytes, bytearray)) else profile) \
            if own else profile
        try:
            kin = T.Input(k)
            vin = T.Input(v, want=kin.dtype)
            p = codec.profile
            if len(kin.shape) != 4 or vin.shape != kin.shape or kin.shape[2:] != (p.kv_heads, p.head_dim):
                raise ValueError(f"RawKV.encode: k {kin.shape} and v {vin.shape} must both be "
                                 f"[layers, tokens, {p.kv_heads}, {p.head_dim}]")
            nl, ntok = kin.shape[0], kin.shape[1]
            W, row = p.window, p.kv_heads * p.head_dim
            layers = []
            for i in range(nl):
                vw = codec.view(first_layer + i)  # a calibrated KVQ codec: that layer's codebooks
                with Layer(vw) as lay:
                    if ntok:
                        lay.append(kin.keep[i], vin.keep[i])
                    recs = [lay.window(w) for w in range(lay.window_count)]
                    tk, tv, tail = lay.tail("k"), lay.tail("v"), lay.tail_tokens
                # A residual window R > W keeps whole windows in the layer's BF16 tail: seal them
                # from those BF16 tokens, as the layer does when more tokens arrive.
                wbytes = W * row * 2
                for w in range(tail // W):
                    sl = slice(w * wbytes, (w + 1) * wbytes)
                    recs.append(vw.encode_window(_bf16(tk[sl], (W, p.kv_heads, p.head_dim)),
                                                    _bf16(tv[sl], (W, p.kv_heads, p.head_dim))))
                cut = (tail // W) * wbytes
                layers.append(RawLayer(first_layer + i, ntok, len(recs), b"".join(recs), tail % W, tk[cut:], tv[cut:]))
            return cls(p.serialize(), tuple(layers))
        finally:
            if own:
                codec.close()

    def decode(self, dtype: DType = "f32", like: Optional[Array] = None,
               codec: Optional[Codec] = None) -> Tuple[Array, Array]:
        """K and V [num_layers, tokens, kv_heads, head_dim] of dtype (numpy; torch like `like`),
        decoded in-process: what a typed GET of the same layers returns, bit-exact. Every record is
        checked first (DquantError CORRUPT). codec: one of this profile to reuse (else one is made;
        a calibrated KVQ profile needs its Codec with the calibration, layer L decoded by its view).
        Layers of different lengths raise ValueError."""
        if not self.layers:
            raise ValueError("RawKV.decode: no layers")
        own = codec is None
        codec = self.codec() if own else codec
        try:
            p = codec.profile
            if codec.profile.serialize() != bytes(self.profile):
                raise ValueError("RawKV.decode: the codec's profile is not the records' profile")
            lens = {layer.windows * p.window + layer.tail_tokens for layer in self.layers}
            if len(lens) != 1:
                raise ValueError(f"RawKV.decode: layers of different lengths {sorted(lens)}")
            ntok = lens.pop()
            odt = T.parse_dtype(dtype)
            shape = (len(self.layers), ntok, p.kv_heads, p.head_dim)
            ko, vo = T.Output(shape, odt, like), T.Output(shape, odt, like)
            step = ntok * p.kv_heads * p.head_dim * T.DTYPE_SIZES[odt]
            lib = codec_library()
            for i, layer in enumerate(self.layers):
                if not ntok:
                    break
                with Layer.restore(codec.view(layer.layer), layer.records, layer.tail_k, layer.tail_v) as lay:
                    for out, kind in ((ko, KIND_K), (vo, KIND_V)):
                        check(lib.dq_layer_decode(lay._l, codec._ws, kind, 0, ntok, ctypes.c_void_p(out.ptr + i * step),
                                                  odt), "decode")
            return ko.result(), vo.result()
        finally:
            if own:
                codec.close()


def _bf16(raw: bytes, shape: Tuple[int, ...]) -> Any:
    """Little-endian BF16 bytes as float32 numpy of shape (widening BF16 to f32 is exact, so the
    encoder sees the values a BF16 input would give)."""
    u = T._np.frombuffer(raw, dtype="<u2").astype(T._np.uint32) << 16
    return u.view(T._np.float32).reshape(shape)
