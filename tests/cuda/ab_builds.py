#!/usr/bin/env python3
"""ab_builds — A/B of libdquant-cuda builds of one tree on the GPU host (tests/bench/GPU_NOTES.md).

Each variant is a name and the preprocessor definitions its build passes to nvcc, e.g.

    tests/cuda/ab_builds.py --variant main= --variant pairs=-DHW_PAIR=2 --rounds 2 \\
        --out $OUT/ab -- --layouts fixed226 --phases attn,e2e-fixed226 --e2e 32868 \\
        --shapes 128:8292,1:131172,126:32868 --time-budget 100

Every variant gets its own release build (build-ab-NAME, `-Dcuda_args`, only the dquant-cuda
target), all built at once. Then bench_truth.py runs the variants in turn, round after round (A, B,
A, B: a drift of the machine's clocks shows up in both), with `--bf16 none` unless the arguments
after `--` pick candidates. The output folder gets three files, whatever the number of runs:
runs.log (every run's output), runs.json (every run's rows) and summary.txt, also printed: per
shape and per end-to-end context, each variant's figure in every round, their median, and the
median against the first variant's.

--no-build benches the build folders as they are; --self-test checks the summary on synthetic
rows and, where torch is installed, the whole path with bench_truth.py --sim (no GPU)."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Tuple

REPO = pathlib.Path(__file__).resolve().parents[2]
TRUTH = REPO / "tests" / "cuda" / "bench_truth.py"


def log(*a: Any) -> None:
    print(*a, flush=True)


def parse_variant(text: str) -> Tuple[str, List[str]]:
    """NAME=DEFINES: a name of letters, digits, '-', '_' and the nvcc arguments (-DX=Y ...)."""
    name, sep, defs = text.partition("=")
    if not sep or not name or not all(c.isalnum() or c in "-_" for c in name):
        raise ValueError(f"--variant {text!r}: NAME=DEFINES (a name of letters, digits, - and _)")
    args = shlex.split(defs)
    for a in args:
        if not a.startswith("-D") or len(a) < 3 or "'" in a:
            raise ValueError(f"--variant {text!r}: {a!r} is not a -DNAME[=VALUE] definition")
    return name, args


def build_dir(name: str) -> pathlib.Path:
    return REPO / f"build-ab-{name}"


def build(name: str, defs: List[str]) -> Tuple[str, int, str]:
    """meson setup (an existing folder: meson configure, which takes the new definitions where
    setup --reconfigure kept the old ones) and compile of dquant-cuda; returns (name, exit status,
    output)."""
    d = build_dir(name)
    cuda_args = "-Dcuda_args=[" + ",".join(f"'{a}'" for a in defs) + "]"
    if (d / "build.ninja").exists():
        setup = ["meson", "configure", str(d), cuda_args]
    else:
        setup = ["meson", "setup", "--buildtype=release", "-Dcuda=enabled", "-Dtests=false", cuda_args, str(d)]
    out = ""
    for cmd in (setup, ["meson", "compile", "-C", str(d), "dquant-cuda"]):
        p = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out += f"$ {' '.join(cmd)}\n{p.stdout}"
        if p.returncode:
            return name, p.returncode, out
    return name, 0, out


def row_key(r: Dict[str, Any]) -> Optional[str]:
    if r.get("kind") == "attention":
        return f"attention ({r.get('batch')}, {r.get('context')}) [{r.get('layout')}]"
    if r.get("kind") == "e2e":
        return f"e2e {r.get('context')} [{r.get('layout')}]"
    return None


def row_figures(r: Dict[str, Any]) -> Dict[str, float]:
    """What a row contributes: attention dq_ms; end to end tokens/s and the step's attention ms."""
    keys = ("dq_ms",) if r.get("kind") == "attention" else ("tokens_per_s", "attn_ms")
    return {k: float(r[k]) for k in keys if isinstance(r.get(k), (int, float))}


