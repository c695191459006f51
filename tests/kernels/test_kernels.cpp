// CPU kernels: conversions, every SIMD variant against the scalar reference (bit for bit, ragged
// sizes, misaligned starts, special values), thread-count invariance, and torch semantics from
// fixtures made by tests/gen_torch_reference.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "kernel_inputs.hpp"
#include "tierswap/kernels.hpp"
#include "tierswap/thread_pool.hpp"

using namespace tierswap;
using tierswap::test::random_floats;

namespace {

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

const std::size_t kSizes[] = {0, 1, 7, 15, 16, 17, 31, 33, 4097, (1u << 20) + 3};

std::vector<CpuIsa> simd_isas() {
  std::vector<CpuIsa> v;
  for (CpuIsa i : {CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512bf16, CpuIsa::neon, CpuIsa::sve})
    if (cpu_isa_supported(i)) v.push_back(i);
  return v;
}

std::vector<CpuIsa> all_isas() {
  std::vector<CpuIsa> v = simd_isas();
  v.insert(v.begin(), CpuIsa::scalar);
  return v;
}

std::vector<std::uint16_t> to16(const std::vector<float>& v, Dtype d) {
  std::vector<std::uint16_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    out[i] = d == Dtype::bf16 ? float_to_bf16(v[i]) : float_to_f16(v[i]);
  return out;
}

template <class T>
::testing::AssertionResult same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0)
      return ::testing::AssertionFailure() << "first difference at element " << i;
  return ::testing::AssertionSuccess();
}

}  // namespace

// ---- conversions
// ---------------------------------------------------------------------------------

TEST(Conversions, Bf16RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(from_bits(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(float_to_bf16(from_bits(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(float_to_bf16(from_bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(float_to_bf16(from_bits(0x7f7fffffu)), 0x7f80);       // FLT_MAX rounds to inf
  const std::uint16_t n = float_to_bf16(from_bits(0x7f800001u));  // signalling NaN
  EXPECT_TRUE(std::isnan(bf16_to_float(n)));
  EXPECT_TRUE(n & 0x40) << "quieted";
  EXPECT_EQ(float_to_bf16(from_bits(0xffc00000u)) & 0x8000, 0x8000) << "sign kept";
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_float(static_cast<std::uint16_t>(h));
    if (!std::isnan(f)) ASSERT_EQ(float_to_bf16(f), h) << h;
  }
}

TEST(Conversions, F16RoundTripsEveryValueAndRoundsToNearestEven) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_float(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(f))));
      continue;
    }
    ASSERT_EQ(float_to_f16(f), h) << h;
  }
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);            // the tie rounds to infinity
  EXPECT_EQ(float_to_f16(1.0f + 1.0f / 2048), 0x3c00);  // tie to even
  EXPECT_EQ(float_to_f16(1.0f + 3.0f / 2048), 0x3c02);
  EXPECT_EQ(float_to_f16(5.9604644775390625e-08f), 0x0001);   // smallest subnormal
  EXPECT_EQ(float_to_f16(2.98023223876953125e-08f), 0x0000);  // half of it: tie to even (0)
  EXPECT_EQ(float_to_f16(1e-10f), 0x0000);
  EXPECT_EQ(float_to_f16(-1e-10f), 0x8000);
}

// ---- every SIMD variant against the scalar reference
// ---------------------------------------------

class SimdVsScalar : public ::testing::TestWithParam<CpuIsa> {};

TEST_P(SimdVsScalar, Casts) {
  const CpuIsa isa = GetParam();
  for (std::size_t n : kSizes) {
    for (std::size_t off : {0, 1, 3}) {
      auto f = random_floats(n + off, n * 7 + off, 100.0f, true);
      for (Dtype d : {Dtype::bf16, Dtype::f16}) {
        std::vector<std::uint16_t> ref(n + off), simd(n + off);
        cast(f.data() + off, Dtype::f32, ref.data() + off, d, n, {CpuIsa::scalar});
        cast(f.data() + off, Dtype::f32, simd.data() + off, d, n, {isa});
        ASSERT_TRUE(same_bits(ref, simd))
            << "f32->" << to_string(d) << " n=" << n << " off=" << off;
        std::vector<float> up_ref(n + off), up_simd(n + off);
        cast(ref.data() + off, d, up_ref.data() + off, Dtype::f32, n, {CpuIsa::scalar});
        cast(ref.data() + off, d, up_simd.data() + off, Dtype::f32, n, {isa});
        ASSERT_TRUE(same_bits(up_ref, up_simd)) << to_string(d) << "->f32 n=" << n;
      }
    }
  }
}

