"""ctypes binding of libdquant-client: a blocking connection to dquantd.

    with Client("unix:/tmp/dquantd.sock") as c:
        c.register_model("m", layers=32, q_heads=32, kv_heads=8, head_dim=128, profile="dq226")
        c.put("req-1", k, v, model="m")              # k, v [layers, tokens, kv_heads, head_dim]
        k2, v2 = c.get("req-1")                      # decompressed, same layout
        out, lse = c.attend("req-1", layer=0, q=q)   # q [q_heads, head_dim]

One Client is one connection: use it from one thread at a time (the C handle's rule). Errors raise
ClientError (a DquantError) with the library's code, name and message."""

from __future__ import annotations

import ctypes
import dataclasses
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _device as D
from . import _lib
from . import _tensor as T
from ._errors import ClientError, ErrorCode, UnsupportedError
from ._tensor import Array, DType
from .raw import RawKV, RawLayer

__all__ = ["Client", "ClientError", "version", "library", "chunk_keys", "has_symbols", "CHUNK_KEY_BYTES", "RawKV",
           "RawLayer", "DevGetResult", "nccl_library", "has_nccl"]

#: A sequence key: str (sent UTF-8 encoded) or bytes.
Key = Union[str, bytes]

DQC_PROFILE_MAX = 1024
DQC_INFO_STR = 64
DQC_INFO_LIST = 16


class dqc_options(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32), ("connect_timeout_ms", ctypes.c_int), ("io_timeout_ms", ctypes.c_int),
        ("client_name", ctypes.c_char_p), ("secret", ctypes.c_void_p), ("secret_len", ctypes.c_size_t),
        ("auto_reconnect", ctypes.c_int), ("reconnect_attempts", ctypes.c_uint32),
        ("reconnect_backoff_ms", ctypes.c_uint32), ("max_reply_header", ctypes.c_uint32),
        ("max_reply_payload", ctypes.c_uint64),
        ("tls_ca", ctypes.c_char_p), ("tls_cert", ctypes.c_char_p), ("tls_key", ctypes.c_char_p),
        ("tls_server_name", ctypes.c_char_p),
    ]


class dqc_seq(ctypes.Structure):
    _fields_ = [("ns", ctypes.c_char_p), ("key", ctypes.c_void_p), ("key_len", ctypes.c_size_t)]


class dqc_server_info(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint32), ("server_version", ctypes.c_char * DQC_INFO_STR),
        ("backend", ctypes.c_char * DQC_INFO_STR), ("max_frame_bytes", ctypes.c_uint64),
        ("max_payload_bytes", ctypes.c_uint64), ("max_batch_items", ctypes.c_uint32),
        ("nprofiles", ctypes.c_size_t), ("profiles", (ctypes.c_char * DQC_INFO_STR) * DQC_INFO_LIST),
        ("nfeatures", ctypes.c_size_t), ("features", (ctypes.c_char * DQC_INFO_STR) * DQC_INFO_LIST),
    ]


class dqc_model_spec(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p), ("layers", ctypes.c_uint32), ("q_heads", ctypes.c_uint32),
        ("kv_heads", ctypes.c_uint32), ("head_dim", ctypes.c_uint32), ("profile_name", ctypes.c_char_p),
        ("profile", ctypes.c_void_p), ("profile_len", ctypes.c_size_t),
    ]


class dqc_model_info(ctypes.Structure):
    _fields_ = [("existed", ctypes.c_int), ("bits_per_value", ctypes.c_double), ("profile_len", ctypes.c_size_t),
                ("profile", ctypes.c_uint8 * DQC_PROFILE_MAX)]


class dqc_put_args(ctypes.Structure):
    _fields_ = [
        ("seq", dqc_seq), ("model", ctypes.c_char_p), ("start_token", ctypes.c_uint64),
        ("first_layer", ctypes.c_uint32), ("num_layers", ctypes.c_uint32), ("tokens", ctypes.c_uint64),
        ("kv_heads", ctypes.c_uint32), ("head_dim", ctypes.c_uint32), ("dtype", ctypes.c_int),
        ("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
    ]


class dqc_put_result(ctypes.Structure):
    _fields_ = [("tokens", ctypes.c_uint64), ("stored_bytes", ctypes.c_uint64),
                ("streams_encoded", ctypes.c_uint64), ("retries", ctypes.c_uint64)]


class dqc_get_args(ctypes.Structure):
    _fields_ = [
        ("seq", dqc_seq), ("first_layer", ctypes.c_uint32), ("num_layers", ctypes.c_uint32),
        ("start_token", ctypes.c_uint64), ("tokens", ctypes.c_uint64), ("dtype", ctypes.c_int),
    ]


class dqc_get_result(ctypes.Structure):
    _fields_ = [
        ("start_token", ctypes.c_uint64), ("tokens", ctypes.c_uint64), ("num_layers", ctypes.c_uint32),
        ("kv_heads", ctypes.c_uint32), ("head_dim", ctypes.c_uint32), ("dtype", ctypes.c_int),
        ("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("bytes", ctypes.c_size_t),
        ("mem_", ctypes.c_void_p), ("mem_cap_", ctypes.c_size_t),
    ]


class dqc_raw_layer(ctypes.Structure):
    _fields_ = [
        ("layer", ctypes.c_uint32), ("tokens", ctypes.c_uint64), ("windows", ctypes.c_uint64),
        ("records", ctypes.c_void_p), ("records_bytes", ctypes.c_size_t), ("tail_tokens", ctypes.c_uint64),
        ("tail_k", ctypes.c_void_p), ("tail_v", ctypes.c_void_p), ("tail_bytes", ctypes.c_size_t),
    ]


class dqc_raw_result(ctypes.Structure):
    _fields_ = [
        ("profile_len", ctypes.c_size_t), ("profile", ctypes.c_uint8 * DQC_PROFILE_MAX), ("nlayers", ctypes.c_size_t),
        ("layers", ctypes.POINTER(dqc_raw_layer)), ("mem_", ctypes.c_void_p), ("mem_cap_", ctypes.c_size_t),
        ("layers_cap_", ctypes.c_size_t),
    ]


class dqc_put_raw_args(ctypes.Structure):
    _fields_ = [
        ("seq", dqc_seq), ("model", ctypes.c_char_p), ("start_token", ctypes.c_uint64),
        ("first_layer", ctypes.c_uint32), ("layers", ctypes.POINTER(dqc_raw_layer)), ("nlayers", ctypes.c_size_t),
        ("profile", ctypes.c_void_p), ("profile_len", ctypes.c_size_t),
    ]


class dqc_attend_item(ctypes.Structure):
    _fields_ = [("seq", dqc_seq), ("layer", ctypes.c_uint32), ("q", ctypes.c_void_p),
                ("append_k", ctypes.c_void_p), ("append_v", ctypes.c_void_p)]


class dqc_attend_args(ctypes.Structure):
    _fields_ = [
        ("items", ctypes.POINTER(dqc_attend_item)), ("nitems", ctypes.c_size_t), ("q_heads", ctypes.c_uint32),
        ("kv_heads", ctypes.c_uint32), ("head_dim", ctypes.c_uint32), ("dtype", ctypes.c_int),
        ("scale", ctypes.c_float),
    ]


class dqc_counter(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_uint64)]


class dqc_gauge(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_double)]


class dqc_stats_result(ctypes.Structure):
    _fields_ = [
        ("ncounters", ctypes.c_size_t), ("counters", ctypes.POINTER(dqc_counter)),
        ("ngauges", ctypes.c_size_t), ("gauges", ctypes.POINTER(dqc_gauge)), ("mem_", ctypes.c_void_p),
    ]


def _error(rc: int, what: str, detail: str = "") -> ClientError:
    lib = library()
    return ClientError(rc, what, detail or lib.dqc_strerror(rc).decode(), lib.dqc_err_name(rc).decode())


_L = None


