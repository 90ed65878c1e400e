"""The NCCL data path from Python: Client.nccl_setup, put_dev, get_dev, attend_dev.

Without a GPU (CI): a child Python loads libdquant-client-fakenccl (tests/python/meson.build:
libdquant-client and libdquant-client-nccl built against the CPU emulation of CUDA and NCCL,
tests/daemon/fakecuda) as both libraries and talks to dquantd-fakenccl on its cuda backend; its
device buffers come from the emulation's cudaMalloc, which is what the emulation accepts as device
memory, and reach the binding through __cuda_array_interface__. The bytes cross a real (emulated)
two-rank NCCL communicator, so the checks compare the NCCL path with the socket path byte for byte.
On a host with two GPUs, torch and a dquantd built with CUDA and NCCL ($DQUANTD_CUDA), the same
comparisons run with torch CUDA tensors. Where libdquant-client-nccl is built, its refusals against
the CPU backend are checked in-process."""

import ctypes
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import unittest

import dquant
from dqtest import Daemon, DaemonTest, need_numpy, np, torch

L, QH, KVH, HD = 2, 4, 2, 64
CHILD_ENV = "DQ_PY_FAKENCCL_CHILD"


class TestNcclCpuDaemon(DaemonTest):
    """libdquant-client-nccl in this process (where it is built) against the CPU backend."""

    def setUp(self):
        need_numpy()
        if not dquant.client.has_nccl():
            self.skipTest("libdquant-client-nccl is not built here (no NCCL); the fake-NCCL test covers the path")
        self.c = self.daemon.client()

    def tearDown(self):
        self.c.close()

    def test_refusals(self):
        self.assertNotIn("nccl", self.c.server()["features"])
        with self.assertRaises(dquant.ClientError) as cm:
            self.c.nccl_setup(0)
        self.assertEqual(cm.exception.code, dquant.ErrorCode.UNSUPPORTED)
        self.assertIn("does not offer NCCL", cm.exception.message)
        buf = FakePointer((1, 1, KVH, HD))                         # never read: refused first
        with self.assertRaises(dquant.ClientError) as cm:
            self.c.put_dev("x", buf, buf, model="m")
        self.assertEqual(cm.exception.code, dquant.ErrorCode.IO)
        self.assertIn("NCCL not set up", cm.exception.message)
        self.c.ping(b"still")                                     # the socket path is untouched
        self.assertEqual(self.c.reconnects, 0)


class FakePointer:
    """A __cuda_array_interface__ with a pointer no call may dereference (the calls refuse first)."""

    def __init__(self, shape, typestr="<f4"):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (8, False), "version": 3,
                                         "strides": None}


class TestNcclFake(unittest.TestCase):
    """Runs FakeNcclChecks in a child Python whose libdquant-client is the emulated one."""

    def test_fake_nccl_child(self):
        need_numpy()
        if os.environ.get(CHILD_ENV):
            self.skipTest("this is the child")
        lib, daemon = os.environ.get("DQUANT_FAKENCCL_LIB"), os.environ.get("DQUANTD_FAKENCCL")
        if not lib or not daemon or not os.path.isfile(lib) or not os.access(daemon, os.X_OK):
            self.skipTest("DQUANT_FAKENCCL_LIB and DQUANTD_FAKENCCL not set (meson test sets them)")
        with tempfile.TemporaryDirectory(prefix="dquant-fakenccl-") as d:
            for name in ("libdquant-client.so", "libdquant-client-nccl.so"):
                os.symlink(lib, os.path.join(d, name))            # one library: one handle for both
            libs = os.environ.get("DQUANT_LIB_DIR", "")
            env = dict(os.environ, DQUANT_LIB_DIR=d + os.pathsep + libs)
            # the links' $ORIGIN is d: libdquant.so.0, which the library needs, by the loader's path
            env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [libs, os.environ.get("LD_LIBRARY_PATH")]))
            env[CHILD_ENV] = "1"
            r = subprocess.run([sys.executable, "-m", "unittest", "-v", "test_nccl"], cwd=pathlib.Path(__file__).parent,
                               env=env, capture_output=True, text=True, timeout=240)
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, f"the fake-NCCL child failed (exit {r.returncode}; 99: leaked device "
                                          f"memory):\n{out}")
        passed = [x for x in out.splitlines() if ".FakeNcclChecks." in x and x.endswith(" ... ok")]
        self.assertEqual(len(passed), 3, f"FakeNcclChecks did not all run and pass:\n{out}")


