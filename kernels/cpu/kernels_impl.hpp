// The kernels, written once against the vector interface of simd.hpp. Each
// kernels_<isa>.cpp includes this file and instantiates table<Isa>(); the scalar instance is the
// reference. Tails are finished with the Scalar instance of the same body, which performs the
// same operations, so a SIMD variant is bit-identical to the reference at any size or offset.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <utility>

#include "kernels/cpu/kernel_table.hpp"
#include "kernels/cpu/simd.hpp"

namespace tierswap::kernels {
namespace {

template <class V, Dtype D>
struct Mem;
template <class V>
struct Mem<V, Dtype::f32> {
  static typename V::F load(const void* p, std::size_t i) {
    return V::load(static_cast<const float*>(p) + i);
  }
  static void store(void* p, std::size_t i, typename V::F v) {
    V::store(static_cast<float*>(p) + i, v);
  }
};
template <class V>
struct Mem<V, Dtype::bf16> {
  static typename V::F load(const void* p, std::size_t i) {
    return V::load_bf16(static_cast<const std::uint16_t*>(p) + i);
  }
  static void store(void* p, std::size_t i, typename V::F v) {
    V::store_bf16(static_cast<std::uint16_t*>(p) + i, v);
  }
};
template <class V>
struct Mem<V, Dtype::f16> {
  static typename V::F load(const void* p, std::size_t i) {
    return V::load_f16(static_cast<const std::uint16_t*>(p) + i);
  }
  static void store(void* p, std::size_t i, typename V::F v) {
    V::store_f16(static_cast<std::uint16_t*>(p) + i, v);
  }
};

// A 16-bit output the kernel only writes (the new parameters' 16-bit copy): stored with the
// ISA's non-temporal store where the range is long enough (kStreamMin values), so a write-only
// stream does not first read its lines into the cache. Same bits as store().
template <class V>
concept Streams16 = requires(std::uint16_t* p, typename V::F v) {
  V::stream16(p, V::pack_bf16(v));
  V::stream_fence();
};
constexpr std::size_t kStreamMin = std::size_t{1} << 17;

template <class X, Dtype D, bool kNt>
inline void store_out(void* p, std::size_t i, typename X::F v) {
  auto* q = static_cast<std::uint16_t*>(p) + i;
  if constexpr (kNt && Streams16<X> && D == Dtype::bf16)
    X::stream16(q, X::pack_bf16(v));
  else if constexpr (kNt && Streams16<X> && D == Dtype::f16)
    X::stream16(q, X::pack_f16(v));
  else
    Mem<X, D>::store(p, i, v);
}

// Runs body.template operator()<V>(i) over full vectors, then <Scalar> over the tail.
template <class V, class Body>
inline void for_range(std::size_t b, std::size_t e, Body&& body) {
  std::size_t i = b;
  if constexpr (V::W > 1) {
    for (; i + V::W <= e; i += V::W) body.template operator()<V>(i);
  }
  for (; i < e; ++i) body.template operator()<Scalar>(i);
}

// for_range for a kernel with a 16-bit output `out` (null: none): body.template
// operator()<X, kNt>(i), kNt telling store_out to stream. When streaming, the values before the
// first vector whose output is aligned go through <Scalar> (bit-identical to the vectors).
template <class V, class Body>
inline void for_range_out(std::size_t b, std::size_t e, const void* out, Body&& body) {
  const auto addr = reinterpret_cast<std::uintptr_t>(out);
  if constexpr (Streams16<V>) {
    constexpr std::size_t kAlign = sizeof(typename V::P16);
    if (out != nullptr && e - b >= kStreamMin && addr % 2 == 0) {
      std::size_t i = b;
      for (; i < e && (addr + 2 * i) % kAlign != 0; ++i) body.template operator()<Scalar, false>(i);
      for (; i + V::W <= e; i += V::W) body.template operator()<V, true>(i);
      for (; i < e; ++i) body.template operator()<Scalar, false>(i);
      V::stream_fence();  // the stores are weakly ordered: done before the range is reported
      return;
    }
  }
  for_range<V>(b, e, [&]<class X>(std::size_t i) { body.template operator()<X, false>(i); });
}

// ---- Adam / AdamW ------------------------------------------------------------------------------
template <class V, Dtype G, Dtype M, bool kP16, Dtype P>
void adam_range(const AdamArgs& a, std::size_t b, std::size_t e) {
  const AdamScalars s = a.s;  // a copy: the stores through float* cannot alias it
  for_range_out<V>(b, e, kP16 ? a.param16 : nullptr, [&]<class X, bool kNt>(std::size_t i) {
    using F = typename X::F;
    F g = X::mul(Mem<X, G>::load(a.grad, i), X::set1(s.grad_multiplier));
    if (s.maximize) g = X::neg(g);
    F p = X::load(a.param + i);
    if (s.weight_decay != 0.0f) {
      if (s.decoupled)
        p = X::mul(p, X::set1(s.decay));
      else
        g = X::fma(p, X::set1(s.weight_decay), g);
    }
    F m = X::fma(g, X::set1(s.one_minus_beta1),
                 X::mul(Mem<X, M>::load(a.exp_avg, i), X::set1(s.beta1)));
    F v = X::fma(X::mul(X::set1(s.one_minus_beta2), g), g,
                 X::mul(Mem<X, M>::load(a.exp_avg_sq, i), X::set1(s.beta2)));
    Mem<X, M>::store(a.exp_avg, i, m);
    Mem<X, M>::store(a.exp_avg_sq, i, v);
    if constexpr (M != Dtype::f32) {  // continue with the values as stored
      m = Mem<X, M>::load(a.exp_avg, i);
      v = Mem<X, M>::load(a.exp_avg_sq, i);
    }
    if (s.amsgrad) {
      v = X::max(Mem<X, M>::load(a.max_exp_avg_sq, i), v);
      Mem<X, M>::store(a.max_exp_avg_sq, i, v);
      if constexpr (M != Dtype::f32) v = Mem<X, M>::load(a.max_exp_avg_sq, i);
    }
    const F denom = X::add(X::div(X::sqrt(v), X::set1(s.bias_correction2_sqrt)), X::set1(s.eps));
    p = X::add(p, X::div(X::mul(X::set1(s.neg_step_size), m), denom));
    X::store(a.param + i, p);
    if constexpr (kP16) store_out<X, P, kNt>(a.param16, i, p);
  });
}

// ---- Lion
// ----------------------------------------------------------------------------------------
template <class V, Dtype G, Dtype M, bool kP16, Dtype P>
void lion_range(const LionArgs& a, std::size_t b, std::size_t e) {
  const LionScalars s = a.s;  // a copy: the stores through float* cannot alias it
  for_range_out<V>(b, e, kP16 ? a.param16 : nullptr, [&]<class X, bool kNt>(std::size_t i) {
    using F = typename X::F;
    F g = X::mul(Mem<X, G>::load(a.grad, i), X::set1(s.grad_multiplier));
    if (s.maximize) g = X::neg(g);
    F p = X::load(a.param + i);
    if (s.weight_decay != 0.0f) p = X::mul(p, X::set1(s.decay));
    const F m = Mem<X, M>::load(a.exp_avg, i);
    const F c = X::add(X::mul(m, X::set1(s.beta1)), X::mul(g, X::set1(s.one_minus_beta1)));
    p = X::fma(X::sign(c), X::set1(s.neg_lr), p);
    Mem<X, M>::store(a.exp_avg, i,
                     X::fma(g, X::set1(s.one_minus_beta2), X::mul(m, X::set1(s.beta2))));
    X::store(a.param + i, p);
    if constexpr (kP16) store_out<X, P, kNt>(a.param16, i, p);
  });
}

// ---- SGD with momentum
// ---------------------------------------------------------------------------
template <class V, Dtype G, bool kP16, Dtype P>
void sgd_range(const SgdArgs& a, std::size_t b, std::size_t e) {
  const SgdScalars s = a.s;  // a copy: the stores through float* cannot alias it
  for_range_out<V>(b, e, kP16 ? a.param16 : nullptr, [&]<class X, bool kNt>(std::size_t i) {
    using F = typename X::F;
    F g = X::mul(Mem<X, G>::load(a.grad, i), X::set1(s.grad_multiplier));
    if (s.maximize) g = X::neg(g);
    F p = X::load(a.param + i);
    if (s.weight_decay != 0.0f) g = X::fma(p, X::set1(s.weight_decay), g);
    if (s.momentum != 0.0f) {
      F buf = s.first_step ? g
                           : X::fma(g, X::set1(s.one_minus_dampening),
                                    X::mul(X::load(a.momentum_buffer + i), X::set1(s.momentum)));
      X::store(a.momentum_buffer + i, buf);
      g = s.nesterov ? X::fma(buf, X::set1(s.momentum), g) : buf;
    }
    p = X::fma(g, X::set1(s.neg_lr), p);
    X::store(a.param + i, p);
    if constexpr (kP16) store_out<X, P, kNt>(a.param16, i, p);
  });
}

// ---- statistics, casts, accumulation
// -------------------------------------------------------------
template <class V, Dtype G>
typename V::H load_half(const void* p, std::size_t i) {
  if constexpr (G == Dtype::f32)
    return V::load_half(static_cast<const float*>(p) + i);
  else if constexpr (G == Dtype::bf16)
    return V::load_half_bf16(static_cast<const std::uint16_t*>(p) + i);
  else
    return V::load_half_f16(static_cast<const std::uint16_t*>(p) + i);
}

template <class V, Dtype G>
void stats_range(const void* grad, std::size_t b, std::size_t e, StatsLanes& out) {
  // b is a multiple of 64 (chunks are), so value i always goes to lane i % 64.
  Scalar::Acc acc;
  std::size_t i = b;
  if constexpr (V::W > 1) {
    typename V::Acc vacc;
    constexpr int kH = V::kHalf;
    for (; i + 64 <= e; i += 64) {
      [&]<int... K>(std::integer_sequence<int, K...>) {
        (V::acc_half(vacc, K, load_half<V, G>(grad, i + K * kH)), ...);
      }
      (std::make_integer_sequence<int, 64 / kH>{});
    }
    V::acc_finish(vacc, acc);
  }
  for (; i < e; ++i) Scalar::acc_squares(acc, i, Mem<Scalar, G>::load(grad, i));
  for (int j = 0; j < 64; ++j) out.lane[j] = acc.lane[j];
}

// The fast path for 16-bit gradients. A 16-bit value's square is exact in fp32 (<= 22 significant
// bits) unless it overflows or underflows fp32's range, so each of 64 lanes adds squares in fp32
// with one rounding per add (a "run" of kStatsRun squares), and each run is widened to fp64 and
// added to the lane's fp64 sum. Every lane flushes after values off = 511, 1023, ... of the chunk,
// and once at the end. A chunk whose sum may have overflowed or underflowed is recomputed with the
// exact path above by chunk_sums_sq(). SIMD variants keep the lanes' runs in registers and hand
// them to the scalar tail, so the order is the reference's at any size.
//
// fp16: value off feeds lane off % 64. bf16 (the training case): in each block of 128 values,
// lane j takes the pair (2j, 2j+1) as Scalar::sq_pairs_bf16 says (odd square first; squares of
// |x| < 2^-63 count as 0), which is one VDPBF16PS per 32 values where AVX512-BF16 exists.
template <Dtype G>
inline constexpr std::size_t kStatsBlock = G == Dtype::bf16 ? 128 : 64;

// S chunks of equal length are summed in lockstep, each with its own lanes (so each result is the
// one-chunk result): one core then keeps S streams of reads in flight, which a lone stream cannot
// (here one core reads about 9 GB/s from one stream and 13 from four or more).
template <class V, Dtype G, int S>
void stats16_streams(const void* grad, const std::size_t* b, std::size_t len, StatsLanes* out) {
  static_assert(G != Dtype::f32);
  constexpr std::size_t kSpan = 64 * kStatsRun;  // values between two flushes
  constexpr std::size_t kBlk = kStatsBlock<G>;
  constexpr std::size_t kAhead = 512;  // software prefetch distance, values (1 KiB)
  const auto* g16 = static_cast<const std::uint16_t*>(grad);
  float run[S][64] = {};
  double lane[S][64] = {};
  std::size_t off = 0;
  if constexpr (V::W > 1) {
    constexpr int kVecs = 64 / static_cast<int>(V::W);
    typename V::F r[S * kVecs];
#pragma GCC unroll 64
    for (int q = 0; q < S * kVecs; ++q) r[q] = V::set1(0.0f);
    for (; off + kBlk <= len; off += kBlk) {
#pragma GCC unroll 64
      for (int q = 0; q < S * kVecs; ++q) {
        const int s = q / kVecs, k = q % kVecs;
        const std::size_t i = b[s] + off;
        if constexpr (G == Dtype::bf16) {
          // Past the chunk's end too: that is the next chunk of this stream (a prefetch never
          // faults, so running past the buffer's end is harmless).
          if ((k * 2 * V::W) % 32 == 0) __builtin_prefetch(g16 + i + kAhead + k * 2 * V::W);
          if (2 * V::W > 32) __builtin_prefetch(g16 + i + kAhead + k * 2 * V::W + 32);
          V::sq_pairs_bf16(g16 + i + 2 * k * V::W, r[q]);
        } else {
          if ((k * V::W) % 32 == 0) __builtin_prefetch(g16 + i + kAhead + k * V::W);
          const auto x = Mem<V, G>::load(grad, i + k * V::W);
          r[q] = V::fma(x, x, r[q]);
        }
      }
      if ((off + kBlk) % kSpan == 0) {
#pragma GCC unroll 64
        for (int q = 0; q < S * kVecs; ++q) {
          V::widen_add(r[q], lane[q / kVecs] + (q % kVecs) * V::W);
          r[q] = V::set1(0.0f);
        }
      }
    }
#pragma GCC unroll 64
    for (int q = 0; q < S * kVecs; ++q) V::store(run[q / kVecs] + (q % kVecs) * V::W, r[q]);
  }
  for (int s = 0; s < S; ++s) {
    auto flush = [&] {
      for (int j = 0; j < 64; ++j) {
        lane[s][j] += static_cast<double>(run[s][j]);
        run[s][j] = 0.0f;
      }
    };
    if constexpr (G == Dtype::bf16) {
      for (std::size_t o = off; o < len; o += 2) {
        const std::uint16_t pair[2] = {g16[b[s] + o],
                                       o + 1 < len ? g16[b[s] + o + 1] : std::uint16_t{0}};
        Scalar::sq_pairs_bf16(pair, run[s][(o % kBlk) / 2]);
        if ((o + 2) % kSpan == 0) flush();
      }
    } else {
      for (std::size_t o = off; o < len; ++o) {
        const float x = Mem<Scalar, G>::load(grad, b[s] + o);
        run[s][o & 63] = Scalar::fma(x, x, run[s][o & 63]);
        if ((o + 1) % kSpan == 0) flush();
      }
    }
    flush();
    for (int j = 0; j < 64; ++j) out[s].lane[j] = lane[s][j];
  }
}

// STREAM triad a = b + s * c with non-temporal stores where aligned: the bandwidth probe.
template <class V>
void triad_range(float* a, const float* b, const float* c, float s, std::size_t i0, std::size_t e) {
  std::size_t i = i0;
  if constexpr (V::W > 1) {
    const auto sv = V::set1(s);
    for (; i + V::W <= e; i += V::W)
      V::stream_store(a + i, V::add(V::load(b + i), V::mul(sv, V::load(c + i))));
  }
  for (; i < e; ++i) a[i] = b[i] + s * c[i];
}

template <class V, Dtype S, Dtype D>
void cast_range(const void* src, void* dst, std::size_t b, std::size_t e) {
  for_range<V>(b, e,
               [&]<class X>(std::size_t i) { Mem<X, D>::store(dst, i, Mem<X, S>::load(src, i)); });
}

template <class V, Dtype A, Dtype G>
void accumulate_range(void* acc, const void* grad, std::size_t b, std::size_t e) {
  for_range<V>(b, e, [&]<class X>(std::size_t i) {
    Mem<X, A>::store(acc, i, X::add(Mem<X, A>::load(acc, i), Mem<X, G>::load(grad, i)));
  });
}

// ---- dtype dispatch: runtime dtypes -> one template instance per combination -------------------
template <class V>
struct Impl {
  static void adam(const AdamArgs& a, std::size_t b, std::size_t e) {
    visit_dtype(a.grad_dtype, [&](auto gt) {
      visit_moment_dtype(a.moment_dtype, [&](auto mt) {
        visit_param16(a.param16, a.param16_dtype, [&](auto has, auto pt) {
          adam_range<V, decltype(gt)::value, decltype(mt)::value, decltype(has)::value,
                     decltype(pt)::value>(a, b, e);
        });
      });
    });
  }
  static void lion(const LionArgs& a, std::size_t b, std::size_t e) {
    visit_dtype(a.grad_dtype, [&](auto gt) {
      visit_moment_dtype(a.moment_dtype, [&](auto mt) {
        visit_param16(a.param16, a.param16_dtype, [&](auto has, auto pt) {
          lion_range<V, decltype(gt)::value, decltype(mt)::value, decltype(has)::value,
                     decltype(pt)::value>(a, b, e);
        });
      });
    });
  }
  static void sgd(const SgdArgs& a, std::size_t b, std::size_t e) {
    visit_dtype(a.grad_dtype, [&](auto gt) {
      visit_param16(a.param16, a.param16_dtype, [&](auto has, auto pt) {
        sgd_range<V, decltype(gt)::value, decltype(has)::value, decltype(pt)::value>(a, b, e);
      });
    });
  }
  static void stats(const void* g, Dtype d, std::size_t b, std::size_t e, StatsLanes& out) {
    visit_dtype(d, [&](auto gd) { stats_range<V, decltype(gd)::value>(g, b, e, out); });
  }
  // How many chunks stats16 sums in lockstep: as many as 3/4 of the vector registers hold runs
  // for (AVX-512: 6 of 4 registers each; AVX2, NEON and scalar: 1).
  static constexpr int kStreams = V::W > 1 ? std::max(1, V::kRegs * 3 / 4 / (64 / int(V::W))) : 1;
  static void stats16(const void* g, Dtype d, const std::size_t* b, std::size_t len, int streams,
                      StatsLanes* out) {
    visit_dtype(d, [&](auto gd) {
      constexpr Dtype G = decltype(gd)::value;
      if constexpr (G == Dtype::f32) {
        throw std::invalid_argument("stats16: fp32 gradients take the exact path");
      } else if (streams == 1) {
        stats16_streams<V, G, 1>(g, b, len, out);
      } else if (streams == kStreams) {
        stats16_streams<V, G, kStreams>(g, b, len, out);
      } else {
        throw std::invalid_argument("stats16: unsupported stream count");
      }
    });
  }
  static void cast(const void* src, Dtype sd, void* dst, Dtype dd, std::size_t b, std::size_t e) {
    visit_dtype(sd, [&](auto s) {
      visit_dtype(dd, [&](auto d) {
        cast_range<V, decltype(s)::value, decltype(d)::value>(src, dst, b, e);
      });
    });
  }
  static void accumulate(void* acc, Dtype ad, const void* g, Dtype gd, std::size_t b,
                         std::size_t e) {
    visit_dtype(ad, [&](auto a) {
      visit_dtype(gd, [&](auto gg) {
        accumulate_range<V, decltype(a)::value, decltype(gg)::value>(acc, g, b, e);
      });
    });
  }
};

template <class V>
KernelTable make_table(CpuIsa isa) {
  KernelTable t;
  t.isa = isa;
  t.adam = &Impl<V>::adam;
  t.lion = &Impl<V>::lion;
  t.sgd = &Impl<V>::sgd;
  t.stats = &Impl<V>::stats;
  t.stats16 = &Impl<V>::stats16;
  t.stats16_streams = Impl<V>::kStreams;
  t.cast = &Impl<V>::cast;
  t.accumulate = &Impl<V>::accumulate;
  t.triad = &triad_range<V>;
  return t;
}

}  // namespace
}  // namespace tierswap::kernels