def library() -> ctypes.CDLL:
    """The loaded libdquant-client (ctypes.CDLL) with its prototypes declared."""
    global _L
    if _L is not None:
        return _L
    lib = _lib.load("dquant-client", "client/lib")
    P, VP, I, SZ = ctypes.POINTER, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    protos = {
        "dqc_options_default": (None, [P(dqc_options)]),
        "dqc_connect_ex": (I, [ctypes.c_char_p, P(dqc_options), P(VP), ctypes.c_char_p, SZ]),
        "dqc_free": (None, [VP]),
        "dqc_reconnect": (I, [VP]),
        "dqc_reconnect_count": (ctypes.c_uint64, [VP]),
        "dqc_last_error": (ctypes.c_char_p, [VP]),
        "dqc_strerror": (ctypes.c_char_p, [I]),
        "dqc_err_name": (ctypes.c_char_p, [I]),
        "dqc_version": (ctypes.c_char_p, []),
        "dqc_server": (I, [VP, P(dqc_server_info)]),
        "dqc_register_model": (I, [VP, P(dqc_model_spec), P(dqc_model_info)]),
        "dqc_put": (I, [VP, P(dqc_put_args), P(dqc_put_result)]),
        "dqc_get": (I, [VP, P(dqc_get_args), P(dqc_get_result)]),
        "dqc_get_result_free": (None, [P(dqc_get_result)]),
        "dqc_get_raw": (I, [VP, P(dqc_seq), ctypes.c_uint32, ctypes.c_uint32, P(dqc_raw_result)]),
        "dqc_raw_result_free": (None, [P(dqc_raw_result)]),
        "dqc_attend": (I, [VP, P(dqc_attend_args), VP, VP]),
        "dqc_delete": (I, [VP, P(dqc_seq)]),
        "dqc_pin": (I, [VP, P(dqc_seq)]),
        "dqc_unpin": (I, [VP, P(dqc_seq)]),
        "dqc_stats": (I, [VP, P(dqc_stats_result)]),
        "dqc_stats_result_free": (None, [P(dqc_stats_result)]),
        "dqc_ping": (I, [VP, VP, SZ]),
    }
    for name, (res, args) in protos.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    _L = lib
    return lib


def version() -> str:
    """libdquant-client's version, "MAJOR.MINOR.PATCH" (the project's version)."""
    return library().dqc_version().decode()


def has_symbols(*names: str) -> bool:
    """Whether the loaded libdquant-client exports every C function named (e.g. "dqc_lookup"): an
    older library lacks the shared-KV-tier calls, which then raise UnsupportedError."""
    lib = library()
    return all(hasattr(lib, n) for n in names)


def _optional(name: str, what: str):
    """The C function name of libdquant-client, or UnsupportedError when the library lacks it."""
    lib = library()
    if not hasattr(lib, name):
        raise UnsupportedError(what, f"{_lib.path_of(lib)} has no {name} (a libdquant-client older than "
                                     "the shared KV tier); build the current one and point DQUANT_LIB_DIR at it")
    return getattr(lib, name)


# libdquant-client-nccl (dquant/client_nccl.h), bound against these declarations:
#   int dqc_nccl_setup(dqc_client *client, int cuda_device);
#   int dqc_put_dev(dqc_client *client, const dqc_put_args *args, dqc_put_result *res);
#   int dqc_get_dev(dqc_client *client, const dqc_get_args *args, void *k_dev, void *v_dev, size_t capacity,
#                   dqc_get_result *res);
#   int dqc_attend_dev(dqc_client *client, const dqc_attend_args *args, float *out_dev, float *lse_dev);
# It links libdquant-client (the same soname), so its calls take this binding's handles.
_LN = None


def nccl_library() -> ctypes.CDLL:
    """The loaded libdquant-client-nccl (the NCCL data path) with its prototypes declared. It is
    built only where meson finds NCCL and the CUDA runtime: UnsupportedError without it."""
    global _LN
    if _LN is not None:
        return _LN
    library()                       # first: the nccl library's libdquant-client is this one
    try:
        lib = _lib.load("dquant-client-nccl", "client/lib")
    except OSError as e:
        raise UnsupportedError("nccl", "libdquant-client-nccl not found (built only where meson finds NCCL and "
                                       f"the CUDA runtime): {str(e).splitlines()[0]}") from None
    P, VP, I = ctypes.POINTER, ctypes.c_void_p, ctypes.c_int
    protos = {
        "dqc_nccl_setup": (I, [VP, I]),
        "dqc_put_dev": (I, [VP, P(dqc_put_args), P(dqc_put_result)]),
        "dqc_get_dev": (I, [VP, P(dqc_get_args), VP, VP, ctypes.c_size_t, P(dqc_get_result)]),
        "dqc_attend_dev": (I, [VP, P(dqc_attend_args), VP, VP]),
    }
    for name, (res, args) in protos.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    _LN = lib
    return lib


def has_nccl() -> bool:
    """Whether libdquant-client-nccl is found (Client.nccl_setup and the *_dev calls)."""
    try:
        nccl_library()
        return True
    except UnsupportedError:
        return False


def _stream_sync():
    """cudaStreamSynchronize of the CUDA runtime libdquant-client-nccl links (found through its
    handle), or None."""
    fn = getattr(nccl_library(), "cudaStreamSynchronize", None)
    if fn is not None:
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_void_p]
    return fn


def _seq(key: Key, ns: Optional[str] = None):
    """A dqc_seq and the buffers it borrows (keep them alive for the call)."""
    kb = key.encode() if isinstance(key, str) else bytes(key)
    kbuf = ctypes.create_string_buffer(kb, len(kb) or 1)
    s = dqc_seq()
    s.ns = _ns(ns)
    s.key = ctypes.cast(kbuf, ctypes.c_void_p)
    s.key_len = len(kb)
    return s, kbuf


