"""ctypes binding of dqc_cluster (dquant/client.h, "multi-node"): many dquantd as one handle.

    with dquant.Cluster(["tcp://10.0.0.1:7733", "tcp://10.0.0.2:7733", "tcp://10.0.0.3:7733"],
                        replicas=2, write_quorum=1) as c:
        c.register_model("m", layers=32, q_heads=32, kv_heads=8, head_dim=128)   # on every member
        c.put("req-1", k, v, model="m")                  # on the key's 2 members
        k2, v2 = c.get("req-1")                          # from the first that has it
        keys = dquant.chunk_keys("ns", tokens, 256)
        hit = c.lookup(keys, model="m", ns="ns")         # the prompt's tree: placed by keys[0]
        c.put_chunks(keys[hit.hits:], k_rest, v_rest, model="m", ns="ns", prefix=keys[:hit.hits])

Members: a list of addresses, one comma-separated string, "srv:NAME" (SRV records) or
"dns:NAME:PORT" (A/AAAA records of a Kubernetes headless Service; dns_server picks the DNS server).
Keys are placed by rendezvous hashing: sequences by (ns, key), chunks by the first chunk of their
prompt, so the chunk calls take that root (lookup: keys[0]; put_chunks: the keys before its own as
prefix; get_chunk / get_chunks / delete_chunk: root=, default the first key). Every other call is
Client's, with the same arguments and results. A Cluster is used from one thread at a time."""

from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _tensor as T
from .client import (CHUNK_KEY_BYTES, Client, Key, PutChunksResult, RawKV, _error, _keys_buffer, _ns, _raw_layers,
                     _raw_of, _seq, dqc_get_result, dqc_options, dqc_put_chunks_args, dqc_put_chunks_result,
                     dqc_raw_result, dqc_stats_result, library)
from ._errors import ClientError, ErrorCode, UnsupportedError
from ._tensor import Array, DType

__all__ = ["Cluster", "dqc_cluster_options", "dqc_cluster_member_info", "dqc_cluster_stats"]

DQC_MEMBER_ID_MAX = 256


class dqc_cluster_options(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32), ("node", dqc_options), ("replicas", ctypes.c_uint32),
        ("write_quorum", ctypes.c_uint32), ("read_spares", ctypes.c_uint32), ("down_backoff_ms", ctypes.c_uint32),
        ("down_backoff_max_ms", ctypes.c_uint32), ("dns_refresh_ms", ctypes.c_uint32),
        ("dns_server", ctypes.c_char_p), ("connect_now", ctypes.c_int), ("repair", ctypes.c_int),
    ]


class dqc_cluster_member_info(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_char * DQC_MEMBER_ID_MAX), ("addr", ctypes.c_char * DQC_MEMBER_ID_MAX), ("up", ctypes.c_int),
        ("retry_in_ms", ctypes.c_uint32), ("connected", ctypes.c_int), ("requests", ctypes.c_uint64),
        ("failures", ctypes.c_uint64),
    ]


class dqc_cluster_stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("failovers", "marked_down", "degraded_writes", "repairs",
                                                "repaired_chunks", "dns_refreshes", "dns_failures",
                                                "member_changes")]


# dqc_cluster_X of the routed calls: the dqc_X declaration with the cluster handle in its place.
_SAME_AS = {
    "dqc_register_model_ex": "dqc_cluster_register_model",
    "dqc_register_model_calibrated": "dqc_cluster_register_model_calibrated", "dqc_put": "dqc_cluster_put",
    "dqc_put_on_prefix": "dqc_cluster_put_on_prefix", "dqc_put_raw": "dqc_cluster_put_raw",
    "dqc_get": "dqc_cluster_get", "dqc_get_raw": "dqc_cluster_get_raw", "dqc_attend": "dqc_cluster_attend",
    "dqc_delete": "dqc_cluster_delete", "dqc_pin": "dqc_cluster_pin", "dqc_unpin": "dqc_cluster_unpin",
    "dqc_lookup": "dqc_cluster_lookup", "dqc_release_lease": "dqc_cluster_release_lease",
}

