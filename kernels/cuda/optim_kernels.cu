// CUDA variants of the fused optimizer kernels. Layering as CUB: launcher (argument checks,
// per-step constants shared with the CPU) -> dtype dispatch -> thin __global__ -> per-element
// body. Every floating-point operation is an explicit round-to-nearest intrinsic (__fadd_rn,
// __fmul_rn, __fdiv_rn, __fsqrt_rn, __fmaf_rn) so nvcc contracts nothing the CPU reference does
// not: results are bit-identical to kernels/cpu's scalar reference.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/cpu/kernel_table.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "tierswap/cuda_kernels.hpp"
#include "tierswap/device.hpp"

namespace tierswap::cuda {
using detail::as_stream;
using detail::check;
using detail::check_launch;
namespace {

using kernels::AdamArgs;
using kernels::LionArgs;
using kernels::SgdArgs;

// ---- conversions (the same bit recipes as kernels/cpu/convert.hpp) --------------------------
__device__ __forceinline__ std::uint16_t to_bf16(float f) {
  const std::uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float from_bf16(std::uint16_t h) {
  return __uint_as_float(static_cast<std::uint32_t>(h) << 16);
}
__device__ __forceinline__ std::uint16_t to_f16(float f) {
  const std::uint32_t u = __float_as_uint(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (a < 0x38800000u) {
    const float r = __fadd_rn(__uint_as_float(a), 0.5f);
    return static_cast<std::uint16_t>(sign | (__float_as_uint(r) - 0x3f000000u));
  }
  a += 0xc8000fffu + ((a >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (a >> 13));
}
__device__ __forceinline__ float from_f16(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  if (exp == 0)
    return __uint_as_float(
        sign | __float_as_uint(__fmul_rn(static_cast<float>(man), 5.9604644775390625e-08f)));
  if (exp == 31) return __uint_as_float(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0u));
  return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
}

template <Dtype D>
struct Mem;
template <>
struct Mem<Dtype::f32> {
  __device__ static float load(const void* p, std::size_t i) {
    return static_cast<const float*>(p)[i];
  }
  __device__ static void store(void* p, std::size_t i, float v) { static_cast<float*>(p)[i] = v; }
};
template <>
struct Mem<Dtype::bf16> {
  __device__ static float load(const void* p, std::size_t i) {
    return from_bf16(static_cast<const std::uint16_t*>(p)[i]);
  }
  __device__ static void store(void* p, std::size_t i, float v) {
    static_cast<std::uint16_t*>(p)[i] = to_bf16(v);
  }
};
template <>
struct Mem<Dtype::f16> {
  __device__ static float load(const void* p, std::size_t i) {
    return from_f16(static_cast<const std::uint16_t*>(p)[i]);
  }
  __device__ static void store(void* p, std::size_t i, float v) {
    static_cast<std::uint16_t*>(p)[i] = to_f16(v);
  }
};

__device__ __forceinline__ float neg(float a) {
  return __uint_as_float(__float_as_uint(a) ^ 0x80000000u);
}
__device__ __forceinline__ float vmax(float a, float b) {
  return a > b ? a : b;
}
__device__ __forceinline__ float sign(float a) {
  return a != a ? a : a > 0.0f ? 1.0f : a < 0.0f ? -1.0f : 0.0f;
}

#define TIERSWAP_GRID_STRIDE(i, n)                                                               \
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)

// ---- per-element bodies (same operation order as kernels/cpu/kernels_impl.hpp) -------------
template <Dtype G, Dtype M, bool kP16, Dtype P>
__global__ void adam_kernel(AdamArgs a, std::size_t n) {
  const auto& s = a.s;
  TIERSWAP_GRID_STRIDE(i, n) {
    float g = __fmul_rn(Mem<G>::load(a.grad, i), s.grad_multiplier);
    if (s.maximize) g = neg(g);
    float p = a.param[i];
    if (s.weight_decay != 0.0f) {
      if (s.decoupled)
        p = __fmul_rn(p, s.decay);
      else
        g = __fmaf_rn(p, s.weight_decay, g);
    }
    float m = __fmaf_rn(g, s.one_minus_beta1, __fmul_rn(Mem<M>::load(a.exp_avg, i), s.beta1));
    float v = __fmaf_rn(__fmul_rn(s.one_minus_beta2, g), g,
                        __fmul_rn(Mem<M>::load(a.exp_avg_sq, i), s.beta2));
    Mem<M>::store(a.exp_avg, i, m);
    Mem<M>::store(a.exp_avg_sq, i, v);
    if (M != Dtype::f32) {
      m = Mem<M>::load(a.exp_avg, i);
      v = Mem<M>::load(a.exp_avg_sq, i);
    }
    if (s.amsgrad) {
      v = vmax(Mem<M>::load(a.max_exp_avg_sq, i), v);
      Mem<M>::store(a.max_exp_avg_sq, i, v);
      if (M != Dtype::f32) v = Mem<M>::load(a.max_exp_avg_sq, i);
    }
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bias_correction2_sqrt), s.eps);
    p = __fadd_rn(p, __fdiv_rn(__fmul_rn(s.neg_step_size, m), denom));
    a.param[i] = p;
    if (kP16) Mem<P>::store(a.param16, i, p);
  }
}

template <Dtype G, Dtype M, bool kP16, Dtype P>
__global__ void lion_kernel(LionArgs a, std::size_t n) {
  const auto& s = a.s;
  TIERSWAP_GRID_STRIDE(i, n) {
    float g = __fmul_rn(Mem<G>::load(a.grad, i), s.grad_multiplier);
    if (s.maximize) g = neg(g);
    float p = a.param[i];
    if (s.weight_decay != 0.0f) p = __fmul_rn(p, s.decay);
    const float m = Mem<M>::load(a.exp_avg, i);
    const float c = __fadd_rn(__fmul_rn(m, s.beta1), __fmul_rn(g, s.one_minus_beta1));
    p = __fmaf_rn(sign(c), s.neg_lr, p);
    Mem<M>::store(a.exp_avg, i, __fmaf_rn(g, s.one_minus_beta2, __fmul_rn(m, s.beta2)));
    a.param[i] = p;
    if (kP16) Mem<P>::store(a.param16, i, p);
  }
}

template <Dtype G, bool kP16, Dtype P>
__global__ void sgd_kernel(SgdArgs a, std::size_t n) {
  const auto& s = a.s;
  TIERSWAP_GRID_STRIDE(i, n) {
    float g = __fmul_rn(Mem<G>::load(a.grad, i), s.grad_multiplier);
    if (s.maximize) g = neg(g);
    float p = a.param[i];
    if (s.weight_decay != 0.0f) g = __fmaf_rn(p, s.weight_decay, g);
    if (s.momentum != 0.0f) {
      const float buf = s.first_step ? g
                                     : __fmaf_rn(g, s.one_minus_dampening,
                                                 __fmul_rn(a.momentum_buffer[i], s.momentum));
      a.momentum_buffer[i] = buf;
      g = s.nesterov ? __fmaf_rn(buf, s.momentum, g) : buf;
    }
    p = __fmaf_rn(g, s.neg_lr, p);
    a.param[i] = p;
    if (kP16) Mem<P>::store(a.param16, i, p);
  }
}

template <Dtype S, Dtype D>
__global__ void cast_kernel(const void* src, void* dst, std::size_t n) {
  TIERSWAP_GRID_STRIDE(i, n) {
    Mem<D>::store(dst, i, Mem<S>::load(src, i));
  }
}

template <Dtype A, Dtype G>
__global__ void accumulate_kernel(void* acc, const void* g, std::size_t n) {
  TIERSWAP_GRID_STRIDE(i, n) {
    Mem<A>::store(acc, i, __fadd_rn(Mem<A>::load(acc, i), Mem<G>::load(g, i)));
  }
}

// Statistics in the CPU's fixed order (kernels/cpu/kernels_impl.hpp and kernel_table.hpp's
// chunk_sums_sq): chunk c of kStatsChunk values, 64 lanes. One thread per (chunk, lane): a block
// of 256 threads holds 4 chunks. The 16-bit fast path sums fp32 runs of kStatsRun squares per lane
// (bf16: lane j takes the pair (2j, 2j+1) of each 128-value block, odd square first, squares of
// |x| < 2^-63 dropped; fp16: value i feeds lane i % 64) and widens each run into the lane's fp64
// sum; lanes combine in the pairwise tree of kernels::combine_lanes(); a chunk whose fast sum is
// not finite, or below kStatsExactBelow with a non-zero value, is summed again with exact fp64
// squares (lane j: values j, j+64, ...). fp32 gradients take the exact path only.
__device__ __forceinline__ double stats_exact_lane(const void* g, Dtype d, std::size_t b,
                                                   std::size_t e, unsigned lane) {
  double acc = 0.0;
  for (std::size_t i = b + lane; i < e; i += kernels::kStatsLanes) {
    const float x = d == Dtype::f32    ? Mem<Dtype::f32>::load(g, i)
                    : d == Dtype::bf16 ? Mem<Dtype::bf16>::load(g, i)
                                       : Mem<Dtype::f16>::load(g, i);
    const double v = static_cast<double>(x);
    acc = __dadd_rn(acc, __dmul_rn(v, v));
  }
  return acc;
}

// The pairwise tree over the 64 lanes of each chunk in sum[]; every thread of the block calls it.
__device__ __forceinline__ void stats_tree(double* sum, unsigned lane) {
  __syncthreads();
  for (unsigned step = 1; step < kernels::kStatsLanes; step *= 2) {
    if (lane % (2 * step) == 0)
      sum[threadIdx.x] = __dadd_rn(sum[threadIdx.x], sum[threadIdx.x + step]);
    __syncthreads();
  }
}

template <Dtype G>
__global__ void stats_lanes_kernel(const void* g, std::size_t n, std::size_t chunks,
                                   double* partial, int* nonfinite) {
  constexpr int L = kernels::kStatsLanes;
  static_assert(256 % L == 0);
  __shared__ double sum[256];
  __shared__ int nonzero[256 / L];
  __shared__ int redo[256 / L];
  __shared__ int any_redo;
  const std::size_t t = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  const std::size_t c = t / L;
  const unsigned lane = threadIdx.x % L;
  const unsigned slot = threadIdx.x / L;
  const std::size_t b = c * kernels::kStatsChunk;
  const std::size_t e = c < chunks ? min(n, b + kernels::kStatsChunk) : b;
  if (threadIdx.x == 0) any_redo = 0;
  if (lane == 0) nonzero[slot] = 0;
  __syncthreads();
  double acc = 0.0;
  if constexpr (G == Dtype::f32) {
    if (c < chunks) acc = stats_exact_lane(g, G, b, e, lane);
  } else if (c < chunks) {
    const auto* h = static_cast<const std::uint16_t*>(g);
    unsigned bits = 0;
    float run = 0.0f;
    if constexpr (G == Dtype::bf16) {
      std::size_t m = 0;
      for (std::size_t blk = b; blk < e; blk += 128, ++m) {
        const std::size_t i0 = blk + 2 * lane;
        for (int q = 1; q >= 0; --q) {  // odd square first, as VDPBF16PS
          const std::size_t i = i0 + q;
          if (i >= e) continue;
          bits |= h[i] & 0x7fffu;
          if ((h[i] & 0x7fffu) >= 0x2000u) {
            const float x = from_bf16(h[i]);
            run = __fadd_rn(run, __fmul_rn(x, x));
          }
        }
        if ((m + 1) % (kernels::kStatsRun / 2) == 0) {
          acc = __dadd_rn(acc, static_cast<double>(run));
          run = 0.0f;
        }
      }
    } else {
      std::size_t m = 0;
      for (std::size_t i = b + lane; i < e; i += L, ++m) {
        bits |= h[i] & 0x7fffu;
        const float x = from_f16(h[i]);
        run = __fmaf_rn(x, x, run);
        if ((m + 1) % kernels::kStatsRun == 0) {
          acc = __dadd_rn(acc, static_cast<double>(run));
          run = 0.0f;
        }
      }
    }
    acc = __dadd_rn(acc, static_cast<double>(run));
    if (bits != 0) atomicOr(&nonzero[slot], 1);
  }
  sum[threadIdx.x] = acc;
  stats_tree(sum, lane);
  double total = sum[threadIdx.x];  // lane 0: the chunk's sum
  if constexpr (G != Dtype::f32) {
    if (lane == 0) {
      redo[slot] =
          c < chunks && (!isfinite(total) || (total < kernels::kStatsExactBelow && nonzero[slot]));
      if (redo[slot]) atomicOr(&any_redo, 1);
    }
    __syncthreads();
    if (any_redo) {  // block-uniform: every thread reaches the tree's barriers
      sum[threadIdx.x] = redo[slot] ? stats_exact_lane(g, G, b, e, lane) : 0.0;
      stats_tree(sum, lane);
      if (redo[slot]) total = sum[threadIdx.x];
    }
  }
  if (lane == 0 && c < chunks) {
    partial[c] = total;
    // As on the CPU: exact squares cannot overflow an fp64 chunk sum, so a non-finite sum means
    // a non-finite value in the chunk.
    if (nonfinite != nullptr) nonfinite[c] = !isfinite(total);
  }
}

__global__ void stats_final_kernel(const double* partial, const int* nonfinite, std::size_t chunks,
                                   double* sum, int* flag) {
  double s = 0.0;
  int f = 0;
  for (std::size_t c = 0; c < chunks; ++c) {
    s = __dadd_rn(s, partial[c]);
    f |= nonfinite[c];
  }
  *sum = s;
  *flag = f;
}

// ---- launch helpers --------------------------------------------------------------------------
constexpr unsigned kBlock = 256;

unsigned grid_for(std::size_t n) {
  const std::size_t blocks = (n + kBlock - 1) / kBlock;
  return static_cast<unsigned>(blocks < 65535 * 32 ? blocks : 65535 * 32);
}

}  // namespace

