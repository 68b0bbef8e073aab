#!/usr/bin/env python3
"""Draws the serving curves from `deepinfer bench sweep --csv` files.

    scripts/plot_sweep.py sweep.csv [more.csv ...] --out docs/plots/sweep_h200

writes OUT_throughput.png (output tok/s per GPU vs concurrent requests) and
OUT_per_user.png (tok/s per user vs tok/s per GPU, each point labelled with its
concurrency), one curve per CSV label. The per-user view also marks the
reference engine's two published decode points (../shared/SPEC.md section 7:
64 GPUs, EP64, NVIDIA SM100) for scale; they are another model on other hardware.
"""
import argparse
import csv
import sys
from collections import defaultdict

# (tok/s per GPU, tok/s per user, requests per rank), published.
REFERENCE_POINTS = [(26000, 108, 256), (2400, 320, 8)]


def read(paths):
    curves = defaultdict(list)
    for path in paths:
        with open(path) as f:
            for row in csv.DictReader(f):
                key = f"{row['label']} ({row['device']}, {row['input_len']}/{row['output_len']})"
                curves[key].append({k: float(row[k]) for k in
                                    ("concurrency", "output_tok_s_per_gpu", "tok_s_per_user")})
    for points in curves.values():
        points.sort(key=lambda p: p["concurrency"])
    return curves


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--out", required=True, help="prefix of the PNG files")
    ap.add_argument("--no-reference", action="store_true", help="leave out the published reference points")
    args = ap.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_sweep.py needs matplotlib (python3 -m pip install matplotlib)")
    curves = read(args.csv)
    if not curves:
        sys.exit("no points in " + ", ".join(args.csv))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, pts in curves.items():
        ax.plot([p["concurrency"] for p in pts], [p["output_tok_s_per_gpu"] for p in pts], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_title("Output throughput vs concurrency (prefill included)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out + "_throughput.png", dpi=120)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, pts in curves.items():
        xs = [p["output_tok_s_per_gpu"] for p in pts]
        ys = [p["tok_s_per_user"] for p in pts]
        ax.plot(xs, ys, marker="o", label=name)
        for p, x, y in zip(pts, xs, ys):
            ax.annotate(str(int(p["concurrency"])), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if not args.no_reference:
        ax.scatter([p[0] for p in REFERENCE_POINTS], [p[1] for p in REFERENCE_POINTS], marker="x", color="black",
                   label="reference engine, published (SM100, EP64)")
        for x, y, c in REFERENCE_POINTS:
            ax.annotate(f"{c}/rank", (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("output tokens/s per GPU")
    ax.set_ylabel("output tokens/s per user")
    ax.set_title("Per-user speed vs per-GPU throughput")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out + "_per_user.png", dpi=120)
    print(f"wrote {args.out}_throughput.png and {args.out}_per_user.png")


if __name__ == "__main__":
    main()
