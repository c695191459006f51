#include <algorithm>
#include <array>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "tierswap/detail/config_table.hpp"
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
    throw_invalid("device_budget", "0",
                  "the simulated device tier needs a capacity (TIERSWAP_DEVICE_BUDGET)");
  if (lookahead < 1 || lookahead > 4096)
    throw_invalid("lookahead", std::to_string(lookahead), "must be in 1..4096");
}

std::uint64_t TierConfig::slab_slack(Tier tier) const {
  const bool dev = tier == Tier::device;
  const std::uint64_t budget = dev ? device_budget : host_budget;
  const std::uint64_t slab = dev ? kDeviceSlabSize : host_slab_size;
  return std::min(2 * slab, budget / 4) + budget / 16;
}

namespace {

using Field = detail::ConfigField<TierConfig>;
using detail::bool_field;

// Every setting of TierConfig, in the configuration page's order.
const std::array<Field, 14> kFields = {{
    detail::size_field<TierConfig, &TierConfig::host_budget>(
        "host_budget", "TIERSWAP_HOST_BUDGET", "1 GiB", "pinned host bytes (tier manager)"),
    detail::size_field<TierConfig, &TierConfig::host_slab_size>(
        "host_slab_size", "TIERSWAP_HOST_SLAB", "64 MiB", "host slab granularity"),
    detail::size_field<TierConfig, &TierConfig::pageable_budget>(
        "pageable_budget", "TIERSWAP_PAGEABLE_BUDGET", "0",
        "host bytes beside the pinned budget for blocks that need no pinning (16-bit gradients of "
        "CPU-stepped sub-groups), unlocked; 0: they share the pinned budget. The one-object setup "
        "and `tierswap.torch` size it to the gradients"),
    bool_field<TierConfig, &TierConfig::lock_host_memory>(
        "lock_host_memory", "TIERSWAP_LOCK_HOST", "true", "pin slabs (cudaHostRegister / mlock)"),
    {"numa_node", "TIERSWAP_NUMA_NODE", "-1", "bind host slabs to a NUMA node (-1: none)",
     [](TierConfig& c, const nlohmann::json& v, const std::string& k) {
       if (!v.is_number_integer()) throw_invalid(k, v.dump(), "expected an integer");
       c.numa_node = detail::json_int<int>(v);
     },
     [](TierConfig& c, const char* n) {
       c.numa_node = static_cast<int>(detail::env_long(n, c.numa_node));
     }},
    {"device_mode", "TIERSWAP_DEVICE_TIER", "`auto`",
     "`auto` (GPU if usable, else simulated when `device_budget` > 0), `gpu`, `simulated`, `off`",
     [](TierConfig& c, const nlohmann::json& v, const std::string& k) {
       c.device_mode = parse_device_mode(detail::json_string(v, k), k);
     },
     [](TierConfig& c, const char* n) {
       if (const char* v = std::getenv(n)) c.device_mode = parse_device_mode(v, n);
     }},
    detail::size_field<TierConfig, &TierConfig::device_budget>(
        "device_budget", "TIERSWAP_DEVICE_BUDGET", "0", "device tier bytes"),
    detail::number_field<TierConfig, &TierConfig::simulated_device_gbps>(
        "simulated_device_gbps", "TIERSWAP_SIM_DEVICE_GBPS", "25",
        "copy bandwidth of the simulated device tier"),
    detail::size_field<TierConfig, &TierConfig::max_dirty_bytes>(
        "max_dirty_bytes", "TIERSWAP_MAX_DIRTY", "256 MiB", "write-behind threshold"),
    detail::count_field<TierConfig, &TierConfig::lookahead>("lookahead", "TIERSWAP_LOOKAHEAD", "2",
                                                            "prefetches in flight"),
    bool_field<TierConfig, &TierConfig::shadow_slots>(
        "shadow_slots", "TIERSWAP_SHADOW", "true",
        "two NVMe extents per block (rollback, crash consistency)"),
    bool_field<TierConfig, &TierConfig::durable>("durable", "TIERSWAP_DURABLE", "true",
                                                 "fdatasync + fsync'd manifest at each commit"),
    {"verify_on_open", "", "true", "checksum every committed block when opening",
     [](TierConfig& c, const nlohmann::json& v, const std::string& k) {
       c.verify_on_open = detail::json_bool(v, k);
     },
     nullptr},
    // TIERSWAP_TELEMETRY is read by the endpoint itself (TelemetryConfig::from_env, when the
    // manager starts it), not here: it can only turn a configured endpoint off.
    {"telemetry", "TIERSWAP_TELEMETRY", "true", "serve the residency snapshot on a Unix socket",
     [](TierConfig& c, const nlohmann::json& v, const std::string& k) {
       c.telemetry = detail::json_bool(v, k);
     },
     nullptr},
}};

}  // namespace

TierConfig TierConfig::from_env() {
  return from_env(TierConfig{});
}

TierConfig TierConfig::from_env(TierConfig c) {
  detail::apply_env<TierConfig>(c, kFields);
  c.validate();
  return c;
}

TierConfig TierConfig::from_json(std::string_view text) {
  auto c = detail::config_from_json<TierConfig>(text, kFields, "tier config");
  c.validate();
  return c;
}

std::vector<Setting> TierConfig::settings() {
  return detail::settings_of<TierConfig>(kFields);
}

}  // namespace tierswap
