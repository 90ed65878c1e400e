"""dquant: Python binding of libdquant (the D-Quant KV-cache codec and its baselines) and of
libdquant-client (the dquantd daemon's client), over ctypes.

    import dquant
    xhat, stats = dquant.roundtrip(k, "dq226", kind="k")   # k: [tokens, kv_heads, head_dim]
    with dquant.Client("unix:/tmp/dquantd.sock") as c: ...

The libraries are found through $DQUANT_LIB_DIR, next to this package, or in the build folders of
the source tree (see README.md). Arrays are numpy arrays or torch tensors; neither is needed to
import the package or to use profiles and the client's non-tensor calls."""

from .codec import (KIND_K, KIND_V, Codec, DquantError, Layer, Profile, baseline_names, builtin_names,
                    roundtrip)
from .client import Client, ClientError
from .client import version as client_version

__all__ = ["KIND_K", "KIND_V", "Codec", "DquantError", "Layer", "Profile", "baseline_names", "builtin_names",
           "roundtrip", "Client", "ClientError", "client_version"]
__version__ = "0.1.0"
