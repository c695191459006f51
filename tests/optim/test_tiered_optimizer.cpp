// TieredOptimizer (the one-object setup), GroupConfig::defaults, gather() and import_state():
// the swap space sized from the parameters for every optimizer kind, the rank directory and its
// removal, clear errors for bad swap directories, a filesystem without room and an earlier run's
// files (left untouched); whole-parameter state out and back in, bit for bit, and its misuse.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <thread>

#include "test_util.hpp"
#include "tierswap/communicator.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/tiered_optimizer.hpp"

using namespace tierswap;
using tierswap::test::TempDir;

namespace {

TieredOptions options(const std::filesystem::path& dir) {
  return test::tiered_options(dir, 4ull << 20);
}

// Three parameters of ragged sizes in two groups, one frozen; initialized and stepped once.
struct Model {
  ParamId w, b, frozen;
};

Model build(TieredOptimizer& t, OptimizerKind kind = OptimizerKind::adamw) {
  const int g0 = t.add_group(GroupConfig::defaults(kind), "decay");
  GroupConfig nd = GroupConfig::defaults(kind);
  nd.weight_decay = 0;
  const int g1 = t.add_group(nd, "no_decay");
  Model m;
  m.w = t.add_param(g0, {"w", {301, 97}, Dtype::bf16, true});
  m.frozen = t.add_param(g0, {"frozen", {17}, Dtype::bf16, false});
  m.b = t.add_param(g1, {"b", {4097}, Dtype::bf16, true});
  t.finalize();
  t.optimizer().initialize([](ParamId id, std::uint64_t off, float* out, std::uint64_t n) {
    for (std::uint64_t i = 0; i < n; ++i)
      out[i] = 0.01f * static_cast<float>((id * 7919 + off + i) % 101) - 0.5f;
  });
  return m;
}

void step(ShardedOptimizer& opt, const Model& m, int seed) {
  opt.begin_backward();
  for (ParamId id : {m.w, m.b}) {
    std::vector<std::uint16_t> g(opt.param(id).numel());
    for (std::size_t i = 0; i < g.size(); ++i)
      g[i] = float_to_bf16(1e-3f * static_cast<float>(static_cast<int>((i * 31 + seed) % 19) - 9));
    opt.add_grad(id, g.data(), Dtype::bf16);
  }
  opt.end_backward();
  opt.step();
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace

TEST(GroupConfigDefaults, FollowTorchPerKind) {
  const auto adamw = GroupConfig::defaults(OptimizerKind::adamw);
  EXPECT_EQ(adamw, GroupConfig{});
  EXPECT_EQ(adamw.weight_decay, 1e-2);
  const auto adam = GroupConfig::defaults(OptimizerKind::adam);
  EXPECT_EQ(adam.kind, OptimizerKind::adam);
  EXPECT_EQ(adam.weight_decay, 0.0);
  EXPECT_EQ(adam.lr, 1e-3);
  const auto sgd = GroupConfig::defaults(OptimizerKind::sgd);
  EXPECT_EQ(sgd.weight_decay, 0.0);
  EXPECT_EQ(sgd.momentum, 0.0);
  const auto lion = GroupConfig::defaults(OptimizerKind::lion);
  EXPECT_EQ(lion.lr, 1e-4);
  EXPECT_EQ(lion.beta2, 0.99);
  EXPECT_EQ(lion.weight_decay, 0.0);
  for (auto k :
       {OptimizerKind::adamw, OptimizerKind::adam, OptimizerKind::sgd, OptimizerKind::lion})
    EXPECT_NO_THROW(GroupConfig::defaults(k).validate());
}

TEST(TieredOptimizer, BuildsEverythingFromOptionsAndRemovesItsFiles) {
  TempDir dir;
  std::filesystem::path sub;
  {
    TieredOptimizer t(options(dir.path()));
    EXPECT_THROW(t.optimizer(), std::logic_error);
    const Model m = build(t);
    ASSERT_EQ(t.rank_dirs().size(), 1u);
    sub = t.rank_dirs()[0];
    EXPECT_EQ(sub, dir.path() / "tierswap-rank0");
    EXPECT_TRUE(std::filesystem::exists(sub / SwapSpace::kFileName));
    // sized from the parameters, no more than a few MiB over what they need
    EXPECT_LT(t.swap_space().capacity(), 64ull << 20);
    EXPECT_GT(t.optimizer().config().subgroup_size, 0u);
    EXPECT_EQ(t.optimizer().config().subgroup_size % kGradStatsChunk, 0u);
    step(t.optimizer(), m, 1);
    EXPECT_EQ(t.optimizer().step_count(), 1u);
    EXPECT_THROW(t.optimizer().param16(m.frozen), std::invalid_argument);
    EXPECT_THROW(t.add_param(0, {"late", {4}, Dtype::bf16, true}), std::logic_error);
    EXPECT_THROW(t.finalize(), std::logic_error);
  }
  EXPECT_FALSE(std::filesystem::exists(sub));
}

// A child forked without exec has the optimizer's memory but none of its threads: using it is
// an error naming the owner, and destroying its copy waits for nothing and removes nothing.
TEST(TieredOptimizer, AForkedChildNeitherUsesNorTearsDownTheParentsOptimizer) {
  TempDir dir;
  auto t = std::make_unique<TieredOptimizer>(options(dir.path()));
  const Model m = build(*t);
  step(t->optimizer(), m, 1);
  const auto file = t->rank_dirs()[0] / SwapSpace::kFileName;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // no gtest assertions here: the exit status says what went wrong
    int status = 0;
    try {
      t->optimizer();
      status = 2;
    } catch (const std::logic_error& e) {
      if (std::string(e.what()).find("a child forked from it") == std::string::npos) status = 3;
    }
    t.reset();  // hung before (joining threads that exist only in the parent)
    if (!std::filesystem::exists(file)) status = 4;
    ::_exit(status);
  }
  int status = -1;
  for (int i = 0; i < 600 && ::waitpid(child, &status, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (status == -1) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
    FAIL() << "the child hung destroying its copy";
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: used, 3: another message, 4: files removed";
  ASSERT_TRUE(std::filesystem::exists(file));
  step(t->optimizer(), m, 2);  // the parent's is whole
  EXPECT_EQ(t->optimizer().step_count(), 2u);
  t.reset();
  EXPECT_FALSE(std::filesystem::exists(file));
}

TEST(TieredOptimizer, AutomaticSubgroupFitsTheReadAheadInAThirdOfTheBudget) {
  OptimizerConfig oc;  // prefetch_depth 2: 4 sub-groups of state in a third of the budget
  EXPECT_EQ(automatic_subgroup_size(1ull << 30, oc, 12), 7454720u);  // 2^30 / 144, whole chunks
  EXPECT_EQ(automatic_subgroup_size(64ull << 30, oc, 12), kDefaultSubgroupSize);  // at most 8M
  EXPECT_EQ(automatic_subgroup_size(1ull << 20, oc, 12), kGradStatsChunk);        // at least one
  oc.prefetch_depth = 6;  // deeper read-ahead, smaller sub-groups
  EXPECT_EQ(automatic_subgroup_size(1ull << 30, oc, 12), 3727360u);
  EXPECT_EQ(automatic_subgroup_size(1ull << 30, oc, 0), automatic_subgroup_size(1ull << 30, oc, 4));
  // What finalize() picks when subgroup_size is 0.
  TempDir dir;
  TieredOptions o = options(dir.path());
  o.optimizer.subgroup_size = 0;
  o.host_budget = 256ull << 20;
  TieredOptimizer t(o);
  t.add_group(GroupConfig::defaults(OptimizerKind::adamw));
  t.add_param(0, {"w", {100000}, Dtype::bf16});
  t.finalize();
  OptimizerConfig want;
  want.prefetch_depth = o.optimizer.prefetch_depth;
  EXPECT_EQ(t.optimizer().config().subgroup_size, automatic_subgroup_size(256ull << 20, want, 12));
}

TEST(TieredOptimizer, SwapSizeSufficesForEveryKindAndSubgroupSize) {
  for (auto kind :
       {OptimizerKind::adamw, OptimizerKind::adam, OptimizerKind::sgd, OptimizerKind::lion}) {
    for (std::uint64_t sg : {std::uint64_t{8192}, std::uint64_t{0}}) {
      TempDir dir;
      TieredOptions o = options(dir.path());
      o.optimizer.subgroup_size = sg;
      o.optimizer.state_tier = OptimizerConfig::StateTier::nvme;
      TieredOptimizer t(o);
      GroupConfig g = GroupConfig::defaults(kind);
      if (kind == OptimizerKind::sgd) g.momentum = 0.9;
      if (kind == OptimizerKind::adam) g.amsgrad = true;
      const int gi = t.add_group(g);
      for (int i = 0; i < 9; ++i)
        t.add_param(gi, {"p" + std::to_string(i), {8191 + i}, Dtype::bf16});
      ASSERT_NO_THROW(t.finalize()) << to_string(kind) << " sg " << sg;
      EXPECT_NO_THROW(t.optimizer().initialize(
          [](ParamId, std::uint64_t, float* out, std::uint64_t n) { std::fill_n(out, n, 0.5f); }));
    }
  }
}

TEST(TieredOptimizer, BadSwapDirectoriesAreRefusedByName) {
  TempDir dir;
  TieredOptions o = options(dir.path());
  o.swap_dirs = {};
  EXPECT_THROW(TieredOptimizer{o}, std::invalid_argument);
  o.swap_dirs = {dir.path(), dir.path()};
  EXPECT_THROW(TieredOptimizer{o}, std::invalid_argument);
  o = options(dir.path());
  o.temporary_swap_dirs = true;
  for (bool TieredOptions::*contradicts :
       {&TieredOptions::resume, &TieredOptions::keep_swap_files}) {
    TieredOptions bad = o;
    bad.*contradicts = true;
    EXPECT_THROW(TieredOptimizer{bad}, std::invalid_argument);
  }
  auto finalize_error = [&](const std::filesystem::path& p) -> std::string {
    TieredOptions oo = options(p);
    TieredOptimizer t(oo);
    t.add_param(t.add_group(GroupConfig{}), {"w", {64}, Dtype::bf16});
    try {
      t.finalize();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(finalize_error(dir.path() / "missing").find("missing"), std::string::npos);
  std::ofstream(dir.path() / "file") << "x";
  EXPECT_NE(finalize_error(dir.path() / "file").find("not a directory"), std::string::npos);
  std::filesystem::create_directory(dir.path() / "real");
  std::filesystem::create_directory_symlink(dir.path() / "real", dir.path() / "link");
  EXPECT_NE(finalize_error(dir.path() / "link").find("symbolic link"), std::string::npos);
}

TEST(TieredOptimizer, NoRoomNamesTheTotalAndCreatesNothing) {
  TempDir dir;
  TieredOptions o = options(dir.path());
  o.swap_capacity = 1ull << 60;
  TieredOptimizer t(o);
  t.add_param(t.add_group(GroupConfig{}), {"w", {64}, Dtype::bf16});
  try {
    t.finalize();
    FAIL() << "finalize with 1 EiB of swap space succeeded";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("needs"), std::string::npos) << what;
    EXPECT_NE(what.find(dir.path().string()), std::string::npos) << what;
    EXPECT_NE(what.find("free"), std::string::npos) << what;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "tierswap-rank0"));
  EXPECT_FALSE(t.finalized());
}

// torch's optimizers take a model whose parameters are all frozen (a phase of a fine-tuning
// schedule): nothing to step, the step count still counts, checkpoints and resume work.
TEST(TieredOptimizer, EveryParameterFrozenStepsNothingAndCheckpoints) {
  TempDir dir, ck;
  TieredOptions o = options(dir.path());
  o.keep_swap_files = true;
  {
    TieredOptimizer t(o);
    const int g = t.add_group(GroupConfig{});
    t.add_param(g, {"frozen", {33, 7}, Dtype::bf16, false});
    t.add_param(t.add_group(GroupConfig{}), {"empty_group_frozen", {5}, Dtype::bf16, false});
    t.finalize();
    ShardedOptimizer& opt = t.optimizer();
    opt.initialize([](ParamId, std::uint64_t, float*, std::uint64_t) {
      ADD_FAILURE() << "asked for the initial values of a frozen parameter";
    });
    for (int i = 0; i < 3; ++i) {
      opt.begin_backward();
      opt.end_backward();
      const StepResult r = opt.step();
      EXPECT_FALSE(r.skipped);
      EXPECT_EQ(r.grad_norm, 0.0);
      EXPECT_EQ(r.bytes_in[static_cast<int>(Tier::nvme)], 0u);
    }
    EXPECT_EQ(opt.step_count(), 3u);
    opt.save(ck.path());
    opt.load(ck.path());
    EXPECT_EQ(opt.step_count(), 3u);
  }
  o.resume = true;
  TieredOptimizer again(o);
  again.add_param(again.add_group(GroupConfig{}), {"frozen", {33, 7}, Dtype::bf16, false});
  again.add_param(again.add_group(GroupConfig{}), {"empty_group_frozen", {5}, Dtype::bf16, false});
  again.finalize();
  EXPECT_TRUE(again.resumed());
  EXPECT_EQ(again.optimizer().step_count(), 3u);
}

// issue 15: a swap space too small failed at finalize() with the allocator's "swap space full"
// and no word of what the parameters need; a capacity the caller gave now says it.
TEST(TieredOptimizer, ASwapCapacityTooSmallSaysWhatTheParametersNeed) {
  TempDir dir;
  TieredOptions o = options(dir.path());
  o.swap_capacity = 1ull << 20;
  o.optimizer.state_tier = OptimizerConfig::StateTier::nvme;
  TieredOptimizer t(o);
  t.add_param(t.add_group(GroupConfig{}), {"w", {512, 512}, Dtype::bf16});
  try {
    t.finalize();
    FAIL() << "1 MiB of swap space for 3 MiB of state was accepted";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("swap_capacity=1.00 MiB is too small"), std::string::npos) << what;
    EXPECT_NE(what.find("they need about"), std::string::npos) << what;
    EXPECT_NE(what.find("swap space full"), std::string::npos) << what;  // the allocator's word
  }
  EXPECT_FALSE(t.finalized());
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "tierswap-rank0"));
}

