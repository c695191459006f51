// Byte-size and duration parsing and formatting used by configs and the CLI.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tierswap {

/// Parses "4096", "64KiB", "1MiB", "2GiB", "1M" (binary), "10MB"/"1GB" (decimal), "1.5GiB".
/// Throws std::invalid_argument naming `key` and the text on anything else, negative values or
/// overflow.
std::uint64_t parse_size(std::string_view text, std::string_view key = "size");

/// A parameter count: an integer, or a decimal number with K, M, B (or G) or T for 10^3, 10^6,
/// 10^9, 10^12 ("20B", "1.5T", "350M"), as model sizes are named: decimal, unlike byte sizes.
/// Every `--params` of the CLI reads this. std::invalid_argument naming `key`.
std::uint64_t parse_param_count(std::string_view text, std::string_view key = "params");

/// A duration in seconds: a number with s, m, h or d ("90", "90s", "15m", "1.5h", "7d"; no unit:
/// seconds), finite and not negative. std::invalid_argument naming `key` and the text otherwise.
double parse_duration(std::string_view text, std::string_view key = "duration");

/// "45 s", "15 min", "2.5 h", "7 d": the largest unit that leaves at least 1 of it.
std::string format_duration(double seconds);

/// "1.50 GiB", "512 KiB", "17 B".
std::string format_bytes(std::uint64_t bytes);

/// Round `v` up / down to a multiple of `a` (a > 0).
constexpr std::uint64_t round_up(std::uint64_t v, std::uint64_t a) noexcept {
  return (v + a - 1) / a * a;
}
constexpr std::uint64_t round_down(std::uint64_t v, std::uint64_t a) noexcept {
  return v / a * a;
}

inline constexpr std::uint64_t KiB = 1024;
inline constexpr std::uint64_t MiB = 1024 * KiB;
inline constexpr std::uint64_t GiB = 1024 * MiB;

}  // namespace tierswap
