// ShardedOptimizer::lend_grad: a step that reads the gradients where the trainer left them is
// bit-identical to one that copied them (statistics, clipping, skipping, every state slot and
// the 16-bit output), in every mix with copied gradients, and a step that throws before it
// stepped keeps nothing pointing into the trainer's memory. drop_grads forgets a hand-over.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "optim_fixture.hpp"

namespace tierswap::optim_test {
namespace {

// One gradient per step of the model (one sample), f16; step 4 carries an inf in w2.
std::vector<std::uint16_t> grad_of(int t, std::size_t p, std::uint64_t n) {
  std::vector<std::uint16_t> g(n);
  for (std::uint64_t i = 0; i < n; ++i) {
    const float v = t == 4 && p == 2 && i == 5000 ? INFINITY : test::sample_grad(t, 0, 1, p, i);
    g[i] = float_to_f16(v * 8);
  }
  return g;
}

OptimizerConfig config(std::uint64_t subgroup, OptimizerConfig::StateTier tier) {
  OptimizerConfig c = test::model_config();
  c.subgroup_size = subgroup;
  c.state_tier = tier;
  return c;
}

struct Pair {
  Rig copied, lent;
  test::ModelOptimizer mc, ml;
  Pair(const OptimizerConfig& oc)
      : copied(tier_config(2 * kMiB, 128 * kKiB), oc), lent(tier_config(2 * kMiB, 128 * kKiB), oc) {
    mc = test::start_model(*copied.opt);
    ml = test::start_model(*lent.opt);
  }
  void expect_same(const StepResult& a, const StepResult& b, int t) {
    SCOPED_TRACE(fmt::format("step {}", t));
    EXPECT_EQ(a.skipped, b.skipped);
    EXPECT_EQ(std::memcmp(&a.grad_norm, &b.grad_norm, sizeof(double)), 0);
    EXPECT_EQ(a.clip_factor, b.clip_factor);
    expect_same_state(*copied.opt, mc, *lent.opt, ml);
    expect_same_param16(*copied.opt, mc, *lent.opt, ml);
  }
};

std::uint64_t numel(ShardedOptimizer& opt, const test::ModelOptimizer& m, std::size_t p) {
  return opt.param(m.ids[p]).numel();
}

TEST(LendGrad, StepsBitIdenticalToCopiedGradients) {
  // 8192: a sub-group is one statistics chunk, and those spanning two parameters are gathered;
  // 32768: runs of whole chunks inside one parameter. State on NVMe and in host memory.
  for (const std::uint64_t sub : {8192u, 32768u}) {
    for (const auto tier : {OptimizerConfig::StateTier::nvme, OptimizerConfig::StateTier::host}) {
      SCOPED_TRACE(fmt::format("sub-group {}, state {}", sub,
                               tier == OptimizerConfig::StateTier::nvme ? "nvme" : "host"));
      Pair r(config(sub, tier));
      for (int t = 1; t <= 6; ++t) {
        // Lent gradients one value past an aligned start: the kernels read them unaligned.
        std::vector<std::vector<std::uint16_t>> kept;
        r.copied.opt->begin_backward();
        r.lent.opt->begin_backward();
        for (std::size_t p = 0; p < test::model_params().size(); ++p) {
          if (!test::model_params()[p].trainable) continue;
          auto g = grad_of(t, p, numel(*r.copied.opt, r.mc, p));
          r.copied.opt->add_grad(r.mc.ids[p], g.data(), Dtype::f16);
          g.insert(g.begin(), 0);
          kept.push_back(std::move(g));
          r.lent.opt->lend_grad(r.ml.ids[p], kept.back().data() + 1, Dtype::f16);
        }
        r.copied.opt->end_backward();
        r.lent.opt->end_backward();
        const StepResult a = r.copied.opt->step();
        const StepResult b = r.lent.opt->step();
        EXPECT_EQ(a.lent_subgroups, 0u);
        EXPECT_EQ(b.lent_subgroups, r.lent.opt->subgroup_count());
        EXPECT_EQ(b.skipped, t == 4);
        r.expect_same(a, b, t);
      }
    }
  }
}

TEST(LendGrad, MixedWithCopiesPartlyLentAndLentTwiceStaysBitIdentical) {
  Pair r(config(8192, OptimizerConfig::StateTier::nvme));
  std::vector<std::vector<std::uint16_t>> kept;
  for (int t = 1; t <= 3; ++t) {
    r.copied.opt->begin_backward();
    r.lent.opt->begin_backward();
    for (std::size_t p = 0; p < test::model_params().size(); ++p) {
      if (!test::model_params()[p].trainable) continue;
      if (p == 5 && t == 2) continue;  // w3 without a gradient: its sub-groups are lent in part
      const auto g = grad_of(t, p, numel(*r.copied.opt, r.mc, p));
      kept.push_back(g);
      const std::uint16_t* gl = kept.back().data();
      if (p == 0) {  // w1 twice: the second is added to the first, lent or not
        r.copied.opt->add_grad(r.mc.ids[p], g.data(), Dtype::f16);
        r.lent.opt->lend_grad(r.ml.ids[p], gl, Dtype::f16);
      }
      if (p == 2) {  // w2 in fp32: not the accumulation dtype, so copied (cast)
        std::vector<float> f(g.size());
        for (std::size_t i = 0; i < g.size(); ++i) f[i] = f16_to_float(g[i]);
        r.copied.opt->add_grad(r.mc.ids[p], f.data(), Dtype::f32);
        r.lent.opt->lend_grad(r.ml.ids[p], f.data(), Dtype::f32);
        continue;
      }
      r.copied.opt->add_grad(r.mc.ids[p], g.data(), Dtype::f16);
      if (p == 4)  // b2 copied into a sub-group whose other slices are lent
        r.lent.opt->add_grad(r.ml.ids[p], gl, Dtype::f16);
      else
        r.lent.opt->lend_grad(r.ml.ids[p], gl, Dtype::f16);
    }
    r.copied.opt->end_backward();
    r.lent.opt->end_backward();
    const StepResult a = r.copied.opt->step();
    const StepResult b = r.lent.opt->step();
    r.expect_same(a, b, t);
  }
}

TEST(LendGrad, NotLentWhereItCannotBe) {
  // A backward that is not the step's last: its gradient must outlive the caller's memory.
  Pair r(config(8192, OptimizerConfig::StateTier::nvme));
  std::vector<std::uint16_t> scratch;
  for (const bool final : {false, true}) {
    r.copied.opt->begin_backward(final);
    r.lent.opt->begin_backward(final);
    for (std::size_t p = 0; p < test::model_params().size(); ++p) {
      if (!test::model_params()[p].trainable) continue;
      scratch = grad_of(final ? 2 : 1, p, numel(*r.copied.opt, r.mc, p));
      r.copied.opt->add_grad(r.mc.ids[p], scratch.data(), Dtype::f16);
      r.lent.opt->lend_grad(r.ml.ids[p], scratch.data(), Dtype::f16);
      std::fill(scratch.begin(), scratch.end(), 0x7c00);  // inf: must not be read later
    }
    r.copied.opt->end_backward();
    r.lent.opt->end_backward();
  }
  const StepResult a = r.copied.opt->step(), b = r.lent.opt->step();
  EXPECT_FALSE(b.skipped);
  EXPECT_EQ(b.lent_subgroups, 0u);  // every sub-group held the first backward's gradient
  r.expect_same(a, b, 1);
}

TEST(LendGrad, AStepThatThrowsBeforeSteppingCopiesTheLentGradientsIn) {
  Pair r(config(8192, OptimizerConfig::StateTier::nvme));
  std::vector<std::vector<std::uint16_t>> kept;
  r.copied.opt->begin_backward();
  r.lent.opt->begin_backward();
  for (std::size_t p = 0; p < test::model_params().size(); ++p) {
    if (!test::model_params()[p].trainable) continue;
    kept.push_back(grad_of(1, p, numel(*r.copied.opt, r.mc, p)));
    r.copied.opt->add_grad(r.mc.ids[p], kept.back().data(), Dtype::f16);
    r.lent.opt->lend_grad(r.ml.ids[p], kept.back().data(), Dtype::f16);
  }
  EXPECT_THROW(r.lent.opt->step(), std::logic_error);          // still in the backward
  for (auto& g : kept) std::fill(g.begin(), g.end(), 0x7c00);  // the trainer's memory reused
  r.copied.opt->end_backward();
  r.lent.opt->end_backward();
  const StepResult a = r.copied.opt->step(), b = r.lent.opt->step();
  EXPECT_FALSE(b.skipped);
  EXPECT_EQ(b.lent_subgroups, 0u);
  r.expect_same(a, b, 1);
}

TEST(LendGrad, DropGradsForgetsWhatWasHandedOver) {
  for (const bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlap" : "no overlap");
    OptimizerConfig oc = config(8192, OptimizerConfig::StateTier::nvme);
    oc.overlap = overlap;
    Pair r(oc);
    std::vector<std::vector<std::uint16_t>> kept;
    r.lent.opt->begin_backward();
    for (std::size_t p = 0; p < test::model_params().size(); ++p) {
      if (!test::model_params()[p].trainable) continue;
      kept.push_back(grad_of(1, p, numel(*r.lent.opt, r.ml, p)));
      r.lent.opt->lend_grad(r.ml.ids[p], kept.back().data(), Dtype::f16);
      if (p == 0) r.lent.opt->add_grad(r.ml.ids[p], kept.back().data(), Dtype::f16);
    }
    EXPECT_THROW(r.lent.opt->drop_grads(), std::logic_error);  // during the backward
    r.lent.opt->end_backward();
    r.lent.opt->drop_grads();
    kept.clear();                            // nothing may read it now
    for (Rig* rig : {&r.copied, &r.lent}) {  // both step on zero gradients
      rig->opt->begin_backward();
      rig->opt->end_backward();
    }
    const StepResult a = r.copied.opt->step(), b = r.lent.opt->step();
    EXPECT_EQ(b.grad_norm, 0.0);
    r.expect_same(a, b, 1);
  }
}

}  // namespace
}  // namespace tierswap::optim_test
