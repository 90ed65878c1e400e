"""dquant.kvtier through a real dquantd, driven by a numpy Llama (tinyllama.py): what
dquant.transformers' cache does inside transformers, checked without transformers.

- a batch of prompts of different lengths generates in both decode modes close to the exact local
  cache, with the chunks, sequences and tails the bookkeeping says;
- a second wave sharing prefixes hits the tier and runs the model only on the rest;
- a decode engine in another process continues the sequences bit for bit like one process;
- errors raise."""

from __future__ import annotations

import multiprocessing
import unittest

from dqtest import DaemonTest, need_numpy, need_symbols, np

import dquant
from dquant.kvtier import ModelShape, TierBatch, prefix_chunks

try:
    from tinyllama import Engine, TinyLlama, kl, prompts_of
except ImportError:  # numpy missing: need_numpy() skips the tests
    Engine = TinyLlama = kl = prompts_of = None

CT = 128          # chunk tokens (one window of dq226)
STEPS = 8


def shape_of(m, name="tiny") -> ModelShape:
    return ModelShape(name, m.layers, m.q_heads, m.kv_heads, m.head_dim)


class TestPlan(unittest.TestCase):
    def test_prefix_chunks(self):
        self.assertEqual(prefix_chunks(300, 2, 128), 2)
        self.assertEqual(prefix_chunks(256, 2, 128), 1)      # a sequence keeps at least one token
        self.assertEqual(prefix_chunks(257, 2, 128), 2)
        self.assertEqual(prefix_chunks(90, 0, 128), 0)
        self.assertEqual(prefix_chunks(1, 0, 128), 0)


