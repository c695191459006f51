// A config struct's settings as one table (internal): each row names the JSON key, the
// environment variable (empty when there is none), the default and meaning the documentation
// shows, and how the key and the variable set the field. from_env(), from_json(), the "unknown
// key" message, settings() and the configuration page's table (`tierswap config --settings`)
// all come from it, so a setting is added in one place.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tierswap/detail/env.hpp"
#include "tierswap/detail/json.hpp"
#include "tierswap/error.hpp"
#include "tierswap/setting.hpp"
#include "tierswap/units.hpp"

namespace tierswap::detail {

template <class C>
struct ConfigField {
  std::string_view key;            ///< JSON key
  std::string_view env;            ///< environment variable, empty when none
  std::string_view shown_default;  ///< the default as the documentation shows it (Markdown)
  std::string_view meaning;        ///< what it does, its values and range (Markdown)
  void (*from_json)(C&, const nlohmann::json& value, const std::string& key);
  void (*from_env)(C&, const char* name);  ///< reads `name` (null when env is empty)
};

/// The known keys, comma-separated, for an "unknown key" message.
template <class C>
std::string known_keys(std::span<const ConfigField<C>> table) {
  std::string out;
  for (const auto& f : table) {
    if (!out.empty()) out += ", ";
    out += f.key;
  }
  return out;
}

/// Every field as a Setting, in table order (settings()).
template <class C>
std::vector<Setting> settings_of(std::span<const ConfigField<C>> table) {
  std::vector<Setting> out;
  for (const auto& f : table)
    out.push_back({std::string(f.key), std::string(f.env), std::string(f.shown_default),
                   std::string(f.meaning)});
  return out;
}

/// `text` parsed as a JSON object; anything else throws std::invalid_argument beginning with
/// `what` ("tier config: invalid JSON: ...").
inline nlohmann::json parse_config_object(std::string_view text, std::string_view what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::invalid_argument(std::string(what) + ": invalid JSON: " + e.what());
  }
  if (!j.is_object()) throw std::invalid_argument(std::string(what) + ": expected a JSON object");
  return j;
}

/// Every field with an environment variable set in the environment, applied to c.
template <class C>
void apply_env(C& c, std::span<const ConfigField<C>> table) {
  for (const auto& f : table)
    if (!f.env.empty() && f.from_env != nullptr) f.from_env(c, std::string(f.env).c_str());
}

/// Every key of the JSON object j applied to c; an unknown key throws naming it and the known
/// ones (`what`: "optimizer config").
template <class C>
void apply_json(C& c, std::span<const ConfigField<C>> table, const nlohmann::json& j,
                std::string_view what) {
  for (auto& [key, v] : j.items()) {
    const ConfigField<C>* field = nullptr;
    for (const auto& f : table)
      if (f.key == key) field = &f;
    if (field == nullptr)
      throw_invalid(
          key, v.dump(),
          std::string("unknown ") + std::string(what) + " key (known: " + known_keys(table) + ")");
    field->from_json(c, v, key);
  }
}

/// A default C with the keys of the JSON object `text` applied (apply_json); `what` names the
/// struct in errors ("tier config").
template <class C>
C config_from_json(std::string_view text, std::span<const ConfigField<C>> table,
                   std::string_view what) {
  C c;
  apply_json<C>(c, table, parse_config_object(text, what), what);
  return c;
}

// Typed readers for a field's JSON value; each throws naming the key.
inline bool json_bool(const nlohmann::json& v, const std::string& key) {
  if (!v.is_boolean()) throw_invalid(key, v.dump(), "expected true or false");
  return v.get<bool>();
}
inline double json_number(const nlohmann::json& v, const std::string& key) {
  if (!v.is_number()) throw_invalid(key, v.dump(), "expected a number");
  return v.get<double>();
}
inline std::string json_string(const nlohmann::json& v, const std::string& key) {
  if (!v.is_string()) throw_invalid(key, v.dump(), "expected a string");
  return v.get<std::string>();
}

