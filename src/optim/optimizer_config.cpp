// OptimizerConfig from the environment and from JSON (unknown keys and bad values are errors
// naming the key).
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "src/optim/optimizer_impl.hpp"
#include "tierswap/detail/env.hpp"
#include "tierswap/detail/json.hpp"
#include "tierswap/error.hpp"
#include "tierswap/optimizer.hpp"
#include "tierswap/units.hpp"

namespace tierswap {
namespace {

OptimizerConfig::StateTier parse_state_tier(std::string_view s, const std::string& key) {
  if (s == "auto") return OptimizerConfig::StateTier::automatic;
  if (s == "host") return OptimizerConfig::StateTier::host;
  if (s == "nvme") return OptimizerConfig::StateTier::nvme;
  throw_invalid(key, s, "expected auto, host or nvme");
}

LossScaling parse_scaling(std::string_view s, const std::string& key) {
  if (s == "none") return LossScaling::none;
  if (s == "fixed") return LossScaling::fixed;
  if (s == "dynamic") return LossScaling::dynamic;
  throw_invalid(key, s, "expected none, fixed or dynamic");
}

Tier parse_grad_tier(std::string_view s, const std::string& key) {
  if (s == "host") return Tier::host;
  if (s == "nvme") return Tier::nvme;
  throw_invalid(key, s, "expected host or nvme");
}

}  // namespace

OptimizerConfig OptimizerConfig::from_env() {
  return from_env(OptimizerConfig{});
}

OptimizerConfig OptimizerConfig::from_env(OptimizerConfig c) {
  using detail::env_bool, detail::env_double, detail::env_u64;
  c.subgroup_size = env_u64("TIERSWAP_SUBGROUP_SIZE", c.subgroup_size, true);
  c.prefetch_depth =
      static_cast<std::uint32_t>(env_u64("TIERSWAP_PREFETCH_DEPTH", c.prefetch_depth, false));
  c.accumulate_fp32 = env_bool("TIERSWAP_ACCUMULATE_FP32", c.accumulate_fp32);
  c.bf16_moments = env_bool("TIERSWAP_BF16_MOMENTS", c.bf16_moments);
  if (const char* v = std::getenv("TIERSWAP_STATE_TIER"))
    c.state_tier = parse_state_tier(v, "TIERSWAP_STATE_TIER");
  if (const char* v = std::getenv("TIERSWAP_GRAD_TIER"))
    c.grad_tier = parse_grad_tier(v, "TIERSWAP_GRAD_TIER");
  c.coalesce = env_bool("TIERSWAP_COALESCE", c.coalesce);
  c.overlap = env_bool("TIERSWAP_OVERLAP", c.overlap);
  c.persist_resident_state = env_bool("TIERSWAP_PERSIST_RESIDENT_STATE", c.persist_resident_state);
  c.overlap_param16_in_place =
      env_bool("TIERSWAP_OVERLAP_PARAM16_IN_PLACE", c.overlap_param16_in_place);
  c.concurrent_gpu_step = env_bool("TIERSWAP_CONCURRENT_GPU_STEP", c.concurrent_gpu_step);
  if (const char* v = std::getenv("TIERSWAP_PLAN")) c.plan_file = v;
  c.max_grad_norm = env_double("TIERSWAP_MAX_GRAD_NORM", c.max_grad_norm);
  c.validate();
  return c;
}

OptimizerConfig OptimizerConfig::from_json(std::string_view text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::invalid_argument(fmt::format("optimizer config: invalid JSON: {}", e.what()));
  }
  if (!j.is_object()) throw std::invalid_argument("optimizer config: expected a JSON object");
  OptimizerConfig c;
  auto bool_of = [](const nlohmann::json& v, const std::string& key) {
    if (!v.is_boolean()) throw_invalid(key, v.dump(), "expected true or false");
    return v.get<bool>();
  };
  auto num_of = [](const nlohmann::json& v, const std::string& key) {
    if (!v.is_number()) throw_invalid(key, v.dump(), "expected a number");
    return v.get<double>();
  };
  auto str_of = [](const nlohmann::json& v, const std::string& key) {
    if (!v.is_string()) throw_invalid(key, v.dump(), "expected a string");
    return v.get<std::string>();
  };
  for (auto& [key, v] : j.items()) {
    if (key == "subgroup_size") {
      if (v.is_string())
        c.subgroup_size = parse_size(v.get<std::string>(), key);
      else if (v.is_number_unsigned())
        c.subgroup_size = detail::json_int<std::uint64_t>(v);
      else
        throw_invalid(key, v.dump(), "expected a count (number or \"16M\")");
    } else if (key == "prefetch_depth") {
      if (!v.is_number_unsigned()) throw_invalid(key, v.dump(), "expected an integer >= 0");
      c.prefetch_depth = static_cast<std::uint32_t>(
          std::min<std::uint64_t>(detail::json_int<std::uint64_t>(v), 1u << 20));
    } else if (key == "accumulate_fp32") {
      c.accumulate_fp32 = bool_of(v, key);
    } else if (key == "bf16_moments") {
      c.bf16_moments = bool_of(v, key);
    } else if (key == "state_tier") {
      c.state_tier = parse_state_tier(str_of(v, key), key);
    } else if (key == "grad_tier") {
      c.grad_tier = parse_grad_tier(str_of(v, key), key);
    } else if (key == "coalesce") {
      c.coalesce = bool_of(v, key);
    } else if (key == "overlap") {
      c.overlap = bool_of(v, key);
    } else if (key == "persist_resident_state") {
      c.persist_resident_state = bool_of(v, key);
    } else if (key == "overlap_param16_in_place") {
      c.overlap_param16_in_place = bool_of(v, key);
    } else if (key == "concurrent_gpu_step") {
      c.concurrent_gpu_step = bool_of(v, key);
    } else if (key == "plan") {
      c.plan_file = str_of(v, key);
    } else if (key == "max_grad_norm") {
      c.max_grad_norm = num_of(v, key);
    } else if (key == "loss_scaler") {
      if (!v.is_object()) throw_invalid(key, v.dump(), "expected an object");
      for (auto& [k2, v2] : v.items()) {
        const std::string name = "loss_scaler." + k2;
        if (k2 == "mode")
          c.loss_scaler.mode = parse_scaling(str_of(v2, name), name);
        else if (k2 == "init_scale")
          c.loss_scaler.init_scale = num_of(v2, name);
        else if (k2 == "growth_factor")
          c.loss_scaler.growth_factor = num_of(v2, name);
        else if (k2 == "backoff_factor")
          c.loss_scaler.backoff_factor = num_of(v2, name);
        else if (k2 == "growth_interval") {
          if (!v2.is_number_unsigned()) throw_invalid(name, v2.dump(), "expected an integer");
          c.loss_scaler.growth_interval = detail::json_int<std::uint32_t>(v2);
        } else
          throw_invalid(name, v2.dump(),
                        "unknown key (known: mode, init_scale, growth_factor, backoff_factor, "
                        "growth_interval)");
      }
    } else {
      throw_invalid(
          key, v.dump(),
          "unknown optimizer config key (known: subgroup_size, prefetch_depth, "
          "accumulate_fp32, bf16_moments, state_tier, grad_tier, coalesce, overlap, plan, "
          "persist_resident_state, overlap_param16_in_place, concurrent_gpu_step, max_grad_norm, "
          "loss_scaler)");
    }
  }
  c.validate();
  return c;
}

