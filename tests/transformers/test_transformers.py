#!/usr/bin/env python3
"""dquant.transformers with Hugging Face transformers and a real model (the GPU host: torch and
transformers are not in CI, where client/python/tests/test_kvtier.py checks the layer below).

    DQUANTD=build-gpu/daemon/dquantd DQ_MODEL_DIR=.models/bytellama-n1024 \
    DQ_TORCH_DEVICE=cuda DQ_BACKEND=cuda  python3 tests/transformers/test_transformers.py -v

DQ_TORCH_DEVICE: where the model runs (cuda when there is a GPU, else cpu); DQ_BACKEND: dquantd's
backend (cuda with a CUDA model, else cpu). The model folder defaults to ../shared/data's
bytellama-n1024. Skips without torch or transformers (exit 77, meson's skip), a model or a daemon.

Checks: model.generate through DquantCache at batch 1 and 8 (prompts of different lengths) in both
decode modes; greedy agreement with the model's own BF16 cache, teacher-forced, >= 95%; a second
batch sharing prefixes runs the model only on the positions the tier lacks; errors surface as
exceptions (daemon gone mid-generation, a model loaded without the dquant attention)."""

from __future__ import annotations

import os
import pathlib
import sys
import unittest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "client" / "python" / "tests"))

try:
    import torch
    import transformers  # noqa: F401
    from transformers import AutoModelForCausalLM, DynamicCache
except ImportError as e:  # CI: no torch / transformers
    print(f"skipped: {e} (the transformers tests run on the GPU host)")
    sys.exit(77)                 # meson's "skipped"

import dquant  # noqa: E402
import dquant.transformers as dqt  # noqa: E402
from dqtest import Daemon  # noqa: E402

MODEL = pathlib.Path(os.environ.get("DQ_MODEL_DIR", REPO.parent / "shared" / "data" / "bytellama-n1024"))
DEVICE = os.environ.get("DQ_TORCH_DEVICE", "cuda" if torch.cuda.is_available() else "cpu")
BACKEND = os.environ.get("DQ_BACKEND", "cuda" if DEVICE == "cuda" else "cpu")
NEW = 32


def positions(mask):
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)


def prompts_at(text, offsets, lengths):
    return [list(text[o:o + n]) for o, n in zip(offsets, lengths)]


class TransformersTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not (MODEL / "model.safetensors").is_file():
            raise unittest.SkipTest(f"no model at {MODEL} (set DQ_MODEL_DIR)")
        cls.daemon = Daemon("--backend", BACKEND)
        cls.model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.bfloat16,
                                                         attn_implementation=dqt.ATTENTION).to(DEVICE).eval()
        cls.text = (MODEL / "heldout.txt").read_bytes()
        cls.c = cls.daemon.client(timeout_ms=60000)
        assert cls.c.server()["backend"] == BACKEND, cls.c.server()

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.daemon.stop()

    def batch(self, n, base, seed_len=300):
        lengths = [seed_len + 53 * i for i in range(n)]               # 300 .. 671 tokens: partial chunks
        return prompts_at(self.text, [base + 20000 * i for i in range(n)], lengths)

    def reference(self, prompts, steps, forced=None):
        """The model with its own cache (DynamicCache): tokens and logits of each step."""
        P = max(map(len, prompts))
        ids = torch.tensor([[0] * (P - len(p)) + p for p in prompts], device=DEVICE)
        mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts], device=DEVICE)
        cache = DynamicCache()
        lg = self.model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), past_key_values=cache).logits[:, -1]
        toks, logits = [], []
        for s in range(steps):
            toks.append(lg.float().argmax(-1))
            logits.append(lg.float())
            if s + 1 == steps:
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            nxt = toks[-1] if forced is None else forced[:, s]
            lg = self.model(input_ids=nxt[:, None], attention_mask=mask, position_ids=positions(mask)[:, -1:],
                            past_key_values=cache).logits[:, -1]
        return torch.stack(toks, 1), torch.stack(logits, 1)

    def forced(self, cache, ids, mask, ref_tok):
        """The model on a prepared DquantCache, teacher-forced along ref_tok: logits of each step."""
        n = ids.shape[1] - cache.get_seq_length()
        lg = self.model(input_ids=ids[:, -n:], attention_mask=mask, position_ids=positions(mask)[:, -n:],
                        past_key_values=cache).logits[:, -1]
        logits = [lg.float()]
        for s in range(1, ref_tok.shape[1]):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            lg = self.model(input_ids=ref_tok[:, s - 1:s], attention_mask=mask, position_ids=positions(mask)[:, -1:],
                            past_key_values=cache).logits[:, -1]
            logits.append(lg.float())
        return torch.stack(logits, 1)

    @torch.inference_mode()
    def test_agreement_both_modes_batch8(self):
        prompts = self.batch(8, 100000)
        ref_tok, ref_lg = self.reference(prompts, NEW)
        for mode in ("attend", "fetch"):
            cache = dqt.DquantCache(self.c, self.model, mode=mode, ns=f"agree-{mode}")
            ids, mask = cache.prepare(prompts)
            lg = self.forced(cache, ids, mask, ref_tok)
            agree = (lg.argmax(-1) == ref_tok).float().mean().item()
            lp, lq = torch.log_softmax(ref_lg, -1), torch.log_softmax(lg, -1)
            kl = (lp.exp() * (lp - lq)).sum(-1)
            print(f"\n{MODEL.name} {mode} batch 8 ({DEVICE}, {BACKEND} backend): greedy agreement {agree:.4f}, "
                  f"KL mean {kl.mean().item():.5f} max {kl.max().item():.4f}")
            self.assertGreaterEqual(agree, 0.95)
            self.assertTrue(torch.equal(lg[:, 0].argmax(-1), ref_tok[:, 0]))   # cold prefill: exact
            cache.delete()

    @torch.inference_mode()
    def test_generate_batch1_and_8(self):
        for n in (1, 8):
            prompts = self.batch(n, 300000 + 1000 * n)
            P = max(map(len, prompts))
            ids = torch.tensor([[0] * (P - len(p)) + p for p in prompts], device=DEVICE)
            mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts], device=DEVICE)
            ref = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                                      pad_token_id=0)
            for mode in ("attend", "fetch"):
                cache = dqt.DquantCache(self.c, self.model, mode=mode, ns=f"gen-{mode}")
                ids2, mask2 = cache.prepare(prompts)
                self.assertTrue(torch.equal(ids2, ids))
                out = self.model.generate(input_ids=ids2, attention_mask=mask2, past_key_values=cache,
                                          max_new_tokens=NEW, do_sample=False, pad_token_id=0)
                self.assertEqual(tuple(out.shape), (n, P + NEW))
                new, ref_new = out[:, P:], ref[:, P:]
                self.assertTrue(torch.equal(new[:, 0], ref_new[:, 0]))
                # free-running greedy: the same tokens up to the first divergence; report the prefix
                same = (new == ref_new).cumprod(1).sum(1).tolist()
                print(f"\n{MODEL.name} generate batch {n} {mode}: identical leading tokens per row {same} of {NEW}")
                if mode == "attend":   # the decoded tokens were appended to the daemon's sequences
                    for r, p in zip(cache.tier.rows, prompts):
                        k, _ = self.c.get(r.seq, ns=f"gen-{mode}")
                        self.assertEqual(k.shape[1], len(p) - r.prefix * cache.tier.chunk_tokens + NEW - 1)
                cache.delete()

    @torch.inference_mode()
    def test_prefix_hits_skip_prefill(self):
        ns = "hits"
        first = self.batch(4, 500000, seed_len=700)
        cache = dqt.DquantCache(self.c, self.model, mode="attend", ns=ns)
        ids, mask = cache.prepare(first)
        self.assertEqual(cache.skipped_tokens, 0)
        self.model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), past_key_values=cache)
        ct = cache.tier.chunk_tokens
        second = [p[:2 * ct] + list(self.text[700000 + 999 * i:700000 + 999 * i + 100]) for i, p in enumerate(first)]
        seen = []
        hook = self.model.get_input_embeddings().register_forward_hook(lambda m, a, o: seen.append(a[0].shape[1]))
        try:
            ref_tok, ref_lg = self.reference(second, 8)
            seen.clear()
            c2 = dqt.DquantCache(self.c, self.model, mode="attend", ns=ns)
            ids2, mask2 = c2.prepare(second)
            self.assertEqual([r.hits for r in c2.tier.rows], [2] * 4)
            self.assertEqual(c2.get_seq_length(), 2 * ct)           # all rows: same length, 2 chunks held
            self.assertEqual(c2.skipped_tokens, 4 * 2 * ct)
            lg = self.forced(c2, ids2, mask2, ref_tok)
            self.assertEqual(seen[0], ids2.shape[1] - 2 * ct)       # the prefill ran on the rest only
        finally:
            hook.remove()
        agree = (lg.argmax(-1) == ref_tok).float().mean().item()
        print(f"\n{MODEL.name} second wave: {c2.skipped_tokens} prompt tokens from the tier, agreement {agree:.3f}")
        self.assertGreaterEqual(agree, 0.9)

    @torch.inference_mode()
    def test_errors(self):
        # attend mode needs the dquant attention
        sdpa = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.bfloat16, attn_implementation="sdpa")
        with self.assertRaises(ValueError):
            dqt.DquantCache(self.c, sdpa, mode="attend")
        # a cache used before prepare()
        cache = dqt.DquantCache(self.c, self.model, mode="attend", ns="errs")
        ids = torch.tensor([[1, 2, 3]], device=DEVICE)
        with self.assertRaises(RuntimeError):
            self.model(input_ids=ids, past_key_values=cache)
        # sequences that vanish mid-generation: ClientError out of generate, not wrong logits
        prompts = self.batch(2, 900000)
        cache = dqt.DquantCache(self.c, self.model, mode="attend", ns="errs")
        ids, mask = cache.prepare(prompts)
        self.model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), past_key_values=cache)
        cache.delete()
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        with self.assertRaises(dquant.ClientError) as cm:
            self.model(input_ids=ids[:, -1:], attention_mask=mask, position_ids=positions(mask)[:, -1:],
                       past_key_values=cache)
        self.assertEqual(cm.exception.code, dquant.ErrorCode.NOT_FOUND)


if __name__ == "__main__":
    unittest.main()
