"""tierswap.torch's step from Python, against torch.optim and against the C++ `bench step`.

What it measures (medians of alternating repetitions in one run; figures go to bench/RESULTS.md):
  torch     AdamW step at --params parameters with host-resident state: tierswap.torch.AdamW's
            opt.step() (gradient hand-over of bf16 p.grad, the fused step, the new bf16 values
            written into p) against torch.optim.AdamW(foreach=True) on fp32 parameters with fp32
            gradients (the CPU recipe torch offers), same thread count. Default: tierswap's host
            state is also committed to NVMe each step (crash consistency); --memory-only keeps
            it in memory only, as torch's (equal terms).
  overhead  the Python layer's cost: tierswap.torch's opt.step() wall time (gradient hand-over
            and step) against `tierswap bench step`'s ingest + step (C++, same parameters, host
            budget, sub-group, threads and --state; both lend their gradients; host state in
            memory only on both sides), run alternately as a subprocess, each side's block after
            a sync and --settle seconds (the subprocess deletes its swap files at exit, and the
            steps right after that ran ~1.3x slower on a disk mounted with discard), each
            block's timed steps after the untimed warm-up the C++ bench takes (1 step with host
            state, 2 with NVMe state); and against the time the native step reports for itself
            (StepResult.seconds).
  handover  step-time hand-over lending p.grad (the step reads it in place: the default) against
            copying it into tierswap's gradient blocks first (as hooks=True must), two optimizers
            on equal terms in one process (host state in memory only), alternating.
  tinylm    tokens/s of tierswap.tinylm: tierswap (host state committed to NVMe every step, host
            state in memory only as torch's, NVMe state) against the torch.optim.AdamW
            mixed-precision recipe, each case's run paired with a recipe run of its own (in
            turn first and second); and per case the median exposed step time and what it
            waited for (opt.last_step's io_wait_seconds, commit_wait_seconds).
  kernel    opt.step() from Python (host state in memory only) against the fused kernel's own
            time for the same parameters (`tierswap bench kernels`, adamw_fused_bf16), in turn,
            and the floor of an exact step: the kernel plus the gradient statistics pass.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_step.py torch --params 256M --reps 5
    PYTHONPATH=build/python /usr/bin/python3 bench/torch_step.py overhead --params 64M
    PYTHONPATH=build/python /usr/bin/python3 bench/torch_step.py handover --params 256M --reps 15
    PYTHONPATH=build/python /usr/bin/python3 bench/torch_step.py tinylm
    PYTHONPATH=build/python /usr/bin/python3 bench/torch_step.py kernel --params 64M --block 3 --pages huge
"""

import argparse
import ctypes
import json
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import torch

import tierswap
import tierswap.torch as tt
from tierswap import tinylm

TENSOR = 16 << 20  # elements per tensor of the synthetic model (default of --tensor)
HUGE_PAGE = 2 << 20


def shapes(n, tensor):
    out, left = [], n
    while left > 0:
        k = min(tensor, left)
        out.append(k)
        left -= k
    return out


def scratch(a, name):
    """A swap directory for one optimizer, inside the run's temporary directory."""
    return tempfile.mkdtemp(prefix=name + "-", dir=a.scratch)


def huge_page_tensor(numel, dtype):
    """An uninitialized tensor on transparent huge pages: a private anonymous mapping advised
    MADV_HUGEPAGE, 2 MiB-aligned (torch's allocator gives large tensors 4 KiB pages where THP
    is `madvise`, the common setting). The tensor keeps the mapping alive."""
    size = numel * torch.empty(0, dtype=dtype).element_size()
    m = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    with warnings.catch_warnings():  # "The given buffer is not writable": it is (MAP_PRIVATE)
        warnings.simplefilter("ignore")
        return torch.frombuffer(m, dtype=dtype, count=numel, offset=-base % HUGE_PAGE)


