// ShardedOptimizer at world size 1, the step: torch.optim.AdamW semantics over groups,
// accumulation, clipping and loss scaling; NVMe traffic of 12 B read + 12 B written per parameter
// and no fp32 gradient; results independent of state tier and threads; Lion and SGD; fp32
// accumulation and bf16 moments; a fixed loss scale; a failed step leaves the state intact.
// (Multi-rank runs: optimizer_mpi under mpirun.)
#include "optim_fixture.hpp"
#include "tierswap/tiered_optimizer.hpp"

using namespace tierswap::optim_test;

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
    // The commit waited for those writes: its time is part of the step's, and counted apart
    // from the acquires' waits.
    EXPECT_GT(s.commit_seconds, 0) << "step " << step;
    EXPECT_LE(s.commit_seconds + s.io_wait_seconds, s.seconds) << "step " << step;
  }
  const TierCounters c = r.tiers->counters();
  EXPECT_LE(c.peak_reserved_bytes[static_cast<int>(Tier::host)], budget);
  EXPECT_GT(c.peak_reserved_bytes[static_cast<int>(Tier::host)], 0u);
  EXPECT_GE(r.opt->state_bytes(), 2 * budget);
}

// alternate_step_order: a step begins where the last one ended, so the state the budget still
// holds is stepped before it is evicted, instead of being evicted just before it is needed (the
// least-recently-used eviction against the same order every step keeps nothing). The order
// changes no bits.
TEST(ShardedOptimizer, AlternateStepOrderReadsOnlyWhatTheBudgetDoesNotHoldWithTheSameBits) {
  const std::uint64_t n = 1 << 18;  // 16 sub-groups of 16Ki: 3 MiB of state, 2x the budget
  const std::uint64_t budget = 1536 * kKiB;
  struct Run {
    std::unique_ptr<Rig> r;
    ParamId p = 0;
    std::vector<std::uint64_t> reads;  // NVMe bytes read by each step
  };
  auto start = [&](bool alternate) {
    OptimizerConfig oc;
    oc.subgroup_size = 1 << 14;
    oc.state_tier = OptimizerConfig::StateTier::nvme;
    oc.max_grad_norm = 0.5;  // the norm, summed in one order whatever the step order
    oc.alternate_step_order = alternate;
    TierConfig tc = tier_config(budget, 128 * kKiB);  // tuned as the one-object setup does it
    tune_tier_config(tc, oc, 3);
    tc.host_slab_size = 128 * kKiB;  // not whole huge pages: they would not fit the budget
    size_pageable_budget(tc, oc, 2 * n);
    Run x;
    x.r = std::make_unique<Rig>(tc, oc);
    x.r->opt->add_group(GroupConfig{});
    x.p = x.r->opt->add_param(0, {"w", {512, 512}, Dtype::bf16, true});
    x.r->opt->finalize();
    x.r->opt->initialize([](ParamId, std::uint64_t off, float* out, std::uint64_t k) {
      for (std::uint64_t i = 0; i < k; ++i) out[i] = 0.001f * static_cast<float>((off + i) % 97);
    });
    return x;
  };
  Run alt = start(true), asc = start(false);
  std::vector<std::uint16_t> g(n);
  const int nv = static_cast<int>(Tier::nvme);
  for (int step = 1; step <= 7; ++step) {
    for (std::uint64_t i = 0; i < n; ++i) g[i] = float_to_bf16(0.01f * ((i * step) % 13) - 0.06f);
    for (Run* x : {&alt, &asc}) {
      const std::uint64_t r0 = x->r->tiers->counters().bytes_out[nv];
      x->r->opt->begin_backward();
      x->r->opt->add_grad(x->p, g.data(), Dtype::bf16);
      x->r->opt->end_backward();
      const StepResult s = x->r->opt->step();
      ASSERT_FALSE(s.skipped);
      EXPECT_LT(s.clip_factor, 1.0) << "step " << step;
      x->reads.push_back(x->r->tiers->counters().bytes_out[nv] - r0);
    }
    // The 16-bit output is in memory (the state is compared once at the end: reading it goes
    // through the same budget and would evict what the next step finds).
    const auto a16 = alt.r->opt->param16(alt.p), b16 = asc.r->opt->param16(asc.p);
    ASSERT_TRUE(std::equal(a16.begin(), a16.end(), b16.begin(), b16.end())) << "step " << step;
  }
  EXPECT_TRUE(same_bits(full(*alt.r->opt, alt.p), full(*asc.r->opt, asc.p)));
  for (auto cls : {BlockClass::exp_avg, BlockClass::exp_avg_sq})
    EXPECT_TRUE(same_bits(full(*alt.r->opt, alt.p, cls), full(*asc.r->opt, asc.p, cls)))
        << to_string(cls);
  // From step 2 on, the steps in ascending order read nearly all of the state every time; in
  // alternating order they read what the budget did not keep: the budget holds 8 of the 16
  // sub-groups, the read-ahead window is 3 of them.
  for (std::size_t t = 1; t < alt.reads.size(); ++t) {
    SCOPED_TRACE(fmt::format("step {}", t + 1));
    EXPECT_GE(asc.reads[t], 12 * n - budget / 8);
    EXPECT_LE(alt.reads[t], 12 * n - budget * 3 / 4);
  }
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

// step(clip_factor): the caller's clip factor (torch's clip_grad_norm_ coefficient, for
// tierswap.torch's clip_grad_norm_) is applied as the native one would be, and only to that step.
TEST(ShardedOptimizer, ACallersClipFactorStepsAsTheNativeClipWithThatFactor) {
  OptimizerConfig clipped;
  clipped.subgroup_size = 8192;
  clipped.max_grad_norm = 1.0;
  OptimizerConfig plain = clipped;
  plain.max_grad_norm = 0;
  Rig a(tier_config(2 * kMiB, 128 * kKiB), clipped), b(tier_config(2 * kMiB, 128 * kKiB), plain);
  const std::uint64_t n = 10007;
  std::vector<float> init(n);
  for (std::uint64_t i = 0; i < n; ++i) init[i] = std::sin(0.1f * i);
  ParamId ids[2];
  for (Rig* r : {&a, &b}) {
    r->opt->add_group(GroupConfig{});
    ids[r == &b] = r->opt->add_param(0, {"w", {n}, Dtype::bf16, true});
    r->opt->finalize();
    r->opt->initialize([&](ParamId, std::uint64_t off, float* out, std::uint64_t k) {
      std::memcpy(out, init.data() + off, k * 4);
    });
  }
  EXPECT_THROW(a.opt->step(0.5), std::invalid_argument);  // max_grad_norm set: twice
  for (double bad : {0.0, -0.5, 1.5, std::nan("")})
    EXPECT_THROW(b.opt->step(bad), std::invalid_argument) << bad;
  std::vector<std::uint16_t> g(n);
  for (int t = 1; t <= 4; ++t) {
    for (std::uint64_t i = 0; i < n; ++i) g[i] = float_to_bf16(std::cos(0.37f * i * t));
    for (Rig* r : {&a, &b}) {
      r->opt->begin_backward();
      r->opt->add_grad(ids[r == &b], g.data(), Dtype::bf16);
    }
    // A step() refused mid-backward does not keep its factor for the next one.
    EXPECT_THROW(b.opt->step(0.25), std::logic_error);
    for (Rig* r : {&a, &b}) r->opt->end_backward();
    const StepResult ra = a.opt->step();
    ASSERT_LT(ra.clip_factor, 1.0);  // norm ~70: clipped
    const StepResult rb = t == 4 ? b.opt->step() : b.opt->step(ra.clip_factor);
    if (t < 4) {
      EXPECT_EQ(rb.clip_factor, ra.clip_factor);
      EXPECT_TRUE(same_bits(full(*a.opt, ids[0]), full(*b.opt, ids[1]))) << "step " << t;
    } else {
      EXPECT_EQ(rb.clip_factor, 1.0);  // no factor: unclipped
      EXPECT_FALSE(same_bits(full(*a.opt, ids[0]), full(*b.opt, ids[1])));
    }
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
      // Ascending every step, so that step 3 begins with state it must read and fails before
      // it hands out any 16-bit values (in alternating order it begins with what step 2 left in
      // memory, steps that, and its rollback must then read master weights from the failing
      // disk: StaleParam16AfterAFailedRollbackIsRestoredBeforeTheNextBackward is that case).
      oc.alternate_step_order = false;
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

// A gradient the tiers cannot take in the middle of a backward (the gradients wait on NVMe between
// micro-batches, and reading one back to add to it fails): add_grad throws, and the backward is
// abandoned: its gradients dropped, the sub-groups already stepped on them speculatively
// discarded, the backward over. The state is the committed one, and the step's backward passes
// done again train on bit for bit as if nothing had failed. Before, the backward stayed open
// (the next begin_backward() refused) and speculative results stayed in memory; with the
// gradients in host memory this happened only when an eviction's write failed under add_grad,
// one run in a few hundred of the test above.
TEST(ShardedOptimizer, AGradientTheTiersCannotTakeAbandonsTheBackward) {
  Rig clean;
  auto mc = test::start_model(*clean.opt);
  test::train(*clean.opt, mc, 1, 3, 0, 1);
  for (const bool overlap : {false, true}) {
    SCOPED_TRACE(fmt::format("overlap {}", overlap));
    std::atomic<bool> fail{false};
    OptimizerConfig oc = test::model_config();
    oc.overlap = overlap;
    oc.grad_tier = Tier::nvme;  // each micro-batch's gradients written down, read back to add to
    Rig r(tier_config(256 * kKiB, 64 * kKiB), oc, 64 * kMiB,
          [&](const detail::IoRequest& q, std::uint64_t) {
            return fail.load() && q.op == IoOp::read
                       ? detail::Fault{detail::Fault::Kind::error, EIO}
                       : detail::Fault{};
          });
    auto m = test::start_model(*r.opt);
    test::train(*r.opt, m, 1, 2, 0, 1);
    const auto master = full(*r.opt, m.ids[0]);
    const auto avg = full(*r.opt, m.ids[0], BlockClass::exp_avg);
    for (int u = 0; u + 1 < test::kMicroSteps; ++u) {
      r.opt->begin_backward(false);
      test::add_micro_grads(*r.opt, m, 3, u, 0, 1);
      r.opt->end_backward();
    }
    r.opt->begin_backward(true);  // the final one: sub-groups complete as their gradients come
    std::vector<std::uint16_t> g16;
    std::string why;
    for (std::size_t p = 0; p < test::model_params().size() && why.empty(); ++p) {
      if (!test::model_params()[p].trainable) continue;
      test::micro_grad16(*r.opt, m, 3, test::kMicroSteps - 1, 0, 1, p, g16);
      // From the middle on, a read-back fails: the first of a sub-group not added to yet
      fail = 2 * p >= test::model_params().size();
      try {
        r.opt->add_grad(m.ids[p], g16.data(), Dtype::f16);
      } catch (const std::system_error& e) {
        why = e.what();
      }
    }
    fail = false;
    EXPECT_NE(why.find("add_grad: "), std::string::npos) << why;
    EXPECT_NE(why.find("the backward is abandoned"), std::string::npos) << why;
    EXPECT_EQ(why.find("Input/output error: Input/output error"), std::string::npos) << why;
    EXPECT_FALSE(r.opt->in_backward());
    EXPECT_THROW(r.opt->end_backward(), std::logic_error);  // over already
    EXPECT_EQ(r.opt->step_count(), 2u);
    EXPECT_TRUE(same_bits(full(*r.opt, m.ids[0]), master));
    EXPECT_TRUE(same_bits(full(*r.opt, m.ids[0], BlockClass::exp_avg), avg));
    test::train(*r.opt, m, 3, 3, 0, 1);  // step 3's backward passes again, from the first
    expect_same_state(*clean.opt, mc, *r.opt, m);
  }
}

// A failed step whose rollback cannot read the master weights back (the disk fails again and
// again) leaves the 16-bit parameters half restored: param16() refuses them, the next
// begin_backward() restores them and throws (the forward pass ran on them), and training then goes
// on bit for bit as if nothing had failed.
TEST(ShardedOptimizer, StaleParam16AfterAFailedRollbackIsRestoredBeforeTheNextBackward) {
  Rig clean;
  auto mc = test::start_model(*clean.opt);
  test::train(*clean.opt, mc, 1, 3, 0, 1);
  std::atomic<bool> fail{false};
  bool arm = false;
  OptimizerConfig oc = test::model_config();
  oc.subgroup_size = 8192;  // several sub-groups: the step hands some out, then fails
  Rig r(tier_config(256 * kKiB, 64 * kKiB), oc, 64 * kMiB,
        [&](const detail::IoRequest&, std::uint64_t) {
          return fail.load() ? detail::Fault{detail::Fault::Kind::error, EIO} : detail::Fault{};
        });
  auto m = test::start_model(*r.opt);
  r.opt->on_param16_ready([&](ParamId, std::span<const std::uint16_t>) {
    if (arm) fail = true;  // every read and write fails from the first hand-out on
  });
  test::train(*r.opt, m, 1, 2, 0, 1);
  const auto p16 =
      std::vector<std::uint16_t>(r.opt->param16(m.ids[0]).begin(), r.opt->param16(m.ids[0]).end());
  arm = true;
  EXPECT_THROW(test::train(*r.opt, m, 3, 3, 0, 1), std::system_error);
  arm = false;
  EXPECT_EQ(r.opt->step_count(), 2u);
  try {
    (void)r.opt->param16(m.ids[0]);
    ADD_FAILURE() << "param16() handed out values the rollback could not restore";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("stale"), std::string::npos) << e.what();
  }
  EXPECT_THROW(r.opt->begin_backward(), std::system_error);  // the disk still fails
  fail = false;
  try {
    r.opt->begin_backward();
    ADD_FAILURE() << "begin_backward() after restoring stale values must ask for a new forward";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), EIO);
    EXPECT_NE(std::string(e.what()).find("run the forward pass again"), std::string::npos)
        << e.what();
  }
  const auto now = r.opt->param16(m.ids[0]);
  EXPECT_TRUE(std::equal(now.begin(), now.end(), p16.begin(), p16.end()));
  EXPECT_EQ(test::train(*r.opt, m, 3, 3, 0, 1).back().step, 3u);
  expect_same_state(*clean.opt, mc, *r.opt, m);
  expect_same_param16(*clean.opt, mc, *r.opt, m);
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

// leave_alone(): the middle of three ragged parameters (spanning sub-groups) keeps its state and
// 16-bit values through the step; the other two step exactly as without the call. With state on
// NVMe, in the overlapped mode (its speculative results redone) and with lent gradients.
struct LeaveAloneCase {
  bool overlap, lend;
};
class LeaveAlone : public ::testing::TestWithParam<LeaveAloneCase> {};

TEST_P(LeaveAlone, KeepsTheParameterAndStepsTheOthersAsWithoutIt) {
  const auto c = GetParam();
  OptimizerConfig oc;
  oc.subgroup_size = 8192;
  oc.state_tier = OptimizerConfig::StateTier::nvme;
  oc.overlap = c.overlap;
  const std::uint64_t sizes[] = {5000, 20000, 3001};
  auto make = [&](Rig& r, std::vector<ParamId>& ids) {
    r.opt->add_group(GroupConfig{});  // AdamW, weight decay 1e-2: a zero gradient still moves it
    for (int i = 0; i < 3; ++i)
      ids.push_back(r.opt->add_param(
          0, {fmt::format("p{}", i), {static_cast<std::int64_t>(sizes[i])}, Dtype::bf16, true}));
    r.opt->finalize();
    r.opt->initialize([](ParamId id, std::uint64_t off, float* out, std::uint64_t k) {
      for (std::uint64_t i = 0; i < k; ++i)
        out[i] = 0.01f * static_cast<float>((off + i + id) % 89);
    });
  };
  auto backward = [&](Rig& r, const std::vector<ParamId>& ids, int step, bool skip_mid) {
    r.opt->begin_backward();
    static std::vector<std::uint16_t> g[3];
    for (int i = 0; i < 3; ++i) {
      if (skip_mid && i == 1) continue;
      g[i].resize(sizes[i]);
      for (std::uint64_t j = 0; j < sizes[i]; ++j)
        g[i][j] = float_to_bf16(0.01f * static_cast<float>((j * (step + i)) % 17) - 0.08f);
      if (c.lend)
        r.opt->lend_grad(ids[i], g[i].data(), Dtype::bf16);
      else
        r.opt->add_grad(ids[i], g[i].data(), Dtype::bf16);
    }
    r.opt->end_backward();
  };
  Rig a(tier_config(2 * kMiB, 64 * kKiB), oc), b(tier_config(2 * kMiB, 64 * kKiB), oc);
  std::vector<ParamId> ia, ib;
  make(a, ia);
  make(b, ib);
  for (Rig* r : {&a, &b}) {
    backward(*r, r == &a ? ia : ib, 1, false);
    ASSERT_FALSE(r->opt->step().skipped);
  }
  const auto mid_master = full(*b.opt, ib[1]);
  const auto mid_m = full(*b.opt, ib[1], BlockClass::exp_avg);
  const auto p16 = b.opt->param16(ib[1]);
  const std::vector<std::uint16_t> mid16(p16.begin(), p16.end());
  backward(a, ia, 2, false);
  a.opt->step();
  backward(b, ib, 2, true);
  const ParamId mid[] = {ib[1]};
  b.opt->leave_alone(mid);
  const StepResult rb = b.opt->step();
  ASSERT_FALSE(rb.skipped);
  EXPECT_EQ(b.opt->step_count(), 2u);
  EXPECT_TRUE(same_bits(full(*b.opt, ib[1]), mid_master));
  EXPECT_TRUE(same_bits(full(*b.opt, ib[1], BlockClass::exp_avg), mid_m));
  const auto after16 = b.opt->param16(ib[1]);
  EXPECT_TRUE(std::equal(after16.begin(), after16.end(), mid16.begin()));
  for (int i : {0, 2}) {
    for (BlockClass cls : {BlockClass::master, BlockClass::exp_avg, BlockClass::exp_avg_sq})
      EXPECT_TRUE(same_bits(full(*a.opt, ia[i], cls), full(*b.opt, ib[i], cls))) << "param " << i;
    const auto x = a.opt->param16(ia[i]), y = b.opt->param16(ib[i]);
    EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin())) << "param " << i;
  }
  // The set held for that step only: the next one steps the middle parameter again.
  backward(b, ib, 3, false);
  b.opt->step();
  EXPECT_FALSE(same_bits(full(*b.opt, ib[1]), mid_master));
}

