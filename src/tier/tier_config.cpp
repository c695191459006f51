#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "tierswap/detail/env.hpp"
#include "tierswap/error.hpp"
#include "tierswap/tier_manager.hpp"
#include "tierswap/units.hpp"

#include <fmt/format.h>
#include "tierswap/detail/json.hpp"

namespace tierswap {

std::string_view to_string(Tier t) noexcept {
  switch (t) {
    case Tier::device:
      return "gpu";
    case Tier::host:
      return "host";
    case Tier::nvme:
      return "nvme";
  }
  return "?";
}

Tier parse_tier(std::string_view s) {
  if (s == "gpu" || s == "device") return Tier::device;
  if (s == "host") return Tier::host;
  if (s == "nvme") return Tier::nvme;
  throw_invalid("tier", s, "expected gpu, host or nvme");
}

namespace {
constexpr std::string_view kClassNames[] = {"master",   "exp_avg", "exp_avg_sq", "max_exp_avg_sq",
                                            "momentum", "grad16",  "param16",    "other"};
}

std::string_view to_string(BlockClass c) noexcept {
  const auto i = static_cast<std::size_t>(c);
  return i < std::size(kClassNames) ? kClassNames[i] : "?";
}

BlockClass parse_block_class(std::string_view s) {
  for (std::size_t i = 0; i < std::size(kClassNames); ++i)
    if (kClassNames[i] == s) return static_cast<BlockClass>(i);
  throw_invalid("class", s,
                "expected master, exp_avg, exp_avg_sq, max_exp_avg_sq, momentum, grad16, param16 "
                "or other");
}

std::string_view to_string(CopyState s) noexcept {
  switch (s) {
    case CopyState::absent:
      return "absent";
    case CopyState::valid:
      return "valid";
    case CopyState::dirty:
      return "dirty";
    case CopyState::reading:
      return "reading";
    case CopyState::writing:
      return "writing";
  }
  return "?";
}

namespace {
DeviceTierMode parse_device_mode(std::string_view s, const std::string& key) {
  if (s == "auto") return DeviceTierMode::automatic;
  if (s == "gpu") return DeviceTierMode::gpu;
  if (s == "simulated") return DeviceTierMode::simulated;
  if (s == "off") return DeviceTierMode::off;
  throw_invalid(key, s, "expected auto, gpu, simulated or off");
}

}  // namespace

void TierConfig::validate() const {
  if (host_budget < 4096)
    throw_invalid("host_budget", std::to_string(host_budget), "must be at least 4 KiB");
  if (host_slab_size < 4096 || host_slab_size % 4096 != 0)
    throw_invalid("host_slab_size", std::to_string(host_slab_size),
                  "must be a multiple of 4096, at least 4 KiB");
  if (numa_node < -1) throw_invalid("numa_node", std::to_string(numa_node), "must be >= -1");
  if (!(simulated_device_gbps > 0))
    throw_invalid("simulated_device_gbps", std::to_string(simulated_device_gbps), "must be > 0");
  if (device_mode == DeviceTierMode::simulated && device_budget == 0)
    throw_invalid("device_budget", "0", "the simulated device tier needs a capacity");
  if (lookahead < 1 || lookahead > 4096)
    throw_invalid("lookahead", std::to_string(lookahead), "must be in 1..4096");
}

std::uint64_t TierConfig::slab_slack(Tier tier) const {
  const bool dev = tier == Tier::device;
  const std::uint64_t budget = dev ? device_budget : host_budget;
  const std::uint64_t slab = dev ? kDeviceSlabSize : host_slab_size;
  return std::min(2 * slab, budget / 4) + budget / 16;
}

TierConfig TierConfig::from_env() {
  return from_env(TierConfig{});
}

TierConfig TierConfig::from_env(TierConfig c) {
  using detail::env_bool, detail::env_double, detail::env_long, detail::env_u64;
  c.host_budget = env_u64("TIERSWAP_HOST_BUDGET", c.host_budget, true);
  c.host_slab_size = env_u64("TIERSWAP_HOST_SLAB", c.host_slab_size, true);
  c.lock_host_memory = env_bool("TIERSWAP_LOCK_HOST", c.lock_host_memory);
  c.numa_node = static_cast<int>(env_long("TIERSWAP_NUMA_NODE", c.numa_node));
  if (const char* v = std::getenv("TIERSWAP_DEVICE_TIER"))
    c.device_mode = parse_device_mode(v, "TIERSWAP_DEVICE_TIER");
  c.device_budget = env_u64("TIERSWAP_DEVICE_BUDGET", c.device_budget, true);
  c.simulated_device_gbps = env_double("TIERSWAP_SIM_DEVICE_GBPS", c.simulated_device_gbps);
  c.max_dirty_bytes = env_u64("TIERSWAP_MAX_DIRTY", c.max_dirty_bytes, true);
  c.lookahead = static_cast<std::uint32_t>(env_u64("TIERSWAP_LOOKAHEAD", c.lookahead, false));
  c.shadow_slots = env_bool("TIERSWAP_SHADOW", c.shadow_slots);
  c.durable = env_bool("TIERSWAP_DURABLE", c.durable);
  c.validate();
  return c;
}

TierConfig TierConfig::from_json(std::string_view text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::invalid_argument(fmt::format("tier config: invalid JSON: {}", e.what()));
  }
  if (!j.is_object()) throw std::invalid_argument("tier config: expected a JSON object");
  TierConfig c;
  auto size_of = [](const nlohmann::json& v, const std::string& key) -> std::uint64_t {
    if (v.is_string()) return parse_size(v.get<std::string>(), key);
    if (!v.is_number_unsigned()) throw_invalid(key, v.dump(), "expected a size");
    return detail::json_int<std::uint64_t>(v);
  };
  auto bool_of = [](const nlohmann::json& v, const std::string& key) {
    if (!v.is_boolean()) throw_invalid(key, v.dump(), "expected true or false");
    return v.get<bool>();
  };
  for (auto& [key, v] : j.items()) {
    if (key == "host_budget") {
      c.host_budget = size_of(v, key);
    } else if (key == "host_slab_size") {
      c.host_slab_size = size_of(v, key);
    } else if (key == "lock_host_memory") {
      c.lock_host_memory = bool_of(v, key);
    } else if (key == "numa_node") {
      if (!v.is_number_integer()) throw_invalid(key, v.dump(), "expected an integer");
      c.numa_node = detail::json_int<int>(v);
    } else if (key == "device_mode") {
      if (!v.is_string()) throw_invalid(key, v.dump(), "expected a string");
      c.device_mode = parse_device_mode(v.get<std::string>(), key);
    } else if (key == "device_budget") {
      c.device_budget = size_of(v, key);
    } else if (key == "simulated_device_gbps") {
      if (!v.is_number()) throw_invalid(key, v.dump(), "expected a number (GB/s)");
      c.simulated_device_gbps = v.get<double>();
    } else if (key == "max_dirty_bytes") {
      c.max_dirty_bytes = size_of(v, key);
    } else if (key == "lookahead") {
      if (!v.is_number_unsigned()) throw_invalid(key, v.dump(), "expected a positive integer");
      c.lookahead = static_cast<std::uint32_t>(
          std::min<std::uint64_t>(detail::json_int<std::uint64_t>(v), 1u << 30));
    } else if (key == "shadow_slots") {
      c.shadow_slots = bool_of(v, key);
    } else if (key == "durable") {
      c.durable = bool_of(v, key);
    } else if (key == "verify_on_open") {
      c.verify_on_open = bool_of(v, key);
    } else if (key == "telemetry") {
      c.telemetry = bool_of(v, key);
    } else {
      throw_invalid(key, v.dump(),
                    "unknown tier config key (known: host_budget, host_slab_size, "
                    "lock_host_memory, numa_node, device_mode, device_budget, "
                    "simulated_device_gbps, max_dirty_bytes, lookahead, shadow_slots, durable, "
                    "verify_on_open, telemetry)");
    }
  }
  c.validate();
  return c;
}

}  // namespace tierswap