TEST_P(SimdVsScalar, AdamAllVariants) {
  const CpuIsa isa = GetParam();
  for (std::size_t n : kSizes) {
    for (Dtype gd : {Dtype::bf16, Dtype::f16, Dtype::f32}) {
      for (Dtype md : {Dtype::f32, Dtype::bf16}) {
        for (int variant = 0; variant < 4; ++variant) {
          AdamConfig c;
          c.lr = 1e-2f;
          c.weight_decay = variant == 3 ? 0.0f : 0.05f;
          c.decoupled = variant != 1;
          c.amsgrad = variant == 2;
          c.maximize = variant == 3;
          const std::size_t off = (n + variant) % 3;  // misaligned starts
          const bool specials = variant == 0;
          auto p0 = random_floats(n + off, n + 1, 1.0f, specials);
          auto g32 = random_floats(n + off, n + 2, 0.1f, specials);
          auto m0 = random_floats(n + off, n + 3, 0.01f, false);
          std::vector<float> v0(n + off);
          for (std::size_t i = 0; i < v0.size(); ++i) v0[i] = std::fabs(m0[i]) * 0.1f;
          struct Run {
            std::vector<float> p, m32, v32, vmax32;
            std::vector<std::uint16_t> m16, v16, vmax16, g16, p16;
          };
          auto run = [&](CpuIsa which) {
            Run r;
            r.p = p0;
            r.m32 = m0;
            r.v32 = v0;
            r.vmax32 = v0;
            r.m16 = to16(m0, Dtype::bf16);
            r.v16 = to16(v0, Dtype::bf16);
            r.vmax16 = r.v16;
            r.g16 = to16(g32, gd == Dtype::f32 ? Dtype::bf16 : gd);
            r.p16.assign(n + off, 0);
            AdamState st;
            st.param = r.p.data() + off;
            const bool b = md == Dtype::bf16;
            st.exp_avg = b ? static_cast<void*>(r.m16.data() + off) : r.m32.data() + off;
            st.exp_avg_sq = b ? static_cast<void*>(r.v16.data() + off) : r.v32.data() + off;
            st.max_exp_avg_sq =
                b ? static_cast<void*>(r.vmax16.data() + off) : r.vmax32.data() + off;
            st.moment_dtype = md;
            GradView g{gd == Dtype::f32 ? static_cast<const void*>(g32.data() + off)
                                        : static_cast<const void*>(r.g16.data() + off),
                       gd, 0.5f};
            Param16View p16{r.p16.data() + off, variant % 2 ? Dtype::f16 : Dtype::bf16};
            for (int step = 1; step <= 3; ++step) adam_step(c, step, st, g, p16, n, {which});
            return r;
          };
          Run a = run(CpuIsa::scalar), b = run(isa);
          std::string what = "n=" + std::to_string(n) + " grad=" + std::string(to_string(gd)) +
                             " moments=" + std::string(to_string(md)) +
                             " variant=" + std::to_string(variant);
          ASSERT_TRUE(same_bits(a.p, b.p)) << what;
          ASSERT_TRUE(same_bits(a.p16, b.p16)) << what;
          ASSERT_TRUE(same_bits(a.m32, b.m32)) << what;
          ASSERT_TRUE(same_bits(a.v32, b.v32)) << what;
          ASSERT_TRUE(same_bits(a.vmax32, b.vmax32)) << what;
          ASSERT_TRUE(same_bits(a.m16, b.m16)) << what;
          ASSERT_TRUE(same_bits(a.v16, b.v16)) << what;
        }
      }
    }
  }
}

