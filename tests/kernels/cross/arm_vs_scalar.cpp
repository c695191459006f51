// The AArch64 kernel tables (NEON, and the SVE instance for this CPU's vector length) against the
// scalar reference, bit for bit, without the rest of the library: built for aarch64 and run under
// qemu by arm_check.sh at several SVE vector lengths (x86 CI machines without the cross tools skip
// it). Usage: arm_vs_scalar EXPECTED_SVE_BITS (0: no SVE instance may be chosen).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cpu/kernels_impl.hpp"
#include "tests/kernels/kernel_inputs.hpp"

using namespace tierswap;
using namespace tierswap::kernels;

namespace {

int failures = 0;
const char* current = "";
char detail[128] = "";

// Bit-identical, except that two NaNs of different payload or sign count as equal: where two
// NaNs meet in one operation AArch64 returns the first operand's, and the compiler may order the
// operands of a commutative operation either way (x86 runs return the same NaN bits).
bool is_nan(const unsigned char* p, Dtype d) {
  if (d == Dtype::f32) {
    std::uint32_t u;
    std::memcpy(&u, p, 4);
    return (u & 0x7fffffffu) > 0x7f800000u;
  }
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return (h & 0x7fffu) > (d == Dtype::bf16 ? 0x7f80u : 0x7c00u);
}

template <class T>
void expect_same(const std::vector<T>& a, const std::vector<T>& b, const char* what, std::size_t n,
                 std::size_t off, Dtype d = Dtype::f32) {
  const std::size_t es = dtype_size(d);
  const auto* x = reinterpret_cast<const unsigned char*>(a.data());
  const auto* y = reinterpret_cast<const unsigned char*>(b.data());
  for (std::size_t i = 0; i + es <= a.size() * sizeof(T); i += es) {
    if (std::memcmp(x + i, y + i, es) == 0 || (is_nan(x + i, d) && is_nan(y + i, d))) continue;
    std::uint32_t u = 0, v = 0;
    std::memcpy(&u, x + i, es);
    std::memcpy(&v, y + i, es);
    std::printf("FAIL %s: %s n=%zu offset=%zu (%s) first difference at %zu: %#x vs %#x\n", current,
                what, n, off, detail, i / es, u, v);
    ++failures;
    return;
  }
}

std::vector<std::uint16_t> to16(const std::vector<float>& v, Dtype d, float scale) {
  std::vector<std::uint16_t> h(v.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    h[i] = d == Dtype::f16 ? to_f16(v[i] * scale) : to_bf16(v[i] * scale);
  return h;
}

// The inputs every check reads: buffers with specials (NaN, inf, subnormals, values beyond
// fp16's range) over [0, off + n), so start pointers are misaligned when off is odd.
struct Inputs {
  std::size_t n, off, len;
  std::vector<float> p0, g32;
  std::vector<std::uint16_t> gb, gh;
  Inputs(std::size_t n_, std::size_t off_)
      : n(n_),
        off(off_),
        len(off_ + n_),
        p0(test::random_floats(len, 1 + n_, 1.0f, true)),
        g32(test::random_floats(len, 2 + n_, 1.0f, true)),
        gb(to16(g32, Dtype::bf16, 0.1f)),
        gh(to16(g32, Dtype::f16, 0.1f)) {}
  const void* of(Dtype d) const {
    return d == Dtype::bf16  ? static_cast<const void*>(gb.data())
           : d == Dtype::f16 ? static_cast<const void*>(gh.data())
                             : static_cast<const void*>(g32.data());
  }
};

// AdamW / Adam / AMSGrad / no 16-bit output (the four variants), every moment and output dtype.
void check_adam(const KernelTable& ref, const KernelTable& t, const Inputs& in, Dtype gd) {
  const std::size_t len = in.len;
  for (Dtype md : {Dtype::f32, Dtype::bf16}) {
    for (Dtype pd : {Dtype::bf16, Dtype::f16}) {
      for (int variant = 0; variant < 4; ++variant) {
        std::snprintf(detail, sizeof detail, "grad %d moments %d param16 %d variant %d",
                      static_cast<int>(gd), static_cast<int>(md), static_cast<int>(pd), variant);
        auto run = [&](const KernelTable& k) {
          std::vector<float> p = in.p0, m32(len, 0.01f), v32(len, 0.001f), x32(len, 0.002f);
          std::vector<std::uint16_t> m16(len, to_bf16(0.01f)), v16(len, to_bf16(0.001f)),
              x16(len, to_bf16(0.002f)), p16(len);
          const bool bfm = md == Dtype::bf16;
          AdamArgs a{};
          a.s = {0.9f,    0.999f, 0.1f, 0.001f,       1e-8f,        0.01f,       0.9999f,
                 -0.001f, 0.03f,  0.5f, variant != 1, variant >= 2, variant == 1};
          a.param = p.data();
          a.exp_avg = bfm ? static_cast<void*>(m16.data()) : m32.data();
          a.exp_avg_sq = bfm ? static_cast<void*>(v16.data()) : v32.data();
          a.max_exp_avg_sq = bfm ? static_cast<void*>(x16.data()) : x32.data();
          a.moment_dtype = md;
          a.grad = in.of(gd);
          a.grad_dtype = gd;
          a.param16 = variant == 3 ? nullptr : p16.data();
          a.param16_dtype = pd;
          for (int s = 0; s < 2; ++s) k.adam(a, in.off, len);
          return std::make_tuple(p, p16, m32, v32, m16, v16);
        };
        const auto x = run(ref), y = run(t);
        const std::size_t n = in.n, off = in.off;
        expect_same(std::get<0>(x), std::get<0>(y), "adam param", n, off);
        expect_same(std::get<1>(x), std::get<1>(y), "adam param16", n, off, pd);
        expect_same(std::get<2>(x), std::get<2>(y), "adam exp_avg f32", n, off);
        expect_same(std::get<3>(x), std::get<3>(y), "adam exp_avg_sq f32", n, off);
        expect_same(std::get<4>(x), std::get<4>(y), "adam exp_avg bf16", n, off, Dtype::bf16);
        expect_same(std::get<5>(x), std::get<5>(y), "adam exp_avg_sq bf16", n, off, Dtype::bf16);
      }
    }
  }
}

// Lion (both signs) and SGD with momentum (plain and Nesterov).
void check_lion_sgd(const KernelTable& ref, const KernelTable& t, const Inputs& in, Dtype gd) {
  const std::size_t len = in.len, n = in.n, off = in.off;
  for (bool maximize : {false, true}) {
    LionArgs l{};
    l.s = {1e-4f, -1e-4f, 0.9f, 0.99f, 0.1f, 0.01f, 0.1f, 0.99999f, 1.0f, maximize};
    std::vector<float> pa = in.p0, ma(len, 0.01f), pb = in.p0, mb(len, 0.01f);
    std::vector<std::uint16_t> qa(len), qb(len);
    l.grad = in.of(gd);
    l.grad_dtype = gd;
    l.moment_dtype = Dtype::f32;
    l.param16_dtype = Dtype::bf16;
    l.param = pa.data();
    l.exp_avg = ma.data();
    l.param16 = qa.data();
    ref.lion(l, off, len);
    l.param = pb.data();
    l.exp_avg = mb.data();
    l.param16 = qb.data();
    t.lion(l, off, len);
    expect_same(pa, pb, "lion param", n, off);
    expect_same(ma, mb, "lion exp_avg", n, off);
    expect_same(qa, qb, "lion param16", n, off, Dtype::bf16);
  }
  for (bool nesterov : {false, true}) {
    SgdArgs s{};
    s.s = {0.01f, -0.01f, 0.9f, nesterov ? 1.0f : 0.9f, 0.001f, 0.5f, nesterov, false, false};
    std::vector<float> pa = in.p0, ba(len, 0.02f), pb = in.p0, bb(len, 0.02f);
    s.grad = in.of(gd);
    s.grad_dtype = gd;
    s.param16 = nullptr;
    s.param = pa.data();
    s.momentum_buffer = ba.data();
    ref.sgd(s, off, len);
    s.param = pb.data();
    s.momentum_buffer = bb.data();
    t.sgd(s, off, len);
    expect_same(pa, pb, "sgd param", n, off);
    expect_same(ba, bb, "sgd momentum", n, off);
  }
}

// Casts in every direction, and accumulation.
void check_casts(const KernelTable& ref, const KernelTable& t, const Inputs& in) {
  const std::size_t len = in.len, n = in.n, off = in.off;
  for (Dtype sd : {Dtype::f32, Dtype::bf16, Dtype::f16}) {
    const void* src = sd == Dtype::f32 ? static_cast<const void*>(in.p0.data()) : in.of(sd);
    for (Dtype dd : {Dtype::f32, Dtype::bf16, Dtype::f16}) {
      std::snprintf(detail, sizeof detail, "from %d to %d", static_cast<int>(sd),
                    static_cast<int>(dd));
      std::vector<std::uint8_t> a(len * 4, 0xab), b(len * 4, 0xab);
      ref.cast(src, sd, a.data(), dd, off, len);
      t.cast(src, sd, b.data(), dd, off, len);
      expect_same(a, b, "cast", n, off, dd);
      std::vector<float> acc32 = in.g32;
      std::vector<std::uint16_t> acc16 = to16(in.g32, dd == Dtype::f32 ? Dtype::bf16 : dd, 1.0f);
      auto acc_a32 = acc32, acc_b32 = acc32;
      auto acc_a16 = acc16, acc_b16 = acc16;
      void* aa = dd == Dtype::f32 ? static_cast<void*>(acc_a32.data()) : acc_a16.data();
      void* ab = dd == Dtype::f32 ? static_cast<void*>(acc_b32.data()) : acc_b16.data();
      ref.accumulate(aa, dd, src, sd, off, len);
      t.accumulate(ab, dd, src, sd, off, len);
      expect_same(acc_a32, acc_b32, "accumulate f32", n, off);
      expect_same(acc_a16, acc_b16, "accumulate 16-bit", n, off,
                  dd == Dtype::f32 ? Dtype::bf16 : dd);
    }
  }
}

// Statistics: the exact lanes per chunk, and the 16-bit fast path's chunk sums (bf16 and fp16,
// with values whose bf16 squares leave fp32's range so the exact fallback runs too).
void check_stats(const KernelTable& ref, const KernelTable& t, const Inputs& in) {
  const std::size_t len = in.len;
  std::vector<std::uint16_t> gs(len);
  for (std::size_t i = 0; i < len; ++i)
    gs[i] = to_bf16(in.g32[i] * (i % 3 == 0 ? 1e-30f : i % 3 == 1 ? 1.0f : 1e25f));
  for (std::size_t b = 0; b < len; b += kStatsChunk) {
    const std::size_t e = std::min(len, b + kStatsChunk);
    for (Dtype d : {Dtype::f32, Dtype::bf16, Dtype::f16}) {
      StatsLanes x{}, y{};
      ref.stats(in.of(d), d, b, e, x);
      t.stats(in.of(d), d, b, e, y);
      if (std::memcmp(x.lane, y.lane, sizeof x.lane) != 0) {
        std::printf("FAIL %s: stats lanes n=%zu\n", current, in.n);
        ++failures;
      }
    }
    for (const std::vector<std::uint16_t>* src : {&in.gb, &in.gh, &std::as_const(gs)}) {
      const Dtype d = src == &in.gh ? Dtype::f16 : Dtype::bf16;
      double sx = 0, sy = 0;
      chunk_sums_sq(ref, src->data(), d, &b, e - b, 1, &sx);
      chunk_sums_sq(t, src->data(), d, &b, e - b, 1, &sy);
      if (std::memcmp(&sx, &sy, sizeof sx) != 0) {
        std::printf("FAIL %s: stats16 %s n=%zu\n", current, d == Dtype::f16 ? "f16" : "bf16", in.n);
        ++failures;
      }
    }
  }
}

// The table's lockstep 16-bit statistics streams against one stream at a time.
void check_stats_streams(const KernelTable& ref, const KernelTable& t, const Inputs& in) {
  const int S = t.stats16_streams;
  if (S <= 1 || in.len / kStatsChunk < static_cast<std::size_t>(S)) return;
  std::size_t starts[kMaxStatsStreams];
  for (int k = 0; k < S; ++k) starts[k] = static_cast<std::size_t>(k) * kStatsChunk;
  double one[kMaxStatsStreams], many[kMaxStatsStreams];
  for (int k = 0; k < S; ++k)
    chunk_sums_sq(ref, in.gb.data(), Dtype::bf16, &starts[k], kStatsChunk, 1, &one[k]);
  chunk_sums_sq(t, in.gb.data(), Dtype::bf16, starts, kStatsChunk, S, many);
  if (std::memcmp(one, many, sizeof(double) * S) != 0) {
    std::printf("FAIL %s: stats16 with %d streams\n", current, S);
    ++failures;
  }
}

// Every kernel of `t` against `ref` over [off, off + n).
void check(const KernelTable& ref, const KernelTable& t, std::size_t n, std::size_t off) {
  const Inputs in(n, off);
  for (Dtype gd : {Dtype::bf16, Dtype::f16, Dtype::f32}) {
    check_adam(ref, t, in, gd);
    check_lion_sgd(ref, t, in, gd);
  }
  check_casts(ref, t, in);
  check_stats(ref, t, in);
  check_stats_streams(ref, t, in);
}

}  // namespace

int main(int argc, char** argv) {
  const unsigned expect_bits = argc > 1 ? static_cast<unsigned>(std::atoi(argv[1])) : 0;
  const KernelTable ref = make_table<Scalar>(CpuIsa::scalar);
  const KernelTable neon = make_table<Neon>(CpuIsa::neon);
  const unsigned vl = sve_vector_bits();
  const KernelTable* sve = sve_table_for_bits(vl);
  std::printf("SVE vector length %u bits: %s\n", vl,
              sve ? "the SVE instance for it is tested" : "no SVE instance (NEON serves)");
  if ((sve ? vl : 0u) != expect_bits) {
    std::printf("FAIL: expected an SVE instance for %u bits\n", expect_bits);
    return 1;
  }
  if (sve != nullptr && sve->isa != CpuIsa::sve) {
    std::printf("FAIL: the SVE table reports another ISA\n");
    return 1;
  }
  // NEON once, on the CPU without SVE (the runs at other vector lengths test the SVE instance).
  // 100003 values cover the lockstep statistics streams (up to 12 chunks of 8192).
  const std::size_t sizes[] = {0, 1, 3, 7, 15, 16, 17, 31, 33, 63, 65, 127, 129, 4097};
  for (const KernelTable* t : {vl == 0 ? &neon : nullptr, sve}) {
    if (t == nullptr) continue;
    current = t == &neon ? "neon" : "sve";
    for (std::size_t n : sizes)
      for (std::size_t off : {0, 1, 3}) check(ref, *t, n, off);
    check(ref, *t, 100003, 0);
  }
  std::printf("%s: AArch64 kernels vs scalar, %d failures\n", failures ? "FAILED" : "OK", failures);
  return failures ? 1 : 0;
}