def ts_model(n, tensor, huge=False):
    """bf16 parameters of `tensor` elements each with bf16 gradients, from torch's allocator, or
    with huge both on transparent huge pages (as the C++ bench's gradients and 16-bit copies)."""
    def alloc(k):
        return huge_page_tensor(k, torch.bfloat16) if huge else torch.empty(k, dtype=torch.bfloat16)
    params = [alloc(k).uniform_(-0.02, 0.02).requires_grad_() for k in shapes(n, tensor)]
    for p in params:
        p.grad = alloc(p.numel()).normal_(0, 1e-3)
    return params


def bench_torch(a):
    n = tierswap.parse_count(a.params)
    torch.set_num_threads(a.threads)
    ps = ts_model(n, a.tensor)
    ts = tt.AdamW(ps, swap_dir=scratch(a, "torch"), state_tier="host",
                  host_budget=a.host_budget, threads=a.threads, telemetry=False,
                  persist_resident_state=not a.memory_only)
    fp = [p.detach().float().requires_grad_() for p in ps]
    for q, p in zip(fp, ps):
        q.grad = p.grad.float()
    ref = torch.optim.AdamW(fp, foreach=True)
    ref.step()  # state allocated outside the timing, as tierswap's is at construction
    ts.step()
    t_ts, t_ref, t_native = [], [], []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        ts.step()
        t_ts.append(time.perf_counter() - t0)
        t_native.append(ts.last_step["seconds"])
        t0 = time.perf_counter()
        ref.step()
        t_ref.append(time.perf_counter() - t0)
    ts.close()
    out = {"params": n, "threads": a.threads, "memory_only": a.memory_only,
           "tierswap_step_s": statistics.median(t_ts),
           "tierswap_native_step_s": statistics.median(t_native),
           "torch_foreach_step_s": statistics.median(t_ref), "runs_tierswap": t_ts,
           "runs_torch": t_ref}
    out["speedup"] = out["torch_foreach_step_s"] / out["tierswap_step_s"]
    return out


def cpp_bench_step(a, n):
    """ingest + step of each of the C++ bench's --block runs (after its own warm-up)."""
    cmd = [a.cli, "bench", "step", "--params", str(n), "--host-budget", a.host_budget,
           "--sub-group", a.sub_group, "--threads", str(a.threads), "--runs", str(a.block),
           "--json", "--lend"]  # as the Python step's hand-over
    if a.cpp_grads == "distinct":  # the Python side's parameters: --tensor each, own p.grad
        cmd += ["--tensor", str(a.tensor), "--distinct-grads"]
    if a.state == "host":
        cmd += ["--state", "host", "--memory-only"]  # as the Python side's
    if a.dir:
        cmd += ["--dir", a.dir]
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    if a.state == "host":
        return [i + s for i, s in zip(r["runs_ingest_s"], r["runs_step_s"])]
    return [x["ingest_s"] + x["step_s"] for x in r["runs"]]


def settle(seconds):
    """Flush and wait out the file system's delayed work (ext4 commits, and discards of freed
    blocks with -o discard, every 5 s by default) before a side's block is timed."""
    if seconds > 0:
        os.sync()
        time.sleep(seconds)


def timed_steps(opt, n, wall, handover, native):
    """n steps of opt: each one's wall time, gradient hand-over and native step appended."""
    for _ in range(n):
        t0 = time.perf_counter()
        opt.step()
        wall.append(time.perf_counter() - t0)
        handover.append(opt.last_step["handover_seconds"])
        native.append(opt.last_step["seconds"])


