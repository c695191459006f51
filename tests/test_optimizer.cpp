// ShardedOptimizer at world size 1: torch.optim.AdamW semantics over a run with parameter
// groups, a frozen parameter, accumulation, clipping and an fp16 overflow; NVMe traffic of
// exactly 12 B read + 12 B written per parameter per step; pinned memory within the budget;
// checkpoints that resume bit-identically and refuse bad input; a failed step leaves the state
// intact; misuse errors. (Multi-rank runs: test_optimizer_mpi under mpirun.)
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

using namespace tierswap;
using tierswap::test::TempDir;

namespace {

constexpr std::uint64_t kKiB = 1024, kMiB = 1024 * 1024;

TierConfig tier_config(std::uint64_t budget, std::uint64_t slab) {
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
TierConfig simulated_gpu_config(std::uint64_t budget, std::uint64_t slab,
                                std::uint64_t device_budget) {
  TierConfig c = tier_config(budget, slab);
  c.device_mode = DeviceTierMode::simulated;
  c.device_budget = device_budget;
  c.simulated_device_gbps = 1000;
  return c;
}

// A plan with every kind of sub-group: NVMe state, host state, GPU state stepped on the GPU.
Plan three_tier_plan() {
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
      engine = std::make_unique<IoEngine>(*space, IoEngineConfig{},
                                          detail::make_fault_backend(std::move(inner), faults));
    } else {
      engine = std::make_unique<IoEngine>(*space);
    }
    tiers = std::make_unique<TierManager>(*space, *engine, tc);
    opt = std::make_unique<ShardedOptimizer>(*tiers, *comm, oc);
  }
};

std::vector<float> full(ShardedOptimizer& opt, ParamId id, BlockClass cls = BlockClass::master) {
  std::vector<float> out(opt.param(id).numel(), NAN);
  for (auto& [off, vals] : opt.shard(id, cls))
    std::copy(vals.begin(), vals.end(), out.begin() + off);
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// Master weights and both moments of every trainable parameter, bit for bit.
void expect_same_state(ShardedOptimizer& a, const test::ModelOptimizer& ma, ShardedOptimizer& b,
                       const test::ModelOptimizer& mb) {
  for (std::size_t p = 0; p < ma.ids.size(); ++p) {
    if (!test::model_params()[p].trainable) continue;
    for (auto cls : {BlockClass::master, BlockClass::exp_avg, BlockClass::exp_avg_sq})
      EXPECT_TRUE(same_bits(full(a, ma.ids[p], cls), full(b, mb.ids[p], cls)))
          << test::model_params()[p].name << " " << to_string(cls);
  }
}

// Every trainable parameter's 16-bit values equal in both runs.
void expect_same_param16(ShardedOptimizer& a, const test::ModelOptimizer& ma, ShardedOptimizer& b,
                         const test::ModelOptimizer& mb) {
  for (std::size_t p = 0; p < ma.ids.size(); ++p) {
    if (!test::model_params()[p].trainable) continue;
    const auto x = a.param16(ma.ids[p]), y = b.param16(mb.ids[p]);
    EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin(), y.end())) << test::model_params()[p].name;
  }
}

}  // namespace

TEST(ShardedOptimizer, MatchesTorchAdamWWithGroupsAccumulationClippingAndLossScaling) {
  std::ifstream in(std::string(TIERSWAP_TEST_FIXTURES) + "/torch_sharded_optimizer_reference.json");
  ASSERT_TRUE(in) << "fixture missing: run tests/gen_torch_optimizer_reference.py";
  const auto ref = nlohmann::json::parse(in);
  Rig r;
  auto m = test::start_model(*r.opt);
  const auto results = test::train(*r.opt, m, 1, 20, 0, 1);
  std::vector<int> skipped, clipped;
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (results[i].skipped) skipped.push_back(static_cast<int>(i + 1));
    if (results[i].clip_factor < 1) clipped.push_back(static_cast<int>(i + 1));
  }
  EXPECT_EQ(skipped, ref.at("skipped").get<std::vector<int>>());
  EXPECT_EQ(clipped, ref.at("clipped").get<std::vector<int>>());
  EXPECT_EQ(r.opt->loss_scale(), ref.at("final_scale").get<double>());
  EXPECT_EQ(r.opt->step_count(), 19u);
  // Agreement: every element within 1e-6 relative (allclose with rtol 1e-6, and atol 1e-8 for
  // the few weights that pass near zero, where a relative figure means nothing), and every
  // tensor within 1e-6 in norm. The differences come from the clip factor (torch: fp32 norm of
  // per-tensor norms; tierswap: fp64 chunk sums) and from tierswap folding unscale and clip into
  // one multiplier.
  for (std::size_t p = 0; p < test::model_params().size(); ++p) {
    const auto& mp = test::model_params()[p];
    if (!mp.trainable) continue;
    const auto want = ref.at("params").at(mp.name).get<std::vector<std::uint32_t>>();
    const auto got = full(*r.opt, m.ids[p]);
    ASSERT_EQ(got.size(), want.size());
    double diff2 = 0, norm2 = 0;
    int reported = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      float w;
      std::memcpy(&w, &want[i], 4);
      const double d = std::abs(static_cast<double>(got[i]) - w);
      diff2 += d * d;
      norm2 += static_cast<double>(w) * w;
      if (d > 1e-6 * std::abs(w) + 1e-8 && reported++ < 5)
        ADD_FAILURE() << mp.name << "[" << i << "]: " << got[i] << " vs torch " << w;
    }
    EXPECT_LE(std::sqrt(diff2 / norm2), 1e-6) << mp.name << ": relative difference in norm";
  }
  // The 16-bit copies are the master weights rounded.
  const auto w1 = full(*r.opt, m.ids[0]);
  const auto p16 = r.opt->param16(m.ids[0]);
  for (std::size_t i = 0; i < w1.size(); ++i) ASSERT_EQ(p16[i], float_to_f16(w1[i]));
}

TEST(ShardedOptimizer, NvmeTrafficIs12BytesReadAnd12WrittenPerParameterAndNoFp32Gradient) {
  const std::uint64_t n = 1 << 18;  // 16 sub-groups of 16Ki: 3 MiB of state, 2x the budget
  OptimizerConfig oc;
  oc.subgroup_size = 1 << 14;
  oc.state_tier = OptimizerConfig::StateTier::nvme;
  const std::uint64_t budget = 1536 * kKiB;
  Rig r(tier_config(budget, 128 * kKiB), oc);
  r.opt->add_group(GroupConfig{});
  const ParamId p = r.opt->add_param(0, {"w", {512, 512}, Dtype::bf16, true});
  r.opt->finalize();
  r.opt->initialize([](ParamId, std::uint64_t off, float* out, std::uint64_t k) {
    for (std::uint64_t i = 0; i < k; ++i) out[i] = 0.001f * static_cast<float>((off + i) % 97);
  });
  std::vector<std::uint16_t> g(n);
  for (int step = 1; step <= 4; ++step) {
    for (std::uint64_t i = 0; i < n; ++i) g[i] = float_to_bf16(0.01f * ((i * step) % 13) - 0.06f);
    const TierCounters c0 = r.tiers->counters();
    r.opt->begin_backward();
    r.opt->add_grad(p, g.data(), Dtype::bf16);
    r.opt->end_backward();
    for (std::size_t k = 0; k < r.opt->subgroup_count(); ++k) EXPECT_TRUE(r.opt->gradient_final(k));
    const StepResult s = r.opt->step();
    const TierCounters c1 = r.tiers->counters();
    ASSERT_FALSE(s.skipped);
    const int nv = static_cast<int>(Tier::nvme);
    // Over the whole cycle (ingest + step): every state byte written once, no gradient byte
    // (16-bit or fp32) ever; every state byte read at most once (less what the budget still
    // caches from the last step: the moments of step 1 are zeros that take no read at all).
    EXPECT_EQ(c1.bytes_in[nv] - c0.bytes_in[nv], 12 * n) << "NVMe bytes written, step " << step;
    EXPECT_LE(c1.bytes_out[nv] - c0.bytes_out[nv], 12 * n) << "NVMe bytes read, step " << step;
    if (step > 1)
      EXPECT_GE(c1.bytes_out[nv] - c0.bytes_out[nv], 12 * n - budget) << "step " << step;
    EXPECT_EQ(s.bytes_in[nv], 12 * n);
  }
  const TierCounters c = r.tiers->counters();
  EXPECT_LE(c.peak_reserved_bytes[static_cast<int>(Tier::host)], budget);
  EXPECT_GT(c.peak_reserved_bytes[static_cast<int>(Tier::host)], 0u);
  EXPECT_GE(r.opt->state_bytes(), 2 * budget);
}

TEST(ShardedOptimizer, StateTierAndThreadCountDoNotChangeResults) {
  Rig a;
  auto ma = test::start_model(*a.opt);
  test::train(*a.opt, ma, 1, 8, 0, 1);
  OptimizerConfig oc = test::model_config();
  oc.state_tier = OptimizerConfig::StateTier::host;
  oc.subgroup_size = 3 * 8192;
  ThreadPool pool(2);
  TempDir d2;
  Rig b(tier_config(8 * kMiB, 256 * kKiB), oc);
  b.opt = std::make_unique<ShardedOptimizer>(*b.tiers, *b.comm, oc, &pool);
  auto mb = test::start_model(*b.opt);
  test::train(*b.opt, mb, 1, 8, 0, 1);
  expect_same_state(*a.opt, ma, *b.opt, mb);
}

