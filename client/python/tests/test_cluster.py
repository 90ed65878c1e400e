"""dquant.Cluster, the multi-node client (dqc_cluster), from Python against three dquantd: the same
calls as Client with keys spread by rendezvous hashing, two copies of each, reads that keep working
while a daemon is killed, the shared tier's chunk trees placed by their first chunk, and an ATTEND
batch over every member equal to the daemons' own answers."""

import unittest

import dquant
from dqtest import Daemon, need_numpy, need_symbols, np

L, QH, KVH, HD, CT = 2, 4, 2, 64, 128


def kv(seed, tokens):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((L, tokens, KVH, HD)).astype(np.float32),
            rng.standard_normal((L, tokens, KVH, HD)).astype(np.float32))


class TestCluster(unittest.TestCase):
    def setUp(self):
        need_numpy()
        need_symbols("dqc_cluster_create")
        self.daemons = [Daemon() for _ in range(3)]
        self.addrs = [d.addr for d in self.daemons]

    def tearDown(self):
        for d in self.daemons:
            d.stop()

    def cluster(self, **kw):
        kw.setdefault("replicas", 2)
        kw.setdefault("write_quorum", 1)
        c = dquant.Cluster(self.addrs, io_timeout_ms=2000, down_backoff_ms=100, **kw)
        c.register_model("m", layers=L, q_heads=QH, kv_heads=KVH, head_dim=HD, chunk_tokens=CT)
        return c

    def test_bad_arguments(self):
        with self.assertRaises(dquant.ClientError) as cm:
            dquant.Cluster("")
        self.assertEqual(cm.exception.code, dquant.ErrorCode.INVALID_ARGUMENT)
        with self.assertRaises(dquant.ClientError) as cm:
            dquant.Cluster(self.addrs, replicas=2, write_quorum=3)
        self.assertIn("write_quorum", str(cm.exception))
        with self.cluster() as c:
            keys = [bytes([i]) * 16 for i in range(3)]
            k, v = kv(1, CT)
            with self.assertRaises(ValueError):
                c.put_chunks(keys[1:2], k, v, model="m", parent=keys[2], prefix=keys[:1])
            with self.assertRaises(dquant.UnsupportedError):
                c.server()

    def test_sequences_survive_a_killed_member(self):
        with self.cluster() as c:
            self.assertEqual(sorted(m["id"] for m in c.members()), sorted(self.addrs))
            data = {}
            for i in range(12):
                k, v = kv(i, 128)
                c.put(f"s{i}", k, v, model="m", ns="t")
                data[f"s{i}"] = c.get(f"s{i}", ns="t")
            # Each sequence is on its first two members, exactly.
            for key in data:
                where = c.locate(key, ns="t")
                self.assertEqual(len(where), 3)
                for rank, addr in enumerate(where):
                    with dquant.Client(addr) as one:
                        if rank < 2:
                            k2, _ = one.get(key, ns="t")
                            np.testing.assert_array_equal(k2, data[key][0])
                        else:
                            with self.assertRaises(dquant.ClientError) as cm:
                                one.get(key, ns="t")
                            self.assertEqual(cm.exception.name, "NOT_FOUND")
            victim = c.locate("s0", ns="t")[0]
            next(d for d in self.daemons if d.addr == victim).proc.kill()
            for key, (k, v) in data.items():
                k2, v2 = c.get(key, ns="t")
                np.testing.assert_array_equal(k2, k)
                np.testing.assert_array_equal(v2, v)
            st = c.cluster_stats()
            self.assertGreaterEqual(st["marked_down"], 1)
            self.assertGreater(st["failovers"], 0)
            self.assertFalse(next(m for m in c.members() if m["id"] == victim)["up"])
            k, v = kv(99, 64)
            c.put("s0", k, v, model="m", ns="t", start_token=128)     # appends keep working (W = 1)
            self.assertEqual(c.get("s0", ns="t")[0].shape[1], 192)

    def test_chunk_trees_and_attend(self):
        need_symbols("dqc_cluster_put_chunks")
        with self.cluster(replicas=1) as c:
            tokens = list(range(3 * CT))
            keys = dquant.chunk_keys("t", tokens, CT)
            self.assertEqual(c.lookup(keys, model="m", ns="t").hits, 0)
            k, v = kv(5, 3 * CT)
            c.put_chunks(keys[:1], k[:, :CT], v[:, :CT], model="m", ns="t")
            r = c.put_chunks(keys[1:], k[:, CT:], v[:, CT:], model="m", ns="t", prefix=keys[:1])
            self.assertEqual(r.stored, 2)
            hit = c.lookup(keys, model="m", ns="t")
            self.assertEqual(hit.hits, 3)
            home = c.locate_chunks(keys[0], ns="t")[0]
            with dquant.Client(home) as one:                  # the whole tree on its first chunk's member
                self.assertEqual(one.lookup(keys, model="m", ns="t").hits, 3)
                kc, vc = one.get_chunks(keys[1:], ns="t")
            k2, v2 = c.get_chunks(keys[1:], ns="t", root=keys[0])
            np.testing.assert_array_equal(k2, kc)
            np.testing.assert_array_equal(v2, vc)
            # A sequence on the prefix, placed on another member: the chunks are copied there.
            key = next(f"r{i}" for i in range(100) if c.locate(f"r{i}", ns="t")[0] != home)
            kt, vt = kv(6, 32)
            c.put(key, kt, vt, model="m", ns="t", prefix_chunks=keys)
            self.assertEqual(c.cluster_stats()["repaired_chunks"], 3)
            # One batch over every member equals each member's own answer.
            names = [key] + [f"p{i}" for i in range(6)]
            for m in {m["id"] for m in c.members()} - {c.locate(n, ns="t")[0] for n in names}:  # random paths
                names.append(next(f"q{i}" for i in range(1000) if c.locate(f"q{i}", ns="t")[0] == m))
            for i, n in enumerate(names[1:]):
                c.put(n, *kv(10 + i, 96), model="m", ns="t")
            rng = np.random.default_rng(3)
            items = [(n, i % L, rng.standard_normal((QH, HD)).astype(np.float32), None, None)
                     for i, n in enumerate(names)]
            out, lse = c.attend_batch(items, ns="t")
            for i, item in enumerate(items):
                with dquant.Client(c.locate(item[0], ns="t")[0]) as one:
                    o1, l1 = one.attend_batch([item], ns="t")
                np.testing.assert_array_equal(out[i], o1[0])
                np.testing.assert_array_equal(lse[i], l1[0])
            self.assertEqual(len({c.locate(n, ns="t")[0] for n in names}), 3, "the batch spans every member")


if __name__ == "__main__":
    unittest.main()