def bench_overhead(a):
    n = tierswap.parse_count(a.params)
    torch.set_num_threads(a.threads)
    ps = ts_model(n, a.tensor, a.pages == "huge")
    ts = tt.AdamW(ps, lr=1e-3, swap_dir=scratch(a, "overhead"), state_tier=a.state,
                  host_budget=a.host_budget, subgroup_size=a.sub_group, threads=a.threads,
                  telemetry=False,
                  durable=False,  # as bench step (without --keep)
                  persist_resident_state=a.state != "host")
    ts.step()
    wall, native, cpp, handover, pairs = [], [], [], [], []
    # Each side's block: the untimed warm-up steps the C++ bench takes in its process (one with
    # host state, two with NVMe state), then --block timed steps. The first step after a pause
    # runs slower (0.37-0.59 s against 0.24 s at 256M with host state, the C++ subprocess or an
    # idle wait before it), and without the warm-up only the Python side timed it.
    warm = a.warmup
    if warm is None:
        warm = 1 if a.state == "host" else 2
    for _ in range(a.reps):  # a block of --block steps on each side in turn
        settle(a.settle)
        for _ in range(warm):
            ts.step()
        timed_steps(ts, a.block, wall, handover, native)
        settle(a.settle)
        cpp += cpp_bench_step(a, n)
        pairs.append(statistics.median(wall[-a.block:]) / statistics.median(cpp[-a.block:]))
    ts.close()
    # The Python layer's own cost: the step's wall time against what the native calls took
    # (gradient hand-over, whose time is the native ingest's plus the loop, and the step).
    own = [w - h - s for w, h, s in zip(wall, handover, native)]
    out = {"params": n, "state": a.state, "host_budget": a.host_budget, "sub_group": a.sub_group,
           "threads": a.threads, "tensor": a.tensor, "settle_s": a.settle,
           "warmup_steps_per_block": warm, "pages": a.pages,
           "cpp_grads": a.cpp_grads,
           "python_step_s": statistics.median(wall),
           "handover_s": statistics.median(handover), "native_step_s": statistics.median(native),
           "python_layer_s": statistics.median(own), "runs_python": wall, "runs_native": native,
           "runs_handover": handover}
    out["python_over_handover_plus_native"] = statistics.median(
        [w / (h + s) for w, h, s in zip(wall, handover, native)])
    if cpp:
        out["cpp_bench_ingest_plus_step_s"] = statistics.median(cpp)
        out["runs_cpp"] = cpp
        out["python_over_cpp_bench"] = out["python_step_s"] / out["cpp_bench_ingest_plus_step_s"]
        out["block"] = a.block
        out["python_over_cpp_bench_per_block"] = pairs
    return out


class _CopyingAdamW(tt.AdamW):
    """tierswap.torch.AdamW whose step-time hand-over copies p.grad (the hooks' way)."""

    def _add_grad(self, p, nid, lend=False):
        return super()._add_grad(p, nid, lend=False)


def bench_handover(a):
    n = tierswap.parse_count(a.params)
    torch.set_num_threads(a.threads)
    sides = {}
    for name, cls in (("lend", tt.AdamW), ("copy", _CopyingAdamW)):
        ps = ts_model(n, a.tensor)
        opt = cls(ps, swap_dir=scratch(a, name),
                  state_tier="host", host_budget=a.host_budget, threads=a.threads,
                  telemetry=False, persist_resident_state=False)
        opt.step()  # first touch outside the timing
        sides[name] = opt
    runs = {name: {"wall": [], "native": [], "handover": []} for name in sides}
    for r in range(a.reps):
        for name in (("lend", "copy") if r % 2 == 0 else ("copy", "lend")):
            t0 = time.perf_counter()
            sides[name].step()
            runs[name]["wall"].append(time.perf_counter() - t0)
            runs[name]["native"].append(sides[name].last_step["seconds"])
            runs[name]["handover"].append(sides[name].last_step["handover_seconds"])
    lent = sides["lend"].last_step["lent_subgroups"]
    for opt in sides.values():
        opt.close()
    out = {"params": n, "threads": a.threads, "lent_subgroups": lent, "runs": runs}
    for name, v in runs.items():
        for k, x in v.items():
            out[f"{name}_{k}_s"] = statistics.median(x)
    out["copy_over_lend_per_rep"] = [c / l for c, l in zip(runs["copy"]["wall"],
                                                            runs["lend"]["wall"])]
    out["copy_over_lend_median"] = statistics.median(out["copy_over_lend_per_rep"])
    return out


