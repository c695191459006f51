"""`tierswap serve` as systemd runs it: readiness through NOTIFY_SOCKET, the socket handed over by
socket activation (LISTEN_FDS), `tierswap ps` listing the service, its Prometheus endpoint, a
clean stop on SIGTERM; and bad options named."""
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

from test_metrics import free_port, parse
from test_tune import cli_path


def notify_socket(tmp_path, name="notify"):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / name)
    s.bind(path)
    s.settimeout(30)
    return s, path


def wait_for(s, word):
    while True:
        msg = s.recv(4096).decode()
        if word in msg.split("\n"):
            return


def shmem_lends_huge_pages():
    """Whether this kernel gives shared memory that asks (MADV_HUGEPAGE) transparent huge pages:
    the sysfs shmem_enabled selection, or its 2 MiB entry's when that is not "inherit"."""
    def selected(path):
        try:
            text = open(path).read()
        except OSError:
            return ""
        return text[text.index("[") + 1:text.index("]")] if "[" in text else ""
    thp = "/sys/kernel/mm/transparent_hugepage"
    top, two = selected(f"{thp}/shmem_enabled"), selected(f"{thp}/hugepages-2048kB/shmem_enabled")
    return (top if two in ("", "inherit") else two) in ("always", "within_size", "advise")