void adam_step(const AdamConfig& cfg, std::int64_t step, const AdamState& st, const GradView& g,
               const Param16View& p16, std::size_t n, void* stream) {
  const AdamArgs a = kernels::adam_args(cfg, step, st, g, p16, n);
  if (n == 0) return;
  const cudaStream_t cs = as_stream(stream);
  kernels::visit_dtype(a.grad_dtype, [&](auto gt) {
    kernels::visit_moment_dtype(a.moment_dtype, [&](auto mt) {
      kernels::visit_param16(a.param16, a.param16_dtype, [&](auto has, auto pt) {
        adam_kernel<decltype(gt)::value, decltype(mt)::value, decltype(has)::value,
                    decltype(pt)::value><<<grid_for(n), kBlock, 0, cs>>>(a, n);
      });
    });
  });
  check_launch("adam_step");
}

void lion_step(const LionConfig& cfg, float* param, void* exp_avg, Dtype moment_dtype,
               const GradView& g, const Param16View& p16, std::size_t n, void* stream) {
  const LionArgs a = kernels::lion_args(cfg, param, exp_avg, moment_dtype, g, p16, n);
  if (n == 0) return;
  const cudaStream_t cs = as_stream(stream);
  kernels::visit_dtype(a.grad_dtype, [&](auto gt) {
    kernels::visit_moment_dtype(a.moment_dtype, [&](auto mt) {
      kernels::visit_param16(a.param16, a.param16_dtype, [&](auto has, auto pt) {
        lion_kernel<decltype(gt)::value, decltype(mt)::value, decltype(has)::value,
                    decltype(pt)::value><<<grid_for(n), kBlock, 0, cs>>>(a, n);
      });
    });
  });
  check_launch("lion_step");
}