// ---- validation and names (moved from optimizer.cpp) ----

std::string_view to_string(OptimizerKind k) noexcept {
  switch (k) {
    case OptimizerKind::adamw:
      return "adamw";
    case OptimizerKind::adam:
      return "adam";
    case OptimizerKind::lion:
      return "lion";
    case OptimizerKind::sgd:
      return "sgd";
  }
  return "?";
}

OptimizerKind parse_optimizer_kind(std::string_view t) {
  if (t == "adamw") return OptimizerKind::adamw;
  if (t == "adam") return OptimizerKind::adam;
  if (t == "lion") return OptimizerKind::lion;
  if (t == "sgd") return OptimizerKind::sgd;
  throw std::invalid_argument(
      fmt::format("optimizer '{}': expected adamw, adam, lion or sgd", std::string(t)));
}

void GroupConfig::validate() const {
  switch (kind) {
    case OptimizerKind::adamw:
    case OptimizerKind::adam:
      adam_config(*this).validate();
      break;
    case OptimizerKind::lion:
      lion_config(*this).validate();
      break;
    case OptimizerKind::sgd:
      sgd_config(*this).validate();
      break;
  }
}

GroupConfig GroupConfig::defaults(OptimizerKind kind) {
  GroupConfig c;
  c.kind = kind;
  switch (kind) {
    case OptimizerKind::adamw:
      break;
    case OptimizerKind::adam:
      c.weight_decay = 0.0;
      break;
    case OptimizerKind::lion:
      c.lr = 1e-4;
      c.beta2 = 0.99;
      c.weight_decay = 0.0;
      break;
    case OptimizerKind::sgd:
      c.weight_decay = 0.0;
      break;
  }
  return c;
}

void LossScalerConfig::validate() const {
  if (mode == LossScaling::none) return;
  if (!(init_scale > 0) || !std::isfinite(init_scale))
    throw_invalid("loss_scaler.init_scale", std::to_string(init_scale), "must be finite and > 0");
  if (!(growth_factor > 1))
    throw_invalid("loss_scaler.growth_factor", std::to_string(growth_factor), "must be > 1");
  if (!(backoff_factor > 0 && backoff_factor < 1))
    throw_invalid("loss_scaler.backoff_factor", std::to_string(backoff_factor),
                  "must be in (0, 1)");
  if (growth_interval == 0) throw_invalid("loss_scaler.growth_interval", "0", "must be > 0");
}

void OptimizerConfig::validate() const {
  if (subgroup_size == 0) throw_invalid("subgroup_size", "0", "must be > 0");
  if (subgroup_size > (std::uint64_t{1} << 30))
    throw_invalid("subgroup_size", std::to_string(subgroup_size), "must be at most 2^30 elements");
  if (prefetch_depth > 64)
    throw_invalid("prefetch_depth", std::to_string(prefetch_depth), "must be at most 64");
  if (grad_tier == Tier::device)
    throw_invalid("grad_tier", "gpu", "gradients are kept in host memory or on NVMe");
  if (!(max_grad_norm >= 0) || !std::isfinite(max_grad_norm))
    throw_invalid("max_grad_norm", std::to_string(max_grad_norm), "must be finite and >= 0");
  loss_scaler.validate();
}

}  // namespace tierswap
