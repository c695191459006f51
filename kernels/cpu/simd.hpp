// Vector wrappers, one per instruction set, with the same operations as the scalar one. A kernel
// is written once against this interface; its scalar instance is the reference, and each SIMD
// instance performs the same IEEE operations in the same order, so results are bit-identical.
//
// Everything here has internal linkage: each kernels_<isa>.cpp is compiled with its own -m flags
// and must not share an inline function with another (the linker could pick the AVX-512 copy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif
#if defined(__ARM_FEATURE_SVE) && defined(__ARM_FEATURE_SVE_BITS) && __ARM_FEATURE_SVE_BITS > 0
#include <arm_sve.h>
#define TIERSWAP_SIMD_SVE 1
#endif

#include "kernels/cpu/convert.hpp"

namespace tierswap::kernels {
namespace {

struct Scalar {
  static constexpr std::size_t W = 1;
  static constexpr int kRegs = 16;
  using F = float;
  static F load(const float* p) { return *p; }
  static void store(float* p, F v) { *p = v; }
  static F load_bf16(const std::uint16_t* p) { return from_bf16(*p); }
  static void store_bf16(std::uint16_t* p, F v) { *p = to_bf16(v); }
  static F load_f16(const std::uint16_t* p) { return from_f16(*p); }
  static void store_f16(std::uint16_t* p, F v) { *p = to_f16(v); }
  static F set1(float x) { return x; }
  static F add(F a, F b) { return a + b; }
  static F sub(F a, F b) { return a - b; }
  static F mul(F a, F b) { return a * b; }
  static F div(F a, F b) { return a / b; }
  static F sqrt(F a) { return __builtin_sqrtf(a); }
  // a * b + c with one rounding (correctly rounded in every variant).
  static F fma(F a, F b, F c) { return __builtin_fmaf(a, b, c); }
  // As MAXPS: the second operand when either is NaN or they are equal.
  static F max(F a, F b) { return a > b ? a : b; }
  static F neg(F a) { return float_of(bits_of(a) ^ 0x80000000u); }
  // -1, 0 or +1; NaN stays NaN (as torch.sign).
  static F sign(F a) { return a != a ? a : a > 0 ? 1.0f : a < 0 ? -1.0f : 0.0f; }

