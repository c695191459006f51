// NEON instance (AArch64), -ffp-contract=off.
#include "kernels/cpu/kernels_impl.hpp"

namespace tierswap::kernels {
const KernelTable* neon_table() {
  static const KernelTable t = make_table<Neon>(CpuIsa::neon);
  return &t;
}
}  // namespace tierswap::kernels
