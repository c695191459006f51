// resume(): continuing from the swap directory. A run stopped after N steps (its files kept, as a
// crash leaves them) and resumed reaches, after more steps, the same bits as a run that never
// stopped; the step count, loss scaler and hyper-parameters come back from the commit record;
// a directory of another model, world size, version or a memory-only run is refused by name and
// left as it was; an empty directory starts afresh; a generation rolls back once, onto data that
// still matches its checksums.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include <nlohmann/json.hpp>

#include "service_util.hpp"
#include "test_util.hpp"
#include "tierswap/communicator.hpp"
#include "tierswap/detail/manifest.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/service.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/tiered_optimizer.hpp"

using namespace tierswap;
using tierswap::test::TempDir;

namespace {

TieredOptions options(const std::filesystem::path& dir) {
  TieredOptions o = test::tiered_options(dir, 2ull << 20);  // well below the state: streamed
  o.optimizer.subgroup_size = 16384;
  o.optimizer.max_grad_norm = 0.5;
  o.optimizer.loss_scaler.mode = LossScaling::dynamic;
  o.optimizer.loss_scaler.init_scale = 1024;
  o.optimizer.loss_scaler.growth_interval = 2;
  o.keep_swap_files = true;
  o.resume = true;
  return o;
}

struct Model {
  ParamId w = 0, b = 0;
};

Model add_params(TieredOptimizer& t, std::int64_t rows = 301) {
  GroupConfig d = GroupConfig::defaults(OptimizerKind::adamw);
  d.lr = 1e-2;
  const int g0 = t.add_group(d, "decay");
  d.weight_decay = 0;
  const int g1 = t.add_group(d, "no_decay");
  return {t.add_param(g0, {"w", {rows, 97}, Dtype::bf16, true}),
          t.add_param(g1, {"b", {4097}, Dtype::bf16, true})};
}

void init(ShardedOptimizer& opt) {
  opt.initialize([](ParamId id, std::uint64_t off, float* out, std::uint64_t n) {
    for (std::uint64_t i = 0; i < n; ++i)
      out[i] = 0.01f * static_cast<float>((id * 7919 + off + i) % 101) - 0.5f;
  });
}

// Step k's gradients depend on k and on the 16-bit parameters (as a real backward does), and are
// scaled by the loss scale; the lr follows a schedule of k (set before the step).
void step(ShardedOptimizer& opt, const Model& m) {
  const std::uint64_t k = opt.step_count() + 1;
  opt.set_lr(0, 1e-2 / static_cast<double>(k));
  opt.begin_backward();
  for (ParamId id : {m.w, m.b}) {
    const auto p = opt.param16(id);
    std::vector<std::uint16_t> g(p.size());
    for (std::size_t i = 0; i < g.size(); ++i)
      g[i] = float_to_bf16(static_cast<float>(opt.loss_scale()) *
                           (bf16_to_float(p[i]) * 1e-2f +
                            1e-3f * static_cast<float>(static_cast<int>((i * 31 + k) % 19) - 9)));
    opt.add_grad(id, g.data(), Dtype::bf16);
  }
  opt.end_backward();
  opt.step();
}

struct State {
  std::vector<float> w, b, w_m, w_v;
  std::vector<std::uint16_t> w16;
  std::uint64_t step = 0;
  double scale = 0, lr = 0;
};

State state(TieredOptimizer& t, const Model& m) {
  ShardedOptimizer& o = t.optimizer();
  const auto p = o.param16(m.w);
  return {o.gather(m.w),
          o.gather(m.b),
          o.gather(m.w, BlockClass::exp_avg),
          o.gather(m.w, BlockClass::exp_avg_sq),
          {p.begin(), p.end()},
          o.step_count(),
          o.loss_scale(),
          o.group_config(0).lr};
}

void expect_same(const State& a, const State& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.scale, b.scale);
  EXPECT_EQ(a.lr, b.lr);
  EXPECT_EQ(a.w, b.w);
  EXPECT_EQ(a.b, b.b);
  EXPECT_EQ(a.w_m, b.w_m);
  EXPECT_EQ(a.w_v, b.w_v);
  EXPECT_EQ(a.w16, b.w16);
}

State uninterrupted(int steps) {
  TempDir dir;
  TieredOptions o = options(dir.path());
  o.keep_swap_files = false;
  TieredOptimizer t(o);
  const Model m = add_params(t);
  t.finalize();
  EXPECT_FALSE(t.resumed());
  init(t.optimizer());
  for (int i = 0; i < steps; ++i) step(t.optimizer(), m);
  return state(t, m);
}

