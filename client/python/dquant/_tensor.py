"""numpy arrays and torch tensors in and out of the C libraries, both optional.

An input is made C-contiguous on the CPU in a dtype the libraries take (f32, f16, bf16; other
floating types become f32). An output is made in the input's flavour: a numpy array, or a torch
tensor moved back to the input's device.

CUDA tensors take the host path: an input is copied to host memory for the C call, a result is
made on the host and moved to the device of the tensor it follows (the GPU-to-GPU path over NCCL,
libdquant-client-nccl, is Client.put_dev / get_dev / attend_dev: _device.py)."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:  # for the annotations only: neither is needed at run time
    import numpy
    import torch

#: What the binding takes and returns as an array: a numpy array or a torch tensor (CPU or CUDA).
Array = Union["numpy.ndarray", "torch.Tensor"]
#: A dtype: "f32"/"float32", "f16"/"float16"/"half", "bf16"/"bfloat16", a torch or numpy dtype, or a dq_dtype code.
DType = Union[str, int, Any]

try:
    import numpy as _np
except ImportError:  # the non-array parts of the binding work without numpy
    _np = None

# dq_dtype values (dquant/types.h)
F32, F16, BF16 = 0, 1, 2
DTYPE_NAMES = {F32: "f32", F16: "f16", BF16: "bf16"}
DTYPE_SIZES = {F32: 4, F16: 2, BF16: 2}


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


def is_torch(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


class Input:
    """A borrowed view of an input array: ptr, dtype code, shape; keeps the buffer alive."""

    def __init__(self, x, want=None):
        if is_torch(x):
            torch = _torch()
            t = x.detach()
            self.flavour, self.device, self.torch_dtype = "torch", t.device, t.dtype
            if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
                t = t.float()
            if want is not None:
                t = t.to({F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16}[want])
            t = t.contiguous().cpu()
            self.keep = t
            self.ptr = t.data_ptr()
            self.dtype = {torch.float32: F32, torch.float16: F16, torch.bfloat16: BF16}[t.dtype]
            self.shape = tuple(t.shape)
            return
        if _np is None:
            raise TypeError("array arguments need numpy or torch (neither is installed)")
        a = _np.asarray(x)
        self.flavour, self.device, self.torch_dtype = "numpy", None, None
        if want is None:
            want = F16 if a.dtype == _np.float16 else F32
        if want == BF16:
            raise TypeError("numpy has no bfloat16: pass a torch tensor or use f32/f16")
        a = _np.ascontiguousarray(a, dtype=_np.float16 if want == F16 else _np.float32)
        self.keep = a
        self.ptr = a.ctypes.data
        self.dtype = want
        self.shape = tuple(a.shape)

    @property
    def nbytes(self):
        n = DTYPE_SIZES[self.dtype]
        for s in self.shape:
            n *= s
        return n

    def c_void_p(self):
        return ctypes.c_void_p(self.ptr)


class Like:
    """The flavour (and torch device) of an array, without copying it."""

    def __init__(self, x):
        if is_torch(x):
            self.flavour, self.device = "torch", x.device
        else:
            self.flavour, self.device = "numpy", None


def like_of(x):
    """An Input or a Like for x (None: numpy results)."""
    if x is None or isinstance(x, (Input, Like)):
        return x
    return Like(x)


class Output:
    """A new array to be written by C, in the flavour of a reference (an Input, a Like, or any
    array; numpy if None)."""

    def __init__(self, shape, dtype=F32, like=None):
        self.shape, self.dtype = tuple(shape), dtype
        like = like_of(like)
        self.like = like
        if like is not None and like.flavour == "torch":
            torch = _torch()
            tdt = {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16}[dtype]
            self.buf = torch.empty(self.shape, dtype=tdt)
            self.ptr = self.buf.data_ptr()
        else:
            if _np is None:
                raise TypeError("array results need numpy or torch (neither is installed)")
            if dtype == BF16:
                raise TypeError("numpy has no bfloat16: ask for f32 or f16")
            self.buf = _np.empty(self.shape, dtype=_np.float16 if dtype == F16 else _np.float32)
            self.ptr = self.buf.ctypes.data

    def c_void_p(self):
        return ctypes.c_void_p(self.ptr)

    def result(self):
        if self.like is not None and self.like.flavour == "torch" and self.like.device is not None \
                and self.like.device.type != "cpu":
            return self.buf.to(self.like.device)
        return self.buf


def from_buffer(ptr, nbytes, shape, dtype, like=None):
    """Copies nbytes at a C pointer into a new array of shape/dtype (flavour of like)."""
    out = Output(shape, dtype, like)
    ctypes.memmove(out.ptr, ptr, nbytes)
    return out.result()


def parse_dtype(d):
    if d is None:
        return F32
    if isinstance(d, int):
        return d
    s = str(d).replace("torch.", "").replace("numpy.", "")
    table = {"f32": F32, "float32": F32, "float": F32, "f16": F16, "float16": F16, "half": F16, "fp16": F16,
             "bf16": BF16, "bfloat16": BF16}
    if s not in table:
        raise ValueError(f"unsupported dtype {d!r} (f32, f16, bf16)")
    return table[s]
