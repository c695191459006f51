"""Draws a `tierswap tune --json` sweep as a PNG: median GB/s against request size, one line per
backend and depth (SQPOLL variants dashed), writes and reads side by side, the chosen setting
circled. `tierswap tune` runs this file itself (it carries a copy); by hand:

    /usr/bin/python3 -m tierswap.plot_tune sweep.json sweep.png

Needs matplotlib (Debian: python3-matplotlib).
"""
import json
import sys


def medians(settings, mode):
    """{(backend, depth, sqpoll): {block_size: median GB/s}} of one direction, from the medians
    tierswap tune computed ("settings": the upper median of each setting's runs)."""
    out = {}
    for st in settings:
        key = (st["backend"], st["queue_depth"], st["sqpoll"])
        out.setdefault(key, {})[st["block_size"]] = st[f"{mode}_gbps"]
    return {k: dict(sorted(per.items())) for k, per in out.items()}


def size_label(n):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return str(n)


def plot(sweep, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = sweep.get("chosen", {})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    for ax, mode in zip(axes, ("write", "read")):
        for (backend, depth, sqpoll), per in sorted(medians(sweep["settings"], mode).items()):
            xs = list(per)
            ax.plot(xs, [per[x] for x in xs], marker="o", linestyle="--" if sqpoll else "-",
                    label=f"{backend} qd{depth}{' sqpoll' if sqpoll else ''}")
        if chosen:
            per = medians(sweep["settings"], mode).get(
                (chosen["backend"], chosen["queue_depth"], chosen["sqpoll"]), {})
            if chosen["block_size"] in per:
                ax.plot([chosen["block_size"]], [per[chosen["block_size"]]], marker="o",
                        markersize=16, markerfacecolor="none", color="black", label="chosen")
        ax.set_xscale("log", base=2)
        ticks = sorted({st["block_size"] for st in sweep["settings"]})
        ax.set_xticks(ticks)
        ax.set_xticklabels([size_label(t) for t in ticks])
        ax.set_xlabel("request size")
        ax.set_title(mode)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("GB/s (median)")
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle(f"tierswap tune: {', '.join(sweep.get('dirs', []))}, "
                 f"{size_label(sweep.get('size', 0))} "
                 f"per phase, {sweep.get('runs_per_setting', '?')} runs each")
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main(argv):
    if len(argv) != 3:
        sys.exit("usage: plot_tune.py SWEEP.json OUT.png")
    with open(argv[1]) as f:
        plot(json.load(f), argv[2])


if __name__ == "__main__":
    main(sys.argv)
