// Kernel test inputs shared by the GoogleTest suite and the standalone NEON check (header-only,
// no test framework: tests/kernels/cross/arm_vs_scalar.cpp is built by a cross compiler).
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace tierswap::test {

inline float float_from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Random floats with a sprinkling of zeros, -0, subnormals, huge values, inf and NaN.
inline std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float scale,
                                        bool specials) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) {
    x = d(rng);
    if (specials) {
      switch (rng() % 64) {
        case 0:
          x = 0.0f;
          break;
        case 1:
          x = -0.0f;
          break;
        case 2:
          x = float_from_bits(static_cast<std::uint32_t>(rng() % 0x7fffff) + 1);
          break;  // subnormal
        case 3:
          x = std::numeric_limits<float>::infinity();
          break;
        case 4:
          x = std::numeric_limits<float>::quiet_NaN();
          break;
        case 5:
          x = 70000.0f;
          break;  // above fp16's range
        case 6:
          x = float_from_bits(0xff800001u);
          break;  // signalling NaN, negative
        default:
          break;
      }
    }
  }
  return v;
}

}  // namespace tierswap::test
