// Integers from untrusted JSON (manifests, checkpoints, records, configs, plans, a peer's
// telemetry answer). nlohmann's get<std::uint64_t>() of a float such as 1e300 casts it out of
// range (undefined behaviour: found by fuzzing), and of a negative or too large integer it wraps.
// json_int<T> takes JSON integers only, in T's range, and throws std::invalid_argument otherwise.
// And JSON string literals written fast (json_quoted).
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace tierswap::detail {

template <class T>
T json_int(const nlohmann::json& j) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  using L = std::numeric_limits<T>;
  bool ok = false;
  T v{};
  if (j.is_number_unsigned()) {
    const auto u = j.get<std::uint64_t>();
    ok = u <= static_cast<std::uint64_t>(L::max());
    v = static_cast<T>(u);
  } else if (j.is_number_integer()) {
    const auto s = j.get<std::int64_t>();
    ok = s >= 0 ? static_cast<std::uint64_t>(s) <= static_cast<std::uint64_t>(L::max())
                : L::is_signed && s >= static_cast<std::int64_t>(L::min());
    v = static_cast<T>(s);
  }
  if (!ok)
    throw std::invalid_argument("expected an integer in [" + std::to_string(L::min()) + ", " +
                                std::to_string(L::max()) + "], got " + j.dump());
  return v;
}

/// `text` as a JSON string literal, byte for byte what nlohmann::json(text).dump() writes (which
/// escapes '"', '\\' and control characters, and throws nlohmann::json::type_error for text that
/// is not UTF-8), several times faster on ASCII text: a model's commit record, escaped at every
/// step, lists all its parameters.
std::string json_quoted(std::string_view text);

/// A JSON array of integers (json_int each).
template <class T>
std::vector<T> json_int_vector(const nlohmann::json& j) {
  if (!j.is_array()) throw std::invalid_argument("expected an array of integers, got " + j.dump());
  std::vector<T> out;
  for (const auto& e : j) out.push_back(json_int<T>(e));
  return out;
}

}  // namespace tierswap::detail