class Client:
    """One connection to dquantd (blocking). addr: "unix:/path", "tcp://host:port" or
    "tls://host:port"."""

    def __init__(self, addr: str = "unix:/tmp/dquantd.sock", secret: Union[str, bytes, None] = None,
                 timeout_ms: Optional[int] = None, client_name: str = "dquant-python",
                 auto_reconnect: bool = True, tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None, tls_server_name: Optional[str] = None) -> None:
        """Connects and sends HELLO. secret: the daemon's shared secret; timeout_ms: both the connect
        and the I/O timeout (None: the library's defaults, 5 s and 60 s). For a tls:// address:
        tls_ca, the PEM file of the CA the server's certificate must chain to (None: the system's
        store); tls_cert and tls_key, a client certificate for mutual TLS; tls_server_name, the name
        the server's certificate must carry (None: the address's host). Raises ClientError
        (CONNECTION, TIMEOUT, UNAUTHENTICATED, VERSION, ...)."""
        lib = library()
        self._h = ctypes.c_void_p()
        o = dqc_options()
        lib.dqc_options_default(ctypes.byref(o))
        self._name = _text(client_name, "client_name")
        o.client_name = self._name
        if secret is not None:
            sb = secret.encode() if isinstance(secret, str) else bytes(secret)
            self._secret = ctypes.create_string_buffer(sb, len(sb))
            o.secret = ctypes.cast(self._secret, ctypes.c_void_p)
            o.secret_len = len(sb)
        if timeout_ms is not None:
            o.connect_timeout_ms = o.io_timeout_ms = int(timeout_ms)
        o.auto_reconnect = 1 if auto_reconnect else 0
        self._tls = [None if v is None else os.fsencode(v) for v in (tls_ca, tls_cert, tls_key, tls_server_name)]
        o.tls_ca, o.tls_cert, o.tls_key, o.tls_server_name = self._tls
        err = ctypes.create_string_buffer(512)
        rc = lib.dqc_connect_ex(addr.encode(), ctypes.byref(o), ctypes.byref(self._h), err, len(err))
        if rc:
            self._h = None
            raise _error(rc, f"connect {addr}", err.value.decode(errors="replace"))
        self.addr = addr

    def close(self) -> None:
        """Closes the connection (again: nothing). Later calls raise ClientError (INVALID_ARGUMENT)."""
        if getattr(self, "_h", None):
            library().dqc_free(self._h)
            self._h = None

    __del__ = close

    @property
    def closed(self) -> bool:
        return not getattr(self, "_h", None)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({getattr(self, 'addr', '?')!r}{', closed' if self.closed else ''})"

    @property
    def handle(self) -> ctypes.c_void_p:
        """The dqc_client * (for C extensions); ClientError when closed."""
        if self.closed:
            raise ClientError(ErrorCode.INVALID_ARGUMENT, "client", "the client is closed")
        return self._h

    def _check(self, rc: int, what: str) -> None:
        if rc:
            detail = library().dqc_last_error(self._h).decode(errors="replace") if self._h else ""
            raise _error(rc, what, detail)

    def _route(self, name: str, what: str):
        """The C function `name` (a dqc_ call taking this handle first) with its prototype; Cluster
        answers with its dqc_cluster_ counterpart of the same signature."""
        return _chunk_fn(name, what) if name in _CHUNK_PROTOS else getattr(library(), name)

    @property
    def reconnects(self) -> int:
        """How many times the handle has reconnected (dqc_reconnect_count)."""
        return int(library().dqc_reconnect_count(self.handle))

    def server(self) -> Dict[str, Any]:
        """The server's HELLO reply as a dict."""
        si = dqc_server_info()
        self._check(library().dqc_server(self.handle, ctypes.byref(si)), "server")
        return {"version": si.version, "server_version": si.server_version.decode(), "backend": si.backend.decode(),
                "max_frame_bytes": si.max_frame_bytes, "max_payload_bytes": si.max_payload_bytes,
                "max_batch_items": si.max_batch_items,
                "profiles": [si.profiles[i].value.decode() for i in range(min(si.nprofiles, DQC_INFO_LIST))],
                "features": [si.features[i].value.decode() for i in range(min(si.nfeatures, DQC_INFO_LIST))]}

    def ping(self, data: bytes = b"") -> None:
        """Sends data and checks that the server echoes it."""
        buf = ctypes.create_string_buffer(bytes(data), max(1, len(data)))
        self._check(library().dqc_ping(self.handle, buf, len(data)), "ping")

    def register_model(self, name: str, layers: int, q_heads: int, kv_heads: int, head_dim: int,
                       profile: Union[str, Any] = "dq226", chunk_tokens: Optional[int] = None,
                       calibration: Optional[bytes] = None) -> Dict[str, Any]:
        """Registers a model (idempotent for an identical spec; another spec under the same name is
        EXISTS); profile is a built-in name or a dquant.codec.Profile (sent serialized).
        chunk_tokens: tokens per chunk of the shared KV tier (None or 0: the server's 256; a multiple
        of the profile's window). calibration: the KVQuant++ calibration of a calibrated profile
        (dquant.kvq.calibrate returns both; the daemon checks one against the other: CORRUPT,
        TRUNCATED, PROFILE, SHAPE for a layer count other than layers, TOO_LARGE past its
        max_calibration_bytes; UnsupportedError from a library without
        dqc_register_model_calibrated; a Cluster registers both on every member). Returns
        {"existed", "bits_per_value", "profile" (serialized bytes the server uses), "chunk_tokens"
        (the model's; None from a library without dqc_register_model_ex, where asking for a size
        raises UnsupportedError)}."""
        spec = dqc_model_spec()
        nb = _text(name, "model name")
        spec.name, spec.layers, spec.q_heads, spec.kv_heads, spec.head_dim = nb, layers, q_heads, kv_heads, head_dim
        keep = None
        if isinstance(profile, str):
            pb = _text(profile, "profile name")
            spec.profile_name = pb
        else:
            ser = profile.serialize()
            keep = ctypes.create_string_buffer(ser, len(ser))
            spec.profile, spec.profile_len = ctypes.cast(keep, ctypes.c_void_p), len(ser)
        info = dqc_model_info()
        ct_out = None
        if calibration:
            cal = bytes(calibration)
            cbuf = ctypes.create_string_buffer(cal, len(cal))
            base = _optional("dqc_register_model_calibrated", "register_model")
            base.restype = ctypes.c_int
            base.argtypes = [ctypes.c_void_p, ctypes.POINTER(dqc_model_spec), ctypes.c_uint32, ctypes.c_void_p,
                             ctypes.c_size_t, ctypes.POINTER(dqc_model_info), ctypes.POINTER(ctypes.c_uint32)]
            fn = self._route("dqc_register_model_calibrated", "register_model with a calibration")
            ct = ctypes.c_uint32()
            self._check(fn(self.handle, ctypes.byref(spec), int(chunk_tokens or 0), ctypes.cast(cbuf, ctypes.c_void_p),
                           len(cal), ctypes.byref(info), ctypes.byref(ct)), "register_model")
            ct_out = int(ct.value)
        elif chunk_tokens or has_symbols("dqc_register_model_ex"):
            ct = ctypes.c_uint32()
            fn = self._route("dqc_register_model_ex", "register_model")
            self._check(fn(self.handle, ctypes.byref(spec), int(chunk_tokens or 0), ctypes.byref(info),
                           ctypes.byref(ct)), "register_model")
            ct_out = int(ct.value)
        else:
            self._check(library().dqc_register_model(self.handle, ctypes.byref(spec), ctypes.byref(info)),
                        "register_model")
        del keep
        return {"existed": bool(info.existed), "bits_per_value": info.bits_per_value,
                "profile": bytes(info.profile[:info.profile_len]), "chunk_tokens": ct_out}

    def unregister_model(self, name: str) -> None:
        """Removes a registered model, freeing its name and its place in the registry (the daemon
        counts models per client_name: max_models_per_client, RESOURCE_EXHAUSTED beyond). ClientError
        BUSY while sequences or chunks of the model exist (delete them first; nothing is deleted for
        you) or a request uses it; NOT_FOUND for an unknown name. UnsupportedError from a
        libdquant-client without dqc_unregister_model."""
        fn = _optional("dqc_unregister_model", "unregister_model")
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p]
        self._check(fn(self.handle, _text(name, "model name")), "unregister_model")

    def put(self, key: Key, k: Array, v: Array, model: str, start_token: int = 0, first_layer: int = 0,
            ns: Optional[str] = None, prefix_chunks: Optional[Sequence[bytes]] = None) -> Dict[str, int]:
        """Appends k and v ([num_layers, tokens, kv_heads, head_dim], f32/f16/bf16) to layers
        [first_layer, first_layer + num_layers) of sequence key at start_token. Returns a dict.
        prefix_chunks (chunk keys held by the daemon, in prompt order; only on the PUT that creates the
        sequence): the sequence is built on those chunks, its own tokens following theirs, and ATTEND
        on it covers the chunks and its own tokens with one softmax (dqc_put_on_prefix)."""
        kin = T.Input(k)
        vin = T.Input(v, want=kin.dtype)
        if len(kin.shape) != 4 or vin.shape != kin.shape:
            raise ValueError(f"put: k {kin.shape} and v {vin.shape} must both be [layers, tokens, kv_heads, head_dim]")
        a = dqc_put_args()
        a.seq, kbuf = _seq(key, ns)
        mb = _text(model, "model")
        a.model, a.start_token, a.first_layer = mb, start_token, first_layer
        a.num_layers, a.tokens, a.kv_heads, a.head_dim = kin.shape
        a.dtype, a.k, a.v = kin.dtype, kin.ptr, vin.ptr
        r = dqc_put_result()
        if prefix_chunks:
            fn = self._route("dqc_put_on_prefix", "put")
            pbuf, npre = _keys_buffer(prefix_chunks, "put")
            self._check(fn(self.handle, ctypes.byref(a), pbuf, npre, ctypes.byref(r)), "put")
        else:
            self._check(self._route("dqc_put", "put")(self.handle, ctypes.byref(a), ctypes.byref(r)), "put")
        del kbuf
        return {"tokens": r.tokens, "stored_bytes": r.stored_bytes, "streams_encoded": r.streams_encoded,
                "retries": r.retries}

    def get(self, key: Key, first_layer: int = 0, num_layers: int = 0, start_token: int = 0, tokens: int = 0,
            dtype: DType = "f32", ns: Optional[str] = None, like: Optional[Array] = None) -> Tuple[Array, Array]:
        """Decompressed K and V ([num_layers, tokens, kv_heads, head_dim] of dtype; numpy, or torch when
        like is a torch tensor). num_layers / tokens 0: to the end."""
        a = dqc_get_args()
        a.seq, kbuf = _seq(key, ns)
        a.first_layer, a.num_layers, a.start_token, a.tokens = first_layer, num_layers, start_token, tokens
        a.dtype = T.parse_dtype(dtype)
        r = dqc_get_result()
        lib = library()
        try:
            self._check(self._route("dqc_get", "get")(self.handle, ctypes.byref(a), ctypes.byref(r)), "get")
            shape = (r.num_layers, r.tokens, r.kv_heads, r.head_dim)
            k = T.from_buffer(r.k, r.bytes, shape, r.dtype, like)
            v = T.from_buffer(r.v, r.bytes, shape, r.dtype, like)
        finally:
            lib.dqc_get_result_free(ctypes.byref(r))
        del kbuf
        return k, v

    def get_raw(self, key: Key, first_layer: int = 0, num_layers: int = 0, ns: Optional[str] = None) -> RawKV:
        """Whole layers [first_layer, first_layer + num_layers) of a sequence as stored (GET_RAW; 0
        layers: to the last): each layer's window records and BF16 tail, and the profile they were
        made with. RawKV.decode gives what get returns, bit-exact. ClientError NOT_FOUND when there
        is no such sequence, OUT_OF_BOUNDS for layers it lacks."""
        s, kbuf = _seq(key, ns)
        r = dqc_raw_result()
        lib = library()
        try:
            self._check(self._route("dqc_get_raw", "get_raw")(self.handle, ctypes.byref(s), first_layer, num_layers,
                                                              ctypes.byref(r)),
                        "get_raw")
            return _raw_of(r)
        finally:
            lib.dqc_raw_result_free(ctypes.byref(r))
            del kbuf

    def put_raw(self, key: Key, raw: RawKV, model: str, start_token: int = 0, first_layer: Optional[int] = None,
                ns: Optional[str] = None) -> Dict[str, int]:
        """Appends layers encoded by the client (RawKV.encode, or another sequence's get_raw) to
        sequence key at start_token, stored as they are (PUT_RAW: no encoding on the daemon).
        first_layer: the first layer written (None: raw's first layer); start_token: each layer's
        current length, a multiple of W, and the layers must hold no tail. raw.profile must be the
        model's. All-or-nothing; the daemon checks every record: ClientError CORRUPT (a record fails
        the container's invariants), SHAPE (records not whole windows, a tail of W tokens or more,
        layers of different lengths), INVALID_ARGUMENT (records of another profile), NONFINITE (a
        NaN/Inf tail value), ORDER, NOT_FOUND (model), OUT_OF_BOUNDS (layers). Returns put's dict
        (streams_encoded 0)."""
        fn = self._route("dqc_put_raw", "put_raw")
        layers, keep = _raw_layers(raw, "put_raw")
        a = dqc_put_raw_args()
        a.seq, kbuf = _seq(key, ns)
        mb = _text(model, "model")
        pbuf = ctypes.create_string_buffer(bytes(raw.profile), max(1, len(raw.profile)))
        a.model, a.start_token = mb, int(start_token)
        a.first_layer = raw.first_layer if first_layer is None else int(first_layer)
        a.layers, a.nlayers = layers, len(raw.layers)
        a.profile, a.profile_len = ctypes.cast(pbuf, ctypes.c_void_p), len(raw.profile)
        r = dqc_put_result()
        self._check(fn(self.handle, ctypes.byref(a), ctypes.byref(r)), "put_raw")
        del kbuf, keep
        return {"tokens": r.tokens, "stored_bytes": r.stored_bytes, "streams_encoded": r.streams_encoded,
                "retries": r.retries}

    def attend(self, key: Key, layer: int, q: Array, scale: float = 0.0, append_k: Optional[Array] = None,
               append_v: Optional[Array] = None, ns: Optional[str] = None, kv_heads: int = 0) -> Tuple[Array, Array]:
        """Decode attention of query q ([q_heads, head_dim]) over one sequence's layer on the server,
        optionally appending the new token's K/V ([1, kv_heads, head_dim]) first. Returns
        (out [q_heads, head_dim] f32, lse [q_heads] f32). For batches use attend_batch."""
        items = [(key, layer, q, append_k, append_v)]
        out, lse = self.attend_batch(items, scale=scale, ns=ns, kv_heads=kv_heads)
        return out[0], lse[0]

    def attend_batch(self, items: Sequence[Tuple[Key, int, Array, Optional[Array], Optional[Array]]],
                     scale: float = 0.0, ns: Optional[str] = None, kv_heads: int = 0) -> Tuple[Array, Array]:
        """items: list of (key, layer, q, append_k or None, append_v or None), all q of one shape and
        dtype. Returns (out [items, q_heads, head_dim], lse [items, q_heads]), both f32."""
        if not items:
            raise ValueError("attend_batch: no items")
        arr = (dqc_attend_item * len(items))()
        keep = []
        q0 = None
        for i, (key, layer, q, ak, av) in enumerate(items):
            qin = T.Input(q, want=None if q0 is None else q0.dtype)
            if q0 is None:
                q0 = qin
                if len(qin.shape) != 2:
                    raise ValueError(f"attend: q {qin.shape} must be [q_heads, head_dim]")
            elif qin.shape != q0.shape:
                raise ValueError("attend_batch: queries differ in shape")
            arr[i].seq, kbuf = _seq(key, ns)
            arr[i].layer, arr[i].q = layer, qin.ptr
            keep += [qin, kbuf]
            if (ak is None) != (av is None):
                raise ValueError("attend: append_k and append_v go together")
            if ak is not None:
                kin, vin = T.Input(ak, want=q0.dtype), T.Input(av, want=q0.dtype)
                arr[i].append_k, arr[i].append_v = kin.ptr, vin.ptr
                kv_heads = kv_heads or kin.shape[-2]
                keep += [kin, vin]
        a = dqc_attend_args()
        a.items, a.nitems = arr, len(items)
        a.q_heads, a.head_dim = q0.shape
        a.kv_heads, a.dtype, a.scale = kv_heads, q0.dtype, scale
        out = T.Output((len(items),) + q0.shape, T.F32, q0)
        lse = T.Output((len(items), q0.shape[0]), T.F32, q0)
        fn = self._route("dqc_attend", "attend")
        self._check(fn(self.handle, ctypes.byref(a), out.c_void_p(), lse.c_void_p()), "attend")
        return out.result(), lse.result()

    def delete(self, key: Key, ns: Optional[str] = None) -> None:
        """Deletes a sequence (ClientError NOT_FOUND when there is none)."""
        s, kbuf = _seq(key, ns)
        self._check(self._route("dqc_delete", "delete")(self.handle, ctypes.byref(s)), "delete")

    def pin(self, key: Key, ns: Optional[str] = None) -> None:
        """Pins a sequence: never evicted until unpinned."""
        s, kbuf = _seq(key, ns)
        self._check(self._route("dqc_pin", "pin")(self.handle, ctypes.byref(s)), "pin")

    def unpin(self, key: Key, ns: Optional[str] = None) -> None:
        s, kbuf = _seq(key, ns)
        self._check(self._route("dqc_unpin", "unpin")(self.handle, ctypes.byref(s)), "unpin")

    def stats(self) -> Dict[str, Dict[str, Union[int, float]]]:
        """The daemon's counters and gauges: {"counters": {name: int}, "gauges": {name: float}}."""
        r = dqc_stats_result()
        lib = library()
        try:
            self._check(lib.dqc_stats(self.handle, ctypes.byref(r)), "stats")
            counters = {r.counters[i].name.decode(): r.counters[i].value for i in range(r.ncounters)}
            gauges = {r.gauges[i].name.decode(): r.gauges[i].value for i in range(r.ngauges)}
        finally:
            lib.dqc_stats_result_free(ctypes.byref(r))
        return {"counters": counters, "gauges": gauges}

    # ---- device tensors over NCCL (libdquant-client-nccl; declarations further down) ----

    def nccl_setup(self, device: int = 0) -> None:
        """Makes this connection's NCCL communicator with the daemon on CUDA device `device`
        (dqc_nccl_setup): afterwards put_dev / get_dev / attend_dev move tensors GPU to GPU, the
        headers still on the socket. ClientError UNSUPPORTED when the daemon offers no NCCL (not
        the cuda backend), TIMEOUT, IO; UnsupportedError without libdquant-client-nccl. The
        communicator belongs to the connection: after a reconnect the *_dev calls fail with IO
        until nccl_setup again (they never fall back to the socket)."""
        fn = nccl_library().dqc_nccl_setup
        self._check(fn(self.handle, int(device)), "nccl_setup")
        self._nccl_device = int(device)

    def _dev_check(self, arrs: Sequence[Any], what: str) -> None:
        dev = getattr(self, "_nccl_device", None)
        for a in arrs:
            if a.device is not None and dev is not None and a.device != dev:
                raise ValueError(f"{what}: a tensor on cuda:{a.device}, the communicator is on cuda:{dev}")

    def put_dev(self, key: Key, k: Any, v: Any, model: str, start_token: int = 0, first_layer: int = 0,
                ns: Optional[str] = None) -> Dict[str, int]:
        """put with k and v in GPU memory (dqc_put_dev): [num_layers, tokens, kv_heads, head_dim]
        f32 / f16 / bf16 CUDA tensors (torch, made contiguous; or __cuda_array_interface__ objects)
        on the nccl_setup device; their producers' streams are synchronized first. The bytes go
        over NCCL. Not retried after a break. Returns put's dict."""
        kin = D.DevArray(k, "put_dev k")
        vin = D.DevArray(v, "put_dev v", want=kin.dtype)
        if len(kin.shape) != 4 or vin.shape != kin.shape:
            raise ValueError(f"put_dev: k {kin.shape} and v {vin.shape} must both be "
                             "[layers, tokens, kv_heads, head_dim]")
        fn = nccl_library().dqc_put_dev
        self._dev_check((kin, vin), "put_dev")
        a = dqc_put_args()
        a.seq, kbuf = _seq(key, ns)
        mb = _text(model, "model")
        a.model, a.start_token, a.first_layer = mb, start_token, first_layer
        a.num_layers, a.tokens, a.kv_heads, a.head_dim = kin.shape
        a.dtype, a.k, a.v = kin.dtype, kin.ptr, vin.ptr
        D.ready((kin, vin), _stream_sync())
        r = dqc_put_result()
        self._check(fn(self.handle, ctypes.byref(a), ctypes.byref(r)), "put_dev")
        del kbuf
        return {"tokens": r.tokens, "stored_bytes": r.stored_bytes, "streams_encoded": r.streams_encoded,
                "retries": r.retries}

    def get_dev(self, key: Key, k_out: Any, v_out: Any, first_layer: int = 0, num_layers: int = 0,
                start_token: int = 0, tokens: int = 0, ns: Optional[str] = None) -> "DevGetResult":
        """A typed GET into GPU memory (dqc_get_dev): K and V decoded in k_out's dtype (f32, f16,
        bf16) into k_out and v_out, contiguous CUDA tensors (or __cuda_array_interface__ objects)
        of one dtype on the nccl_setup device, each at least the reply's size. Returns the
        reply's shape, and for torch outputs views of them shaped [num_layers, tokens, kv_heads,
        head_dim]. ClientError TOO_LARGE when the reply does not fit (the bytes are still received;
        the communicator stays usable), NOT_FOUND, IO (no communicator)."""
        ko = D.DevArray(k_out, "get_dev k_out", writable=True)
        vo = D.DevArray(v_out, "get_dev v_out", want=ko.dtype, writable=True)
        fn = nccl_library().dqc_get_dev
        self._dev_check((ko, vo), "get_dev")
        a = dqc_get_args()
        a.seq, kbuf = _seq(key, ns)
        a.first_layer, a.num_layers, a.start_token, a.tokens = first_layer, num_layers, start_token, tokens
        a.dtype = ko.dtype
        D.ready((ko, vo), _stream_sync())
        r = dqc_get_result()
        lib = library()
        try:
            self._check(fn(self.handle, ctypes.byref(a), ko.c_void_p(), vo.c_void_p(), min(ko.nbytes, vo.nbytes),
                           ctypes.byref(r)), "get_dev")
            shape = (int(r.num_layers), int(r.tokens), int(r.kv_heads), int(r.head_dim))
            res = DevGetResult(int(r.start_token), shape[1], shape[0], shape[2], shape[3],
                               T.DTYPE_NAMES[r.dtype], int(r.bytes), k_out, v_out)
        finally:
            lib.dqc_get_result_free(ctypes.byref(r))
        del kbuf
        if ko.flavour == "torch":
            count = res.bytes // T.DTYPE_SIZES[ko.dtype]
            res = dataclasses.replace(res, k=ko.keep.view(-1)[:count].view(shape),
                                      v=vo.keep.view(-1)[:count].view(shape))
        return res

    def attend_dev(self, items: Sequence[Tuple[Key, int, Any, Optional[Any], Optional[Any]]], out: Any = None,
                   lse: Any = None, scale: float = 0.0, ns: Optional[str] = None,
                   kv_heads: int = 0) -> Tuple[Any, Any]:
        """attend_batch with every q (and append_k / append_v) in GPU memory (dqc_attend_dev): items
        as for attend_batch, device arrays of one dtype. out [items, q_heads, head_dim] and lse
        [items, q_heads], f32 in GPU memory: given (contiguous, writable), or made on the query's
        device (torch queries). Returns (out, lse). Not retried after a break, even without
        appends."""
        if not items:
            raise ValueError("attend_dev: no items")
        arr = (dqc_attend_item * len(items))()
        keep: List[Any] = []
        q0 = None
        for i, (key, layer, q, ak, av) in enumerate(items):
            qin = D.DevArray(q, "attend_dev q", want=None if q0 is None else q0.dtype)
            if q0 is None:
                q0 = qin
                if len(qin.shape) != 2:
                    raise ValueError(f"attend_dev: q {qin.shape} must be [q_heads, head_dim]")
            elif qin.shape != q0.shape:
                raise ValueError("attend_dev: queries differ in shape")
            arr[i].seq, kbuf = _seq(key, ns)
            arr[i].layer, arr[i].q = layer, qin.ptr
            keep += [qin, kbuf]
            if (ak is None) != (av is None):
                raise ValueError("attend_dev: append_k and append_v go together")
            if ak is not None:
                kin = D.DevArray(ak, "attend_dev append_k", want=q0.dtype)
                vin = D.DevArray(av, "attend_dev append_v", want=q0.dtype)
                arr[i].append_k, arr[i].append_v = kin.ptr, vin.ptr
                kv_heads = kv_heads or kin.shape[-2]
                keep += [kin, vin]
        oshape, lshape = (len(items),) + q0.shape, (len(items), q0.shape[0])
        if out is None or lse is None:
            if q0.flavour != "torch":
                raise ValueError("attend_dev: pass out and lse (device f32) for __cuda_array_interface__ queries")
            torch = T._torch()
            out = torch.empty(oshape, dtype=torch.float32, device=q0.keep.device) if out is None else out
            lse = torch.empty(lshape, dtype=torch.float32, device=q0.keep.device) if lse is None else lse
        oa = D.DevArray(out, "attend_dev out", want=T.F32, writable=True)
        la = D.DevArray(lse, "attend_dev lse", want=T.F32, writable=True)
        if oa.nbytes < 4 * len(items) * q0.shape[0] * q0.shape[1] or la.nbytes < 4 * len(items) * q0.shape[0]:
            raise ValueError(f"attend_dev: out must hold {oshape}, lse {lshape} (f32)")
        devs = tuple(x for x in keep if isinstance(x, D.DevArray)) + (oa, la)
        self._dev_check(devs, "attend_dev")
        fn = nccl_library().dqc_attend_dev
        a = dqc_attend_args()
        a.items, a.nitems = arr, len(items)
        a.q_heads, a.head_dim = q0.shape
        a.kv_heads, a.dtype, a.scale = kv_heads, q0.dtype, scale
        D.ready(devs, _stream_sync())
        self._check(fn(self.handle, ctypes.byref(a), oa.c_void_p(), la.c_void_p()), "attend_dev")
        return out, lse

    # ---- the shared KV tier (the C declarations are quoted further down) ----

    def lookup(self, keys: Sequence[bytes], model: str, ns: Optional[str] = None,
               lease_ms: int = 0) -> LookupResult:
        """How many leading chunks of keys (prompt order, from dquant.chunk_keys) the daemon holds for
        model in namespace ns. lease_ms > 0 leases the chunks found to this connection for that long
        (not evicted until it expires, release_lease, or the connection closes; result.lease_id),
        where the daemon offers leases (else ClientError UNSUPPORTED). Raises UnsupportedError when
        the library lacks dqc_lookup, ClientError for the daemon's errors."""
        fn = self._route("dqc_lookup", "lookup")
        keys = list(keys)
        buf, n = _keys_buffer(keys, "lookup")
        r = dqc_lookup_result()
        self._check(fn(self.handle, _ns(ns), _text(model, "model"), buf, n, int(lease_ms), ctypes.byref(r)), "lookup")
        return LookupResult(int(r.hits), int(r.hit_tokens), int(r.chunk_tokens), tuple(keys[:r.hits]),
                            int(r.lease_id), int(r.lease_ms))

    def release_lease(self, lease_id: int) -> None:
        """Ends a lease of this connection (LookupResult.lease_id) before it expires; ClientError
        NOT_FOUND when there is none (expired, released, or another connection's)."""
        fn = self._route("dqc_release_lease", "release_lease")
        self._check(fn(self.handle, int(lease_id)), "release_lease")

    def put_chunks(self, keys: Sequence[bytes], k: Array, v: Array, model: str, ns: Optional[str] = None,
                   parent: Optional[bytes] = None) -> PutChunksResult:
        """Stores len(keys) chunks in prompt order: k and v are [layers, len(keys) * chunk_tokens,
        kv_heads, head_dim] (every layer of the model; f32, f16, bf16; numpy or torch, CUDA tensors
        through host memory). parent: the key before keys[0] (None at a prompt's start). Chunks the
        daemon already holds are acknowledged without re-encoding (deduped)."""
        fn = _chunk_fn("dqc_put_chunks", "put_chunks")
        if parent is not None and len(parent) != CHUNK_KEY_BYTES:
            raise ValueError(f"put_chunks: parent must be {CHUNK_KEY_BYTES} bytes")
        buf, n = _keys_buffer(keys, "put_chunks")
        kin = T.Input(k)
        vin = T.Input(v, want=kin.dtype)
        if len(kin.shape) != 4 or vin.shape != kin.shape:
            raise ValueError(f"put_chunks: k {kin.shape} and v {vin.shape} must both be "
                             "[layers, tokens, kv_heads, head_dim]")
        if n == 0 or kin.shape[1] % n:
            raise ValueError(f"put_chunks: {kin.shape[1]} tokens are not {n} whole chunks")
        pbuf = ctypes.create_string_buffer(bytes(parent), CHUNK_KEY_BYTES) if parent is not None else None
        a = dqc_put_chunks_args()
        nsb, mb = _ns(ns), _text(model, "model")
        a.ns, a.model = nsb, mb
        a.keys, a.nkeys = ctypes.cast(buf, ctypes.c_void_p), n
        a.parent = ctypes.cast(pbuf, ctypes.c_void_p) if pbuf is not None else None
        a.layers, a.kv_heads, a.head_dim = kin.shape[0], kin.shape[2], kin.shape[3]
        a.chunk_tokens = kin.shape[1] // n
        a.dtype, a.k, a.v = kin.dtype, kin.ptr, vin.ptr
        r = dqc_put_chunks_result()
        self._check(fn(self.handle, ctypes.byref(a), ctypes.byref(r)), "put_chunks")
        return PutChunksResult(int(r.stored), int(r.deduped), int(r.streams_encoded))

    def get_chunk(self, key: bytes, ns: Optional[str] = None, dtype: DType = "f32",
                  like: Optional[Array] = None) -> Tuple[Array, Array]:
        """One chunk decompressed: K and V [layers, chunk_tokens, kv_heads, head_dim] of dtype (numpy;
        torch on like's device when like is a torch tensor). ClientError NOT_FOUND when not held."""
        fn = _chunk_fn("dqc_get_chunk", "get_chunk")
        buf, _ = _keys_buffer([key], "get_chunk")
        r = dqc_get_result()
        lib = library()
        try:
            self._check(fn(self.handle, _ns(ns), buf, T.parse_dtype(dtype), ctypes.byref(r)), "get_chunk")
            shape = (r.num_layers, r.tokens, r.kv_heads, r.head_dim)
            kk = T.from_buffer(r.k, r.bytes, shape, r.dtype, like)
            vv = T.from_buffer(r.v, r.bytes, shape, r.dtype, like)
        finally:
            lib.dqc_get_result_free(ctypes.byref(r))
        return kk, vv

    def delete_chunk(self, key: bytes, ns: Optional[str] = None) -> None:
        """Deletes one chunk (ClientError NOT_FOUND when not held)."""
        self._chunk_call("dqc_delete_chunk", "delete_chunk", key, ns)

    def pin_chunk(self, key: bytes, ns: Optional[str] = None) -> None:
        """Pins one chunk: never evicted until unpinned (NOT_FOUND when not held)."""
        self._chunk_call("dqc_pin_chunk", "pin_chunk", key, ns)

    def unpin_chunk(self, key: bytes, ns: Optional[str] = None) -> None:
        """Unpins one chunk."""
        self._chunk_call("dqc_unpin_chunk", "unpin_chunk", key, ns)

    def _chunk_call(self, name: str, what: str, key: bytes, ns: Optional[str]) -> None:
        fn = _chunk_fn(name, what)
        buf, _ = _keys_buffer([key], what)
        self._check(fn(self.handle, _ns(ns), buf), what)

    def get_chunks(self, keys: Sequence[bytes], ns: Optional[str] = None, dtype: DType = "f32",
                   like: Optional[Array] = None) -> Tuple[Array, Array]:
        """Chunks decompressed and concatenated in the order of keys (one dqc_get_chunk each): K and V
        [layers, len(keys) * chunk_tokens, kv_heads, head_dim] of dtype, in like's flavour (numpy
        without it). ClientError NOT_FOUND when one is not held."""
        keys = list(keys)
        if not keys:
            raise ValueError("get_chunks: no keys")
        parts = [self.get_chunk(key, ns=ns, dtype=dtype, like=like) for key in keys]
        if len(parts) == 1:
            return parts[0]
        if T.is_torch(parts[0][0]):
            import torch
            return torch.cat([p[0] for p in parts], dim=1), torch.cat([p[1] for p in parts], dim=1)
        return T._np.concatenate([p[0] for p in parts], axis=1), T._np.concatenate([p[1] for p in parts], axis=1)

    def get_chunks_raw(self, keys: Sequence[bytes], ns: Optional[str] = None) -> RawKV:
        """Chunks as stored (one GET_RAW, dqc_get_chunks_raw): per layer of the model, the chunks'
        window records one after the other in the order of keys (len(keys) × chunk_tokens / W
        windows, no tail). RawKV.decode gives get_chunks' arrays, bit-exact. ClientError NOT_FOUND
        when one is not held (nothing returned then)."""
        fn = _chunk_fn("dqc_get_chunks_raw", "get_chunks_raw")
        buf, n = _keys_buffer(keys, "get_chunks_raw")
        if n == 0:
            raise ValueError("get_chunks_raw: no keys")
        r = dqc_raw_result()
        lib = library()
        try:
            self._check(fn(self.handle, _ns(ns), buf, n, ctypes.byref(r)), "get_chunks_raw")
            return _raw_of(r)
        finally:
            lib.dqc_raw_result_free(ctypes.byref(r))

    def put_chunks_raw(self, keys: Sequence[bytes], raw: RawKV, model: str, ns: Optional[str] = None,
                       parent: Optional[bytes] = None) -> PutChunksResult:
        """Stores len(keys) chunks (prompt order) from records the client encoded (PUT_CHUNKS_RAW):
        raw holds every layer of the model, each with len(keys) × chunk_tokens / W whole windows and
        no tail (RawKV.encode of [layers, len(keys) × chunk_tokens, kv_heads, head_dim], or
        get_chunks_raw's). parent as for put_chunks. Deduped like put_chunks (chunks held already
        are acknowledged, streams_encoded 0); every record is checked before any chunk is stored:
        ClientError CORRUPT, SHAPE, INVALID_ARGUMENT, NOT_FOUND (model, parent) as for put_raw."""
        fn = _chunk_fn("dqc_put_chunks_raw", "put_chunks_raw")
        if parent is not None and len(parent) != CHUNK_KEY_BYTES:
            raise ValueError(f"put_chunks_raw: parent must be {CHUNK_KEY_BYTES} bytes")
        buf, n = _keys_buffer(keys, "put_chunks_raw")
        if n == 0:
            raise ValueError("put_chunks_raw: no keys")
        layers, keep = _raw_layers(raw, "put_chunks_raw")
        pbuf = ctypes.create_string_buffer(bytes(parent), CHUNK_KEY_BYTES) if parent is not None else None
        prof = ctypes.create_string_buffer(bytes(raw.profile), max(1, len(raw.profile)))
        r = dqc_put_chunks_result()
        self._check(fn(self.handle, _ns(ns), _text(model, "model"), buf, n, pbuf, layers, len(raw.layers), prof,
                       len(raw.profile), ctypes.byref(r)), "put_chunks_raw")
        del keep
        return PutChunksResult(int(r.stored), int(r.deduped), int(r.streams_encoded))