def summarize(runs: List[Dict[str, Any]], names: List[str]) -> str:
    """runs: {"variant", "round", "rows"} per bench_truth run. One line per (row, figure): each
    variant's figures by round, their median and the median over the first variant's."""
    table: Dict[Tuple[str, str], Dict[str, List[float]]] = {}
    order: List[Tuple[str, str]] = []
    for run in runs:
        for r in run["rows"]:
            k = row_key(r)
            if k is None:
                continue
            for fig, v in row_figures(r).items():
                if (k, fig) not in table:
                    table[(k, fig)] = {}
                    order.append((k, fig))
                table[(k, fig)].setdefault(run["variant"], []).append(v)
    lines = []
    for k, fig in order:
        per = table[(k, fig)]
        lines.append(f"{k} {fig}")
        base = statistics.median(per[names[0]]) if per.get(names[0]) else None
        for n in names:
            vals = per.get(n, [])
            if not vals:
                lines.append(f"  {n:<12} -")
                continue
            med = statistics.median(vals)
            rel = f"  x{med / base:.4f}" if base else ""
            lines.append(f"  {n:<12} {' / '.join(f'{v:.4f}' for v in vals)}  median {med:.4f}{rel}")
    return "\n".join(lines) + "\n"


def bench(args: argparse.Namespace, names: List[str], extra: List[str], out: pathlib.Path) -> int:
    runs: List[Dict[str, Any]] = []
    status = 0
    if not any(a == "--bf16" or a.startswith("--bf16=") for a in extra):
        extra = ["--bf16", "none"] + extra
    with open(out / "runs.log", "w") as lg, tempfile.TemporaryDirectory() as tmp:
        for rnd in range(1, args.rounds + 1):
            for n in names:
                js = os.path.join(tmp, f"{n}-{rnd}.json")
                cmd = [args.python, str(TRUTH), "--build", str(build_dir(n)), "--json", js] + extra
                t0 = time.time()
                p = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                lg.write(f"==== {n} round {rnd}: exit {p.returncode} in {time.time() - t0:.0f} s\n$ "
                         f"{' '.join(cmd)}\n{p.stdout}\n")
                lg.flush()
                try:
                    rows = json.loads(pathlib.Path(js).read_text()).get("rows", [])
                except (OSError, ValueError):
                    rows = []
                errs = [r.get("error") for r in rows if r.get("error")]
                log(f"{n} round {rnd}: exit {p.returncode}, {len(rows)} rows"
                    + (f", errors: {'; '.join(errs)[:300]}" if errs else ""))
                status = status or p.returncode or (1 if not rows else 0)
                runs.append({"variant": n, "round": rnd, "exit": p.returncode, "rows": rows})
    (out / "runs.json").write_text(json.dumps({"variants": names, "runs": runs}, indent=1))
    text = summarize(runs, names)
    (out / "summary.txt").write_text(text)
    log(text)
    return status