  // Exact statistics (fp32 gradients, and the 16-bit fallback of kernels_impl.hpp's
  // stats16_streams): value i of a chunk adds its (exact) square to fp64 lane i % 64, in order. 64
  // independent chains keep SIMD variants off the add latency while the order stays one and the
  // same for every variant. (A non-finite value makes its chunk's sum non-finite: squares are
  // >= 0 and even (fp32 max)^2 ~ 1.2e77 cannot overflow an fp64 sum, so no per-value flag.)
  struct Acc {
    double lane[64] = {};
  };
  static void acc_squares(Acc& acc, std::size_t i, F x) {
    const double d = x;
    acc.lane[i & 63] += d * d;
  }
  // The 16-bit statistics path: lanes[j] += (double)x[j] for the W lanes of x (exact widening).
  static void widen_add(F x, double* lanes) { lanes[0] += static_cast<double>(x); }
  // bf16 statistics, the semantics of AVX512-BF16's VDPBF16PS with a = b = 2W raw bf16 values:
  // lane j: acc = (acc + sq(x[2j+1])) + sq(x[2j]), one rounding per add, where sq(x) is x * x
  // (exact in fp32) but 0 when |x| < 2^-63 (the instruction treats subnormal inputs and products
  // as zero). Magnitudes are tested on the bits, so inf and NaN go through.
  static bool sq_kept(std::uint16_t h) { return (h & 0x7fffu) >= 0x2000u; }
  static void sq_pairs_bf16(const std::uint16_t* p, F& acc) {
    if (sq_kept(p[1])) {
      const float o = from_bf16(p[1]);
      acc = acc + o * o;
    }
    if (sq_kept(p[0])) {
      const float e = from_bf16(p[0]);
      acc = acc + e * e;
    }
  }
};

#if defined(__AVX2__)
struct Avx2 {
  static constexpr std::size_t W = 8;
  static constexpr int kRegs = 16;  // vector registers
  using F = __m256;
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F load_bf16(const std::uint16_t* p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  // 16-bit stores in two parts, the packing and the store, so that a kernel's write-only
  // 16-bit output can take the non-temporal store (stream16: p aligned to sizeof(P16)).
  using P16 = __m128i;
  static P16 pack_bf16(F v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i nan_bits = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    const __m256 is_nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    r = _mm256_blendv_epi8(r, nan_bits, _mm256_castps_si256(is_nan));
    r = _mm256_and_si256(r, _mm256_set1_epi32(0xffff));
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  }
  static P16 pack_f16(F v) {
    return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static void store16(std::uint16_t* p, P16 x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), x);
  }
  static void stream16(std::uint16_t* p, P16 x) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), x);
  }
  static void stream_fence() { _mm_sfence(); }
  static void store_bf16(std::uint16_t* p, F v) { store16(p, pack_bf16(v)); }
  static F load_f16(const std::uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store_f16(std::uint16_t* p, F v) { store16(p, pack_f16(v)); }
  static F set1(float x) { return _mm256_set1_ps(x); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F neg(F a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f)); }
  static F sign(F a) {
    const __m256 zero = _mm256_setzero_ps();
    const __m256 pos = _mm256_and_ps(_mm256_cmp_ps(a, zero, _CMP_GT_OQ), _mm256_set1_ps(1.0f));
    const __m256 negv = _mm256_and_ps(_mm256_cmp_ps(a, zero, _CMP_LT_OQ), _mm256_set1_ps(-1.0f));
    return _mm256_blendv_ps(_mm256_or_ps(pos, negv), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  // Statistics: 64 values per block, loaded 4 at a time and widened to fp64: 16 accumulators.
  static constexpr int kHalf = 4;
  using H = __m128;
  static H load_half(const float* p) { return _mm_loadu_ps(p); }
  static H load_half_bf16(const std::uint16_t* p) {
    const __m128i w = _mm_cvtepu16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm_castsi128_ps(_mm_slli_epi32(w, 16));
  }
  static H load_half_f16(const std::uint16_t* p) {
    return _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  struct Acc {
    __m256d lane[16];
    Acc() {
      for (auto& l : lane) l = _mm256_setzero_pd();
    }
  };
  static void acc_half(Acc& acc, int k, H x) {
    // d * d is exact in fp64 (inputs have <= 24 significant bits), so the fused multiply-add
    // rounds exactly as the reference's acc + d * d.
    const __m256d d = _mm256_cvtps_pd(x);
    acc.lane[k] = _mm256_fmadd_pd(d, d, acc.lane[k]);
  }
  static void acc_finish(const Acc& acc, Scalar::Acc& out) {
    for (int k = 0; k < 16; ++k) _mm256_storeu_pd(out.lane + 4 * k, acc.lane[k]);
  }
  static void sq_pairs_bf16(const std::uint16_t* p, F& acc) {  // see Scalar::sq_pairs_bf16
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i mag = _mm256_set1_epi32(0x7fffffff), small = _mm256_set1_epi32(0x1fffffff);
    __m256i e = _mm256_slli_epi32(w, 16);
    __m256i o = _mm256_and_si256(w, _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
    e = _mm256_and_si256(e, _mm256_cmpgt_epi32(_mm256_and_si256(e, mag), small));
    o = _mm256_and_si256(o, _mm256_cmpgt_epi32(_mm256_and_si256(o, mag), small));
    const __m256 ef = _mm256_castsi256_ps(e), of = _mm256_castsi256_ps(o);
    acc = _mm256_fmadd_ps(ef, ef, _mm256_fmadd_ps(of, of, acc));
  }
  static void widen_add(F x, double* lanes) {
    _mm256_storeu_pd(
        lanes, _mm256_add_pd(_mm256_loadu_pd(lanes), _mm256_cvtps_pd(_mm256_castps256_ps128(x))));
    _mm256_storeu_pd(lanes + 4, _mm256_add_pd(_mm256_loadu_pd(lanes + 4),
                                              _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1))));
  }
  static void stream_store(float* p, F v) {
    if ((reinterpret_cast<std::uintptr_t>(p) & 31) == 0)
      _mm256_stream_ps(p, v);
    else
      _mm256_storeu_ps(p, v);
  }
};
#endif

#if defined(__AVX512F__)
struct Avx512 {
  static constexpr std::size_t W = 16;
  static constexpr int kRegs = 32;
  using F = __m512;
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F load_bf16(const std::uint16_t* p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  // Integer round-to-nearest-even rather than VCVTNEPS2BF16: that instruction treats subnormal
  // inputs as zero, which would break bit-identity with the reference. Packing and storing are
  // apart as in Avx2 (stream16: p aligned to 32 bytes).
  using P16 = __m256i;
  static P16 pack_bf16(F v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __mmask16 is_nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, is_nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
  }
  static P16 pack_f16(F v) {
    return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static void store16(std::uint16_t* p, P16 x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), x);
  }
  static void stream16(std::uint16_t* p, P16 x) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), x);
  }
  static void stream_fence() { _mm_sfence(); }
  static void store_bf16(std::uint16_t* p, F v) { store16(p, pack_bf16(v)); }
  static F load_f16(const std::uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void store_f16(std::uint16_t* p, F v) { store16(p, pack_f16(v)); }
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F neg(F a) {
    return _mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(static_cast<int>(0x80000000u))));
  }
  static F sign(F a) {
    const __m512 zero = _mm512_setzero_ps();
    __m512 r =
        _mm512_mask_mov_ps(zero, _mm512_cmp_ps_mask(a, zero, _CMP_GT_OQ), _mm512_set1_ps(1.0f));
    r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(a, zero, _CMP_LT_OQ), _mm512_set1_ps(-1.0f));
    return _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
  }
  // Statistics: 64 values per block, loaded 8 at a time and widened to fp64: 8 accumulators.
  static constexpr int kHalf = 8;
  using H = __m256;
  static H load_half(const float* p) { return _mm256_loadu_ps(p); }
  static H load_half_bf16(const std::uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static H load_half_f16(const std::uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  struct Acc {
    __m512d lane[8];
    Acc() {
      for (auto& l : lane) l = _mm512_setzero_pd();
    }
  };
  static void acc_half(Acc& acc, int k, H x) {
    const __m512d d = _mm512_cvtps_pd(x);  // fma: see Avx2::acc_half
    acc.lane[k] = _mm512_fmadd_pd(d, d, acc.lane[k]);
  }
  static void acc_finish(const Acc& acc, Scalar::Acc& out) {
    for (int k = 0; k < 8; ++k) _mm512_storeu_pd(out.lane + 8 * k, acc.lane[k]);
  }
  static void sq_pairs_bf16(const std::uint16_t* p, F& acc) {  // see Scalar::sq_pairs_bf16
    const __m512i w = _mm512_loadu_si512(p);
    const __m512i mag = _mm512_set1_epi32(0x7fffffff), small = _mm512_set1_epi32(0x1fffffff);
    const __m512i e = _mm512_slli_epi32(w, 16);
    const __m512i o = _mm512_and_si512(w, _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
    const __mmask16 ke = _mm512_cmpgt_epi32_mask(_mm512_and_si512(e, mag), small);
    const __mmask16 ko = _mm512_cmpgt_epi32_mask(_mm512_and_si512(o, mag), small);
    const __m512 ef = _mm512_castsi512_ps(e), of = _mm512_castsi512_ps(o);
    acc = _mm512_mask3_fmadd_ps(ef, ef, _mm512_mask3_fmadd_ps(of, of, acc, ko), ke);
  }
  static void widen_add(F x, double* lanes) {
    _mm512_storeu_pd(
        lanes, _mm512_add_pd(_mm512_loadu_pd(lanes), _mm512_cvtps_pd(_mm512_castps512_ps256(x))));
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
    _mm512_storeu_pd(lanes + 8, _mm512_add_pd(_mm512_loadu_pd(lanes + 8), _mm512_cvtps_pd(hi)));
  }
  static void stream_store(float* p, F v) {
    if ((reinterpret_cast<std::uintptr_t>(p) & 63) == 0)
      _mm512_stream_ps(p, v);
    else
      _mm512_storeu_ps(p, v);
  }
};
#endif

#if defined(__AVX512BF16__)
// AVX-512 with AVX512-BF16: the bf16 statistics, done by the instruction the reference's
// sq_pairs_bf16 describes, and bf16 stores by VCVTNEPS2BF16, which rounds to nearest even as the
// reference does but treats subnormal inputs as zero and may set other NaN payload bits: a vector
// holding a subnormal or a NaN takes Avx512's integer rounding instead (one fpclass test).
struct Avx512Bf16 : Avx512 {
  static P16 pack_bf16(F v) {
    constexpr int kQnan = 0x01, kDenormal = 0x20, kSnan = 0x80;
    if (_mm512_fpclass_ps_mask(v, kQnan | kDenormal | kSnan) != 0) return Avx512::pack_bf16(v);
    return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
  }
  static void store_bf16(std::uint16_t* p, F v) { store16(p, pack_bf16(v)); }
  static void sq_pairs_bf16(const std::uint16_t* p, F& acc) {
    const __m512bh w = reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));
    acc = _mm512_dpbf16_ps(acc, w, w);
  }
};
#endif

