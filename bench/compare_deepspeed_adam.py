#!/usr/bin/python3
"""tierswap's fused AdamW kernel against DeepSpeed's CPU Adam, on the same buffers in one process.

Measurement only: DeepSpeed is not a dependency of tierswap and none of its code is in this
repository. Point --deepspeed-src at a DeepSpeed source tree (its csrc/adam/cpu_adam.cpp,
cpu_adam_impl.cpp and csrc/includes), e.g. one fetched with git; the script builds DeepSpeed's op
with torch's cpp_extension as DeepSpeed's op builder does (-O3 -march=native -fopenmp
-D__AVX512__), and a small extension calling tierswap's `adam_step` (build/libtierswap.so) on
torch tensors' memory. Needs Debian's python3-torch and libtorch-dev (headers) and
/usr/bin/python3.

Cases, on 64M (--params) fp32 parameters and moments, a bf16 gradient and its fp32 copy, a bf16
parameter output; AdamW, lr 1e-3, weight decay 0.01; order rotating, --reps repetitions of 3
calls each, medians:
  tierswap fused      bf16 gradient in, bf16 parameters out (28 B/param)
  tierswap fp32       fp32 gradient in, no 16-bit output (DeepSpeed's work: 28 B/param)
  DS fp32 step        DeepSpeed's step on the fp32 gradient (28 B/param)
  DS step + downcast  ... plus p16.copy_(p) (34 B/param)
  DS pipeline         ZeRO-Offload's: upcast the bf16 gradient, step, downcast (40 B/param)
Threads: OMP_NUM_THREADS for DeepSpeed, a tierswap pool of the same size (--threads).

Usage: /usr/bin/python3 bench/compare_deepspeed_adam.py --deepspeed-src DIR [--build build]
       [--params 64M] [--reps 9] [--threads 2] [--json]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

EXTENSION = r"""
#include <torch/extension.h>
#include <tierswap/kernels.hpp>
#include <tierswap/thread_pool.hpp>
#include <memory>

static std::unique_ptr<tierswap::ThreadPool> pool;

void adamw(torch::Tensor p, torch::Tensor m, torch::Tensor v, torch::Tensor g, torch::Tensor p16,
           int64_t step, double lr, double b1, double b2, double eps, double wd, int threads) {
  if (!pool || pool->size() != static_cast<unsigned>(threads))
    pool = std::make_unique<tierswap::ThreadPool>(threads);
  tierswap::AdamConfig cfg;
  cfg.lr = lr; cfg.beta1 = b1; cfg.beta2 = b2; cfg.eps = eps; cfg.weight_decay = wd;
  tierswap::AdamState st;
  st.param = p.data_ptr<float>();
  st.exp_avg = m.data_ptr();
  st.exp_avg_sq = v.data_ptr();
  const auto gd = g.scalar_type() == torch::kFloat ? tierswap::Dtype::f32 : tierswap::Dtype::bf16;
  tierswap::GradView gv{g.data_ptr(), gd, 1.0f};
  tierswap::Param16View pv{p16.numel() ? p16.data_ptr() : nullptr, tierswap::Dtype::bf16};
  tierswap::CpuKernelContext ctx{tierswap::default_cpu_isa(), pool.get()};
  pybind11::gil_scoped_release nogil;
  tierswap::adam_step(cfg, step, st, gv, pv, static_cast<std::size_t>(p.numel()), ctx);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) { mod.def("adamw", &adamw); }
