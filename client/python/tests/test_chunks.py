"""The shared KV tier from Python: chunk keys against the independently computed vectors of
tests/proto/chunk_key_vectors.txt, and lookup / put_chunks / get_chunks against a real dquantd.
Whatever needs a C function libdquant-client lacks skips, saying which."""

import os
import pathlib
import unittest

import dquant
from dqtest import REPO, DaemonTest, need_numpy, need_symbols, nmse, np


def vectors():
    path = pathlib.Path(os.environ.get("DQ_CHUNK_VECTORS", REPO / "tests" / "proto" / "chunk_key_vectors.txt"))
    if not path.is_file():
        raise unittest.SkipTest(f"{path} not found (set DQ_CHUNK_VECTORS)")
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        ns, ct, toks, keys = line.split("\t")
        out.append((ns, int(ct), [int(t) for t in toks.split(",")], [bytes.fromhex(k) for k in keys.split(",")]))
    return out


class TestChunkKeysArguments(unittest.TestCase):
    """Checked in Python, before any C call: run with or without dqc_chunk_keys."""

    def test_bad_arguments(self):
        with self.assertRaises(ValueError):
            dquant.chunk_keys("m", [1, 2], 0)
        with self.assertRaises(ValueError):
            dquant.chunk_keys("m", [1, 2], 1, parent=b"short")

    def test_missing_symbol_is_unsupported(self):
        if dquant.has_symbols("dqc_chunk_keys"):
            self.skipTest("libdquant-client has dqc_chunk_keys (the other tests use it)")
        with self.assertRaises(dquant.UnsupportedError) as cm:
            dquant.chunk_keys("m", [1], 1)
        self.assertEqual(cm.exception.code, dquant.ErrorCode.UNSUPPORTED)
        self.assertIn("dqc_chunk_keys", str(cm.exception))


class TestChunkKeys(unittest.TestCase):
    def setUp(self):
        need_symbols("dqc_chunk_keys")

    def test_vectors(self):
        vec = vectors()
        self.assertGreaterEqual(len(vec), 5)
        nkeys = 0
        for ns, ct, toks, keys in vec:
            got = dquant.chunk_keys(ns, toks, ct)
            self.assertEqual(got, keys, f"ns {ns!r}, chunks of {ct}")
            self.assertTrue(all(len(k) == dquant.CHUNK_KEY_BYTES for k in got))
            nkeys += len(got)
            if np is not None:          # a numpy array of ids gives the same keys
                self.assertEqual(dquant.chunk_keys(ns, np.array(toks, dtype=np.int64), ct), keys)
        self.assertGreaterEqual(nkeys, 8)

    def test_chain(self):
        toks = [(i * 2654435761) % (1 << 32) for i in range(1000)]
        keys = dquant.chunk_keys("m", toks, 256)
        self.assertEqual(len(keys), 3)                                 # the partial chunk has no key
        self.assertEqual(dquant.chunk_keys("m", toks, 256, parent=bytes(16)), keys)
        self.assertEqual(dquant.chunk_keys("m", toks[256:], 256, parent=keys[0]), keys[1:])
        self.assertNotEqual(dquant.chunk_keys("n", toks, 256)[0], keys[0])
        other = list(toks)
        other[700] ^= 1
        self.assertEqual(dquant.chunk_keys("m", other, 256)[:2], keys[:2])   # a shared prefix
        self.assertNotEqual(dquant.chunk_keys("m", other, 256)[2], keys[2])
        self.assertEqual(dquant.chunk_keys("m", toks[:100], 256), [])
        with self.assertRaises(ValueError):
            dquant.chunk_keys("m", [1, -1], 1)


