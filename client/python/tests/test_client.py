"""libdquant-client through the binding, against a real dquantd: round trips, errors as
exceptions with their codes, the context manager."""

import unittest

import dquant
from dqtest import DaemonTest, need_numpy, need_torch, nmse, np, torch


class TestClient(DaemonTest):
    def setUp(self):
        need_numpy()
        self.c = self.daemon.client()
        self.c.register_model("py", layers=2, q_heads=4, kv_heads=2, head_dim=64, profile="dq226")

    def tearDown(self):
        self.c.close()

    def test_put_get_roundtrip_numpy(self):
        rng = np.random.default_rng(5)
        k = rng.standard_normal((2, 200, 2, 64)).astype(np.float32)
        v = rng.standard_normal((2, 200, 2, 64)).astype(np.float32)
        put = self.c.put("rt", k, v, model="py")
        self.assertEqual(put["tokens"], 200)
        kg, vg = self.c.get("rt")
        self.assertEqual((kg.shape, kg.dtype), (k.shape, np.float32))
        self.assertLess(nmse(k, kg), 0.05)
        self.assertLess(nmse(v, vg), 0.2)
        self.assertGreater(nmse(k, kg), 1e-4)          # compressed on the server, not echoed
        k16, _ = self.c.get("rt", dtype="f16", first_layer=1, start_token=50, tokens=100)
        self.assertEqual((k16.shape, k16.dtype), ((1, 100, 2, 64), np.float16))
        self.assertTrue(np.allclose(k16.astype(np.float32), kg[1:, 50:150], rtol=1e-3, atol=1e-3))
        # appending continues the sequence; out of order is ORDER
        self.c.put("rt", k[:, :10], v[:, :10], model="py", start_token=200)
        with self.assertRaises(dquant.ClientError) as cm:
            self.c.put("rt", k[:, :10], v[:, :10], model="py", start_token=5)
        self.assertEqual(cm.exception.code, dquant.ErrorCode.ORDER)
        self.c.delete("rt")

    def test_attend_matches_the_local_codec(self):
        rng = np.random.default_rng(6)
        k = rng.standard_normal((2, 150, 2, 64)).astype(np.float32)
        v = rng.standard_normal((2, 150, 2, 64)).astype(np.float32)
        self.c.put("att", k, v, model="py")
        q = rng.standard_normal((4, 64)).astype(np.float32)
        out, lse = self.c.attend("att", layer=1, q=q)
        with dquant.Codec("dq226", 2, 64) as codec, codec.layer() as layer:
            layer.append(k[1], v[1])
            lo, llse = codec.attend(layer, q)
        self.assertLess(np.abs(out - lo).max(), 1e-3)
        self.assertLess(np.abs(lse - llse).max(), 1e-3)
        self.c.delete("att")

    def test_errors_are_exceptions_with_codes(self):
        with self.assertRaises(dquant.ClientError) as cm:
            self.c.get("no-such-sequence")
        e = cm.exception
        self.assertIsInstance(e, dquant.DquantError)
        self.assertEqual((e.code, e.name), (-13, "NOT_FOUND"))
        self.assertTrue(e.message)
        with self.assertRaises(dquant.ClientError) as cm:
            self.c.register_model("py", layers=3, q_heads=4, kv_heads=2, head_dim=64)   # another spec
        self.assertEqual(cm.exception.code, dquant.ErrorCode.EXISTS)
        bad = np.zeros((2, 4, 2, 64), np.float32)
        bad[0, 1, 1, 3] = np.nan
        with self.assertRaises(dquant.ClientError) as cm:
            self.c.put("nan", bad, np.zeros_like(bad), model="py")
        self.assertEqual(cm.exception.name, "NONFINITE")
        with self.assertRaises(dquant.ClientError) as cm:
            self.c.get("nan")                          # all-or-nothing: nothing was stored
        self.assertEqual(cm.exception.code, dquant.ErrorCode.NOT_FOUND)

    def test_unregister_model(self):
        """Issue 18.8: a model goes once nothing of it is stored; BUSY before, NOT_FOUND after."""
        self.c.register_model("tmp", layers=1, q_heads=4, kv_heads=2, head_dim=64)
        k = np.ones((1, 3, 2, 64), np.float32)
        self.c.put("u", k, k, model="tmp")
        with self.assertRaises(dquant.ClientError) as cm:
            self.c.unregister_model("tmp")
        self.assertEqual(cm.exception.code, dquant.ErrorCode.BUSY)
        self.c.delete("u")
        self.c.unregister_model("tmp")
        with self.assertRaises(dquant.ClientError) as cm:
            self.c.unregister_model("tmp")
        self.assertEqual(cm.exception.code, dquant.ErrorCode.NOT_FOUND)
        with self.assertRaises(dquant.ClientError) as cm:
            self.c.put("u", k, k, model="tmp")
        self.assertEqual(cm.exception.code, dquant.ErrorCode.NOT_FOUND)
        info = self.c.register_model("tmp", layers=2, q_heads=4, kv_heads=2, head_dim=64)   # the name is free
        self.assertFalse(info["existed"])
        self.c.unregister_model("tmp")

    def test_names_with_nul_do_not_alias(self):
        """Issue 18.7: ctypes passes names as C strings, so "tenantA\0x" reached the daemon as
        "tenantA" and deleted tenantA's sequence. Every name is now refused before it is sent."""
        k = np.ones((2, 3, 2, 64), np.float32)
        self.c.put("s", k, k, model="py", ns="tenantA")
        calls = [lambda: self.c.delete("s", ns="tenantA\0x"),
                 lambda: self.c.get("s", ns="tenantA\0x"),
                 lambda: self.c.put("s2", k, k, model="py\0x", ns="tenantA"),
                 lambda: self.c.register_model("py\0x", layers=2, q_heads=4, kv_heads=2, head_dim=64),
                 lambda: self.c.register_model("py2", layers=2, q_heads=4, kv_heads=2, head_dim=64,
                                               profile="dq226\0"),
                 lambda: self.c.unregister_model("py\0x"),
                 lambda: self.c.delete("s", ns="tenant\ud800"),                       # not UTF-8
                 lambda: self.daemon.client(client_name="tenantA\0x")]
        for i, call in enumerate(calls):
            with self.assertRaises(dquant.ClientError, msg=f"call {i}") as cm:
                call()
            self.assertEqual(cm.exception.code, dquant.ErrorCode.INVALID_ARGUMENT, f"call {i}")
        if dquant.has_symbols("dqc_chunk_keys"):
            with self.assertRaises(dquant.ClientError):
                dquant.chunk_keys("tenantA\0x", list(range(256)), 256)
        kg, _ = self.c.get("s", ns="tenantA")                  # untouched
        self.assertEqual(kg.shape, (2, 3, 2, 64))
        self.c.delete("s", ns="tenantA")
        self.c.put("s", k, k, model="py", ns="t\u00e9nant-\u30c6")      # UTF-8 names work
        self.assertEqual(self.c.get("s", ns="t\u00e9nant-\u30c6")[0].shape, (2, 3, 2, 64))
        self.c.delete("s", ns="t\u00e9nant-\u30c6")

    def test_context_manager_closes(self):
        with self.daemon.client() as c:
            self.assertFalse(c.closed)
            c.ping(b"x")
            self.assertEqual(c.server()["version"], 1)
        self.assertTrue(c.closed)
        with self.assertRaises(dquant.ClientError) as cm:
            c.ping()
        self.assertEqual(cm.exception.code, dquant.ErrorCode.INVALID_ARGUMENT)
        c.close()                                      # twice: nothing
        # an exception inside the block still closes, and propagates
        with self.assertRaises(KeyError):
            with self.daemon.client() as c2:
                raise KeyError("x")
        self.assertTrue(c2.closed)

    def test_stats_and_pins(self):
        k = np.ones((2, 3, 2, 64), np.float32)
        self.c.put("pinned", k, k, model="py")
        self.c.pin("pinned")
        self.c.unpin("pinned")
        st = self.c.stats()
        self.assertTrue(st["counters"])
        self.assertTrue(all(isinstance(v, int) for v in st["counters"].values()))
        self.c.delete("pinned")
        with self.assertRaises(dquant.ClientError):
            self.c.delete("pinned")

    def test_torch_cpu_and_cuda(self):
        need_torch()
        k = torch.randn(2, 130, 2, 64, dtype=torch.bfloat16)
        self.c.put("torch", k, k, model="py")
        k2, v2 = self.c.get("torch", dtype="bf16", like=k)
        self.assertEqual((type(k2), k2.dtype, k2.shape), (torch.Tensor, torch.bfloat16, k.shape))
        self.assertLess(float(((k.float() - k2.float()) ** 2).sum() / (k.float() ** 2).sum()), 0.05)
        if torch.cuda.is_available():     # device tensors go through host memory (no NCCL from Python)
            kc = k.cuda()
            k3, _ = self.c.get("torch", dtype="bf16", like=kc)
            self.assertEqual(k3.device.type, "cuda")
            self.assertTrue(torch.equal(k3.cpu(), k2))
            out, lse = self.c.attend("torch", layer=0, q=torch.randn(4, 64, device="cuda"))
            self.assertEqual((out.device.type, tuple(out.shape), tuple(lse.shape)), ("cuda", (4, 64), (4,)))
        self.c.delete("torch")


if __name__ == "__main__":
    unittest.main()
