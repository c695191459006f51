// `tierswap bench kernels --device gpu` (bench_kernels_gpu.hpp). Every launch is followed by a
// synchronize inside the timed region, so a figure is the kernel's whole time on the device plus
// one launch and one wake-up (microseconds against the milliseconds of 64M parameters).
#include "tools/bench_kernels_gpu.hpp"

#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "tierswap/cuda_kernels.hpp"
#include "tierswap/device.hpp"
#include "tierswap/kernels.hpp"
#include "tools/kernel_timing.hpp"

#include <fmt/format.h>

namespace tierswap::cli {
namespace {

// The bench's device memory: fp32 master and moments, an fp32 gradient (the unfused pipeline's
// scratch), the bf16 gradient, the bf16 output and the statistics chunk sums.
struct GpuBuffers {
  explicit GpuBuffers(std::uint64_t n)
      : p(n * 4),
        m(n * 4),
        v(n * 4),
        g32(n * 4),
        g16(n * 2),
        p16(n * 2),
        sums((n / kGradStatsChunk + 1) * sizeof(double)) {
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> h(n);
    for (auto& x : h) x = d(rng);
    cuda::copy_to_device(p.data(), h.data(), n * 4, nullptr);
    std::vector<std::uint16_t> h16(n);
    for (auto& x : h16) x = float_to_bf16(0.01f * d(rng));
    cuda::copy_to_device(g16.data(), h16.data(), n * 2, nullptr);
    cuda::zero_on_device(m.data(), n * 4, nullptr);
    cuda::zero_on_device(v.data(), n * 4, nullptr);
    cuda::synchronize(nullptr);  // before h and h16 go
  }
  static float* f(const cuda::DeviceBuffer& b) { return static_cast<float*>(b.data()); }
  cuda::DeviceBuffer p, m, v, g32, g16, p16, sums;
};

// The kernels as bench kernels runs them on the CPU (same names, same bytes per parameter), the
// probe first: a device-to-device copy of the fp32 master (read + write, 8 B/param).
std::vector<Kernel> gpu_kernels(const GpuBuffers& b, std::uint64_t n, std::int64_t& step) {
  AdamConfig adam;
  adam.weight_decay = 0.01;
  const AdamState st{GpuBuffers::f(b.p), GpuBuffers::f(b.m), GpuBuffers::f(b.v), nullptr,
                     Dtype::f32};
  auto run = [](auto f) {
    return [f] {
      f();
      cuda::synchronize(nullptr);
    };
  };
  std::vector<Kernel> ks;
  ks.push_back({"bandwidth_probe_copy",
                8.0,
                run([&b, n] { cuda::copy_on_device(b.g32.data(), b.p.data(), n * 4, nullptr); }),
                {}});
  ks.push_back({"adamw_fused_bf16",
                28.0,
                run([&b, n, &step, adam, st] {
                  cuda::adam_step(adam, ++step, st, {b.g16.data(), Dtype::bf16, 1.0f},
                                  {b.p16.data(), Dtype::bf16}, n, nullptr);
                }),
                {}});
  ks.push_back(
      {"adamw_unfused_pipeline",
       40.0,
       run([&b, n, &step, adam, st] {
         cuda::cast(b.g16.data(), Dtype::bf16, b.g32.data(), Dtype::f32, n, nullptr);
         cuda::adam_step(adam, ++step, st, {b.g32.data(), Dtype::f32, 1.0f}, {}, n, nullptr);
         cuda::cast(b.p.data(), Dtype::f32, b.p16.data(), Dtype::bf16, n, nullptr);
       }),
       {}});
  ks.push_back({"lion_fused_bf16",
                20.0,
                run([&b, n] {
                  cuda::lion_step(LionConfig{}, GpuBuffers::f(b.p), b.m.data(), Dtype::f32,
                                  {b.g16.data(), Dtype::bf16, 1.0f}, {b.p16.data(), Dtype::bf16}, n,
                                  nullptr);
                }),
                {}});
  ks.push_back({"grad_chunk_sums_bf16",
                2.0,
                run([&b, n] {
                  cuda::grad_chunk_sums(b.g16.data(), Dtype::bf16, n,
                                        static_cast<double*>(b.sums.data()), nullptr);
                }),
                {}});
  return ks;
}

// Medians against the probe, and the pinned-memory copy rates (to and from the GPU, GB/s).
void report_gpu(const std::vector<Kernel>& ks, std::uint64_t n, int reps, bool json,
                double h2d_gbps, double d2h_gbps) {
  const double probe = ks[0].bytes_per_param * static_cast<double>(n) / median(ks[0].seconds) / 1e9;
  nlohmann::json out{{"device", device_info().name},
                     {"params", n},
                     {"reps", reps},
                     {"bandwidth_probe_gbps", probe},
                     {"results", nlohmann::json::array()}};
  out["h2d_pinned_gbps"] = h2d_gbps;
  out["d2h_pinned_gbps"] = d2h_gbps;
  if (!json)
    fmt::print(
        "tierswap bench kernels --device gpu: {} params on {}, median of {} alternating "
        "repetitions\n{:<24} {:>8} {:>10} {:>9} {:>9} {:>9}\n",
        n, device_info().name, reps, "kernel", "B/param", "Gparam/s", "GB/s", "of probe", "ms");
  for (const auto& k : ks) {
    const double s = median(k.seconds), gps = static_cast<double>(n) / s / 1e9;
    if (&k != &ks[0])
      out["results"].push_back({{"kernel", k.name},
                                {"gparams_per_s", gps},
                                {"gbps", gps * k.bytes_per_param},
                                {"bytes_per_param", k.bytes_per_param},
                                {"median_seconds", s},
                                {"fraction_of_probe", gps * k.bytes_per_param / probe}});
    if (!json)
      fmt::print("{:<24} {:>8.0f} {:>10.2f} {:>9.1f} {:>8.0f}% {:>9.3f}\n", k.name,
                 k.bytes_per_param, gps, gps * k.bytes_per_param,
                 100.0 * gps * k.bytes_per_param / probe, s * 1e3);
  }
  if (json)
    fmt::print("{}\n", out.dump(2));
  else
    fmt::print("pinned host memory across the link: {:.1f} GB/s to the GPU, {:.1f} GB/s back\n",
               h2d_gbps, d2h_gbps);
}

}  // namespace

void run_gpu_kernels(std::uint64_t n, int reps, bool json) {
  if (!cuda::available())
    throw std::runtime_error("--device gpu: no usable GPU (" + device_info().reason + ")");
  GpuBuffers b(n);
  std::int64_t step = 0;
  std::vector<Kernel> ks = gpu_kernels(b, n, step);
  time_kernels(ks, reps);
  // Best of 3 copies of 1 GiB each way, after the kernels.
  const double h2d = cuda::measure_copy_gbps(0, true, 1ull << 30, 3);
  const double d2h = cuda::measure_copy_gbps(0, false, 1ull << 30, 3);
  report_gpu(ks, n, reps, json, h2d, d2h);
}

}  // namespace tierswap::cli