"""

BYTES = {"tierswap fused": 28, "tierswap fp32": 28, "DS fp32 step": 28, "DS step + downcast": 34,
         "DS pipeline": 40}


def build(args, workdir):
    from torch.utils.cpp_extension import load
    src = os.path.abspath(args.deepspeed_src)
    needed = [f"{src}/csrc/adam/cpu_adam.cpp", f"{src}/csrc/adam/cpu_adam_impl.cpp",
              f"{src}/csrc/includes/cpu_adam.h"]
    missing = [p for p in needed if not os.path.isfile(p)]
    if missing:
        sys.exit(f"compare_deepspeed_adam.py: --deepspeed-src {src} lacks {', '.join(missing)}")
    api = "/usr/include/torch/csrc/api/include"
    for d in ("ds", "ts"):
        os.makedirs(f"{workdir}/{d}", exist_ok=True)
    ds = load("ds_cpu_adam", needed[:2],
              extra_cflags=["-O3", "-std=c++17", "-march=native", "-fopenmp", "-D__AVX512__",
                            "-Wno-reorder"],
              extra_include_paths=[f"{src}/csrc/includes", api], extra_ldflags=["-fopenmp"],
              build_directory=f"{workdir}/ds", verbose=False)
    with open(f"{workdir}/ts_ext.cpp", "w") as f:
        f.write(EXTENSION)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    lib = os.path.abspath(args.build)
    ts = load("ts_adam", [f"{workdir}/ts_ext.cpp"], extra_cflags=["-O3", "-std=c++20"],
              extra_include_paths=[f"{repo}/include", api],
              extra_ldflags=[f"-L{lib}", "-ltierswap", f"-Wl,-rpath,{lib}"],
              build_directory=f"{workdir}/ts", verbose=False)
    return ds, ts


def cases(ds, ts, n, threads):
    import torch
    torch.manual_seed(0)
    p, m, v = torch.randn(n), torch.zeros(n), torch.zeros(n)
    g16 = (torch.randn(n) * 1e-3).to(torch.bfloat16)
    g32, p16 = g16.float(), torch.empty(n, dtype=torch.bfloat16)
    none16 = torch.empty(0, dtype=torch.bfloat16)
    lr, b1, b2, eps, wd = 1e-3, 0.9, 0.999, 1e-8, 0.01
    ds.create_adam(0, lr, b1, b2, eps, wd, True, False)
    step = [0]

    def ds_step():
        step[0] += 1
        ds.adam_update(0, step[0], lr, b1, b2, eps, wd, True, p, g32, m, v)

    def ts_step(g, out):
        step[0] += 1
        ts.adamw(p, m, v, g, out, step[0], lr, b1, b2, eps, wd, threads)

    return [("tierswap fused", lambda: ts_step(g16, p16)),
            ("tierswap fp32", lambda: ts_step(g32, none16)),
            ("DS fp32 step", ds_step),
            ("DS step + downcast", lambda: (ds_step(), p16.copy_(p))),
            ("DS pipeline", lambda: (g32.copy_(g16), ds_step(), p16.copy_(p)))]


def measure(runs, reps):
    times = {name: [] for name, _ in runs}
    for _, f in runs:
        f()  # first touch
    for r in range(reps):
        for name, f in runs[r % len(runs):] + runs[:r % len(runs)]:
            t0 = time.perf_counter()
            f(), f(), f()
            times[name].append((time.perf_counter() - t0) / 3)
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deepspeed-src", required=True, help="a DeepSpeed source tree (its csrc/)")
    ap.add_argument("--build", default="build", help="the build directory with libtierswap.so")
    ap.add_argument("--params", default="64M")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.reps < 1 or args.threads < 1:
        sys.exit("compare_deepspeed_adam.py: --reps and --threads must be >= 1")
    if not os.path.isfile(os.path.join(args.build, "libtierswap.so")):
        sys.exit(f"compare_deepspeed_adam.py: no libtierswap.so in --build {args.build}")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch
    torch.set_num_threads(args.threads)
    sys.path.insert(0, os.path.join(args.build, "python"))
    import tierswap
    try:
        n = tierswap.parse_count(args.params)
    except ValueError as e:
        sys.exit(f"compare_deepspeed_adam.py: --params: {e}")
    with tempfile.TemporaryDirectory(prefix="tierswap-dsadam-") as work:
        ds, ts = build(args, work)
        times = measure(cases(ds, ts, n, args.threads), args.reps)
    med = {c: statistics.median(t) for c, t in times.items()}
    fused = times["tierswap fused"]
    # Per-repetition ratios: the samples of one repetition ran back to back.
    ratio = {c: statistics.median(t[i] / fused[i] for i in range(len(t)))
             for c, t in times.items() if c != "tierswap fused"}
    out = {"params": n, "threads": args.threads, "reps": args.reps,
           "median_ms": {c: round(1e3 * s, 3) for c, s in med.items()},
           "gb_per_s": {c: round(BYTES[c] * n / s / 1e9, 2) for c, s in med.items()},
           "tierswap_fused_speedup": {c: round(r, 3) for c, r in ratio.items()},
           "samples_ms": {c: [round(1e3 * x, 2) for x in t] for c, t in times.items()}}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{n} parameters, {args.threads} threads, {args.reps} repetitions of 3 calls, medians")
    for c in times:
        speed = "" if c == "tierswap fused" else f"   tierswap fused: {ratio[c]:.3f}x"
        print(f"{c:20s} {BYTES[c]:2d} B/param {1e3 * med[c]:8.2f} ms "
              f"{out['gb_per_s'][c]:6.2f} GB/s{speed}")


if __name__ == "__main__":
    main()