# ---- chunk keys of the shared KV tier (proto/chunkkey.h, computed by libdquant-client) ----

#: Bytes of one chunk key (XXH3-128, canonical form).
CHUNK_KEY_BYTES = 16

# dqc_chunk_keys as declared in client.h, its return type and its parameters by name in order:
#   size_t dqc_chunk_keys(const char *ns, const uint32_t *tokens, size_t ntokens, uint32_t chunk_tokens,
#                         const uint8_t *parent, uint8_t *out, size_t max_keys);
# The one declaration to adapt if it changes: chunk_keys passes its arguments by these names (it
# also knows "ns_len"); an int return type would be read as a dq_error code when negative.
_CHUNK_KEYS_PROTO = (ctypes.c_size_t, (
    ("ns", ctypes.c_char_p), ("tokens", ctypes.POINTER(ctypes.c_uint32)), ("ntokens", ctypes.c_size_t),
    ("chunk_tokens", ctypes.c_uint32), ("parent", ctypes.POINTER(ctypes.c_uint8)),
    ("out", ctypes.POINTER(ctypes.c_uint8)), ("max_keys", ctypes.c_size_t)))


def _token_array(tokens: Any) -> Tuple[Any, int]:
    """tokens (a sequence of ints, a numpy array or a torch tensor of token ids in [0, 2^32)) as a
    C uint32 array and its length."""
    if T.is_torch(tokens):
        tokens = tokens.detach().cpu().reshape(-1).tolist()
    elif T._np is not None and isinstance(tokens, T._np.ndarray):
        a = tokens.reshape(-1)
        if a.size and (a.dtype.kind not in "iu" or int(a.min()) < 0 or int(a.max()) > 0xFFFFFFFF):
            raise ValueError("chunk_keys: token ids must be integers in [0, 2^32)")
        a = T._np.ascontiguousarray(a, dtype=T._np.uint32)
        return a.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32)), a.size
    tokens = list(tokens)
    for t in tokens:
        if not isinstance(t, int) or isinstance(t, bool) or t < 0 or t > 0xFFFFFFFF:
            raise ValueError(f"chunk_keys: token id {t!r} is not an integer in [0, 2^32)")
    return (ctypes.c_uint32 * max(1, len(tokens)))(*tokens), len(tokens)