class TestChunkApi(DaemonTest):
    LAYERS, KVH, HD, Q, CT = 2, 2, 64, 4, 128

    def setUp(self):
        need_numpy()
        need_symbols(*dquant.client.CHUNK_SYMBOLS)
        self.c = self.daemon.client()
        info = self.c.register_model("chunky", layers=self.LAYERS, q_heads=self.Q, kv_heads=self.KVH,
                                     head_dim=self.HD, profile="dq226", chunk_tokens=self.CT)
        self.assertEqual(info["chunk_tokens"], self.CT)

    def tearDown(self):
        self.c.close()

    def kv(self, tokens, seed):
        rng = np.random.default_rng(seed)
        shape = (self.LAYERS, tokens, self.KVH, self.HD)
        return rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)

    def test_attend_on_prefix(self):
        """A sequence built on two chunks plus a private tail attends like one sequence holding the
        same tokens (the windows align at chunk boundaries, so the containers are the same)."""
        need_symbols("dqc_put_on_prefix")
        ct, tail = self.CT, 77
        prompt = np.random.default_rng(21).integers(0, 50000, size=2 * ct).tolist()
        keys = dquant.chunk_keys("pfx", prompt, ct)
        k, v = self.kv(2 * ct + tail, 22)
        self.c.put_chunks(keys, k[:, :2 * ct], v[:, :2 * ct], model="chunky", ns="pfx")
        self.c.put(b"tail", k[:, 2 * ct:], v[:, 2 * ct:], model="chunky", ns="pfx", prefix_chunks=keys)
        self.c.put(b"whole", k, v, model="chunky", ns="pfx")
        q = np.random.default_rng(23).standard_normal((self.Q, self.HD)).astype(np.float32)
        for layer in range(self.LAYERS):
            o1, l1 = self.c.attend(b"tail", layer, q, ns="pfx")
            o2, l2 = self.c.attend(b"whole", layer, q, ns="pfx")
            self.assertLess(float(np.max(np.abs(o1 - o2)) / np.max(np.abs(o2))), 1e-5)
            self.assertTrue(np.allclose(l1, l2, rtol=1e-5, atol=1e-5))
        # the prefix chunks are held by the sequence: deleting one is refused while it exists
        with self.assertRaises(dquant.ClientError) as cm:
            self.c.delete_chunk(keys[0], ns="pfx")
        self.assertEqual(cm.exception.code, dquant.ErrorCode.BUSY)
        # a prefix chunk that is not held
        with self.assertRaises(dquant.ClientError) as cm:
            self.c.put(b"orphan", k[:, :1], v[:, :1], model="chunky", ns="pfx", prefix_chunks=[bytes(16)])
        self.assertEqual(cm.exception.code, dquant.ErrorCode.NOT_FOUND)

    def test_lookup_put_get(self):
        ct = self.CT
        prompt = np.random.default_rng(11).integers(0, 50000, size=3 * ct + 40).tolist()
        keys = dquant.chunk_keys("tenant", prompt, ct)
        self.assertEqual(len(keys), 3)                       # the 40 trailing tokens have no key
        miss = self.c.lookup(keys, model="chunky", ns="tenant")
        self.assertEqual((miss.hits, miss.hit_tokens, miss.chunk_tokens, miss.keys), (0, 0, ct, ()))
        k, v = self.kv(3 * ct, 12)
        put = self.c.put_chunks(keys[:1], k[:, :ct], v[:, :ct], model="chunky", ns="tenant")
        self.assertEqual((put.stored, put.deduped), (1, 0))
        self.assertGreater(put.streams_encoded, 0)
        hit = self.c.lookup(keys, model="chunky", ns="tenant")
        self.assertEqual((hit.hits, hit.hit_tokens, hit.keys), (1, ct, tuple(keys[:1])))
        # the rest, chained from the first; the first again is deduped
        r = self.c.put_chunks(keys[1:], k[:, ct:], v[:, ct:], model="chunky", ns="tenant", parent=keys[0])
        self.assertEqual((r.stored, r.deduped), (2, 0))
        again = self.c.put_chunks(keys[:2], k[:, :2 * ct], v[:, :2 * ct], model="chunky", ns="tenant")
        self.assertEqual((again.stored, again.deduped), (0, 2))
        self.assertEqual(self.c.lookup(keys, model="chunky", ns="tenant").hit_tokens, 3 * ct)
        if dquant.has_symbols("dqc_release_lease"):
            leased = self.c.lookup(keys, model="chunky", ns="tenant", lease_ms=5000)
            self.assertEqual(leased.hits, 3)
            self.assertNotEqual(leased.lease_id, 0)
            self.assertGreater(leased.lease_ms, 0)
            self.c.release_lease(leased.lease_id)
            with self.assertRaises(dquant.ClientError) as cm:    # released: no longer there
                self.c.release_lease(leased.lease_id)
            self.assertEqual(cm.exception.code, dquant.ErrorCode.NOT_FOUND)
        kg, vg = self.c.get_chunks(keys, ns="tenant")
        self.assertEqual((kg.shape, kg.dtype), (k.shape, np.float32))
        self.assertLess(nmse(k, kg), 0.05)
        self.assertLess(nmse(v, vg), 0.2)
        self.assertGreater(nmse(k, kg), 1e-4)                # stored compressed
        k1, _ = self.c.get_chunk(keys[1], ns="tenant", dtype="f16")
        self.assertEqual((k1.shape, k1.dtype), ((self.LAYERS, ct, self.KVH, self.HD), np.float16))
        self.assertTrue(np.allclose(k1.astype(np.float32), kg[:, ct:2 * ct], rtol=1e-3, atol=1e-3))
        if dquant.has_symbols("dqc_delete_chunk", "dqc_pin_chunk", "dqc_unpin_chunk"):
            self.c.pin_chunk(keys[2], ns="tenant")
            self.c.unpin_chunk(keys[2], ns="tenant")
            self.c.delete_chunk(keys[2], ns="tenant")
            self.assertEqual(self.c.lookup(keys, model="chunky", ns="tenant").hits, 2)   # the chain stops there
            with self.assertRaises(dquant.ClientError) as cm:
                self.c.delete_chunk(keys[2], ns="tenant")
            self.assertEqual(cm.exception.code, dquant.ErrorCode.NOT_FOUND)
            with self.assertRaises(dquant.ClientError) as cm:
                self.c.pin_chunk(keys[2], ns="tenant")
            self.assertEqual(cm.exception.code, dquant.ErrorCode.NOT_FOUND)
        # another namespace holds none of them
        self.assertEqual(self.c.lookup(keys, model="chunky", ns="other").hits, 0)
        with self.assertRaises(dquant.ClientError) as cm:
            self.c.get_chunk(keys[0], ns="other")
        self.assertEqual(cm.exception.code, dquant.ErrorCode.NOT_FOUND)

    def test_errors(self):
        ct = self.CT
        keys = dquant.chunk_keys("e", list(range(2 * ct)), ct)
        k, v = self.kv(ct, 13)
        with self.assertRaises(dquant.ClientError) as cm:         # the parent must be held
            self.c.put_chunks(keys[1:], k, v, model="chunky", ns="e", parent=keys[0])
        self.assertEqual(cm.exception.code, dquant.ErrorCode.NOT_FOUND)
        self.assertEqual(self.c.lookup(keys, model="chunky", ns="e").hits, 0)   # nothing stored
        if not dquant.has_symbols("dqc_release_lease"):           # a daemon without leases refuses them
            with self.assertRaises(dquant.ClientError) as cm:
                self.c.lookup(keys, model="chunky", ns="e", lease_ms=100)
            self.assertEqual(cm.exception.code, dquant.ErrorCode.UNSUPPORTED)
        k[0, 3, 1, 5] = np.nan
        with self.assertRaises(dquant.ClientError) as cm:
            self.c.put_chunks(keys[:1], k, v, model="chunky", ns="e")
        self.assertEqual(cm.exception.name, "NONFINITE")
        with self.assertRaises(ValueError):
            self.c.lookup([b"short"], model="chunky")
        with self.assertRaises(dquant.ClientError) as cm:     # 128 tokens are not 2 chunks of the model's 128
            self.c.put_chunks(keys, k, v, model="chunky", ns="e")
        self.assertEqual(cm.exception.code, dquant.ErrorCode.INVALID_ARGUMENT)
        with self.assertRaises(ValueError):                   # nor whole chunks of any size: refused in Python
            self.c.put_chunks(keys, k[:, :127], v[:, :127], model="chunky", ns="e")


if __name__ == "__main__":
    unittest.main()
