#!/usr/bin/env python3
"""Self-test of the dquant Python binding, without pytest: plain python3, numpy when present
(array checks are skipped without it), a dquantd binary when one is found ($DQUANTD or the
source tree's build folders; the client checks are skipped without one).

    python3 client/python/selftest.py            # prints one line per check, then "N passed, N failed"

Exit status 0 when nothing failed."""

import glob
import math
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import dquant  # noqa: E402

try:
    import numpy as np
except ImportError:
    np = None

RESULTS = {"passed": 0, "failed": 0, "skipped": 0}


def check(fn):
    name = fn.__name__
    try:
        fn()
    except SkipTest as s:
        RESULTS["skipped"] += 1
        print(f"[SKIP] {name}: {s}")
        return fn
    except Exception:
        RESULTS["failed"] += 1
        print(f"[FAIL] {name}")
        traceback.print_exc()
        return fn
    RESULTS["passed"] += 1
    print(f"[ OK ] {name}")
    return fn


class SkipTest(Exception):
    pass


def need_numpy():
    if np is None:
        raise SkipTest("numpy not installed")


def gaussian_kv(tokens, heads, dim, seed=1):
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((tokens, heads, dim)).astype(np.float32)
    k += (np.arange(dim) % 5 == 0).astype(np.float32) * 0.7   # channel offsets, as real keys have
    v = rng.standard_normal((tokens, heads, dim)).astype(np.float32)
    return k, v


def nmse(x, xh):
    x = np.asarray(x, dtype=np.float64)
    return float(((x - np.asarray(xh, dtype=np.float64)) ** 2).sum() / (x ** 2).sum())


# ---- no numpy needed ----

@check
def profiles_and_bits():
    assert dquant.builtin_names() == ["dq226", "dq196"]
    assert "kivi2" in dquant.baseline_names()
    p = dquant.Profile.builtin("dq226", 8, 128)
    assert p.container_bytes == (331, 231) and p.levels == (8, 6), p
    assert abs(p.bits_per_value() - 2.2578) < 1e-3, p.bits_per_value()
    assert sum(p.freq[0]) == 256 and sum(p.freq[1]) == 256
    assert abs(dquant.Profile.builtin("int2", 8, 128).bits_per_value() - 2.25) < 1e-12
    assert dquant.Profile.builtin("bf16", 2, 128).bits_per_value("k") == 16.0


@check
def profile_serialization_roundtrip():
    p = dquant.Profile.make(2, 128, container_bytes=(90, 64), levels=(9, 5), alpha=1.3, name="x")
    q = dquant.Profile.deserialize(p.serialize())
    assert (q.name, q.container_bytes, q.levels, q.freq) == ("x", (90, 64), (9, 5), p.freq)
    assert abs(q.alpha - 1.3) < 1e-6


@check
def errors_carry_codes():
    try:
        dquant.Profile.builtin("dq999", 8, 128)
    except dquant.DquantError as e:
        assert e.name == "PROFILE" and e.code == -7, e
    else:
        raise AssertionError("no error for an unknown profile")
    try:
        dquant.Profile.make(2, 128, container_bytes=(8, 8), levels=(8, 6))
    except dquant.DquantError as e:
        assert e.name == "CONTAINER_TOO_SMALL", e
    else:
        raise AssertionError("no error for a tiny container")


# ---- arrays ----

@check
def roundtrip_every_codec():
    need_numpy()
    k, v = gaussian_kv(300, 2, 128)
    seen = {}
    for name in ["dq226", "dq196", "int2", "quarot2", "kivi2", "turbo2", "bf16"]:
        kh, _ = dquant.roundtrip(k, name, kind="k")
        vh, _ = dquant.roundtrip(v, name, kind="v")
        assert kh.shape == k.shape and kh.dtype == np.float32
        seen[name] = (nmse(k, kh), nmse(v, vh))
    assert seen["bf16"][0] < 1e-4 and seen["bf16"][1] < 1e-4, seen
    assert seen["dq226"][0] < seen["dq196"][0] < seen["int2"][0], seen
    assert seen["dq226"][1] < seen["int2"][1], seen
    assert 0.01 < seen["dq226"][0] < 0.05 and 0.08 < seen["dq226"][1] < 0.2, seen


@check
def roundtrip_f16_in_f16_out():
    need_numpy()
    k, _ = gaussian_kv(130, 2, 64)
    kh, st = dquant.roundtrip(k.astype(np.float16), "dq226", kind="k")
    assert kh.dtype == np.float16 and st["streams"] == 130
    assert nmse(k, kh.astype(np.float32)) < 0.05


@check
def roundtrip_rejects_nonfinite_and_bad_shapes():
    need_numpy()
    k, _ = gaussian_kv(10, 2, 64)
    k[3, 1, 7] = np.nan
    try:
        dquant.roundtrip(k, "dq226", kind="k")
    except dquant.DquantError as e:
        assert e.name == "NONFINITE", e
    else:
        raise AssertionError("NaN accepted")
    with dquant.Codec("dq226", 2, 64) as c:
        try:
            c.roundtrip(np.zeros((4, 3, 64), np.float32))
        except ValueError:
            pass
        else:
            raise AssertionError("wrong shape accepted")