def chunk_keys(ns: str, tokens: Any, chunk_tokens: int, parent: Optional[bytes] = None) -> List[bytes]:
    """The chunk keys of a prompt's full chunks (proto/chunkkey.h): key_i is XXH3-128 over "dqchunk1",
    the namespace, key_(i-1) (parent for the first; None: the prompt's start, 16 zero bytes), the
    chunk's token count and its token ids. A final partial chunk has no key. tokens: ints in
    [0, 2^32), a numpy array or a torch tensor. Every client of one namespace gets the same keys for
    the same prefix, so these name chunks in the daemon's shared tier (Client.lookup, put_chunks,
    get_chunks). Computed by libdquant-client's dqc_chunk_keys (UnsupportedError without it)."""
    if not isinstance(chunk_tokens, int) or chunk_tokens <= 0 or chunk_tokens > 0xFFFFFFFF:
        raise ValueError(f"chunk_keys: chunk_tokens must be a positive integer, not {chunk_tokens!r}")
    if parent is not None and len(parent) != CHUNK_KEY_BYTES:
        raise ValueError(f"chunk_keys: parent must be {CHUNK_KEY_BYTES} bytes, not {len(parent)}")
    fn = _optional("dqc_chunk_keys", "chunk_keys")
    restype, params = _CHUNK_KEYS_PROTO
    if fn.argtypes is None or list(fn.argtypes) != [t for _, t in params]:
        fn.restype, fn.argtypes = restype, [t for _, t in params]
    nsb = _text(ns, "ns")
    toks, n = _token_array(tokens)
    nkeys = n // chunk_tokens
    out = (ctypes.c_uint8 * max(1, nkeys * CHUNK_KEY_BYTES))()
    par = (ctypes.c_uint8 * CHUNK_KEY_BYTES).from_buffer_copy(bytes(parent)) if parent is not None else None
    args = {"ns": nsb, "ns_len": len(nsb), "tokens": toks, "ntokens": n, "chunk_tokens": chunk_tokens,
            "parent": par, "out": out, "max_keys": nkeys}
    got = fn(*(args[name] for name, _ in params))
    if got < 0:                 # an int-returning declaration reports errors as a dq_error code
        raise _error(got, "chunk_keys")
    if got != nkeys:
        raise ClientError(ErrorCode.INTERNAL, "chunk_keys", f"dqc_chunk_keys wrote {got} keys, expected {nkeys}")
    raw = bytes(out)
    return [raw[i * CHUNK_KEY_BYTES:(i + 1) * CHUNK_KEY_BYTES] for i in range(nkeys)]