/// A byte count: a JSON number or size string ("1GiB"), a variable parsed as a size.
inline std::uint64_t json_size(const nlohmann::json& v, const std::string& key) {
  if (v.is_string()) return parse_size(v.get<std::string>(), key);
  if (!v.is_number_unsigned())
    throw_invalid(key, v.dump(), "expected a size (a number or a string like \"8GiB\")");
  return json_int<std::uint64_t>(v);
}
/// A count: a non-negative JSON integer, capped at 2^30 (validate() then names the range).
inline std::uint32_t json_count(const nlohmann::json& v, const std::string& key) {
  if (!v.is_number_unsigned()) throw_invalid(key, v.dump(), "expected a non-negative integer");
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(json_int<std::uint64_t>(v), 1u << 30));
}

/// An element count: a non-negative JSON integer or a string in the CLI's count grammar
/// (parse_param_count: "8M" = 8,000,000, as `--sub-group` reads it), not the byte-size grammar.
inline std::uint64_t json_elements(const nlohmann::json& v, const std::string& key) {
  if (v.is_string()) return parse_param_count(v.get<std::string>(), key);
  if (!v.is_number_unsigned())
    throw_invalid(key, v.dump(), "expected an element count (a number or a string like \"8M\")");
  return json_int<std::uint64_t>(v);
}

/// A field set from a JSON boolean and from a "0"/"1" variable (env_bool).
template <class C, bool C::*M>
ConfigField<C> bool_field(std::string_view key, std::string_view env, std::string_view shown,
                          std::string_view meaning) {
  return {key,
          env,
          shown,
          meaning,
          [](C& c, const nlohmann::json& v, const std::string& k) { c.*M = json_bool(v, k); },
          [](C& c, const char* name) { c.*M = env_bool(name, c.*M); }};
}

/// A byte count (json_size; the variable through env_u64 as a size).
template <class C, std::uint64_t C::*M>
ConfigField<C> size_field(std::string_view key, std::string_view env, std::string_view shown,
                          std::string_view meaning) {
  return {key,
          env,
          shown,
          meaning,
          [](C& c, const nlohmann::json& v, const std::string& k) { c.*M = json_size(v, k); },
          [](C& c, const char* n) { c.*M = env_u64(n, c.*M, true); }};
}

/// An element count (json_elements; the variable in the same grammar).
template <class C, std::uint64_t C::*M>
ConfigField<C> elements_field(std::string_view key, std::string_view env, std::string_view shown,
                              std::string_view meaning) {
  return {key,
          env,
          shown,
          meaning,
          [](C& c, const nlohmann::json& v, const std::string& k) { c.*M = json_elements(v, k); },
          [](C& c, const char* n) {
            if (const char* v = std::getenv(n)) c.*M = parse_param_count(v, n);
          }};
}

/// A count (json_count; the variable through env_u64, capped like it).
template <class C, std::uint32_t C::*M>
ConfigField<C> count_field(std::string_view key, std::string_view env, std::string_view shown,
                           std::string_view meaning) {
  return {key,
          env,
          shown,
          meaning,
          [](C& c, const nlohmann::json& v, const std::string& k) { c.*M = json_count(v, k); },
          [](C& c, const char* n) {
            c.*M = static_cast<std::uint32_t>(
                std::min<std::uint64_t>(env_u64(n, c.*M, false), 1u << 30));
          }};
}

/// A string, from a JSON string or the variable as it is (its grammar is validate()'s to check).
template <class C, std::string C::*M>
ConfigField<C> string_field(std::string_view key, std::string_view env, std::string_view shown,
                            std::string_view meaning) {
  return {key,
          env,
          shown,
          meaning,
          [](C& c, const nlohmann::json& v, const std::string& k) { c.*M = json_string(v, k); },
          [](C& c, const char* n) {
            if (const char* v = std::getenv(n)) c.*M = v;
          }};
}

/// A real number (its range is the struct's validate()'s to check).
template <class C, double C::*M>
ConfigField<C> number_field(std::string_view key, std::string_view env, std::string_view shown,
                            std::string_view meaning) {
  return {key,
          env,
          shown,
          meaning,
          [](C& c, const nlohmann::json& v, const std::string& k) {
            if (!v.is_number()) throw_invalid(k, v.dump(), "expected a number");
            c.*M = v.get<double>();
          },
          [](C& c, const char* n) { c.*M = env_double(n, c.*M); }};
}

}  // namespace tierswap::detail