TEST_P(SimdVsScalar, LionAndSgd) {
  const CpuIsa isa = GetParam();
  for (std::size_t n : kSizes) {
    const std::size_t off = n % 3;
    auto p0 = random_floats(n + off, n + 11, 1.0f, true);
    auto g32 = random_floats(n + off, n + 12, 0.1f, true);
    auto g16 = to16(g32, Dtype::bf16);
    for (Dtype md : {Dtype::f32, Dtype::bf16}) {
      auto lion = [&](CpuIsa which) {
        std::vector<float> p = p0, m(n + off, 0.01f);
        std::vector<std::uint16_t> m16(n + off, float_to_bf16(0.01f)), p16(n + off);
        void* mp = md == Dtype::f32 ? static_cast<void*>(m.data() + off) : m16.data() + off;
        LionConfig c;
        c.weight_decay = 0.1f;
        for (int s = 0; s < 3; ++s)
          lion_step(c, p.data() + off, mp, md, {g16.data() + off, Dtype::bf16, 2.0f},
                    {p16.data() + off, Dtype::bf16}, n, {which});
        return std::make_tuple(p, m, m16, p16);
      };
      auto [pa, ma, m16a, p16a] = lion(CpuIsa::scalar);
      auto [pb, mb, m16b, p16b] = lion(isa);
      ASSERT_TRUE(same_bits(pa, pb)) << "lion n=" << n;
      ASSERT_TRUE(same_bits(ma, mb));
      ASSERT_TRUE(same_bits(m16a, m16b));
      ASSERT_TRUE(same_bits(p16a, p16b));
    }
    for (bool nesterov : {false, true}) {
      auto sgd = [&](CpuIsa which) {
        std::vector<float> p = p0, buf(n + off);
        std::vector<std::uint16_t> p16(n + off);
        SgdConfig c;
        c.nesterov = nesterov;
        c.weight_decay = 0.01f;
        for (int s = 0; s < 3; ++s)
          sgd_step(c, s == 0, p.data() + off, buf.data() + off,
                   {g32.data() + off, Dtype::f32, 1.0f}, {p16.data() + off, Dtype::f16}, n,
                   {which});
        return std::make_tuple(p, buf, p16);
      };
      auto [pa, ba, p16a] = sgd(CpuIsa::scalar);
      auto [pb, bb, p16b] = sgd(isa);
      ASSERT_TRUE(same_bits(pa, pb)) << "sgd n=" << n;
      ASSERT_TRUE(same_bits(ba, bb));
      ASSERT_TRUE(same_bits(p16a, p16b));
    }
  }
}