def test_serve_under_systemd_notifies_lists_and_serves_metrics(tmp_path):
    swap = tmp_path / "swap"
    swap.mkdir()
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    sock = str(tmp_path / "service.sock")
    port = free_port()
    note, note_path = notify_socket(tmp_path)
    env = dict(os.environ, NOTIFY_SOCKET=note_path, TIERSWAP_RUNTIME_DIR=str(run))
    svc = subprocess.Popen([cli_path(), "serve", "--swap-dir", str(swap), "--capacity", "64MiB",
                            "--host-budget", "4MiB", "--pageable-budget", "6MiB", "--socket", sock,
                            "--no-lock", "--metrics", f"127.0.0.1:{port}"],
                           env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(note, "READY=1")
        assert os.path.exists(sock)
        assert oct(os.stat(sock).st_mode & 0o777) == "0o600"
        ps = subprocess.run([cli_path(), "ps"], env=env, capture_output=True, text=True, check=True)
        assert str(svc.pid) in ps.stdout and "0 B of 4.00 MiB shared memory granted" in ps.stdout, ps.stdout
        pages = "transparent huge pages" if shmem_lends_huge_pages() else "4 KiB pages"
        assert f"shared memory on {pages} (shmem_enabled: " in ps.stdout, ps.stdout
        res = subprocess.run([cli_path(), "residency", str(svc.pid)], env=env, capture_output=True,
                             text=True, check=True)
        assert f"node service (pid {svc.pid}): 0 B of 4.00 MiB" in res.stdout, res.stdout
        listed = json.loads(subprocess.run([cli_path(), "ps", "--json"], env=env,
                                           capture_output=True, text=True, check=True).stdout)
        entry = [p for p in listed["processes"] if p["pid"] == svc.pid]
        assert len(entry) == 1 and entry[0]["service"]["host_budget"] == 4 << 20, listed
        assert entry[0]["service"]["clients"] == [], listed
        assert entry[0]["service"]["pageable_budget"] == 6 << 20, listed
        assert entry[0]["service"]["pageable_granted"] == 0, listed
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            types, samples = parse(r.read().decode())
        assert samples["tierswap_service_clients"][""] == 0
        assert samples["tierswap_service_memory_budget_bytes"][""] == 4 << 20
        assert samples["tierswap_service_pageable_budget_bytes"][""] == 6 << 20
        assert samples["tierswap_service_pageable_granted_bytes"][""] == 0
        svc.send_signal(signal.SIGTERM)
        wait_for(note, "STOPPING=1")
        assert svc.wait(timeout=30) == 0
        err = svc.stderr.read()
        assert "(4.00 MiB of shared memory for all clients, 6.00 MiB pageable beside it" in err, err
        assert not os.path.exists(sock)  # its own socket is removed
    finally:
        if svc.poll() is None:
            svc.kill()
        svc.wait()


def test_ps_and_residency_do_not_wait_forever_on_a_stopped_process(tmp_path):
    """A stopped process (SIGSTOP, a debugger) accepts on its telemetry socket and answers
    nothing: `ps` still lists every process (asking them all at once) and `residency` of it ends
    with an error saying it is stopped, and so does `residency` aimed at a service's own socket."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    env = dict(os.environ, TIERSWAP_RUNTIME_DIR=str(run))
    services = []
    try:
        for name in ("stopped", "running"):
            swap = tmp_path / name
            swap.mkdir()
            note, note_path = notify_socket(tmp_path, name + ".notify")
            services.append(subprocess.Popen(
                [cli_path(), "serve", "--swap-dir", str(swap), "--capacity", "64MiB",
                 "--host-budget", "4MiB", "--socket", str(tmp_path / f"{name}.sock"), "--no-lock"],
                env=dict(env, NOTIFY_SOCKET=note_path), stderr=subprocess.DEVNULL))
            wait_for(note, "READY=1")
        stopped, running = services
        stopped.send_signal(signal.SIGSTOP)
        ps = subprocess.run([cli_path(), "ps", "--timeout", "1.5"], env=env,
                            capture_output=True, text=True, check=True, timeout=120)
        assert str(stopped.pid) in ps.stdout and str(running.pid) in ps.stdout, ps.stdout
        assert f"node service (pid {running.pid})" in ps.stdout, ps.stdout
        assert f"process {stopped.pid} is stopped (SIGSTOP or a debugger)" in ps.stdout, ps.stdout
        res = subprocess.run([cli_path(), "residency", str(stopped.pid), "--timeout", "1.5"],
                             env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode != 0
        assert f"{stopped.pid}.sock within 1.5 s: process {stopped.pid} is stopped" in res.stderr, \
            res.stderr
        res = subprocess.run([cli_path(), "residency", str(tmp_path / "running.sock")], env=env,
                             capture_output=True, text=True, timeout=120)  # the default 10 s
        assert res.returncode != 0
        assert f"process {running.pid} listens there" in res.stderr, res.stderr
        # --watch goes on while the process is stopped, shows it again when it goes on, and
        # ends by itself once it is gone.
        stopped.send_signal(signal.SIGCONT)
        watch = subprocess.Popen([cli_path(), "residency", str(stopped.pid), "--watch", "0.3",
                                  "--timeout", "1", "--json"], env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert f'"pid":{stopped.pid}' in watch.stdout.readline().replace(" ", "")
        stopped.send_signal(signal.SIGSTOP)
        time.sleep(3)
        stopped.send_signal(signal.SIGCONT)
        time.sleep(1)
        stopped.terminate()
        assert stopped.wait(timeout=30) == 0
        out, err = watch.communicate(timeout=60)
        assert watch.returncode == 0, err
        assert f"process {stopped.pid} is stopped (SIGSTOP or a debugger)" in err, err
        assert "(still watching)" in err and "the process is gone" in err, err
        assert f'"pid":{stopped.pid}' in out.replace(" ", ""), out[:500]  # shown again
    finally:
        for svc in services:
            svc.send_signal(signal.SIGCONT)
            svc.terminate()
            svc.wait(timeout=30)


def test_serve_takes_the_socket_systemd_hands_over(tmp_path):
    swap = tmp_path / "swap"
    swap.mkdir()
    path = str(tmp_path / "activated.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    note, note_path = notify_socket(tmp_path)
    env = dict(os.environ, NOTIFY_SOCKET=note_path, LISTEN_FDS="1",
               TIERSWAP_RUNTIME_DIR=str(tmp_path), TIERSWAP_HUGE_PAGES="0")
    os.chmod(tmp_path, 0o700)
    # The socket becomes fd 3 (SD_LISTEN_FDS_START); LISTEN_PID must be the service's pid: the
    # shell's, which exec keeps.
    fd = listener.fileno()
    cmd = (f'exec 3<&{fd} {fd}<&-; LISTEN_PID=$$ exec "{cli_path()}" serve --swap-dir "{swap}" '
           f'--capacity 64MiB --no-lock')
    svc = subprocess.Popen(["bash", "-c", cmd], env=env, pass_fds=(fd,), stdin=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    try:
        wait_for(note, "READY=1")
        # A connection on the handed-over socket is the service's: garbage gets it dropped.
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.settimeout(10)
        c.connect(path)
        c.sendall(b"\xff\xff\xff\x7fgarbage")
        assert c.recv(16) == b""
        c.close()
        svc.send_signal(signal.SIGTERM)
        assert svc.wait(timeout=30) == 0
        assert os.path.exists(path)  # systemd's socket: not the service's to remove
        err = svc.stderr.read()
        assert f"listening on {path}" in err, err
        assert "dropped" in err and "message length" in err, err
        assert "4 KiB pages" not in err, err  # no warning about pages it was told not to use
    finally:
        if svc.poll() is None:
            svc.kill()
        svc.wait()


@pytest.mark.parametrize("args,named", [
    (["--host-budget", "lots"], "--host-budget"),
    (["--metrics", "nine"], "--metrics"),
    (["--metrics", "0.0.0.0:"], "loopback only"),
    (["--metrics-any-host", "--metrics", "0.0.0.0:"], "PORT in 0..65535"),
    (["--metrics", "0.0.0.0:9100"], "--metrics-any-host"),  # loopback unless told otherwise
    (["--region-ttl", "soon"], "--region-ttl 'soon'"),
    (["--client-quota", "8MiB"], "client_quota"),
    (["--pageable-quota", "much"], "--pageable-quota"),
    (["--pageable-budget", "much"], "--pageable-budget"),
    (["--pageable-quota", "8MiB", "--pageable-budget", "4MiB"], "pageable_quota 8.00 MiB exceeds"),
])
def test_serve_names_a_bad_option(tmp_path, args, named):
    r = subprocess.run([cli_path(), "serve", "--swap-dir", str(tmp_path), "--capacity", "64MiB",
                        "--host-budget", "4MiB", "--socket", str(tmp_path / "s.sock"), *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert named in r.stderr, r.stderr


def test_serve_without_a_swap_space_asks_for_a_capacity(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = subprocess.run([cli_path(), "serve", "--swap-dir", str(empty), "--host-budget", "4MiB",
                        "--socket", str(tmp_path / "s.sock")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert str(empty) in r.stderr and "--capacity" in r.stderr, r.stderr
    assert list(empty.iterdir()) == []  # nothing created


def test_serve_makes_one_level_of_socket_directory_and_refuses_a_deeper_one(tmp_path):
    swap = tmp_path / "swap"
    swap.mkdir()
    deep = tmp_path / "missing" / "deeper" / "s.sock"
    r = subprocess.run([cli_path(), "serve", "--swap-dir", str(swap), "--capacity", "64MiB",
                        "--host-budget", "4MiB", "--socket", str(deep)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert str(deep.parent) in r.stderr and "parent must exist" in r.stderr, r.stderr
    assert not (tmp_path / "missing").exists()
    assert list(swap.iterdir()) == []  # checked before the swap space is created
    one = tmp_path / "run" / "s.sock"
    svc = subprocess.Popen([cli_path(), "serve", "--swap-dir", str(swap), "--capacity", "64MiB",
                            "--host-budget", "4MiB", "--socket", str(one), "--no-lock"],
                           stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not one.exists() and svc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert one.exists(), svc.stderr.read() if svc.poll() is not None else "no socket"
        assert (one.parent.stat().st_mode & 0o777) == 0o700
    finally:
        svc.send_signal(signal.SIGTERM)
        err = svc.communicate(timeout=60)[1]
    assert svc.returncode == 0, err
    assert not one.exists()  # removed at the stop


def test_serve_refuses_a_budget_above_the_machine_s_memory_and_makes_nothing(tmp_path):
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    swap = tmp_path / "service-swap"
    swap.mkdir()
    r = subprocess.run([cli_path(), "serve", "--swap-dir", str(swap), "--capacity", "512MiB",
                        "--host-budget", str(ram * 2), "--socket", str(tmp_path / "s" / "sock"),
                        "--no-lock"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "is more than this machine's memory" in r.stderr, r.stderr
    assert list(swap.iterdir()) == [] and not (tmp_path / "s").exists()


@pytest.mark.parametrize("journal", [False, True])
def test_the_service_log_says_when_and_whom_it_refused(tmp_path, journal):
    """issue 61: log lines had no time nor level for journald, and the default level hid
    refusals and attaches."""
    svc, sock = start_service(tmp_path, journal=journal)
    try:
        r = subprocess.run([cli_path(), "release", "nosuch.0", "--socket", sock, "--timeout", "10"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "not known to this service" in r.stderr, r.stderr
    finally:
        svc.send_signal(signal.SIGTERM)
        err = svc.communicate(timeout=60)[1]
    # journald stamps the time itself and reads the level from syslog's "<4>" (warning).
    stamp = "<4>" if journal else r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z "
    assert re.search(f"^{stamp}tierswap\\[warn\\]: service: refused nosuch.0 to pid \\d+ of uid "
                     f"{os.getuid()}: client nosuch.0 is not known", err, re.M), err
    info = "<6>" if journal else stamp
    assert re.search(f"^{info}tierswap\\[info\\]: service: stopping", err, re.M), err


def start_service(tmp_path, budget="256MiB", extra=(), journal=False):
    """A service on tmp_path/service-swap (made at the first start, reopened at a later one);
    with `journal`, its stderr taken for the journal's (JOURNAL_STREAM set)."""
    swap = tmp_path / "service-swap"
    swap.mkdir(exist_ok=True)
    sock = str(tmp_path / "service.sock")
    starts = len(list(tmp_path.glob("notify*")))
    note, note_path = notify_socket(tmp_path, f"notify{starts}")
    svc = subprocess.Popen([cli_path(), "serve", "--swap-dir", str(swap), "--capacity", "512MiB",
                            "--host-budget", budget, "--socket", sock, "--no-lock", *extra],
                           env=dict({k: v for k, v in os.environ.items()
                                     if k not in ("JOURNAL_STREAM", "TIERSWAP_LOG_LEVEL")},
                                    NOTIFY_SOCKET=note_path,
                                    **({"JOURNAL_STREAM": "8:1"} if journal else {})),
                           stderr=subprocess.PIPE,
                           text=True)
    wait_for(note, "READY=1")
    return svc, sock


def test_a_pytorch_job_on_the_service_trains_as_on_its_own_swap_files(tmp_path):
    import torch

    import tierswap.torch as tt
    from tierswap import tinylm

    svc, sock = start_service(tmp_path)
    try:
        runs = {}
        for name, kw in (("own", {}), ("service", {"service": sock, "service_job": "lm"})):
            (tmp_path / name).mkdir()
            model = tinylm.make_model()
            opt = tt.AdamW(tinylm.param_groups(model), swap_dir=str(tmp_path / name),
                           host_budget="16MiB", state_tier="nvme", max_grad_norm=1.0,
                           telemetry=False, **kw)
            losses = tinylm.train_tierswap(model, opt, 4, total=4)
            if name == "service":  # issue 61: host_budget 16MiB was charged 20 MiB
                r = subprocess.run([cli_path(), "residency", str(svc.pid), "--json"],
                                   capture_output=True, text=True, check=True)
                (client,) = json.loads(r.stdout)["clients"]
                assert client["memory_bytes"] == 16 << 20, client
            masters = opt.state_dict()["master_params"]
            runs[name] = (losses, {k: v.clone() for k, v in masters.items()}, opt.residency())
            opt.close()
        assert runs["own"][0] == runs["service"][0]
        assert runs["own"][1].keys() == runs["service"][1].keys()
        for k, a in runs["own"][1].items():
            assert torch.equal(a, runs["service"][1][k]), k
        res = runs["service"][2]
        assert res["host_memory"] == "service-shared"
        assert res["counters"]["tiers"]["nvme"]["bytes_in"] > 0  # written through the service
        assert not (tmp_path / "service" / "tierswap-rank0" / "tierswap.swap").exists()
    finally:
        svc.terminate()
        assert svc.wait(timeout=30) == 0


def test_ranks_without_a_host_budget_take_their_share_of_the_service(tmp_path, monkeypatch):
    """The defaults work together: a rank that gives no host_budget takes what the service offers
    it (1/LOCAL_WORLD_SIZE of the node's budget) when its default 1 GiB does not fit; one that
    gives a budget is refused when it does not fit; a share too small is named."""
    import torch

    import tierswap.torch as tt

    svc, sock = start_service(tmp_path, budget="64MiB")
    opts = []
    try:
        (tmp_path / "given").mkdir()
        small = torch.nn.Linear(8, 8).to(torch.bfloat16)
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "64")  # all 64 MiB free: 1 MiB each
        with pytest.raises(RuntimeError, match=r"offers this rank 1.00 MiB \(1/64 of its"):
            tt.AdamW(small.parameters(), swap_dir=str(tmp_path / "given"), service=sock,
                     service_job="small", telemetry=False)
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
        for rank in range(2):
            (tmp_path / f"r{rank}").mkdir()
            model = torch.nn.Linear(256, 256).to(torch.bfloat16)
            opt = tt.AdamW(model.parameters(), swap_dir=str(tmp_path / f"r{rank}"), service=sock,
                           service_job=f"share{rank}", telemetry=False)
            model(torch.randn(4, 256, dtype=torch.bfloat16)).sum().backward()
            opt.step()
            assert 4 << 20 <= opt.residency()["host_budget_bytes"] <= 32 << 20
            opts.append(opt)
        with pytest.raises(RuntimeError, match="of the node's 64.00 MiB is free"):
            tt.AdamW(small.parameters(), swap_dir=str(tmp_path / "given"), service=sock,
                     service_job="given", host_budget="8MiB", telemetry=False)
    finally:
        for opt in opts:
            opt.close()
        svc.terminate()
        assert svc.wait(timeout=30) == 0