TEST(TieredOptimizer, AnEarlierRunsSwapSpaceIsRefusedAndKept) {
  TempDir dir;
  const auto sub = dir.path() / "tierswap-rank0";
  std::filesystem::create_directory(sub);
  std::ofstream(sub / SwapSpace::kFileName) << "earlier state";
  TieredOptimizer t(options(dir.path()));
  t.add_param(t.add_group(GroupConfig{}), {"w", {64}, Dtype::bf16});
  try {
    t.finalize();
    FAIL() << "an earlier run's swap space was overwritten";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("earlier run"), std::string::npos) << e.what();
  }
  std::ifstream in(sub / SwapSpace::kFileName);
  std::string body;
  std::getline(in, body);
  EXPECT_EQ(body, "earlier state");
}

TEST(TieredOptimizer, AddParamChecksAtOnce) {
  TempDir dir;
  TieredOptimizer t(options(dir.path()));
  const int g = t.add_group(GroupConfig{});
  EXPECT_THROW(t.add_param(5, {"w", {4}, Dtype::bf16}), std::invalid_argument);
  EXPECT_THROW(t.add_param(g, {"", {4}, Dtype::bf16}), std::invalid_argument);
  EXPECT_THROW(t.add_param(g, {"w", {4}, Dtype::f32}), std::invalid_argument);
  EXPECT_THROW(t.add_param(g, {"w", {4, 0}, Dtype::bf16}), std::invalid_argument);
  t.add_param(g, {"w", {4}, Dtype::bf16});
  EXPECT_THROW(t.add_param(g, {"w", {4}, Dtype::bf16}), std::invalid_argument);
  GroupConfig bad;
  bad.lr = -1;
  EXPECT_THROW(t.add_group(bad), std::invalid_argument);
}

