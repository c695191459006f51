// The fused optimizer kernels on a CUDA device, with the same semantics and the same fp32
// operations as the CPU kernels (kernels.hpp), so results are bit-identical to the scalar
// reference. All data pointers are device pointers (or host memory the device can address);
// `stream` is a cudaStream_t passed as void*; null means the calling thread's default stream
// (cudaStreamPerThread), so work issued by different threads (the tier manager's copies, the
// optimizer's step) does not serialize on the legacy default stream. Launches are
// stream-ordered and never synchronize; errors from the launch are thrown as std::runtime_error.
// In a build without CUDA every function throws std::runtime_error saying so. Memory, copies,
// streams and buffers are cuda_runtime.hpp's (included here).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tierswap/cuda_runtime.hpp"
#include "tierswap/kernels.hpp"

namespace tierswap::cuda {

void adam_step(const AdamConfig& cfg, std::int64_t step, const AdamState& state,
               const GradView& grad, const Param16View& p16, std::size_t n, void* stream);
void lion_step(const LionConfig& cfg, float* param, void* exp_avg, Dtype moment_dtype,
               const GradView& grad, const Param16View& p16, std::size_t n, void* stream);
void sgd_step(const SgdConfig& cfg, bool first_step, float* param, float* momentum_buffer,
              const GradView& grad, const Param16View& p16, std::size_t n, void* stream);

/// Device scratch grad_stats() needs for n values. (grad_stats is the whole-tensor form, kept for
/// callers that want one norm and for the tests' check against the CPU; the optimizer itself uses
/// grad_chunk_sums, whose partial sums it combines across sub-groups and ranks.)
std::size_t grad_stats_workspace_bytes(std::size_t n) noexcept;
/// Writes the sum of squares (same fixed order as the CPU: bit-identical) to *d_sum_sq and the
/// non-finite flag (0/1) to *d_nonfinite, both device memory.
void grad_stats(const void* grad, Dtype dtype, std::size_t n, double* d_sum_sq, int* d_nonfinite,
                void* d_workspace, void* stream);
/// The per-chunk sums grad_stats() adds up, as kernels.hpp's grad_chunk_sums (bit for bit):
/// d_sums[c] for chunk c < ceil(n / kGradStatsChunk), device memory. No workspace needed.
void grad_chunk_sums(const void* grad, Dtype dtype, std::size_t n, double* d_sums, void* stream);
void cast(const void* src, Dtype src_dtype, void* dst, Dtype dst_dtype, std::size_t n,
          void* stream);
void accumulate(void* acc, Dtype acc_dtype, const void* grad, Dtype grad_dtype, std::size_t n,
                void* stream);

}  // namespace tierswap::cuda
