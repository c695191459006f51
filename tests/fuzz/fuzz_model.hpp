// A small optimizer on a swap directory of the fuzzing process, for the targets that feed
// checkpoints and commit records to the optimizer: two groups, ragged sizes, stepped once.
#pragma once

#include <memory>
#include <vector>

#include "fuzz_util.hpp"
#include "tierswap/tiered_optimizer.hpp"

namespace tierswap::fuzz {

inline std::unique_ptr<TieredOptimizer> small_model(const std::filesystem::path& dir, bool resume) {
  std::filesystem::create_directories(dir);
  TieredOptions o;
  o.swap_dirs = {dir};
  o.host_budget = 4ull << 20;
  o.communicator = "single";
  o.threads = 1;
  o.tiers.telemetry = false;
  o.tiers.durable = false;
  o.tiers.lock_host_memory = false;
  o.tiers.device_mode = DeviceTierMode::off;
  o.optimizer.subgroup_size = 8192;
  o.keep_swap_files = true;
  o.resume = resume;
  auto t = std::make_unique<TieredOptimizer>(o);
  const int g0 = t->add_group(GroupConfig::defaults(OptimizerKind::adamw), "decay");
  const int g1 = t->add_group(GroupConfig::defaults(OptimizerKind::sgd), "sgd");
  t->add_param(g0, {"w", {61, 211}, Dtype::bf16, true});
  t->add_param(g1, {"b", {5003}, Dtype::bf16, true});
  t->finalize();
  if (t->resumed()) return t;
  ShardedOptimizer& opt = t->optimizer();
  opt.initialize([](ParamId, std::uint64_t off, float* out, std::uint64_t n) {
    for (std::uint64_t i = 0; i < n; ++i) out[i] = 1e-3f * static_cast<float>((off + i) % 89);
  });
  opt.begin_backward();
  for (ParamId id = 0; id < opt.param_count(); ++id) {
    std::vector<std::uint16_t> g(opt.param(id).numel(), float_to_bf16(1e-2f));
    opt.add_grad(id, g.data(), Dtype::bf16);
  }
  opt.end_backward();
  opt.step();
  return t;
}

}  // namespace tierswap::fuzz