TEST_P(SimdVsScalar, StatsAndAccumulate) {
  const CpuIsa isa = GetParam();
  for (std::size_t n : kSizes) {
    for (Dtype d : {Dtype::bf16, Dtype::f16, Dtype::f32}) {
      const std::size_t off = n % 5;
      auto f = random_floats(n + off, n + 21, 3.0f, false);
      auto h = to16(f, d == Dtype::f32 ? Dtype::bf16 : d);
      const void* g = d == Dtype::f32 ? static_cast<const void*>(f.data() + off)
                                      : static_cast<const void*>(h.data() + off);
      GradStats a = grad_stats(g, d, n, {CpuIsa::scalar});
      GradStats b = grad_stats(g, d, n, {isa});
      ASSERT_EQ(std::memcmp(&a.sum_sq, &b.sum_sq, sizeof(double)), 0)
          << "n=" << n << " " << to_string(d) << ": " << a.sum_sq << " vs " << b.sum_sq;
      ASSERT_EQ(a.nonfinite, b.nonfinite);
      for (Dtype ad : {Dtype::f32, Dtype::bf16, Dtype::f16}) {
        auto accf = random_floats(n + off, n + 22, 1.0f, false);
        auto acc16 = to16(accf, ad == Dtype::f32 ? Dtype::bf16 : ad);
        auto acc32 = accf;
        auto acc16b = acc16;
        auto acc32b = acc32;
        void* x = ad == Dtype::f32 ? static_cast<void*>(acc32.data() + off) : acc16.data() + off;
        void* y = ad == Dtype::f32 ? static_cast<void*>(acc32b.data() + off) : acc16b.data() + off;
        accumulate(x, ad, g, d, n, {CpuIsa::scalar});
        accumulate(y, ad, g, d, n, {isa});
        ASSERT_TRUE(same_bits(acc32, acc32b));
        ASSERT_TRUE(same_bits(acc16, acc16b));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, SimdVsScalar, ::testing::ValuesIn(simd_isas()),
                         [](const auto& info) { return std::string(to_string(info.param)); });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(SimdVsScalar);

// ---- statistics semantics and thread-count invariance -------------------------------------------

TEST(GradStats, MatchesAnExactSumAndFlagsNonFinite) {
  const std::size_t n = 100003;
  auto f = random_floats(n, 5, 2.0f, false);
  auto h = to16(f, Dtype::bf16);
  long double exact = 0;
  for (auto x : h) {
    long double v = bf16_to_float(x);
    exact += v * v;
  }
  GradStats s = grad_stats(h.data(), Dtype::bf16, n);
  // The 16-bit fast path rounds once per fp32 add of a run of kStatsRun squares.
  EXPECT_NEAR(s.sum_sq, static_cast<double>(exact), 1e-6 * static_cast<double>(exact));
  EXPECT_FALSE(s.nonfinite);
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    auto hb = h;
    hb[n - 2] = float_to_bf16(bad);
    EXPECT_TRUE(grad_stats(hb.data(), Dtype::bf16, n).nonfinite);
  }
  auto hf = to16(f, Dtype::f16);
  hf[7] = float_to_f16(1e6f);  // overflows fp16 to inf
  EXPECT_TRUE(grad_stats(hf.data(), Dtype::f16, n).nonfinite);
}

// Values whose squares leave fp32's range (bf16 only: |x| > 2^64 overflows, |x| < 2^-63 lands in
// fp32 subnormals) send their chunk to the exact fp64 path; zeros stay on the fast path.
TEST(GradStats, ChunksBeyondFp32RangeAreSummedExactly) {
  const std::size_t n = 3 * 8192 + 100;
  auto exact_sum = [](const std::vector<std::uint16_t>& h) {
    long double e = 0;
    for (auto x : h) {
      const long double v = bf16_to_float(x);
      e += v * v;
    }
    return static_cast<double>(e);
  };
  for (float scale : {1e30f, 1e25f, 1e-25f, 1e-35f, 1e-38f}) {
    auto f = random_floats(n, 17, 1.0f, false);
    for (auto& x : f) x *= scale;
    auto h = to16(f, Dtype::bf16);
    const double e = exact_sum(h);
    ASSERT_GT(e, 0.0);
    const GradStats ref = grad_stats(h.data(), Dtype::bf16, n, {CpuIsa::scalar});
    for (CpuIsa isa : all_isas()) {
      const GradStats s = grad_stats(h.data(), Dtype::bf16, n, {isa});
      EXPECT_EQ(std::memcmp(&s.sum_sq, &ref.sum_sq, sizeof(double)), 0) << to_string(isa);
      EXPECT_FALSE(s.nonfinite) << scale;
      // Exact squares, summed in fp64 over 64 lanes: far tighter than the fast path's bound.
      EXPECT_NEAR(s.sum_sq, e, 1e-13 * e) << "scale " << scale << " " << to_string(isa);
    }
  }
  // One huge value in an otherwise ordinary chunk; an all-zero chunk (+0 and -0); a chunk of
  // values too small for fp32 squares between ordinary chunks.
  auto h = to16(random_floats(n, 18, 1.0f, false), Dtype::bf16);
  h[8192 + 5] = float_to_bf16(3e35f);
  for (std::size_t i = 0; i < 8192; ++i) h[i] = (i & 1) ? 0x8000 : 0;
  for (std::size_t i = 2 * 8192; i < 3 * 8192; ++i) h[i] = float_to_bf16(1e-30f);
  const double e = exact_sum(h);
  const GradStats ref = grad_stats(h.data(), Dtype::bf16, n, {CpuIsa::scalar});
  for (CpuIsa isa : all_isas()) {
    const GradStats s = grad_stats(h.data(), Dtype::bf16, n, {isa});
    EXPECT_EQ(std::memcmp(&s.sum_sq, &ref.sum_sq, sizeof(double)), 0) << to_string(isa);
    EXPECT_FALSE(s.nonfinite);
    EXPECT_NEAR(s.sum_sq, e, 1e-6 * e) << to_string(isa);
  }
  std::vector<std::uint16_t> zeros(n, 0x8000);
  EXPECT_EQ(grad_stats(zeros.data(), Dtype::bf16, n).sum_sq, 0.0);
  // fp16: squares of the largest and the smallest values stay in fp32's range.
  std::vector<std::uint16_t> hf(n, 0x7bff);  // 65504
  hf[3] = 0x0001;                            // 2^-24
  const GradStats sf = grad_stats(hf.data(), Dtype::f16, n);
  EXPECT_FALSE(sf.nonfinite);
  EXPECT_NEAR(sf.sum_sq, (n - 1) * 65504.0 * 65504.0, 1e-6 * (n - 1) * 65504.0 * 65504.0);
}

TEST(ThreadCount, ResultsAreBitIdenticalForAnyPoolSize) {
  const std::size_t n = (1u << 21) + 77;
  auto p0 = random_floats(n, 1, 1.0f, false);
  auto g = to16(random_floats(n, 2, 0.1f, false), Dtype::bf16);
  std::vector<float> ref_p;
  std::vector<std::uint16_t> ref_p16;
  double ref_sum = 0;
  for (unsigned threads : {1u, 2u, 3u, 4u}) {
    ThreadPool pool(threads);
    CpuKernelContext ctx;
    ctx.pool = &pool;
    std::vector<float> p = p0, m(n), v(n);
    // The 16-bit output one element past an aligned start: each thread's range streams its
    // stores (non-temporal) after a scalar head up to the first aligned vector.
    std::vector<std::uint16_t> p16(n + 1);
    AdamConfig c;
    c.weight_decay = 0.01f;
    for (int s = 1; s <= 2; ++s)
      adam_step(c, s, {p.data(), m.data(), v.data(), nullptr, Dtype::f32},
                {g.data(), Dtype::bf16, 1.0f}, {p16.data() + 1, Dtype::bf16}, n, ctx);
    double sum = grad_stats(g.data(), Dtype::bf16, n, ctx).sum_sq;
    if (threads == 1) {
      ref_p = p;
      ref_p16 = p16;
      ref_sum = sum;
    } else {
      EXPECT_TRUE(same_bits(ref_p, p)) << threads << " threads";
      EXPECT_TRUE(same_bits(ref_p16, p16)) << threads << " threads";
      EXPECT_EQ(std::memcmp(&ref_sum, &sum, sizeof sum), 0) << threads << " threads";
    }
  }
}

TEST(KernelApi, RejectsMisuse) {
  float p = 0, m = 0, v = 0;
  std::uint16_t g = 0;
  AdamConfig c;
  EXPECT_THROW(adam_step(c, 0, {&p, &m, &v}, {&g}, {}, 1), std::invalid_argument);  // step 0
  EXPECT_THROW(adam_step(c, 1, {&p, nullptr, &v}, {&g}, {}, 1), std::invalid_argument);
  c.amsgrad = true;
  EXPECT_THROW(adam_step(c, 1, {&p, &m, &v}, {&g}, {}, 1), std::invalid_argument);
  c = {};
  c.beta1 = 1.0f;
  EXPECT_THROW(adam_step(c, 1, {&p, &m, &v}, {&g}, {}, 1), std::invalid_argument);
  c = {};
  EXPECT_THROW(adam_step(c, 1, {&p, &m, &v}, {&g}, {&g, Dtype::f32}, 1), std::invalid_argument);
  EXPECT_THROW(adam_step(c, 1, {&p, &m, &v, nullptr, Dtype::f16}, {&g}, {}, 1),
               std::invalid_argument);
  EXPECT_NO_THROW(adam_step(c, 1, {nullptr, nullptr, nullptr}, {nullptr}, {}, 0));  // n = 0
  SgdConfig s;
  s.nesterov = true;
  s.dampening = 0.5f;
  EXPECT_THROW(sgd_step(s, true, &p, &m, {&g}, {}, 1), std::invalid_argument);
  EXPECT_THROW(parse_isa("sse9"), std::invalid_argument);
  EXPECT_THROW(parse_dtype("int8"), std::invalid_argument);
  for (CpuIsa isa : {CpuIsa::neon, CpuIsa::sve}) {
    EXPECT_EQ(parse_isa(to_string(isa)), isa);
    if (cpu_isa_supported(isa)) continue;
    CpuKernelContext ctx;
    ctx.isa = isa;
    EXPECT_THROW(cast(&p, Dtype::f32, &g, Dtype::bf16, 1, ctx), std::invalid_argument);
  }
}

// ---- torch semantics
// -----------------------------------------------------------------------------

TEST(TorchReference, MatchesTorchOptimBitForBitAfter12Steps) {
  std::ifstream in(std::string(TIERSWAP_TEST_FIXTURES) + "/torch_optim_reference.json");
  ASSERT_TRUE(in) << "fixture missing: run tests/gen_torch_reference.py";
  nlohmann::json j = nlohmann::json::parse(in);
  const std::size_t n = j["n"];
  auto f32 = [](const nlohmann::json& a) {
    std::vector<float> v;
    for (auto& x : a) v.push_back(from_bits(x.get<std::uint32_t>()));
    return v;
  };
  int cases = 0;
  for (CpuIsa isa : {CpuIsa::scalar, default_cpu_isa()}) {
    for (auto& cs : j["cases"]) {
      const std::string kind = cs["kind"];
      const auto& hp = cs["hp"];
      const float mult = cs["multiplier"];
      std::vector<float> p = f32(cs["param0"]), m(n, 0), v(n, 0), vmax(n, 0), buf(n, 0);
      std::vector<std::uint16_t> p16(n);
      int step = 0;
      for (auto& gj : cs["grads_bf16"]) {
        ++step;
        std::vector<std::uint16_t> g;
        for (auto& x : gj) g.push_back(static_cast<std::uint16_t>(x.get<std::uint32_t>()));
        GradView gv{g.data(), Dtype::bf16, mult};
        if (kind == "adamw" || kind == "adam") {
          AdamConfig c;
          c.lr = hp["lr"];
          c.beta1 = hp["betas"][0];
          c.beta2 = hp["betas"][1];
          c.eps = hp["eps"];
          c.weight_decay = hp["weight_decay"];
          c.decoupled = kind == "adamw";
          c.amsgrad = hp.value("amsgrad", false);
          c.maximize = hp.value("maximize", false);
          adam_step(c, step, {p.data(), m.data(), v.data(), vmax.data(), Dtype::f32}, gv,
                    {p16.data(), Dtype::bf16}, n, {isa});
        } else if (kind == "sgd") {
          SgdConfig c;
          c.lr = hp["lr"];
          c.momentum = hp.value("momentum", 0.0f);
          c.dampening = hp.value("dampening", 0.0f);
          c.weight_decay = hp.value("weight_decay", 0.0f);
          c.nesterov = hp.value("nesterov", false);
          c.maximize = hp.value("maximize", false);
          sgd_step(c, step == 1, p.data(), buf.data(), gv, {}, n, {isa});
        } else {
          LionConfig c;
          c.lr = hp["lr"];
          c.beta1 = hp["betas"][0];
          c.beta2 = hp["betas"][1];
          c.weight_decay = hp["weight_decay"];
          lion_step(c, p.data(), m.data(), Dtype::f32, gv, {}, n, {isa});
        }
      }
      // Every kernel evaluates torch's operations with torch's roundings (Debian's torch 1.13:
      // its vectorized add with alpha and addcmul are FMAs): bit for bit, tails included (263
      // values: 7 beyond the last 8- or 16-wide vector). Lion has no torch class; its reference
      // is the paper's formula in torch fp32 ops.
      auto expect_equal = [&](const std::vector<float>& got, const nlohmann::json& want,
                              const char* what) {
        const auto w = f32(want);
        std::size_t differ = 0, first = n;
        for (std::size_t i = 0; i < n; ++i)
          if (std::memcmp(&got[i], &w[i], sizeof(float)) != 0) {
            ++differ;
            first = std::min(first, i);
          }
        EXPECT_EQ(differ, 0u) << kind << " " << hp.dump() << " " << what << " isa "
                              << to_string(isa) << ": first at " << first << ": " << got[first]
                              << " vs torch's " << w[first];
      };
      const auto& e = cs["expected"];
      expect_equal(p, e["param"], "param");
      if (e.contains("exp_avg")) expect_equal(m, e["exp_avg"], "exp_avg");
      if (e.contains("exp_avg_sq")) expect_equal(v, e["exp_avg_sq"], "exp_avg_sq");
      if (e.contains("max_exp_avg_sq")) expect_equal(vmax, e["max_exp_avg_sq"], "max_exp_avg_sq");
      if (e.contains("momentum_buffer")) expect_equal(buf, e["momentum_buffer"], "momentum");
      for (std::size_t i = 0; i < n && kind.starts_with("adam"); ++i)
        ASSERT_EQ(p16[i], float_to_bf16(p[i])) << "the 16-bit copy is the rounded master";
      ++cases;
    }
  }
  EXPECT_GE(cases, 22);
}
