// Timing helpers shared by the CLI's benchmarks and demo: a monotonic clock, seconds since a
// point, and the median of repeated measurements (the figures quoted are medians).
#pragma once

#include <algorithm>
#include <vector>

#include "tierswap/detail/clock.hpp"

namespace tierswap::cli {

using detail::Clock;

inline double since(Clock::time_point t0) {
  return detail::seconds_since(t0);
}

/// The upper median for an even count (as every figure in bench/RESULTS.md); 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace tierswap::cli