#if defined(__aarch64__)
// NEON (AArch64: always present). fp16 conversions go lane by lane through the reference recipe,
// so they are bit-identical by construction; bf16 uses the same integer rounding as the others.
struct Neon {
  static constexpr std::size_t W = 4;
  static constexpr int kRegs = 32;
  using F = float32x4_t;
  static F load(const float* p) { return vld1q_f32(p); }
  static void store(float* p, F v) { vst1q_f32(p, v); }
  static F load_bf16(const std::uint16_t* p) {
    return vreinterpretq_f32_u32(vshlq_n_u32(vmovl_u16(vld1_u16(p)), 16));
  }
  static void store_bf16(std::uint16_t* p, F v) {
    const uint32x4_t u = vreinterpretq_u32_f32(v);
    const uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    uint32x4_t r = vshrq_n_u32(vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7fff)), lsb), 16);
    const uint32x4_t nan_bits = vorrq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(0x40));
    const uint32x4_t not_nan = vceqq_f32(v, v);
    r = vbslq_u32(not_nan, r, nan_bits);
    vst1_u16(p, vmovn_u32(r));
  }
  static F load_f16(const std::uint16_t* p) {
    const float t[4] = {from_f16(p[0]), from_f16(p[1]), from_f16(p[2]), from_f16(p[3])};
    return vld1q_f32(t);
  }
  static void store_f16(std::uint16_t* p, F v) {
    float t[4];
    vst1q_f32(t, v);
    for (int j = 0; j < 4; ++j) p[j] = to_f16(t[j]);
  }
  static F set1(float x) { return vdupq_n_f32(x); }
  static F add(F a, F b) { return vaddq_f32(a, b); }
  static F sub(F a, F b) { return vsubq_f32(a, b); }
  static F mul(F a, F b) { return vmulq_f32(a, b); }
  static F div(F a, F b) { return vdivq_f32(a, b); }
  static F sqrt(F a) { return vsqrtq_f32(a); }
  static F fma(F a, F b, F c) { return vfmaq_f32(c, a, b); }
  static F max(F a, F b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
  static F neg(F a) { return vnegq_f32(a); }
  static F sign(F a) {
    const F zero = vdupq_n_f32(0.0f);
    F r = vbslq_f32(vcgtq_f32(a, zero), vdupq_n_f32(1.0f), zero);
    r = vbslq_f32(vcltq_f32(a, zero), vdupq_n_f32(-1.0f), r);
    return vbslq_f32(vceqq_f32(a, a), r, a);
  }
  // Statistics: 64 values per block, 2 at a time widened to fp64: 32 accumulators.
  static constexpr int kHalf = 2;
  using H = float32x2_t;
  static H load_half(const float* p) { return vld1_f32(p); }
  static H load_half_bf16(const std::uint16_t* p) {
    const float t[2] = {from_bf16(p[0]), from_bf16(p[1])};
    return vld1_f32(t);
  }
  static H load_half_f16(const std::uint16_t* p) {
    const float t[2] = {from_f16(p[0]), from_f16(p[1])};
    return vld1_f32(t);
  }
  struct Acc {
    float64x2_t lane[32];
    Acc() {
      for (auto& l : lane) l = vdupq_n_f64(0.0);
    }
  };
  static void acc_half(Acc& acc, int k, H x) {
    const float64x2_t d = vcvt_f64_f32(x);  // fma: see Avx2::acc_half
    acc.lane[k] = vfmaq_f64(acc.lane[k], d, d);
  }
  static void acc_finish(const Acc& acc, Scalar::Acc& out) {
    for (int k = 0; k < 32; ++k) vst1q_f64(out.lane + 2 * k, acc.lane[k]);
  }
  static void sq_pairs_bf16(const std::uint16_t* p, F& acc) {  // see Scalar::sq_pairs_bf16
    const uint32x4_t w = vreinterpretq_u32_u16(vld1q_u16(p));
    const uint32x4_t mag = vdupq_n_u32(0x7fffffffu), small = vdupq_n_u32(0x1fffffffu);
    uint32x4_t e = vshlq_n_u32(w, 16);
    uint32x4_t o = vandq_u32(w, vdupq_n_u32(0xffff0000u));
    e = vandq_u32(e, vcgtq_u32(vandq_u32(e, mag), small));
    o = vandq_u32(o, vcgtq_u32(vandq_u32(o, mag), small));
    const F ef = vreinterpretq_f32_u32(e), of = vreinterpretq_f32_u32(o);
    acc = vfmaq_f32(vfmaq_f32(acc, of, of), ef, ef);
  }
  static void widen_add(F x, double* lanes) {
    vst1q_f64(lanes, vaddq_f64(vld1q_f64(lanes), vcvt_f64_f32(vget_low_f32(x))));
    vst1q_f64(lanes + 2, vaddq_f64(vld1q_f64(lanes + 2), vcvt_high_f64_f32(x)));
  }
  static void stream_store(float* p, F v) { vst1q_f32(p, v); }
};
#endif