TEST(ShardedOptimizerState, GatherAndImportRoundTripBitForBit) {
  TempDir da, db;
  TieredOptimizer a(options(da.path())), b(options(db.path()));
  const Model ma = build(a), mb = build(b);
  for (int s = 0; s < 3; ++s) step(a.optimizer(), ma, s);
  std::vector<std::vector<float>> keep;
  std::vector<ShardedOptimizer::StateTensor> in;
  for (ParamId id : {ma.w, ma.b})
    for (auto cls : {BlockClass::master, BlockClass::exp_avg, BlockClass::exp_avg_sq}) {
      keep.push_back(a.optimizer().gather(id, cls));
      EXPECT_EQ(keep.back().size(), a.optimizer().param(id).numel());
    }
  std::size_t i = 0;
  for (ParamId id : {mb.w, mb.b})
    for (auto cls : {BlockClass::master, BlockClass::exp_avg, BlockClass::exp_avg_sq})
      in.push_back({id, cls, keep[i++]});
  b.optimizer().import_state(in, a.optimizer().step_count());
  EXPECT_EQ(b.optimizer().step_count(), 3u);
  i = 0;
  for (ParamId id : {mb.w, mb.b})
    for (auto cls : {BlockClass::master, BlockClass::exp_avg, BlockClass::exp_avg_sq})
      EXPECT_TRUE(same_bits(b.optimizer().gather(id, cls), keep[i++]));
  for (ParamId id : {ma.w, ma.b}) {
    const auto x = a.optimizer().param16(id), y = b.optimizer().param16(id);
    EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin()));
  }
  // The two continue identically.
  step(a.optimizer(), ma, 7);
  step(b.optimizer(), mb, 7);
  EXPECT_TRUE(same_bits(a.optimizer().gather(ma.w), b.optimizer().gather(mb.w)));
  EXPECT_TRUE(same_bits(a.optimizer().gather(ma.b, BlockClass::exp_avg_sq),
                        b.optimizer().gather(mb.b, BlockClass::exp_avg_sq)));
}

