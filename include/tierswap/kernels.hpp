// Fused optimizer kernels on the CPU: one pass over the state per step.
//
// The fused Adam/AdamW step reads fp32 master p, moments m and v, and a 16-bit gradient, derives
// the fp32 gradient in registers (times a multiplier: loss-scale inverse x clip factor), updates
// p, m, v and writes the 16-bit copy of p in the same pass: 28 bytes per parameter with bf16
// gradients and fp32 moments, against 40 for cast pass + fp32 Adam + cast back.
//
// Semantics follow torch.optim.AdamW / Adam (PyTorch 1.13+, single-tensor path):
//   g  = grad * multiplier;  g = -g if maximize;  g = fma(p, wd, g)  (Adam, L2)
//   p *= 1 - lr * wd        (AdamW, decoupled)
//   m  = fma(g, 1 - beta1, m * beta1)
//   v  = fma((1 - beta2) * g, g, v * beta2)
//   vmax = max(vmax, v)     (amsgrad; the denominator then uses vmax)
//   denom = sqrt(v) / sqrt(1 - beta2^t) + eps
//   p += (-lr / (1 - beta1^t)) * m / denom
// The fused multiply-adds sit where torch's CPU path uses one: `add_(x, alpha=a)` is fmadd in
// its vectorized kernel, and `addcmul_(g, g, value=1 - beta2)` (`self + value * t1 * t2`) is
// contracted by the compiler into fma(value * g, g, self) in Debian's torch 1.13 (every element,
// tail included: TorchReference.MatchesTorchOptimBitForBitAfter12Steps); everything else is a
// separately rounded fp32 operation. Every variant (scalar, AVX2+F16C, AVX-512, CUDA) evaluates
// exactly these operations in this order and nothing else is contracted, so all of them are
// bit-identical to the scalar reference.
// Conversions to 16 bits round to nearest even; NaN stays NaN (quieted).
//
// Thread-safety: kernels may run concurrently on disjoint buffers. With a ThreadPool the work is
// split into contiguous ranges; results do not depend on the thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tierswap/types.hpp"

namespace tierswap {

class ThreadPool;

/// avx512bf16: the AVX-512 kernels, with the bf16 statistics pass on VDPBF16PS (same results).
/// sve: AArch64 SVE, the instance built for this CPU's vector length (128, 256 or 512 bits).
enum class CpuIsa : std::uint8_t { scalar, avx2, avx512, neon, avx512bf16, sve };
std::string_view to_string(CpuIsa isa) noexcept;
/// "scalar" | "avx2" | "avx512" | "avx512bf16" | "neon" | "sve"; std::invalid_argument otherwise.
CpuIsa parse_isa(std::string_view text);
/// Whether this build and this CPU (CPUID/HWCAP, OS state support) can run `isa`.
bool cpu_isa_supported(CpuIsa isa) noexcept;
/// Every ISA cpu_isa_supported() accepts, scalar first (what `tierswap info` lists).
std::vector<CpuIsa> supported_cpu_isas();
/// The best supported ISA, or TIERSWAP_CPU_ISA when set (std::invalid_argument when it names an
/// unknown or unsupported ISA). Evaluated once.
CpuIsa default_cpu_isa();

/// Where and how a kernel runs. `pool` null: the calling thread only.
struct CpuKernelContext {
  CpuIsa isa = default_cpu_isa();
  ThreadPool* pool = nullptr;
};

/// A gradient as the kernels read it: 16-bit (or fp32) values times `multiplier`.
struct GradView {
  const void* data = nullptr;
  Dtype dtype = Dtype::bf16;
  float multiplier = 1.0f;  ///< loss-scale inverse x clip factor, folded into the read
};

/// Optional 16-bit copy of the parameters written in the same pass (data null: none).
struct Param16View {
  void* data = nullptr;
  Dtype dtype = Dtype::bf16;  ///< bf16 or f16
};

// Hyper-parameters are doubles, as torch's Python floats: derived constants (1 - beta, the bias
// corrections, 1 - lr * wd) are computed in double and rounded to fp32 once, as torch does.
struct AdamConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = true;  ///< true: AdamW; false: Adam with L2 (weight decay added to g)
  bool amsgrad = false;
  bool maximize = false;
  /// Throws std::invalid_argument naming the field for values torch also rejects.
  void validate() const;
};