def kernel_seconds(a, n):
    """The fused kernel's own time for n parameters, `tierswap bench kernels`'s adamw_fused_bf16
    (bf16 gradient in, fp32 state updated in place, bf16 parameters out), and its statistics
    pass's, grad_stats_bf16 (the gradient read once: norm and non-finite check), medians of
    --block."""
    r = subprocess.run([a.cli, "bench", "kernels", "--params", str(n), "--threads",
                        str(a.threads), "--reps", str(a.block), "--json"],
                       capture_output=True, text=True, check=True)
    t = {k["kernel"]: k["median_seconds"] for k in json.loads(r.stdout)["results"]}
    return t["adamw_fused_bf16"], t["grad_stats_bf16"]


def bench_kernel(a):
    """opt.step() from Python, host state in memory only (no disk), against the fused kernel's
    time for the same parameters in `tierswap bench kernels`; the two in turn, --block steps or
    kernel repetitions a side, --reps times. Also the floor of an exact step: the kernel plus
    the statistics pass, since the verdict (skip a non-finite step, the clip factor) comes
    before the first state is written and an in-place kernel cannot be undone."""
    n = tierswap.parse_count(a.params)
    torch.set_num_threads(a.threads)
    ps = ts_model(n, a.tensor, a.pages == "huge")
    ts = tt.AdamW(ps, lr=1e-3, swap_dir=scratch(a, "kernel"), state_tier="host",
                  host_budget=a.host_budget, subgroup_size=a.sub_group, threads=a.threads,
                  telemetry=False, durable=False, persist_resident_state=False, hooks=False)
    for _ in range(2):
        ts.step()
    wall, kernel, stats, pairs, handover, native = [], [], [], [], [], []
    for r in range(a.reps):
        k = None
        for side in (("python", "kernel") if r % 2 == 0 else ("kernel", "python")):
            if side == "kernel":
                k, st = kernel_seconds(a, n)
                kernel.append(k)
                stats.append(st)
                continue
            ts.step()  # untimed: the first step after the subprocess runs slower (caches, TLB)
            timed_steps(ts, a.block, wall, handover, native)
        pairs.append(statistics.median(wall[-a.block:]) / k)
    ts.close()
    floor = [(k + st) / k for k, st in zip(kernel, stats)]
    return {"params": n, "threads": a.threads, "tensor": a.tensor, "sub_group": a.sub_group,
            "block": a.block, "pages": a.pages, "python_step_s": statistics.median(wall),
            "handover_s": statistics.median(handover), "native_step_s": statistics.median(native),
            "kernel_s": statistics.median(kernel), "grad_stats_s": statistics.median(stats),
            "python_over_kernel_per_rep": pairs,
            "python_over_kernel_median": statistics.median(pairs),
            "exact_floor_over_kernel_median": statistics.median(floor), "runs_python": wall,
            "runs_kernel": kernel, "runs_grad_stats": stats}


TINYLM_CASES = {  # tierswap.torch's keywords of each tinylm case
    # host_memory: host state kept in memory only, as torch's (no NVMe write per step); the
    # *_in_step cases are the defaults before issue 60 (the gradients handed over at step(), the
    # commit inside it); nvme_hooks: handed over during the backward, the step overlapped with it
    # (the default for GPU parameters, not for these CPU ones).
    "host": dict(state_tier="host"),
    "host_in_step": dict(state_tier="host", pipelined_commit=False, hooks=False),
    "host_memory": dict(state_tier="host", persist_resident_state=False),
    "nvme": dict(state_tier="nvme"),
    "nvme_hooks": dict(state_tier="nvme", hooks=True, overlap=True),
    "nvme_in_step": dict(state_tier="nvme", pipelined_commit=False, hooks=False)}
