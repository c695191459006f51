// Internal: the per-ISA function table and the argument blocks the dispatcher fills in.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "tierswap/kernels.hpp"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#include <sys/prctl.h>
#endif

namespace tierswap::kernels {

// Per-step constants, computed once in double (as torch's Python scalars) and rounded to fp32.
struct AdamScalars {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay, decay;
  float neg_step_size, bias_correction2_sqrt, grad_multiplier;
  bool decoupled, amsgrad, maximize;
};
struct AdamArgs {
  AdamScalars s;
  float* param;
  void* exp_avg;
  void* exp_avg_sq;
  void* max_exp_avg_sq;
  Dtype moment_dtype;
  const void* grad;
  Dtype grad_dtype;
  void* param16;
  Dtype param16_dtype;
};

struct LionScalars {
  float lr, neg_lr, beta1, beta2, one_minus_beta1, one_minus_beta2, weight_decay, decay,
      grad_multiplier;
  bool maximize;
};
struct LionArgs {
  LionScalars s;
  float* param;
  void* exp_avg;
  Dtype moment_dtype;
  const void* grad;
  Dtype grad_dtype;
  void* param16;
  Dtype param16_dtype;
};

struct SgdScalars {
  float lr, neg_lr, momentum, one_minus_dampening, weight_decay, grad_multiplier;
  bool nesterov, maximize, first_step;
};
struct SgdArgs {
  SgdScalars s;
  float* param;
  float* momentum_buffer;
  const void* grad;
  Dtype grad_dtype;
  void* param16;
  Dtype param16_dtype;
};

inline constexpr int kStatsLanes = 64;
inline constexpr int kMaxStatsStreams = 8;  // chunks a stats16 call may take at once
struct StatsLanes {
  double lane[kStatsLanes];
};

struct KernelTable {
  CpuIsa isa;
  void (*adam)(const AdamArgs&, std::size_t b, std::size_t e);
  void (*lion)(const LionArgs&, std::size_t b, std::size_t e);
  void (*sgd)(const SgdArgs&, std::size_t b, std::size_t e);
  // Statistics lanes of one chunk [b, e) (b is the chunk's start): exact fp64 squares, any dtype.
  void (*stats)(const void* g, Dtype d, std::size_t b, std::size_t e, StatsLanes& out);
  // The fast path for bf16/f16 (fp32 runs of squares): `streams` chunks [b[k], b[k] + len) in
  // lockstep, streams 1 or stats16_streams. Use chunk_sums_sq().
  void (*stats16)(const void* g, Dtype d, const std::size_t* b, std::size_t len, int streams,
                  StatsLanes* out);
  int stats16_streams;
  void (*cast)(const void* src, Dtype sd, void* dst, Dtype dd, std::size_t b, std::size_t e);
  void (*accumulate)(void* acc, Dtype ad, const void* g, Dtype gd, std::size_t b, std::size_t e);
  void (*triad)(float* a, const float* b, const float* c, float s, std::size_t i, std::size_t e);
};

/// The fixed combination of a chunk's 64 lanes: a pairwise tree, (0+1), (2+3), ... then pairs of
/// those, and so on. CPU and CUDA both use this order.
inline double combine_lanes(const double* lane) {
  double l[kStatsLanes];
  for (int j = 0; j < kStatsLanes; ++j) l[j] = lane[j];
  for (int step = 1; step < kStatsLanes; step *= 2)
    for (int j = 0; j < kStatsLanes; j += 2 * step) l[j] = l[j] + l[j + step];
  return l[0];
}

const KernelTable& scalar_table();
const KernelTable* avx2_table();        // null when not compiled in
const KernelTable* avx512_table();      // null when not compiled in
const KernelTable* avx512bf16_table();  // null when not compiled in
const KernelTable* neon_table();        // null when not compiled in
// SVE instances, one per vector length (kernels_sve.cpp built with -msve-vector-bits=N); null
// when not compiled in. sve_table(): the one for this CPU's vector length, or null.
const KernelTable* sve128_table();
const KernelTable* sve256_table();
const KernelTable* sve512_table();
const KernelTable* sve_table();

namespace {  // internal linkage: also included by the SVE translation units (see simd.hpp)
/// This thread's SVE vector length in bits (inherited by the threads it starts), 0 without SVE.
inline unsigned sve_vector_bits() noexcept {
#if defined(__aarch64__) && defined(__linux__)
  if ((getauxval(AT_HWCAP) & HWCAP_SVE) == 0) return 0;
  const int vl = prctl(PR_SVE_GET_VL);
  return vl < 0 ? 0u : static_cast<unsigned>(vl & PR_SVE_VL_LEN_MASK) * 8u;
#else
  return 0;
#endif
}
/// The SVE instance built for `bits`-bit vectors, null for other lengths or when not built.
inline const KernelTable* sve_table_for_bits(unsigned bits) noexcept {
  switch (bits) {
    case 128:
      return sve128_table();
    case 256:
      return sve256_table();
    case 512:
      return sve512_table();
    default:
      return nullptr;
  }
}
}  // namespace

// ---- runtime dtype -> compile-time dtype (CPU and CUDA launchers) ------------------------------
template <Dtype D>
using DtypeC = std::integral_constant<Dtype, D>;

/// Calls f(DtypeC<d>{}).
template <class F>
void visit_dtype(Dtype d, F&& f) {
  switch (d) {
    case Dtype::f32:
      f(DtypeC<Dtype::f32>{});
      break;
    case Dtype::bf16:
      f(DtypeC<Dtype::bf16>{});
      break;
    case Dtype::f16:
      f(DtypeC<Dtype::f16>{});
      break;
  }
}

/// Moments are f32 or bf16 (check_moment() rejects f16): only those two are instantiated.
template <class F>
void visit_moment_dtype(Dtype d, F&& f) {
  if (d == Dtype::bf16)
    f(DtypeC<Dtype::bf16>{});
  else
    f(DtypeC<Dtype::f32>{});
}

/// Calls f(has_copy, DtypeC<dtype>) for the optional 16-bit parameter copy (bf16 or f16).
template <class F>
void visit_param16(const void* data, Dtype d, F&& f) {
  if (data == nullptr)
    f(std::false_type{}, DtypeC<Dtype::bf16>{});
  else if (d == Dtype::f16)
    f(std::true_type{}, DtypeC<Dtype::f16>{});
  else
    f(std::true_type{}, DtypeC<Dtype::bf16>{});
}

/// Argument checks shared by the CPU and CUDA entry points (std::invalid_argument).
void need(const void* p, const char* what);
void check_p16(const Param16View& p16);
void check_moment(Dtype d);
void check_adam(const AdamConfig& cfg, std::int64_t step, const AdamState& st, const GradView& g,
                const Param16View& p16, std::size_t n);

/// Per-step fp32 constants, shared by the CPU and CUDA launchers so both see the same bits.
AdamScalars adam_scalars(const AdamConfig& cfg, std::int64_t step, float grad_multiplier);
LionScalars lion_scalars(const LionConfig& cfg, float grad_multiplier);
SgdScalars sgd_scalars(const SgdConfig& cfg, bool first_step, float grad_multiplier);

/// Validated argument blocks for the launchers (CPU and CUDA): std::invalid_argument on misuse.
AdamArgs adam_args(const AdamConfig& cfg, std::int64_t step, const AdamState& st, const GradView& g,
                   const Param16View& p16, std::size_t n);
LionArgs lion_args(const LionConfig& cfg, float* param, void* exp_avg, Dtype moment_dtype,
                   const GradView& g, const Param16View& p16, std::size_t n);
SgdArgs sgd_args(const SgdConfig& cfg, bool first_step, float* param, float* momentum_buffer,
                 const GradView& g, const Param16View& p16, std::size_t n);

/// Elements per statistics chunk: the unit of the fixed reduction order.
inline constexpr std::size_t kStatsChunk = kGradStatsChunk;
/// Squares each lane adds in fp32 before its run is widened into the lane's fp64 sum (16-bit path).
inline constexpr std::size_t kStatsRun = 8;
/// A 16-bit chunk whose fast sum is below this (but has a non-zero value) or is not finite is
/// recomputed exactly: below it, fp32 underflow of bf16 squares (|x| < 2^-63) could matter.
inline constexpr double kStatsExactBelow = 0x1p-80;

/// True when every 16-bit value of [b, e) is +0 or -0.
inline bool all_zero16(const void* g, std::size_t b, std::size_t e) {
  const auto* h = static_cast<const std::uint16_t*>(g);
  unsigned bits = 0;
  for (std::size_t i = b; i < e; ++i) bits |= h[i] & 0x7fffu;
  return bits == 0;
}

/// Sums of squares of statistics chunks [b[k], b[k] + len), k < count (count 1 or
/// t.stats16_streams), in the fixed order every variant (CPU and CUDA) follows. 16-bit gradients
/// take the fast path (fp32 runs of kStatsRun exact squares per lane, widened to fp64: relative
/// error below kStatsRun * 2^-24 per run, about 5e-7); a chunk whose fast sum is not finite (an
/// inf/NaN value, or a bf16 square beyond fp32's range), or is below kStatsExactBelow without
/// being all zeros, is recomputed with exact fp64 squares. fp32 gradients always take the exact
/// path.
inline void chunk_sums_sq(const KernelTable& t, const void* g, Dtype d, const std::size_t* b,
                          std::size_t len, int count, double* sums) {
  StatsLanes l[kMaxStatsStreams];
  const bool fast = d != Dtype::f32;
  if (fast) t.stats16(g, d, b, len, count, l);
  for (int k = 0; k < count; ++k) {
    if (fast) {
      const double s = combine_lanes(l[k].lane);
      if (std::isfinite(s) && (s >= kStatsExactBelow || all_zero16(g, b[k], b[k] + len))) {
        sums[k] = s;
        continue;
      }
    }
    StatsLanes x{};
    t.stats(g, d, b[k], b[k] + len, x);
    sums[k] = combine_lanes(x.lane);
  }
}

}  // namespace tierswap::kernels