TEST(ShardedOptimizer, LionAndSgdGroupsStepLikeTheirKernels) {
  OptimizerConfig oc;
  oc.subgroup_size = 8192;
  Rig r(tier_config(2 * kMiB, 128 * kKiB), oc);
  GroupConfig lion;
  lion.kind = OptimizerKind::lion;
  lion.lr = 1e-3;
  lion.beta2 = 0.99;
  lion.weight_decay = 0.1;
  GroupConfig sgd;
  sgd.kind = OptimizerKind::sgd;
  sgd.lr = 0.05;
  sgd.momentum = 0.9;
  sgd.weight_decay = 1e-3;
  r.opt->add_group(lion);
  r.opt->add_group(sgd);
  const std::uint64_t n = 10007;
  const ParamId a = r.opt->add_param(0, {"a", {10007}, Dtype::bf16, true});
  const ParamId b = r.opt->add_param(1, {"b", {10007}, Dtype::bf16, true});
  r.opt->finalize();
  std::vector<float> init(n);
  for (std::uint64_t i = 0; i < n; ++i) init[i] = std::sin(0.1f * i);
  r.opt->initialize([&](ParamId, std::uint64_t off, float* out, std::uint64_t k) {
    std::memcpy(out, init.data() + off, k * 4);
  });
  std::vector<float> pa = init, ma(n, 0), pb = init, mb(n, 0);
  std::vector<std::uint16_t> g(n);
  for (int t = 1; t <= 5; ++t) {
    for (std::uint64_t i = 0; i < n; ++i) g[i] = float_to_bf16(std::cos(0.37f * i * t));
    r.opt->begin_backward();
    r.opt->add_grad(a, g.data(), Dtype::bf16);
    r.opt->add_grad(b, g.data(), Dtype::bf16);
    r.opt->end_backward();
    r.opt->step();
    LionConfig lc;
    lc.lr = 1e-3;
    lc.beta2 = 0.99;
    lc.weight_decay = 0.1;
    lion_step(lc, pa.data(), ma.data(), Dtype::f32, {g.data(), Dtype::bf16, 1.0f}, {}, n);
    SgdConfig sc;
    sc.lr = 0.05;
    sc.momentum = 0.9;
    sc.weight_decay = 1e-3;
    sgd_step(sc, t == 1, pb.data(), mb.data(), {g.data(), Dtype::bf16, 1.0f}, {}, n);
  }
  EXPECT_TRUE(same_bits(full(*r.opt, a), pa));
  EXPECT_TRUE(same_bits(full(*r.opt, a, BlockClass::exp_avg), ma));
  EXPECT_TRUE(same_bits(full(*r.opt, b), pb));
  EXPECT_TRUE(same_bits(full(*r.opt, b, BlockClass::momentum), mb));
  EXPECT_THROW(r.opt->shard(a, BlockClass::exp_avg_sq), std::invalid_argument);
}

TEST(ShardedOptimizer, CheckpointResumesBitIdenticallyAtAnotherSubgroupSize) {
  Rig a;
  auto ma = test::start_model(*a.opt);
  test::train(*a.opt, ma, 1, 10, 0, 1);
  TempDir ck;
  a.opt->save(ck.path());
  a.opt->save(ck.path());  // saving again replaces the files of the first save
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(ck.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 3);  // manifest + one rank's index and data
  test::train(*a.opt, ma, 11, 20, 0, 1);

  OptimizerConfig oc = test::model_config();
  oc.subgroup_size = 16384;
  Rig b(tier_config(2 * kMiB, 128 * kKiB), oc);
  auto mb = test::build_model(*b.opt);
  b.opt->load(ck.path());
  EXPECT_EQ(b.opt->step_count(), 9u);  // step 6 was skipped
  test::train(*b.opt, mb, 11, 20, 0, 1);
  EXPECT_EQ(a.opt->loss_scale(), b.opt->loss_scale());
  expect_same_state(*a.opt, ma, *b.opt, mb);
  for (std::size_t p = 0; p < ma.ids.size(); ++p) {
    if (!test::model_params()[p].trainable) continue;
    const auto x = a.opt->param16(ma.ids[p]);
    const auto y = b.opt->param16(mb.ids[p]);
    EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin(), y.end()));
  }
}

