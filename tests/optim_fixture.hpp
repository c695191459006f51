// What the ShardedOptimizer tests share (tests/test_optimizer_*.cpp): a rig of swap space,
// engine, tier manager and optimizer on a temporary directory, tier configs, and comparisons of
// whole parameters' state and 16-bit values, bit for bit.
#pragma once

#include <gtest/gtest.h>
#include <numa.h>

#include <fmt/format.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "optim_model.hpp"
#include "test_util.hpp"
#include "tierswap/communicator.hpp"
#include "tierswap/detail/io_backend.hpp"
#include "tierswap/device.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/optimizer.hpp"
#include "tierswap/placement.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/thread_pool.hpp"

namespace tierswap::optim_test {

using namespace tierswap;
using tierswap::test::TempDir;

inline constexpr std::uint64_t kKiB = 1024, kMiB = 1024 * 1024;

inline TierConfig tier_config(std::uint64_t budget, std::uint64_t slab) {
  TierConfig c;
  c.host_budget = budget;
  c.host_slab_size = slab;
  c.device_mode = DeviceTierMode::off;
  c.durable = false;
  c.telemetry = false;
  c.max_dirty_bytes = 1ull << 30;
  return c;
}

// The host tier above beside a simulated device tier of `device_budget` bytes (host memory
// standing in for a GPU's) with a fast simulated link.
inline TierConfig simulated_gpu_config(std::uint64_t budget, std::uint64_t slab,
                                       std::uint64_t device_budget) {
  TierConfig c = tier_config(budget, slab);
  c.device_mode = DeviceTierMode::simulated;
  c.device_budget = device_budget;
  c.simulated_device_gbps = 1000;
  return c;
}

// A plan with every kind of sub-group: NVMe state, host state, GPU state stepped on the GPU.
inline Plan three_tier_plan() {
  return Plan::from_json(R"({"format": "tierswap.plan", "version": 1, "subgroups": [
      {"numel": 300, "state_tier": "nvme", "step_device": "cpu"},
      {"numel": 300, "state_tier": "host", "step_device": "cpu"},
      {"numel": 400, "state_tier": "gpu", "step_device": "gpu"}]})");
}

struct Rig {
  TempDir dir;
  std::unique_ptr<SwapSpace> space;
  std::unique_ptr<IoEngine> engine;
  std::unique_ptr<TierManager> tiers;
  std::unique_ptr<Communicator> comm = make_single_communicator();
  std::unique_ptr<ShardedOptimizer> opt;

  explicit Rig(TierConfig tc = tier_config(2 * kMiB, 128 * kKiB),
               OptimizerConfig oc = test::model_config(), std::uint64_t capacity = 64 * kMiB,
               detail::FaultPlan faults = nullptr) {
    SwapSpaceConfig sc;
    sc.dirs = {dir.path()};
    sc.capacity = capacity;
    space = std::make_unique<SwapSpace>(SwapSpace::create(sc));
    if (faults) {
      std::string why;
      auto inner = test::make_backend(IoBackendKind::posix, *space, 16, &why);
      IoEngineConfig ec;
      ec.queue_depth = 16;  // the backend's
      engine = std::make_unique<IoEngine>(*space, ec,
                                          detail::make_fault_backend(std::move(inner), faults));
    } else {
      engine = std::make_unique<IoEngine>(*space);
    }
    tiers = std::make_unique<TierManager>(*space, *engine, tc);
    opt = std::make_unique<ShardedOptimizer>(*tiers, *comm, oc);
  }
};

inline std::vector<float> full(ShardedOptimizer& opt, ParamId id,
                               BlockClass cls = BlockClass::master) {
  std::vector<float> out(opt.param(id).numel(), NAN);
  for (auto& [off, vals] : opt.shard(id, cls))
    std::copy(vals.begin(), vals.end(), out.begin() + off);
  return out;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// Master weights and both moments of every trainable parameter, bit for bit.
inline void expect_same_state(ShardedOptimizer& a, const test::ModelOptimizer& ma,
                              ShardedOptimizer& b, const test::ModelOptimizer& mb) {
  for (std::size_t p = 0; p < ma.ids.size(); ++p) {
    if (!test::model_params()[p].trainable) continue;
    for (auto cls : {BlockClass::master, BlockClass::exp_avg, BlockClass::exp_avg_sq})
      EXPECT_TRUE(same_bits(full(a, ma.ids[p], cls), full(b, mb.ids[p], cls)))
          << test::model_params()[p].name << " " << to_string(cls);
  }
}

// Every trainable parameter's 16-bit values equal in both runs.
inline void expect_same_param16(ShardedOptimizer& a, const test::ModelOptimizer& ma,
                                ShardedOptimizer& b, const test::ModelOptimizer& mb) {
  for (std::size_t p = 0; p < ma.ids.size(); ++p) {
    if (!test::model_params()[p].trainable) continue;
    const auto x = a.param16(ma.ids[p]), y = b.param16(mb.ids[p]);
    EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin(), y.end())) << test::model_params()[p].name;
  }
}

}  // namespace tierswap::optim_test