void sgd_step(const SgdConfig& cfg, bool first_step, float* param, float* momentum_buffer,
              const GradView& g, const Param16View& p16, std::size_t n, void* stream) {
  const SgdArgs a = kernels::sgd_args(cfg, first_step, param, momentum_buffer, g, p16, n);
  if (n == 0) return;
  const cudaStream_t cs = as_stream(stream);
  kernels::visit_dtype(a.grad_dtype, [&](auto gt) {
    kernels::visit_param16(a.param16, a.param16_dtype, [&](auto has, auto pt) {
      sgd_kernel<decltype(gt)::value, decltype(has)::value, decltype(pt)::value>
          <<<grid_for(n), kBlock, 0, cs>>>(a, n);
    });
  });
  check_launch("sgd_step");
}

std::size_t grad_stats_workspace_bytes(std::size_t n) noexcept {
  const std::size_t chunks = (n + kernels::kStatsChunk - 1) / kernels::kStatsChunk;
  return chunks * (sizeof(double) + sizeof(int)) + 16;
}

namespace {
// The per-chunk sums (and, when `flags` is set, per-chunk non-finite flags) of `chunks` chunks.
void launch_chunk_sums(const void* grad, Dtype dtype, std::size_t n, std::size_t chunks,
                       double* sums, int* flags, cudaStream_t st, const char* what) {
  const std::size_t threads = chunks * kernels::kStatsLanes;
  const unsigned blocks = static_cast<unsigned>((threads + kBlock - 1) / kBlock);
  kernels::visit_dtype(dtype, [&](auto gd) {
    stats_lanes_kernel<decltype(gd)::value>
        <<<blocks, kBlock, 0, st>>>(grad, n, chunks, sums, flags);
  });
  check_launch(what);
}
}  // namespace

