"""The KVQuant++ codecs from Python (dquant.kvq): profiles by name, per-layer calibration, local
encode/decode/attention through the calibrated codec's per-layer views, and the same codecs served
by dquantd (register_model with a calibration): GET, GET_RAW and ATTEND bit-exact with the local
views of the same layers; bad calibrations and unknown codec parameters refused with their codes
while the daemon keeps serving."""

import unittest

import dquant
from dquant import ClientError, DquantError, ErrorCode, kvq
from dqtest import Daemon, DaemonTest, need_numpy, nmse, np

L, QH, KVH, HD = 3, 4, 2, 64
CAL_TOKENS = 512


def need_kvq():
    if not hasattr(dquant.codec.library(), "dq_profile_kvq"):
        raise unittest.SkipTest("this libdquant has no KVQuant++ codecs")


def layered(layers, tokens, seed):
    """K and V [layers, tokens, KVH, HD] whose distribution differs per layer (scale, offset, loud
    channels), so per-layer codebooks differ."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((layers, tokens, KVH, HD)).astype(np.float32)
    v = rng.standard_normal((layers, tokens, KVH, HD)).astype(np.float32)
    for l in range(layers):
        loud = np.where(np.arange(HD) % (5 + l) == 0, 4.0 + l, 1.0).astype(np.float32)
        k[l] = k[l] * loud * (1 + 0.7 * l) + 0.25 * l
        v[l] = v[l] * loud * (1 + 0.7 * l)
    return k, v


def make(name, layers=L):
    """(profile, calibration or None) for name, calibrated over `layers` layers when it needs it."""
    p = kvq.profile(name, KVH, HD)
    if not kvq.needs_calibration(p):
        return p, None
    k, v = layered(layers, CAL_TOKENS, 99)
    return kvq.calibrate(p, k, v, seed=7)


class TestKvqLocal(unittest.TestCase):
    """dquant.kvq in-process, no daemon."""

    def setUp(self):
        need_numpy()
        need_kvq()

    def test_profiles_by_name(self):
        for name, calib in (("lm3", False), ("lmh2", False), ("ip3", False), ("ip3+lr4", False), ("ol3", True),
                            ("pq16x8", True)):
            p = kvq.profile(name, KVH, HD)
            self.assertEqual(p.codec_type, "kvq", name)
            self.assertEqual(kvq.needs_calibration(p), calib, name)
            self.assertGreater(p.bits_per_value(), 0.0)
            # the built-in lookup knows them too, and the serialized form round-trips
            self.assertEqual(dquant.Profile.builtin(name, KVH, HD).serialize(), p.serialize())
            self.assertEqual(dquant.Profile.deserialize(p.serialize()).serialize(), p.serialize())

    def test_unknown_parameters_are_profile_errors(self):
        for name in ("pq0x8", "lm9", "ip1", "pq16x0", "lm3+lr", "zz3"):
            with self.assertRaises(DquantError, msg=name) as cm:
                kvq.profile(name, KVH, HD)
            self.assertEqual(cm.exception.code, ErrorCode.PROFILE, name)

    def test_calibrate_and_check(self):
        p0 = kvq.profile("pq16x8", KVH, HD)
        p, calib = make("pq16x8")
        self.assertEqual(kvq.check_calibration(p, calib), L)
        self.assertNotEqual(p.serialize(), p0.serialize(), "the calibrated profile carries the hash")
        # a codec of a profile that needs calibration cannot be made without it
        with self.assertRaises(DquantError) as cm:
            dquant.Codec(p0)
        self.assertEqual(cm.exception.code, ErrorCode.PROFILE)
        bad = bytearray(calib)
        bad[len(bad) // 2] ^= 1
        with self.assertRaises(DquantError) as cm:
            kvq.check_calibration(p, bytes(bad))
        self.assertEqual(cm.exception.code, ErrorCode.CORRUPT)
        with self.assertRaises(DquantError) as cm:
            kvq.check_calibration(p, calib[:-9])
        self.assertIn(cm.exception.code, (ErrorCode.TRUNCATED, ErrorCode.CORRUPT))
        # bad sample input
        k, v = layered(L, 32, 3)
        with self.assertRaises(DquantError) as cm:
            kvq.calibrate(p0, k, v)
        self.assertEqual(cm.exception.code, ErrorCode.INVALID_ARGUMENT, "too few tokens")
        k, v = layered(L, CAL_TOKENS, 3)
        k[1, 5, 0, 3] = np.nan
        with self.assertRaises(DquantError) as cm:
            kvq.calibrate(p0, k, v)
        self.assertEqual(cm.exception.code, ErrorCode.NONFINITE)
        with self.assertRaises(ValueError):
            kvq.calibrate(p0, k[:, :, :1], v[:, :, :1])

    def test_views_use_their_layers_codebooks(self):
        p, calib = make("pq16x8")
        x = layered(1, 40, 5)[0][0]
        with kvq.codec(p, calib) as c:
            v0, v1 = c.view(0), c.view(1)
            self.assertIs(c.view(1), v1)
            r0, _ = v0.encode(x, "k")
            r1, _ = v1.encode(x, "k")
            self.assertNotEqual(r0, r1)
            # layer 1's records decode best with layer 1's codebooks, differently with layer 0's
            own, other = v1.decode(r1, b"", "k"), v0.decode(r1, b"", "k")
            self.assertFalse(np.array_equal(own, other))
            self.assertLess(nmse(x, own), nmse(x, other))
            with self.assertRaises(IndexError):
                c.view(L)
        with kvq.codec(*make("lm3")) as c:
            self.assertIs(c.view(2), c, "no calibration: one codec for every layer")


class TestKvqDaemon(DaemonTest):
    """The KVQ codecs served by dquantd, against the local views."""

    def setUp(self):
        need_numpy()
        need_kvq()

    def serve(self, name):
        p, calib = make(name)
        model = f"kvq-{name}"
        with self.daemon.client() as c:
            r = c.register_model(model, L, QH, KVH, HD, profile=p if calib else name, calibration=calib)
            self.assertFalse(r["existed"])
            self.assertEqual(r["profile"], p.serialize())
            self.assertTrue(c.register_model(model, L, QH, KVH, HD, profile=p if calib else name,
                                             calibration=calib)["existed"])
            k, v = layered(L, 2 * p.window + 7, 11)
            c.put("s", k, v, model=model)
            gk, gv = c.get("s")
            raw = c.get_raw("s")
            q = layered(1, 1, 12)[0][0, 0]
            qs = np.concatenate([q] * (QH // KVH)).reshape(QH, HD)
            with kvq.codec(p, calib) as codec:
                for l in range(L):
                    vw = codec.view(l)
                    with vw.layer() as lay:
                        lay.append(k[l], v[l])
                        self.assertEqual(gk[l].tobytes(), lay.decode("k").tobytes(), f"{name} layer {l} K")
                        self.assertEqual(gv[l].tobytes(), lay.decode("v").tobytes(), f"{name} layer {l} V")
                        recs = b"".join(lay.window(w) for w in range(lay.window_count))
                        self.assertEqual(raw.layers[l].records, recs, f"{name} layer {l} records")
                        out, lse = c.attend("s", l, qs)
                        ro, rl = vw.attend(lay, qs)
                        self.assertEqual(out.tobytes(), ro.tobytes(), f"{name} layer {l} ATTEND")
                        self.assertEqual(lse.tobytes(), rl.tobytes())
                # GET_RAW decoded in-process with the calibrated codec is the typed GET
                dk, dv = raw.decode(codec=codec)
                self.assertEqual((dk.tobytes(), dv.tobytes()), (gk.tobytes(), gv.tobytes()))
            c.delete("s")
            c.unregister_model(model)
        return gk

    def test_lm3(self):
        self.serve("lm3")

    def test_ip3(self):
        self.serve("ip3")

    def test_pq16x8_calibrated(self):
        self.serve("pq16x8")

    def test_ip3_lowrank4(self):
        self.serve("ip3+lr4")

    def test_chunks_of_a_calibrated_model(self):
        # the shared KV tier: chunks encoded by the daemon (put_chunks) and by the client
        # (put_chunks_raw through the calibrated codec's views) decode as the local views do
        p, calib = make("pq16x8")
        W = p.window
        k, v = layered(L, 2 * W, 21)
        keys = dquant.chunk_keys("kvq", np.arange(2 * W), W)
        keys2 = dquant.chunk_keys("kvq2", np.arange(2 * W), W)
        with self.daemon.client() as c, kvq.codec(p, calib) as codec:
            c.register_model("chunky", L, QH, KVH, HD, profile=p, calibration=calib, chunk_tokens=W)
            self.assertEqual(c.put_chunks(keys, k, v, model="chunky", ns="kvq").stored, 2)
            raw = dquant.RawKV.encode(k, v, codec)
            self.assertEqual(c.put_chunks_raw(keys2, raw, model="chunky", ns="kvq2").stored, 2)
            self.assertEqual(c.get_chunks_raw(keys, ns="kvq"), raw, "the daemon's records are the views' records")
            gk, gv = c.get_chunks(keys2, ns="kvq2")
            for l in range(L):
                with codec.view(l).layer() as lay:
                    lay.append(k[l], v[l])
                    self.assertEqual(gk[l].tobytes(), lay.decode("k").tobytes(), f"layer {l}")
                    self.assertEqual(gv[l].tobytes(), lay.decode("v").tobytes(), f"layer {l}")
            for key in keys:
                c.delete_chunk(key, ns="kvq")
            for key in keys2:
                c.delete_chunk(key, ns="kvq2")
            c.unregister_model("chunky")

    def alive(self, c):
        c.register_model("alive", 1, QH, KVH, HD, profile="lm3")
        k, v = layered(1, 5, 1)
        c.put("alive", k, v, model="alive")
        self.assertEqual(c.get("alive")[0].shape, (1, 5, KVH, HD))
        c.delete("alive")
        c.unregister_model("alive")

    def expect(self, code, fn, *args, **kw):
        with self.assertRaises(ClientError) as cm:
            fn(*args, **kw)
        self.assertEqual(cm.exception.code, code, str(cm.exception))

    def test_bad_calibration(self):
        p, calib = make("pq16x8")
        with self.daemon.client() as c:
            reg = c.register_model
            self.expect(ErrorCode.PROFILE, reg, "b", L, QH, KVH, HD, profile=p)  # missing
            self.expect(ErrorCode.PROFILE, reg, "b", L, QH, KVH, HD, profile="pq16x8")
            self.expect(ErrorCode.PROFILE, reg, "b", L, QH, KVH, HD, profile="lm3", calibration=calib)
            self.alive(c)
            for cut in (len(calib) - 1, 40):
                with self.assertRaises(DquantError) as local:
                    kvq.check_calibration(p, calib[:cut])
                self.expect(local.exception.code, reg, "b", L, QH, KVH, HD, profile=p, calibration=calib[:cut])
            bad = bytearray(calib)
            bad[len(bad) // 3] ^= 0x20
            self.expect(ErrorCode.CORRUPT, reg, "b", L, QH, KVH, HD, profile=p, calibration=bytes(bad))
            self.alive(c)
            p4, calib4 = make("pq16x8", L + 1)
            self.expect(ErrorCode.SHAPE, reg, "b", L, QH, KVH, HD, profile=p4, calibration=calib4)
            for name in ("pq0x8", "lm9", "ip1"):
                self.expect(ErrorCode.PROFILE, reg, "b", L, QH, KVH, HD, profile=name)
            self.alive(c)
            # registered, then other bytes under the same name: EXISTS
            reg("b", L, QH, KVH, HD, profile=p, calibration=calib)
            self.expect(ErrorCode.EXISTS, reg, "b", L + 1, QH, KVH, HD, profile=p4, calibration=calib4)
            self.assertTrue(reg("b", L, QH, KVH, HD, profile=p, calibration=calib)["existed"])
            c.unregister_model("b")
            self.alive(c)


class TestKvqCluster(unittest.TestCase):
    """A calibrated model through dquant.Cluster: registered on every member with its calibration."""

    def setUp(self):
        need_numpy()
        need_kvq()
        if not dquant.has_symbols("dqc_cluster_register_model_calibrated"):
            self.skipTest("libdquant-client lacks dqc_cluster_register_model_calibrated")
        self.daemons = [Daemon() for _ in range(2)]

    def tearDown(self):
        for d in self.daemons:
            d.stop()

    def test_register_put_get(self):
        p, calib = make("pq16x8")
        k, v = layered(L, p.window + 9, 31)
        with dquant.Cluster([d.addr for d in self.daemons], replicas=2) as cl:
            cl.register_model("m", L, QH, KVH, HD, profile=p, calibration=calib)
            cl.put("s", k, v, model="m")
            gk, _ = cl.get("s")
        with kvq.codec(p, calib) as codec:
            for l in range(L):
                with codec.view(l).layer() as lay:
                    lay.append(k[l], v[l])
                    self.assertEqual(gk[l].tobytes(), lay.decode("k").tobytes(), f"layer {l}")
        for d in self.daemons:
            with d.client() as one:
                self.assertTrue(one.register_model("m", L, QH, KVH, HD, profile=p, calibration=calib)["existed"])
                self.assertEqual(one.get("s")[0].tobytes(), gk.tobytes(), "both replicas hold it")


if __name__ == "__main__":
    unittest.main()
