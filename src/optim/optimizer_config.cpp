// OptimizerConfig from the environment and from JSON (unknown keys and bad values are errors
// naming the key).
#include <fmt/format.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "src/optim/optimizer_impl.hpp"
#include "tierswap/detail/config_table.hpp"
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

// ---- the settings table ----------------------------------------------------------------------
using detail::json_number, detail::json_string;
using Field = detail::ConfigField<OptimizerConfig>;
using detail::bool_field;

void loss_scaler_json(OptimizerConfig& c, const nlohmann::json& v, const std::string& key) {
  if (!v.is_object()) throw_invalid(key, v.dump(), "expected an object");
  for (auto& [k2, v2] : v.items()) {
    const std::string name = key + "." + k2;
    if (k2 == "mode")
      c.loss_scaler.mode = parse_scaling(json_string(v2, name), name);
    else if (k2 == "init_scale")
      c.loss_scaler.init_scale = json_number(v2, name);
    else if (k2 == "growth_factor")
      c.loss_scaler.growth_factor = json_number(v2, name);
    else if (k2 == "backoff_factor")
      c.loss_scaler.backoff_factor = json_number(v2, name);
    else if (k2 == "growth_interval") {
      if (!v2.is_number_unsigned()) throw_invalid(name, v2.dump(), "expected an integer");
      c.loss_scaler.growth_interval = detail::json_int<std::uint32_t>(v2);
    } else
      throw_invalid(name, v2.dump(),
                    "unknown key (known: mode, init_scale, growth_factor, backoff_factor, "
                    "growth_interval)");
  }
}

