// A config struct's settings as one table (internal): each row names the JSON key, the
// environment variable (empty when there is none) and how each sets the field. from_env(),
// from_json(), the "unknown key" message and the README's configuration table (checked by a test)
// all come from it, so a setting is added in one place.
#pragma once

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>

#include "tierswap/detail/env.hpp"
#include "tierswap/error.hpp"

namespace tierswap::detail {

template <class C>
struct ConfigField {
  std::string_view key;  ///< JSON key
  std::string_view env;  ///< environment variable, empty when none
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

/// A field set from a JSON boolean and from a "0"/"1" variable (env_bool).
template <class C, bool C::*M>
ConfigField<C> bool_field(std::string_view key, std::string_view env);

/// A JSON key and its environment variable, for documentation checks.
struct ConfigKey {
  std::string key, env;
};

template <class C, bool C::*M>
ConfigField<C> bool_field(std::string_view key, std::string_view env) {
  return {key, env,
          [](C& c, const nlohmann::json& v, const std::string& k) { c.*M = json_bool(v, k); },
          [](C& c, const char* name) { c.*M = env_bool(name, c.*M); }};
}

}  // namespace tierswap::detail
