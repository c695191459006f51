// The NEON kernel table against the scalar reference, bit for bit, without the rest of the
// library: built for aarch64 and run under qemu by neon_check.sh (x86 CI machines skip it).
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/cpu/kernels_impl.hpp"
#include "tests/kernel_inputs.hpp"

using namespace tierswap;
using namespace tierswap::kernels;

namespace {

int failures = 0;

template <class T>
void expect_same(const std::vector<T>& a, const std::vector<T>& b, const char* what,
                 std::size_t n) {
  if (std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) != 0) {
    std::printf("FAIL %s n=%zu\n", what, n);
    ++failures;
  }
}

}  // namespace

int main() {
  const KernelTable ref = make_table<Scalar>(CpuIsa::scalar);
  const KernelTable neon = make_table<Neon>(CpuIsa::neon);
  for (std::size_t n : {1ul, 3ul, 7ul, 17ul, 63ul, 65ul, 4097ul, 100003ul}) {
    auto p0 = test::random_floats(n, 1, 1.0f, true);
    auto g32 = test::random_floats(n, 2, 1.0f, true);
    std::vector<std::uint16_t> g16(n);
    for (std::size_t i = 0; i < n; ++i) g16[i] = to_bf16(g32[i] * 0.1f);
    for (Dtype pd : {Dtype::bf16, Dtype::f16}) {
      for (int variant = 0; variant < 3; ++variant) {
        auto run = [&](const KernelTable& t) {
          std::vector<float> p = p0, m(n, 0.01f), v(n, 0.001f), vmax(n, 0.002f);
          std::vector<std::uint16_t> p16(n);
          AdamArgs a{};
          a.s = {0.9f,    0.999f, 0.1f, 0.001f,       1e-8f,        0.01f,       0.9999f,
                 -0.001f, 0.03f,  0.5f, variant != 1, variant == 2, variant == 1};
          a.param = p.data();
          a.exp_avg = m.data();
          a.exp_avg_sq = v.data();
          a.max_exp_avg_sq = vmax.data();
          a.moment_dtype = Dtype::f32;
          a.grad = g16.data();
          a.grad_dtype = Dtype::bf16;
          a.param16 = p16.data();
          a.param16_dtype = pd;
          for (int s = 0; s < 2; ++s) t.adam(a, 0, n);
          return std::make_pair(p, p16);
        };
        auto [pa, p16a] = run(ref);
        auto [pb, p16b] = run(neon);
        expect_same(pa, pb, "adam param", n);
        expect_same(p16a, p16b, "adam param16", n);
      }
    }
    {
      std::vector<std::uint16_t> a(n), b(n);
      ref.cast(p0.data(), Dtype::f32, a.data(), Dtype::f16, 0, n);
      neon.cast(p0.data(), Dtype::f32, b.data(), Dtype::f16, 0, n);
      expect_same(a, b, "cast f32->f16", n);
      ref.cast(p0.data(), Dtype::f32, a.data(), Dtype::bf16, 0, n);
      neon.cast(p0.data(), Dtype::f32, b.data(), Dtype::bf16, 0, n);
      expect_same(a, b, "cast f32->bf16", n);
    }
    {
      LionArgs l{};
      l.s = {1e-4f, -1e-4f, 0.9f, 0.99f, 0.1f, 0.01f, 0.1f, 0.99999f, 1.0f, false};
      std::vector<float> pa = p0, ma(n, 0.01f), pb = p0, mb(n, 0.01f);
      l.grad = g16.data();
      l.grad_dtype = Dtype::bf16;
      l.moment_dtype = Dtype::f32;
      l.param = pa.data();
      l.exp_avg = ma.data();
      ref.lion(l, 0, n);
      l.param = pb.data();
      l.exp_avg = mb.data();
      neon.lion(l, 0, n);
      expect_same(pa, pb, "lion param", n);
      expect_same(ma, mb, "lion exp_avg", n);
    }
    // Statistics: the exact lanes per chunk, and the 16-bit fast path's chunk sums (bf16 and fp16,
    // with values whose bf16 squares leave fp32's range so the exact fallback runs too).
    std::vector<std::uint16_t> g16h(n), g16s(n);
    for (std::size_t i = 0; i < n; ++i) {
      g16h[i] = to_f16(g32[i]);
      g16s[i] = to_bf16(g32[i] * (i % 3 == 0 ? 1e-30f : i % 3 == 1 ? 1.0f : 1e25f));
    }
    for (std::size_t b = 0; b < n; b += kStatsChunk) {
      const std::size_t e = std::min(n, b + kStatsChunk);
      StatsLanes x{}, y{};
      ref.stats(g16.data(), Dtype::bf16, b, e, x);
      neon.stats(g16.data(), Dtype::bf16, b, e, y);
      if (std::memcmp(x.lane, y.lane, sizeof x.lane) != 0) {
        std::printf("FAIL stats n=%zu\n", n);
        ++failures;
      }
      for (const auto* src : {&g16, &g16h, &g16s}) {
        const Dtype d = src == &g16h ? Dtype::f16 : Dtype::bf16;
        double sx = 0, sy = 0;
        chunk_sums_sq(ref, src->data(), d, &b, e - b, 1, &sx);
        chunk_sums_sq(neon, src->data(), d, &b, e - b, 1, &sy);
        if (std::memcmp(&sx, &sy, sizeof sx) != 0) {
          std::printf("FAIL stats16 %s n=%zu\n", d == Dtype::f16 ? "f16" : "bf16", n);
          ++failures;
        }
      }
    }
  }
  std::printf("%s: neon vs scalar, %d failures\n", failures ? "FAILED" : "OK", failures);
  return failures ? 1 : 0;
}