# What each timed step waited for: the name in the output, the key of opt.last_step.
STEP_WAITS = {"exposed_step": "exposed_seconds", "io_wait": "io_wait_seconds",
              "commit_wait": "commit_wait_seconds"}


def tinylm_tierswap(a, kw, tokens, waits):
    """tokens/s of tinylm's training with tierswap's AdamW of keywords kw, over --steps steps
    after --warmup untimed ones; each timed step's exposed time and waits (STEP_WAITS, from
    opt.last_step) appended to waits."""
    model = tinylm.make_model(width=a.width)
    marks = []  # the time at each step's end

    def log(step, loss, rate, r):
        marks.append(time.perf_counter())
        if step >= a.warmup:
            waits.append({name: r[k] for name, k in STEP_WAITS.items()})
    with tempfile.TemporaryDirectory(dir=a.scratch) as d:
        opt = tt.AdamW(tinylm.param_groups(model), swap_dir=d,
                       host_budget=a.nvme_budget if kw["state_tier"] == "nvme" else "256MiB",
                       max_grad_norm=1.0, threads=a.threads, telemetry=False, **kw)
        marks.append(time.perf_counter())
        tinylm.train_tierswap(model, opt, a.warmup + a.steps, log=log)
        opt.close()
    return tokens / (marks[-1] - marks[a.warmup])


def tinylm_recipe(a, tokens):
    """tokens/s of the recipe, timed as tinylm_tierswap times tierswap's."""
    marks = [time.perf_counter()]
    tinylm.train_reference(tinylm.make_model(width=a.width), a.warmup + a.steps,
                           log=lambda *_: marks.append(time.perf_counter()))
    return tokens / (marks[-1] - marks[a.warmup])


