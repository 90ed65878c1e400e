"""Device arrays for the NCCL data path (libdquant-client-nccl): torch CUDA tensors, or any object
with the CUDA Array Interface (__cuda_array_interface__, version 2 or 3: CuPy, Numba, ...).

A DevArray borrows the memory of its array (device pointer, shape, dq_dtype) for one C call. The
library moves the bytes on a stream of its own, so work still pending on the producer's stream must
be finished first: torch tensors' current stream and an interface's "stream" are synchronized
before the call (ready()). Host arrays are refused: they go through put / get / attend."""

from __future__ import annotations

import ctypes
from typing import Any, Callable, Optional, Tuple

from . import _tensor as T

_CAI_DTYPES = {"<f4": T.F32, "<f2": T.F16}


def is_device_array(x: Any) -> bool:
    """A torch CUDA tensor, or an object exposing __cuda_array_interface__."""
    if T.is_torch(x):
        return x.device.type == "cuda"
    return hasattr(x, "__cuda_array_interface__")


class DevArray:
    """A borrowed view of a contiguous device array: ptr, shape, dtype (dq_dtype), device (torch's
    index, or None when the interface does not say), nbytes; keep holds what must stay alive."""

    def __init__(self, x: Any, what: str, want: Optional[int] = None, writable: bool = False) -> None:
        self.stream: Optional[int] = None
        if T.is_torch(x):
            torch = T._torch()
            if x.device.type != "cuda":
                raise TypeError(f"{what}: a CUDA tensor is required (host tensors go through the socket calls)")
            t = x.detach()
            dt = {torch.float32: T.F32, torch.float16: T.F16, torch.bfloat16: T.BF16}.get(t.dtype)
            if writable:
                if dt is None or (want is not None and dt != want) or not t.is_contiguous():
                    raise ValueError(f"{what}: an output must be a contiguous f32/f16/bf16 CUDA tensor"
                                     f"{'' if want is None else ' of ' + T.DTYPE_NAMES[want]}")
            else:
                if dt is None or (want is not None and dt != want):
                    dt = T.F32 if want is None else want
                    t = t.to({T.F32: torch.float32, T.F16: torch.float16, T.BF16: torch.bfloat16}[dt])
                t = t.contiguous()
            self.keep, self.ptr, self.dtype = t, t.data_ptr(), dt
            self.shape, self.device, self.flavour = tuple(t.shape), t.device.index, "torch"
            return
        cai = getattr(x, "__cuda_array_interface__", None)
        if cai is None:
            raise TypeError(f"{what}: a CUDA tensor or an object with __cuda_array_interface__ is required "
                            "(host arrays go through put / get / attend)")
        dt = _CAI_DTYPES.get(cai.get("typestr"))
        if dt is None or (want is not None and dt != want):
            raise ValueError(f"{what}: __cuda_array_interface__ typestr {cai.get('typestr')!r}; f32 ('<f4') or "
                             f"f16 ('<f2'){'' if want is None else ', ' + T.DTYPE_NAMES[want]} needed")
        shape = tuple(int(s) for s in cai["shape"])
        strides = cai.get("strides")
        if strides is not None:
            expect, step = [], T.DTYPE_SIZES[dt]
            for s in reversed(shape):
                expect.insert(0, step)
                step *= s
            if tuple(strides) != tuple(expect):
                raise ValueError(f"{what}: the device array must be C-contiguous (strides {strides})")
        ptr, readonly = cai["data"]
        if writable and readonly:
            raise ValueError(f"{what}: the output device array is read-only")
        self.keep, self.ptr, self.dtype, self.shape = x, int(ptr or 0), dt, shape
        self.device, self.flavour = None, "cai"
        self.stream = cai.get("stream")

    @property
    def nbytes(self) -> int:
        n = T.DTYPE_SIZES[self.dtype]
        for s in self.shape:
            n *= s
        return n

    def c_void_p(self) -> ctypes.c_void_p:
        return ctypes.c_void_p(self.ptr)


def ready(arrays: Tuple[DevArray, ...], stream_sync: Optional[Callable[[int], int]]) -> None:
    """Finishes the work pending on the streams that produce arrays: torch's current stream of each
    device involved, and every interface's "stream" (through cudaStreamSynchronize, stream_sync)."""
    devices = {a.device for a in arrays if a.flavour == "torch"}
    if devices:
        torch = T._torch()
        for d in devices:
            torch.cuda.current_stream(d).synchronize()
    for s in {a.stream for a in arrays if a.flavour == "cai" and a.stream}:
        if stream_sync is None:
            raise TypeError("__cuda_array_interface__ names a stream, and the CUDA runtime is not reachable")
        # CAI v3: 1 is the legacy default stream, 2 the per-thread one (cudaStreamLegacy / PerThread)
        rc = stream_sync(s)
        if rc:
            raise RuntimeError(f"cudaStreamSynchronize({s:#x}) failed with CUDA error {rc}")
