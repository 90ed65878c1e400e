#!/usr/bin/env python3
"""Chunk-key test vectors computed independently of proto/chunkkey.c: the preimage of every chunk is
built here from the spec in proto/chunkkey.h and hashed by xxhsum -H2 (XXH3-128, the xxhash package's
command-line tool), whose output is the key's canonical 16 bytes in hex.

    chunk_key_vectors.py            print the vectors (the file tests/proto/chunk_key_vectors.txt)
    chunk_key_vectors.py --check F  recompute every vector of F with xxhsum; exit 1 on a difference

Line format: ns <TAB> chunk_tokens <TAB> token ids, comma-separated <TAB> keys, comma-separated hex."""
import random
import struct
import subprocess
import sys


def xxh128(data: bytes) -> str:
    out = subprocess.run(["xxhsum", "-H2", "-"], input=data, capture_output=True, check=True).stdout
    return out.split()[0].decode()[-32:]


def chunk_keys(ns: str, chunk_tokens: int, tokens):
    nsb = ns.encode()
    parent = bytes(16)
    keys = []
    for i in range(len(tokens) // chunk_tokens):
        chunk = tokens[i * chunk_tokens:(i + 1) * chunk_tokens]
        pre = b"dqchunk1" + struct.pack("<I", len(nsb)) + nsb + parent + struct.pack("<I", len(chunk))
        pre += struct.pack("<%dI" % len(chunk), *chunk)
        key = xxh128(pre)
        keys.append(key)
        parent = bytes.fromhex(key)
    return keys


def cases():
    rng = random.Random(20261201)
    yield "m", 1, [7]
    yield "", 2, [0, 1, 2, 3, 4]
    yield "bytellama-19m", 4, [rng.randrange(256) for _ in range(13)]
    yield "tenantA/qwen3-8b", 256, [rng.randrange(151936) for _ in range(600)]
    yield "ns\u00e9", 128, [rng.randrange(2**32) for _ in range(384)]


def line(ns, ct, toks, keys):
    return "%s\t%d\t%s\t%s" % (ns, ct, ",".join(map(str, toks)), ",".join(keys))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        bad = 0
        n = 0
        for raw in open(sys.argv[2], encoding="utf-8"):
            ns, ct, toks, keys = raw.rstrip("\n").split("\t")
            toks = [int(t) for t in toks.split(",") if t]
            want = [k for k in keys.split(",") if k]
            got = chunk_keys(ns, int(ct), toks)
            n += 1
            if got != want:
                bad += 1
                print("mismatch for ns=%r chunk_tokens=%s: %s vs %s" % (ns, ct, got, want))
        print("%d vectors, %d differ" % (n, bad))
        return 1 if bad or not n else 0
    for ns, ct, toks in cases():
        print(line(ns, ct, toks, chunk_keys(ns, ct, toks)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