struct AdamState {
  float* param = nullptr;
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  void* max_exp_avg_sq = nullptr;   ///< amsgrad only
  Dtype moment_dtype = Dtype::f32;  ///< f32, or bf16 (opt-in: halves the moments' bytes)
};

/// One fused Adam/AdamW step over n parameters; `step` is the 1-based step count after this
/// update (bias correction). Throws std::invalid_argument on null buffers or bad dtypes.
void adam_step(const AdamConfig& cfg, std::int64_t step, const AdamState& state,
               const GradView& grad, const Param16View& p16, std::size_t n,
               const CpuKernelContext& ctx = {});

/// Lion (Chen et al. 2023): c = m*b1 + g*(1-b1); p = fma(sign(c), -lr, p*(1 - lr*wd));
/// m = fma(g, 1-b2, m*b2). One moment: 20 bytes per parameter with bf16 gradients (read p, m, g;
/// write p, m, p16).
struct LionConfig {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double weight_decay = 0.0;
  bool maximize = false;
  void validate() const;
};
void lion_step(const LionConfig& cfg, float* param, void* exp_avg, Dtype moment_dtype,
               const GradView& grad, const Param16View& p16, std::size_t n,
               const CpuKernelContext& ctx = {});

/// SGD with momentum, torch.optim.SGD semantics: g += wd*p; buf = g on the first step, else
/// buf = momentum*buf + (1-dampening)*g; g = nesterov ? g + momentum*buf : buf; p -= lr*g
/// (maximize: p += lr*g). momentum 0: no buffer is touched (it may be null).
struct SgdConfig {
  double lr = 1e-2;
  double momentum = 0.9;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool maximize = false;
  void validate() const;
};
void sgd_step(const SgdConfig& cfg, bool first_step, float* param, float* momentum_buffer,
              const GradView& grad, const Param16View& p16, std::size_t n,
              const CpuKernelContext& ctx = {});

/// Sum of squares (fp64, fixed reduction order: bit-identical for every ISA and thread count) and
/// a non-finite flag over n gradient values (the multiplier is not applied). The order: chunks of
/// 8192 values; in a chunk, value i adds its (exact) square to lane i % 64; the 64 lanes combine
/// in a pairwise tree; chunk sums add in chunk order.
struct GradStats {
  double sum_sq = 0;
  bool nonfinite = false;
};
GradStats grad_stats(const void* grad, Dtype dtype, std::size_t n,
                     const CpuKernelContext& ctx = {});
/// Values per statistics chunk: the unit of grad_stats' fixed order.
// kGradStatsChunk (elements per chunk): tierswap/types.hpp.
/// The chunk sums grad_stats adds up: sums[c] for chunk c < ceil(n / kGradStatsChunk). A buffer
/// that starts on a chunk boundary of a larger one gets that buffer's chunk sums, bit for bit:
/// what lets ranks that hold chunk-aligned shards compute one norm for any world size.
void grad_chunk_sums(const void* grad, Dtype dtype, std::size_t n, double* sums,
                     const CpuKernelContext& ctx = {});

/// dst = src converted (16 <-> 32 bits, or same-type copy), round to nearest even.
void cast(const void* src, Dtype src_dtype, void* dst, Dtype dst_dtype, std::size_t n,
          const CpuKernelContext& ctx = {});

/// acc = acc + g, computed in fp32 and rounded to acc's dtype (gradient accumulation).
void accumulate(void* acc, Dtype acc_dtype, const void* grad, Dtype grad_dtype, std::size_t n,
                const CpuKernelContext& ctx = {});

/// STREAM triad a = b + s * c (non-temporal stores where the ISA has them): the memory-bandwidth
/// probe `tierswap bench kernels` measures the optimizer kernels against (12 bytes per element).
void stream_triad(float* a, const float* b, const float* c, float s, std::size_t n,
                  const CpuKernelContext& ctx = {});

/// Scalar conversions, exactly as every kernel does them.
std::uint16_t float_to_bf16(float f) noexcept;
float bf16_to_float(std::uint16_t h) noexcept;
std::uint16_t float_to_f16(float f) noexcept;
float f16_to_float(std::uint16_t h) noexcept;

}  // namespace tierswap
