"""Compressed transfer from Python: K/V encoded in-process by libdquant (dquant.RawKV.encode) and
stored by PUT_RAW / PUT_CHUNKS_RAW as they are, read back by GET_RAW bit-exact and decoded
in-process to what a typed GET returns; and bad records (flipped bytes, truncated, oversized,
another profile's, a NaN tail) refused with their codes, storing nothing."""

import dataclasses
import unittest

import dquant
from dquant import RawKV
from dqtest import DaemonTest, need_numpy, need_symbols, nmse, np

L, QH, KVH, HD, W = 2, 4, 2, 64, 128


def kv(tokens, seed, layers=L):
    rng = np.random.default_rng(seed)
    shape = (layers, tokens, KVH, HD)
    k = rng.standard_normal(shape).astype(np.float32) + 0.3 * (np.arange(HD) % 7).astype(np.float32)
    return k, rng.standard_normal(shape).astype(np.float32)


def flip(raw, layer, offset, xor=0x40):
    """raw with one byte of layer's records changed (offset from the records' start)."""
    recs = bytearray(raw.layers[layer].records)
    recs[offset] ^= xor
    layers = list(raw.layers)
    layers[layer] = dataclasses.replace(layers[layer], records=bytes(recs))
    return dataclasses.replace(raw, layers=tuple(layers))


def with_layer(raw, layer, **fields):
    layers = list(raw.layers)
    layers[layer] = dataclasses.replace(layers[layer], **fields)
    return dataclasses.replace(raw, layers=tuple(layers))


class TestRawCodec(unittest.TestCase):
    """RawKV.encode / decode in-process, no daemon."""

    def setUp(self):
        need_numpy()
        self.p = dquant.Profile.builtin("dq226", KVH, HD)

    def test_encode_is_the_layers_windows_and_tail(self):
        T = 2 * W + 37
        k, v = kv(T, 1)
        raw = RawKV.encode(k, v, self.p, first_layer=3)
        self.assertEqual(raw.profile, self.p.serialize())
        self.assertEqual([x.layer for x in raw.layers], [3, 4])
        with dquant.Codec(self.p) as c:
            wb = c.window_bytes
            for i, x in enumerate(raw.layers):
                self.assertEqual((x.tokens, x.windows, x.tail_tokens), (T, 2, 37))
                self.assertEqual(len(x.records), 2 * wb)
                self.assertEqual(len(x.tail_k), 37 * KVH * HD * 2)
                with c.layer() as lay:
                    lay.append(k[i], v[i])
                    self.assertEqual(x.records, lay.window(0) + lay.window(1))
                    self.assertEqual((x.tail_k, x.tail_v), (lay.tail("k"), lay.tail("v")))
                    kd, vd = raw.decode(codec=c)
                    self.assertTrue(np.array_equal(kd[i], lay.decode("k")))
                    self.assertTrue(np.array_equal(vd[i], lay.decode("v")))
                    for w in range(2):
                        c.check_window(lay.window(w))
        self.assertEqual(raw.nbytes, L * (2 * wb + 2 * 37 * KVH * HD * 2))
        self.assertLess(nmse(k, kd), 0.05)
        self.assertGreater(nmse(k, kd), 1e-4)                 # really compressed

    def test_residual_longer_than_the_window(self):
        """R = 2W: the layer keeps up to 2W - 1 tokens in BF16, PUT_RAW takes fewer than W; encode
        seals the extra window from the BF16 tail exactly as the layer does later."""
        p = dquant.Profile.make(KVH, HD, window=W, residual=2 * W)
        T = 2 * W + 5
        k, v = kv(3 * W, 2, layers=1)
        raw = RawKV.encode(k[:, :T], v[:, :T], p)
        self.assertEqual((raw.layers[0].windows, raw.layers[0].tail_tokens), (2, 5))
        with dquant.Codec(p) as c, c.layer() as lay:
            lay.append(k[0, :T], v[0, :T])
            self.assertEqual(lay.window_count, 1)                # the layer itself sealed one
            self.assertEqual(lay.tail_tokens, W + 5)
            lay.append(k[0, T:], v[0, T:])                        # 3W tokens: it seals the second
            self.assertEqual(lay.window_count, 2)
            self.assertEqual(raw.layers[0].records, lay.window(0) + lay.window(1))
            self.assertEqual(raw.layers[0].tail_k, lay.tail("k")[:5 * KVH * HD * 2])     # tokens 2W.. in both
            kd, _ = raw.decode(codec=c)
            self.assertTrue(np.array_equal(kd[0], lay.decode("k", 0, T)))

    def test_corrupt_records_are_caught_in_process(self):
        k, v = kv(W, 3, layers=1)
        raw = RawKV.encode(k, v, self.p)
        bad = flip(raw, 0, 2 + KVH * HD + 4 + 3)                  # key record 0: its rANS state
        with dquant.Codec(self.p) as c:
            with self.assertRaises(dquant.DquantError) as cm:
                c.check_window(bad.layers[0].records)
            self.assertEqual(cm.exception.code, dquant.ErrorCode.CORRUPT)
        with self.assertRaises(dquant.DquantError) as cm:
            bad.decode()
        self.assertEqual(cm.exception.code, dquant.ErrorCode.CORRUPT)
        with self.assertRaises(ValueError):                       # not whole records
            with_layer(raw, 0, records=raw.layers[0].records[:-1]).decode()

    def test_bad_input(self):
        k, v = kv(10, 4)
        with self.assertRaises(ValueError):
            RawKV.encode(k[0], v[0], self.p)                      # not [layers, tokens, ...]
        with self.assertRaises(ValueError):
            RawKV.encode(k, v[:, :5], self.p)
        k[1, 3, 0, 2] = np.inf
        with self.assertRaises(dquant.DquantError) as cm:
            RawKV.encode(k, v, self.p)
        self.assertEqual(cm.exception.code, dquant.ErrorCode.NONFINITE)


