// ShardedOptimizer at world size 1, the overlapped step: bit-identical to the ordinary step, and
// redoing what changed after the speculation.
// (Multi-rank runs: optimizer_mpi under mpirun.)
#include "optim_fixture.hpp"

using namespace tierswap::optim_test;

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
  EXPECT_TRUE(b.opt->speculation_pending());
  EXPECT_THROW(b.opt->save(ck.path()), std::logic_error);
  // the state is not the committed one yet: gather refuses it (it returned speculative values)
  const auto& params = test::model_params();
  const ParamId trained =
      mb.ids[std::find_if(params.begin(), params.end(), [](const auto& p) { return p.trainable; }) -
             params.begin()];
  EXPECT_THROW(b.opt->gather(trained, BlockClass::exp_avg), std::logic_error);
  EXPECT_THROW(b.opt->set_overlap(false), std::logic_error);
  b.opt->step();
  EXPECT_FALSE(b.opt->speculation_pending());
  EXPECT_NO_THROW(b.opt->gather(trained, BlockClass::exp_avg));
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
