#!/usr/bin/python3
"""Draws how the NVMe step's cost grows with the model from `tierswap bench step --json` outputs
(one file per size): nanoseconds per parameter of the step, its io-only pass and the
ZeRO-Infinity traffic step, and the step over its io-only pass (median of the per-run ratios).

Usage: bench/plot_step_scaling.py OUT.png STEP.json [STEP.json ...]   (needs python3-matplotlib)
"""
import json
import sys


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    runs = sorted((json.load(open(f)) for f in argv[2:]), key=lambda d: d["params"])
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = [d["params"] for d in runs]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for key, label in (("step_s", "tierswap step"), ("io_only_s", "io-only pass"),
                       ("zero_infinity_step_s", "ZeRO-Infinity traffic")):
        a.plot(n, [d[key] / d["params"] * 1e9 for d in runs], marker="o", label=label)
    a.set_ylabel("ns per parameter (medians)")
    b.plot(n, [d["median_run_step_over_io_only"] for d in runs], marker="o",
           label="step / io-only")
    b.plot(n, [d["median_run_zero_infinity_over_step"] for d in runs], marker="o",
           label="ZeRO-Infinity / step")
    b.axhline(1.10, color="grey", linestyle="--", linewidth=1)
    b.set_ylabel("ratio (median of the per-run ratios)")
    for ax in (a, b):
        ax.set_xscale("log")
        ax.set_xlabel("parameters")
        ax.grid(True, alpha=0.3)
        ax.legend()
    budget = runs[0]["host_budget_bytes"] / 2**30
    fig.suptitle(f"tierswap bench step, AdamW, {budget:g} GiB pinned host budget")
    fig.tight_layout()
    fig.savefig(argv[1], dpi=90)


if __name__ == "__main__":
    main(sys.argv)
