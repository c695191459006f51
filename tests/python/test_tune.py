"""`tierswap tune`: the sweep, the choice, the config file the engine reads, the plot, bad input."""
import json
import os
import subprocess

import pytest

from build_tree import cli_path


def tune(*args, env=None):
    return subprocess.run([cli_path(), "tune", *args], capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})))


def upper_median(v):
    return sorted(v)[len(v) // 2]


def test_sweep_chooses_the_fastest_swap_and_writes_a_config_the_engine_reads(tmp_path):
    out = tmp_path / "io.json"
    r = tune("--dir", str(tmp_path), "--size", "4MiB", "--runs", "3", "--backends", "uring,posix",
             "--block-sizes", "256KiB,1MiB", "--depths", "4,16", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert "sweep" in r.stderr  # progress while it runs
    sweep = json.loads(r.stdout)
    settings = sweep["settings"]
    assert len(settings) + len(sweep["skipped"]) == 8
    assert {s["backend"] for s in settings} >= {"posix"}
    for s in settings:
        runs = [x for x in sweep["runs"] if x["backend"] == s["backend"]
                and x["block_size"] == s["block_size"] and x["queue_depth"] == s["queue_depth"]]
        assert len(runs) == 6  # 3 writes + 3 reads, every one moving the whole size
        assert all(x["bytes"] == 4 << 20 for x in runs)
        for mode in ("write", "read"):
            assert s[f"{mode}_gbps"] == upper_median([x["gbps"] for x in runs if x["mode"] == mode])
        assert s["swap_gbps"] == pytest.approx(2 / (1 / s["write_gbps"] + 1 / s["read_gbps"]))
    chosen = sweep["chosen"]
    assert chosen["swap_gbps"] == max(s["swap_gbps"] for s in settings)
    written = json.loads(out.read_text())
    assert written == {k: chosen[k] for k in ("backend", "block_size", "queue_depth", "sqpoll")}
    assert sweep["config_file"] == str(out)
    # No swap file is left behind.
    assert sorted(os.listdir(tmp_path)) == sorted(p for p in ["io.json", "io.png"]
                                                  if (tmp_path / p).exists())
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "io.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sweep["plot"] == str(tmp_path / "io.png")


def test_the_engine_loads_the_file_tune_wrote(tmp_path):
    out = tmp_path / "io.json"
    r = tune("--dir", str(tmp_path), "--size", "1MiB", "--runs", "1", "--backends", "posix",
             "--block-sizes", "128KiB", "--depths", "2", "--out", str(out), "--no-plot")
    assert r.returncode == 0, r.stderr
    assert f"export TIERSWAP_IO_CONFIG={out}" in r.stdout
    # demo builds its engine from the environment (IoEngineConfig::from_env): it runs on the
    # file, and a file with a key the engine does not know stops it, naming the file and the key.
    r = subprocess.run([cli_path(), "demo", "--dir", str(tmp_path / "ok"), "--params", "1M",
                        "--steps", "1"], capture_output=True, text=True,
                       env=dict(os.environ, TIERSWAP_IO_CONFIG=str(out)))
    assert r.returncode == 0, r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"queue_depth": 8, "colour": "red"}')
    r = subprocess.run([cli_path(), "demo", "--dir", str(tmp_path / "d"), "--params", "1M",
                        "--steps", "1"], capture_output=True, text=True,
                       env=dict(os.environ, TIERSWAP_IO_CONFIG=str(bad)))
    assert r.returncode != 0 and str(bad) in r.stderr and "colour" in r.stderr


@pytest.mark.parametrize("args, names", [
    ((), "--dir"),
    (("--backends", "spdk"), "spdk"),
    (("--backends", "auto"), "auto"),
    (("--depths", "0"), "queue_depth"),
    (("--block-sizes", "3KiB"), "block_size"),
    (("--size", "12XB"), "--size"),
    (("--runs", "0"), "--runs"),
])
def test_bad_input_is_named(tmp_path, args, names):
    full = list(args) if args == () else ["--dir", str(tmp_path), "--size", "1MiB", *args]
    r = tune(*full, "--out", str(tmp_path / "io.json"))
    assert r.returncode != 0
    assert names in r.stderr, r.stderr
    assert not (tmp_path / "io.json").exists()


def test_a_failing_tune_leaves_an_existing_config_alone(tmp_path):
    out = tmp_path / "io.json"
    out.write_text('{"queue_depth": 64}\n')
    r = tune("--dir", str(tmp_path / "missing"), "--size", "1MiB", "--out", str(out))
    assert r.returncode != 0 and "missing" in r.stderr
    r = tune("--dir", str(tmp_path), "--size", "1MiB", "--runs", "1", "--backends", "posix",
             "--block-sizes", "128KiB", "--depths", "2", "--out", str(tmp_path / "no" / "io.json"))
    assert r.returncode != 0 and str(tmp_path / "no" / "io.json") in r.stderr
    (tmp_path / "taken").mkdir()  # the sweep runs, then --out cannot be written (a directory)
    r = tune("--dir", str(tmp_path), "--size", "1MiB", "--runs", "1", "--backends", "posix",
             "--block-sizes", "128KiB", "--depths", "2", "--out", str(tmp_path / "taken"),
             "--no-plot")
    assert r.returncode != 0 and str(tmp_path / "taken") in r.stderr
    assert not (tmp_path / "taken.tmp").exists()
    assert out.read_text() == '{"queue_depth": 64}\n'