// Rewrites the commit record of the swap space in `dir` with `edit` applied (a commit of nothing).
template <class Edit>
void edit_record(const std::filesystem::path& dir, Edit&& edit) {
  TieredOptions o = options(dir);
  TieredOptimizer t(o);
  add_params(t);
  t.finalize();
  auto j = nlohmann::json::parse(t.tiers().commit_record());
  edit(j);
  t.tiers().set_commit_record(j.dump());
  t.tiers().commit();
}

}  // namespace

TEST(Resume, StoppedAndResumedRunMatchesAnUninterruptedOneBitForBit) {
  const State ref = uninterrupted(7);
  TempDir dir;
  State at3;
  {
    TieredOptimizer t(options(dir.path()));
    const Model m = add_params(t);
    t.finalize();
    ASSERT_FALSE(t.resumed());
    init(t.optimizer());
    for (int i = 0; i < 3; ++i) step(t.optimizer(), m);
    at3 = state(t, m);
  }
  for (int round = 0; round < 2; ++round) {  // resumed twice: 3 -> 5 -> 7
    TieredOptions o = options(dir.path());
    o.host_budget = 3ull << 20;  // another budget: the stored sub-group size still wins
    o.optimizer.subgroup_size = 0;
    TieredOptimizer t(o);
    const Model m = add_params(t);
    t.finalize();
    ASSERT_TRUE(t.resumed());
    EXPECT_EQ(t.optimizer().config().subgroup_size, 16384u);
    if (round == 0) expect_same(state(t, m), at3);
    step(t.optimizer(), m);
    step(t.optimizer(), m);
    if (round == 1) expect_same(state(t, m), ref);
  }
}

// A run that ends by an error keeps the files of its committed steps, as a crash does, so the
// next run resumes where it stopped; a clean end, or an error before any step, removes them.
TEST(Resume, ARunEndingByAnErrorKeepsItsFilesForTheResume) {
  TempDir dir;
  auto run = [&](int steps, bool mark, bool throw_at_end) {
    TieredOptions o = options(dir.path());
    o.keep_swap_files = false;  // the default: files go at a clean end
    TieredOptimizer t(o);
    const Model m = add_params(t);
    t.finalize();
    if (!t.resumed()) init(t.optimizer());
    for (int i = 0; i < steps; ++i) step(t.optimizer(), m);
    if (mark) t.mark_failed();
    if (throw_at_end) throw std::runtime_error("the trainer's error");
    return t.optimizer().step_count();
  };
  auto files_left = [&] { return std::filesystem::exists(dir.path() / "tierswap-rank0"); };
  EXPECT_THROW(run(2, false, true), std::runtime_error);  // unwound by an exception
  ASSERT_TRUE(files_left());
  EXPECT_EQ(run(1, true, false), 3u);  // resumed at 2, one step, then marked failed: kept
  ASSERT_TRUE(files_left());
  EXPECT_EQ(run(1, false, false), 4u);  // resumed at 3, a clean end: removed
  EXPECT_FALSE(files_left());
  EXPECT_THROW(run(0, false, true), std::runtime_error);  // nothing stepped: nothing to keep
  EXPECT_FALSE(files_left());
}

TEST(Resume, AnEmptyDirectoryStartsAfresh) {
  TempDir dir;
  TieredOptimizer t(options(dir.path()));
  add_params(t);
  t.finalize();
  EXPECT_FALSE(t.resumed());
  EXPECT_EQ(t.optimizer().step_count(), 0u);
}

