// ShardedOptimizer at world size 1, misuse and configuration: clear errors for API misuse, config
// from JSON and the environment.
// (Multi-rank runs: optimizer_mpi under mpirun.)
#include <algorithm>
#include <set>

#include "optim_fixture.hpp"
#include "tierswap/process_config.hpp"
#include "tierswap/tiered_optimizer.hpp"

using namespace tierswap::optim_test;

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
  // No state yet (neither initialize() nor load()): nothing would say what the masters hold.
  for (auto call : {+[](ShardedOptimizer& o) { o.begin_backward(); },
                    +[](ShardedOptimizer& o) { (void)o.step(); },
                    +[](ShardedOptimizer& o) { (void)o.gather(0, BlockClass::master); },
                    +[](ShardedOptimizer& o) { o.save(testing::TempDir() + "never-saved"); }}) {
    try {
      call(*r.opt);
      ADD_FAILURE() << "stepped an optimizer that holds no state";
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("holds no state yet: call initialize() or load()"),
                std::string::npos)
          << e.what();
    }
  }
  r.opt->initialize(
      [](ParamId, std::uint64_t, float* out, std::uint64_t n) { std::fill(out, out + n, 0.5f); });
  r.opt->begin_backward();
  EXPECT_THROW(r.opt->begin_backward(), std::logic_error);
  EXPECT_THROW(r.opt->add_grad(f, grad, Dtype::bf16), std::invalid_argument);
  EXPECT_THROW(r.opt->add_grad(99, grad, Dtype::bf16), std::invalid_argument);
  EXPECT_THROW(r.opt->param16(f), std::invalid_argument);  // frozen: the trainer keeps its values
  EXPECT_THROW(r.opt->step(), std::logic_error);           // backward not ended
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

// A host budget that cannot hold one streamed sub-group's state beside the gradients is refused by
// finalize(), with the figures, instead of failing every step; just above, the model trains.
TEST(ShardedOptimizer, AHostBudgetNoStepCanWorkInIsRefusedAtFinalize) {
  Rig small(tier_config(128 * kKiB, 8 * kKiB));
  try {
    (void)test::build_model(*small.opt);
    ADD_FAILURE() << "finalize accepted a budget no step can work in";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("host budget 128.00 KiB: a sub-group's state streamed from NVMe (96.00 KiB) "
                     "does not fit beside"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("a step needs more than"), std::string::npos) << m;
  }
  Rig enough(tier_config(256 * kKiB, 8 * kKiB));
  auto m = test::start_model(*enough.opt);
  EXPECT_EQ(test::train(*enough.opt, m, 1, 3, 0, 1).back().step, 3u);
}

TEST(ShardedOptimizer, ConfigFromJsonAndEnvironment) {
  const auto c = OptimizerConfig::from_json(
      R"({"subgroup_size": "4M", "prefetch_depth": 3, "state_tier": "host", "grad_tier": "nvme",
          "max_grad_norm": 1.5, "overlap": true, "overlap_param16_in_place": true,
          "concurrent_gpu_step": false, "loss_scaler": {"mode": "dynamic", "growth_interval": 10}})");
  EXPECT_EQ(c.subgroup_size, 4'000'000u);  // a count, as --sub-group reads it
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
       {R"({"subgroup": 1})", R"({"subgroup_size": "4MiB"})", R"({"subgroup_size": -4})",
        R"({"grad_tier": "gpu"})", R"({"loss_scaler": {"mode": "sometimes"}})",
        R"({"max_grad_norm": -1})", R"({"loss_scaler": {"backoff": 0.5}})", R"({"overlap": "yes"})",
        R"({"overlap_param16_in_place": 1})", R"({"concurrent_gpu_step": "no"})", "[1]", "{"}) {
    try {
      OptimizerConfig::from_json(bad);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_FALSE(std::string(e.what()).empty());
    }
  }
  const test::ScopedEnv subgroup("TIERSWAP_SUBGROUP_SIZE", "1M");
  const test::ScopedEnv tier("TIERSWAP_STATE_TIER", "nvme");
  const test::ScopedEnv overlap("TIERSWAP_OVERLAP", "1");
  const test::ScopedEnv in_place("TIERSWAP_OVERLAP_PARAM16_IN_PLACE", "1");
  const test::ScopedEnv gpu("TIERSWAP_CONCURRENT_GPU_STEP", "0");
  const auto e = OptimizerConfig::from_env();
  EXPECT_FALSE(e.concurrent_gpu_step);
  EXPECT_TRUE(e.overlap);
  EXPECT_TRUE(e.overlap_param16_in_place);
  EXPECT_EQ(e.state_tier, OptimizerConfig::StateTier::nvme);
  EXPECT_EQ(e.subgroup_size, 1'000'000u);
  const test::ScopedEnv bad_tier("TIERSWAP_STATE_TIER", "ssd");  // over "nvme" until its end
  EXPECT_THROW(OptimizerConfig::from_env(), std::invalid_argument);
}