INSTANTIATE_TEST_SUITE_P(Modes, LeaveAlone,
                         ::testing::Values(LeaveAloneCase{false, false},
                                           LeaveAloneCase{false, true},
                                           LeaveAloneCase{true, false}),
                         [](const auto& info) {
                           return std::string(info.param.overlap ? "Overlap" : "Plain") +
                                  (info.param.lend ? "Lent" : "Copied");
                         });

TEST(ShardedOptimizer, LeaveAloneRefusesUnknownAndFrozenParametersAndChangesNothing) {
  Rig r;
  r.opt->add_group(GroupConfig{});
  const ParamId w = r.opt->add_param(0, {"w", {64}, Dtype::bf16, true});
  const ParamId f = r.opt->add_param(0, {"frozen", {8}, Dtype::bf16, false});
  r.opt->finalize();
  r.opt->initialize(
      [](ParamId, std::uint64_t, float* out, std::uint64_t k) { std::fill(out, out + k, 0.5f); });
  const ParamId frozen[] = {f}, unknown[] = {w, 99};
  EXPECT_THROW(r.opt->leave_alone(frozen), std::invalid_argument);
  EXPECT_THROW(r.opt->leave_alone(unknown), std::invalid_argument);
  r.opt->begin_backward();
  EXPECT_THROW(r.opt->leave_alone(std::span<const ParamId>{}), std::logic_error);
  r.opt->end_backward();
  r.opt->step();  // nothing was left alone: w decays
  EXPECT_NE(full(*r.opt, w)[0], 0.5f);
}

