"""ctypes binding of libdquant-client: a blocking connection to dquantd.

    with Client("unix:/tmp/dquantd.sock") as c:
        c.register_model("m", layers=32, q_heads=32, kv_heads=8, head_dim=128, profile="dq226")
        c.put("req-1", k, v, model="m")              # k, v [layers, tokens, kv_heads, head_dim]
        k2, v2 = c.get("req-1")                      # decompressed, same layout
        out, lse = c.attend("req-1", layer=0, q=q)   # q [q_heads, head_dim]

One Client is one connection: use it from one thread at a time (the C handle's rule). Errors raise
ClientError with the library's code, name and message."""

import ctypes

from . import _lib
from . import _tensor as T

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


class ClientError(RuntimeError):
    """A failed call: .code (negative dq_error), .name ("CONNECTION", ...), and the handle's message."""

    def __init__(self, code, what, detail=""):
        lib = library()
        self.code = code
        self.name = lib.dqc_err_name(code).decode()
        msg = detail or lib.dqc_strerror(code).decode()
        super().__init__(f"{what}: {self.name}: {msg}")


_L = None


def library():
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
        "dqc_last_error": (ctypes.c_char_p, [VP]),
        "dqc_strerror": (ctypes.c_char_p, [I]),
        "dqc_err_name": (ctypes.c_char_p, [I]),
        "dqc_version": (ctypes.c_char_p, []),
        "dqc_server": (I, [VP, P(dqc_server_info)]),
        "dqc_register_model": (I, [VP, P(dqc_model_spec), P(dqc_model_info)]),
        "dqc_put": (I, [VP, P(dqc_put_args), P(dqc_put_result)]),
        "dqc_get": (I, [VP, P(dqc_get_args), P(dqc_get_result)]),
        "dqc_get_result_free": (None, [P(dqc_get_result)]),
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


def version():
    return library().dqc_version().decode()


def _seq(key, ns=None):
    """A dqc_seq and the buffers it borrows (keep them alive for the call)."""
    kb = key.encode() if isinstance(key, str) else bytes(key)
    kbuf = ctypes.create_string_buffer(kb, len(kb) or 1)
    s = dqc_seq()
    s.ns = ns.encode() if ns else None
    s.key = ctypes.cast(kbuf, ctypes.c_void_p)
    s.key_len = len(kb)
    return s, kbuf