namespace {

// Every setting has a key, a shown default and a meaning (the configuration page's row, printed
// by `tierswap config --settings`; the cli_settings_table test holds the page to it); keys are
// unique, and from_json's unknown-key error lists every key.
template <class Config>
void expect_documented(const char* what) {
  SCOPED_TRACE(what);
  std::set<std::string> keys;
  std::string known;
  for (const auto& s : Config::settings()) {
    SCOPED_TRACE(s.key);
    EXPECT_FALSE(s.shown_default.empty());
    EXPECT_FALSE(s.meaning.empty());
    EXPECT_EQ(s.meaning.find('|'), std::string::npos) << "a '|' breaks the Markdown row";
    EXPECT_TRUE(keys.insert(s.key).second) << "the key is listed twice";
    known += (known.empty() ? "" : ", ") + s.key;
  }
  try {
    Config::from_json(R"({"no_such_setting": 1})");
    ADD_FAILURE() << "an unknown key was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(known), std::string::npos) << e.what();
  }
}

}  // namespace

// A setting is added in one place, its struct's table, which carries what the page shows.
TEST(ShardedOptimizer, EverySettingCarriesItsDocumentation) {
  expect_documented<OptimizerConfig>("OptimizerConfig");
  expect_documented<TierConfig>("TierConfig");
  expect_documented<NodeServiceConfig>("NodeServiceConfig");
  expect_documented<IoEngineConfig>("IoEngineConfig");
  expect_documented<SwapSpaceConfig>("SwapSpaceConfig");
  expect_documented<ProcessConfig>("ProcessConfig");
}

// The node service's settings belong to the one-object setup that attaches (NodeServiceConfig):
// keywords over the variables, each refused value named.
TEST(ShardedOptimizer, NodeServiceSettingsApplyOverTheirBaseAndNameBadValues) {
  NodeServiceConfig base;
  base.socket = "/run/tierswap/tierswap.sock";
  base.timeout_seconds = 5;
  const auto c = NodeServiceConfig::from_json(R"({"service_job": "lm-1"})", base);
  EXPECT_EQ(c.socket, "/run/tierswap/tierswap.sock");
  EXPECT_EQ(c.job, "lm-1");
  EXPECT_EQ(c.timeout_seconds, 5);
  EXPECT_EQ(NodeServiceConfig::from_json(R"({"service": ""})", base).socket, "");
  for (const char* bad : {R"({"service_job": "a/b"})", R"({"service_timeout": 0})",
                          R"({"service_wait": -1})", R"({"service": 3})", R"({"socket": "x"})"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(NodeServiceConfig::from_json(bad), std::invalid_argument);
  }
  try {
    NodeServiceConfig::from_json(R"({"service_job": "a/b"})");
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("service_job"), std::string::npos) << e.what();
  }
}
