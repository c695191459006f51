// Environment overrides shared by the config structs' from_env() (internal). Each throws
// std::invalid_argument naming the variable and its value when the value does not parse.
#pragma once

#include <cstdint>

namespace tierswap::detail {

/// An unsigned integer, or a size with a suffix ("2GiB") when `size`; `fallback` when unset.
std::uint64_t env_u64(const char* name, std::uint64_t fallback, bool size);
/// "0" or "1"; `fallback` when unset.
bool env_bool(const char* name, bool fallback);
/// A signed integer; `fallback` when unset.
long env_long(const char* name, long fallback);
/// A number; `fallback` when unset.
double env_double(const char* name, double fallback);

}  // namespace tierswap::detail
