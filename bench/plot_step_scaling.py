#!/usr/bin/python3
"""Draws how the NVMe step's cost grows with the model from `tierswap bench step --json` outputs:
nanoseconds per parameter of the step, its io-only pass and the ZeRO-Infinity traffic step, and
the step over its io-only pass (median of the per-run ratios). Several files of one size (several
invocations) are drawn as one point each, the lines going through their (upper) medians; files from
`bench step --disk-busy` add a third panel: the fraction of each pass with a request in flight.

Usage: bench/plot_step_scaling.py OUT.png STEP.json [STEP.json ...]   (needs python3-matplotlib)
"""
import json
import statistics
import sys

PASSES = (("step", "step_s", "tierswap step"), ("io_only", "io_only_s", "io-only pass"),
          ("zero_infinity", "zero_infinity_step_s", "ZeRO-Infinity traffic"))


def by_size(files):
    """{params: [the invocations' JSON, ...]}, sizes ascending."""
    sizes = {}
    for f in files:
        d = json.load(open(f))
        sizes.setdefault(d["params"], []).append(d)
    return dict(sorted(sizes.items()))


def plot_series(ax, sizes, value, label):
    """One point per invocation, a line through the medians per size."""
    n = list(sizes)
    line = ax.plot(n, [statistics.median_high(value(d) for d in ds) for ds in sizes.values()],
                   marker="o", label=label)[0]
    if any(len(ds) > 1 for ds in sizes.values()):
        xs = [p for p, ds in sizes.items() for _ in ds]
        ax.scatter(xs, [value(d) for ds in sizes.values() for d in ds], s=12,
                   color=line.get_color(), alpha=0.5)


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    sizes = by_size(argv[2:])
    busy = all("median_disk_busy" in d for ds in sizes.values() for d in ds)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3 if busy else 2, figsize=(18 if busy else 12, 4.5))
    a, b = axes[0], axes[1]
    for _, key, label in PASSES:
        plot_series(a, sizes, lambda d, k=key: d[k] / d["params"] * 1e9, label)
    a.set_ylabel("ns per parameter (medians)")
    plot_series(b, sizes, lambda d: d["median_run_step_over_io_only"], "step / io-only")
    plot_series(b, sizes, lambda d: d["median_run_zero_infinity_over_step"],
                "ZeRO-Infinity / step")
    b.axhline(1.10, color="grey", linestyle="--", linewidth=1)
    b.set_ylabel("ratio (median of the per-run ratios)")
    if busy:
        for name, _, label in PASSES:
            plot_series(axes[2], sizes, lambda d, p=name: 100 * d["median_disk_busy"][p], label)
        axes[2].set_ylabel("% of the pass with a disk request in flight")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("parameters")
        ax.grid(True, alpha=0.3)
        ax.legend()
    first = next(iter(sizes.values()))[0]
    fig.suptitle(f"tierswap bench step, AdamW, {first['host_budget_bytes'] / 2**30:g} GiB pinned "
                 "host budget")
    fig.tight_layout()
    fig.savefig(argv[1], dpi=90)


if __name__ == "__main__":
    main(sys.argv)
