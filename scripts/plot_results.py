#!/usr/bin/env python3
"""Plots spgraph's benchmark records (the JSON lists written by `bench --json` and
`scripts/torch_peer.py --bench --json`) as PNGs.

  scripts/plot_results.py --out DIR FILE.json [FILE.json ...]

writes into DIR:
  pipeline_step_time.png  table B: GPU time per step vs tokens per chunk for spgraph-graph,
                          spgraph-eager, torch-eager and torch-graph (log-log), and host time per step
  attention_tflops.png    table A: spgraph's attention TFLOP/s per row beside FlashMLA's figures,
                          with the measured bf16 GEMM ceiling as a line
Records that are missing are skipped with a note; when several files hold the same record, the
last file read wins.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Table B workloads: tokens per chunk (requests x new tokens) and how the axis names them.
PIPELINE = [("tiny", 16, "tiny\n16"), ("small", 256, "small\n256"), ("model", 1024, "model\n1024\nx 8 layers"),
            ("medium", 2048, "medium\n2048"), ("large", 8192, "large\n8192")]
VARIANTS = [("spgraph-graph", "tab:blue", "-"), ("spgraph-eager", "tab:cyan", "--"),
            ("torch-eager", "tab:red", "--"), ("torch-graph", "tab:orange", "-")]

# FlashMLA's SM90 sparse prefill kernel (public source at 9241ae3, its own nvcc flags, called from
# C++), measured side by side with spgraph on one H200 on 2026-12-01, sustained (25 ms warm-up,
# >= 100 ms timed; docs/benchmarks.md, table A), keyed by spgraph's row names. They replace the
# figures of 2026-11-30, which were taken through Python calls.
FLASHMLA_TFLOPS = {
    "V32/8192": 607, "V32/32768": 581, "V32/65536": 546, "V32/131072": 529,
    "V4-C1/8192": 487, "V4-C1/32768": 471, "V4-C1/65536": 440,
    "V4-C2/8192": 560, "V4-C2/32768": 545, "V4-C2/65536": 516,
    "V4-C4A-pro/32768": 549, "V4-C128A/65536": 579,
    "small-h128-k1152/8192/sq16": 144, "small-h128-k1152/8192/sq64": 538, "small-h128-k1152/8192/sq256": 531,
    "small-h64-k640/8192/sq16": 66, "small-h64-k640/8192/sq64": 247, "small-h64-k640/8192/sq256": 476,
}
ATTENTION_ROWS = ["V32/8192", "V32/32768", "V32/65536", "V32/131072", "V4-C1/8192", "V4-C1/32768", "V4-C1/65536",
                  "V4-C2/8192", "V4-C2/32768", "V4-C2/65536", "V4-C4A-pro/32768", "V4-C128A/65536",
                  "small-h128-k1152/8192/sq16", "small-h128-k1152/8192/sq64", "small-h128-k1152/8192/sq256",
                  "small-h64-k640/8192/sq16", "small-h64-k640/8192/sq64", "small-h64-k640/8192/sq256"]


def load(paths):
    """(suite, name, variant, metric) -> value, over all files; null values are dropped."""
    values = {}
    for path in paths:
        with open(path) as f:
            records = json.load(f)
        for r in records:
            if isinstance(r.get("value"), (int, float)):
                values[(r["suite"], r["name"], r["variant"], r["metric"])] = float(r["value"])
        print(f"read {len(records)} records from {path}")
    return values


def plot_pipeline(values, out):
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    drawn = 0
    for ax, metric, title in zip(axes, ("gpu_us", "host_us"), ("GPU time per step", "host time per step")):
        for variant, color, style in VARIANTS:
            pts = [(x, values.get(("pipeline", name, variant, metric))) for name, x, _ in PIPELINE]
            missing = [name for (name, _, _), (_, v) in zip(PIPELINE, pts) if v is None]
            if missing:
                which = "any workload" if len(missing) == len(PIPELINE) else ", ".join(missing)
                print(f"note: pipeline {variant} {metric}: no record for {which}; skipped")
            line = [(x, v) for (name, x, _), (_, v) in zip(PIPELINE, pts) if v is not None and name != "model"]
            model = values.get(("pipeline", "model", variant, metric))
            if line:
                ax.plot(*zip(*line), style, color=color, marker="o", label=variant)
            if model is not None:  # another program (8 layers): a point of its own, not on the line
                ax.plot([1024], [model], linestyle="none", marker="*", markersize=12, color=color,
                        label=None if line else variant)
            for x, v in line + ([(1024, model)] if model is not None else []):
                ax.annotate(f"{v:.0f}", (x, v), textcoords="offset points", xytext=(5, 4), fontsize=7, color=color)
            drawn += len(line) + (model is not None)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks([x for _, x, _ in PIPELINE])
        ax.set_xticklabels([label for _, _, label in PIPELINE], fontsize=8)
        ax.minorticks_off()
        ax.set_xlabel("tokens per chunk (model: star, 8 layers)")
        ax.set_ylabel("microseconds per step")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle("Prefill pipeline step (table B), medians")
    fig.tight_layout()
    if not drawn:
        print("note: no pipeline records; pipeline_step_time.png not written")
        plt.close(fig)
        return
    path = os.path.join(out, "pipeline_step_time.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def plot_attention(values, out):
    names = ATTENTION_ROWS + sorted({k[1] for k in values if k[0] == "attention" and k[3] == "tflops"} - set(ATTENTION_ROWS))
    ours = {n: values.get(("attention", n, "spgraph", "tflops")) for n in names}
    missing = [n for n in names if ours[n] is None and n in ATTENTION_ROWS]
    if missing:
        print(f"note: attention: no spgraph tflops record for {', '.join(missing)}; rows skipped")
    rows = [n for n in names if ours[n] is not None]
    if not rows:
        print("note: no attention records; attention_tflops.png not written")
        return
    fig, ax = plt.subplots(figsize=(14, 5.5))
    xs = range(len(rows))
    for dx, label, color, vals in ((-0.2, "spgraph (sustained, automatic)", "tab:blue", [ours[n] for n in rows]),
                                   (0.2, "FlashMLA 9241ae3 (H200, side by side, 2026-12-01)", "tab:gray",
                                    [FLASHMLA_TFLOPS.get(n) for n in rows])):
        pts = [(x + dx, v) for x, v in zip(xs, vals) if v is not None]
        bars = ax.bar([p[0] for p in pts], [p[1] for p in pts], width=0.4, color=color, label=label)
        ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=1)
    ceiling = values.get(("ceilings", "gemm-bf16-8192", "cublas", "tflops"))
    if ceiling is None:
        ceiling = next((v for k, v in values.items() if k[:2] == ("ceilings", "gemm-bf16-8192") and k[3] == "tflops"),
                       None)
    if ceiling is not None:
        ax.axhline(ceiling, color="tab:green", linestyle="--", label=f"bf16 GEMM ceiling, measured ({ceiling:.0f})")
    else:
        print("note: no ceilings gemm-bf16-8192 tflops record; no ceiling line")
    top = max([ours[n] for n in rows] + [FLASHMLA_TFLOPS.get(n, 0) for n in rows] + [ceiling or 0])
    ax.set_ylim(0, top * 1.2)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(rows, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("TFLOP/s")
    ax.set_title("Sparse attention (table A): spgraph vs FlashMLA")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", ncol=3)
    fig.tight_layout()
    path = os.path.join(out, "attention_tflops.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description="Plot spgraph benchmark records (JSON) as PNGs")
    ap.add_argument("files", nargs="+", help="JSON record files")
    ap.add_argument("--out", "-o", default=".", help="directory for the PNGs (default: current directory)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    values = load(args.files)
    plot_pipeline(values, args.out)
    plot_attention(values, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
