"""The Prometheus endpoint of a PyTorch job (TIERSWAP_METRICS): scraped over HTTP with Python's
own client while the job runs, every line parsed by the exposition grammar, the values checked
against what the job reports; and a bad address is an error naming the variable."""

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

JOB = r"""
import sys, torch, tierswap.torch as tt
from tierswap import tinylm
model = tinylm.make_model()
# commits inside step(): the counters printed below are final, not still moving as the last
# step's commit lands (pipelined_commit)
opt = tt.AdamW(tinylm.param_groups(model), swap_dir=sys.argv[1], host_budget="16MiB",
               state_tier="nvme", max_grad_norm=1.0, telemetry=False, pipelined_commit=False)
tinylm.train_tierswap(model, opt, 3, total=3)
c = opt.residency()["counters"]["tiers"]["nvme"]
print(opt.step_count, c["bytes_in"], c["bytes_out"], flush=True)
sys.stdin.read()  # scraped now; ends when the test closes stdin
opt.close()
"""

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE = re.compile(rf"^({NAME})(\{{{LABEL}(?:,{LABEL})*\}})? (\S+)$")
TYPE = re.compile(rf"^# TYPE ({NAME}) (counter|gauge)$")
HELP = re.compile(rf"^# HELP ({NAME}) .*$")


def parse(text):
    """Every line a HELP, a TYPE before its family's samples, or a sample; returns
    {name: {labels: value}} and the types."""
    assert text.endswith("\n")
    types, samples = {}, {}
    for line in text.splitlines():
        if HELP.match(line):
            continue
        m = TYPE.match(line)
        if m:
            assert m[1] not in types, f"TYPE twice: {line}"
            types[m[1]] = m[2]
            continue
        m = SAMPLE.match(line)
        assert m, f"not a metric line: {line!r}"
        assert m[1] in types, f"sample before its TYPE: {line}"
        if types[m[1]] == "counter":
            assert m[1].endswith("_total"), line
        labels = m[2] or ""
        assert labels not in samples.setdefault(m[1], {}), f"sample twice: {line}"
        samples[m[1]][labels] = float(m[3])
    return types, samples


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port, deadline):
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                assert r.status == 200
                assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                return r.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_pytorch_job_serves_its_metrics_while_it_runs(tmp_path):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path),
               TIERSWAP_METRICS=f"127.0.0.1:{port}")
    job = subprocess.Popen([sys.executable, "-c", JOB, str(tmp_path)], env=env, text=True,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        steps, written, read = (int(x) for x in job.stdout.readline().split())
        types, samples = parse(scrape(port, time.monotonic() + 30))
    finally:
        job.stdin.close()
        assert job.wait(timeout=60) == 0
    assert steps == 3
    (labels, taken), = samples["tierswap_steps_total"].items()
    assert taken == 3 and 'rank="0"' in labels
    mgr = re.search(r'manager="(\d+)"', labels)[1]
    one = f'{{manager="{mgr}"}}'
    assert samples["tierswap_nvme_written_bytes_total"][one] == written > 0
    assert samples["tierswap_nvme_read_bytes_total"][one] == read > 0
    assert samples["tierswap_commits_total"][one] >= 3
    assert samples["tierswap_step_seconds_total"][labels] > 0
    host = f'{{manager="{mgr}",tier="host"}}'
    assert samples["tierswap_tier_capacity_bytes"][host] >= 16 << 20
    assert types["tierswap_tier_resident_bytes"] == "gauge"
    assert all(n.startswith(("tierswap_", "process_")) for n in types)
    assert samples["process_resident_memory_bytes"][""] > 0
    assert types["process_cpu_seconds_total"] == "counter"
    assert len(samples["tierswap_build_info"]) == 1
    # After the job: nothing listens.
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_a_bad_metrics_address_names_the_variable(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), TIERSWAP_METRICS="nine")
    r = subprocess.run([sys.executable, "-c", JOB, str(tmp_path)], env=env, text=True,
                       capture_output=True, stdin=subprocess.DEVNULL)
    assert r.returncode != 0
    assert "TIERSWAP_METRICS" in r.stderr and "nine" in r.stderr
