"""dquant: Python binding of libdquant (the D-Quant KV-cache codec and its baselines) and of
libdquant-client (the dquantd daemon's client), over ctypes.

    import dquant
    xhat, stats = dquant.roundtrip(k, "dq226", kind="k")   # k: [tokens, kv_heads, head_dim]
    with dquant.Client("unix:/tmp/dquantd.sock") as c: ...
    with dquant.Cluster(["tcp://10.0.0.1:7733", "tcp://10.0.0.2:7733"], replicas=2) as c: ...   # many daemons
    keys = dquant.chunk_keys("ns", token_ids, 256)         # the shared KV tier's chunk keys
    raw = dquant.RawKV.encode(k, v, profile)               # records PUT_RAW stores as they are
    p, calib = dquant.kvq.calibrate(dquant.kvq.profile("pq16x8", 8, 128), k4, v4)   # KVQuant++ codecs

The libraries are found through $DQUANT_LIB_DIR, next to this package, in the build folders of the
source tree it sits in, or where `meson install` puts them (see README.md). Arrays are numpy arrays
or torch tensors; neither is needed to import the package or to use profiles and the client's
non-tensor calls. Failures raise DquantError (ClientError from the daemon client) carrying .code,
.name and the message."""

from ._errors import ClientError, DquantError, ErrorCode, UnsupportedError, error_name
from .client import CHUNK_KEY_BYTES, Client, LookupResult, PutChunksResult, chunk_keys, has_symbols
from .client import version as client_version
from .cluster import Cluster
from .codec import KIND_K, KIND_V, Codec, Layer, Profile, baseline_names, builtin_names, roundtrip
from .raw import RawKV, RawLayer
from . import kvq

__all__ = ["KIND_K", "KIND_V", "Codec", "Layer", "Profile", "baseline_names", "builtin_names", "roundtrip",
           "Client", "Cluster", "LookupResult", "PutChunksResult", "RawKV", "RawLayer", "chunk_keys", "CHUNK_KEY_BYTES",
           "has_symbols", "client_version", "kvq", "DquantError", "ClientError", "UnsupportedError", "ErrorCode", "error_name"]
__version__ = "0.1.0"
