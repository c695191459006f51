// AVX-512 (F, BW, VL, DQ) instance, -ffp-contract=off.
#include "kernels/cpu/kernels_impl.hpp"

namespace tierswap::kernels {
const KernelTable* avx512_table() {
  static const KernelTable t = make_table<Avx512>(CpuIsa::avx512);
  return &t;
}
}  // namespace tierswap::kernels
