// ShardedOptimizer at world size 1, placement: GPU sub-groups on a simulated device tier, device
// gradients, the split step, memory-only resident state, plans from a file.
// (Multi-rank runs: optimizer_mpi under mpirun.)
#include "optim_fixture.hpp"
#include "tierswap/log.hpp"

using namespace tierswap::optim_test;

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
    void* event = g.data();  // a simulated tier: any event is refused before it is used
    try {
      b.opt->add_grad_device(mb.ids[0], g.data(), Dtype::f16, std::span<void* const>(&event, 1));
      ADD_FAILURE() << "an event accepted on a simulated device tier";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("simulated"), std::string::npos) << e.what();
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
      for (std::size_t k = 0; k < b.opt->subgroup_count(); ++k)
        gpu += b.opt->placement(k).gpu_steps;
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
    // Serial, the GPU's part fails before any 16-bit value changed. Concurrent, the CPU's part
    // may have written some already, and the rollback's own reads of the GPU part's master
    // weights fail too: the values are then stale until the next backward restores them, which
    // asks for the forward pass again.
    bool stale = false;
    try {
      (void)b.opt->param16(mb.ids[0]);
    } catch (const std::runtime_error&) {
      stale = true;
    }
    if (!concurrent) EXPECT_FALSE(stale);
    if (stale) EXPECT_THROW(b.opt->begin_backward(), std::system_error);
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
// Memory-only resident state (persist_resident_state=false), against an ordinary run `a` of the
// same 12 steps: the same bits without NVMe I/O for it, undo copies where the budget holds them,
// rollback after an NVMe fault, checkpoints across the two modes, GPU-resident state, budgets.
class MemoryOnly : public ::testing::Test {
 protected:
  MemoryOnly() : ma(test::start_model(*a.opt)), ra(test::train(*a.opt, ma, 1, 12, 0, 1)) {}
  void same16(ShardedOptimizer& b, const test::ModelOptimizer& mb) {
    expect_same_param16(*a.opt, ma, b, mb);
  }
  Rig a;
  test::ModelOptimizer ma;
  std::vector<StepResult> ra;
  const Plan split = Plan::from_json(R"({"format": "tierswap.plan", "version": 1, "subgroups": [
      {"numel": 1, "state_tier": "nvme", "step_device": "cpu"},
      {"numel": 1, "state_tier": "host", "step_device": "cpu"}]})");
  const Plan three = three_tier_plan();
};

TEST_F(MemoryOnly, GivesTheSameBitsWithoutNvmeIo) {
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
}

TEST_F(MemoryOnly, UndoCopiesForOnlySomeSubgroupsGiveTheSameBits) {
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
}

TEST_F(MemoryOnly, AnNvmeWriteFaultLeavesItAsItWasAndCheckpointsCrossBothModes) {
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
}

TEST_F(MemoryOnly, OnASimulatedGpuTheSameBitsWithFewerNvmeBytes) {
  // GPU-resident state too (a simulated device tier): the same bits, and fewer NVMe bytes than
  // the persisted run of the same plan, whose GPU and host state is committed at every step.

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
}

// Memory-only GPU state larger than the host budget (the initialization writes each block in host
// memory and copies it up, so its host copies must give way as they go): starts and steps, the
// same bits as the all-host run.
TEST_F(MemoryOnly, GpuStateLargerThanTheHostBudgetStartsAndSteps) {
  const Plan all_gpu = Plan::from_json(R"({"format": "tierswap.plan", "version": 1, "subgroups": [
      {"numel": 1, "state_tier": "gpu", "step_device": "gpu"}]})");
  OptimizerConfig oc = test::model_config();
  oc.persist_resident_state = false;
  Rig g(simulated_gpu_config(64 * kKiB, 16 * kKiB, 8 * kMiB), oc);
  g.opt->set_plan(all_gpu);
  auto mg = test::start_model(*g.opt);
  std::uint64_t device_state = 0;
  for (const auto& row : g.tiers->snapshot().classes)
    if (row.tier == Tier::device && row.cls != BlockClass::grad16) device_state += row.bytes;
  EXPECT_GT(device_state, g.tiers->config().host_budget) << "the state outgrows the host budget";
  test::train(*g.opt, mg, 1, 12, 0, 1);
  expect_same_state(*a.opt, ma, *g.opt, mg);
  same16(*g.opt, mg);
}

