"""ctypes binding of the few libdquant / libdquant-cuda calls bench_truth.py needs (dquant/codec.h,
dquant/profile.h, dquant/cuda.h). Pointers are plain integers: torch's data_ptr() for device
memory and torch.cuda.current_stream().cuda_stream for the stream, so the library's kernels go to
the caller's stream (and into a CUDA graph being captured there) next to torch's own.

Only the libraries of a build folder are loaded (BUILD/lib/libdquant.so,
BUILD/cuda/libdquant-cuda.so). libdquant-cuda needs libcudart.so.13: import torch first, so that
the process has one CUDA runtime (torch's), which the library then shares.

Errors raise DqError (.code, .name); a failing CUDA call adds dqcu_last_cuda_error()."""

from __future__ import annotations

import ctypes
import pathlib
from typing import Optional

KIND_K, KIND_V = 0, 1
DTYPE_F32, DTYPE_F16, DTYPE_BF16 = 0, 1, 2
KERNEL_AUTO = 0

DQ_PROFILE_NAME_MAX = 32


class DqError(RuntimeError):
    def __init__(self, what: str, code: int, name: str, cuda_error: int = 0):
        msg = f"{what} -> {name} ({code})"
        if cuda_error:
            msg += f", cuda error {cuda_error}"
        super().__init__(msg)
        self.code, self.name, self.cuda_error = code, name, cuda_error


class dq_profile(ctypes.Structure):
    """dquant/profile.h's dq_profile (the fields read here), padded: the library writes the whole
    struct, and the padding leaves room for fields a newer header may append."""
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
        ("_rest", ctypes.c_uint8 * 1024),
    ]


class dqcu_settings(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("attend_kernel", ctypes.c_int),
        ("encode_kernel", ctypes.c_int),
        ("encode_schedule", ctypes.c_int),
        ("hot_kernel", ctypes.c_int),
        ("reserved", ctypes.c_int * 11),
    ]


# dqcu_attn_seq (device memory): windows, tail_k, tail_v (pointers), nwin, tail_tokens (u32).
ATTN_SEQ_BYTES = 32

_P, _I, _U32, _SZ = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_size_t


def lib_path(build: pathlib.Path, sub: str, stem: str) -> pathlib.Path:
    for name in (f"lib{stem}.so", f"lib{stem}.so.0"):
        p = build / sub / name
        if p.exists():
            return p
    raise OSError(f"lib{stem}.so not found in {build / sub} (build it: ninja -C {build})")


class HostLib:
    """libdquant: profiles and host codecs."""

    def __init__(self, build: str):
        self.build = pathlib.Path(build)
        self.dq = ctypes.CDLL(str(lib_path(self.build, "lib", "dquant")))
        d = self.dq
        d.dq_profile_builtin.argtypes = [ctypes.c_char_p, _U32, _U32, ctypes.POINTER(dq_profile)]
        d.dq_profile_builtin.restype = _I
        d.dq_codec_create.argtypes = [ctypes.POINTER(dq_profile), _P, ctypes.POINTER(_P)]
        d.dq_codec_create.restype = _I
        d.dq_codec_free.argtypes = [_P]
        d.dq_codec_free.restype = None
        d.dq_codec_window_bytes.argtypes = [_P]
        d.dq_codec_window_bytes.restype = _SZ
        d.dq_codec_record_bytes.argtypes = [_P, _I]
        d.dq_codec_record_bytes.restype = _SZ
        d.dq_hot_window_bytes.argtypes = [_P]
        d.dq_hot_window_bytes.restype = _SZ
        d.dq_codec_mean_bytes.argtypes = [_P]
        d.dq_codec_mean_bytes.restype = _SZ
        d.dq_workspace_create.argtypes = [_P, ctypes.POINTER(_P)]
        d.dq_workspace_create.restype = _I
        d.dq_workspace_free.argtypes = [_P]
        d.dq_workspace_free.restype = None
        d.dq_tokens_decode.argtypes = [_P, _P, _I, _P, _P, _SZ, _SZ, _P, _I]
        d.dq_tokens_decode.restype = _I
        d.dq_err_name.argtypes = [_I]
        d.dq_err_name.restype = ctypes.c_char_p

    def err_name(self, code: int) -> str:
        return self.dq.dq_err_name(code).decode()

    def check(self, what: str, rc: int, cuda_error: int = 0) -> int:
        if rc < 0:
            raise DqError(what, rc, self.err_name(rc), cuda_error)
        return rc