# ---- the shared KV tier: LOOKUP, PUT_CHUNKS, chunk GET ----
#
# Bound against these declarations of client.h (the structs mirror them field for field;
# tests/python/layout_probe.c checks sizes and offsets against the C compiler):
#
#   int dqc_register_model_ex(dqc_client *c, const dqc_model_spec *spec, uint32_t chunk_tokens,
#                             dqc_model_info *info, uint32_t *chunk_tokens_out);
#   typedef struct dqc_put_chunks_args { const char *ns, *model; const uint8_t *keys; size_t nkeys;
#       const uint8_t *parent; uint32_t layers, chunk_tokens, kv_heads, head_dim; dq_dtype dtype;
#       const void *k, *v; } dqc_put_chunks_args;
#   typedef struct dqc_put_chunks_result { uint64_t stored, deduped, streams_encoded; } dqc_put_chunks_result;
#   int dqc_put_chunks(dqc_client *c, const dqc_put_chunks_args *a, dqc_put_chunks_result *res);
#   typedef struct dqc_lookup_result { uint64_t hits, hit_tokens; uint32_t chunk_tokens;
#       uint64_t lease_id; uint32_t lease_ms; } dqc_lookup_result;
#   int dqc_lookup(dqc_client *c, const char *ns, const char *model, const uint8_t *keys, size_t nkeys,
#                  uint32_t lease_ms, dqc_lookup_result *res);
#   int dqc_release_lease(dqc_client *c, uint64_t lease_id);
#   int dqc_put_on_prefix(dqc_client *c, const dqc_put_args *a, const uint8_t *prefix_keys, size_t nprefix,
#                         dqc_put_result *res);
#
# dqc_lookup_result's lease fields came after its first three: against a library without them C
# writes only the first 24 bytes of the (larger) ctypes struct, and lease_id reads 0.
#   int dqc_get_chunk(dqc_client *c, const char *ns, const uint8_t *key, dq_dtype dtype, dqc_get_result *res);
#   int dqc_delete_chunk(dqc_client *c, const char *ns, const uint8_t *key);   (and dqc_pin_chunk,
#   dqc_unpin_chunk, the same)

