#!/usr/bin/python3
"""Rate-distortion plot of the perplexity / KL protocol: bits/value vs KL(p_fp32 || p_codec).

Reads the JSON lines of `dquant eval --ppl --json` (one object per codec; rows with "error" and the
identity "fp32", whose KL is 0, are left out of the log-scale plot) and draws one panel per dataset,
every codec a point labelled with its name, families by colour. Regeneration step for
tests/eval/RESULTS.md (needs matplotlib); not a test:

    /usr/bin/python3 tests/eval/plot_rd.py tests/eval/rd_kl.png tests/eval/results/ppl_*.jsonl

With --table FILE.jsonl it prints the rows of one --ppl or --claims JSON run as a markdown table
(no matplotlib needed), as make_kvq_results.sh does for RESULTS.md.
"""
import json
import sys


def family(codec):
    if codec.startswith(("dq", "fixed")):
        return "D-Quant / fixed-width"
    if codec.startswith(("lm", "ip", "ol", "pq")):
        return "KVQuant++"
    return "baselines"


COLOURS = {"D-Quant / fixed-width": "tab:red", "KVQuant++": "tab:blue", "baselines": "tab:grey"}
ORDER = ["bytellama-n1024", "bytellama-19m", "tinystories-656k"]


def load(paths):
    rows = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line)
                if r.get("protocol") != "ppl" or "error" in r or r["codec"] == "fp32":
                    continue
                rows.setdefault(r["dataset"], {})[r["codec"]] = r
    return rows


def table(path):
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if rows and "claim_id" in rows[0]:
        print("| # | claim | paper | ours | verdict |")
        print("|---|---|---|---|---|")
        for i, r in enumerate(rows, 1):
            print("| %d | %s | %s | %s | %s |" % (i, r["claim"], r["paper"], r["ours"], r["verdict"]))
        print()
        for i, r in enumerate(rows, 1):
            if r["note"]:
                print("%d. (%s) %s" % (i, r["claim_id"], r["note"].strip()))
        return 0
    print("| codec | bits/value | K bits | V bits | K NMSE | V NMSE | PPL | dPPL [95% CI] | KL, nats [95% CI] |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|")
    ref = None
    for r in rows:
        if "error" in r:
            print("| %s | - | - | - | - | - | - | cannot run: %s | |" % (r["codec"], r.get("why", r["error"])))
            continue
        ref = r
        d, k = r["dppl"], r["kl"]
        print("| %s | %.4f | %.4f | %.4f | %.4g | %.4g | %.4f | %+.4g [%+.4g, %+.4g] | %.4g [%.4g, %.4g] |" % (
            r["codec"], r["bits_per_value"], r["bits_k"], r["bits_v"], r["nmse_k"], r["nmse_v"], r["ppl"],
            d["est"], d["lo"], d["hi"], k["est"], k["lo"], k["hi"]))
    if ref:
        print()
        print("PPL_fp32 = %.4f over %d chunks x %d scored targets (context %d)." % (
            ref["ppl_fp32"], ref["chunks"], ref["targets"], ref["context"]))
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "--table":
        return table(argv[2])
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = load(argv[2:])
    sets = [d for d in ORDER if d in rows] + sorted(d for d in rows if d not in ORDER)
    if not sets:
        sys.stderr.write("no --ppl rows in the inputs\n")
        return 1
    fig, axes = plt.subplots(1, len(sets), figsize=(6.5 * len(sets), 5.5), squeeze=False)
    for ax, ds in zip(axes[0], sets):
        seen = set()
        for codec, r in sorted(rows[ds].items(), key=lambda kv: kv[1]["bits_per_value"]):
            if r["bits_per_value"] > 8:  # bf16 at 16 bits: its KL is printed, the axis stays on the codecs
                ax.annotate("bf16: KL %.1e at 16 bits" % r["kl"]["est"], xy=(0.02, 0.02),
                            xycoords="axes fraction", fontsize=8)
                continue
            fam = family(codec)
            kl = r["kl"]
            ax.errorbar(r["bits_per_value"], kl["est"],
                        yerr=[[kl["est"] - kl["lo"]], [kl["hi"] - kl["est"]]],
                        fmt="o", color=COLOURS[fam], ms=5, capsize=2,
                        label=fam if fam not in seen else None)
            seen.add(fam)
            ax.annotate(codec, (r["bits_per_value"], kl["est"]), textcoords="offset points",
                        xytext=(4, 3), fontsize=7)
        any_row = next(iter(rows[ds].values()))
        ax.set_yscale("log")
        ax.set_xlabel("bits/value (every stored byte of the prefill cache)")
        ax.set_ylabel("KL(p_fp32 || p_codec), nats per scored token")
        ax.set_title("%s (n = %d): %d chunks of %d + %d" % (ds, any_row["stream_values"], any_row["chunks"],
                                                            any_row["context"], any_row["targets"]))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    fig.suptitle("Rate-distortion, KVQuant++ protocol (dquant eval --ppl); bars: 95% bootstrap over chunks",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(argv[1], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
