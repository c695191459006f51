// ShardedOptimizer at world size 1, 16-bit parameters: handed to the trainer once per step before
// the commit, and bound device copies that follow every step.
// (Multi-rank runs: optimizer_mpi under mpirun.)
#include "optim_fixture.hpp"

using namespace tierswap::optim_test;

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