TEST(Resume, AnotherModelIsRefusedByNameAndTheDirectoryKept) {
  TempDir dir;
  {
    TieredOptimizer t(options(dir.path()));
    const Model m = add_params(t);
    t.finalize();
    init(t.optimizer());
    step(t.optimizer(), m);
  }
  const auto manifest = dir.path() / "tierswap-rank0" / "tierswap.manifest";
  const auto before = std::filesystem::last_write_time(manifest);
  {
    TieredOptimizer t(options(dir.path()));
    add_params(t, 300);  // w is 300 x 97 now
    try {
      t.finalize();
      FAIL() << "resumed another model";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("\"w\""), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(std::filesystem::last_write_time(manifest), before);
  TieredOptions o = options(dir.path());
  o.resume = false;  // without resume: refused, and the message says how to resume
  TieredOptimizer t(o);
  add_params(t);
  try {
    t.finalize();
    FAIL() << "overwrote an earlier run's swap space";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("resume"), std::string::npos) << e.what();
  }
  TieredOptimizer again(options(dir.path()));
  add_params(again);
  again.finalize();
  EXPECT_TRUE(again.resumed());
  EXPECT_EQ(again.optimizer().step_count(), 1u);
}

// The commit record, written at every step, lists the layout as a checkpoint's manifest does
// (its parameter lists are made once at finalize() and spliced in), with this step's count.
TEST(Resume, TheCommitRecordListsTheGroupsAsACheckpointDoes) {
  TempDir dir, ckpt;
  TieredOptimizer t(options(dir.path()));
  const Model m = add_params(t);
  t.finalize();
  init(t.optimizer());
  for (int i = 0; i < 2; ++i) step(t.optimizer(), m);
  t.optimizer().save(ckpt.path());
  const auto rec = nlohmann::json::parse(t.tiers().commit_record());
  const auto man =
      nlohmann::json::parse(detail::read_manifest_file(ckpt.path() / "tierswap.checkpoint"));
  EXPECT_EQ(rec.at("step"), 2);
  ASSERT_FALSE(man.at("groups").empty());
  EXPECT_FALSE(man.at("groups")[0].at("params").empty());
  EXPECT_EQ(rec.at("groups"), man.at("groups"));
}

// A striped run resumes from its directories in any order; a list that misses one, or names one
// holding none of its files, is refused by name and the files are kept.
TEST(Resume, AStripedRunIsResumedFromItsDirectoriesInAnyOrderAndOnlyFromThem) {
  TempDir a, b, c;
  auto striped = [&](std::vector<std::filesystem::path> dirs) {
    TieredOptions o = options(a.path());
    o.swap_dirs = std::move(dirs);
    return o;
  };
  {
    TieredOptimizer t(striped({a.path(), b.path()}));
    const Model m = add_params(t);
    t.finalize();
    init(t.optimizer());
    step(t.optimizer(), m);
    t.mark_failed();  // as a crash: the files stay
  }
  auto refusal = [&](std::vector<std::filesystem::path> dirs) {
    TieredOptimizer t(striped(std::move(dirs)));
    add_params(t);
    try {
      t.finalize();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("resumed");
  };
  const std::string rank_c = (c.path() / "tierswap-rank0").string();
  std::string w = refusal({a.path(), c.path()});
  EXPECT_NE(w.find(rank_c + " holds no file of the swap space whose files are in " +
                   (a.path() / "tierswap-rank0").string()),
            std::string::npos)
      << w;
  w = refusal({c.path(), b.path(), a.path()});
  EXPECT_NE(w.find(rank_c + " holds no file"), std::string::npos) << w;
  w = refusal({b.path()});
  EXPECT_NE(w.find("striped over 2 files but 1 directories were given"), std::string::npos) << w;
  TieredOptimizer t(striped({b.path(), a.path()}));
  add_params(t);
  t.finalize();
  EXPECT_TRUE(t.resumed());
  EXPECT_EQ(t.optimizer().step_count(), 1u);
}

TEST(Resume, RecordsOfAnotherWorldVersionOrMemoryOnlyStateAreRefusedByName) {
  const std::pair<const char*, std::function<void(nlohmann::json&)>> cases[] = {
      {"world size 2", [](nlohmann::json& j) { j["world_size"] = 2; }},
      {"tierswap 0.0.9", [](nlohmann::json& j) { j["tierswap"] = "0.0.9"; }},
      {"memory only", [](nlohmann::json& j) { j["memory_only_state"] = true; }},
      {"rank 3", [](nlohmann::json& j) { j["rank"] = 3; }},
      {"sub-group size 1000", [](nlohmann::json& j) { j["subgroup_size"] = 1000; }},
      {"malformed", [](nlohmann::json& j) { j["groups"] = "x"; }},
      {"lr", [](nlohmann::json& j) { j["groups"][0]["config"]["lr"] = -1; }},
      {"moments stored as bf16", [](nlohmann::json& j) { j["moment_dtype"] = "bf16"; }},
  };
  for (const auto& [want, edit] : cases) {
    TempDir dir;
    {
      TieredOptimizer t(options(dir.path()));
      const Model m = add_params(t);
      t.finalize();
      init(t.optimizer());
      step(t.optimizer(), m);
    }
    edit_record(dir.path(), edit);
    TieredOptimizer t(options(dir.path()));
    add_params(t);
    try {
      t.finalize();
      ADD_FAILURE() << "resumed despite " << want;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

TEST(Resume, ARunWhoseResidentStateWasMemoryOnlyCannotResume) {
  TempDir dir;
  {
    TieredOptions o = options(dir.path());
    o.host_budget = 64ull << 20;
    o.optimizer.state_tier = OptimizerConfig::StateTier::host;
    o.optimizer.persist_resident_state = false;
    TieredOptimizer t(o);
    const Model m = add_params(t);
    t.finalize();
    init(t.optimizer());
    step(t.optimizer(), m);
  }
  TieredOptions o = options(dir.path());
  TieredOptimizer t(o);
  add_params(t);
  try {
    t.finalize();
    FAIL() << "resumed lost state";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("persist_resident_state"), std::string::npos) << e.what();
  }
}

namespace {

std::unique_ptr<TierManager> open_tiers(SwapSpace& space, IoEngine& engine) {
  TierConfig tc;
  tc.telemetry = false;
  tc.device_mode = DeviceTierMode::off;
  return std::make_unique<TierManager>(space, engine, tc);
}

// Two steps in `dir`, files kept; returns the state after the first.
State two_steps(const std::filesystem::path& dir) {
  TieredOptimizer t(options(dir));
  const Model m = add_params(t);
  t.finalize();
  init(t.optimizer());
  step(t.optimizer(), m);
  State at1 = state(t, m);
  step(t.optimizer(), m);
  return at1;
}

}  // namespace

TEST(Resume, RollingBackAGenerationReturnsToThePreviousStepOnce) {
  TempDir dir;
  const State at1 = two_steps(dir.path());
  {
    SwapSpace space = SwapSpace::open({dir.path() / "tierswap-rank0"});
    IoEngine engine(space);
    auto tiers = open_tiers(space, engine);
    EXPECT_TRUE(tiers->roll_back_generation());
    EXPECT_FALSE(tiers->roll_back_generation());  // the generation before that is gone
  }
  TieredOptimizer t(options(dir.path()));
  const Model m = add_params(t);
  t.finalize();
  ASSERT_TRUE(t.resumed());
  expect_same(state(t, m), at1);
}

TEST(Resume, RollingBackOntoOverwrittenDataIsRefusedByBlockName) {
  TempDir dir;
  two_steps(dir.path());
  const auto path = dir.path() / "tierswap-rank0" / "tierswap.manifest";
  auto j = nlohmann::json::parse(detail::read_manifest_file(path));
  std::string victim;
  for (auto& b : j["blocks"])
    if (b.contains("previous") && b["previous"][1].get<bool>()) {
      b["previous"][3] = "1234";  // as if the previous extent had been overwritten since
      victim = b["name"].get<std::string>();
      break;
    }
  ASSERT_FALSE(victim.empty());
  detail::write_manifest_file(path, j.dump(), false);
  SwapSpace space = SwapSpace::open({dir.path() / "tierswap-rank0"});
  IoEngine engine(space);
  auto tiers = open_tiers(space, engine);
  try {
    tiers->roll_back_generation();
    FAIL() << "rolled back onto data that does not match";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(victim), std::string::npos) << e.what();
  }
  EXPECT_EQ(tiers->committed_generation(), 3u);  // nothing changed
}

// ---- through the node service ------------------------------------------------------------------
TEST(Resume, ThroughTheNodeServiceAKilledRunResumesBitForBit) {
  const State ref = uninterrupted(7);
  TempDir sdir, dir;
  ServiceConfig sc;
  sc.swap_dirs = {sdir.path()};
  sc.capacity = 64ull << 20;
  sc.host_budget = 32ull << 20;
  sc.socket = sdir.path() / "service.sock";
  sc.lock_memory = false;
  const pid_t svc = test::spawn_service(sc);
  ASSERT_GT(svc, 0);
  struct Stop {
    pid_t pid;
    ~Stop() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } stop{svc};
  auto through_service = [&] {
    TieredOptions o = options(dir.path());
    o.service.socket = sc.socket.string();
    o.service.job = "resume-test";
    return o;
  };
  const pid_t victim = ::fork();
  if (victim == 0) {  // 3 steps, then killed: no destructor runs
    TieredOptimizer t(through_service());
    const Model m = add_params(t);
    t.finalize();
    if (t.resumed() || t.engine().backend() != IoBackendKind::service) ::_exit(4);
    init(t.optimizer());
    if (t.tiers().snapshot().host_memory != "service-shared") ::_exit(5);
    for (int i = 0; i < 3; ++i) step(t.optimizer(), m);
    ::kill(::getpid(), SIGKILL);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(victim, &status, 0), victim);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the client exited with " << WEXITSTATUS(status);
  for (int round = 0; round < 2; ++round) {  // resumed twice: 3 -> 5 -> 7
    std::unique_ptr<TieredOptimizer> t;
    for (int i = 0; i < 200 && !t; ++i) {  // until the service has seen the victim's socket close
      try {
        t = std::make_unique<TieredOptimizer>(through_service());
        add_params(*t);
        t->finalize();
      } catch (const std::system_error& e) {
        t.reset();
        ASSERT_NE(std::string(e.what()).find("already attached"), std::string::npos) << e.what();
        ::usleep(10000);
      }
    }
    ASSERT_TRUE(t);
    ASSERT_TRUE(t->resumed());
    const Model m{0, 1};
    step(t->optimizer(), m);
    step(t->optimizer(), m);
    if (round == 1) expect_same(state(*t, m), ref);
  }
}