TEST(ShardedOptimizer, BadCheckpointsGiveClearErrorsAndLeaveTheStateAlone) {
  Rig a;
  auto ma = test::start_model(*a.opt);
  test::train(*a.opt, ma, 1, 3, 0, 1);
  TempDir ck;
  a.opt->save(ck.path());

  Rig b;
  auto mb = test::start_model(*b.opt);
  test::train(*b.opt, mb, 1, 1, 0, 1);
  const auto before = full(*b.opt, mb.ids[0]);
  auto expect_error = [&](const std::filesystem::path& dir, const std::string& what) {
    try {
      b.opt->load(dir);
      ADD_FAILURE() << "load succeeded; expected: " << what;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_TRUE(same_bits(full(*b.opt, mb.ids[0]), before));
    EXPECT_EQ(b.opt->step_count(), 1u);
  };
  TempDir empty;
  expect_error(empty.path(), "no tierswap.checkpoint");

  std::filesystem::path bin, index;
  for (auto& e : std::filesystem::directory_iterator(ck.path())) {
    if (e.path().extension() == ".bin") bin = e.path();
    if (e.path().extension() == ".json") index = e.path();
  }
  // Corrupt one byte deep in the data: the piece checksum catches it, mid-copy.
  {
    std::fstream f(bin, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40000);
    char c;
    f.read(&c, 1);
    c ^= 0x5a;
    f.seekp(40000);
    f.write(&c, 1);
  }
  expect_error(ck.path(), "checksum mismatch");
  std::filesystem::resize_file(bin, std::filesystem::file_size(bin) - 100);
  expect_error(ck.path(), "truncated");
  std::filesystem::remove(index);
  expect_error(ck.path(), "missing");

  // A model of another shape.
  Rig c;
  c.opt->add_group(GroupConfig{});
  c.opt->add_group(GroupConfig{});
  c.opt->add_param(0, {"w1", {97, 130}, Dtype::f16, true});
  c.opt->finalize();
  TempDir ck2;
  a.opt->save(ck2.path());
  try {
    c.opt->load(ck2.path());
    ADD_FAILURE() << "a mismatched model loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("parameters"), std::string::npos) << e.what();
  }
}

TEST(ShardedOptimizer, AFailedStepLeavesThePreviousStateIntact) {
  // A clean run to compare with: a failed step drops its gradients, so redoing step 3 must give
  // the same bits as a run that never failed.
  Rig clean;
  auto mc = test::start_model(*clean.opt);
  test::train(*clean.opt, mc, 1, 3, 0, 1);
  for (const bool overlap : {false, true}) {
    for (const IoOp op : {IoOp::write, IoOp::read}) {
      SCOPED_TRACE(
          fmt::format("overlap {}, failing {}s", overlap, op == IoOp::write ? "write" : "read"));
      std::atomic<bool> fail{false};
      OptimizerConfig oc = test::model_config();
      oc.overlap = overlap;
      // A budget below the state (~470 KiB with gradients), so that a step reads state.
      Rig r(tier_config(256 * kKiB, 64 * kKiB), oc, 64 * kMiB,
            [&](const detail::IoRequest& q, std::uint64_t) {
              return fail.load() && q.op == op ? detail::Fault{detail::Fault::Kind::error, EIO}
                                               : detail::Fault{};
            });
      auto m = test::start_model(*r.opt);
      test::train(*r.opt, m, 1, 2, 0, 1);
      const auto master = full(*r.opt, m.ids[0]);
      const auto avg = full(*r.opt, m.ids[0], BlockClass::exp_avg);
      const auto p16 = std::vector<std::uint16_t>(r.opt->param16(m.ids[0]).begin(),
                                                  r.opt->param16(m.ids[0]).end());
      fail = true;
      EXPECT_THROW(test::train(*r.opt, m, 3, 3, 0, 1), std::system_error);
      fail = false;
      EXPECT_EQ(r.opt->step_count(), 2u);
      EXPECT_TRUE(same_bits(full(*r.opt, m.ids[0]), master));
      EXPECT_TRUE(same_bits(full(*r.opt, m.ids[0], BlockClass::exp_avg), avg));
      const auto now = r.opt->param16(m.ids[0]);
      EXPECT_TRUE(std::equal(now.begin(), now.end(), p16.begin(), p16.end()));
      // And training goes on from there, as if the failure had not happened.
      const auto res = test::train(*r.opt, m, 3, 3, 0, 1);
      EXPECT_EQ(res.back().step, 3u);
      expect_same_state(*clean.opt, mc, *r.opt, m);
    }
  }
}

// on_param16_ready: each trainable parameter once per step that changes it, before the commit
// (world size 1), with the values param16() then holds; nothing on the overflow step; after a
// failed step, once more for every parameter with the restored values.
TEST(ShardedOptimizer, Param16ReadyHandsOutEachParameterOnceBeforeTheCommit) {
  for (const bool overlap : {false, true}) {
    SCOPED_TRACE(fmt::format("overlap {}", overlap));
    OptimizerConfig oc = test::model_config();
    oc.overlap = overlap;
    oc.subgroup_size = 8192;  // parameters spanning several sub-groups, sub-groups several params
    // Writes fail from the first hand-out of the failing step on: that step has handed out some
    // parameters and fails at a later write-behind or at the commit.
    std::atomic<bool> fail_writes{false};
    bool arm = false;
    Rig r(tier_config(256 * kKiB, 64 * kKiB), oc, 64 * kMiB,
          [&](const detail::IoRequest& q, std::uint64_t) {
            return q.op == IoOp::write && fail_writes.load()
                       ? detail::Fault{detail::Fault::Kind::error, EIO}
                       : detail::Fault{};
          });
    auto m = test::start_model(*r.opt);
    std::map<ParamId, int> calls;
    std::map<ParamId, std::vector<std::uint16_t>> last;
    std::uint64_t max_gen_seen = 0;
    r.opt->on_param16_ready([&](ParamId id, std::span<const std::uint16_t> v) {
      ++calls[id];
      last[id].assign(v.begin(), v.end());
      if (arm) fail_writes = true;
      max_gen_seen = std::max(max_gen_seen, r.tiers->committed_generation());
    });
    std::size_t trainable = 0;
    for (const auto& p : test::model_params()) trainable += p.trainable;
    ASSERT_GT(r.opt->subgroup_count(), trainable / 2);
    for (int t = 1; t <= 8; ++t) {
      calls.clear();
      const std::uint64_t before = r.tiers->committed_generation();
      const StepResult res = test::train(*r.opt, m, t, t, 0, 1).back();
      if (res.skipped) {
        EXPECT_EQ(t, test::kOverflowStep);
        EXPECT_TRUE(calls.empty()) << "step " << t;
        continue;
      }
      EXPECT_EQ(max_gen_seen, before) << "called after the commit, step " << t;
      EXPECT_EQ(calls.size(), trainable) << "step " << t;
      for (std::size_t p = 0; p < m.ids.size(); ++p) {
        if (!test::model_params()[p].trainable) {
          EXPECT_EQ(calls.count(m.ids[p]), 0u);
          continue;
        }
        EXPECT_EQ(calls[m.ids[p]], 1) << test::model_params()[p].name << " step " << t;
        const auto now = r.opt->param16(m.ids[p]);
        EXPECT_TRUE(
            std::equal(now.begin(), now.end(), last[m.ids[p]].begin(), last[m.ids[p]].end()))
            << test::model_params()[p].name << " step " << t;
      }
    }
    // A step that fails part-way: the trainer is given the restored values of everything.
    std::vector<std::vector<std::uint16_t>> before(m.ids.size());
    for (std::size_t p = 0; p < m.ids.size(); ++p) {
      if (!test::model_params()[p].trainable) continue;  // frozen: no 16-bit copy kept
      const auto v = r.opt->param16(m.ids[p]);
      before[p].assign(v.begin(), v.end());
    }
    calls.clear();
    arm = true;
    bool threw = false;
    try {
      test::train(*r.opt, m, 9, 9, 0, 1);
    } catch (const std::system_error&) {
      threw = true;
    }
    arm = false;
    fail_writes = false;
    // (In the overlapped mode the kept speculative results may leave the commit nothing to write.)
    if (!overlap) EXPECT_TRUE(threw);
    if (threw) {
      EXPECT_EQ(r.opt->step_count(), 7u);  // step 6 was skipped (overflow)
      EXPECT_EQ(calls.size(), trainable);
      for (std::size_t p = 0; p < m.ids.size(); ++p) {
        if (!test::model_params()[p].trainable) continue;
        const auto now = r.opt->param16(m.ids[p]);
        EXPECT_TRUE(std::equal(now.begin(), now.end(), before[p].begin(), before[p].end()))
            << test::model_params()[p].name;
        EXPECT_TRUE(
            std::equal(now.begin(), now.end(), last[m.ids[p]].begin(), last[m.ids[p]].end()))
            << test::model_params()[p].name;
      }
    }
    r.opt->on_param16_ready({});
    calls.clear();
    test::train(*r.opt, m, 9, 9, 0, 1);
    EXPECT_TRUE(calls.empty());
  }
}

// The overlapped step against the ordinary one over 20 steps with accumulation, clipping on some
// steps (discard and redo), an overflow at step 6 (discard) and unclipped steps (kept), for
// NVMe- and host-resident state and gradients spilled to NVMe, with the speculative 16-bit output
// in a scratch copy or in param16() itself (overlap_param16_in_place: recomputed on discard).
TEST(ShardedOptimizer, OverlappedStepIsBitIdenticalToTheOrdinaryStep) {
  // Every step's 16-bit parameters too: a discarded speculation must not leave its values.
  auto p16_of = [](ShardedOptimizer& opt, const test::ModelOptimizer& m) {
    std::vector<std::uint16_t> all;
    for (std::size_t p = 0; p < m.ids.size(); ++p)
      if (test::model_params()[p].trainable) {
        const auto v = opt.param16(m.ids[p]);
        all.insert(all.end(), v.begin(), v.end());
      }
    return all;
  };
  Rig a;
  auto ma = test::start_model(*a.opt);
  std::vector<StepResult> ra;
  std::vector<std::vector<std::uint16_t>> a16;
  for (int t = 1; t <= 20; ++t) {
    ra.push_back(test::train(*a.opt, ma, t, t, 0, 1).back());
    a16.push_back(p16_of(*a.opt, ma));
  }
  struct Case {
    OptimizerConfig::StateTier state;
    Tier grad;
    unsigned threads;
    bool numa;  // slabs and step workers bound to NUMA node 0
    bool in_place16 = false;
  };
  for (const Case c : {Case{OptimizerConfig::StateTier::nvme, Tier::host, 1, false},
                       Case{OptimizerConfig::StateTier::nvme, Tier::nvme, 2, false},
                       Case{OptimizerConfig::StateTier::host, Tier::host, 2, true},
                       Case{OptimizerConfig::StateTier::nvme, Tier::host, 2, false, true},
                       Case{OptimizerConfig::StateTier::host, Tier::nvme, 1, false, true}}) {
    const int node = c.numa && numa_available() >= 0 ? 0 : -1;
    SCOPED_TRACE(fmt::format("state {}, gradients {}, {} threads, NUMA node {}, param16 {}",
                             c.state == OptimizerConfig::StateTier::nvme ? "nvme" : "host",
                             to_string(c.grad), c.threads, node,
                             c.in_place16 ? "in place" : "scratch"));
    OptimizerConfig oc = test::model_config();
    oc.overlap = true;
    oc.overlap_param16_in_place = c.in_place16;
    oc.state_tier = c.state;
    oc.grad_tier = c.grad;
    ThreadPool pool(c.threads, node);
    TierConfig tc = tier_config(4 * kMiB, 128 * kKiB);
    tc.numa_node = node;
    Rig b(tc, oc);
    b.opt = std::make_unique<ShardedOptimizer>(*b.tiers, *b.comm, oc, &pool);
    auto mb = test::start_model(*b.opt);
    std::vector<StepResult> rb;
    for (int t = 1; t <= 20; ++t) {
      rb.push_back(test::train(*b.opt, mb, t, t, 0, 1).back());
      EXPECT_TRUE(p16_of(*b.opt, mb) == a16[t - 1]) << "param16 after step " << t;
    }
    ASSERT_EQ(ra.size(), rb.size());
    int kept = 0, redone = 0, skipped = 0;
    for (std::size_t i = 0; i < ra.size(); ++i) {
      EXPECT_EQ(ra[i].skipped, rb[i].skipped) << "step " << i + 1;
      EXPECT_EQ(ra[i].clip_factor, rb[i].clip_factor) << "step " << i + 1;
      EXPECT_EQ(ra[i].loss_scale, rb[i].loss_scale) << "step " << i + 1;
      EXPECT_EQ(ra[i].overlapped_subgroups, 0u);
      EXPECT_FALSE(ra[i].redone);
      if (rb[i].skipped) {
        ++skipped;
        EXPECT_EQ(rb[i].overlapped_subgroups, 0u);
      } else if (rb[i].clip_factor < 1) {
        ++redone;
        EXPECT_TRUE(rb[i].redone) << "step " << i + 1;
        EXPECT_EQ(rb[i].overlapped_subgroups, 0u);
      } else {
        ++kept;
        EXPECT_FALSE(rb[i].redone) << "step " << i + 1;
        EXPECT_EQ(rb[i].overlapped_subgroups, b.opt->subgroup_count()) << "step " << i + 1;
      }
    }
    EXPECT_EQ(skipped, 1);
    EXPECT_GT(redone, 0);
    EXPECT_GT(kept, 0);
    expect_same_state(*a.opt, ma, *b.opt, mb);
    expect_same_param16(*a.opt, ma, *b.opt, mb);
  }
}

// Speculative results that can no longer be kept: a learning rate changed between the final
// backward and step(), and a gradient added to a sub-group after it was stepped.
TEST(ShardedOptimizer, OverlappedStepRedoesWhatChangedAfterTheSpeculativeStep) {
  OptimizerConfig oc = test::model_config();
  oc.max_grad_norm = 0;  // no clipping: only the changes force a redo
  Rig a(tier_config(2 * kMiB, 128 * kKiB), oc);
  oc.overlap = true;
  Rig b(tier_config(2 * kMiB, 128 * kKiB), oc);
  auto ma = test::start_model(*a.opt);
  auto mb = test::start_model(*b.opt);
  const auto r1 = test::train(*b.opt, mb, 1, 1, 0, 1);
  test::train(*a.opt, ma, 1, 1, 0, 1);
  EXPECT_FALSE(r1.back().redone);
  EXPECT_EQ(r1.back().overlapped_subgroups, b.opt->subgroup_count());
  // Step 2 of both with a learning rate set after the backward.
  auto backward = [&](ShardedOptimizer& opt, const test::ModelOptimizer& m, int twice) {
    opt.begin_backward(true);
    for (std::size_t p = 0; p < m.ids.size(); ++p) {
      if (!test::model_params()[p].trainable) continue;
      std::vector<std::uint16_t> gp(opt.param(m.ids[p]).numel(), float_to_f16(0.001f * (p + 1)));
      opt.add_grad(m.ids[p], gp.data(), Dtype::f16);
      if (p == static_cast<std::size_t>(twice)) opt.add_grad(m.ids[p], gp.data(), Dtype::f16);
    }
    opt.end_backward();
  };
  backward(*a.opt, ma, -1);
  backward(*b.opt, mb, -1);
  a.opt->set_lr(0, 5e-4);
  b.opt->set_lr(0, 5e-4);
  EXPECT_FALSE(a.opt->step().redone);
  EXPECT_TRUE(b.opt->step().redone);
  expect_same_state(*a.opt, ma, *b.opt, mb);
  // Step 3: parameter 5 ("w3") gets its gradient twice, the second time after its sub-groups may
  // already have been stepped.
  backward(*a.opt, ma, 5);
  backward(*b.opt, mb, 5);
  EXPECT_FALSE(a.opt->step().redone);
  EXPECT_TRUE(b.opt->step().redone);
  expect_same_state(*a.opt, ma, *b.opt, mb);
  // Misuse: toggling during a backward; a checkpoint while speculative results wait.
  b.opt->begin_backward(true);
  EXPECT_THROW(b.opt->set_overlap(false), std::logic_error);
  for (std::size_t p = 0; p < mb.ids.size(); ++p) {
    if (!test::model_params()[p].trainable) continue;
    std::vector<std::uint16_t> gp(b.opt->param(mb.ids[p]).numel(), float_to_f16(0.001f));
    b.opt->add_grad(mb.ids[p], gp.data(), Dtype::f16);
  }
  b.opt->end_backward();
  TempDir ck;
  EXPECT_THROW(b.opt->save(ck.path()), std::logic_error);
  EXPECT_THROW(b.opt->set_overlap(false), std::logic_error);
  b.opt->step();
  b.opt->set_overlap(false);
  EXPECT_FALSE(b.opt->overlap());
  b.opt->save(ck.path());
  // In-place mode cannot discard: refused at finalize and by set_overlap.
  TierConfig inplace = tier_config(2 * kMiB, 128 * kKiB);
  inplace.shadow_slots = false;
  Rig c(inplace, oc);
  EXPECT_THROW(test::build_model(*c.opt), std::invalid_argument);
  oc.overlap = false;
  Rig d(inplace, oc);
  test::build_model(*d.opt);
  EXPECT_THROW(d.opt->set_overlap(true), std::logic_error);
}

TEST(ShardedOptimizer, MisuseIsRejectedWithClearErrors) {
  Rig r;
  EXPECT_THROW(r.opt->finalize(), std::logic_error);  // no groups
  GroupConfig bad;
  bad.beta1 = 1.5;
  EXPECT_THROW(r.opt->add_group(bad), std::invalid_argument);
  const int g = r.opt->add_group(GroupConfig{});
  EXPECT_THROW(r.opt->add_param(3, {"x", {4}, Dtype::bf16, true}), std::invalid_argument);
  EXPECT_THROW(r.opt->add_param(g, {"x", {4}, Dtype::f32, true}), std::invalid_argument);
  EXPECT_THROW(r.opt->add_param(g, {"x", {0, 4}, Dtype::bf16, true}), std::invalid_argument);
  const ParamId x = r.opt->add_param(g, {"x", {4}, Dtype::bf16, true});
  const ParamId f = r.opt->add_param(g, {"frozen", {4}, Dtype::bf16, false});
  EXPECT_THROW(r.opt->add_param(g, {"x", {4}, Dtype::bf16, true}), std::invalid_argument);
  EXPECT_THROW(r.opt->add_param(g, {"y", {4}, Dtype::f16, true}), std::invalid_argument);
  std::uint16_t grad[4] = {};
  EXPECT_THROW(r.opt->begin_backward(), std::logic_error);  // not finalized
  r.opt->finalize();
  EXPECT_THROW(r.opt->add_param(g, {"z", {4}, Dtype::bf16, true}), std::logic_error);
  EXPECT_THROW(r.opt->add_grad(x, grad, Dtype::bf16), std::logic_error);  // no backward
  r.opt->begin_backward();
  EXPECT_THROW(r.opt->begin_backward(), std::logic_error);
  EXPECT_THROW(r.opt->add_grad(f, grad, Dtype::bf16), std::invalid_argument);
  EXPECT_THROW(r.opt->add_grad(99, grad, Dtype::bf16), std::invalid_argument);
  EXPECT_THROW(r.opt->param16(f), std::invalid_argument);  // frozen: the trainer keeps its values
  EXPECT_THROW(r.opt->step(), std::logic_error);  // backward not ended
  r.opt->end_backward();
  GroupConfig other;
  other.kind = OptimizerKind::lion;
  EXPECT_THROW(r.opt->set_group_config(g, other), std::invalid_argument);
  EXPECT_THROW(r.opt->set_lr(g, -1), std::invalid_argument);
  r.opt->set_lr(g, 0.5);
  EXPECT_EQ(r.opt->group_config(g).lr, 0.5);
  OptimizerConfig oc;
  oc.subgroup_size = 0;
  EXPECT_THROW(oc.validate(), std::invalid_argument);
  oc = {};
  oc.loss_scaler.mode = LossScaling::dynamic;
  oc.loss_scaler.backoff_factor = 2;
  EXPECT_THROW(oc.validate(), std::invalid_argument);
  // A second optimizer on the same swap space would clobber the first one's blocks.
  ShardedOptimizer twin(*r.tiers, *r.comm);
  twin.add_group(GroupConfig{});
  twin.add_param(0, {"x", {4}, Dtype::bf16, true});
  EXPECT_THROW(twin.finalize(), std::runtime_error);
}

TEST(ShardedOptimizer, ConfigFromJsonAndEnvironment) {
  const auto c = OptimizerConfig::from_json(
      R"({"subgroup_size": "4M", "prefetch_depth": 3, "state_tier": "host", "grad_tier": "nvme",
          "max_grad_norm": 1.5, "overlap": true, "overlap_param16_in_place": true,
          "concurrent_gpu_step": false, "loss_scaler": {"mode": "dynamic", "growth_interval": 10}})");
  EXPECT_EQ(c.subgroup_size, 4u << 20);
  EXPECT_TRUE(c.overlap);
  EXPECT_TRUE(c.overlap_param16_in_place);
  EXPECT_FALSE(c.concurrent_gpu_step);
  EXPECT_TRUE(OptimizerConfig{}.concurrent_gpu_step);
  EXPECT_EQ(c.prefetch_depth, 3u);
  EXPECT_EQ(c.state_tier, OptimizerConfig::StateTier::host);
  EXPECT_EQ(c.grad_tier, Tier::nvme);
  EXPECT_EQ(c.max_grad_norm, 1.5);
  EXPECT_EQ(c.loss_scaler.mode, LossScaling::dynamic);
  EXPECT_EQ(c.loss_scaler.growth_interval, 10u);
  for (const char* bad :
       {R"({"subgroup": 1})", R"({"grad_tier": "gpu"})",
        R"({"loss_scaler": {"mode": "sometimes"}})", R"({"max_grad_norm": -1})",
        R"({"loss_scaler": {"backoff": 0.5}})", R"({"overlap": "yes"})",
        R"({"overlap_param16_in_place": 1})", R"({"concurrent_gpu_step": "no"})", "[1]", "{"}) {
    try {
      OptimizerConfig::from_json(bad);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_FALSE(std::string(e.what()).empty());
    }
  }
  ::setenv("TIERSWAP_STATE_TIER", "nvme", 1);
  ::setenv("TIERSWAP_SUBGROUP_SIZE", "1M", 1);
  ::setenv("TIERSWAP_OVERLAP", "1", 1);
  ::setenv("TIERSWAP_OVERLAP_PARAM16_IN_PLACE", "1", 1);
  ::setenv("TIERSWAP_CONCURRENT_GPU_STEP", "0", 1);
  const auto e = OptimizerConfig::from_env();
  ::unsetenv("TIERSWAP_OVERLAP");
  ::unsetenv("TIERSWAP_OVERLAP_PARAM16_IN_PLACE");
  ::unsetenv("TIERSWAP_CONCURRENT_GPU_STEP");
  EXPECT_FALSE(e.concurrent_gpu_step);
  EXPECT_TRUE(e.overlap);
  EXPECT_TRUE(e.overlap_param16_in_place);
  EXPECT_EQ(e.state_tier, OptimizerConfig::StateTier::nvme);
  EXPECT_EQ(e.subgroup_size, 1u << 20);
  ::setenv("TIERSWAP_STATE_TIER", "ssd", 1);
  EXPECT_THROW(OptimizerConfig::from_env(), std::invalid_argument);
  ::unsetenv("TIERSWAP_STATE_TIER");
  ::unsetenv("TIERSWAP_SUBGROUP_SIZE");
}