_VP, _SZ, _I, _P = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.POINTER
_PROTOS = {
    "dqc_cluster_options_default": (None, [_P(dqc_cluster_options)]),
    "dqc_cluster_create": (_I, [ctypes.c_char_p, _P(dqc_cluster_options), _P(_VP), ctypes.c_char_p, _SZ]),
    "dqc_cluster_free": (None, [_VP]),
    "dqc_cluster_last_error": (ctypes.c_char_p, [_VP]),
    "dqc_cluster_set_members": (_I, [_VP, ctypes.c_char_p]),
    "dqc_cluster_refresh": (_I, [_VP]),
    "dqc_cluster_size": (_SZ, [_VP]),
    "dqc_cluster_member": (_I, [_VP, _SZ, _P(dqc_cluster_member_info)]),
    "dqc_cluster_client": (_VP, [_VP, _SZ]),
    "dqc_cluster_locate": (_SZ, [_VP, _VP, _P(_SZ), _SZ]),
    "dqc_cluster_locate_chunks": (_SZ, [_VP, ctypes.c_char_p, _VP, _P(_SZ), _SZ]),
    "dqc_cluster_get_stats": (_I, [_VP, _P(dqc_cluster_stats)]),
    "dqc_cluster_put_chunks": (_I, [_VP, _P(dqc_put_chunks_args), _VP, _SZ, _P(dqc_put_chunks_result)]),
    "dqc_cluster_put_chunks_raw": (_I, [_VP, ctypes.c_char_p, ctypes.c_char_p, _VP, _SZ, _VP, _SZ, _VP, _SZ, _VP,
                                        _SZ, _P(dqc_put_chunks_result)]),
    "dqc_cluster_get_chunks": (_I, [_VP, ctypes.c_char_p, _VP, _VP, _SZ, _I, _P(dqc_get_result)]),
    "dqc_cluster_get_chunks_raw": (_I, [_VP, ctypes.c_char_p, _VP, _VP, _SZ, _P(dqc_raw_result)]),
    "dqc_cluster_delete_chunk": (_I, [_VP, ctypes.c_char_p, _VP, _VP]),
    "dqc_cluster_pin_chunk": (_I, [_VP, ctypes.c_char_p, _VP, _VP]),
    "dqc_cluster_unpin_chunk": (_I, [_VP, ctypes.c_char_p, _VP, _VP]),
}


def _fn(name: str):
    lib = library()
    if not hasattr(lib, name):
        raise UnsupportedError("cluster", f"libdquant-client has no {name} (a library older than dqc_cluster)")
    fn = getattr(lib, name)
    if name in _PROTOS:
        fn.restype, fn.argtypes = _PROTOS[name]
    return fn


def _root(root: Optional[bytes], first: bytes, what: str) -> ctypes.Array:
    r = first if root is None else bytes(root)
    if len(r) != CHUNK_KEY_BYTES:
        raise ValueError(f"{what}: a chunk key (root) is {CHUNK_KEY_BYTES} bytes, not {len(r)}")
    return ctypes.create_string_buffer(r, CHUNK_KEY_BYTES)