class TestRawTransfer(DaemonTest):
    MODEL = "rawm"

    def setUp(self):
        need_numpy()
        need_symbols(*dquant.client.RAW_SYMBOLS, *dquant.client.CHUNK_SYMBOLS)
        self.c = self.daemon.client()
        info = self.c.register_model(self.MODEL, layers=L, q_heads=QH, kv_heads=KVH, head_dim=HD, profile="dq226",
                                     chunk_tokens=W)
        self.profile = info["profile"]
        self.assertEqual(self.profile, dquant.Profile.builtin("dq226", KVH, HD).serialize())

    def tearDown(self):
        self.c.close()

    def counter(self, name):
        return self.c.stats()["counters"][name]

    def test_put_raw_reads_back_bit_exact(self):
        T = 2 * W + 37
        k, v = kv(T, 10)
        raw = RawKV.encode(k, v, self.profile)
        req0, bytes0, enc0 = (self.counter(n) for n in ("put_raw_requests", "put_raw_bytes", "streams_encoded"))
        r = self.c.put_raw("a", raw, model=self.MODEL, ns="raw")
        self.assertEqual((r["tokens"], r["streams_encoded"]), (T, 0))
        self.assertEqual(self.counter("put_raw_requests"), req0 + 1)
        self.assertEqual(self.counter("put_raw_bytes"), bytes0 + raw.nbytes)
        self.assertEqual(self.counter("streams_encoded"), enc0)      # the daemon encoded nothing
        got = self.c.get_raw("a", ns="raw")
        self.assertEqual(got, raw)                                   # records, tails, profile: equal bytes
        # a typed GET equals the client's own decode, bit-exact, in f32 and f16
        kd, vd = raw.decode()
        kg, vg = self.c.get("a", ns="raw")
        self.assertTrue(np.array_equal(kg, kd) and np.array_equal(vg, vd))
        kd16, _ = raw.decode(dtype="f16")
        kg16, _ = self.c.get("a", ns="raw", dtype="f16")
        self.assertTrue(np.array_equal(kg16, kd16))
        # the daemon's own PUT of the same K/V builds the same bytes
        self.c.put("b", k, v, model=self.MODEL, ns="raw")
        self.assertEqual(self.c.get_raw("b", ns="raw").layers, raw.layers)
        # GET_RAW of one layer; ATTEND agrees on both sequences
        one = self.c.get_raw("a", first_layer=1, num_layers=1, ns="raw")
        self.assertEqual(one.layers, raw.layers[1:])
        out_a, lse_a = self.c.attend("a", 1, np.ones((QH, HD), np.float32), ns="raw")
        out_b, lse_b = self.c.attend("b", 1, np.ones((QH, HD), np.float32), ns="raw")
        self.assertTrue(np.allclose(out_a, out_b, rtol=1e-6, atol=1e-6))

    def test_put_raw_appends_whole_windows(self):
        T = 3 * W + 20
        k, v = kv(T, 11)
        whole = RawKV.encode(k, v, self.profile)
        first = RawKV.encode(k[:, :2 * W], v[:, :2 * W], self.profile)       # windows 0, 1, no tail
        rest = RawKV.encode(k[:, 2 * W:], v[:, 2 * W:], self.profile)        # window 2 and the tail
        self.c.put_raw("s", first, model=self.MODEL, ns="raw")
        with self.assertRaises(dquant.ClientError) as cm:                    # not at the layers' end
            self.c.put_raw("s", rest, model=self.MODEL, ns="raw", start_token=W)
        self.assertEqual(cm.exception.code, dquant.ErrorCode.ORDER)
        self.c.put_raw("s", rest, model=self.MODEL, ns="raw", start_token=2 * W)
        self.assertEqual(self.c.get_raw("s", ns="raw").layers,
                         tuple(dataclasses.replace(x, tokens=T) for x in whole.layers))
        with self.assertRaises(dquant.ClientError) as cm:                    # a layer with a tail takes no records
            self.c.put_raw("s", first, model=self.MODEL, ns="raw", start_token=T)
        self.assertEqual(cm.exception.code, dquant.ErrorCode.INVALID_ARGUMENT)

    def expect_refused(self, key, raw, code, text=None, start_token=0):
        with self.assertRaises(dquant.ClientError) as cm:
            self.c.put_raw(key, raw, model=self.MODEL, ns="raw", start_token=start_token)
        self.assertEqual(cm.exception.code, code, str(cm.exception))
        if text:
            self.assertIn(text, cm.exception.message)
        return cm.exception

    def expect_absent(self, key):
        for call in (self.c.get, self.c.get_raw):
            with self.assertRaises(dquant.ClientError) as cm:
                call(key, ns="raw")
            self.assertEqual(cm.exception.code, dquant.ErrorCode.NOT_FOUND)

    def test_bad_records_store_nothing(self):
        T = 2 * W + 20
        k, v = kv(T, 12)
        raw = RawKV.encode(k, v, self.profile)
        wb, row = len(raw.layers[0].records) // 2, KVH * HD
        rk, rv = 4 + self.p_containers()[0], 4 + self.p_containers()[1]
        corrupt0, req0 = self.counter("put_raw_corrupt"), self.counter("put_raw_requests")
        # a flipped padding byte: layer 1, window 1, value record 100's last byte (zero in a valid one)
        pad = wb + 2 + row + W * rk + 100 * rv + rv - 1
        self.assertEqual(raw.layers[1].records[pad], 0)
        self.expect_refused("x", flip(raw, 1, pad, 0x01), dquant.ErrorCode.CORRUPT, "layer 1 window 1")
        # a flipped bit of a rANS state (after fp16 s and o): layer 0, window 0, key record 0
        self.expect_refused("x", flip(raw, 0, 2 + row + 4 + 3), dquant.ErrorCode.CORRUPT, "layer 0 window 0")
        # truncated: the last record one byte short
        self.expect_refused("x", with_layer(raw, 1, records=raw.layers[1].records[:-1]), dquant.ErrorCode.SHAPE)
        # oversized: more record bytes than the windows say
        self.expect_refused("x", with_layer(raw, 0, records=raw.layers[0].records + bytes(64)),
                            dquant.ErrorCode.SHAPE)
        # oversized: a tail of W tokens
        longt = bytes(W * row * 2)
        self.expect_refused("x", with_layer(raw, 0, tail_tokens=W, tail_k=longt, tail_v=longt), dquant.ErrorCode.SHAPE)
        # a NaN in a BF16 tail
        nan_tail = bytearray(raw.layers[1].tail_k)
        nan_tail[2 * (5 * row + 3):2 * (5 * row + 3) + 2] = b"\xc0\x7f"
        self.expect_refused("x", with_layer(raw, 1, tail_k=bytes(nan_tail)), dquant.ErrorCode.NONFINITE)
        # another profile's records (dq196) with that profile
        other = RawKV.encode(k, v, dquant.Profile.builtin("dq196", KVH, HD))
        self.assertNotEqual(len(other.layers[0].records), len(raw.layers[0].records))
        self.expect_refused("x", other, dquant.ErrorCode.INVALID_ARGUMENT, "another profile")
        # ... and claiming the model's profile: not whole records of it
        self.expect_refused("x", dataclasses.replace(other, profile=raw.profile), dquant.ErrorCode.SHAPE)
        self.expect_absent("x")
        self.assertEqual(self.counter("put_raw_corrupt"), corrupt0 + 2)
        self.assertEqual(self.counter("put_raw_requests"), req0 + 8)
        # on an existing sequence a refused PUT_RAW changes nothing (layer 0 is rolled back)
        first = RawKV.encode(k[:, :W], v[:, :W], self.profile)
        second = RawKV.encode(k[:, W:2 * W], v[:, W:2 * W], self.profile)
        self.c.put_raw("y", first, model=self.MODEL, ns="raw")
        self.expect_refused("y", flip(second, 1, 2 + row + 4 + 3), dquant.ErrorCode.CORRUPT, start_token=W)
        self.assertEqual(self.c.get_raw("y", ns="raw"), first)
        self.c.put_raw("y", second, model=self.MODEL, ns="raw", start_token=W)
        self.assertEqual(self.c.get_raw("y", ns="raw").layers[0].records,
                         first.layers[0].records + second.layers[0].records)

    def p_containers(self):
        return dquant.Profile.deserialize(self.profile).container_bytes

    def test_chunks_raw(self):
        ct = W
        prompt = np.random.default_rng(13).integers(0, 50000, size=3 * ct + 11).tolist()
        keys = dquant.chunk_keys("rawns", prompt, ct)
        k, v = kv(3 * ct, 13)
        raw = RawKV.encode(k, v, self.profile)
        r = self.c.put_chunks_raw(keys, raw, model=self.MODEL, ns="rawns")
        self.assertEqual((r.stored, r.deduped, r.streams_encoded), (3, 0, 0))
        self.assertEqual(self.c.lookup(keys, model=self.MODEL, ns="rawns").hits, 3)
        got = self.c.get_chunks_raw(keys, ns="rawns")
        self.assertEqual(got.profile, raw.profile)
        self.assertEqual([x.records for x in got.layers], [x.records for x in raw.layers])
        self.assertEqual(self.c.get_chunks_raw(keys[1:2], ns="rawns").layers[1].records,
                         raw.layers[1].records[len(raw.layers[1].records) // 3:][:len(raw.layers[1].records) // 3])
        kd, vd = got.decode()
        kg, vg = self.c.get_chunks(keys, ns="rawns")
        self.assertTrue(np.array_equal(kg, kd) and np.array_equal(vg, vd))
        # BF16 PUT_CHUNKS of the same chunks: deduped; PUT_CHUNKS_RAW of its own chunks: deduped too
        self.assertEqual(self.c.put_chunks(keys, k, v, model=self.MODEL, ns="rawns").deduped, 3)
        self.assertEqual(self.c.put_chunks_raw(keys[:2], RawKV.encode(k[:, :2 * ct], v[:, :2 * ct], self.profile),
                                               model=self.MODEL, ns="rawns").deduped, 2)
        # the same data by PUT_CHUNKS under other keys: the daemon's records equal the client's
        keys2 = dquant.chunk_keys("rawns2", prompt, ct)
        self.c.put_chunks(keys2, k, v, model=self.MODEL, ns="rawns2")
        self.assertEqual(self.c.get_chunks_raw(keys2, ns="rawns2").layers, got.layers)
        # a corrupt record in chunk 2, layer 1: nothing stored, not even chunks 0 and 1
        keys3 = dquant.chunk_keys("rawns3", prompt, ct)
        wb = len(raw.layers[1].records) // 3
        corrupt0 = self.counter("put_raw_corrupt")
        with self.assertRaises(dquant.ClientError) as cm:
            self.c.put_chunks_raw(keys3, flip(raw, 1, 2 * wb + 2 + KVH * HD + 4 + 3), model=self.MODEL, ns="rawns3")
        self.assertEqual(cm.exception.code, dquant.ErrorCode.CORRUPT)
        self.assertIn("chunk 2 layer 1 window 2", cm.exception.message)
        self.assertEqual(self.counter("put_raw_corrupt"), corrupt0 + 1)
        self.assertEqual(self.c.lookup(keys3, model=self.MODEL, ns="rawns3").hits, 0)
        with self.assertRaises(dquant.ClientError) as cm:
            self.c.get_chunks_raw(keys3[:1], ns="rawns3")
        self.assertEqual(cm.exception.code, dquant.ErrorCode.NOT_FOUND)
        # chunks with a tail, or fewer windows than the keys need: SHAPE / INVALID_ARGUMENT, nothing stored
        tailed = RawKV.encode(k[:, :ct + 5], v[:, :ct + 5], self.profile)
        with self.assertRaises(dquant.ClientError) as cm:
            self.c.put_chunks_raw(keys3[:1], tailed, model=self.MODEL, ns="rawns3")
        self.assertEqual(cm.exception.code, dquant.ErrorCode.SHAPE)
        with self.assertRaises(dquant.ClientError) as cm:
            self.c.put_chunks_raw(keys3, RawKV.encode(k[:, :ct], v[:, :ct], self.profile), model=self.MODEL,
                                  ns="rawns3")
        self.assertIn(cm.exception.code, (dquant.ErrorCode.SHAPE, dquant.ErrorCode.INVALID_ARGUMENT))
        self.assertEqual(self.c.lookup(keys3, model=self.MODEL, ns="rawns3").hits, 0)
        with self.assertRaises(ValueError):
            self.c.put_chunks_raw([], raw, model=self.MODEL)


if __name__ == "__main__":
    unittest.main()
