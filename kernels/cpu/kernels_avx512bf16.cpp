// AVX-512 with AVX512-BF16: the AVX-512 table with the bf16 statistics pass on VDPBF16PS. Only
// that function is compiled here; the rest of the table is the AVX-512 one.
#include "kernels/cpu/kernels_impl.hpp"

namespace tierswap::kernels {
const KernelTable* avx512bf16_table() {
  static const KernelTable t = [] {
    KernelTable k = *avx512_table();
    k.isa = CpuIsa::avx512bf16;
    k.stats16 = &Impl<Avx512Bf16>::stats16;
    k.stats16_streams = Impl<Avx512Bf16>::kStreams;
    return k;
  }();
  return &t;
}
}  // namespace tierswap::kernels