def bench_tinylm(a):
    """Each case's run beside a run of the recipe of its own, the two in turn first (a shared
    host's load moves within seconds: a case compared with a recipe run minutes away would
    measure the load as much as the case); per case the median of its per-pair ratios."""
    torch.set_num_threads(a.threads)
    tokens = a.steps * sum(x.numel() for x, _ in tinylm.batches(0))
    cases = {c: TINYLM_CASES[c] for c in a.cases}
    rates = {c: [] for c in cases}
    recipe = {c: [] for c in cases}  # the recipe's run beside each of the case's
    waits = {c: [] for c in cases}  # STEP_WAITS of each step
    for r in range(a.reps):
        for i, (case, kw) in enumerate(cases.items()):
            for side in (("tierswap", "torch") if (r + i) % 2 == 0 else ("torch", "tierswap")):
                if side == "torch":
                    recipe[case].append(tinylm_recipe(a, tokens))
                else:
                    rates[case].append(tinylm_tierswap(a, kw, tokens, waits[case]))
    out = {"torch_adamw_tokens_per_s": statistics.median(sum(recipe.values(), []))}
    for c in cases:
        per = [x / t for x, t in zip(rates[c], recipe[c])]
        out[f"tierswap_{c}_tokens_per_s"] = statistics.median(rates[c])
        out[f"tierswap_{c}_over_torch_median"] = statistics.median(per)
        out[f"tierswap_{c}_over_torch_per_rep"] = per
        for name in STEP_WAITS:
            out[f"tierswap_{c}_{name}_s_median"] = statistics.median(w[name] for w in waits[c])
    out.update(steps=a.steps, warmup=a.warmup, threads=a.threads, width=a.width,
               nvme_budget=a.nvme_budget,
               params=sum(p.numel() for p in tinylm.make_model(width=a.width).parameters()),
               runs={"tierswap": rates, "torch_adamw": recipe})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("torch", "overhead", "handover", "tinylm", "kernel"))
    ap.add_argument("--params", default="256M")
    ap.add_argument("--host-budget", default="6GiB")
    ap.add_argument("--sub-group", default="8M")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--width", type=int, default=256,
                    help="tinylm: the model's width (256: 3.3M parameters; 512: 13M)")
    ap.add_argument("--nvme-budget", default="16MiB",
                    help="tinylm: the host budget of the NVMe-state cases (16MiB: the state of "
                         "width 256 is 2.4x it; 37MiB: width 512's is 4x it)")
    ap.add_argument("--block", type=int, default=1,
                    help="overhead: steps per side in turn (the C++ bench's --runs), so both "
                         "sides are timed in a process that has stepped before; kernel: steps "
                         "and kernel repetitions per side")
    ap.add_argument("--state", default="nvme", choices=("nvme", "host"),
                    help="overhead: where the state lives (host: in memory only, no NVMe I/O)")
    ap.add_argument("--memory-only", action="store_true",
                    help="torch: host state kept in memory only (persist_resident_state=False)")
    ap.add_argument("--settle", type=float, default=7,
                    help="overhead: sync and wait this many seconds before each side's block "
                         "(the C++ bench deletes its swap files at exit, and the file system "
                         "finishes that work, e.g. ext4's discards at its next 5 s commit, "
                         "while the next block runs); 0: none")
    ap.add_argument("--warmup", type=int, default=None,
                    help="overhead: untimed Python steps at the start of each block (default: "
                         "what the C++ bench takes, 1 with host state, 2 with NVMe state); "
                         "tinylm: untimed training steps before the --steps timed ones, on both "
                         "sides (default 2: the first steps' set-up is not the training's rate)")
    ap.add_argument("--cases", default=",".join(TINYLM_CASES),
                    help="tinylm: the tierswap cases to run, comma-separated (default: all: "
                         f"{', '.join(TINYLM_CASES)})")
    ap.add_argument("--pages", choices=("4k", "huge"), default="4k",
                    help="overhead, kernel: the memory of the parameters (what the step writes "
                         "its new 16-bit values into) and of their gradients: torch's allocator "
                         "(4 KiB pages where THP is `madvise`) or transparent huge pages, as the "
                         "C++ benches' own buffers (huge on both sides: equal terms)")
    ap.add_argument("--dir", default=os.environ.get("TMPDIR", "/var/tmp"))
    ap.add_argument("--cli", default=os.path.join(os.path.dirname(__file__), "..", "build",
                                                  "tierswap"))
    ap.add_argument("--tensor", default=str(TENSOR),
                    help="elements per tensor of the synthetic model (default 16Mi; bench step's "
                         "parameters have 64Mi: 67108864)")
    ap.add_argument("--cpp-grads", choices=("distinct", "shared"), default="distinct",
                    help="overhead: the C++ bench's parameters as the Python side's (--tensor "
                         "elements each, each gradient its own buffer: equal terms), or its own "
                         "layout (64Mi-element parameters sharing one gradient buffer)")
    a = ap.parse_args()
    if a.warmup is not None and a.warmup < 0:
        ap.error(f"--warmup {a.warmup}: must be >= 0")
    if a.what == "tinylm" and a.warmup is None:
        a.warmup = 2
    a.cases = a.cases.split(",")
    unknown = [c for c in a.cases if c not in TINYLM_CASES]
    if unknown:
        ap.error(f"--cases: no case {', '.join(map(repr, unknown))} (cases: "
                 f"{', '.join(TINYLM_CASES)})")
    a.tensor = tierswap.parse_count(a.tensor)
    fn = {"torch": bench_torch, "overhead": bench_overhead, "handover": bench_handover,
          "tinylm": bench_tinylm, "kernel": bench_kernel}[a.what]
    # Every swap directory lives in one temporary directory, removed at exit whatever happens.
    with tempfile.TemporaryDirectory(prefix="tierswap-bench-", dir=a.dir) as a.scratch:
        out = fn(a)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    sys.exit(main())