class HostCodec:
    """A libdquant codec of a built-in profile (owned; free() or let it be collected)."""

    def __init__(self, host: HostLib, profile: str, kv_heads: int, head_dim: int):
        self.host = host
        self.prof = dq_profile()
        host.check(f"dq_profile_builtin({profile})",
                   host.dq.dq_profile_builtin(profile.encode(), kv_heads, head_dim, ctypes.byref(self.prof)))
        h = _P()
        host.check("dq_codec_create", host.dq.dq_codec_create(ctypes.byref(self.prof), None, ctypes.byref(h)))
        self.handle = h
        self.profile = profile
        self.kv_heads, self.head_dim = self.prof.kv_heads, self.prof.head_dim
        self.window = self.prof.window
        self.residual = self.prof.residual
        self.container_bytes = tuple(self.prof.container_bytes)
        self.window_bytes = host.dq.dq_codec_window_bytes(h)
        self.record_bytes = (host.dq.dq_codec_record_bytes(h, KIND_K), host.dq.dq_codec_record_bytes(h, KIND_V))
        self.hot_window_bytes = host.dq.dq_hot_window_bytes(h)  # dquant/hot.h
        self.mean_bytes = host.dq.dq_codec_mean_bytes(h)
        self.ws = None

    def decode_window(self, rec: int, k_out: int, v_out: int) -> None:
        """The window record at host address rec (window_bytes bytes: the key mean, W key records,
        W value records) decoded by dq_tokens_decode: W keys to k_out, W values to v_out (host
        addresses of W x kv_heads x head_dim float32 each)."""
        d = self.host.dq
        if self.ws is None:
            ws = _P()
            self.host.check("dq_workspace_create", d.dq_workspace_create(self.handle, ctypes.byref(ws)))
            self.ws = ws
        rk, rv, W = self.record_bytes[KIND_K], self.record_bytes[KIND_V], self.window
        keys = rec + self.mean_bytes
        self.host.check("dq_tokens_decode K", d.dq_tokens_decode(self.handle, self.ws, KIND_K, rec, keys, rk, W,
                                                                 k_out, DTYPE_F32))
        self.host.check("dq_tokens_decode V", d.dq_tokens_decode(self.handle, self.ws, KIND_V, None, keys + W * rk,
                                                                 rv, W, v_out, DTYPE_F32))

    def free(self) -> None:
        if self.ws:
            self.host.dq.dq_workspace_free(self.ws)
            self.ws = None
        if self.handle:
            self.host.dq.dq_codec_free(self.handle)
            self.handle = None

    def __del__(self):
        try:
            self.free()
        except Exception:
            pass


class CudaLib(HostLib):
    """libdquant and libdquant-cuda."""

    def __init__(self, build: str):
        super().__init__(build)
        self.cu = ctypes.CDLL(str(lib_path(self.build, "cuda", "dquant-cuda")))
        c = self.cu
        c.dqcu_device_count.argtypes = []
        c.dqcu_device_count.restype = _I
        c.dqcu_last_cuda_error.argtypes = []
        c.dqcu_last_cuda_error.restype = _I
        c.dqcu_settings_default.argtypes = [ctypes.POINTER(dqcu_settings)]
        c.dqcu_settings_default.restype = None
        c.dqcu_codec_create_with.argtypes = [_P, ctypes.POINTER(dqcu_settings), ctypes.POINTER(_P)]
        c.dqcu_codec_create_with.restype = _I
        c.dqcu_codec_free.argtypes = [_P]
        c.dqcu_codec_free.restype = None
        c.dqcu_attend_check.argtypes = [_P, _U32]
        c.dqcu_attend_check.restype = _I
        c.dqcu_attend_kernel.argtypes = [_P, _U32]
        c.dqcu_attend_kernel.restype = _I
        c.dqcu_attend_workspace_size.argtypes = [_P, _U32, _U32, _U32]
        c.dqcu_attend_workspace_size.restype = _SZ
        c.dqcu_attend.argtypes = [_P, _U32, ctypes.c_float, _P, _U32, _U32, _P, _P, _P, _P, _SZ, _P]
        c.dqcu_attend.restype = _I
        c.dqcu_encode_windows.argtypes = [_P, _P, _P, _I, _SZ, _P, _P, _P, _P]
        c.dqcu_encode_windows.restype = _I
        c.dqcu_decompress.argtypes = [_P, _I, _P, _SZ, _P, _SZ, _SZ, _SZ, _P, _I, _P, _P]
        c.dqcu_decompress.restype = _I
        c.dqcu_hot_window_bytes.argtypes = [_P]
        c.dqcu_hot_window_bytes.restype = _SZ
        c.dqcu_transcode_hot.argtypes = [_P, _P, _SZ, _P, _P, _P]
        c.dqcu_transcode_hot.restype = _I
        c.dqcu_attend_hot_check.argtypes = [_P, _U32]
        c.dqcu_attend_hot_check.restype = _I
        c.dqcu_attend_hot_kernel.argtypes = [_P, _U32]
        c.dqcu_attend_hot_kernel.restype = _I
        c.dqcu_attend_hot_workspace_size.argtypes = [_P, _U32, _U32, _U32]
        c.dqcu_attend_hot_workspace_size.restype = _SZ
        c.dqcu_attend_hot.argtypes = [_P, _U32, ctypes.c_float, _P, _U32, _U32, _P, _P, _P, _P, _SZ, _P]
        c.dqcu_attend_hot.restype = _I

    def check_cuda(self, what: str, rc: int) -> int:
        if rc < 0:
            raise DqError(what, rc, self.err_name(rc), self.cu.dqcu_last_cuda_error())
        return rc

    def device_count(self) -> int:
        return self.cu.dqcu_device_count()


