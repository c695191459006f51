// The fault soak: 300 steps of a small model, its state streamed from NVMe, with the fault
// backend injecting EIO, ENOSPC, short transfers and EAGAIN at random (seeded, about one request
// in a thousand). A hard fault fails the engine ticket it lands in. In a transfer the step waits
// for, it fails the step, which rolls back (the committed generation untouched) and is redone with
// the same gradients; in a read-ahead or a write-behind nobody waits for, the tier manager reads or
// writes again and the step goes on (which of the two a fault meets depends on timing). Soft
// faults are retried and never fail a step. The final state is bit-identical to a fault-free run,
// and no file descriptor, thread or pinned byte is left behind.
#include <dirent.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>

#include "test_util.hpp"
#include "tierswap/communicator.hpp"
#include "tierswap/detail/io_backend.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/optimizer.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/thread_pool.hpp"

using namespace tierswap;
using detail::Fault;
using tierswap::test::TempDir;

namespace {

std::size_t count_entries(const char* dir) {
  std::size_t n = 0;
  if (DIR* d = ::opendir(dir)) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n;
}
std::size_t open_fds() {
  return count_entries("/proc/self/fd");
}
std::size_t threads() {
  return count_entries("/proc/self/task");
}
// Locked (pinned) memory of the process, /proc/self/status VmLck, in kB.
std::uint64_t locked_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmLck:", 0) == 0) return std::stoull(line.substr(6));
  return 0;
}

// Injects a fault into about one request in `one_in` (seeded); counts what it injected.
struct Injector {
  std::mt19937_64 rng;
  std::uint32_t one_in;
  std::atomic<bool> on{false};
  std::atomic<int> hard{0}, soft{0};
  std::mutex mu;
  Injector(std::uint64_t seed, std::uint32_t one_in) : rng(seed), one_in(one_in) {}
  Fault operator()(const detail::IoRequest& r) {
    if (!on.load()) return {};
    std::lock_guard lk(mu);
    if (rng() % one_in != 0) return {};
    switch (rng() % 4) {
      case 0:
        ++hard;
        return {Fault::Kind::error, EIO};
      case 1:
        ++hard;
        return {Fault::Kind::error, ENOSPC};
      case 2:
        if (r.length <= 4096) return {};
        ++soft;
        return {Fault::Kind::short_transfer, 0, 4096};
      default:
        ++soft;
        return {Fault::Kind::again};
    }
  }
};

struct SoakRun {
  std::vector<std::vector<float>> state;  // per parameter: master, exp_avg, exp_avg_sq
  std::vector<std::vector<std::uint16_t>> p16;
  int failed_steps = 0, hard = 0, soft = 0;
  std::uint64_t failed_tickets = 0;  // engine tickets a hard fault failed
  std::uint64_t views = 0;           // host tier bytes pinned by views after the last step
};

void backward(ShardedOptimizer& opt, const std::vector<ParamId>& ids, std::uint64_t k) {
  opt.begin_backward();
  for (ParamId id : ids) {
    const auto p = opt.param16(id);
    std::vector<std::uint16_t> g(p.size());
    for (std::size_t i = 0; i < g.size(); ++i)
      g[i] = float_to_bf16(bf16_to_float(p[i]) * 0.02f +
                           1e-3f * static_cast<float>(static_cast<int>((i * 5 + k * 11) % 17) - 8));
    opt.add_grad(id, g.data(), Dtype::bf16);
  }
  opt.end_backward();
}

