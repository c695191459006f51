// `tierswap bench kernels --device gpu`: the fused optimizer kernels on the GPU against a
// device-to-device copy of the same bytes (the bandwidth probe), and the pinned-memory copy rates
// across the host link.
#pragma once

#include <cstdint>

namespace tierswap::cli {

/// Times the CUDA kernels on `n` parameters, `reps` alternating rounds after one warm-up each,
/// and prints the medians (text, or JSON with `json`). Throws without a usable GPU, saying why.
void run_gpu_kernels(std::uint64_t n, int reps, bool json);

}  // namespace tierswap::cli
