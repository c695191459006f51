// AVX2 + FMA + F16C instance (compiled with -mavx2 -mfma -mf16c, -ffp-contract=off).
#include "kernels/cpu/kernels_impl.hpp"

namespace tierswap::kernels {
const KernelTable* avx2_table() {
  static const KernelTable t = make_table<Avx2>(CpuIsa::avx2);
  return &t;
}
}  // namespace tierswap::kernels