#: The C functions of the shared KV tier; without them the chunk calls raise UnsupportedError.
CHUNK_SYMBOLS = ("dqc_chunk_keys", "dqc_register_model_ex", "dqc_lookup", "dqc_put_chunks", "dqc_get_chunk")


class dqc_lookup_result(ctypes.Structure):
    _fields_ = [("hits", ctypes.c_uint64), ("hit_tokens", ctypes.c_uint64), ("chunk_tokens", ctypes.c_uint32),
                ("lease_id", ctypes.c_uint64), ("lease_ms", ctypes.c_uint32)]


class dqc_put_chunks_args(ctypes.Structure):
    _fields_ = [
        ("ns", ctypes.c_char_p), ("model", ctypes.c_char_p), ("keys", ctypes.c_void_p), ("nkeys", ctypes.c_size_t),
        ("parent", ctypes.c_void_p), ("layers", ctypes.c_uint32), ("chunk_tokens", ctypes.c_uint32),
        ("kv_heads", ctypes.c_uint32), ("head_dim", ctypes.c_uint32), ("dtype", ctypes.c_int),
        ("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
    ]


class dqc_put_chunks_result(ctypes.Structure):
    _fields_ = [("stored", ctypes.c_uint64), ("deduped", ctypes.c_uint64), ("streams_encoded", ctypes.c_uint64)]


_CHUNK_PROTOS = {
    "dqc_lookup": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t,
                                  ctypes.c_uint32, ctypes.POINTER(dqc_lookup_result)]),
    "dqc_put_chunks": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(dqc_put_chunks_args),
                                      ctypes.POINTER(dqc_put_chunks_result)]),
    "dqc_get_chunk": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int,
                                     ctypes.POINTER(dqc_get_result)]),
    "dqc_release_lease": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint64]),
    "dqc_put_on_prefix": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(dqc_put_args), ctypes.c_void_p,
                                         ctypes.c_size_t, ctypes.POINTER(dqc_put_result)]),
    "dqc_delete_chunk": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]),
    "dqc_pin_chunk": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]),
    "dqc_unpin_chunk": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]),
    "dqc_register_model_ex": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(dqc_model_spec), ctypes.c_uint32,
                                             ctypes.POINTER(dqc_model_info), ctypes.POINTER(ctypes.c_uint32)]),
}