// pipelined_commit: each step's commit left running while the next step's gradients come in; the
// same bits as commits inside step(), for streamed and resident state, every generation landing.
TEST(ShardedOptimizer, APipelinedCommitGivesTheSameBitsAndEveryGenerationLands) {
  for (const auto tier : {OptimizerConfig::StateTier::nvme, OptimizerConfig::StateTier::host}) {
    OptimizerConfig oc = test::model_config();
    oc.state_tier = tier;
    Rig sync(tier_config(2 * kMiB, 128 * kKiB), oc);
    oc.pipelined_commit = true;
    Rig piped(tier_config(2 * kMiB, 128 * kKiB), oc);
    const auto ms = test::start_model(*sync.opt), mp = test::start_model(*piped.opt);
    const auto rs = test::train(*sync.opt, ms, 1, 5, 0, 1);
    const auto rp = test::train(*piped.opt, mp, 1, 5, 0, 1);
    for (std::size_t i = 0; i < rp.size(); ++i) {
      EXPECT_TRUE(rp[i].commit_pending && !rs[i].commit_pending) << "step " << i + 1;
      EXPECT_EQ(rp[i].commit_seconds, 0);
      EXPECT_EQ(rp[i].generation, rs[i].generation) << "step " << i + 1;
    }
    expect_same_state(*sync.opt, ms, *piped.opt, mp);  // gather() lets the last one land
    expect_same_param16(*sync.opt, ms, *piped.opt, mp);
    EXPECT_EQ(piped.tiers->committed_generation(), sync.tiers->committed_generation());
    EXPECT_FALSE(piped.tiers->commit_in_flight());
  }
}

