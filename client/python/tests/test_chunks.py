"""The shared KV tier from Python: chunk keys against the independently computed vectors of
tests/proto/chunk_key_vectors.txt, and lookup / put_chunks / get_chunks against a real dquantd;
chunks shared by clients in other processes, a common prompt prefix found by LOOKUP, concurrent
PUT_CHUNKS storing a chunk once, and a lease under eviction pressure. Whatever needs a C function
libdquant-client lacks skips, saying which."""

import multiprocessing
import os
import pathlib
import time
import unittest

import dquant
from dqtest import REPO, Daemon, DaemonTest, need_numpy, need_symbols, nmse, np


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



# ---- clients in other processes (multiprocessing, spawn: each a fresh interpreter and its own
# connection; these functions run there) ----

SL, SQ, SKVH, SHD, SCT, SMODEL = 2, 4, 2, 64, 128, "shared"


def prompt_of(seed, n):
    return np.random.default_rng(seed).integers(0, 50000, size=n).tolist()


def kv_of(tokens):
    """K/V [SL, len(tokens), SKVH, SHD] f32 as a model would make them: a function of each token's id
    and position, so that prompts with a common prefix have the same K/V over it."""
    t = np.asarray(tokens, dtype=np.float64)[None, :, None, None]
    pos = np.arange(len(tokens), dtype=np.float64)[None, :, None, None]
    lay = np.arange(SL, dtype=np.float64)[:, None, None, None]
    j = np.arange(SKVH * SHD, dtype=np.float64).reshape(SKVH, SHD)[None, None]
    k = np.sin(t * 0.0137 + pos * 0.071 + j * 0.113 + lay * 1.7) + 0.3 * (j % 7)
    v = np.cos(t * 0.0291 + pos * 0.053 + j * 0.171 + lay * 0.9)
    return k.astype(np.float32), v.astype(np.float32)


def register_shared(c):
    return c.register_model(SMODEL, layers=SL, q_heads=SQ, kv_heads=SKVH, head_dim=SHD, profile="dq226",
                            chunk_tokens=SCT)


def child_put(addr, ns, tokens):
    """Another engine: stores the prompt's full chunks (keys computed here) and reads them back."""
    with dquant.Client(addr, timeout_ms=20000) as c:
        register_shared(c)
        keys = dquant.chunk_keys(ns, tokens, SCT)
        k, v = kv_of(tokens[:len(keys) * SCT])
        r = c.put_chunks(keys, k, v, model=SMODEL, ns=ns)
        return os.getpid(), keys, (r.stored, r.deduped), c.get_chunks_raw(keys, ns=ns)


def child_lookup(addr, ns, tokens):
    """Another engine: finds the prompt's chunks by its own keys and fetches what it holds."""
    with dquant.Client(addr, timeout_ms=20000) as c:
        register_shared(c)
        keys = dquant.chunk_keys(ns, tokens, SCT)
        hit = c.lookup(keys, model=SMODEL, ns=ns)
        kg, vg = c.get_chunks(keys[:hit.hits], ns=ns) if hit.hits else (None, None)
        return os.getpid(), keys, hit.hits, hit.hit_tokens, kg, vg


def child_race(addr, ns, tokens, raw, barrier):
    """One of several engines storing the same chunks at once: PUT_CHUNKS, or PUT_CHUNKS_RAW of
    records encoded in-process when raw."""
    with dquant.Client(addr, timeout_ms=20000) as c:
        info = register_shared(c)
        keys = dquant.chunk_keys(ns, tokens, SCT)
        k, v = kv_of(tokens)
        rec = dquant.RawKV.encode(k, v, info["profile"]) if raw else None
        barrier.wait(30)
        r = c.put_chunks_raw(keys, rec, model=SMODEL, ns=ns) if raw else c.put_chunks(keys, k, v, model=SMODEL, ns=ns)
        return raw, r.stored, r.deduped, r.streams_encoded