_CHUNK_PROTOS.update({
    "dqc_put_raw": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(dqc_put_raw_args), ctypes.POINTER(dqc_put_result)]),
    "dqc_get_chunks_raw": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t,
                                          ctypes.POINTER(dqc_raw_result)]),
    "dqc_put_chunks_raw": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p,
                                          ctypes.c_size_t, ctypes.c_void_p, ctypes.POINTER(dqc_raw_layer),
                                          ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                                          ctypes.POINTER(dqc_put_chunks_result)]),
})

#: The C functions of compressed transfer (PUT_RAW, PUT_CHUNKS_RAW, GET_RAW of chunks); dqc_get_raw
#: is older and always bound.
RAW_SYMBOLS = ("dqc_put_raw", "dqc_put_chunks_raw", "dqc_get_chunks_raw")


def _raw_of(r: dqc_raw_result) -> RawKV:
    """A RawKV copied out of a filled dqc_raw_result (which the caller then frees)."""
    layers = []
    for i in range(r.nlayers):
        x = r.layers[i]
        tb = x.tail_bytes if x.tail_tokens else 0
        layers.append(RawLayer(int(x.layer), int(x.tokens), int(x.windows),
                               ctypes.string_at(x.records, x.records_bytes) if x.records_bytes else b"",
                               int(x.tail_tokens), ctypes.string_at(x.tail_k, tb) if tb else b"",
                               ctypes.string_at(x.tail_v, tb) if tb else b""))
    return RawKV(bytes(r.profile[:r.profile_len]), tuple(layers))


def _raw_layers(raw: RawKV, what: str) -> Tuple[Any, List[Any]]:
    """raw's layers as a dqc_raw_layer array and the buffers it borrows (keep them for the call).
    Only what the C struct cannot say is checked here (the daemon checks the rest)."""
    if not isinstance(raw, RawKV) or not raw.layers:
        raise ValueError(f"{what}: a RawKV with at least one layer is required")
    arr = (dqc_raw_layer * len(raw.layers))()
    keep: List[Any] = []
    for i, x in enumerate(raw.layers):
        if len(x.tail_k) != len(x.tail_v):
            raise ValueError(f"{what}: layer {i}: tail_k has {len(x.tail_k)} bytes, tail_v {len(x.tail_v)}")
        arr[i].layer, arr[i].tokens, arr[i].windows = x.layer, x.tokens, x.windows
        arr[i].records, arr[i].records_bytes = _borrow(x.records, keep), len(x.records)
        arr[i].tail_tokens = x.tail_tokens
        if x.tail_k:
            arr[i].tail_k, arr[i].tail_v = _borrow(x.tail_k, keep), _borrow(x.tail_v, keep)
            arr[i].tail_bytes = len(x.tail_k)
    return arr, keep


def _borrow(data: bytes, keep: List[Any]) -> Optional[int]:
    """The address of data's bytes for a C call that only reads them, without a copy for bytes (a
    bytearray or memoryview is copied once); the object that owns them goes to keep."""
    if not data:
        return None
    b = data if isinstance(data, bytes) else bytes(data)
    p = ctypes.c_char_p(b)
    keep += [b, p]
    return ctypes.cast(p, ctypes.c_void_p).value


def _chunk_fn(name: str, what: str):
    fn = _optional(name, what)
    res, args = _CHUNK_PROTOS[name]
    fn.restype, fn.argtypes = res, args
    return fn


def _keys_buffer(keys: Sequence[bytes], what: str) -> Tuple[Any, int]:
    """Chunk keys (16 bytes each) back to back in one C buffer, and their count."""
    keys = list(keys)
    for i, k in enumerate(keys):
        if not isinstance(k, (bytes, bytearray, memoryview)) or len(k) != CHUNK_KEY_BYTES:
            raise ValueError(f"{what}: key {i} is not {CHUNK_KEY_BYTES} bytes (dquant.chunk_keys makes them)")
    raw = b"".join(bytes(k) for k in keys)
    return ctypes.create_string_buffer(raw, max(1, len(raw))), len(keys)


def _text(value: Union[str, bytes], what: str) -> bytes:
    """A name as the daemon takes it (namespace, model, profile or client name): UTF-8 without NUL.
    A NUL would cut the name short in C (ctypes passes it as a NUL-terminated string) and let it
    alias another, so it is refused here, as the daemon refuses it: ClientError INVALID_ARGUMENT."""
    try:
        b = value.encode() if isinstance(value, str) else bytes(value)
        b.decode()
    except UnicodeError as e:
        raise ClientError(ErrorCode.INVALID_ARGUMENT, what, f"{value!r} is not valid UTF-8 ({e.reason})") from None
    at = b.find(b"\0")
    if at >= 0:
        raise ClientError(ErrorCode.INVALID_ARGUMENT, what,
                          f"{value!r} holds a NUL character at byte {at}; names are UTF-8 without NUL")
    return b


def _ns(ns: Optional[str]) -> Optional[bytes]:
    return _text(ns, "ns") if ns else None


@dataclasses.dataclass(frozen=True)
class LookupResult:
    """What the daemon holds of a prompt's chunks: the first `hits` keys (prompt order; the count
    stops at the first miss), covering hit_tokens = hits * chunk_tokens tokens. keys: those held.
    lease_id: the lease on them (0: none, as without lease_ms or hits), for lease_ms ms."""

    hits: int
    hit_tokens: int
    chunk_tokens: int
    keys: Tuple[bytes, ...] = ()
    lease_id: int = 0
    lease_ms: int = 0


@dataclasses.dataclass(frozen=True)
class PutChunksResult:
    """stored: chunks encoded by this request; deduped: chunks the daemon already held."""

    stored: int
    deduped: int
    streams_encoded: int


@dataclasses.dataclass(frozen=True)
class DevGetResult:
    """What get_dev received: the reply's start_token, tokens, num_layers, kv_heads, head_dim, dtype
    ("f32", "f16", "bf16") and bytes (of K, and of V); k and v: views of the outputs shaped
    [num_layers, tokens, kv_heads, head_dim] for torch outputs, else the outputs as given."""

    start_token: int
    tokens: int
    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: str
    bytes: int
    k: Any
    v: Any
