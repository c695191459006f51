"""bench/torch_step.py: the overhead mode's blocks (warm-up, the C++ side), the parameters on huge
pages, and nothing left behind in --dir."""
import json
import os
import subprocess
import sys

import pytest

from test_tune import cli_path

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "torch_step.py")


def run(tmp_path, *args):
    r = subprocess.run([sys.executable, SCRIPT, *args, "--dir", str(tmp_path), "--threads", "1"],
                       capture_output=True, text=True, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert os.listdir(tmp_path) == [], "the script left files in --dir"
    return json.loads(r.stdout)


@pytest.mark.parametrize("pages", ["4k", "huge"])
def test_overhead_blocks_time_the_steps_after_the_cpp_benchs_warm_up(tmp_path, pages):
    out = run(tmp_path, "overhead", "--params", "3M", "--tensor", "1M", "--state", "host",
              "--host-budget", "64MiB", "--sub-group", "1M", "--reps", "2", "--block", "3",
              "--settle", "0", "--cli", cli_path(), "--pages", pages)
    assert out["warmup_steps_per_block"] == 1  # the C++ bench's with host state
    assert out["pages"] == pages
    assert len(out["runs_python"]) == len(out["runs_cpp"]) == 6  # reps x block, no warm-up
    assert len(out["python_over_cpp_bench_per_block"]) == 2
    assert all(t > 0 for t in out["runs_python"] + out["runs_cpp"])
    # The Python layer's own cost is a small part of each step on any host.
    assert 1.0 <= out["python_over_handover_plus_native"] < 2.0


def test_overhead_takes_two_warm_up_steps_with_nvme_state_unless_told(tmp_path):
    common = ["overhead", "--params", "2M", "--tensor", "1M", "--host-budget", "32MiB",
              "--sub-group", "1M", "--reps", "1", "--block", "2", "--settle", "0",
              "--cli", cli_path()]
    assert run(tmp_path, *common)["warmup_steps_per_block"] == 2
    assert run(tmp_path, *common, "--warmup", "0")["warmup_steps_per_block"] == 0
    assert run(tmp_path, *common, "--cpp-grads", "shared")["cpp_grads"] == "shared"


def test_bench_step_takes_the_python_sides_parameter_layout(tmp_path):
    """--tensor and --distinct-grads: the C++ bench's parameters as the Python side's."""
    base = [cli_path(), "bench", "step", "--params", "3M", "--state", "host", "--memory-only",
            "--host-budget", "64MiB", "--sub-group", "1M", "--runs", "1", "--lend", "--json",
            "--dir", str(tmp_path)]
    r = json.loads(subprocess.run(base + ["--tensor", "1M", "--distinct-grads"], check=True,
                                  capture_output=True, text=True).stdout)
    assert r["tensor"] == 1000000 and r["distinct_grads"] is True
    r = json.loads(subprocess.run(base, check=True, capture_output=True, text=True).stdout)
    assert r["tensor"] == 64 << 20 and r["distinct_grads"] is False
    bad = subprocess.run(base + ["--tensor", "0"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--tensor" in bad.stderr


def test_torch_mode_compares_with_torch_and_cleans_up(tmp_path):
    out = run(tmp_path, "torch", "--params", "2M", "--tensor", "1M", "--reps", "2",
              "--memory-only")
    assert len(out["runs_tierswap"]) == len(out["runs_torch"]) == 2
    assert out["speedup"] > 0


def test_tinylm_mode_reports_every_case_against_the_recipe(tmp_path):
    out = run(tmp_path, "tinylm", "--reps", "1", "--steps", "3", "--warmup", "1")
    for case in ("host", "host_in_step", "host_memory", "nvme", "nvme_hooks", "nvme_in_step"):
        assert out[f"tierswap_{case}_over_torch_median"] > 0, case
        assert out[f"tierswap_{case}_exposed_step_s_median"] > 0, case
        assert out[f"tierswap_{case}_io_wait_s_median"] >= 0, case
        assert out[f"tierswap_{case}_commit_wait_s_median"] >= 0, case
        # each case against a recipe run of its own
        assert len(out["runs"]["torch_adamw"][case]) == len(out["runs"]["tierswap"][case]) == 1
    assert out["torch_adamw_tokens_per_s"] > 0 and out["steps"] == 3 and out["warmup"] == 1


def test_tinylm_mode_runs_the_cases_asked_for(tmp_path):
    out = run(tmp_path, "tinylm", "--reps", "1", "--steps", "2", "--warmup", "0", "--cases",
              "nvme")
    assert list(out["runs"]["tierswap"]) == ["nvme"]
    assert "tierswap_host_over_torch_median" not in out
    r = subprocess.run([sys.executable, SCRIPT, "tinylm", "--cases", "host,hots"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "no case 'hots'" in r.stderr


def test_kernel_mode_sets_the_python_step_beside_the_fused_kernel(tmp_path):
    out = run(tmp_path, "kernel", "--params", "2M", "--tensor", "1M", "--reps", "2",
              "--host-budget", "256MiB", "--sub-group", "1M", "--cli", cli_path(), "--pages", "huge")
    assert len(out["runs_python"]) == len(out["runs_kernel"]) == 2
    assert out["python_step_s"] > 0 and out["kernel_s"] > 0 and out["grad_stats_s"] > 0
    assert len(out["runs_grad_stats"]) == 2 and out["exact_floor_over_kernel_median"] > 1
    assert len(out["python_over_kernel_per_rep"]) == 2
