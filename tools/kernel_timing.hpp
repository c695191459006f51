// What `bench kernels` times, on the CPU (bench_kernels.cpp) and on the GPU
// (bench_kernels_gpu.cpp): a kernel with its traffic per parameter and its times, and the
// alternating repetitions figures are medians of.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tools/timing.hpp"

namespace tierswap::cli {

// A kernel of the bench: its traffic per parameter, and its times.
struct Kernel {
  std::string name;
  double bytes_per_param;
  std::function<void()> fn;
  std::vector<double> seconds;
};

// One warm-up call each, then `reps` rounds of every kernel in turn (alternating).
inline void time_kernels(std::vector<Kernel>& ks, int reps) {
  for (auto& k : ks) k.fn();  // warm-up: caches, page tables, thread wake-up paths, clocks
  for (int r = 0; r < reps; ++r) {
    for (auto& k : ks) {
      const auto t0 = Clock::now();
      k.fn();
      k.seconds.push_back(since(t0));
    }
  }
}

}  // namespace tierswap::cli