class TestKvTier(DaemonTest):
    def setUp(self):
        need_numpy()
        need_symbols(*dquant.client.CHUNK_SYMBOLS, "dqc_put_on_prefix")
        self.model = TinyLlama()
        self.engine = Engine(self.model)
        self.c = self.daemon.client()

    def tearDown(self):
        self.c.close()

    def batch(self, mode, ns):
        return TierBatch(self.c, shape_of(self.model), mode=mode, ns=ns, chunk_tokens=CT)

    def counter(self, name):
        return self.c.stats()["counters"].get(name, 0)

    def test_modes_match_local_cache(self):
        """Cold batch (no hits): prefill is exact, the first token equals the local run's; decoding
        through the tier (both modes) stays close to the exact cache, teacher-forced on its
        tokens; ATTEND on the containers equals local attention over the decompressed prompt."""
        prompts = prompts_of(np.random.default_rng(1), [300, 256, 90], self.model.vocab)
        ref_tok, ref_lg = self.engine.reference(prompts, STEPS)
        stored0 = self.counter("chunks_put")
        res = {}
        for mode in ("attend", "fetch"):
            b = self.batch(mode, f"modes-{mode}")
            tok, lg = self.engine.tier(b, prompts, STEPS, forced=ref_tok)
            self.assertEqual(self.engine.prefill_positions, 300)        # nothing held: the whole batch runs
            np.testing.assert_allclose(lg[:, 0], ref_lg[:, 0], rtol=1e-5, atol=1e-4)
            self.assertTrue((tok[:, 0] == ref_tok[:, 0]).all())
            res[mode] = (b, tok, lg)
        # chunks: 2 of the 300-token prompt, 2 of the 256-token one, none of the 90; per mode (two namespaces)
        self.assertEqual(self.counter("chunks_put") - stored0, 8)
        for mode in ("attend", "fetch"):
            b, tok, lg = res[mode]
            self.assertEqual([r.prefix for r in b.rows], [2, 1, 0])
            self.assertEqual([len(r.keys) for r in b.rows], [2, 2, 0])
            div = kl(ref_lg[:, 1:], lg[:, 1:])
            self.assertLess(float(div.mean()), 0.05, f"{mode}: mean KL vs the exact cache {div.mean():.4f}")
            self.assertGreaterEqual(float((tok[:, 1:] == ref_tok[:, 1:]).mean()), 0.8)
        # attend (containers on the daemon) vs fetch (decompressed, attended locally): the same values
        np.testing.assert_allclose(res["attend"][2], res["fetch"][2], rtol=2e-3, atol=2e-3)
        # the sequences: each holds its private tail, the decode tokens appended in attend mode
        b = res["attend"][0]
        for r, tail in zip(b.rows, [300 - 256, 256 - 128, 90]):
            k, _ = self.c.get(r.seq, ns=b.ns)
            self.assertEqual(k.shape[1], tail + STEPS - 1)
        b = res["fetch"][0]
        for r, tail in zip(b.rows, [300 - 256, 256 - 128, 90]):
            self.assertEqual(self.c.get(r.seq, ns=b.ns)[0].shape[1], tail)
        res["attend"][0].delete()
        with self.assertRaises(dquant.ClientError) as cm:
            self.c.get(res["attend"][0].rows[0].seq, ns="modes-attend")
        self.assertEqual(cm.exception.code, dquant.ErrorCode.NOT_FOUND)

    def test_second_wave_hits(self):
        """Prompts sharing prefixes with stored ones: LOOKUP hits exactly the common full chunks, the
        model runs only from the first position some row lacks, held chunks are not sent again."""
        rng = np.random.default_rng(2)
        ns = "waves"
        first = prompts_of(rng, [400, 300], self.model.vocab)
        self.engine.tier(self.batch("attend", ns), first, 2)
        stored = self.counter("chunks_put")
        second = [first[0][:300] + prompts_of(rng, [60], self.model.vocab)[0],   # 2 common chunks (+44 tokens)
                  first[1][:256] + prompts_of(rng, [150], self.model.vocab)[0]]  # 2 common chunks
        b = self.batch("attend", ns)
        ref_tok, ref_lg = self.engine.reference(second, 4)
        tok, lg = self.engine.tier(b, second, 4, forced=ref_tok)
        self.assertEqual([r.hits for r in b.rows], [2, 2])
        self.assertEqual([r.pad for r in b.rows], [46, 0])
        self.assertEqual(b.skip, 256)                          # both rows hold 256 own tokens there
        self.assertEqual(self.engine.prefill_positions, 406 - 256)
        # new chunks: row 0 has 2 full chunks (both held), row 1 has 3 (one new)
        self.assertEqual(self.counter("chunks_put") - stored, 1)
        # the prefill over decompressed held KV is close to the exact one
        self.assertLess(float(kl(ref_lg, lg).mean()), 0.05)
        st = self.c.stats()["counters"]
        self.assertGreaterEqual(st.get("lookup_hit_tokens", 0), 4 * CT)

    def test_disaggregated_attach(self):
        """A prefill engine (another process) stores the batch and hands over its sequence keys and
        first tokens; this decode engine continues them and produces the same logits, bit for bit
        in attend mode, as one process doing both."""
        prompts = prompts_of(np.random.default_rng(3), [330, 140, 260], self.model.vocab)
        for mode in ("attend", "fetch"):
            one = self.batch(mode, f"one-{mode}")
            tok1, lg1 = self.engine.tier(one, prompts, STEPS)
            ctx = multiprocessing.get_context("fork")
            q = ctx.Queue()
            p = ctx.Process(target=_prefill_engine, args=(self.daemon.addr, mode, f"two-{mode}", prompts, q))
            p.start()
            seq_keys, first = q.get(timeout=120)
            p.join(60)
            self.assertEqual(p.exitcode, 0)
            self.assertTrue((np.asarray(first) == tok1[:, 0]).all())
            dec = self.batch(mode, f"two-{mode}")
            tok2, lg2 = self.engine.attached(dec, seq_keys, prompts, first, STEPS)
            if mode == "attend":
                np.testing.assert_array_equal(lg2, lg1[:, 1:])
            else:
                np.testing.assert_allclose(lg2, lg1[:, 1:], rtol=1e-5, atol=1e-5)
            self.assertTrue((tok2 == tok1[:, 1:]).all())

    def test_errors(self):
        m = self.model
        b = self.batch("attend", "errs")
        with self.assertRaises(ValueError):
            b.prepare([[1, 2], []])
        prompts = prompts_of(np.random.default_rng(4), [200, 50], m.vocab)
        b.prepare(prompts)
        q = np.zeros((2, m.q_heads, 1, m.head_dim), np.float32)
        with self.assertRaises(ValueError):        # not stored yet
            b.attend(0, q)
        with self.assertRaises(ValueError):
            b.prepare(prompts)                      # one batch per TierBatch
        b.release()
        tok, _ = self.engine.tier(self.batch("attend", "errs2"), prompts, 1)
        b2 = self.batch("attend", "errs2")
        b2.attach(["nope-1", "nope-2"], prompts)
        kv = np.zeros((2, m.kv_heads, 1, m.head_dim), np.float32)
        with self.assertRaises(dquant.ClientError) as cm:   # sequences that do not exist
            b2.attend(0, q, kv, kv)
        self.assertEqual(cm.exception.code, dquant.ErrorCode.NOT_FOUND)
        with self.assertRaises(ValueError):                 # wrong query shape
            b2.attend(0, q[:, :, :, :8])
        with self.assertRaises(dquant.ClientError) as cm:   # another spec under the same model name
            TierBatch(self.c, ModelShape("tiny", m.layers + 1, m.q_heads, m.kv_heads, m.head_dim), chunk_tokens=CT)
        self.assertEqual(cm.exception.code, dquant.ErrorCode.EXISTS)
        with self.assertRaises(ValueError):
            TierBatch(self.c, shape_of(m), mode="sideways")


def _prefill_engine(addr, mode, ns, prompts, q):
    """The prefill engine of test_disaggregated_attach, in a child process: its own client."""
    with dquant.Client(addr, timeout_ms=20000) as c:
        b = TierBatch(c, shape_of(TinyLlama()), mode=mode, ns=ns, chunk_tokens=CT)
        tok, _ = Engine(TinyLlama()).tier(b, prompts, 1)
        q.put(([r.seq for r in b.rows], tok[:, 0].tolist()))


if __name__ == "__main__":
    unittest.main()