// fp32 accumulation reads fp32 gradient blocks (statistics and kernel); with this model's exact
// sums it must give the very bits of 16-bit accumulation. bf16 moments halve the moments' bytes
// and stay close.
TEST(ShardedOptimizer, Fp32AccumulationAndBf16MomentsPaths) {
  Rig a;
  auto ma = test::start_model(*a.opt);
  test::train(*a.opt, ma, 1, 8, 0, 1);
  OptimizerConfig oc = test::model_config();
  oc.accumulate_fp32 = true;
  Rig b(tier_config(2 * kMiB, 128 * kKiB), oc);
  auto mb = test::start_model(*b.opt);
  test::train(*b.opt, mb, 1, 8, 0, 1);
  oc = test::model_config();
  oc.bf16_moments = true;
  Rig c(tier_config(2 * kMiB, 128 * kKiB), oc);
  auto mc = test::start_model(*c.opt);
  test::train(*c.opt, mc, 1, 8, 0, 1);
  EXPECT_EQ(c.opt->state_bytes() * 3, a.opt->state_bytes() * 2);  // 4 + 2 + 2 vs 4 + 4 + 4
  expect_same_state(*a.opt, ma, *b.opt, mb);
  for (std::size_t p = 0; p < ma.ids.size(); ++p) {
    if (!test::model_params()[p].trainable) continue;
    const auto x = full(*a.opt, ma.ids[p]);
    const auto z = full(*c.opt, mc.ids[p]);
    for (std::size_t i = 0; i < x.size(); ++i)
      ASSERT_NEAR(z[i], x[i], 1e-4) << test::model_params()[p].name << "[" << i << "]";
  }
}

