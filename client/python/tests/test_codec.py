"""libdquant through the binding: numpy (and torch) round trips, errors, context managers."""

import math
import unittest

import dquant
from dqtest import need_numpy, need_torch, nmse, np, torch


def gaussian_kv(tokens, heads, dim, seed=1):
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((tokens, heads, dim)).astype(np.float32)
    k += (np.arange(dim) % 5 == 0).astype(np.float32) * 0.7
    v = rng.standard_normal((tokens, heads, dim)).astype(np.float32)
    return k, v


class TestCodec(unittest.TestCase):
    def setUp(self):
        need_numpy()

    def test_roundtrip_numpy_f32_and_f16(self):
        k, v = gaussian_kv(300, 2, 128)
        kh, st = dquant.roundtrip(k, "dq226", kind="k")
        self.assertEqual((kh.shape, kh.dtype), (k.shape, np.float32))
        self.assertEqual(st["streams"], 300)
        self.assertLess(nmse(k, kh), 0.05)
        self.assertGreater(nmse(k, kh), 1e-4)          # lossy: it really went through the codec
        vh, _ = dquant.roundtrip(v.astype(np.float16), "dq226", kind="v")
        self.assertEqual(vh.dtype, np.float16)
        self.assertLess(nmse(v, vh.astype(np.float32)), 0.2)
        bf, _ = dquant.roundtrip(k, "bf16", kind="k")
        self.assertLess(nmse(k, bf), 1e-4)

    def test_nonfinite_raises_with_code(self):
        k, _ = gaussian_kv(10, 2, 64)
        k[3, 1, 7] = np.inf
        with self.assertRaises(dquant.DquantError) as cm:
            dquant.roundtrip(k, "dq226", kind="k")
        self.assertEqual((cm.exception.code, cm.exception.name), (dquant.ErrorCode.NONFINITE, "NONFINITE"))

    def test_codec_and_layer_are_context_managers(self):
        k, v = gaussian_kv(200, 2, 64, seed=3)
        with dquant.Codec("dq226", 2, 64) as c:
            with c.layer() as layer:
                layer.append(k, v)
                self.assertEqual((layer.tokens, layer.sealed_tokens, layer.tail_tokens), (200, 128, 72))
                q = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
                out, lse = c.attend(layer, q)
                kd, vd = layer.decode("k"), layer.decode("v")
                for h in range(4):
                    s = kd[:, h // 2, :] @ q[h] / math.sqrt(64)
                    p = np.exp(s - s.max())
                    self.assertLess(np.abs(p @ vd[:, h // 2, :] / p.sum() - out[h]).max(), 1e-3)
            self.assertIsNone(layer._l)
        self.assertIsNone(c._c)
        c.close()                                        # twice: nothing

    def test_fixed_width_profiles(self):
        from dquant import evalcodecs
        p = dquant.Profile.builtin("dq226", 8, 128).fixed("fixed226")
        self.assertEqual((p.codec_type, p.levels, p.container_bytes), ("fixed", (6, 3), (334, 205)))
        self.assertEqual(p.serialize(), dquant.Profile.builtin("fixed226", 8, 128).serialize())
        with self.assertRaises(dquant.DquantError):
            dquant.Profile.builtin("int2", 8, 128).fixed()
        k, v = gaussian_kv(300, 2, 128)
        for name in ("fixed226", "fixed226@2.25", "fixedk8v4"):
            c = evalcodecs.get(name, 2, 128)
            self.assertEqual(c.profile.codec_type, "fixed")
            kh = c.roundtrip(k, "k")
            self.assertLess(nmse(k, kh), 0.2)  # M_K 5 to 8 on Gaussian keys
            self.assertGreater(nmse(k, kh), 1e-4)
            lib, _ = dquant.roundtrip(k, c.profile, kind="k")
            self.assertEqual(lib.tobytes(), kh.tobytes())
        self.assertEqual(evalcodecs.get("fixed226", 2, 128).bits_per_value(),
                         dquant.Profile.builtin("fixed226", 2, 128).bits_per_value())

    def test_format_version_2_profiles(self):
        """dq226p: dq226 in container format version 2, by name, through make() and scaled()."""
        p1, p2 = dquant.Profile.builtin("dq226", 2, 128), dquant.Profile.builtin("dq226p", 2, 128)
        self.assertEqual((p1._p.format_version, p2._p.format_version), (1, 2))
        self.assertEqual((p2.levels, p2.container_bytes), (p1.levels, p1.container_bytes))
        made = dquant.Profile.make(2, 128, p1.container_bytes, p1.levels, name="dq226p", format_version=2)
        self.assertEqual(made.serialize(), p2.serialize())
        self.assertEqual(dquant.Profile.scaled("dq226p", 2, 128)._p.format_version, 2)
        k, v = gaussian_kv(300, 2, 128)
        kh1, _ = dquant.roundtrip(k, p1, kind="k")
        kh2, st = dquant.roundtrip(k, p2, kind="k")
        self.assertEqual(st["streams"], 300)
        self.assertNotEqual(kh1.tobytes(), kh2.tobytes())  # another coder: another drift
        self.assertLess(abs(nmse(k, kh2) - nmse(k, kh1)), 0.1 * nmse(k, kh1))
        with self.assertRaises(dquant.DquantError):
            dquant.Profile.make(1, 1, (8, 8), (8, 6), format_version=2)  # n odd

    def test_torch_cpu_bf16(self):
        need_torch()
        t = torch.randn(140, 2, 64, dtype=torch.bfloat16)
        th, _ = dquant.roundtrip(t, "dq226", kind="v")
        self.assertIsInstance(th, torch.Tensor)
        self.assertEqual((th.dtype, th.shape, th.device.type), (torch.bfloat16, t.shape, "cpu"))
        self.assertLess(float(((t.float() - th.float()) ** 2).sum() / (t.float() ** 2).sum()), 0.2)

    def test_torch_cuda_comes_back_on_the_device(self):
        need_torch()
        if not torch.cuda.is_available():
            self.skipTest("no CUDA device")
        t = torch.randn(140, 2, 64, dtype=torch.float16, device="cuda")
        th, _ = dquant.roundtrip(t, "dq226", kind="k")
        self.assertEqual((th.device.type, th.dtype), ("cuda", torch.float16))
        self.assertLess(float(((t.float() - th.float()) ** 2).sum() / (t.float() ** 2).sum()), 0.05)


if __name__ == "__main__":
    unittest.main()
