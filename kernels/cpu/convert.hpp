// Scalar 16-bit conversions: the reference every SIMD and CUDA variant matches bit for bit.
// fp32 -> bf16/fp16 round to nearest even; NaN becomes a quiet NaN keeping sign and the top
// payload bits (what F16C's VCVTPS2PH does); fp16 -> fp32 quiets signalling NaNs (as VCVTPH2PS).
#pragma once

#include <cstdint>
#include <cstring>

namespace tierswap::kernels {
namespace {  // internal linkage: see simd.hpp

inline std::uint32_t bits_of(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float float_of(std::uint32_t u) noexcept {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline std::uint16_t to_bf16(float f) noexcept {
  const std::uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float from_bf16(std::uint16_t h) noexcept {
  return float_of(std::uint32_t{h} << 16);
}

inline std::uint16_t to_f16(float f) noexcept {
  const std::uint32_t u = bits_of(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to infinity
  if (a < 0x38800000u) {
    // Below the smallest normal half: let an fp32 add do the rounding at 2^-24 granularity.
    const float r = float_of(a) + 0.5f;
    return static_cast<std::uint16_t>(sign | (bits_of(r) - 0x3f000000u));
  }
  const std::uint32_t odd = (a >> 13) & 1u;
  a += 0xc8000fffu + odd;  // rebias exponent (127 -> 15) and add the rounding bias
  return static_cast<std::uint16_t>(sign | (a >> 13));
}

inline float from_f16(std::uint16_t h) noexcept {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(man) * 5.9604644775390625e-08f;  // man * 2^-24, exact
    return float_of(sign | bits_of(v));
  }
  if (exp == 31) return float_of(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0u));
  return float_of(sign | ((exp + 112u) << 23) | (man << 13));
}

}  // namespace
}  // namespace tierswap::kernels
