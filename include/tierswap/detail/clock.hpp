// The monotonic clock the library times itself with, and seconds since a point on it (internal).
#pragma once

#include <chrono>

namespace tierswap::detail {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace tierswap::detail