#if defined(TIERSWAP_SIMD_SVE)
// SVE at one fixed vector length (-msve-vector-bits=N: 128 on Grace / Neoverse V2, 256 on
// Neoverse V1, 512 on A64FX). The fixed length makes the vectors ordinary types that the kernels
// keep in arrays; the dispatcher runs an instance only on a CPU whose vector length is N. All
// predicates are all-true: tails go through Scalar as for every other instance. bf16 uses the
// integer rounding of the others; fp16 uses FCVT, which with Linux's FPCR (no flush to zero, no
// default NaN, round to nearest even) converts exactly as convert.hpp's recipe.
struct Sve {
  static constexpr std::size_t kBits = __ARM_FEATURE_SVE_BITS;
  static constexpr std::size_t W = kBits / 32;
  static constexpr int kRegs = 32;
  using F = svfloat32_t __attribute__((arm_sve_vector_bits(__ARM_FEATURE_SVE_BITS)));
  using U = svuint32_t __attribute__((arm_sve_vector_bits(__ARM_FEATURE_SVE_BITS)));
  using D = svfloat64_t __attribute__((arm_sve_vector_bits(__ARM_FEATURE_SVE_BITS)));
  static svbool_t all32() { return svptrue_b32(); }
  static svbool_t all64() { return svptrue_b64(); }
  static F load(const float* p) { return svld1_f32(all32(), p); }
  static void store(float* p, F v) { svst1_f32(all32(), p, v); }
  static F load_bf16(const std::uint16_t* p) {
    return svreinterpret_f32_u32(svlsl_n_u32_x(all32(), svld1uh_u32(all32(), p), 16));
  }
  static void store_bf16(std::uint16_t* p, F v) {
    const svbool_t pg = all32();
    const U u = svreinterpret_u32_f32(v);
    const U hi = svlsr_n_u32_x(pg, u, 16);
    const U lsb = svand_n_u32_x(pg, hi, 1);
    U r = svlsr_n_u32_x(pg, svadd_u32_x(pg, svadd_n_u32_x(pg, u, 0x7fff), lsb), 16);
    r = svsel_u32(svcmpuo_f32(pg, v, v), svorr_n_u32_x(pg, hi, 0x40), r);
    svst1h_u32(pg, p, r);  // the low 16 bits of each lane
  }
  static F load_f16(const std::uint16_t* p) {
    // Each value in the low half of its 32-bit lane, which is the half FCVT reads.
    const svfloat16_t h = svreinterpret_f16_u32(svld1uh_u32(all32(), p));
    return svcvt_f32_f16_x(all32(), h);
  }
  static void store_f16(std::uint16_t* p, F v) {
    const svfloat16_t h = svcvt_f16_f32_x(all32(), v);  // into the low half of each lane
    svst1h_u32(all32(), p, svreinterpret_u32_f16(h));
  }
  static F set1(float x) { return svdup_n_f32(x); }
  static F add(F a, F b) { return svadd_f32_x(all32(), a, b); }
  static F sub(F a, F b) { return svsub_f32_x(all32(), a, b); }
  static F mul(F a, F b) { return svmul_f32_x(all32(), a, b); }
  static F div(F a, F b) { return svdiv_f32_x(all32(), a, b); }
  static F sqrt(F a) { return svsqrt_f32_x(all32(), a); }
  static F fma(F a, F b, F c) { return svmla_f32_x(all32(), c, a, b); }
  static F max(F a, F b) { return svsel_f32(svcmpgt_f32(all32(), a, b), a, b); }
  static F neg(F a) { return svneg_f32_x(all32(), a); }
  static F sign(F a) {
    const svbool_t pg = all32();
    const F zero = svdup_n_f32(0.0f);
    F r = svsel_f32(svcmpgt_f32(pg, a, zero), svdup_n_f32(1.0f), zero);
    r = svsel_f32(svcmplt_f32(pg, a, zero), svdup_n_f32(-1.0f), r);
    return svsel_f32(svcmpuo_f32(pg, a, a), a, r);
  }
  // Statistics: 64 values per block, W / 2 at a time (one per 64-bit lane, in its low half) and
  // widened to fp64: 64 / (W / 2) accumulators.
  static constexpr int kHalf = static_cast<int>(W / 2);
  using H = F;  // values in the even 32-bit lanes
  static H load_half(const float* p) {
    return svreinterpret_f32_u64(svld1uw_u64(all64(), reinterpret_cast<const std::uint32_t*>(p)));
  }
  static H load_half_bf16(const std::uint16_t* p) {
    const svuint64_t w = svlsl_n_u64_x(all64(), svld1uh_u64(all64(), p), 16);
    return svreinterpret_f32_u64(w);
  }
  static H load_half_f16(const std::uint16_t* p) {
    const svfloat16_t h = svreinterpret_f16_u64(svld1uh_u64(all64(), p));
    return svcvt_f32_f16_x(all32(), h);  // odd lanes convert the zero upper halves: unused
  }
  struct Acc {
    D lane[64 / kHalf];
    Acc() {
      for (auto& l : lane) l = svdup_n_f64(0.0);
    }
  };
  static void acc_half(Acc& acc, int k, H x) {
    const D d = svcvt_f64_f32_x(all64(), x);  // fma: see Avx2::acc_half
    acc.lane[k] = svmla_f64_x(all64(), acc.lane[k], d, d);
  }
  static void acc_finish(const Acc& acc, Scalar::Acc& out) {
    for (int k = 0; k < 64 / kHalf; ++k) svst1_f64(all64(), out.lane + kHalf * k, acc.lane[k]);
  }
  static void sq_pairs_bf16(const std::uint16_t* p, F& acc) {  // see Scalar::sq_pairs_bf16
    const svbool_t pg = all32();
    const U w = svreinterpret_u32_u16(svld1_u16(svptrue_b16(), p));
    U e = svlsl_n_u32_x(pg, w, 16);
    U o = svand_n_u32_x(pg, w, 0xffff0000u);
    const U zero = svdup_n_u32(0);
    e = svsel_u32(svcmpgt_n_u32(pg, svand_n_u32_x(pg, e, 0x7fffffffu), 0x1fffffffu), e, zero);
    o = svsel_u32(svcmpgt_n_u32(pg, svand_n_u32_x(pg, o, 0x7fffffffu), 0x1fffffffu), o, zero);
    const F ef = svreinterpret_f32_u32(e), of = svreinterpret_f32_u32(o);
    acc = svmla_f32_x(pg, svmla_f32_x(pg, acc, of, of), ef, ef);
  }
  static void widen_add(F x, double* lanes) {
    const svbool_t pg = all64();
    // zip1 puts x[0 .. W/2) in the even 32-bit lanes, zip2 the rest; FCVT widens those.
    const D lo = svcvt_f64_f32_x(pg, svzip1_f32(x, x)), hi = svcvt_f64_f32_x(pg, svzip2_f32(x, x));
    svst1_f64(pg, lanes, svadd_f64_x(pg, svld1_f64(pg, lanes), lo));
    svst1_f64(pg, lanes + W / 2, svadd_f64_x(pg, svld1_f64(pg, lanes + W / 2), hi));
  }
  static void stream_store(float* p, F v) { svstnt1_f32(all32(), p, v); }
};
#endif

}  // namespace
}  // namespace tierswap::kernels