TEST(ShardedOptimizer, FixedLossScaleNeverChangesAndStillSkipsOverflow) {
  OptimizerConfig oc = test::model_config();
  oc.loss_scaler.mode = LossScaling::fixed;
  oc.loss_scaler.init_scale = 512;
  Rig r(tier_config(2 * kMiB, 128 * kKiB), oc);
  auto m = test::start_model(*r.opt);
  const auto res = test::train(*r.opt, m, 1, 8, 0, 1);
  for (std::size_t i = 0; i < res.size(); ++i) {
    EXPECT_EQ(res[i].loss_scale, 512.0);
    EXPECT_EQ(res[i].next_loss_scale, 512.0);
    EXPECT_EQ(res[i].skipped, static_cast<int>(i + 1) == test::kOverflowStep);
  }
  EXPECT_EQ(r.opt->step_count(), 7u);
}

// A placement plan (an edited plan file): host-resident state for the first half of the rank's
// parameters, NVMe for the rest. Same bits as the ordinary run; each sub-group where the plan
// says; a plan that steps on the GPU is refused on a machine without one.
// A plan with GPU sub-groups on a simulated device tier (host memory standing in for the GPU, the
// CPU kernels standing in for the CUDA ones: the same bits): the state of the plan's tail lives in
// the device tier through steps, overflow discards, clipping redos and device-tier evictions, with
// gradients from host memory or from device memory (accumulated in the device tier where it holds
// them beside a step's views, else through host memory), and the run is bit-identical to an
// all-host one.
TEST(ShardedOptimizer, PlanGpuSubgroupsRunOnASimulatedDeviceTier) {
  Rig a;
  auto ma = test::start_model(*a.opt);
  test::train(*a.opt, ma, 1, 12, 0, 1);
  const Plan plan = three_tier_plan();
  for (const bool overlap : {false, true}) {
    for (const std::uint64_t device_budget : {4 * kMiB, 256 * kKiB, 128 * kKiB}) {
      // Gradients from device memory too below 1 MiB (at 128 KiB, through host memory).
      const bool device_grads = device_budget < kMiB;
      SCOPED_TRACE(fmt::format("overlap {}, device budget {}", overlap, device_budget));
      OptimizerConfig oc = test::model_config();
      oc.overlap = overlap;
      TierConfig tc = simulated_gpu_config(2 * kMiB, 128 * kKiB, device_budget);
      Rig b(tc, oc);
      ASSERT_EQ(b.tiers->device_tier(), DeviceTierMode::simulated);
      b.opt->set_plan(plan);
      auto mb = test::start_model(*b.opt);
      std::size_t on_gpu = 0, nvme = 0;
      for (std::size_t k = 0; k < b.opt->subgroup_count(); ++k) {
        const auto [tier, gpu] = b.opt->placement(k);
        EXPECT_EQ(gpu, tier == Tier::device) << k;
        on_gpu += tier == Tier::device;
        nvme += tier == Tier::nvme;
      }
      ASSERT_GT(on_gpu, 0u);
      ASSERT_GT(nvme, 0u);
      EXPECT_EQ(b.opt->placement(b.opt->subgroup_count() - 1).state_tier, Tier::device);
      const auto rb = test::train(*b.opt, mb, 1, 12, 0, 1, device_grads);
      // Gradients accumulate in the device tier where it holds them beside a step's views (and,
      // overlapped, an ingest's gradient); the smallest budget sends them through host memory.
      for (std::size_t k = 0; k < b.opt->subgroup_count(); ++k)
        EXPECT_EQ(b.opt->gradient_on_device(k),
                  b.opt->placement(k).gpu_steps && device_budget > 128 * kKiB)
            << k;
      EXPECT_TRUE(rb[test::kOverflowStep - 1].skipped);
      expect_same_state(*a.opt, ma, *b.opt, mb);
      expect_same_param16(*a.opt, ma, *b.opt, mb);
      const auto c = b.tiers->counters();
      EXPECT_GT(c.bytes_in[static_cast<int>(Tier::device)], 0u);
      if (device_budget < 256 * kKiB) EXPECT_GT(c.evictions, 0u) << "evicted under pressure";
      EXPECT_LE(c.peak_reserved_bytes[static_cast<int>(Tier::device)], device_budget);
      std::uint64_t device_state = 0;
      for (const auto& row : b.tiers->snapshot().classes)
        if (row.tier == Tier::device && row.cls != BlockClass::grad16) device_state += row.bytes;
      if (device_budget > kMiB) EXPECT_GT(device_state, 0u) << "the GPU sub-groups' state stays";
    }
  }
  // Without a device tier, GPU-resident state is refused by name.
  Rig c;
  c.opt->set_plan(plan);
  if (!device_info().available) {
    try {
      test::build_model(*c.opt);
      ADD_FAILURE() << "GPU-resident state accepted without a device tier";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("step on the GPU"), std::string::npos) << e.what();
    }
  }
}

