#include "tierswap/units.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include "tierswap/error.hpp"

#include <fmt/format.h>

namespace tierswap {

std::uint64_t parse_size(std::string_view text, std::string_view key) {
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  if (s.empty()) throw_invalid(key, text, "empty size");
  std::size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) throw_invalid(key, text, "a size starts with a number (e.g. 4096, 64KiB, 2GiB)");
  std::string number(s.substr(0, i));
  std::string unit(s.substr(i));
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "kib")
    mult = 1024.0;
  else if (unit == "m" || unit == "mib")
    mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb")
    mult = 1e3;
  else if (unit == "mb")
    mult = 1e6;
  else if (unit == "gb")
    mult = 1e9;
  else if (unit == "tb")
    mult = 1e12;
  else
    throw_invalid(key, text, "unknown unit (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");

  if (number.find('.') == std::string::npos) {
    std::uint64_t v = 0;
    auto [p, ec] = std::from_chars(number.data(), number.data() + number.size(), v);
    if (ec != std::errc() || p != number.data() + number.size())
      throw_invalid(key, text, "not a number");
    auto m = static_cast<std::uint64_t>(mult);
    if (v != 0 && m > std::numeric_limits<std::uint64_t>::max() / v)
      throw_invalid(key, text, "too large");
    return v * m;
  }
  char* end = nullptr;
  double d = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(d) || d < 0)
    throw_invalid(key, text, "not a number");
  double bytes = d * mult;
  if (bytes >= 18446744073709551615.0) throw_invalid(key, text, "too large");
  if (bytes != std::floor(bytes)) throw_invalid(key, text, "not a whole number of bytes");
  return static_cast<std::uint64_t>(bytes);
}

std::string format_bytes(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  return fmt::format("{:.2f} {}", v, kUnits[u]);
}

double parse_duration(std::string_view text, std::string_view key) {
  const std::string t(text);
  std::size_t used = 0;
  double v = -1;
  try {
    v = std::stod(t, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (t.substr(0, used).find_first_not_of("0123456789.") != std::string::npos) used = 0;
  const std::string unit = t.substr(used);
  static constexpr std::pair<const char*, double> kUnits[] = {
      {"", 1}, {"s", 1}, {"m", 60}, {"h", 3600}, {"d", 86400}};
  for (const auto& [name, mult] : kUnits)
    if (used != 0 && unit == name && std::isfinite(v * mult) && v >= 0) return v * mult;
  throw std::invalid_argument(fmt::format(
      "{} '{}': expected a duration such as 90s, 15m, 12h or 7d (a number: seconds)", key, t));
}

std::string format_duration(double seconds) {
  if (seconds >= 86400) return fmt::format("{:g} d", seconds / 86400);
  if (seconds >= 3600) return fmt::format("{:g} h", seconds / 3600);
  if (seconds >= 60) return fmt::format("{:g} min", seconds / 60);
  return fmt::format("{:g} s", seconds);
}

std::uint64_t parse_param_count(std::string_view text, std::string_view key) {
  const std::string t(text);
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(t, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  double mult = 1;
  const std::string rest = t.substr(used);
  if (rest == "K" || rest == "k")
    mult = 1e3;
  else if (rest == "M")
    mult = 1e6;
  else if (rest == "B" || rest == "G")
    mult = 1e9;
  else if (rest == "T")
    mult = 1e12;
  else if (!rest.empty())
    used = 0;
  if (used == 0 || !(v > 0) || v * mult > 1e15)
    throw std::invalid_argument(fmt::format(
        "{} '{}': expected a parameter count such as 20B, 7.5B, 350M or 1000000", key, t));
  return static_cast<std::uint64_t>(std::llround(v * mult));
}

}  // namespace tierswap
