// The scalar reference instance (compiled without SIMD flags, -ffp-contract=off).
#include "kernels/cpu/kernels_impl.hpp"

namespace tierswap::kernels {
const KernelTable& scalar_table() {
  static const KernelTable t = make_table<Scalar>(CpuIsa::scalar);
  return t;
}
}  // namespace tierswap::kernels