// Gradients from device memory (add_grad_device) for the sub-groups a GPU steps are accumulated
// in the device tier and stepped there: on a simulated device tier (host memory standing in for
// the GPU's), with the GPU sub-groups' state memory-only there, no byte crosses between host and
// device after the first step, while gradients from host memory (add_grad) go up every step (and
// nothing comes down: a device view of a block's device copy copies nothing); the
// same bits as an all-host run, with and without overlap, with gradients spilled to NVMe for the
// CPU sub-groups. Misuse is refused by name.
TEST(ShardedOptimizer, DeviceGradientsStayInTheDeviceTier) {
  Rig a;
  auto ma = test::start_model(*a.opt);
  test::train(*a.opt, ma, 1, 12, 0, 1);
  const Plan plan = three_tier_plan();
  const int d = static_cast<int>(Tier::device);
  for (const bool overlap : {false, true}) {
    for (const Tier grad_tier : {Tier::host, Tier::nvme}) {
      // Bytes into and out of the device tier over steps 2..12: add_grad, add_grad_device.
      std::uint64_t up[2] = {}, down[2] = {};
      for (const bool device_grads : {false, true}) {
        SCOPED_TRACE(fmt::format("overlap {}, grad_tier {}, add_grad{}", overlap,
                                 to_string(grad_tier), device_grads ? "_device" : ""));
        OptimizerConfig oc = test::model_config();
        oc.overlap = overlap;
        oc.persist_resident_state = false;
        oc.grad_tier = grad_tier;
        TierConfig tc = simulated_gpu_config(4 * kMiB, 128 * kKiB, 4 * kMiB);
        Rig b(tc, oc);
        b.opt->set_plan(plan);
        auto mb = test::start_model(*b.opt);
        for (std::size_t k = 0; k < b.opt->subgroup_count(); ++k)
          EXPECT_EQ(b.opt->gradient_on_device(k), b.opt->placement(k).gpu_steps) << k;
        EXPECT_THROW(b.opt->gradient_on_device(b.opt->subgroup_count()), std::invalid_argument);
        test::train(*b.opt, mb, 1, 1, 0, 1, device_grads);
        const auto c0 = b.tiers->counters();
        const auto rb = test::train(*b.opt, mb, 2, 12, 0, 1, device_grads);
        const auto c1 = b.tiers->counters();
        EXPECT_TRUE(rb[test::kOverflowStep - 2].skipped);
        up[device_grads ? 1 : 0] = c1.bytes_in[d] - c0.bytes_in[d];
        down[device_grads ? 1 : 0] = c1.bytes_out[d] - c0.bytes_out[d];
        expect_same_state(*a.opt, ma, *b.opt, mb);
        expect_same_param16(*a.opt, ma, *b.opt, mb);
      }
      EXPECT_GT(up[0], 0u) << "host gradients go up to the GPU sub-groups every step";
      EXPECT_EQ(down[0], 0u) << "the GPU-resident state never comes down";
      EXPECT_EQ(up[1] + down[1], 0u) << "device gradients never leave the device tier";
    }
  }

  {  // misuse
    OptimizerConfig oc = test::model_config();
    Rig b(simulated_gpu_config(4 * kMiB, 128 * kKiB, 4 * kMiB), oc);
    b.opt->set_plan(plan);
    auto mb = test::start_model(*b.opt);
    std::vector<std::uint16_t> g(b.opt->param(mb.ids[0]).numel(), 0);
    EXPECT_THROW(b.opt->add_grad_device(mb.ids[0], g.data(), Dtype::f16, {}), std::logic_error);
    b.opt->begin_backward();
    void* event = g.data();  // no GPU here: any event is refused before it is used
    if (!device_info().available) {
      try {
        b.opt->add_grad_device(mb.ids[0], g.data(), Dtype::f16, std::span<void* const>(&event, 1));
        ADD_FAILURE() << "an event accepted without a GPU";
      } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("no GPU is usable"), std::string::npos) << e.what();
      }
    }
    EXPECT_THROW(b.opt->add_grad_device(mb.ids[0], nullptr, Dtype::f16, {}), std::invalid_argument);
    EXPECT_THROW(b.opt->add_grad_device(999, g.data(), Dtype::f16, {}), std::invalid_argument);
    for (std::size_t p = 0; p < mb.ids.size(); ++p)
      if (!test::model_params()[p].trainable)
        EXPECT_THROW(b.opt->add_grad_device(mb.ids[p], g.data(), Dtype::f16, {}),
                     std::invalid_argument);
    b.opt->end_backward();
  }
  if (!device_info().available) {  // neither a GPU nor a simulated device tier
    Rig c;
    auto mc = test::start_model(*c.opt);
    std::vector<std::uint16_t> g(c.opt->param(mc.ids[0]).numel(), 0);
    c.opt->begin_backward();
    try {
      c.opt->add_grad_device(mc.ids[0], g.data(), Dtype::f16, {});
      ADD_FAILURE() << "add_grad_device accepted without a GPU";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("no usable GPU"), std::string::npos) << e.what();
    }
    c.opt->end_backward();
  }
}

// bind_param16_device: the trainer's device copies of the 16-bit parameters (host memory standing
// in on a simulated device tier) equal param16() after binding, after every step (ordinary and
// overlapped, speculative 16-bit output in a scratch copy or in place, through an overflow and
// clipping steps, with GPU, host and NVMe sub-groups), already
// when on_param16_ready is called for a parameter, and after a step that failed and was rolled
// back; an unbound copy is left alone; misuse is refused by name.
TEST(ShardedOptimizer, BoundDeviceCopiesOfTheParam16FollowEveryStep) {
  Rig a;
  auto ma = test::start_model(*a.opt);
  test::train(*a.opt, ma, 1, 12, 0, 1);
  for (const int mode : {0, 1, 2}) {  // ordinary, overlapped, overlapped with param16 in place
    const bool overlap = mode > 0;
    SCOPED_TRACE(fmt::format("overlap {}, param16 in place {}", overlap, mode == 2));
    std::atomic<bool> fail{false};
    OptimizerConfig oc = test::model_config();
    oc.overlap = overlap;
    oc.overlap_param16_in_place = mode == 2;
    oc.persist_resident_state = false;
    Rig b(simulated_gpu_config(4 * kMiB, 128 * kKiB, 4 * kMiB), oc, 64 * kMiB,
          [&](const detail::IoRequest& q, std::uint64_t) {
            return fail.load() && q.op == IoOp::write
                       ? detail::Fault{detail::Fault::Kind::error, EIO}
                       : detail::Fault{};
          });
    b.opt->set_plan(three_tier_plan());
    auto mb = test::start_model(*b.opt);
    std::map<ParamId, std::vector<std::uint16_t>> bound;
    for (std::size_t p = 0; p < mb.ids.size(); ++p) {
      if (!test::model_params()[p].trainable) continue;
      auto& v = bound[mb.ids[p]];
      v.assign(b.opt->param(mb.ids[p]).numel(), 0xdead);
      b.opt->bind_param16_device(mb.ids[p], v.data());
    }
    auto expect_bound = [&](const char* when) {
      for (const auto& [id, v] : bound) {
        const auto x = b.opt->param16(id);
        EXPECT_TRUE(std::equal(x.begin(), x.end(), v.begin(), v.end()))
            << when << ": " << b.opt->param(id).name;
      }
    };
    expect_bound("bound");
    std::size_t calls = 0, stale = 0;
    b.opt->on_param16_ready([&](ParamId id, std::span<const std::uint16_t> v) {
      ++calls;
      const auto& d = bound.at(id);
      stale += !std::equal(v.begin(), v.end(), d.begin(), d.end());
    });
    for (int t = 1; t <= 6; ++t) {
      test::train(*b.opt, mb, t, t, 0, 1);
      expect_bound(fmt::format("step {}", t).c_str());
    }
    EXPECT_GT(calls, 0u);
    EXPECT_EQ(stale, 0u) << "on_param16_ready before the device copy was written";
    fail = true;  // a write error on the NVMe sub-groups: the step rolls back
    EXPECT_THROW(test::train(*b.opt, mb, 7, 7, 0, 1), std::system_error);
    fail = false;
    EXPECT_EQ(b.opt->step_count(), 5u);  // step 6 overflowed (skipped)
    expect_bound("rolled back");
    for (int t = 7; t <= 12; ++t) {
      test::train(*b.opt, mb, t, t, 0, 1);
      expect_bound(fmt::format("step {}", t).c_str());
    }
    EXPECT_EQ(stale, 0u);
    expect_same_state(*a.opt, ma, *b.opt, mb);
    expect_same_param16(*a.opt, ma, *b.opt, mb);
    // Unbound: left alone.
    const ParamId first = bound.begin()->first;
    b.opt->bind_param16_device(first, nullptr);
    std::fill(bound[first].begin(), bound[first].end(), 0xdead);
    test::train(*b.opt, mb, 13, 13, 0, 1);
    EXPECT_TRUE(std::all_of(bound[first].begin(), bound[first].end(),
                            [](std::uint16_t x) { return x == 0xdead; }));
  }
  {  // misuse
    Rig b(simulated_gpu_config(4 * kMiB, 128 * kKiB, 4 * kMiB));
    std::vector<std::uint16_t> v(1 << 16);
    EXPECT_THROW(b.opt->bind_param16_device(0, v.data()), std::logic_error);  // not finalized
    auto mb = test::start_model(*b.opt);
    EXPECT_THROW(b.opt->bind_param16_device(999, v.data()), std::invalid_argument);
    for (std::size_t p = 0; p < mb.ids.size(); ++p)
      if (!test::model_params()[p].trainable) {
        try {
          b.opt->bind_param16_device(mb.ids[p], v.data());
          ADD_FAILURE() << "a frozen parameter bound";
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("frozen"), std::string::npos) << e.what();
        }
      }
  }
  if (!device_info().available) {  // no GPU, no simulated device tier
    Rig c;
    auto mc = test::start_model(*c.opt);
    std::vector<std::uint16_t> v(c.opt->param(mc.ids[0]).numel());
    try {
      c.opt->bind_param16_device(mc.ids[0], v.data());
      ADD_FAILURE() << "bound without a GPU or a simulated device tier";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("no usable GPU"), std::string::npos) << e.what();
    }
  }
}

