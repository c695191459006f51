"""bench/plot_step_scaling.py: invocations grouped by size, upper medians, the disk-busy panel."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "plot_step_scaling.py")


def load():
    spec = importlib.util.spec_from_file_location("plot_step_scaling", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bench_json(path, params, ratio, busy=None):
    d = {"params": params, "host_budget_bytes": 1 << 30, "step_s": params * 4e-9,
         "io_only_s": params * 4e-9 / ratio, "zero_infinity_step_s": params * 8e-9,
         "median_run_step_over_io_only": ratio, "median_run_zero_infinity_over_step": 2.0}
    if busy is not None:
        d["median_disk_busy"] = {"step": busy, "io_only": 0.99, "zero_infinity": 0.98}
    path.write_text(json.dumps(d))
    return str(path)


def test_invocations_of_one_size_are_grouped_and_take_the_upper_median(tmp_path):
    mod = load()
    files = [bench_json(tmp_path / f"{i}.json", p, r)
             for i, (p, r) in enumerate([(256, 1.3), (64, 1.0), (256, 1.1), (64, 1.2)])]
    sizes = mod.by_size(files)
    assert list(sizes) == [64, 256]
    assert [len(v) for v in sizes.values()] == [2, 2]
    plotted = []

    class Axis:
        def plot(self, x, y, **kw):
            plotted.append((x, y))
            return [type("Line", (), {"get_color": lambda self: "k"})()]

        def scatter(self, x, y, **kw):
            plotted.append((x, y))

    mod.plot_series(Axis(), sizes, lambda d: d["median_run_step_over_io_only"], "r")
    assert plotted[0] == ([64, 256], [1.2, 1.3])  # upper medians, as bench/RESULTS.md
    assert sorted(plotted[1][1]) == [1.0, 1.1, 1.2, 1.3]  # one point per invocation


@pytest.mark.parametrize("busy", [None, 0.97])
def test_draws_a_png_with_or_without_disk_busy(tmp_path, busy):
    pytest.importorskip("matplotlib")
    files = [bench_json(tmp_path / f"{p}.json", p, 1.05, busy) for p in (64 << 20, 256 << 20)]
    out = tmp_path / "scaling.png"
    res = subprocess.run([sys.executable, SCRIPT, str(out), *files], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_input_prints_the_usage():
    res = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True)
    assert res.returncode != 0 and "Usage: bench/plot_step_scaling.py" in res.stderr