class DeviceCodec:
    """A dqcu_codec on the current CUDA device, made from a HostCodec (attend_kernel, hot_kernel:
    0 = auto or a version number, dqcu_settings.attend_kernel / hot_kernel)."""

    def __init__(self, lib: CudaLib, hc: HostCodec, attend_kernel: int = KERNEL_AUTO, hot_kernel: int = KERNEL_AUTO):
        self.lib, self.hc = lib, hc
        st = dqcu_settings()
        lib.cu.dqcu_settings_default(ctypes.byref(st))
        st.attend_kernel = attend_kernel
        st.hot_kernel = hot_kernel
        h = _P()
        lib.check_cuda("dqcu_codec_create_with", lib.cu.dqcu_codec_create_with(hc.handle, ctypes.byref(st),
                                                                               ctypes.byref(h)))
        self.handle = h

    def free(self) -> None:
        if self.handle:
            self.lib.cu.dqcu_codec_free(self.handle)
            self.handle = None

    def attend_check(self, q_heads: int) -> int:
        return self.lib.cu.dqcu_attend_check(self.handle, q_heads)

    def attend_kernel(self, q_heads: int) -> int:
        return self.lib.check_cuda("dqcu_attend_kernel", self.lib.cu.dqcu_attend_kernel(self.handle, q_heads))

    def workspace_size(self, q_heads: int, nseq: int, max_tokens: int) -> int:
        return self.lib.cu.dqcu_attend_workspace_size(self.handle, q_heads, nseq, max_tokens)

    def attend(self, q_heads: int, scale: float, seqs: int, nseq: int, max_tokens: int, q: int, out: int,
               lse: Optional[int], ws: int, ws_bytes: int, stream: int) -> None:
        self.lib.check_cuda("dqcu_attend", self.lib.cu.dqcu_attend(
            self.handle, q_heads, scale, seqs, nseq, max_tokens, q, out, lse or None, ws, ws_bytes, stream or None))

    def encode_windows(self, k: int, v: int, dtype: int, nwin: int, windows: int, status: int, stream: int) -> None:
        self.lib.check_cuda("dqcu_encode_windows", self.lib.cu.dqcu_encode_windows(
            self.handle, k, v, dtype, nwin, windows, status, None, stream or None))

    def decompress(self, kind: int, windows: int, nwin: int, tail: Optional[int], tail_tokens: int, first: int,
                   count: int, out: int, dtype: int, stream: int) -> None:
        self.lib.check_cuda("dqcu_decompress", self.lib.cu.dqcu_decompress(
            self.handle, kind, windows, nwin, tail or None, tail_tokens, first, count, out, dtype, None,
            stream or None))

    # the hot layout (dquant/hot.h): windows transcoded to fixed-width codes, attention on them

    def hot_window_bytes(self) -> int:
        return self.lib.cu.dqcu_hot_window_bytes(self.handle)

    def transcode_hot(self, windows: int, nwin: int, hot: int, corrupt: Optional[int], stream: int) -> None:
        self.lib.check_cuda("dqcu_transcode_hot", self.lib.cu.dqcu_transcode_hot(
            self.handle, windows, nwin, hot, corrupt or None, stream or None))

    def attend_hot_check(self, q_heads: int) -> int:
        return self.lib.cu.dqcu_attend_hot_check(self.handle, q_heads)

    def attend_hot_kernel(self, q_heads: int) -> int:
        return self.lib.check_cuda("dqcu_attend_hot_kernel", self.lib.cu.dqcu_attend_hot_kernel(self.handle, q_heads))

    def hot_workspace_size(self, q_heads: int, nseq: int, max_tokens: int) -> int:
        return self.lib.cu.dqcu_attend_hot_workspace_size(self.handle, q_heads, nseq, max_tokens)

    def attend_hot(self, q_heads: int, scale: float, seqs: int, nseq: int, max_tokens: int, q: int, out: int,
                   lse: Optional[int], ws: int, ws_bytes: int, stream: int) -> None:
        self.lib.check_cuda("dqcu_attend_hot", self.lib.cu.dqcu_attend_hot(
            self.handle, q_heads, scale, seqs, nseq, max_tokens, q, out, lse or None, ws, ws_bytes, stream or None))

    def __del__(self):
        try:
            self.free()
        except Exception:
            pass