// A split plan (the first sub-groups' state and step on the GPU, the rest in host memory stepped
// by the CPU): with concurrent_gpu_step the GPU's part runs on its own thread beside the CPU's.
// The same bits as an all-host run and as the serial split, ordinary and overlapped, persisted
// and memory-only; a failure in the GPU's part rolls the step back and training goes on; the
// CPU's part does not wait for the GPU's (the order in which parameters become ready shows it).
TEST(ShardedOptimizer, SplitStepRunsTheGpuPartBesideTheCpuPart) {
  const Plan split = Plan::from_json(R"({"format": "tierswap.plan", "version": 1, "subgroups": [
      {"numel": 500, "state_tier": "gpu", "step_device": "gpu"},
      {"numel": 500, "state_tier": "host", "step_device": "cpu"}]})");
  Rig a;
  auto ma = test::start_model(*a.opt);
  test::train(*a.opt, ma, 1, 12, 0, 1);
  for (const bool concurrent : {true, false})
    for (const int mode : {0, 1, 2}) {  // persisted, memory-only, memory-only overlapped
      SCOPED_TRACE(fmt::format("concurrent {}, mode {}", concurrent, mode));
      OptimizerConfig oc = test::model_config();
      oc.concurrent_gpu_step = concurrent;
      oc.persist_resident_state = mode == 0;
      oc.overlap = mode == 2;
      Rig b(simulated_gpu_config(2 * kMiB, 128 * kKiB, 4 * kMiB), oc);
      b.opt->set_plan(split);
      auto mb = test::start_model(*b.opt);
      std::size_t gpu = 0;
      for (std::size_t k = 0; k < b.opt->subgroup_count(); ++k) gpu += b.opt->placement(k).gpu_steps;
      ASSERT_EQ(gpu, 2u);
      ASSERT_FALSE(b.opt->placement(b.opt->subgroup_count() - 1).gpu_steps);
      const auto rb = test::train(*b.opt, mb, 1, 12, 0, 1, mode == 1);
      for (std::size_t i = 0; i < rb.size(); ++i) {
        if (rb[i].skipped) continue;
        if (mode < 2) EXPECT_EQ(rb[i].gpu_subgroups, 2u) << "step " << i + 1;
        if (rb[i].gpu_subgroups > 0) EXPECT_GT(rb[i].gpu_seconds, 0.0) << "step " << i + 1;
      }
      expect_same_state(*a.opt, ma, *b.opt, mb);
      expect_same_param16(*a.opt, ma, *b.opt, mb);
    }

  // A read error in the GPU's part: after step 4 the GPU sub-groups' persisted state is dropped
  // from GPU and host memory, so step 5's GPU part reads it back from NVMe, and fails (the CPU's
  // part reads nothing: host state resident, gradients in host memory).
  for (const bool concurrent : {true, false}) {
    SCOPED_TRACE(fmt::format("read fault, concurrent {}", concurrent));
    std::atomic<bool> fail{false};
    std::atomic<std::uint64_t> failed{0};
    OptimizerConfig oc = test::model_config();
    oc.concurrent_gpu_step = concurrent;
    Rig b(simulated_gpu_config(4 * kMiB, 128 * kKiB, 4 * kMiB), oc, 64 * kMiB,
          [&](const detail::IoRequest& q, std::uint64_t) {
            if (q.op != IoOp::read || !fail.load()) return detail::Fault{};
            ++failed;
            return detail::Fault{detail::Fault::Kind::error, EIO};
          });
    b.opt->set_plan(split);
    auto mb = test::start_model(*b.opt);
    test::train(*b.opt, mb, 1, 4, 0, 1);
    for (int sg = 0; sg < 2; ++sg)
      for (const char* cls : {"master", "exp_avg", "exp_avg_sq"}) {
        const auto id = b.tiers->find(fmt::format("g0.r0.s{}.{}", sg, cls));
        ASSERT_TRUE(id) << sg << " " << cls;
        b.tiers->evict(*id, Tier::device);
        b.tiers->evict(*id, Tier::host);
      }
    fail = true;
    EXPECT_THROW(test::train(*b.opt, mb, 5, 5, 0, 1), std::system_error);
    fail = false;
    EXPECT_GT(failed.load(), 0u);
    EXPECT_EQ(b.opt->step_count(), 4u);
    test::train(*b.opt, mb, 5, 12, 0, 1);
    expect_same_state(*a.opt, ma, *b.opt, mb);
    expect_same_param16(*a.opt, ma, *b.opt, mb);
  }

  // Order: the GPU's sub-groups come first, and each takes ~50 ms for its gradient to cross a slow
  // simulated link (16 KiB at 0.33 MB/s) while the CPU's sub-groups take microseconds. w1 lies
  // in the GPU's sub-groups only; b1, b2 and w3 in the CPU's only. Serial: w1 is ready first.
  // Concurrent: the CPU's parameters are ready before it.
  for (const bool concurrent : {true, false}) {
    SCOPED_TRACE(fmt::format("order, concurrent {}", concurrent));
    OptimizerConfig oc = test::model_config();
    oc.concurrent_gpu_step = concurrent;
    TierConfig tc = simulated_gpu_config(2 * kMiB, 128 * kKiB, 4 * kMiB);
    tc.simulated_device_gbps = 0.00033;
    Rig b(tc, oc);
    b.opt->set_plan(split);
    auto mb = test::start_model(*b.opt);
    std::vector<std::string> order;
    b.opt->on_param16_ready([&](ParamId id, std::span<const std::uint16_t>) {
      order.push_back(b.opt->param(id).name);
    });
    test::train(*b.opt, mb, 1, 1, 0, 1);
    ASSERT_FALSE(order.empty());
    auto at = [&](const std::string& name) {
      return std::find(order.begin(), order.end(), name) - order.begin();
    };
    if (concurrent) {
      for (const char* cpu : {"b1", "b2", "w3"}) EXPECT_LT(at(cpu), at("w1")) << cpu;
    } else {
      EXPECT_EQ(order.front(), "w1");
    }
  }
}