TEST(ShardedOptimizerState, ImportChecksEverythingBeforeWriting) {
  TempDir dir;
  TieredOptimizer t(options(dir.path()));
  const Model m = build(t);
  ShardedOptimizer& opt = t.optimizer();
  const auto before = opt.gather(m.w);
  std::vector<float> ones(opt.param(m.w).numel(), 1.0f), shorter(5, 1.0f);
  using ST = ShardedOptimizer::StateTensor;
  auto expect_refused = [&](std::vector<ST> v, const char* what) {
    try {
      opt.import_state(v, std::nullopt);
      ADD_FAILURE() << what << ": accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("import_state"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(same_bits(opt.gather(m.w), before)) << what << ": state changed";
  };
  expect_refused({{m.w, BlockClass::master, ones}, {m.b, BlockClass::master, shorter}}, "short");
  expect_refused({{m.w, BlockClass::master, ones}, {m.w, BlockClass::master, ones}}, "twice");
  expect_refused({{m.w, BlockClass::master, ones}, {m.frozen, BlockClass::master, shorter}},
                 "frozen");
  expect_refused({{m.w, BlockClass::master, ones}, {m.w, BlockClass::momentum, ones}}, "momentum");
  expect_refused({{m.w, BlockClass::master, ones}, {99, BlockClass::master, ones}}, "unknown");
  EXPECT_THROW(opt.gather(m.frozen), std::invalid_argument);
  EXPECT_THROW(opt.gather(m.w, BlockClass::momentum), std::invalid_argument);
  opt.begin_backward();
  EXPECT_THROW(opt.import_state(std::vector<ST>{{m.w, BlockClass::master, ones}}, std::nullopt),
               std::logic_error);
}

// add_grad copies a slice's first gradient since the last drop and adds the later ones (a
// parameter added twice in one backward, accumulation over backward passes, slices that span
// sub-groups, whole-block slices taken without zero-filling): the same bits as handing the total
// over once. Gradients are small multiples of 2^-8, so every sum is exact in bf16.
TEST(ShardedOptimizerIngest, FirstGradientCopiedLaterOnesAddedSameBitsAsTheTotal) {
  auto run = [](bool split) {
    TempDir dir;
    TieredOptions o = options(dir.path());
    o.optimizer.subgroup_size = 8192;
    TieredOptimizer t(o);
    const int g = t.add_group(GroupConfig::defaults(OptimizerKind::adamw));
    const std::vector<std::int64_t> sizes = {5000, 20000, 3, 8192};
    for (std::size_t i = 0; i < sizes.size(); ++i)
      t.add_param(g, {"p" + std::to_string(i), {sizes[i]}, Dtype::bf16});
    t.finalize();
    auto& opt = t.optimizer();
    opt.initialize([](ParamId, std::uint64_t off, float* out, std::uint64_t n) {
      for (std::uint64_t i = 0; i < n; ++i)
        out[i] = 0.25f - 0.001f * static_cast<float>((off + i) % 97);
    });
    auto grad = [&](ParamId id, int part, int step) {
      std::vector<std::uint16_t> v(opt.param(id).numel());
      for (std::size_t i = 0; i < v.size(); ++i) {
        const int k = static_cast<int>((i * 5 + id * 3 + part * 7 + step) % 9) - 4;
        v[i] = float_to_bf16(static_cast<float>(k) / 256.0f);
      }
      return v;
    };
    for (int step = 0; step < 3; ++step) {
      if (!split) {  // the total, once
        opt.begin_backward();
        for (ParamId id = 0; id < 4; ++id) {
          auto total = grad(id, 0, step);
          for (int part = 1; part < 3; ++part) {
            const auto more = grad(id, part, step);
            for (std::size_t i = 0; i < total.size(); ++i)
              total[i] = float_to_bf16(bf16_to_float(total[i]) + bf16_to_float(more[i]));
          }
          opt.add_grad(id, total.data(), Dtype::bf16);
        }
        opt.end_backward();
      } else {  // parts 0 and 1 in one backward (p1 twice), part 2 in a second backward
        opt.begin_backward(false);
        for (ParamId id = 0; id < 4; ++id) opt.add_grad(id, grad(id, 0, step).data(), Dtype::bf16);
        opt.add_grad(1, grad(1, 1, step).data(), Dtype::bf16);
        for (ParamId id : {0u, 2u, 3u}) opt.add_grad(id, grad(id, 1, step).data(), Dtype::bf16);
        opt.end_backward();
        opt.begin_backward(true);
        for (ParamId id = 0; id < 4; ++id) opt.add_grad(id, grad(id, 2, step).data(), Dtype::bf16);
        opt.end_backward();
      }
      EXPECT_FALSE(opt.step().skipped);
    }
    std::vector<std::vector<float>> out;
    for (ParamId id = 0; id < 4; ++id)
      for (auto cls : {BlockClass::master, BlockClass::exp_avg, BlockClass::exp_avg_sq})
        out.push_back(opt.gather(id, cls));
    return out;
  };
  const auto once = run(false), parts = run(true);
  ASSERT_EQ(once.size(), parts.size());
  for (std::size_t i = 0; i < once.size(); ++i) EXPECT_TRUE(same_bits(once[i], parts[i])) << i;
}

// Every setting read from the environment, set to garbage in turn: building the whole stack
// (options, swap space, engine, tier manager with telemetry, pool, optimizer) and stepping either
// works or throws an exception naming the variable or its value, never aborts (a throw after a
// thread started used to: TierManager with TIERSWAP_TELEMETRY=yes).
TEST(TieredOptimizer, GarbageInAnyEnvironmentSettingThrowsOrIsIgnoredNeverAborts) {
  const char* vars[] = {"TIERSWAP_BLOCK_SIZE",
                        "TIERSWAP_COALESCE",
                        "TIERSWAP_CONCURRENT_GPU_STEP",
                        "TIERSWAP_CPU_ISA",
                        "TIERSWAP_DEVICE_BUDGET",
                        "TIERSWAP_DEVICE_TIER",
                        "TIERSWAP_DIRECT_IO",
                        "TIERSWAP_DURABLE",
                        "TIERSWAP_GRAD_TIER",
                        "TIERSWAP_HOST_BUDGET",
                        "TIERSWAP_HOST_SLAB",
                        "TIERSWAP_HUGE_PAGES",
                        "TIERSWAP_IO_BACKEND",
                        "TIERSWAP_IO_RETRIES",
                        "TIERSWAP_LOCK_HOST",
                        "TIERSWAP_LOG_LEVEL",
                        "TIERSWAP_LOOKAHEAD",
                        "TIERSWAP_MAX_DIRTY",
                        "TIERSWAP_MAX_GRAD_NORM",
                        "TIERSWAP_NUMA_NODE",
                        "TIERSWAP_OVERLAP",
                        "TIERSWAP_PERSIST_RESIDENT_STATE",
                        "TIERSWAP_PLAN",
                        "TIERSWAP_POSIX_THREADS",
                        "TIERSWAP_PREFETCH_DEPTH",
                        "TIERSWAP_QUEUE_DEPTH",
                        "TIERSWAP_RUNTIME_DIR",
                        "TIERSWAP_SHADOW",
                        "TIERSWAP_SIM_DEVICE_GBPS",
                        "TIERSWAP_SQPOLL",
                        "TIERSWAP_STATE_TIER",
                        "TIERSWAP_STRIPE_SIZE",
                        "TIERSWAP_SUBGROUP_SIZE",
                        "TIERSWAP_SWAP_CAPACITY",
                        "TIERSWAP_SWAP_DIRS",
                        "TIERSWAP_TELEMETRY"};
  int threw = 0;
  for (const char* var : vars) {
    TempDir dir;
    const test::ScopedEnv bogus(var, "bogus!");
    try {
      TieredOptions o;  // its defaults read the environment
      o.swap_dirs = {dir.path()};
      o.host_budget = 4ull << 20;
      o.communicator = "single";
      o.threads = 2;
      TieredOptimizer t(o);
      const Model m = build(t);
      step(t.optimizer(), m, 1);
    } catch (const std::exception& e) {
      ++threw;
      const std::string what = e.what();
      EXPECT_TRUE(what.find(var) != std::string::npos || what.find("bogus!") != std::string::npos)
          << var << ": " << what;
    }
  }
  EXPECT_GT(threw, 20);  // most settings are parsed strictly
}
