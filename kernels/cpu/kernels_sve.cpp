// SVE instance for one vector length, -ffp-contract=off. CMake builds this file once per length
// (TIERSWAP_SVE_BITS = 128, 256, 512 with -msve-vector-bits=N); each defines sve<N>_table().
#include "kernels/cpu/kernels_impl.hpp"

#if !defined(TIERSWAP_SIMD_SVE) || TIERSWAP_SVE_BITS != __ARM_FEATURE_SVE_BITS
#error "kernels_sve.cpp needs -march=...+sve -msve-vector-bits=N and TIERSWAP_SVE_BITS=N"
#endif

#define TIERSWAP_SVE_CAT2(a, b, c) a##b##c
#define TIERSWAP_SVE_CAT(a, b, c) TIERSWAP_SVE_CAT2(a, b, c)

namespace tierswap::kernels {
const KernelTable* TIERSWAP_SVE_CAT(sve, TIERSWAP_SVE_BITS, _table)() {
  static const KernelTable t = make_table<Sve>(CpuIsa::sve);
  return &t;
}
}  // namespace tierswap::kernels
