// Timing helpers shared by the CLI's benchmarks and demo: a monotonic clock, seconds since a
// point, and the median of repeated measurements (the figures quoted are medians).
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace tierswap::cli {

using Clock = std::chrono::steady_clock;

inline double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// The upper median for an even count (as every figure in bench/RESULTS.md); 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace tierswap::cli
