// CUDA kernels against the CPU scalar reference, bit for bit, over ragged sizes. Skips with the
// reason when no GPU is usable (always on the CI machine); runs on a GPU machine.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "tierswap/cuda_kernels.hpp"
#include "tierswap/device.hpp"
#include "tierswap/kernels.hpp"

using namespace tierswap;

namespace {

template <class T>
struct DeviceVec {
  T* d = nullptr;
  std::size_t n = 0;
  explicit DeviceVec(const std::vector<T>& h) : n(h.size()) {
    d = static_cast<T*>(cuda::device_alloc(n * sizeof(T)));
    if (n) cuda::copy_to_device(d, h.data(), n * sizeof(T), nullptr);
  }
  ~DeviceVec() { cuda::device_free(d); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    if (n) cuda::copy_to_host(h.data(), d, n * sizeof(T), nullptr);
    cuda::synchronize(nullptr);
    return h;
  }
};

std::vector<float> randoms(std::size_t n, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace

TEST(CudaKernels, BuildWithoutCudaSaysSo) {
  if (device_info().compiled_with_cuda) GTEST_SKIP() << "built with CUDA";
  EXPECT_FALSE(cuda::available());
  EXPECT_THROW(cuda::device_alloc(16), std::runtime_error);
}

TEST(CudaKernels, AdamStatsAndCastsMatchTheScalarReference) {
  if (!cuda::available()) GTEST_SKIP() << "no usable GPU: " << device_info().reason;
  for (std::size_t n : {1ul, 7ul, 17ul, 4097ul, (1ul << 20) + 3}) {
    std::vector<float> p = randoms(n, 1, 1.0f), m = randoms(n, 2, 0.01f), v(n, 0.0f);
    auto gf = randoms(n, 3, 0.1f);
    std::vector<std::uint16_t> g(n), p16(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = float_to_bf16(gf[i]);
    DeviceVec<float> dp(p), dm(m), dv(v);
    DeviceVec<std::uint16_t> dg(g), dp16(p16);
    AdamConfig c;
    c.weight_decay = 0.01;
    for (int step = 1; step <= 3; ++step) {
      adam_step(c, step, {p.data(), m.data(), v.data(), nullptr, Dtype::f32},
                {g.data(), Dtype::bf16, 0.5f}, {p16.data(), Dtype::bf16}, n, {CpuIsa::scalar});
      cuda::adam_step(c, step, {dp.d, dm.d, dv.d, nullptr, Dtype::f32}, {dg.d, Dtype::bf16, 0.5f},
                      {dp16.d, Dtype::bf16}, n, nullptr);
    }
    EXPECT_EQ(std::memcmp(dp.get().data(), p.data(), n * 4), 0) << "param n=" << n;
    EXPECT_EQ(std::memcmp(dm.get().data(), m.data(), n * 4), 0) << "exp_avg n=" << n;
    EXPECT_EQ(std::memcmp(dv.get().data(), v.data(), n * 4), 0) << "exp_avg_sq n=" << n;
    EXPECT_EQ(std::memcmp(dp16.get().data(), p16.data(), n * 2), 0) << "param16 n=" << n;

    GradStats ref = grad_stats(g.data(), Dtype::bf16, n, {CpuIsa::scalar});
    DeviceVec<double> dsum{std::vector<double>(1)};
    DeviceVec<int> dflag{std::vector<int>(1)};
    DeviceVec<char> ws{std::vector<char>(cuda::grad_stats_workspace_bytes(n))};
    cuda::grad_stats(dg.d, Dtype::bf16, n, dsum.d, dflag.d, ws.d, nullptr);
    const double got = dsum.get()[0];
    EXPECT_EQ(std::memcmp(&got, &ref.sum_sq, sizeof got), 0) << "sum_sq n=" << n;
    EXPECT_EQ(dflag.get()[0] != 0, ref.nonfinite);

    std::vector<std::uint16_t> h16(n);
    cast(p.data(), Dtype::f32, h16.data(), Dtype::f16, n, {CpuIsa::scalar});
    DeviceVec<std::uint16_t> d16{std::vector<std::uint16_t>(n)};
    cuda::cast(dp.d, Dtype::f32, d16.d, Dtype::f16, n, nullptr);
    EXPECT_EQ(d16.get(), h16) << "cast n=" << n;
  }
}

// The statistics pass's three paths: the 16-bit fast path, chunks sent to the exact path (bf16
// squares beyond fp32's range, tiny values, inf/NaN) and all-zero chunks, for bf16 and fp16.
TEST(CudaKernels, StatsFallbacksMatchTheScalarReference) {
  if (!cuda::available()) GTEST_SKIP() << "no usable GPU: " << device_info().reason;
  const std::size_t n = 5 * 8192 + 77;
  for (Dtype d : {Dtype::bf16, Dtype::f16}) {
    for (float scale : {1.0f, 1e25f, 1e-25f}) {
      auto f = randoms(n, 9, scale);
      if (d == Dtype::f16 && scale != 1.0f) continue;
      std::vector<std::uint16_t> h(n);
      for (std::size_t i = 0; i < n; ++i)
        h[i] = d == Dtype::bf16 ? float_to_bf16(f[i]) : float_to_f16(f[i]);
      for (std::size_t i = 8192; i < 2 * 8192; ++i) h[i] = 0x8000;  // an all-zero chunk
      h[3 * 8192 + 5] = d == Dtype::bf16 ? float_to_bf16(3e35f) : float_to_f16(6e4f);
      for (bool poison : {false, true}) {
        if (poison) h[4 * 8192 + 9] = 0x7fc0;  // NaN
        GradStats ref = grad_stats(h.data(), d, n, {CpuIsa::scalar});
        DeviceVec<std::uint16_t> dg{h};
        DeviceVec<double> dsum{std::vector<double>(1)};
        DeviceVec<int> dflag{std::vector<int>(1)};
        DeviceVec<char> ws{std::vector<char>(cuda::grad_stats_workspace_bytes(n))};
        cuda::grad_stats(dg.d, d, n, dsum.d, dflag.d, ws.d, nullptr);
        const double got = dsum.get()[0];
        // The chunk sums the optimizer takes of a device-resident gradient: the CPU's bit for bit
        // (a NaN chunk compared as non-finite).
        const std::size_t chunks = (n + kGradStatsChunk - 1) / kGradStatsChunk;
        std::vector<double> want(chunks);
        grad_chunk_sums(h.data(), d, n, want.data(), {CpuIsa::scalar});
        DeviceVec<double> dsums{std::vector<double>(chunks)};
        cuda::grad_chunk_sums(dg.d, d, n, dsums.d, nullptr);
        const auto sums = dsums.get();
        for (std::size_t c = 0; c < chunks; ++c) {
          if (std::isnan(want[c])) {
            EXPECT_TRUE(std::isnan(sums[c])) << "chunk " << c;
          } else {
            EXPECT_EQ(std::memcmp(&sums[c], &want[c], sizeof(double)), 0)
                << to_string(d) << " scale " << scale << " chunk " << c;
          }
        }
        if (poison) {
          EXPECT_TRUE(dflag.get()[0] != 0);
          EXPECT_TRUE(ref.nonfinite);
        } else {
          EXPECT_EQ(std::memcmp(&got, &ref.sum_sq, sizeof got), 0)
              << to_string(d) << " scale " << scale << ": " << got << " vs " << ref.sum_sq;
          EXPECT_EQ(dflag.get()[0] != 0, ref.nonfinite);
        }
      }
    }
  }
}

// The staging buffer: grows (at least doubling), keeps its memory when large enough, and is
// page-locked exactly when a GPU is usable (plain host memory here without one); a round trip
// through device memory on a GPU.
TEST(CudaKernels, PinnedBufferGrowsAndIsPageLockedWithAGpu) {
  cuda::PinnedBuffer b;
  EXPECT_EQ(b.size(), 0u);
  std::byte* p = b.reserve(10000);
  ASSERT_NE(p, nullptr);
  EXPECT_GE(b.size(), 10000u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 4096, 0u);
  std::memset(p, 0x5a, 10000);
  EXPECT_EQ(b.reserve(5000), p) << "large enough: the same memory";
  EXPECT_EQ(b.reserve(b.size()), p);
  const std::size_t before = b.size();
  b.reserve(before + 1);
  EXPECT_GE(b.size(), 2 * before) << "grows by at least doubling";
  EXPECT_EQ(b.registered(), cuda::available());
  if (!cuda::available()) return;
  std::vector<std::uint8_t> h(b.size());
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<std::uint8_t>(i * 7);
  DeviceVec<std::uint8_t> d(h);
  cuda::copy_to_host(b.data(), d.d, h.size(), nullptr);
  cuda::synchronize(nullptr);
  EXPECT_EQ(std::memcmp(b.data(), h.data(), h.size()), 0);
}