def dev_lib():
    """The CUDA runtime (the emulation's, or the real one) libdquant-client-nccl links."""
    lib = dquant.client.nccl_library()
    for name, args in (("cudaMalloc", [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]),
                       ("cudaFree", [ctypes.c_void_p]),
                       ("cudaMemcpy", [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = ctypes.c_int, args
    return lib


class DevBuf:
    """Device memory from cudaMalloc shown through __cuda_array_interface__ (f32 or f16)."""

    H2D, D2H = 1, 2

    def __init__(self, shape, dtype="float32", host=None):
        self.lib = dev_lib()
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        self.ptr = ctypes.c_void_p()
        assert self.lib.cudaMalloc(ctypes.byref(self.ptr), max(1, self.nbytes)) == 0
        if host is not None:
            a = np.ascontiguousarray(host, dtype=self.dtype)
            assert a.shape == self.shape
            assert self.lib.cudaMemcpy(self.ptr, a.ctypes.data, self.nbytes, self.H2D) == 0

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr.value, False), "version": 3,
                "strides": None, "stream": None}

    def host(self, count=None):
        out = np.empty(self.shape, self.dtype)
        assert self.lib.cudaMemcpy(out.ctypes.data, self.ptr, self.nbytes, self.D2H) == 0
        return out

    def free(self):
        if self.ptr:
            self.lib.cudaFree(self.ptr)
            self.ptr = ctypes.c_void_p()


def kv(tokens, seed, dtype="float32"):
    rng = np.random.default_rng(seed)
    shape = (L, tokens, KVH, HD)
    return rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype)


