// The CUDA kernel launchers in a build without CUDA: every call says so.
#include <stdexcept>

#include "tierswap/cuda_kernels.hpp"

namespace tierswap::cuda {
namespace {
[[noreturn]] void no_cuda() {
  throw std::runtime_error("tierswap was built without CUDA (TIERSWAP_WITH_CUDA=OFF or no nvcc)");
}
}  // namespace

void adam_step(const AdamConfig&, std::int64_t, const AdamState&, const GradView&,
               const Param16View&, std::size_t, void*) {
  no_cuda();
}
void lion_step(const LionConfig&, float*, void*, Dtype, const GradView&, const Param16View&,
               std::size_t, void*) {
  no_cuda();
}
void sgd_step(const SgdConfig&, bool, float*, float*, const GradView&, const Param16View&,
              std::size_t, void*) {
  no_cuda();
}
std::size_t grad_stats_workspace_bytes(std::size_t) noexcept {
  return 0;
}
void grad_stats(const void*, Dtype, std::size_t, double*, int*, void*, void*) {
  no_cuda();
}
void grad_chunk_sums(const void*, Dtype, std::size_t, double*, void*) {
  no_cuda();
}
void cast(const void*, Dtype, void*, Dtype, std::size_t, void*) {
  no_cuda();
}
void accumulate(void*, Dtype, const void*, Dtype, std::size_t, void*) {
  no_cuda();
}
}  // namespace tierswap::cuda