def test_a_rank_takes_the_pageable_memory_the_service_offers_it(tmp_path, monkeypatch, capfd):
    """Without a host_budget a rank sizes its pageable pool (where the gradients wait) to what the
    service offers it of its unlocked memory, rather than asking for all its gradients and being
    refused at attach: those that do not fit spill, and the run is the one on its own files."""
    import torch

    import tierswap.torch as tt

    svc, sock = start_service(tmp_path, budget="64MiB", extra=("--pageable-budget", "16MiB"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # 4 MiB of pageable memory each: 8 needed
    runs = {}
    try:
        for name, kw in (("own", {}), ("service", {"service": sock, "service_job": "pg"})):
            (tmp_path / name).mkdir()
            torch.manual_seed(0)
            model = torch.nn.Linear(2048, 2048).to(torch.bfloat16)  # 8 MiB of bf16 gradients
            opt = tt.AdamW(model.parameters(), swap_dir=str(tmp_path / name), telemetry=False,
                           **kw)
            for step in range(3):
                torch.manual_seed(100 + step)
                model(torch.randn(4, 2048, dtype=torch.bfloat16)).square().sum().backward()
                opt.step()
                opt.zero_grad()
            runs[name] = ({k: v.clone() for k, v in opt.state_dict()["master_params"].items()},
                          opt.residency())
            opt.close()
    finally:
        svc.terminate()
        assert svc.wait(timeout=30) == 0
    assert "pageable memory for the gradients:" in capfd.readouterr().err
    assert 0 < runs["service"][1]["pageable_budget_bytes"] <= 4 << 20, runs["service"][1]
    for k, v in runs["own"][0].items():
        assert torch.equal(v, runs["service"][0][k]), k


def test_a_killed_run_on_a_temporary_directory_leaves_no_region_in_the_service(tmp_path):
    """A run without swap_dir (a temporary directory, which nothing can resume) asks the service to
    forget its region when it detaches: killed, it leaves none. One with a swap_dir keeps its
    region for a resume."""
    import sys

    svc, sock = start_service(tmp_path)
    child = (
        "import os, signal, sys, torch\n"
        "import tierswap.torch as tt\n"
        "m = torch.nn.Linear(64, 64).to(torch.bfloat16)\n"
        "kw = {'swap_dir': sys.argv[2]} if len(sys.argv) > 2 else {}\n"
        "opt = tt.AdamW(m.parameters(), service=sys.argv[1], service_job='killed', "
        "telemetry=False, **kw)\n"
        "m(torch.randn(2, 64, dtype=torch.bfloat16)).sum().backward()\n"
        "opt.step()\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n")

    def clients():
        r = subprocess.run([cli_path(), "residency", str(svc.pid), "--json"],
                           capture_output=True, text=True, check=True)
        return json.loads(r.stdout)["clients"]

    try:
        for args, kept in (([], 0), ([str(tmp_path)], 1)):
            r = subprocess.run([sys.executable, "-c", child, sock, *args], capture_output=True,
                               text=True, timeout=120, env=dict(os.environ))
            assert r.returncode == -signal.SIGKILL, r.stderr
            deadline = time.time() + 30
            while len(clients()) != kept or any(c.get("attached") for c in clients()):
                assert time.time() < deadline, clients()
                time.sleep(0.1)
    finally:
        svc.terminate()
        assert svc.wait(timeout=30) == 0


def kept_job(tmp_path, sock, name):
    """A tinylm job on the service that trained one step and keeps its region (its optimizer,
    attached until closed), its swap directory tmp_path/name."""
    import tierswap.torch as tt
    from tierswap import tinylm

    (tmp_path / name).mkdir()
    model = tinylm.make_model()
    opt = tt.AdamW(tinylm.param_groups(model), swap_dir=str(tmp_path / name), host_budget="16MiB",
                   state_tier="nvme", telemetry=False, service=sock, service_job=name,
                   keep_swap_files=True)
    tinylm.train_tierswap(model, opt, 1, total=1)
    return opt


def test_release_frees_the_region_of_a_job_that_kept_it(tmp_path):
    svc, sock = start_service(tmp_path)

    def release(client):
        return subprocess.run([cli_path(), "release", client, "--socket", sock, "--timeout", "10"],
                              capture_output=True, text=True, timeout=60)

    def service_lines():
        return subprocess.run([cli_path(), "residency", str(svc.pid)], capture_output=True,
                              text=True, check=True).stdout

    try:
        opt = kept_job(tmp_path, sock, "kept")
        r = release("kept.0")  # while the job runs: refused, nothing lost
        assert r.returncode != 0 and "kept.0 is already attached" in r.stderr, r.stderr
        opt.close()
        lines = service_lines()
        assert re.search(r"kept\.0 \(tier manager\): detached for \d+ s", lines), lines
        # a tier manager's generations are its manifest's: the service has none to show
        assert "generations in its swap directory's manifest" in lines and "generation 0" not in lines
        for bad, named in (("ghost.0", "ghost.0 is not known"), ("kept", "JOB.RANK"),
                           ("kept.x", "JOB.RANK"), ("kept.1", "kept.1 is not known")):
            r = release(bad)
            assert r.returncode != 0 and named in r.stderr, (bad, r.stderr)
        assert "kept.0 (tier manager): detached" in service_lines()
        r = release("kept.0")
        assert r.returncode == 0 and "kept.0 released" in r.stdout, r.stderr
        assert "0 clients known" in service_lines()
        r = release("kept.0")
        assert r.returncode != 0 and "kept.0 is not known" in r.stderr, r.stderr
        assert "nothing to reattach to or release" in r.stderr, r.stderr
        for t in ("0", "-1", "nan", "soon"):
            r = subprocess.run([cli_path(), "release", "kept.0", "--socket", sock, "--timeout", t],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode != 0, t
            assert f"--timeout: '{t}': expected a number of seconds above 0" in r.stderr, r.stderr
    finally:
        svc.terminate()
        assert svc.wait(timeout=30) == 0


def test_release_selects_regions_by_age_and_job_and_keeps_attached_ones(tmp_path):
    """issue 61: kept regions never expired; `tierswap release --older-than D` / `--all-of-job J`
    free what a uid's ended jobs left, never a region a job is attached to."""
    svc, sock = start_service(tmp_path)

    def release(*args):
        return subprocess.run([cli_path(), "release", *args, "--socket", sock, "--timeout", "10"],
                              capture_output=True, text=True, timeout=60)

    try:
        for name in ("ended", "old"):
            kept_job(tmp_path, sock, name).close()
        running = kept_job(tmp_path, sock, "running")
        r = release("--older-than", "1h")
        assert r.returncode == 0 and "0 released, 0 attached and kept, 0 failed" in r.stdout, r
        r = release("--all-of-job", "running")
        assert r.returncode == 0 and "running.0 is attached: kept" in r.stdout, r
        r = release("--all-of-job", "ended")
        assert r.returncode == 0, r.stderr
        assert "ended.0 released" in r.stdout and "1 released" in r.stdout, r.stdout
        time.sleep(2.1)  # the last use is kept in whole seconds
        r = release("--older-than", "1s")
        assert r.returncode == 0, r.stderr
        assert "old.0 released" in r.stdout and "running.0" not in r.stdout, r.stdout
        assert "1 released, 0 attached and kept" in r.stdout, r.stdout
        for args, named in ((["old.0", "--all-of-job", "old"], "name one client"), ([], "name one client"),
                            (["--older-than", "soon"], "--older-than 'soon'"),
                            (["--all-of-job", "a/b"], "--all-of-job 'a/b'")):
            r = release(*args)
            assert r.returncode != 0 and named in r.stderr, (args, r.stderr)
        running.close()
        r = release("--all-of-job", "running")
        assert r.returncode == 0 and "running.0 released" in r.stdout, r
    finally:
        svc.terminate()
        assert svc.wait(timeout=30) == 0


def test_a_restart_over_a_lost_swap_file_says_what_went_and_exits_78(tmp_path):
    """issue 61: after the swap file was deleted, a restart made a new one and failed on the old
    registry, which under Restart=on-failure looped. Now it makes nothing, names the clients whose
    state went, and exits 78, which the unit does not restart (RestartPreventExitStatus=78)."""
    svc, sock = start_service(tmp_path)
    try:
        kept_job(tmp_path, sock, "gone").close()
    finally:
        svc.terminate()
        assert svc.wait(timeout=30) == 0
    swap = tmp_path / "service-swap"
    (swap / "tierswap.swap").unlink()
    before = sorted(p.name for p in swap.iterdir())
    r = subprocess.run([cli_path(), "serve", "--swap-dir", str(swap), "--capacity", "512MiB",
                        "--host-budget", "256MiB", "--socket", sock, "--no-lock"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 78, r.stderr
    assert "gone.0" in r.stderr and "is gone" in r.stderr and "exit status 78" in r.stderr, r.stderr
    assert sorted(p.name for p in swap.iterdir()) == before
    r = subprocess.run([cli_path(), "serve", "--swap-dir", str(tmp_path / "missing"), "--capacity",
                        "64MiB", "--socket", sock], capture_output=True, text=True, timeout=60)
    assert r.returncode == 78 and "does not exist" in r.stderr, r.stderr


def test_serve_releases_regions_past_their_ttl(tmp_path):
    svc, sock = start_service(tmp_path, extra=("--region-ttl", "2s"))
    try:
        kept_job(tmp_path, sock, "brief").close()
    finally:
        time.sleep(4)  # past the TTL and a sweep
        svc.terminate()
        assert svc.wait(timeout=30) == 0
    err = svc.stderr.read()
    assert "regions unused for 2 s released" in err, err
    assert re.search(r"service: brief\.0 expired: no client attached to it for \d+ s "
                     r"\(--region-ttl 2 s\)", err), err
    assert "service: brief.0 released" in err, err


def test_bench_io_measures_through_the_service_and_gives_its_region_back(tmp_path):
    svc, sock = start_service(tmp_path, budget="8MiB")
    try:
        r = subprocess.run([cli_path(), "bench", "io", "--service", sock, "--size", "8MiB",
                            "--block-size", "256KiB", "--queue-depth", "3", "--runs", "2", "--json"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["service"] == sock and out["backend_description"].startswith("service (")
        assert "buffered" not in out["backend_description"]  # the region's files are the service's
        runs = out["runs"]
        assert [(x["mode"], x["run"]) for x in runs] == [("write", 1), ("read", 1), ("write", 2),
                                                         ("read", 2)]
        for x in runs:
            assert x["bytes"] == 8 << 20 and x["requests"] == 32 and x["queue_depth"] == 3, x
        # Each combination's client released its region and memory: the service is as it was.
        ps = subprocess.run([cli_path(), "residency", str(svc.pid)], capture_output=True,
                            text=True, check=True)
        assert "0 B of 8.00 MiB shared memory granted (+ 0 B of " in ps.stdout, ps.stdout
        assert "pageable), 0 clients known" in ps.stdout, ps.stdout
        # A ring larger than the client's share of the budget is refused with the service's reason.
        r = subprocess.run([cli_path(), "bench", "io", "--service", sock, "--size", "8MiB",
                            "--block-size", "4MiB", "--queue-depth", "4", "--runs", "1"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and "refused" in r.stderr, r.stderr
    finally:
        svc.kill()
        svc.wait()


@pytest.mark.parametrize("extra,named", [
    (["--dir", "/var/tmp"], "--dir"),
    (["--sweep"], "--sweep"),
    (["--backend", "posix"], "--backend"),
])
def test_bench_io_through_the_service_refuses_the_service_s_own_settings(tmp_path, extra, named):
    r = subprocess.run([cli_path(), "bench", "io", "--service", str(tmp_path / "none.sock"),
                        "--size", "1MiB"] + extra, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and named in r.stderr and "tierswap serve" in r.stderr, r.stderr


def test_a_stopped_service_fails_its_client_within_its_timeout(tmp_path):
    """SIGSTOP on the service (a hung service): the client's step fails with ETIMEDOUT after its
    timeout (TIERSWAP_SERVICE_TIMEOUT), and closing the optimizer does not wait for the service a
    second time (before, the release and the goodbye each waited the timeout again)."""
    import sys

    svc, sock = start_service(tmp_path)
    child = (
        "import sys, time\n"
        "import tierswap.torch as tt\n"
        "from tierswap import tinylm\n"
        "model = tinylm.make_model()\n"
        "opt = tt.AdamW(tinylm.param_groups(model), swap_dir=sys.argv[2], host_budget='16MiB',\n"
        "               state_tier='nvme', telemetry=False, service=sys.argv[1], service_job='hung')\n"
        "try:\n"
        "    while True:\n"
        "        tinylm.train_tierswap(model, opt, 1, total=1)\n"
        "        print('stepped', flush=True)\n"
        "except Exception as e:\n"
        "    print('failed:', e, flush=True)\n"
        "failed = time.monotonic()\n"
        "opt.close()\n"
        "print('closed after', time.monotonic() - failed, flush=True)\n")
    (tmp_path / "job").mkdir()
    timeout = 8
    client = subprocess.Popen([sys.executable, "-c", child, sock, str(tmp_path / "job")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, TIERSWAP_SERVICE_TIMEOUT=str(timeout)))
    try:
        assert client.stdout.readline() == "stepped\n", client.stderr.read()
        svc.send_signal(signal.SIGSTOP)
        out, err = client.communicate(timeout=10 * timeout)
        assert client.returncode == 0, err
        failed = [line for line in out.splitlines() if line.startswith("failed:")]
        assert failed and "Connection timed out" in failed[0], out + err
        closed = float(out.splitlines()[-1].split()[-1])
        assert closed < timeout, (closed, err)  # the close did not wait for the service again
        assert f"did not answer within {timeout} s earlier" in err, err
    finally:
        client.kill()
        svc.send_signal(signal.SIGCONT)
        svc.terminate()
        assert svc.wait(timeout=30) == 0


def test_sigterm_lets_a_training_job_commit_and_tells_it_the_service_is_going(tmp_path):
    """SIGTERM (systemctl stop): the job attached is served to its next commit, then told the
    service is stopping (ESHUTDOWN with the reason), and the service logs it and exits; the job
    run again on the restarted service resumes from the last step it completed."""
    import sys

    svc, sock = start_service(tmp_path)
    child = (
        "import sys\n"
        "import tierswap.torch as tt\n"
        "from tierswap import tinylm\n"
        "model = tinylm.make_model()\n"
        "opt = tt.AdamW(tinylm.param_groups(model), swap_dir=sys.argv[2], host_budget='16MiB',\n"
        "               telemetry=False, service=sys.argv[1], service_job='lm',\n"
        "               keep_swap_files=True, resume=True)\n"
        "print('resumed at', opt.step_count, flush=True)\n"
        "if len(sys.argv) > 3:\n"
        "    sys.exit(0)\n"
        "try:\n"
        "    while True:\n"
        "        tinylm.train_tierswap(model, opt, opt.step_count + 1, start=opt.step_count)\n"
        "        print('stepped', opt.step_count, flush=True)\n"
        "except Exception as e:\n"
        "    print('failed:', e, flush=True)\n")
    job = tmp_path / "job"
    job.mkdir()

    def run(*more):
        return subprocess.Popen([sys.executable, "-c", child, sock, str(job), *more],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    client = run()
    try:
        assert client.stdout.readline() == "resumed at 0\n", client.stderr.read()
        first = client.stdout.readline()
        assert first.startswith("stepped"), client.stderr.read()
        svc.send_signal(signal.SIGTERM)
        log = svc.communicate(timeout=120)[1]
        assert svc.returncode == 0, log
        out, err = client.communicate(timeout=120)
        out = first + out
    finally:
        client.kill()
        svc.kill()
    assert "stopping: lm.0 is at its last commit; told it the service is going" in log, log
    assert "stopping: every client is detached" in log, log
    assert "the tierswap service is stopping (SIGTERM)" in err, err
    steps = [int(line.split()[1]) for line in out.splitlines() if line.startswith("stepped")]
    assert out.splitlines()[-1].startswith("failed:"), out
    svc, sock = start_service(tmp_path)  # restarted over the same swap files
    try:
        out, err = run("resume-only").communicate(timeout=120)
        assert out.splitlines()[0] == f"resumed at {steps[-1]}", out + err
    finally:
        svc.terminate()
        assert svc.wait(timeout=30) == 0