TEST_F(MemoryOnly, StateLargerThanItsBudgetIsRefused) {
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

// A plan records the modes it was made for; finalize() warns when the optimizer runs another
// (its predicted times and NVMe bytes do not apply) and says how to match them. The step order
// of an overlapped plan is the backward's, so no order warning for it.
TEST(ShardedOptimizer, FinalizeWarnsWhenThePlanWasMadeForOtherModes) {
  const auto plan_with = [](const char* modes) {
    return Plan::from_json(fmt::format(R"({{"format": "tierswap.plan", "version": 1, {}
        "subgroups": [{{"numel": 1000, "state_tier": "host", "step_device": "cpu"}}]}})",
                                       modes));
  };
  const auto finalize_log = [](const Plan& plan, bool persist, bool alternate) {
    OptimizerConfig oc = test::model_config();
    oc.persist_resident_state = persist;
    oc.alternate_step_order = alternate;
    Rig r(tier_config(2 * kMiB, 128 * kKiB), oc);
    r.opt->set_plan(plan);
    testing::internal::CaptureStderr();
    test::build_model(*r.opt);
    return testing::internal::GetCapturedStderr();
  };
  const LogLevel level = log_level();  // the warnings are what this test reads
  set_log_level(LogLevel::warn);
  const Plan both = plan_with(
      R"("overlap": false, "persist_resident_state": false, "alternate_step_order": false,)");
  std::string log = finalize_log(both, false, false);
  EXPECT_EQ(log.find("plan: it was made for"), std::string::npos) << log;
  log = finalize_log(both, true, true);
  EXPECT_NE(log.find("made for persist_resident_state=false but the optimizer runs with true"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("make the plan with --persist-resident-state"), std::string::npos) << log;
  EXPECT_NE(log.find("made for alternate_step_order=false but the optimizer runs with true"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("TIERSWAP_ALTERNATE_STEP_ORDER=0, or make the plan without --ascending"),
            std::string::npos)
      << log;
  // Overlapped plan: the order is not the plan's business. A file that does not say: no warning.
  log = finalize_log(plan_with(R"("overlap": true, "alternate_step_order": false,)"), true, true);
  EXPECT_EQ(log.find("alternate_step_order"), std::string::npos) << log;
  log = finalize_log(plan_with(R"("overlap": false,)"), false, false);
  EXPECT_EQ(log.find("plan: it was made for"), std::string::npos) << log;
  set_log_level(level);
  // The plan file keeps the order it says (make_plan's: test_placement.cpp).
  EXPECT_FALSE(*Plan::from_json(both.to_json()).alternate_step_order);
}

// On a real GPU (skipped without one): the three-tier plan and a split plan with their GPU
// sub-groups' state in GPU memory and stepped by the CUDA kernels, gradients handed over from GPU
// memory and the 16-bit parameters bound to GPU copies, ordinary and overlapped, persisted and
// memory-only: bit-identical to the all-host run; the bound copies equal param16(); the GPU
// sub-groups' gradients never cross the link.
TEST(ShardedOptimizer, PlanGpuSubgroupsOnARealGpuGiveTheSameBits) {
  if (!cuda::available()) GTEST_SKIP() << "no usable GPU: " << device_info().reason;
  Rig a;
  auto ma = test::start_model(*a.opt);
  test::train(*a.opt, ma, 1, 12, 0, 1);
  const Plan split = Plan::from_json(R"({"format": "tierswap.plan", "version": 1, "subgroups": [
      {"numel": 500, "state_tier": "gpu", "step_device": "gpu"},
      {"numel": 500, "state_tier": "host", "step_device": "cpu"}]})");
  for (const Plan& plan : {three_tier_plan(), split})
    for (const int mode : {0, 1, 2}) {  // persisted, memory-only, memory-only overlapped
      SCOPED_TRACE(fmt::format("{} sub-groups in the plan, mode {}", plan.subgroups.size(), mode));
      OptimizerConfig oc = test::model_config();
      oc.persist_resident_state = mode == 0;
      oc.overlap = mode == 2;
      TierConfig tc = tier_config(4 * kMiB, 128 * kKiB);
      tc.device_mode = DeviceTierMode::gpu;
      tc.device_budget = 4 * kMiB;
      Rig b(tc, oc);
      ASSERT_EQ(b.tiers->device_tier(), DeviceTierMode::gpu);
      b.opt->set_plan(plan);
      auto mb = test::start_model(*b.opt);
      std::map<ParamId, cuda::DeviceBuffer> bound;
      for (std::size_t p = 0; p < mb.ids.size(); ++p)
        if (test::model_params()[p].trainable) {
          auto& d = bound[mb.ids[p]];
          d.reserve(b.opt->param(mb.ids[p]).numel() * 2);
          b.opt->bind_param16_device(mb.ids[p], d.data());
        }
      const auto rb = test::train(*b.opt, mb, 1, 12, 0, 1, true, true);
      std::size_t gpu_steps = 0;
      for (const auto& r : rb) gpu_steps += r.gpu_subgroups;
      if (mode < 2) EXPECT_GT(gpu_steps, 0u) << "the CUDA kernels stepped";
      expect_same_state(*a.opt, ma, *b.opt, mb);
      expect_same_param16(*a.opt, ma, *b.opt, mb);
      for (const auto& [id, d] : bound) {
        std::vector<std::uint16_t> got(b.opt->param(id).numel());
        cuda::copy_to_host(got.data(), d.data(), got.size() * 2, nullptr);
        cuda::synchronize(nullptr);
        const auto want = b.opt->param16(id);
        EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin(), got.end()))
            << "bound GPU copy of " << b.opt->param(id).name;
      }
    }
}