if os.environ.get(CHILD_ENV):

    class FakeNcclChecks(unittest.TestCase):
        """In the child: the binding's device calls over the emulated NCCL, against the socket path."""

        @classmethod
        def setUpClass(cls):
            cls.daemon = Daemon("--backend", "cuda", binary=os.environ["DQUANTD_FAKENCCL"])

        @classmethod
        def tearDownClass(cls):
            rc = cls.daemon.stop()
            assert rc == 0, f"dquantd-fakenccl exited with {rc} (99: device memory leaked)"

        def setUp(self):
            self.bufs = []
            self.c = self.daemon.client()
            self.assertTrue(os.path.realpath(os.environ["DQUANT_FAKENCCL_LIB"]) in _loaded_paths(),
                            "the child must run the emulation")
            self.c.register_model("nm", layers=L, q_heads=QH, kv_heads=KVH, head_dim=HD, profile="dq226")
            info = self.c.server()
            self.assertEqual(info["backend"], "cuda")
            self.assertIn("nccl", info["features"])
            self.c.nccl_setup(0)

        def tearDown(self):
            for b in self.bufs:
                b.free()
            self.c.close()

        def dev(self, shape, dtype="float32", host=None):
            b = DevBuf(shape, dtype, host)
            self.bufs.append(b)
            return b

        def counter(self, name):
            return self.c.stats()["counters"][name]

        def counter_reaches(self, name, value, timeout=5.0):
            """The counter once it reaches value, or after timeout: the daemon counts a reply's NCCL
            bytes when their send completes, which may be after the client has them."""
            deadline = time.time() + timeout
            while self.counter(name) < value and time.time() < deadline:
                time.sleep(0.01)
            return self.counter(name)

        def test_put_get_over_nccl_equal_the_socket(self):
            T = 300
            k, v = kv(T, 1)
            in0 = self.counter("nccl_bytes_in")
            r = self.c.put_dev("a", self.dev(k.shape, host=k), self.dev(v.shape, host=v), model="nm")
            self.assertEqual((r["tokens"], r["streams_encoded"] > 0), (T, True))
            self.assertEqual(self.counter("nccl_bytes_in"), in0 + k.nbytes + v.nbytes)
            self.c.put("b", k, v, model="nm")                      # the same K/V through the socket
            self.assertEqual(self.c.get_raw("a").layers, self.c.get_raw("b").layers)
            # GET into device memory (larger than needed): the socket GET's values, byte for byte
            kg, vg = self.c.get("a")
            ko, vo = self.dev((L, T + 50, KVH, HD)), self.dev((L, T + 50, KVH, HD))
            out0 = self.counter("nccl_bytes_out")
            g = self.c.get_dev("a", ko, vo)
            self.assertEqual((g.num_layers, g.tokens, g.kv_heads, g.head_dim, g.dtype, g.bytes),
                             (L, T, KVH, HD, "f32", kg.nbytes))
            self.assertEqual(self.counter_reaches("nccl_bytes_out", out0 + 2 * kg.nbytes), out0 + 2 * kg.nbytes)
            n = kg.size
            self.assertTrue(np.array_equal(ko.host().reshape(-1)[:n], kg.reshape(-1)))
            self.assertTrue(np.array_equal(vo.host().reshape(-1)[:n], vg.reshape(-1)))
            # f16, a range of tokens of one layer
            k16, _ = self.c.get("a", dtype="f16", first_layer=1, num_layers=1, start_token=40, tokens=100)
            ko16, vo16 = self.dev((1, 100, KVH, HD), np.float16), self.dev((1, 100, KVH, HD), np.float16)
            g = self.c.get_dev("a", ko16, vo16, first_layer=1, num_layers=1, start_token=40, tokens=100)
            self.assertEqual((g.tokens, g.dtype), (100, "f16"))
            self.assertTrue(np.array_equal(ko16.host(), k16))
            # too small: TOO_LARGE, and the communicator stays in step for the next call
            small = self.dev((1, 1, KVH, HD))
            with self.assertRaises(dquant.ClientError) as cm:
                self.c.get_dev("a", small, small)
            self.assertEqual(cm.exception.code, dquant.ErrorCode.TOO_LARGE)
            self.c.get_dev("a", ko, vo)
            self.assertTrue(np.array_equal(ko.host().reshape(-1)[:n], kg.reshape(-1)))
            with self.assertRaises(dquant.ClientError) as cm:
                self.c.get_dev("nothing", ko, vo)
            self.assertEqual(cm.exception.code, dquant.ErrorCode.NOT_FOUND)
            # f16 input
            k16, v16 = kv(130, 2, np.float16)
            self.c.put_dev("c", self.dev(k16.shape, np.float16, k16), self.dev(v16.shape, np.float16, v16), model="nm")
            self.c.put("d", k16, v16, model="nm")
            self.assertEqual(self.c.get_raw("c").layers, self.c.get_raw("d").layers)

        def test_attend_over_nccl_equals_the_socket(self):
            k, v = kv(200, 3)
            self.c.put("s1", k, v, model="nm")
            self.c.put("s2", k, v, model="nm")
            rng = np.random.default_rng(4)
            q = rng.standard_normal((QH, HD)).astype(np.float32)
            q2 = rng.standard_normal((QH, HD)).astype(np.float32)
            dq, dq2 = self.dev(q.shape, host=q), self.dev(q2.shape, host=q2)
            out, lse = self.dev((2, QH, HD)), self.dev((2, QH))
            self.c.attend_dev([("s1", 0, dq, None, None), ("s1", 1, dq2, None, None)], out, lse)
            ho, hl = self.c.attend_batch([("s1", 0, q, None, None), ("s1", 1, q2, None, None)])
            self.assertTrue(np.array_equal(out.host(), ho) and np.array_equal(lse.host(), hl))
            # with a token appended first: s1 through NCCL, s2 through the socket
            ak = rng.standard_normal((1, KVH, HD)).astype(np.float32)
            av = rng.standard_normal((1, KVH, HD)).astype(np.float32)
            out1, lse1 = self.dev((1, QH, HD)), self.dev((1, QH))
            self.c.attend_dev([("s1", 0, dq, self.dev(ak.shape, host=ak), self.dev(av.shape, host=av))], out1, lse1)
            ho, hl = self.c.attend_batch([("s2", 0, q, ak, av)])
            self.assertTrue(np.array_equal(out1.host(), ho) and np.array_equal(lse1.host(), hl))
            self.assertEqual(self.c.get("s1", num_layers=1)[0].shape[1], 201)
            self.assertTrue(np.array_equal(self.c.get("s1", num_layers=1)[0], self.c.get("s2", num_layers=1)[0]))
            with self.assertRaises(ValueError):                   # out too small
                self.c.attend_dev([("s1", 1, dq, None, None)], out1, self.dev((0,)))

        def test_dev_calls_need_the_connections_communicator(self):
            k, v = kv(10, 5)
            with self.daemon.client() as other:                   # its own connection, no nccl_setup
                with self.assertRaises(dquant.ClientError) as cm:
                    other.put_dev("x", self.dev(k.shape, host=k), self.dev(v.shape, host=v), model="nm")
                self.assertEqual(cm.exception.code, dquant.ErrorCode.IO)
                self.assertIn("NCCL not set up", cm.exception.message)
                with self.assertRaises(dquant.ClientError) as cm:
                    other.get("x")
                self.assertEqual(cm.exception.code, dquant.ErrorCode.NOT_FOUND)
                other.ping(b"ok")
            with self.assertRaises(TypeError):                    # host memory is not device memory
                self.c.put_dev("x", k, v, model="nm")
            with self.assertRaises(ValueError):                   # dtypes differ
                self.c.put_dev("x", self.dev(k.shape, host=k), self.dev(v.shape, np.float16, v), model="nm")