def self_test(python: str) -> int:
    failures: List[str] = []

    def check(cond: bool, what: str) -> None:
        if not cond:
            failures.append(what)
            log("FAIL:", what)

    check(parse_variant("main=") == ("main", []), "parse_variant, no definitions")
    check(parse_variant("p2=-DHW_PAIR=2 -DX") == ("p2", ["-DHW_PAIR=2", "-DX"]), "parse_variant")
    for bad in ("main", "=-DX", "a b=-DX", "a=-O3", "a=-D"):
        try:
            parse_variant(bad)
            check(False, f"parse_variant accepted {bad!r}")
        except ValueError:
            pass
    rows = [{"kind": "attention", "batch": 1, "context": 9, "layout": "hot", "dq_ms": 2.0},
            {"kind": "e2e", "context": 9, "layout": "hot", "tokens_per_s": 100.0, "attn_ms": 5.0},
            {"kind": "attention", "batch": 2, "context": 9, "layout": "hot", "dq_ms": None, "error": "x"}]
    runs = [{"variant": "a", "round": 1, "rows": rows},
            {"variant": "b", "round": 1, "rows": [dict(r, dq_ms=1.0) if r["kind"] == "attention" and r["dq_ms"]
                                                   else r for r in rows]},
            {"variant": "a", "round": 2, "rows": [dict(r, dq_ms=4.0) if r["kind"] == "attention" and r["dq_ms"]
                                                   else r for r in rows]}]
    s = summarize(runs, ["a", "b"])
    check("attention (1, 9) [hot] dq_ms\n  a            2.0000 / 4.0000  median 3.0000  x1.0000\n"
          "  b            1.0000  median 1.0000  x0.3333\n" in s, f"summary of the attention row:\n{s}")
    check("e2e 9 [hot] tokens_per_s" in s and "e2e 9 [hot] attn_ms" in s, "summary of the e2e row")
    check("(2, 9)" not in s, "a row without figures is left out")
    try:
        import torch  # noqa: F401
    except ImportError:
        log("torch not installed: the run through bench_truth.py --sim skipped")
        torch = None
    if torch is not None:
        with tempfile.TemporaryDirectory() as d:
            cmd = [python, str(pathlib.Path(__file__).resolve()), "--no-build", "--variant", "x=", "--variant",
                   "y=-DY", "--rounds", "2", "--out", d, "--python", python, "--", "--sim", "--phases", "attn",
                   "--layouts", "hot", "--time-budget", "200"]
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
            check(p.returncode == 0, f"sim A/B exit {p.returncode}:\n{p.stdout}")
            files = sorted(os.listdir(d))
            check(files == ["runs.json", "runs.log", "summary.txt"], f"output files {files}")
            rep = json.loads(pathlib.Path(d, "runs.json").read_text())
            check([(r["variant"], r["round"]) for r in rep["runs"]] == [("x", 1), ("y", 1), ("x", 2), ("y", 2)],
                  "runs alternate the variants round by round")
            check(all(len(r["rows"]) == 4 and all(x.get("bf16_ms") is None for x in r["rows"])
                      for r in rep["runs"]), "four attention rows a run, BF16 not timed")
            summ = pathlib.Path(d, "summary.txt").read_text()
            check(summ.count("x1.0000") == 8, f"every shape's median against x:\n{summ}")
    log(f"self-test: {'FAILED ' + str(len(failures)) if failures else 'passed'}")
    return 1 if failures else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: List[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", action="append", default=[], help="NAME=DEFINES (nvcc -D arguments); repeat")
    ap.add_argument("--rounds", type=int, default=2, help="runs of every variant, alternated (default 2)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp") + "/ab", help="output folder")
    ap.add_argument("--no-build", action="store_true", help="bench the build folders as they are")
    ap.add_argument("--python", default=sys.executable, help="the Python that runs bench_truth.py")
    ap.add_argument("--self-test", action="store_true", help="check the summary (and, with torch, a sim run)")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test(args.python)
    try:
        variants = [parse_variant(v) for v in args.variant]
    except ValueError as e:
        ap.error(str(e))
    names = [n for n, _ in variants]
    if len(variants) < 2 or len(set(names)) != len(names):
        ap.error("give two or more --variant, each its own name")
    if args.rounds < 1:
        ap.error("--rounds must be positive")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.no_build:
        t0 = time.time()
        with ThreadPoolExecutor(max_workers=len(variants)) as ex:
            done = list(ex.map(lambda v: build(*v), variants))
        bad = [(n, rc, o) for n, rc, o in done if rc]
        for n, rc, o in bad:
            log(f"build of {n} failed (exit {rc}):\n{o[-3000:]}")
        if bad:
            return 2
        log(f"built {', '.join(names)} in {time.time() - t0:.0f} s")
    return bench(args, names, extra, out)


if __name__ == "__main__":
    sys.exit(main())
