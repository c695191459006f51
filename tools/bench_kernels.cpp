// `tierswap bench kernels`: from one run on the same buffers, a memory-bandwidth probe
// (STREAM triad), the fused bf16-gradient AdamW step, the unfused pipeline ZeRO-Offload runs
// (bf16 -> fp32 cast pass, fp32 Adam pass, fp32 -> bf16 cast pass), Lion and the gradient
// statistics pass. Repetitions alternate between the kernels; figures are medians.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tierswap/aligned_buffer.hpp"
#include "tierswap/kernels.hpp"
#include "tierswap/thread_pool.hpp"
#include "tierswap/units.hpp"
#include "tools/bench_kernels_gpu.hpp"
#include "tools/commands.hpp"
#include "tools/kernel_timing.hpp"

#include <fmt/format.h>

namespace tierswap::cli {
namespace {

struct Options {
  std::string params = "64M";
  unsigned threads = 2;
  std::string isa;
  int reps = 5;
  bool json = false;
  std::string device = "cpu";
};

// A read-only reference for the statistics pass: each thread ORs its share of `bytes` as 8
// interleaved streams of 64-byte lines (as many streams as help here). Not a kernel: a ceiling
// for one that only reads, measured on the same buffer.
std::uint64_t read_probe(const std::byte* p, std::size_t bytes, ThreadPool& pool) {
  constexpr std::size_t kStreams = 8, kLine = 64;
  const std::size_t lines = bytes / kLine;
  std::vector<std::uint64_t> out(pool.size());
  pool.parallel_for(pool.size(), 1, [&](std::size_t tb, std::size_t te) {
    for (std::size_t t = tb; t < te; ++t) {
      const std::size_t lb = lines * t / pool.size(), le = lines * (t + 1) / pool.size();
      const std::size_t per = (le - lb) / kStreams;
      std::uint64_t acc[8] = {};
      for (std::size_t i = 0; i < per; ++i)
        for (std::size_t s = 0; s < kStreams; ++s) {
          const auto* q = reinterpret_cast<const std::uint64_t*>(p + (lb + s * per + i) * kLine);
          for (int w = 0; w < 8; ++w) acc[w] |= q[w];
        }
      std::uint64_t r = 0;
      for (auto a : acc) r |= a;
      out[t] = r;
    }
  });
  std::uint64_t r = 0;
  for (auto x : out) r |= x;
  return r;
}

// The medians against the probes (ks[0] the triad, ks.back() the read probe), as text or JSON.
void report_kernels(const Options& o, std::vector<Kernel> ks, std::uint64_t n, CpuIsa isa) {
  const double probe_gbps = 12.0 * static_cast<double>(n) / median(ks[0].seconds) / 1e9;
  nlohmann::json out{{"bandwidth_probe_gbps", probe_gbps},
                     {"threads", o.threads},
                     {"params", n},
                     {"isa", std::string(to_string(isa))},
                     {"reps", o.reps},
                     {"results", nlohmann::json::array()}};
  const double read_gbps = 2.0 * static_cast<double>(n) / median(ks.back().seconds) / 1e9;
  ks.pop_back();
  out["read_probe_gbps"] = read_gbps;
  double fused_s = 0, unfused_s = 0;
  if (!o.json) {
    fmt::print(
        "tierswap bench kernels: {} params, {} threads, isa {}, median of {} alternating "
        "repetitions\n",
        n, o.threads, to_string(isa), o.reps);
    fmt::print("{:<24} {:>8} {:>10} {:>9} {:>9} {:>9}\n", "kernel", "B/param", "Gparam/s", "GB/s",
               "of probe", "ms");
  }
  for (std::size_t i = 0; i < ks.size(); ++i) {
    const auto& k = ks[i];
    const double s = median(k.seconds);
    const double gps = static_cast<double>(n) / s / 1e9;
    const double gbps = gps * k.bytes_per_param;
    if (k.name == "adamw_fused_bf16") fused_s = s;
    if (k.name == "adamw_unfused_pipeline") unfused_s = s;
    if (i > 0)
      out["results"].push_back({{"kernel", k.name},
                                {"isa", std::string(to_string(isa))},
                                {"gparams_per_s", gps},
                                {"gbps", gbps},
                                {"bytes_per_param", k.bytes_per_param},
                                {"median_seconds", s},
                                {"fraction_of_probe", gbps / probe_gbps}});
    if (k.name == "grad_stats_bf16")
      out["results"].back()["fraction_of_read_probe"] = gbps / read_gbps;
    if (!o.json)
      fmt::print("{:<24} {:>8.0f} {:>10.3f} {:>9.2f} {:>8.0f}% {:>9.2f}\n", k.name,
                 k.bytes_per_param, gps, gbps, 100.0 * gbps / probe_gbps, s * 1e3);
  }
  out["fused_speedup_over_unfused"] = unfused_s / fused_s;
  if (o.json) {
    fmt::print("{}\n", out.dump(2));
  } else {
    fmt::print("fused AdamW is {:.2f}x the unfused pipeline\n", unfused_s / fused_s);
    fmt::print("read-only probe (8 streams a thread, same gradient buffer): {:.2f} GB/s\n",
               read_gbps);
  }
}

// The buffers every kernel runs on, filled once (first touch in parallel, so pages land near the
// threads that use them), and the state the kernels' closures step.
struct Buffers {
  std::uint64_t n;
  AlignedBuffer p, m, v, g32, g16, p16;
  float* pf = reinterpret_cast<float*>(p.data());
  float* mf = reinterpret_cast<float*>(m.data());
  float* vf = reinterpret_cast<float*>(v.data());
  float* g32f = reinterpret_cast<float*>(g32.data());
  AdamConfig adam;
  LionConfig lion;
  std::int64_t step = 0;
  volatile double sink = 0;
  volatile std::uint64_t read_sink = 0;