def _loaded_paths():
    with open("/proc/self/maps") as f:
        return {os.path.realpath(line.split()[-1]) for line in f if ".so" in line}


class TestNcclTorch(unittest.TestCase):
    """torch CUDA tensors over real NCCL: two GPUs (the daemon's cuda:0, the client's cuda:1), torch,
    libdquant-client-nccl and $DQUANTD_CUDA (a dquantd built with CUDA and NCCL)."""

    def test_torch_cuda_tensors(self):
        need_numpy()
        if torch is None or not torch.cuda.is_available() or torch.cuda.device_count() < 2:
            self.skipTest("needs torch with two CUDA devices (the GPU host)")
        if not dquant.client.has_nccl() or not os.environ.get("DQUANTD_CUDA"):
            self.skipTest("needs libdquant-client-nccl and $DQUANTD_CUDA (a dquantd built with CUDA and NCCL)")
        d = Daemon("--backend", "cuda", "--gpu-device", "0", binary=os.environ["DQUANTD_CUDA"])
        try:
            with d.client() as c:
                c.register_model("tm", layers=L, q_heads=QH, kv_heads=KVH, head_dim=HD, profile="dq226")
                self.assertIn("nccl", c.server()["features"])
                c.nccl_setup(1)
                dev = torch.device("cuda", 1)
                k = torch.randn(L, 300, KVH, HD, device=dev, dtype=torch.bfloat16)
                v = torch.randn(L, 300, KVH, HD, device=dev, dtype=torch.bfloat16) * 2   # pending work: synced first
                c.put_dev("a", k, v, model="tm")
                c.put("b", k, v, model="tm")                       # through host memory and the socket
                self.assertEqual(c.get_raw("a").layers, c.get_raw("b").layers)
                ko = torch.empty(L * 400 * KVH * HD, device=dev, dtype=torch.bfloat16)
                vo = torch.empty_like(ko)
                g = c.get_dev("a", ko, vo)
                kg, vg = c.get("b", dtype="bf16", like=k)
                self.assertEqual(tuple(g.k.shape), (L, 300, KVH, HD))
                self.assertTrue(torch.equal(g.k, kg) and torch.equal(g.v, vg))
                q = torch.randn(QH, HD, device=dev, dtype=torch.bfloat16)
                out, lse = c.attend_dev([("a", 1, q, None, None)])
                ho, hl = c.attend_batch([("b", 1, q, None, None)])
                self.assertEqual(out.device, dev)
                self.assertLess(float((out - ho).abs().max()), 1e-3)
                self.assertLess(float((lse - hl).abs().max()), 1e-3)
                with self.assertRaises(ValueError):               # another device than the communicator's
                    c.put_dev("x", k.to("cuda:0"), v.to("cuda:0"), model="tm")
        finally:
            self.assertEqual(d.stop(), 0)


if __name__ == "__main__":
    unittest.main()
