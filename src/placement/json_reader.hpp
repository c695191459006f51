// Reading the placement's JSON files (hardware profiles, plans) key by key: every refusal names
// the file and the key, with what was there ("gpus[0].model: expected a string, got 3").
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tierswap/detail/json.hpp"

namespace tierswap::placement_json {

using nlohmann::json;
inline constexpr std::uint64_t kUnlimited = std::numeric_limits<std::uint64_t>::max();

[[noreturn]] inline void bad(std::string_view origin, const std::string& key,
                             const std::string& why) {
  throw std::invalid_argument(fmt::format("{}: {}: {}", origin, key, why));
}

// Reads the keys of `obj` (at `path` in the file); finish() refuses any key not read.
struct Reader {
  std::string_view origin;
  std::string path;
  const json& obj;
  std::vector<std::string> seen;

  Reader(std::string_view o, std::string p, const json& j) : origin(o), path(std::move(p)), obj(j) {
    if (!obj.is_object()) bad(origin, path.empty() ? "(top level)" : path, "expected an object");
  }
  std::string key(const char* k) const { return path.empty() ? k : path + "." + k; }
  const json* get(const char* k, bool required) {
    seen.emplace_back(k);
    auto it = obj.find(k);
    if (it == obj.end()) {
      if (required) bad(origin, key(k), "missing");
      return nullptr;
    }
    return &*it;
  }
  double num(const char* k, double def, bool required = false) {
    const json* v = get(k, required);
    if (!v) return def;
    if (!v->is_number()) bad(origin, key(k), fmt::format("expected a number, got {}", v->dump()));
    const double d = v->get<double>();
    if (!(d >= 0)) bad(origin, key(k), fmt::format("must be >= 0, got {}", v->dump()));
    return d;
  }
  std::uint64_t bytes(const char* k, std::uint64_t def, bool required = false) {
    const json* v = get(k, required);
    if (!v) return def;
    if (v->is_string() && v->get<std::string>() == "unlimited") return kUnlimited;
    if (!v->is_number_unsigned())
      bad(origin, key(k),
          fmt::format("expected a byte count (or \"unlimited\"), got {}", v->dump()));
    return v->get<std::uint64_t>();
  }
  std::uint64_t count(const char* k, std::uint64_t def, bool required = false) {
    const json* v = get(k, required);
    if (!v) return def;
    if (!v->is_number_unsigned())
      bad(origin, key(k), fmt::format("expected a count (a whole number >= 0), got {}", v->dump()));
    return v->get<std::uint64_t>();
  }
  int integer(const char* k, int def, bool required = false) {
    const json* v = get(k, required);
    if (!v) return def;
    if (!v->is_number_integer())
      bad(origin, key(k), fmt::format("expected an integer, got {}", v->dump()));
    try {
      return detail::json_int<int>(*v);
    } catch (const std::invalid_argument& e) {
      bad(origin, key(k), e.what());
    }
  }
  bool boolean(const char* k, bool def, bool required = false) {
    const json* v = get(k, required);
    if (!v) return def;
    if (!v->is_boolean())
      bad(origin, key(k), fmt::format("expected true or false, got {}", v->dump()));
    return v->get<bool>();
  }
  std::string str(const char* k, std::string def, bool required = false) {
    const json* v = get(k, required);
    if (!v) return def;
    if (!v->is_string()) bad(origin, key(k), fmt::format("expected a string, got {}", v->dump()));
    return v->get<std::string>();
  }
  const json& array(const char* k) {
    const json* v = get(k, false);
    static const json empty = json::array();
    if (!v) return empty;
    if (!v->is_array()) bad(origin, key(k), "expected an array");
    return *v;
  }
  void finish() const {
    for (auto it = obj.begin(); it != obj.end(); ++it)
      if (std::find(seen.begin(), seen.end(), it.key()) == seen.end())
        bad(origin, key(it.key().c_str()), "unknown key");
  }
};

}  // namespace tierswap::placement_json