  Buffers(std::uint64_t n_, ThreadPool& pool)
      : n(n_), p(n_ * 4), m(n_ * 4), v(n_ * 4), g32(n_ * 4), g16(n_ * 2), p16(n_ * 2) {
    adam.weight_decay = 0.01;
    auto* g16h = reinterpret_cast<std::uint16_t*>(g16.data());
    pool.parallel_for(n, 4096, [&](std::size_t b, std::size_t e) {
      std::mt19937 rng(static_cast<unsigned>(b));
      std::normal_distribution<float> d(0.0f, 1.0f);
      for (std::size_t i = b; i < e; ++i) {
        pf[i] = d(rng);
        mf[i] = 0.0f;
        vf[i] = 0.0f;
        g32f[i] = 0.0f;
        g16h[i] = float_to_bf16(0.01f * d(rng));
      }
      std::memset(p16.data() + 2 * b, 0, 2 * (e - b));
    });
  }
};

// The probe first and the read probe last (report_kernels reads them there). The probe is a
// STREAM triad g32 = m + 0.5 v (g32 is the unfused pipeline's scratch, so no optimizer state
// changes) through the same ISA and threads, with non-temporal stores, counted as STREAM counts
// it: 12 bytes per element.
std::vector<Kernel> kernel_list(Buffers& B, const CpuKernelContext& ctx, ThreadPool& pool) {
  const std::uint64_t n = B.n;
  std::vector<Kernel> ks;
  ks.push_back({"bandwidth_probe_triad",
                12.0,
                [&B, n, ctx] { stream_triad(B.g32f, B.mf, B.vf, 0.5f, n, ctx); },
                {}});
  ks.push_back({"adamw_fused_bf16",
                28.0,
                [&B, n, ctx] {
                  adam_step(B.adam, ++B.step, {B.pf, B.mf, B.vf, nullptr, Dtype::f32},
                            {B.g16.data(), Dtype::bf16, 1.0f}, {B.p16.data(), Dtype::bf16}, n, ctx);
                },
                {}});
  ks.push_back({"adamw_unfused_pipeline",
                40.0,
                [&B, n, ctx] {
                  cast(B.g16.data(), Dtype::bf16, B.g32f, Dtype::f32, n, ctx);
                  adam_step(B.adam, ++B.step, {B.pf, B.mf, B.vf, nullptr, Dtype::f32},
                            {B.g32f, Dtype::f32, 1.0f}, {}, n, ctx);
                  cast(B.pf, Dtype::f32, B.p16.data(), Dtype::bf16, n, ctx);
                },
                {}});
  ks.push_back({"lion_fused_bf16",
                20.0,
                [&B, n, ctx] {
                  lion_step(B.lion, B.pf, B.mf, Dtype::f32, {B.g16.data(), Dtype::bf16, 1.0f},
                            {B.p16.data(), Dtype::bf16}, n, ctx);
                },
                {}});
  ks.push_back(
      {"grad_stats_bf16",
       2.0,
       [&B, n, ctx] { B.sink = B.sink + grad_stats(B.g16.data(), Dtype::bf16, n, ctx).sum_sq; },
       {}});
  // Not a result row: the read-only ceiling the statistics pass is compared with (same buffer).
  ks.push_back(
      {"read_probe",
       2.0,
       [&B, &pool, n] { B.read_sink = B.read_sink | read_probe(B.g16.data(), n * 2, pool); },
       {}});
  return ks;
}

void run(const Options& o) {
  const std::uint64_t n = parse_param_count(o.params, "--params");
  if (o.threads < 1 || o.threads > 1024)
    throw std::invalid_argument(fmt::format("--threads={}: must be in 1..1024", o.threads));
  if (o.reps < 1) throw std::invalid_argument(fmt::format("--reps={}: must be >= 1", o.reps));
  if (o.device == "gpu") return run_gpu_kernels(n, o.reps, o.json);
  const CpuIsa isa = o.isa.empty() ? default_cpu_isa() : parse_isa(o.isa);
  if (!cpu_isa_supported(isa))
    throw std::invalid_argument(
        fmt::format("--isa={}: not supported on this CPU or build", to_string(isa)));
  ThreadPool pool(o.threads);
  const CpuKernelContext ctx{isa, &pool};
  Buffers buffers(n, pool);
  std::vector<Kernel> ks = kernel_list(buffers, ctx, pool);
  time_kernels(ks, o.reps);
  report_kernels(o, std::move(ks), n, isa);
}

}  // namespace

void add_bench_kernels(CLI::App& bench) {
  auto opts = std::make_shared<Options>();
  auto* k = bench.add_subcommand(
      "kernels", "Fused optimizer kernels against a bandwidth probe and the unfused pipeline");
  k->add_option("--params", opts->params, kParamsHelp)->capture_default_str();
  k->add_option("--threads", opts->threads, "Worker threads")->capture_default_str();
  k->add_option("--isa", opts->isa,
                "scalar|avx2|avx512|avx512bf16|neon|sve (default: best supported)");
  k->add_option("--reps", opts->reps, "Alternating repetitions (median reported)")
      ->capture_default_str();
  k->add_flag("--json", opts->json, "Print the figures as JSON on stdout");
  k->add_option("--device", opts->device,
                "cpu, or gpu: the CUDA kernels against a device-to-device copy, and the "
                "pinned-memory copy rates (--threads and --isa do not apply)")
      ->check(CLI::IsMember({"cpu", "gpu"}))
      ->capture_default_str();
  k->callback([opts] { run(*opts); });
}

}  // namespace tierswap::cli