class TestSharedAcrossProcesses(DaemonTest):
    def setUp(self):
        need_numpy()
        need_symbols(*dquant.client.CHUNK_SYMBOLS, *dquant.client.RAW_SYMBOLS)
        self.c = self.daemon.client()
        register_shared(self.c)
        self.mp = multiprocessing.get_context("spawn")

    def tearDown(self):
        self.c.close()

    def stat(self, name):
        s = self.c.stats()
        return s["counters"][name] if name in s["counters"] else s["gauges"][name]

    def test_two_processes_share_chunks(self):
        tokens = prompt_of(31, 3 * SCT + 50)
        dedupe0 = self.stat("chunk_dedupe_hits")
        with self.mp.Pool(1) as a, self.mp.Pool(1) as b:
            pid_a, keys_a, (stored, deduped), raw_a = a.apply(child_put, (self.daemon.addr, "share", tokens))
            pid_b, keys_b, hits, hit_tokens, kb, vb = b.apply(child_lookup, (self.daemon.addr, "share", tokens))
        self.assertEqual(len({pid_a, pid_b, os.getpid()}), 3)
        self.assertEqual((stored, deduped), (3, 0))
        self.assertEqual(keys_b, keys_a)                          # computed apart, the same keys
        self.assertEqual((hits, hit_tokens), (3, 3 * SCT))
        # B's data are A's chunks: the decode of the records A read back, bit-exact
        ka, va = raw_a.decode()
        self.assertTrue(np.array_equal(kb, ka) and np.array_equal(vb, va))
        k, v = kv_of(tokens[:3 * SCT])
        self.assertLess(nmse(k, kb), 0.05)
        # this process stores the same prefix: nothing encoded, every chunk deduped
        r = self.c.put_chunks(keys_a, k, v, model=SMODEL, ns="share")
        self.assertEqual((r.stored, r.deduped, r.streams_encoded), (0, 3, 0))
        self.assertEqual(self.stat("chunk_dedupe_hits"), dedupe0 + 3)

    def test_common_prefix_hits_exactly_the_common_full_chunks(self):
        a = prompt_of(41, 5 * SCT + 30)
        self.c.put_chunks(dquant.chunk_keys("pfx", a, SCT)[:5], *kv_of(a[:5 * SCT]), model=SMODEL, ns="pfx")
        cases = [(2 * SCT + 44, 2), (3 * SCT, 3), (17, 0), (5 * SCT + 30, 5)]
        with self.mp.Pool(1) as other:
            for common, want in cases:
                rest = prompt_of(42 + common, 4 * SCT)
                if common < len(a) and rest[0] == a[common]:
                    rest[0] = (rest[0] + 1) % 50000
                b = a[:common] + rest                             # diverges at token `common`
                _, keys, hits, hit_tokens, kb, _ = other.apply(child_lookup, (self.daemon.addr, "pfx", b))
                self.assertEqual((hits, hit_tokens), (want, want * SCT), f"common prefix of {common} tokens")
                self.assertGreater(len(keys), want)
                if want:                                          # the hits are A's K/V over the prefix
                    ka, _ = self.c.get_chunks(dquant.chunk_keys("pfx", a, SCT)[:want], ns="pfx")
                    self.assertTrue(np.array_equal(kb, ka))

    def test_concurrent_puts_store_each_chunk_once(self):
        n = 4
        tokens = prompt_of(51, 3 * SCT)
        stored0, dedupe0, chunks0 = (self.stat(x) for x in ("chunks_put", "chunk_dedupe_hits", "chunks_stored"))
        enc0 = self.stat("streams_encoded")
        with self.mp.Manager() as mgr:
            barrier = mgr.Barrier(n)
            with self.mp.Pool(n) as pool:
                res = pool.starmap(child_race, [(self.daemon.addr, "race", tokens, i % 2 == 1, barrier)
                                                for i in range(n)])
        stored = sum(r[1] for r in res)
        self.assertEqual(stored, 3, f"each chunk stored once: {res}")
        self.assertEqual(sum(r[2] for r in res), 3 * (n - 1))
        self.assertEqual(self.stat("chunks_put"), stored0 + 3)
        self.assertEqual(self.stat("chunk_dedupe_hits"), dedupe0 + 3 * (n - 1))
        self.assertEqual(self.stat("chunks_stored"), chunks0 + 3)
        # encoded on the daemon: K and V of every token of every layer of the chunks PUT_CHUNKS stored
        by_bf16 = sum(r[1] for r in res if not r[0])
        self.assertEqual(sum(r[3] for r in res), by_bf16 * SCT * SL * 2)
        self.assertEqual(self.stat("streams_encoded"), enc0 + by_bf16 * SCT * SL * 2)
        self.assertEqual(self.c.lookup(dquant.chunk_keys("race", tokens, SCT), model=SMODEL, ns="race").hits, 3)


