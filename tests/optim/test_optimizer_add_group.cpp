// ShardedOptimizer::add_group_between_steps (torch's add_param_group): the new group steps as a
// fresh optimizer of that group alone would (its own step count), the other groups as if it had
// never come; refusals change nothing; resume and checkpoints keep it.
#include "optim_fixture.hpp"
#include "tierswap/tiered_optimizer.hpp"

namespace tierswap::optim_test {
namespace {

constexpr std::int64_t kOld = 5000, kNew = 9001;  // ragged, over several sub-groups

OptimizerConfig plain_config(OptimizerConfig::StateTier tier) {
  OptimizerConfig c;
  c.subgroup_size = 2048;  // no clipping, no loss scale: groups do not meet in the step
  c.state_tier = tier;
  return c;
}

GroupConfig sgd_momentum() {
  GroupConfig g = GroupConfig::defaults(OptimizerKind::sgd);
  g.lr = 0.05;
  g.momentum = 0.9;  // its first step takes the gradient as the buffer: step 1 must be its own
  g.weight_decay = 1e-3;
  return g;
}

float initial(std::uint64_t seed, std::uint64_t i) {
  return 0.01f * static_cast<float>((seed * 7919 + i) % 101) - 0.5f;
}

ParamInit init_from(std::uint64_t seed) {
  return [seed](ParamId, std::uint64_t off, float* out, std::uint64_t n) {
    for (std::uint64_t i = 0; i < n; ++i) out[i] = initial(seed, off + i);
  };
}

// Gradient k of a parameter seeded `seed` (k counts that parameter's own steps).
std::vector<std::uint16_t> grad(std::uint64_t seed, int k, std::int64_t n) {
  std::vector<std::uint16_t> g(static_cast<std::size_t>(n));
  for (std::size_t j = 0; j < g.size(); ++j)
    g[j] = float_to_bf16(0.01f * static_cast<float>((j * (k + seed)) % 23) - 0.1f);
  return g;
}

void backward_and_step(ShardedOptimizer& opt, const std::vector<std::pair<ParamId, int>>& given,
                       const std::vector<std::uint64_t>& seeds) {
  opt.begin_backward();
  std::vector<std::vector<std::uint16_t>> keep;
  for (std::size_t i = 0; i < given.size(); ++i) {
    const auto [id, k] = given[i];
    keep.push_back(grad(seeds[i], k, static_cast<std::int64_t>(opt.param(id).numel())));
    opt.add_grad(id, keep.back().data(), Dtype::bf16);
  }
  opt.end_backward();
  ASSERT_FALSE(opt.step().skipped);
}

void expect_same_state(ShardedOptimizer& a, ParamId ia, ShardedOptimizer& b, ParamId ib) {
  const BlockClass classes[] = {BlockClass::master, BlockClass::exp_avg, BlockClass::exp_avg_sq,
                                BlockClass::momentum};
  for (BlockClass cls : classes) {
    bool kept = true;
    try {
      (void)a.shard(ia, cls);
    } catch (const std::invalid_argument&) {
      kept = false;  // a state this group does not keep
    }
    if (kept) EXPECT_TRUE(same_bits(full(a, ia, cls), full(b, ib, cls))) << to_string(cls);
  }
  EXPECT_EQ(a.param16(ia).size(), b.param16(ib).size());
  EXPECT_EQ(std::memcmp(a.param16(ia).data(), b.param16(ib).data(), a.param16(ia).size() * 2), 0);
}

// `r` built with one group of one parameter, initialized from `seed`; the parameter's id.
ParamId one_param(Rig& r, const GroupConfig& g, const ParamSpec& spec, std::uint64_t seed) {
  r.opt->add_group(g);
  const ParamId id = r.opt->add_param(0, spec);
  r.opt->finalize();
  r.opt->initialize(init_from(seed));
  return id;
}

struct Case {
  const char* name;
  GroupConfig added;
  OptimizerConfig::StateTier tier;
};

class AddGroup : public ::testing::TestWithParam<Case> {};

TEST_P(AddGroup, StepsAsAFreshOptimizerOfItAndLeavesTheOthersAsTheyWere) {
  const Case& c = GetParam();
  const ParamSpec old_spec{"old", {kOld}, Dtype::bf16, true};
  const ParamSpec new_spec{"new", {kNew}, Dtype::bf16, true};
  Rig a(tier_config(4 * kMiB, 64 * kKiB), plain_config(c.tier));
  const ParamId old_id = one_param(a, GroupConfig{}, old_spec, 1);
  for (int k = 1; k <= 3; ++k) backward_and_step(*a.opt, {{old_id, k}}, {1});
  const std::size_t subs_before = a.opt->subgroup_count();
  const std::vector<ParamSpec> added = {new_spec, {"frozen", {7}, Dtype::bf16, false}};
  const auto ids = a.opt->add_group_between_steps(c.added, "late", added, init_from(2));
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(a.opt->group_count(), 2);
  EXPECT_EQ(a.opt->group_step_count(0), 3u);
  EXPECT_EQ(a.opt->group_step_count(1), 0u);
  EXPECT_GE(a.opt->subgroup_count(), subs_before + 2);  // its own, the last one ragged
  const ParamId new_id = ids[0];
  for (std::uint64_t i = 0; i < static_cast<std::uint64_t>(kNew); i += 997)
    EXPECT_EQ(a.opt->param16(new_id)[i], float_to_bf16(initial(2, i)));
  for (int k = 1; k <= 3; ++k) backward_and_step(*a.opt, {{old_id, k + 3}, {new_id, k}}, {1, 2});
  EXPECT_EQ(a.opt->step_count(), 6u);
  EXPECT_EQ(a.opt->group_step_count(1), 3u);

  Rig old_only(tier_config(4 * kMiB, 64 * kKiB), plain_config(c.tier));
  const ParamId o = one_param(old_only, GroupConfig{}, old_spec, 1);
  for (int k = 1; k <= 6; ++k) backward_and_step(*old_only.opt, {{o, k}}, {1});
  expect_same_state(*a.opt, old_id, *old_only.opt, o);

  Rig new_only(tier_config(4 * kMiB, 64 * kKiB), plain_config(c.tier));
  const ParamId n = one_param(new_only, c.added, new_spec, 2);
  for (int k = 1; k <= 3; ++k) backward_and_step(*new_only.opt, {{n, k}}, {2});
  expect_same_state(*a.opt, new_id, *new_only.opt, n);
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, AddGroup,
    ::testing::Values(Case{"adamw_nvme", GroupConfig{}, OptimizerConfig::StateTier::nvme},
                      Case{"adamw_host", GroupConfig{}, OptimizerConfig::StateTier::host},
                      Case{"sgd_momentum_nvme", sgd_momentum(), OptimizerConfig::StateTier::nvme}),
    [](const auto& info) { return std::string(info.param.name); });

// A built optimizer with one group of "old", stepped twice.
struct Built {
  Rig rig;
  ParamId old_id = 0;
  explicit Built(std::uint64_t capacity = 64 * kMiB)
      : rig(tier_config(4 * kMiB, 64 * kKiB), plain_config(OptimizerConfig::StateTier::nvme),
            capacity) {
    old_id = one_param(rig, GroupConfig{}, {"old", {kOld}, Dtype::bf16, true}, 1);
    for (int k = 1; k <= 2; ++k) backward_and_step(*rig.opt, {{old_id, k}}, {1});
  }
};

TEST(AddGroupRefused, BadGroupsAndWrongTimesChangeNothing) {
  Built b;
  ShardedOptimizer& opt = *b.rig.opt;
  const auto before = full(opt, b.old_id);
  const std::vector<ParamSpec> good = {{"new", {kNew}, Dtype::bf16, true}};
  const std::vector<ParamSpec> f32 = {{"new", {kNew}, Dtype::f32, true}};
  const std::vector<ParamSpec> taken = {{"old", {9}, Dtype::bf16, true}};
  EXPECT_THROW(opt.add_group_between_steps(GroupConfig{}, "g", f32, init_from(2)),
               std::invalid_argument);
  EXPECT_THROW(opt.add_group_between_steps(GroupConfig{}, "g", taken, init_from(2)),
               std::invalid_argument);
  GroupConfig bad;
  bad.lr = -1;
  EXPECT_THROW(opt.add_group_between_steps(bad, "g", good, init_from(2)), std::invalid_argument);
  EXPECT_THROW(opt.add_group_between_steps(GroupConfig{}, "g", good, ParamInit{}),
               std::invalid_argument);
  opt.begin_backward();
  EXPECT_THROW(opt.add_group_between_steps(GroupConfig{}, "g", good, init_from(2)),
               std::logic_error);
  opt.end_backward();
  opt.drop_grads();
  EXPECT_EQ(opt.group_count(), 1);
  EXPECT_EQ(opt.param_count(), 1u);
  EXPECT_TRUE(same_bits(full(opt, b.old_id), before));
  // The names and the group index the refused attempts took are free again.
  const auto ids = opt.add_group_between_steps(GroupConfig{}, "g", good, init_from(2));
  backward_and_step(opt, {{b.old_id, 3}, {ids[0], 1}}, {1, 2});
  EXPECT_EQ(opt.group_step_count(1), 1u);
}

TEST(AddGroupRefused, ASwapSpaceWithoutRoomSaysSwapCapacityAndKeepsStepping) {
  Built b(1 * kMiB);  // the old group's state and gradients in 2 slots: about 240 KiB
  ShardedOptimizer& opt = *b.rig.opt;
  const std::vector<ParamSpec> big = {{"big", {256 * 1024}, Dtype::bf16, true}};
  try {
    opt.add_group_between_steps(GroupConfig{}, "big", big, init_from(3));
    FAIL() << "a group larger than the swap space was added";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("swap_capacity"), std::string::npos) << e.what();
  }
  EXPECT_EQ(opt.group_count(), 1);
  backward_and_step(opt, {{b.old_id, 3}}, {1});
  const std::vector<ParamSpec> small = {{"small", {300}, Dtype::bf16, true}};
  const auto ids = opt.add_group_between_steps(GroupConfig{}, "small", small, init_from(3));
  backward_and_step(opt, {{b.old_id, 4}, {ids[0], 1}}, {1, 3});
  EXPECT_EQ(opt.group_step_count(1), 1u);
}

TEST(AddGroupRefused, BeforeTheStateExistsItSaysInitialize) {
  Rig r(tier_config(4 * kMiB, 64 * kKiB), plain_config(OptimizerConfig::StateTier::nvme));
  r.opt->add_param(r.opt->add_group(GroupConfig{}), {"old", {kOld}, Dtype::bf16, true});
  const std::vector<ParamSpec> good = {{"new", {kNew}, Dtype::bf16, true}};
  EXPECT_THROW(r.opt->add_group_between_steps(GroupConfig{}, "g", good, init_from(2)),
               std::logic_error);
  r.opt->finalize();
  EXPECT_THROW(r.opt->add_group_between_steps(GroupConfig{}, "g", good, init_from(2)),
               std::logic_error);
}

TieredOptions tiered(const std::filesystem::path& dir) {
  TieredOptions o;
  o.swap_dirs = {dir};
  o.host_budget = 4 * kMiB;
  o.optimizer = plain_config(OptimizerConfig::StateTier::nvme);
  o.swap_capacity = 16 * kMiB;  // room for the group added later
  o.tiers.durable = false;
  o.tiers.telemetry = false;
  o.tiers.device_mode = DeviceTierMode::off;
  return o;
}

// The resumed run passes the added group at construction; the checkpoint's load restores each
// group's step count too. Both continue as the uninterrupted run does, bit for bit.
TEST(AddGroupKept, ResumeAndCheckpointsKeepTheGroupAndItsStepCount) {
  TempDir dir, ck, other;
  TieredOptions o = tiered(dir.path());
  o.keep_swap_files = true;
  std::vector<float> expected;
  {
    TieredOptimizer t(o);
    const ParamId old_id = t.add_param(t.add_group(GroupConfig{}), {"old", {kOld}, Dtype::bf16});
    t.finalize();
    ShardedOptimizer& opt = t.optimizer();
    opt.initialize(init_from(1));
    for (int k = 1; k <= 2; ++k) backward_and_step(opt, {{old_id, k}}, {1});
    const std::vector<ParamSpec> added = {{"group1.new", {kNew}, Dtype::bf16, true}};
    const ParamId new_id =
        opt.add_group_between_steps(GroupConfig{}, "group1", added, init_from(2))[0];
    backward_and_step(opt, {{old_id, 3}, {new_id, 1}}, {1, 2});
    opt.save(ck.path());
    // What the resumed and the loaded runs must reach after one more step.
    TieredOptimizer ref(tiered(other.path()));
    const ParamId r_old = ref.add_param(ref.add_group(GroupConfig{}), {"old", {kOld}, Dtype::bf16});
    const ParamId r_new =
        ref.add_param(ref.add_group(GroupConfig{}, "group1"), {"group1.new", {kNew}, Dtype::bf16});
    ref.finalize();
    ref.optimizer().initialize(init_from(9));
    ref.optimizer().load(ck.path());
    EXPECT_EQ(ref.optimizer().step_count(), 3u);
    EXPECT_EQ(ref.optimizer().group_step_count(0), 3u);
    EXPECT_EQ(ref.optimizer().group_step_count(1), 1u);
    backward_and_step(ref.optimizer(), {{r_old, 4}, {r_new, 2}}, {1, 2});
    backward_and_step(opt, {{old_id, 4}, {new_id, 2}}, {1, 2});
    expect_same_state(ref.optimizer(), r_new, opt, new_id);
    expected = full(opt, new_id);
  }
  o.resume = true;
  TieredOptimizer again(o);
  const ParamId old_id =
      again.add_param(again.add_group(GroupConfig{}), {"old", {kOld}, Dtype::bf16});
  const ParamId new_id = again.add_param(again.add_group(GroupConfig{}, "group1"),
                                         {"group1.new", {kNew}, Dtype::bf16});
  again.finalize();
  ASSERT_TRUE(again.resumed());
  ShardedOptimizer& opt = again.optimizer();
  EXPECT_EQ(opt.step_count(), 4u);
  EXPECT_EQ(opt.group_step_count(1), 2u);
  EXPECT_TRUE(same_bits(full(opt, new_id), expected));
  (void)old_id;
}

TEST(AddGroupKept, ImportStateTakesAStepCountPerGroup) {
  Built b;
  ShardedOptimizer& opt = *b.rig.opt;
  const std::vector<ParamSpec> added = {{"new", {kNew}, Dtype::bf16, true}};
  opt.add_group_between_steps(GroupConfig{}, "g", added, init_from(2));
  const std::uint64_t steps[] = {7, 4};
  opt.import_state({}, 7, steps);
  EXPECT_EQ(opt.step_count(), 7u);
  EXPECT_EQ(opt.group_step_count(0), 7u);
  EXPECT_EQ(opt.group_step_count(1), 4u);
  const std::uint64_t too_many[] = {7, 8};
  EXPECT_THROW(opt.import_state({}, 7, too_many), std::invalid_argument);
  EXPECT_THROW(opt.import_state({}, std::nullopt, steps), std::invalid_argument);
  opt.import_state({}, 5);  // one count for all, as a torch state dict of one step
  EXPECT_EQ(opt.group_step_count(1), 5u);
}

}  // namespace
}  // namespace tierswap::optim_test