// Every setting of OptimizerConfig, in the configuration page's order.
const std::array<Field, 16> kFields = {{
    // Elements, read with the count grammar ("8M" = 8,000,000, as --sub-group reads it).
    detail::elements_field<OptimizerConfig, &OptimizerConfig::subgroup_size>(
        "subgroup_size", "TIERSWAP_SUBGROUP_SIZE", "8Mi",
        "elements per optimizer sub-group, a count as `--sub-group` reads it (`\"4M\"` = "
        "4,000,000; rounded up to 8192; ≤ 2^30)"),
    detail::count_field<OptimizerConfig, &OptimizerConfig::prefetch_depth>(
        "prefetch_depth", "TIERSWAP_PREFETCH_DEPTH", "2",
        "sub-groups of state read ahead (fewer if the host budget cannot hold them)"),
    bool_field<OptimizerConfig, &OptimizerConfig::alternate_step_order>(
        "alternate_step_order", "TIERSWAP_ALTERNATE_STEP_ORDER", "true",
        "step the sub-groups in ascending and descending order in turn, so a step starts with the "
        "state the budget still holds from the last one (state streamed from NVMe: reads only what "
        "the budget does not hold; the same bits); false: ascending every step"),
    bool_field<OptimizerConfig, &OptimizerConfig::accumulate_fp32>(
        "accumulate_fp32", "TIERSWAP_ACCUMULATE_FP32", "false",
        "accumulate gradients in fp32 instead of the 16-bit dtype"),
    bool_field<OptimizerConfig, &OptimizerConfig::bf16_moments>(
        "bf16_moments", "TIERSWAP_BF16_MOMENTS", "false",
        "store moments in bf16: 16 B/param of NVMe traffic per step instead of 24, 1.53x faster "
        "steps on NVMe; changes results (measured on the small LM over 300 steps: loss per step "
        "within 0.23% median, 3.3% at most, final loss +0.11%; bench/RESULTS.md)"),
    {"state_tier", "TIERSWAP_STATE_TIER", "`auto`", "`auto`, `host`, `nvme`",
     [](OptimizerConfig& c, const nlohmann::json& v, const std::string& k) {
       c.state_tier = parse_state_tier(json_string(v, k), k);
     },
     [](OptimizerConfig& c, const char* n) {
       if (const char* v = std::getenv(n)) c.state_tier = parse_state_tier(v, n);
     }},
    {"grad_tier", "TIERSWAP_GRAD_TIER", "`host`", "where 16-bit gradients wait: `host`, `nvme`",
     [](OptimizerConfig& c, const nlohmann::json& v, const std::string& k) {
       c.grad_tier = parse_grad_tier(json_string(v, k), k);
     },
     [](OptimizerConfig& c, const char* n) {
       if (const char* v = std::getenv(n)) c.grad_tier = parse_grad_tier(v, n);
     }},
    bool_field<OptimizerConfig, &OptimizerConfig::coalesce>(
        "coalesce", "TIERSWAP_COALESCE", "true", "one reduce-scatter per step (world size > 1)"),
    {"max_grad_norm", "TIERSWAP_MAX_GRAD_NORM", "0", "clip the global gradient norm (0: off)",
     [](OptimizerConfig& c, const nlohmann::json& v, const std::string& k) {
       c.max_grad_norm = json_number(v, k);
     },
     [](OptimizerConfig& c, const char* n) {
       c.max_grad_norm = detail::env_double(n, c.max_grad_norm);
     }},
    bool_field<OptimizerConfig, &OptimizerConfig::overlap>(
        "overlap", "TIERSWAP_OVERLAP", "false",
        "overlapped step: sub-groups step speculatively during the final backward"),
    detail::string_field<OptimizerConfig, &OptimizerConfig::plan_file>(
        "plan", "TIERSWAP_PLAN", "—",
        "a plan file (`tierswap plan --out`): per-sub-group state tier and step device"),
    bool_field<OptimizerConfig, &OptimizerConfig::persist_resident_state>(
        "persist_resident_state", "TIERSWAP_PERSIST_RESIDENT_STATE", "true",
        "false: host- and GPU-resident state in memory only (no NVMe I/O; durable through "
        "`save()`; overlapped: undo copies where the budget holds them)"),
    bool_field<OptimizerConfig, &OptimizerConfig::overlap_param16_in_place>(
        "overlap_param16_in_place", "TIERSWAP_OVERLAP_PARAM16_IN_PLACE", "false",
        "overlapped mode: speculative steps write the 16-bit parameters straight into `param16()` "
        "(no copy after the verdict; `param16()` may show speculative values between a sub-group's "
        "final gradient and `step()`; a discarded speculation recomputes them from the restored "
        "master weights)"),
    bool_field<OptimizerConfig, &OptimizerConfig::concurrent_gpu_step>(
        "concurrent_gpu_step", "TIERSWAP_CONCURRENT_GPU_STEP", "true",
        "a plan's GPU sub-groups step on a lane of their own beside the CPU's (false: one after "
        "the other; the same bits)"),
    bool_field<OptimizerConfig, &OptimizerConfig::pipelined_commit>(
        "pipelined_commit", "TIERSWAP_PIPELINED_COMMIT", "false (`tierswap.torch`: true)",
        "step t's commit (writes, sync, manifest) runs while the trainer computes step t+1's "
        "forward; the next call that touches the state waits for it and, if it failed, rolls step "
        "t back and throws naming it; a crash resumes from step t-1. One rank, shadow slots, no "
        "memory-only state; else inside `step()`"),
    {"loss_scaler", "", "`{\"mode\": \"none\"}`",
     "`mode` none/fixed/dynamic, `init_scale` 65536, `growth_factor` 2, `backoff_factor` 0.5, "
     "`growth_interval` 2000",
     loss_scaler_json, nullptr},
}};

}  // namespace

OptimizerConfig OptimizerConfig::from_env() {
  return from_env(OptimizerConfig{});
}

OptimizerConfig OptimizerConfig::from_env(OptimizerConfig c) {
  detail::apply_env<OptimizerConfig>(c, kFields);
  c.validate();
  return c;
}

OptimizerConfig OptimizerConfig::from_json(std::string_view text) {
  auto c = detail::config_from_json<OptimizerConfig>(text, kFields, "optimizer config");
  c.validate();
  return c;
}

std::vector<Setting> OptimizerConfig::settings() {
  return detail::settings_of<OptimizerConfig>(kFields);
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