class TestLeaseUnderPressure(unittest.TestCase):
    """A daemon with a 3 MiB host budget holding two single chunks A and B; A is leased."""

    def setUp(self):
        need_numpy()
        need_symbols(*dquant.client.CHUNK_SYMBOLS, "dqc_release_lease")
        self.daemon = Daemon("--host-memory", "3M", "--workers", "1")
        self.c = self.daemon.client()
        register_shared(self.c)
        self.fill = kv_of(prompt_of(99, 512))
        self.next = 0

    def tearDown(self):
        self.c.close()
        self.daemon.stop()

    def stat(self, name):
        s = self.c.stats()
        return s["counters"][name] if name in s["counters"] else s["gauges"][name]

    def fill_until(self, chunks):
        """PUTs of fresh 512-token sequences until fewer than `chunks` chunks are held (watched
        through STATS, which touches nothing); the number of PUTs."""
        n = 0
        while self.stat("chunks_stored") >= chunks:
            self.assertLess(n, 400, f"no chunk evicted after {n} PUTs")
            self.c.put(f"fill-{self.next}", *self.fill, model=SMODEL, ns="lease")
            self.next += 1
            n += 1
        return n

    def hits(self, key):
        return self.c.lookup([key], model=SMODEL, ns="lease").hits

    def test_a_lease_survives_eviction_pressure_and_expires(self):
        ta, tb = prompt_of(61, SCT), prompt_of(62, SCT)
        ka, kb = dquant.chunk_keys("lease", ta, SCT)[0], dquant.chunk_keys("lease", tb, SCT)[0]
        self.c.put_chunks([ka], *kv_of(ta), model=SMODEL, ns="lease")
        self.c.put_chunks([kb], *kv_of(tb), model=SMODEL, ns="lease")
        lease_ms = 1500
        leased = self.c.lookup([ka], model=SMODEL, ns="lease", lease_ms=lease_ms)
        self.assertEqual((leased.hits, leased.lease_ms), (1, lease_ms))
        self.assertNotEqual(leased.lease_id, 0)
        self.assertEqual(self.stat("leases_active"), 1.0)
        self.assertEqual(self.hits(kb), 1)            # B is now the most recently used: unleased, A would go first
        evictions0 = self.stat("evictions")
        n = self.fill_until(2)
        self.assertEqual(self.stat("chunks_stored"), 1.0)
        self.assertGreater(self.stat("evictions"), evictions0)
        self.assertEqual(self.hits(ka), 1, f"the leased chunk stayed while {n} PUTs evicted the other")
        self.assertEqual(self.hits(kb), 0)
        # the lease runs out: A is evictable again
        time.sleep((lease_ms + 200) / 1000)
        self.assertEqual(self.stat("leases_active"), 0.0)
        self.assertEqual(self.stat("lease_expiries"), 1)
        with self.assertRaises(dquant.ClientError) as cm:
            self.c.release_lease(leased.lease_id)
        self.assertEqual(cm.exception.code, dquant.ErrorCode.NOT_FOUND)
        self.fill_until(1)
        self.assertEqual(self.hits(ka), 0)


if __name__ == "__main__":
    unittest.main()
