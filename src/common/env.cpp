#include "tierswap/detail/env.hpp"

#include <cstdlib>
#include <string_view>

#include "tierswap/error.hpp"
#include "tierswap/units.hpp"

namespace tierswap::detail {

std::uint64_t env_u64(const char* name, std::uint64_t fallback, bool size) {
  const char* v = std::getenv(name);
  if (v == nullptr) return fallback;
  if (size) return parse_size(v, name);
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v, &end, 10);
  if (end == v || *end != '\0' || *v == '-')
    throw_invalid(name, v, "expected a non-negative integer");
  return x;
}

bool env_bool(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr) return fallback;
  const std::string_view s(v);
  if (s == "1") return true;
  if (s == "0") return false;
  throw_invalid(name, s, "expected 0 or 1");
}

long env_long(const char* name, long fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0') throw_invalid(name, v, "expected an integer");
  return x;
}

double env_double(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr) return fallback;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  if (end == v || *end != '\0') throw_invalid(name, v, "expected a number");
  return x;
}

}  // namespace tierswap::detail