void grad_stats(const void* grad, Dtype dtype, std::size_t n, double* d_sum_sq, int* d_nonfinite,
                void* d_workspace, void* stream) {
  kernels::need(d_sum_sq, "d_sum_sq");
  kernels::need(d_nonfinite, "d_nonfinite");
  const std::size_t chunks = (n + kernels::kStatsChunk - 1) / kernels::kStatsChunk;
  cudaStream_t st = as_stream(stream);
  if (chunks == 0) {
    check(cudaMemsetAsync(d_sum_sq, 0, sizeof(double), st), "grad_stats memset");
    check(cudaMemsetAsync(d_nonfinite, 0, sizeof(int), st), "grad_stats memset");
    return;
  }
  kernels::need(grad, "grad");
  kernels::need(d_workspace, "d_workspace");
  auto* partial = static_cast<double*>(d_workspace);
  auto* flags = reinterpret_cast<int*>(partial + chunks);
  launch_chunk_sums(grad, dtype, n, chunks, partial, flags, st, "grad_stats (lanes)");
  stats_final_kernel<<<1, 1, 0, st>>>(partial, flags, chunks, d_sum_sq, d_nonfinite);
  check_launch("grad_stats (final)");
}

void grad_chunk_sums(const void* grad, Dtype dtype, std::size_t n, double* d_sums, void* stream) {
  const std::size_t chunks = (n + kernels::kStatsChunk - 1) / kernels::kStatsChunk;
  if (chunks == 0) return;
  kernels::need(grad, "grad");
  kernels::need(d_sums, "d_sums");
  launch_chunk_sums(grad, dtype, n, chunks, d_sums, nullptr, as_stream(stream), "grad_chunk_sums");
}

void cast(const void* src, Dtype sd, void* dst, Dtype dd, std::size_t n, void* stream) {
  if (n == 0) return;
  kernels::need(src, "src");
  kernels::need(dst, "dst");
  const cudaStream_t cs = as_stream(stream);
  kernels::visit_dtype(sd, [&](auto from) {
    kernels::visit_dtype(dd, [&](auto to) {
      cast_kernel<decltype(from)::value, decltype(to)::value>
          <<<grid_for(n), kBlock, 0, cs>>>(src, dst, n);
    });
  });
  check_launch("cast");
}

void accumulate(void* acc, Dtype ad, const void* g, Dtype gd, std::size_t n, void* stream) {
  if (n == 0) return;
  kernels::need(acc, "acc");
  kernels::need(g, "grad");
  const cudaStream_t cs = as_stream(stream);
  kernels::visit_dtype(ad, [&](auto a) {
    kernels::visit_dtype(gd, [&](auto gg) {
      accumulate_kernel<decltype(a)::value, decltype(gg)::value>
          <<<grid_for(n), kBlock, 0, cs>>>(acc, g, n);
    });
  });
  check_launch("accumulate");
}

}  // namespace tierswap::cuda