class Client:
    """One connection to dquantd (blocking). addr: "unix:/path" or "tcp://host:port"."""

    def __init__(self, addr="unix:/tmp/dquantd.sock", secret=None, timeout_ms=None, client_name="dquant-python",
                 auto_reconnect=True):
        lib = library()
        self._h = ctypes.c_void_p()
        o = dqc_options()
        lib.dqc_options_default(ctypes.byref(o))
        self._name = client_name.encode()
        o.client_name = self._name
        if secret is not None:
            sb = secret.encode() if isinstance(secret, str) else bytes(secret)
            self._secret = ctypes.create_string_buffer(sb, len(sb))
            o.secret = ctypes.cast(self._secret, ctypes.c_void_p)
            o.secret_len = len(sb)
        if timeout_ms is not None:
            o.connect_timeout_ms = o.io_timeout_ms = int(timeout_ms)
        o.auto_reconnect = 1 if auto_reconnect else 0
        err = ctypes.create_string_buffer(512)
        rc = lib.dqc_connect_ex(addr.encode(), ctypes.byref(o), ctypes.byref(self._h), err, len(err))
        if rc:
            self._h = None
            raise ClientError(rc, f"connect {addr}", err.value.decode(errors="replace"))
        self.addr = addr

    def close(self):
        if getattr(self, "_h", None):
            library().dqc_free(self._h)
            self._h = None

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check(self, rc, what):
        if rc:
            detail = library().dqc_last_error(self._h).decode(errors="replace") if self._h else ""
            raise ClientError(rc, what, detail)

    def server(self):
        """The server's HELLO reply as a dict."""
        si = dqc_server_info()
        self._check(library().dqc_server(self._h, ctypes.byref(si)), "server")
        return {"version": si.version, "server_version": si.server_version.decode(), "backend": si.backend.decode(),
                "max_frame_bytes": si.max_frame_bytes, "max_payload_bytes": si.max_payload_bytes,
                "max_batch_items": si.max_batch_items,
                "profiles": [si.profiles[i].value.decode() for i in range(min(si.nprofiles, DQC_INFO_LIST))],
                "features": [si.features[i].value.decode() for i in range(min(si.nfeatures, DQC_INFO_LIST))]}

    def ping(self, data=b""):
        buf = ctypes.create_string_buffer(bytes(data), max(1, len(data)))
        self._check(library().dqc_ping(self._h, buf, len(data)), "ping")

    def register_model(self, name, layers, q_heads, kv_heads, head_dim, profile="dq226"):
        """Registers a model; profile is a built-in name or a dquant.codec.Profile (sent serialized).
        Returns {"existed", "bits_per_value", "profile" (serialized bytes the server uses)}."""
        spec = dqc_model_spec()
        nb = name.encode()
        spec.name, spec.layers, spec.q_heads, spec.kv_heads, spec.head_dim = nb, layers, q_heads, kv_heads, head_dim
        keep = None
        if isinstance(profile, str):
            pb = profile.encode()
            spec.profile_name = pb
        else:
            ser = profile.serialize()
            keep = ctypes.create_string_buffer(ser, len(ser))
            spec.profile, spec.profile_len = ctypes.cast(keep, ctypes.c_void_p), len(ser)
        info = dqc_model_info()
        self._check(library().dqc_register_model(self._h, ctypes.byref(spec), ctypes.byref(info)), "register_model")
        del keep
        return {"existed": bool(info.existed), "bits_per_value": info.bits_per_value,
                "profile": bytes(info.profile[:info.profile_len])}

    def put(self, key, k, v, model, start_token=0, first_layer=0, ns=None):
        """Appends k and v ([num_layers, tokens, kv_heads, head_dim], f32/f16/bf16) to layers
        [first_layer, first_layer + num_layers) of sequence key at start_token. Returns a dict."""
        kin = T.Input(k)
        vin = T.Input(v, want=kin.dtype)
        if len(kin.shape) != 4 or vin.shape != kin.shape:
            raise ValueError(f"put: k {kin.shape} and v {vin.shape} must both be [layers, tokens, kv_heads, head_dim]")
        a = dqc_put_args()
        a.seq, kbuf = _seq(key, ns)
        mb = model.encode()
        a.model, a.start_token, a.first_layer = mb, start_token, first_layer
        a.num_layers, a.tokens, a.kv_heads, a.head_dim = kin.shape
        a.dtype, a.k, a.v = kin.dtype, kin.ptr, vin.ptr
        r = dqc_put_result()
        self._check(library().dqc_put(self._h, ctypes.byref(a), ctypes.byref(r)), "put")
        del kbuf
        return {"tokens": r.tokens, "stored_bytes": r.stored_bytes, "streams_encoded": r.streams_encoded,
                "retries": r.retries}

    def get(self, key, first_layer=0, num_layers=0, start_token=0, tokens=0, dtype="f32", ns=None, like=None):
        """Decompressed K and V ([num_layers, tokens, kv_heads, head_dim] of dtype; numpy, or torch when
        like is a torch tensor). num_layers / tokens 0: to the end."""
        a = dqc_get_args()
        a.seq, kbuf = _seq(key, ns)
        a.first_layer, a.num_layers, a.start_token, a.tokens = first_layer, num_layers, start_token, tokens
        a.dtype = T.parse_dtype(dtype)
        r = dqc_get_result()
        lib = library()
        try:
            self._check(lib.dqc_get(self._h, ctypes.byref(a), ctypes.byref(r)), "get")
            shape = (r.num_layers, r.tokens, r.kv_heads, r.head_dim)
            ref = T.Input(like) if like is not None else None
            k = T.from_buffer(r.k, r.bytes, shape, r.dtype, ref)
            v = T.from_buffer(r.v, r.bytes, shape, r.dtype, ref)
        finally:
            lib.dqc_get_result_free(ctypes.byref(r))
        del kbuf
        return k, v

    def attend(self, key, layer, q, scale=0.0, append_k=None, append_v=None, ns=None, kv_heads=0):
        """Decode attention of query q ([q_heads, head_dim]) over one sequence's layer on the server,
        optionally appending the new token's K/V ([1, kv_heads, head_dim]) first. Returns
        (out [q_heads, head_dim] f32, lse [q_heads] f32). For batches use attend_batch."""
        items = [(key, layer, q, append_k, append_v)]
        out, lse = self.attend_batch(items, scale=scale, ns=ns, kv_heads=kv_heads)
        return out[0], lse[0]

    def attend_batch(self, items, scale=0.0, ns=None, kv_heads=0):
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
        self._check(library().dqc_attend(self._h, ctypes.byref(a), out.c_void_p(), lse.c_void_p()), "attend")
        return out.result(), lse.result()

    def delete(self, key, ns=None):
        s, kbuf = _seq(key, ns)
        self._check(library().dqc_delete(self._h, ctypes.byref(s)), "delete")

    def pin(self, key, ns=None):
        s, kbuf = _seq(key, ns)
        self._check(library().dqc_pin(self._h, ctypes.byref(s)), "pin")

    def unpin(self, key, ns=None):
        s, kbuf = _seq(key, ns)
        self._check(library().dqc_unpin(self._h, ctypes.byref(s)), "unpin")

    def stats(self):
        """The daemon's counters and gauges: {"counters": {name: int}, "gauges": {name: float}}."""
        r = dqc_stats_result()
        lib = library()
        try:
            self._check(lib.dqc_stats(self._h, ctypes.byref(r)), "stats")
            counters = {r.counters[i].name.decode(): r.counters[i].value for i in range(r.ncounters)}
            gauges = {r.gauges[i].name.decode(): r.gauges[i].value for i in range(r.ngauges)}
        finally:
            lib.dqc_stats_result_free(ctypes.byref(r))
        return {"counters": counters, "gauges": gauges}