@check
def layer_append_decode_attend():
    need_numpy()
    k, v = gaussian_kv(300, 2, 64, seed=3)
    c = dquant.Codec("dq226", 2, 64)
    layer = c.layer()
    layer.append(k[:200], v[:200])
    layer.append(k[200:], v[200:])
    # W = R = 128: a window is sealed when the tail reaches 128 tokens
    assert layer.tokens == 300 and layer.sealed_tokens == 256 and layer.tail_tokens == 44, \
        (layer.sealed_tokens, layer.tail_tokens)
    kd = layer.decode("k")
    assert kd.shape == k.shape
    assert 1e-3 < nmse(k[:256], kd[:256]) < 0.05           # sealed: through the codec
    assert nmse(k[256:], kd[256:]) < 1e-4                  # tail: BF16
    rng = np.random.default_rng(9)
    q = rng.standard_normal((4, 64)).astype(np.float32)
    out, lse = c.attend(layer, q)
    ref, rlse = c.attend(layer, q, reference=True)
    assert out.shape == (4, 64) and lse.shape == (4,)
    assert np.abs(out - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max()), np.abs(out - ref).max()
    # against exact attention over the decoded cache (GQA: head h reads KV head h // 2)
    vd = layer.decode("v")
    for h in range(4):
        s = kd[:, h // 2, :] @ q[h] / math.sqrt(64)
        p = np.exp(s - s.max())
        p /= p.sum()
        o = p @ vd[:, h // 2, :]
        assert np.abs(o - out[h]).max() < 1e-3, (h, np.abs(o - out[h]).max())
        assert abs(float(np.log(np.exp(s - s.max()).sum()) + s.max()) - float(lse[h])) < 1e-3
    del layer
    c.close()


@check
def torch_tensors_if_present():
    try:
        import torch
    except ImportError:
        raise SkipTest("torch not installed")
    t = torch.randn(140, 2, 64, dtype=torch.bfloat16)
    th, _ = dquant.roundtrip(t, "dq226", kind="v")
    assert isinstance(th, torch.Tensor) and th.dtype == torch.bfloat16 and th.shape == t.shape
    e = ((t.float() - th.float()) ** 2).sum() / (t.float() ** 2).sum()
    assert float(e) < 0.2, float(e)


# ---- the daemon through libdquant-client ----

def find_daemon():
    env = os.environ.get("DQUANTD")
    if env and os.access(env, os.X_OK):
        return env
    repo = HERE.parent.parent
    for p in [repo / "build" / "daemon" / "dquantd"] + sorted(map(pathlib.Path, glob.glob(str(repo / "build*/daemon/dquantd")))):
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


@check
def client_against_daemon():
    need_numpy()
    binary = find_daemon()
    if not binary:
        raise SkipTest("no dquantd binary (set DQUANTD or build daemon/dquantd)")
    tmp = tempfile.mkdtemp(prefix="dquant-py-")
    sock = os.path.join(tmp, "d.sock")
    log = open(os.path.join(tmp, "daemon.log"), "wb")
    proc = subprocess.Popen([binary, "--listen", f"unix:{sock}", "--metrics", "off", "--log-level", "warn"],
                            stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        deadline = time.time() + 10
        while time.time() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"dquantd exited ({proc.returncode}); see {tmp}/daemon.log")
            try:
                s = socket.socket(socket.AF_UNIX)
                s.connect(sock)
                s.close()
                break
            except OSError:
                time.sleep(0.02)
        with dquant.Client(f"unix:{sock}", timeout_ms=10000) as c:
            c.ping(b"hello")
            info = c.server()
            assert info["version"] == 1, info
            reg = c.register_model("py", layers=2, q_heads=4, kv_heads=2, head_dim=64, profile="dq226")
            assert abs(reg["bits_per_value"] - dquant.Profile.builtin("dq226", 2, 64).bits_per_value()) < 1e-6
            assert dquant.Profile.deserialize(reg["profile"]).name == "dq226"
            rng = np.random.default_rng(5)
            k = rng.standard_normal((2, 200, 2, 64)).astype(np.float32)
            v = rng.standard_normal((2, 200, 2, 64)).astype(np.float32)
            put = c.put("seq-1", k, v, model="py")
            assert put["tokens"] == 200, put
            kg, vg = c.get("seq-1")
            assert kg.shape == k.shape and vg.shape == v.shape
            assert nmse(k, kg) < 0.05 and nmse(v, vg) < 0.2
            # the server's attention equals the local codec's on the same tokens
            q = rng.standard_normal((4, 64)).astype(np.float32)
            out, lse = c.attend("seq-1", layer=1, q=q)
            codec = dquant.Codec("dq226", 2, 64)
            layer = codec.layer()
            layer.append(k[1], v[1])
            lo, llse = codec.attend(layer, q)
            assert np.abs(out - lo).max() < 1e-3 and np.abs(lse - llse).max() < 1e-3, np.abs(out - lo).max()
            st = c.stats()
            assert st["counters"], st
            c.pin("seq-1")
            c.unpin("seq-1")
            c.delete("seq-1")
            try:
                c.get("seq-1")
            except dquant.ClientError as e:
                assert e.name == "NOT_FOUND", e
            else:
                raise AssertionError("deleted sequence still readable")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed, {RESULTS['skipped']} skipped")
    sys.exit(1 if RESULTS["failed"] else 0)