SoakRun soak(std::uint32_t one_in, int steps) {
  TempDir dir;
  SwapSpaceConfig sc;
  sc.dirs = {dir.path()};
  sc.capacity = 64ull << 20;
  SwapSpace space = SwapSpace::create(sc);
  Injector inj(2026, one_in);
  std::string why;
  IoEngineConfig ec;
  ec.block_size = 64 << 10;
  ec.queue_depth = 16;  // the backend's depth below
  auto inner = test::make_backend(IoBackendKind::posix, space, 16, &why);
  IoEngine engine(
      space, ec,
      detail::make_fault_backend(
          std::move(inner), [&](const detail::IoRequest& r, std::uint64_t) { return inj(r); }));
  TierConfig tc;
  tc.host_budget = 3ull << 20;
  tc.host_slab_size = 256 << 10;
  tc.device_mode = DeviceTierMode::off;
  tc.durable = false;
  tc.telemetry = false;
  TierManager tiers(space, engine, tc);
  auto comm = make_single_communicator();
  ThreadPool pool(2);
  OptimizerConfig oc;
  oc.subgroup_size = 65536;
  oc.state_tier = OptimizerConfig::StateTier::nvme;
  oc.max_grad_norm = 1.0;
  ShardedOptimizer opt(tiers, *comm, oc, &pool);
  GroupConfig g = GroupConfig::defaults(OptimizerKind::adamw);
  g.lr = 3e-3;
  const int g0 = opt.add_group(g);
  const std::vector<ParamId> ids = {opt.add_param(g0, {"w", {300, 1001}, Dtype::bf16}),
                                    opt.add_param(g0, {"b", {7777}, Dtype::bf16})};
  opt.finalize();
  opt.initialize([](ParamId id, std::uint64_t off, float* o, std::uint64_t n) {
    for (std::uint64_t i = 0; i < n; ++i) o[i] = 0.01f * static_cast<float>((id + off + i) % 83);
  });
  SoakRun run;
  inj.on = true;
  for (std::uint64_t k = 1; k <= static_cast<std::uint64_t>(steps); ++k) {
    for (int attempt = 0;; ++attempt) {
      const int hard_before = inj.hard;
      try {
        backward(opt, ids, k);
        opt.step();
        break;
      } catch (const std::system_error& e) {
        std::fprintf(stderr, "step %llu: %s\n", static_cast<unsigned long long>(k), e.what());
        ++run.failed_steps;
        // The fault fails the attempt it landed in, never a later one (nothing stays poisoned).
        EXPECT_GT(inj.hard.load(), hard_before) << "step " << k << " failed without a new fault";
        EXPECT_TRUE(e.code().value() == EIO || e.code().value() == ENOSPC) << e.what();
        EXPECT_EQ(opt.step_count(), k - 1) << "a failed step must leave the committed state";
        // Each attempt was failed by a fault of its own (above): a streak is bad luck, not a
        // poisoned state. At one request in 200 failing hard, a retry that re-reads the state
        // fails often enough that 6 in a row was seen (1 run in ~10 on 2 vCPUs under load);
        // 12 in a row would be a state that keeps failing.
        EXPECT_LT(attempt, 12) << "step " << k << " keeps failing";
        if (attempt >= 12) throw;
      }
    }
  }
  inj.on = false;
  for (const auto& row : tiers.snapshot().tiers)
    if (row.tier == Tier::host) {
      run.views = row.pinned_bytes;  // (a read-ahead may still be landing: not a leak)
    }
  run.hard = inj.hard;
  run.soft = inj.soft;
  run.failed_tickets = engine.stats().failed_tickets;
  for (ParamId id : ids) {
    for (BlockClass c : {BlockClass::master, BlockClass::exp_avg, BlockClass::exp_avg_sq})
      run.state.push_back(opt.gather(id, c));
    const auto p = opt.param16(id);
    run.p16.emplace_back(p.begin(), p.end());
  }
  return run;
}

// Runs `steps` steps fault-free and again with a fault in about one request in `one_in`; the
// second run must end with the first's state, having leaked nothing.
void expect_soak_survives(std::uint32_t one_in, int steps) {
  const SoakRun clean = soak(0xffffffffu, steps);  // (practically) no faults
  // Counted after a first run: sanitizer runtimes start threads of their own on first use.
  const std::size_t fds0 = open_fds(), threads0 = threads();
  const std::uint64_t locked0 = locked_kb();
  const SoakRun faulty = soak(one_in, steps);
  EXPECT_EQ(open_fds(), fds0) << "file descriptors leaked";
  EXPECT_EQ(threads(), threads0) << "threads leaked";
  EXPECT_EQ(locked_kb(), locked0) << "pinned (locked) host memory not given back";
  EXPECT_EQ(faulty.views, 0u) << "host views held after the steps";
  EXPECT_EQ(clean.failed_steps, 0);
  EXPECT_GT(faulty.hard, 0) << "no hard fault was injected: the soak tested nothing";
  EXPECT_GT(faulty.soft, 0);
  // No hard fault passed as success: each failed its ticket (several may land in one), and every
  // failed step had one. Whether any landed where a step waits is timing: not asserted.
  EXPECT_GT(faulty.failed_tickets, 0u);
  EXPECT_LE(faulty.failed_tickets, static_cast<std::uint64_t>(faulty.hard));
  EXPECT_LE(static_cast<std::uint64_t>(faulty.failed_steps), faulty.failed_tickets);
  ASSERT_EQ(clean.state.size(), faulty.state.size());
  for (std::size_t i = 0; i < clean.state.size(); ++i)
    EXPECT_TRUE(clean.state[i] == faulty.state[i]) << "state tensor " << i << " differs";
  EXPECT_EQ(clean.p16, faulty.p16);
  std::printf(
      "fault soak (1 in %u): %d steps, %d hard faults (EIO/ENOSPC) failed %llu tickets and %d "
      "step attempts, each redone; %d soft faults (short transfers, EAGAIN) retried; state "
      "bit-identical\n",
      one_in, steps, faulty.hard, static_cast<unsigned long long>(faulty.failed_tickets),
      faulty.failed_steps, faulty.soft);
}

}  // namespace

TEST(FaultSoak, ThreeHundredStepsUnderRandomFaultsEndBitIdenticalAndLeakNothing) {
  expect_soak_survives(1000, 300);
}

// Ten times the fault rate: faults in a rollback's own reads, and write-behinds that fail with
// nobody waiting (finalized by the engine's reaper), come often enough to be seen in one run.
// Before the fixes, runs at this rate failed often (16 of 20 seeds over 300 steps; 2 of 6 runs of
// this test): a commit recorded a block whose failed write-behind
// had left its newest data only in memory, and a rollback whose read failed left the 16-bit
// parameters half restored.
TEST(FaultSoak, DenseFaultsEndBitIdenticalToo) {
  expect_soak_survives(100, 200);
}
