// A small synthetic model and its gradient sequence, shared by the optimizer tests, the
// multi-rank (mpirun) test and tests/gen_torch_optimizer_reference.py (which computes the same
// numbers in Python: keep the two in step).
//
// Two groups ("decay": AdamW lr 1e-3 wd 0.1; "no_decay": lr 3e-3 wd 0) and a frozen parameter.
// Each micro-step's gradient is a sum over 12 samples; rank r of W takes the samples s with
// s % W == r. Every sample value is k * 2^-10 * 2^(t % 3) with |k| <= 16, so every partial sum
// over samples and 4 micro-steps is exact in fp16: the reduced gradient is the same for every
// world size and reduction order, which makes bit-identical results across world sizes a fair
// test. Step 6 carries an inf (an fp16 overflow): it must be skipped.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tierswap/cuda_runtime.hpp"
#include "tierswap/optimizer.hpp"

namespace tierswap::test {

struct ModelParam {
  std::string name;
  std::vector<std::int64_t> shape;
  int group;
  bool trainable;
};

inline const std::vector<ModelParam>& model_params() {
  static const std::vector<ModelParam> p = {{"w1", {97, 131}, 0, true}, {"b1", {131}, 1, true},
                                            {"w2", {64, 150}, 0, true}, {"emb", {16}, 0, false},
                                            {"b2", {150}, 1, true},     {"w3", {7001}, 0, true},
                                            {"b3", {3}, 1, true}};
  return p;
}

inline constexpr int kSamples = 12;
inline constexpr int kMicroSteps = 4;
inline constexpr int kOverflowStep = 6;
inline constexpr double kMaxGradNorm = 0.02;

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline std::uint64_t key(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d,
                         std::uint64_t e) {
  return splitmix64(splitmix64(splitmix64(splitmix64(splitmix64(a) ^ b) ^ c) ^ d) ^ e);
}

/// Initial master weight of element i of parameter p: in [-1, 1).
inline float init_value(std::size_t p, std::uint64_t i) {
  const std::uint64_t h = key(0xC0FFEE, p, i, 0, 0);
  return static_cast<float>(static_cast<double>(h >> 40) * std::ldexp(1.0, -23) - 1.0);
}

/// Sample s's gradient of element i of parameter p in micro-step u of (1-based) step t.
inline float sample_grad(int t, int u, int s, std::size_t p, std::uint64_t i) {
  if (t == kOverflowStep && u == 2 && s == 5 && p == 2 && i == 17) return INFINITY;
  const std::uint64_t h = key(t, u, s, p, i);
  const int k = static_cast<int>(h % 33) - 16;
  return static_cast<float>(std::ldexp(k, -10 + t % 3));
}

struct ModelOptimizer {
  std::vector<ParamId> ids;  // by model_params() index
};

inline OptimizerConfig model_config() {
  OptimizerConfig c;
  c.subgroup_size = 8192;
  c.max_grad_norm = kMaxGradNorm;
  c.loss_scaler.mode = LossScaling::dynamic;
  c.loss_scaler.init_scale = 1024;
  c.loss_scaler.growth_interval = 5;
  c.state_tier = OptimizerConfig::StateTier::nvme;
  return c;
}

/// Registers the model (groups and parameters) with `opt` and finalizes it.
/// The model's groups and parameters, then finalize() (unless `finalize` is false: resume()).
inline ModelOptimizer build_model(ShardedOptimizer& opt, bool finalize = true) {
  GroupConfig decay;
  decay.lr = 1e-3;
  decay.weight_decay = 0.1;
  GroupConfig no_decay;
  no_decay.lr = 3e-3;
  no_decay.weight_decay = 0.0;
  no_decay.beta2 = 0.99;
  opt.add_group(decay, "decay");
  opt.add_group(no_decay, "no_decay");
  ModelOptimizer m;
  for (const auto& p : model_params())
    m.ids.push_back(opt.add_param(p.group, {p.name, p.shape, Dtype::f16, p.trainable}));
  if (finalize) opt.finalize();
  return m;
}

inline void init_model(ShardedOptimizer& opt, const ModelOptimizer& m) {
  opt.initialize([&](ParamId id, std::uint64_t off, float* out, std::uint64_t n) {
    std::size_t p = 0;
    while (m.ids[p] != id) ++p;
    for (std::uint64_t i = 0; i < n; ++i) out[i] = init_value(p, off + i);
  });
}

/// build_model() and init_model(): a model ready for step 1.
inline ModelOptimizer start_model(ShardedOptimizer& opt) {
  ModelOptimizer m = build_model(opt);
  init_model(opt, m);
  return m;
}

/// Parameter p's 16-bit gradient of micro-batch u of step t on this rank's samples, into g16.
inline void micro_grad16(const ShardedOptimizer& opt, const ModelOptimizer& m, int t, int u,
                         int rank, int world, std::size_t p, std::vector<std::uint16_t>& g16) {
  g16.assign(opt.param(m.ids[p]).numel(), 0);
  for (std::uint64_t i = 0; i < g16.size(); ++i) {
    float sum = 0;  // exact: see the header comment
    for (int s = rank; s < kSamples; s += world) sum += sample_grad(t, u, s, p, i);
    g16[i] = float_to_f16(sum);
  }
}

/// Micro-batch u of step t: every trainable parameter's gradient through add_grad (between
/// begin_backward and end_backward).
inline void add_micro_grads(ShardedOptimizer& opt, const ModelOptimizer& m, int t, int u, int rank,
                            int world) {
  std::vector<std::uint16_t> g16;
  for (std::size_t p = 0; p < model_params().size(); ++p) {
    if (!model_params()[p].trainable) continue;
    micro_grad16(opt, m, t, u, rank, world, p, g16);
    opt.add_grad(m.ids[p], g16.data(), Dtype::f16);
  }
}

/// Runs steps [first, last] (1-based) of the gradient sequence on this rank's samples.
/// `device_grads`: through add_grad_device, from GPU memory with `gpu` (copied there first), else
/// from host memory standing in for a simulated device's.
inline std::vector<StepResult> train(ShardedOptimizer& opt, const ModelOptimizer& m, int first,
                                     int last, int rank, int world, bool device_grads = false,
                                     bool gpu = false) {
  std::vector<StepResult> out;
  std::vector<std::uint16_t> g16;
  cuda::DeviceBuffer d16;
  auto device_copy = [&]() -> const void* {
    if (!gpu) return g16.data();
    cuda::copy_to_device(d16.reserve(g16.size() * 2), g16.data(), g16.size() * 2, nullptr);
    cuda::synchronize(nullptr);
    return d16.data();
  };
  for (int t = first; t <= last; ++t) {
    for (int u = 0; u < kMicroSteps; ++u) {
      opt.begin_backward(u == kMicroSteps - 1);
      if (!device_grads) add_micro_grads(opt, m, t, u, rank, world);
      for (std::size_t p = 0; device_grads && p < model_params().size(); ++p) {
        if (!model_params()[p].trainable) continue;
        micro_grad16(opt, m, t, u, rank, world, p, g16);
        opt.add_grad_device(m.ids[p], device_copy(), Dtype::f16, {});
      }
      opt.end_backward();
    }
    out.push_back(opt.step());
  }
  return out;
}

}  // namespace tierswap::test