class Cluster(Client):
    """Many dquantd as one handle (dqc_cluster): keys placed by rendezvous hashing on `replicas`
    members, writes acknowledged by `write_quorum` of them, reads from the first member that has
    the key. Raises ClientError like Client (CONNECTION when no member answers)."""

    def __init__(self, members: Union[str, Sequence[str]], replicas: int = 1, write_quorum: int = 0,
                 read_spares: int = 1, dns_server: Optional[str] = None, dns_refresh_ms: Optional[int] = None,
                 secret: Union[str, bytes, None] = None, connect_timeout_ms: Optional[int] = None,
                 io_timeout_ms: Optional[int] = None, down_backoff_ms: Optional[int] = None,
                 client_name: str = "dquant-python", connect_now: bool = True, repair: bool = True) -> None:
        """members: addresses (a list, or one comma-separated string), "srv:NAME" or "dns:NAME:PORT".
        write_quorum 0: replicas. Timeouts default to the library's cluster defaults (connect 1 s,
        I/O 10 s): a dead member is skipped after a refused or timed-out connect, a hung one after
        the I/O timeout."""
        self._h = None
        spec = members if isinstance(members, str) else ",".join(members)
        o = dqc_cluster_options()
        _fn("dqc_cluster_options_default")(ctypes.byref(o))
        o.replicas, o.write_quorum, o.read_spares = int(replicas), int(write_quorum), int(read_spares)
        self._keep: List[Any] = []
        if dns_server is not None:
            self._keep.append(dns_server.encode())
            o.dns_server = self._keep[-1]
        if dns_refresh_ms is not None:
            o.dns_refresh_ms = int(dns_refresh_ms)
        if down_backoff_ms is not None:
            o.down_backoff_ms = int(down_backoff_ms)
            o.down_backoff_max_ms = max(o.down_backoff_max_ms, o.down_backoff_ms)
        if connect_timeout_ms is not None:
            o.node.connect_timeout_ms = int(connect_timeout_ms)
        if io_timeout_ms is not None:
            o.node.io_timeout_ms = int(io_timeout_ms)
        self._keep.append(client_name.encode())
        o.node.client_name = self._keep[-1]
        if secret is not None:
            sb = secret.encode() if isinstance(secret, str) else bytes(secret)
            self._keep.append(ctypes.create_string_buffer(sb, len(sb)))
            o.node.secret, o.node.secret_len = ctypes.cast(self._keep[-1], ctypes.c_void_p), len(sb)
        o.connect_now, o.repair = int(bool(connect_now)), int(bool(repair))
        h = ctypes.c_void_p()
        err = ctypes.create_string_buffer(512)
        rc = _fn("dqc_cluster_create")(spec.encode(), ctypes.byref(o), ctypes.byref(h), err, len(err))
        if rc:
            raise _error(rc, f"cluster {spec}", err.value.decode(errors="replace"))
        self._h = h
        self.addr = spec

    def close(self) -> None:
        """Closes every member's connection (again: nothing)."""
        if getattr(self, "_h", None):
            _fn("dqc_cluster_free")(self._h)
            self._h = None

    __del__ = close

    def __repr__(self) -> str:
        return f"Cluster({getattr(self, 'addr', '?')!r}{', closed' if self.closed else ''})"

    def _check(self, rc: int, what: str) -> None:
        if rc:
            detail = _fn("dqc_cluster_last_error")(self._h).decode(errors="replace") if self._h else ""
            raise _error(rc, what, detail)

    def _route(self, name: str, what: str):
        cname = _SAME_AS.get(name)
        if cname is None:
            raise UnsupportedError(what, f"{what} is not a call of the multi-node client")
        base = super()._route(name, what)     # declares the dqc_ prototype
        fn = _fn(cname)
        if fn.argtypes is None:
            fn.restype, fn.argtypes = base.restype, list(base.argtypes)
        return fn

    # ---- membership ----

    def members(self) -> List[Dict[str, Any]]:
        """Each member: {"id" (what placement hashes), "addr", "up", "retry_in_ms", "connected",
        "requests", "failures"}; the order is not placement's."""
        out = []
        for i in range(int(_fn("dqc_cluster_size")(self.handle))):
            mi = dqc_cluster_member_info()
            self._check(_fn("dqc_cluster_member")(self.handle, i, ctypes.byref(mi)), "members")
            out.append({"id": mi.id.decode(), "addr": mi.addr.decode(), "up": bool(mi.up),
                        "retry_in_ms": int(mi.retry_in_ms), "connected": bool(mi.connected),
                        "requests": int(mi.requests), "failures": int(mi.failures)})
        return out

    def set_members(self, members: Union[str, Sequence[str]]) -> None:
        """Replaces the members (members that stay keep their connection and state)."""
        spec = members if isinstance(members, str) else ",".join(members)
        self._check(_fn("dqc_cluster_set_members")(self.handle, spec.encode()), "set_members")

    def refresh(self) -> None:
        """Resolves DNS members now (nothing for a list)."""
        self._check(_fn("dqc_cluster_refresh")(self.handle), "refresh")

    def locate(self, key: Key, ns: Optional[str] = None, n: int = 0) -> List[str]:
        """The ids of the members a sequence is placed on, best first (n 0: every member)."""
        s, kbuf = _seq(key, ns)
        return self._ids(lambda out, cap: _fn("dqc_cluster_locate")(self.handle, ctypes.byref(s), out, cap), n)

    def locate_chunks(self, root: bytes, ns: Optional[str] = None, n: int = 0) -> List[str]:
        """The ids of the members a prompt tree (its first chunk's key) is placed on, best first."""
        rb = _root(root, b"", "locate_chunks")
        return self._ids(lambda out, cap: _fn("dqc_cluster_locate_chunks")(self.handle, _ns(ns), rb, out, cap), n)

    def _ids(self, call, n: int) -> List[str]:
        size = int(_fn("dqc_cluster_size")(self.handle))
        cap = size if n <= 0 else min(n, size)
        out = (ctypes.c_size_t * max(1, cap))()
        got = call(out, cap)
        members = self.members()
        return [members[out[i]]["id"] for i in range(got)]

    def cluster_stats(self) -> Dict[str, int]:
        """What this handle did: failovers, marked_down, degraded_writes, repairs, repaired_chunks,
        dns_refreshes, dns_failures, member_changes."""
        st = dqc_cluster_stats()
        self._check(_fn("dqc_cluster_get_stats")(self.handle, ctypes.byref(st)), "cluster_stats")
        return {name: int(getattr(st, name)) for name, _ in dqc_cluster_stats._fields_}

    def stats(self) -> Dict[str, Dict[str, Dict[str, Union[int, float]]]]:
        """Each reachable member's STATS, by member id (as Client.stats)."""
        lib = library()
        out = {}
        for i, m in enumerate(self.members()):
            c = _fn("dqc_cluster_client")(self.handle, i)
            if not c:
                continue
            r = dqc_stats_result()
            try:
                if lib.dqc_stats(c, ctypes.byref(r)) == 0:
                    out[m["id"]] = {
                        "counters": {r.counters[j].name.decode(): r.counters[j].value for j in range(r.ncounters)},
                        "gauges": {r.gauges[j].name.decode(): r.gauges[j].value for j in range(r.ngauges)}}
            finally:
                lib.dqc_stats_result_free(ctypes.byref(r))
        return out

    def ping(self, data: bytes = b"") -> None:
        """PING every member that is up; ClientError CONNECTION when none answers."""
        buf = ctypes.create_string_buffer(bytes(data), max(1, len(data)))
        answered = 0
        for i, m in enumerate(self.members()):
            c = _fn("dqc_cluster_client")(self.handle, i) if m["up"] else None
            answered += bool(c) and library().dqc_ping(c, buf, len(data)) == 0
        if not answered:
            raise ClientError(ErrorCode.CONNECTION, "ping", "no member answered")

    @property
    def reconnects(self) -> int:
        raise UnsupportedError("reconnects", "a Cluster reconnects per member: see members()")

    def server(self) -> Dict[str, Any]:
        raise UnsupportedError("server", "a Cluster has many servers: see members() and stats()")

    def nccl_setup(self, device: int = 0) -> None:
        raise UnsupportedError("nccl_setup", "the NCCL data path is per daemon: use a Client")

    # ---- the shared KV tier: placement by the prompt's first chunk ----

    def put_chunks(self, keys: Sequence[bytes], k: Array, v: Array, model: str, ns: Optional[str] = None,
                   parent: Optional[bytes] = None, prefix: Sequence[bytes] = ()) -> PutChunksResult:
        """Client.put_chunks where prefix is the keys of the prompt's chunks before keys[0], from its
        first (they place the tree; parent, if given, must be the last of them)."""
        prefix = list(prefix)
        if parent is not None and (not prefix or bytes(parent) != bytes(prefix[-1])):
            raise ValueError("put_chunks: pass the keys before keys[0] as prefix (parent must be the last of them)")
        buf, n = _keys_buffer(keys, "put_chunks")
        pbuf, npre = _keys_buffer(prefix, "put_chunks") if prefix else (None, 0)
        kin = T.Input(k)
        vin = T.Input(v, want=kin.dtype)
        if len(kin.shape) != 4 or vin.shape != kin.shape:
            raise ValueError(f"put_chunks: k {kin.shape} and v {vin.shape} must both be "
                             "[layers, tokens, kv_heads, head_dim]")
        if n == 0 or kin.shape[1] % n:
            raise ValueError(f"put_chunks: {kin.shape[1]} tokens are not {n} whole chunks")
        a = dqc_put_chunks_args()
        nsb, mb = _ns(ns), model.encode()
        a.ns, a.model = nsb, mb
        a.keys, a.nkeys = ctypes.cast(buf, ctypes.c_void_p), n
        a.layers, a.kv_heads, a.head_dim = kin.shape[0], kin.shape[2], kin.shape[3]
        a.chunk_tokens = kin.shape[1] // n
        a.dtype, a.k, a.v = kin.dtype, kin.ptr, vin.ptr
        r = dqc_put_chunks_result()
        self._check(_fn("dqc_cluster_put_chunks")(self.handle, ctypes.byref(a), pbuf, npre, ctypes.byref(r)),
                    "put_chunks")
        return PutChunksResult(int(r.stored), int(r.deduped), int(r.streams_encoded))

    def put_chunks_raw(self, keys: Sequence[bytes], raw: RawKV, model: str, ns: Optional[str] = None,
                       parent: Optional[bytes] = None, prefix: Sequence[bytes] = ()) -> PutChunksResult:
        """Client.put_chunks_raw with prefix as for put_chunks."""
        prefix = list(prefix)
        if parent is not None and (not prefix or bytes(parent) != bytes(prefix[-1])):
            raise ValueError("put_chunks_raw: pass the keys before keys[0] as prefix")
        buf, n = _keys_buffer(keys, "put_chunks_raw")
        if n == 0:
            raise ValueError("put_chunks_raw: no keys")
        pbuf, npre = _keys_buffer(prefix, "put_chunks_raw") if prefix else (None, 0)
        layers, keep = _raw_layers(raw, "put_chunks_raw")
        prof = ctypes.create_string_buffer(bytes(raw.profile), max(1, len(raw.profile)))
        r = dqc_put_chunks_result()
        self._check(_fn("dqc_cluster_put_chunks_raw")(self.handle, _ns(ns), model.encode(), pbuf, npre, buf, n, layers,
                                                      len(raw.layers), prof, len(raw.profile), ctypes.byref(r)),
                    "put_chunks_raw")
        del keep
        return PutChunksResult(int(r.stored), int(r.deduped), int(r.streams_encoded))

    def get_chunks(self, keys: Sequence[bytes], ns: Optional[str] = None, dtype: DType = "f32",
                   like: Optional[Array] = None, root: Optional[bytes] = None) -> Tuple[Array, Array]:
        """Chunks decompressed and concatenated (one GET): [layers, len(keys) * chunk_tokens, kv_heads,
        head_dim]. root: the prompt's first chunk key (None: keys[0])."""
        keys = list(keys)
        if not keys:
            raise ValueError("get_chunks: no keys")
        buf, n = _keys_buffer(keys, "get_chunks")
        rb = _root(root, keys[0], "get_chunks")
        r = dqc_get_result()
        lib = library()
        try:
            self._check(_fn("dqc_cluster_get_chunks")(self.handle, _ns(ns), rb, buf, n, T.parse_dtype(dtype),
                                                      ctypes.byref(r)), "get_chunks")
            shape = (r.num_layers, r.tokens, r.kv_heads, r.head_dim)
            return (T.from_buffer(r.k, r.bytes, shape, r.dtype, like), T.from_buffer(r.v, r.bytes, shape, r.dtype, like))
        finally:
            lib.dqc_get_result_free(ctypes.byref(r))

    def get_chunk(self, key: bytes, ns: Optional[str] = None, dtype: DType = "f32", like: Optional[Array] = None,
                  root: Optional[bytes] = None) -> Tuple[Array, Array]:
        """One chunk decompressed; root: its prompt's first chunk key (None: the key itself)."""
        return self.get_chunks([key], ns=ns, dtype=dtype, like=like, root=root)

    def get_chunks_raw(self, keys: Sequence[bytes], ns: Optional[str] = None, root: Optional[bytes] = None) -> RawKV:
        keys = list(keys)
        if not keys:
            raise ValueError("get_chunks_raw: no keys")
        buf, n = _keys_buffer(keys, "get_chunks_raw")
        rb = _root(root, keys[0], "get_chunks_raw")
        r = dqc_raw_result()
        lib = library()
        try:
            self._check(_fn("dqc_cluster_get_chunks_raw")(self.handle, _ns(ns), rb, buf, n, ctypes.byref(r)),
                        "get_chunks_raw")
            return _raw_of(r)
        finally:
            lib.dqc_raw_result_free(ctypes.byref(r))

    def delete_chunk(self, key: bytes, ns: Optional[str] = None, root: Optional[bytes] = None) -> None:
        self._tree_call("dqc_cluster_delete_chunk", "delete_chunk", key, ns, root)

    def pin_chunk(self, key: bytes, ns: Optional[str] = None, root: Optional[bytes] = None) -> None:
        self._tree_call("dqc_cluster_pin_chunk", "pin_chunk", key, ns, root)

    def unpin_chunk(self, key: bytes, ns: Optional[str] = None, root: Optional[bytes] = None) -> None:
        self._tree_call("dqc_cluster_unpin_chunk", "unpin_chunk", key, ns, root)

    def _tree_call(self, name: str, what: str, key: bytes, ns: Optional[str], root: Optional[bytes]) -> None:
        kb = _root(key, b"", what)
        rb = _root(root, bytes(key), what)
        self._check(_fn(name)(self.handle, _ns(ns), rb, kb), what)