// Not taken where a failed commit could not be undone: memory-only state steps after it.
// Memory-only state throughout: nothing of a step is on NVMe, so the step commits nothing (no
// pipelined commit either), and the generation stays the one initialize() committed, whose
// record already refuses a resume (Resume.ARunWhoseResidentStateWasMemoryOnlyCannotResume).
// Beside NVMe-resident sub-groups (a plan), every step commits again.
TEST(ShardedOptimizer, AStepOfMemoryOnlyStateCommitsNothing) {
  for (const bool with_plan : {false, true}) {
    SCOPED_TRACE(with_plan ? "half on NVMe by a plan" : "all in host memory");
    OptimizerConfig oc = test::model_config();
    oc.state_tier = OptimizerConfig::StateTier::host;
    oc.persist_resident_state = false;
    oc.pipelined_commit = true;
    Rig r(tier_config(4 * kMiB, 128 * kKiB), oc);
    if (with_plan)
      r.opt->set_plan(Plan::from_json(R"({"format": "tierswap.plan", "version": 1, "subgroups": [
          {"numel": 1, "state_tier": "nvme", "step_device": "cpu"},
          {"numel": 1, "state_tier": "host", "step_device": "cpu"}]})"));
    const auto m = test::start_model(*r.opt);
    const std::uint64_t g0 = r.tiers->committed_generation();
    const std::uint64_t c0 = r.tiers->counters().commits;
    std::uint64_t t = 0;
    for (const StepResult& s : test::train(*r.opt, m, 1, 3, 0, 1)) {
      ++t;
      EXPECT_FALSE(s.commit_pending);
      if (with_plan) {
        EXPECT_GT(s.commit_seconds, 0);
        EXPECT_EQ(s.generation, g0 + t);
      } else {
        EXPECT_EQ(s.commit_seconds, 0);
        EXPECT_EQ(s.generation, g0);
      }
    }
    EXPECT_EQ(r.tiers->counters().commits - c0, with_plan ? t : 0u);
    EXPECT_EQ(r.opt->step_count(), t);
  }
}