// persist_resident_state = false: host-resident state in memory only. Bit-identical to the
// persisted run over overflow and clipping steps, with and without overlap, alone and beside
// NVMe-streamed sub-groups (a plan); no NVMe byte for it; a step failing on the NVMe side leaves it
// as it was; checkpoints round-trip in both directions; a budget that cannot hold it is refused by
// name.
TEST(ShardedOptimizer, MemoryOnlyResidentStateGivesTheSameBitsWithoutNvmeIo) {
  Rig a;
  auto ma = test::start_model(*a.opt);
  const auto ra = test::train(*a.opt, ma, 1, 12, 0, 1);
  const Plan split = Plan::from_json(R"({"format": "tierswap.plan", "version": 1, "subgroups": [
      {"numel": 1, "state_tier": "nvme", "step_device": "cpu"},
      {"numel": 1, "state_tier": "host", "step_device": "cpu"}]})");
  auto same16 = [&](ShardedOptimizer& b, const test::ModelOptimizer& mb) {
    expect_same_param16(*a.opt, ma, b, mb);
  };
  for (const bool overlap : {false, true}) {
    for (const bool with_plan : {false, true}) {
      SCOPED_TRACE(fmt::format("overlap {}, {}", overlap,
                               with_plan ? "half on NVMe by a plan" : "all in host memory"));
      OptimizerConfig oc = test::model_config();
      oc.overlap = overlap;
      oc.state_tier = OptimizerConfig::StateTier::host;
      oc.persist_resident_state = false;
      Rig b(tier_config(4 * kMiB, 128 * kKiB), oc);
      if (with_plan) b.opt->set_plan(split);
      auto mb = test::start_model(*b.opt);
      std::size_t host = 0;
      for (std::size_t k = 0; k < b.opt->subgroup_count(); ++k)
        host += b.opt->placement(k).state_tier == Tier::host;
      ASSERT_GT(host, 0u);
      const auto w0 = b.tiers->counters().bytes_in[static_cast<int>(Tier::nvme)];
      const auto rb = test::train(*b.opt, mb, 1, 12, 0, 1);
      const auto written = b.tiers->counters().bytes_in[static_cast<int>(Tier::nvme)] - w0;
      if (with_plan)
        EXPECT_GT(written, 0u);
      else
        EXPECT_EQ(written, 0u) << "memory-only state written to NVMe";
      std::uint32_t overlapped = 0;
      for (std::size_t i = 0; i < ra.size(); ++i) {
        EXPECT_EQ(ra[i].skipped, rb[i].skipped) << i;
        EXPECT_EQ(ra[i].clip_factor, rb[i].clip_factor) << i;
        overlapped += rb[i].overlapped_subgroups;
      }
      // Overlapped: the memory-only host state has undo copies (the budget holds them), so it
      // steps during the backward like the rest.
      if (overlap)
        EXPECT_GT(overlapped, 0u);
      else
        EXPECT_EQ(overlapped, 0u);
      expect_same_state(*a.opt, ma, *b.opt, mb);
      same16(*b.opt, mb);
    }
  }

  // A host budget that holds the memory-only state but undo copies for only some of it: those
  // step during the backward, the rest after the verdict, the same bits.
  {
    OptimizerConfig oc = test::model_config();
    oc.overlap = true;
    oc.state_tier = OptimizerConfig::StateTier::host;
    oc.persist_resident_state = false;
    std::uint64_t state = 0;
    {
      Rig probe(tier_config(4 * kMiB, 128 * kKiB), oc);
      test::build_model(*probe.opt);
      state = probe.opt->state_bytes();
    }
    bool partial = false;
    for (std::uint64_t budget = state; budget < 3 * state; budget += state / 16) {
      Rig b(tier_config(budget, 64 * kKiB), oc);
      test::ModelOptimizer mb;
      try {
        mb = test::start_model(*b.opt);
      } catch (const std::invalid_argument&) {
        continue;  // the memory-only state and gradients do not fit yet
      }
      const auto rb = test::train(*b.opt, mb, 1, 12, 0, 1);
      std::uint32_t most = 0;
      for (const auto& r : rb) most = std::max(most, r.overlapped_subgroups);
      if (most == 0 || most >= b.opt->subgroup_count()) continue;
      partial = true;
      SCOPED_TRACE(fmt::format("host budget {} B: {} of {} sub-groups overlapped", budget, most,
                               b.opt->subgroup_count()));
      for (std::size_t i = 0; i < ra.size(); ++i) EXPECT_EQ(ra[i].skipped, rb[i].skipped) << i;
      expect_same_state(*a.opt, ma, *b.opt, mb);
      same16(*b.opt, mb);
      break;
    }
    EXPECT_TRUE(partial) << "no budget gave undo copies for only some sub-groups";
  }

  // A step that fails on the NVMe side (a write error) leaves the memory-only half as it was,
  // and training goes on to the same bits; overlapped too, where the memory-only half was
  // stepped speculatively and its undo copies bring it back.
  for (const bool overlap : {false, true}) {
    SCOPED_TRACE(fmt::format("write fault, overlap {}", overlap));
    std::atomic<bool> fail{false};
    OptimizerConfig oc = test::model_config();
    oc.overlap = overlap;
    oc.persist_resident_state = false;
    Rig b(tier_config(4 * kMiB, 128 * kKiB), oc, 64 * kMiB,
          [&](const detail::IoRequest& q, std::uint64_t) {
            return fail.load() && q.op == IoOp::write
                       ? detail::Fault{detail::Fault::Kind::error, EIO}
                       : detail::Fault{};
          });
    b.opt->set_plan(split);
    auto mb = test::start_model(*b.opt);
    test::train(*b.opt, mb, 1, 6, 0, 1);
    std::vector<std::vector<float>> before;
    for (std::size_t p = 0; p < mb.ids.size(); ++p)
      if (test::model_params()[p].trainable) before.push_back(full(*b.opt, mb.ids[p]));
    fail = true;
    EXPECT_THROW(test::train(*b.opt, mb, 7, 7, 0, 1), std::system_error);
    fail = false;
    EXPECT_EQ(b.opt->step_count(), 5u);
    std::size_t i = 0;
    for (std::size_t p = 0; p < mb.ids.size(); ++p)
      if (test::model_params()[p].trainable)
        EXPECT_TRUE(same_bits(full(*b.opt, mb.ids[p]), before[i++]))
            << test::model_params()[p].name;
    test::train(*b.opt, mb, 7, 12, 0, 1);
    expect_same_state(*a.opt, ma, *b.opt, mb);
    same16(*b.opt, mb);

    // Checkpoints: memory-only -> persisted and persisted -> memory-only.
    TempDir ck;
    b.opt->save(ck.path());
    Rig c;
    auto mc = test::build_model(*c.opt);
    c.opt->load(ck.path());
    expect_same_state(*a.opt, ma, *c.opt, mc);
    TempDir ck2;
    a.opt->save(ck2.path());
    Rig d(tier_config(4 * kMiB, 128 * kKiB), oc);
    d.opt->set_plan(split);
    auto md = test::build_model(*d.opt);
    d.opt->load(ck2.path());
    expect_same_state(*a.opt, ma, *d.opt, md);
    same16(*d.opt, md);
  }

  // GPU-resident state too (a simulated device tier): the same bits, and fewer NVMe bytes than
  // the persisted run of the same plan, whose GPU and host state is committed at every step.
  const Plan three = three_tier_plan();
  for (const bool overlap : {false, true}) {
    SCOPED_TRACE(fmt::format("GPU-resident, overlap {}", overlap));
    std::uint64_t written[2] = {};
    for (const bool persist : {true, false}) {
      OptimizerConfig oc = test::model_config();
      oc.overlap = overlap;
      oc.persist_resident_state = persist;
      TierConfig tc = simulated_gpu_config(4 * kMiB, 128 * kKiB, 4 * kMiB);
      Rig g(tc, oc);
      g.opt->set_plan(three);
      auto mg = test::start_model(*g.opt);
      const auto w0 = g.tiers->counters().bytes_in[static_cast<int>(Tier::nvme)];
      const auto rg = test::train(*g.opt, mg, 1, 12, 0, 1);
      written[persist ? 0 : 1] = g.tiers->counters().bytes_in[static_cast<int>(Tier::nvme)] - w0;
      // Overlapped: every sub-group steps during the backward, the memory-only GPU and host
      // ones too (their undo copies fit the budgets).
      std::uint32_t most = 0;
      for (const auto& r : rg) most = std::max(most, r.overlapped_subgroups);
      EXPECT_EQ(most, overlap ? g.opt->subgroup_count() : 0u);
      expect_same_state(*a.opt, ma, *g.opt, mg);
      same16(*g.opt, mg);
    }
    EXPECT_GT(written[1], 0u);  // the NVMe sub-groups
    EXPECT_LT(written[1], written[0] / 2) << written[1] << " of " << written[0];
  }
  {  // memory-only GPU state larger than the device budget
    OptimizerConfig oc = test::model_config();
    oc.persist_resident_state = false;
    Rig g(simulated_gpu_config(4 * kMiB, 128 * kKiB, 64 * kKiB), oc);
    g.opt->set_plan(three);
    try {
      test::build_model(*g.opt);
      ADD_FAILURE() << "memory-only GPU state larger than the device budget accepted";
    } catch (const std::invalid_argument& err) {
      EXPECT_NE(std::string(err.what()).find("device budget"), std::string::npos) << err.what();
    }
  }

  // Memory-only state that the budget cannot hold.
  OptimizerConfig oc = test::model_config();
  oc.state_tier = OptimizerConfig::StateTier::host;
  oc.persist_resident_state = false;
  Rig e(tier_config(256 * kKiB, 64 * kKiB), oc);
  try {
    test::build_model(*e.opt);
    ADD_FAILURE() << "memory-only state larger than the budget accepted";
  } catch (const std::invalid_argument& err) {
    EXPECT_NE(std::string(err.what()).find("persist_resident_state"), std::string::npos)
        << err.what();
  }
}

TEST(ShardedOptimizer, FinalizePlacesSubgroupsByAPlanFile) {
  Rig a;
  auto ma = test::start_model(*a.opt);
  test::train(*a.opt, ma, 1, 6, 0, 1);
  TempDir d;
  const auto file = d.path() / "plan.json";
  std::ofstream(file) << R"({"format": "tierswap.plan", "version": 1, "subgroups": [
      {"numel": 500, "state_tier": "host", "step_device": "cpu"},
      {"numel": 500, "state_tier": "nvme", "step_device": "cpu"}]})";
  OptimizerConfig oc = test::model_config();
  oc.plan_file = file.string();
  Rig b(tier_config(2 * kMiB, 128 * kKiB), oc);
  auto mb = test::start_model(*b.opt);
  std::size_t host = 0, nvme = 0;
  for (std::size_t k = 0; k < b.opt->subgroup_count(); ++k) {
    const auto [tier, gpu] = b.opt->placement(k);
    EXPECT_FALSE(gpu);
    host += tier == Tier::host;
    nvme += tier == Tier::nvme;
  }
  EXPECT_GT(host, 0u);
  EXPECT_GT(nvme, 0u);
  EXPECT_EQ(b.opt->placement(0).state_tier, Tier::host);
  EXPECT_EQ(b.opt->placement(b.opt->subgroup_count() - 1).state_tier, Tier::nvme);
  test::train(*b.opt, mb, 1, 6, 0, 1);
  expect_same_state(*a.opt, ma, *b.opt, mb);

  // set_plan() with GPU sub-groups: refused at finalize() without a usable GPU.
  if (!device_info().available) {
    Plan gpu = Plan::from_json(R"({"format": "tierswap.plan", "version": 1, "subgroups": [
        {"numel": 1, "state_tier": "gpu", "step_device": "gpu"}]})");
    Rig c;
    c.opt->set_plan(gpu);
    try {
      test::build_model(*c.opt);
      ADD_FAILURE() << "a GPU plan was accepted without a GPU";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("no GPU is usable"), std::string::npos) << e.what();
    }
  }
  // A missing plan file names itself.
  oc.plan_file = (d.path() / "missing.json").string();
  Rig e(tier_config(2 * kMiB, 128 * kKiB), oc);
  try {
    test::build_model(*e.opt);
    ADD_FAILURE() << "a missing plan file was accepted";
  } catch (const std::invalid_argument& err) {
    EXPECT_NE(std::string(err.what()).find("missing.json"), std::string::npos) << err.what();
  }
}
