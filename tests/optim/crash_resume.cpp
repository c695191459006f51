// Kill trials: a training process killed with SIGKILL at seeded random moments resumes from its
// swap directory and ends bit-identical to a run that never stopped.
//
//   crash_resume [--trials N] [--seed S] [--work DIR] [--pipelined]   the driver (CTest runs it)
//   crash_resume child DIR PHASE KILL_STEP FRACTION OUT      one training process
//
// A child trains a small model (two groups, ragged sizes, state streamed from NVMe under a host
// budget well below it, write-behind, dynamic loss scaling, clipping, a save() checkpoint every
// third step) for kSteps steps with TieredOptions::resume, each step's gradients a function of
// the step number and the 16-bit parameters. At step KILL_STEP it arms a timer for PHASE
// ("ingest": the backward, "step": step() with its pipeline, write-behind and commit, "save":
// save()) that sends SIGKILL after FRACTION x that phase's duration in the previous step. At the
// end it writes every parameter's master weights and moments to OUT. The driver runs a reference
// child, then per trial a child that is killed and children that resume until one finishes, and
// compares OUT byte for byte. It fails on any difference, a child that fails, or a resume that
// does not happen. --pipelined: the children leave each step's commit running while they go on
// (OptimizerConfig::pipelined_commit, through TIERSWAP_PIPELINED_COMMIT), so a kill in the next
// step's backward finds it in flight and the resumed run redoes that step.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tierswap/tiered_optimizer.hpp"

extern char** environ;

using namespace tierswap;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kSteps = 9;
const char* const kPhases[] = {"ingest", "step", "save"};

TieredOptions options(const std::string& dir) {
  TieredOptions o;
  o.swap_dirs = {dir};
  o.host_budget = 3ull << 20;
  o.communicator = "single";
  o.threads = 2;
  o.tiers.telemetry = false;
  o.tiers.durable = false;  // kill -9 keeps the page cache: the generations are still exact
  o.tiers.device_mode = DeviceTierMode::off;
  o.optimizer.subgroup_size = 32768;
  o.optimizer.state_tier = OptimizerConfig::StateTier::nvme;
  o.optimizer.max_grad_norm = 1.0;
  o.optimizer.loss_scaler.mode = LossScaling::dynamic;
  o.optimizer.loss_scaler.init_scale = 256;
  o.optimizer.loss_scaler.growth_interval = 3;
  o.keep_swap_files = true;
  o.resume = true;
  o.optimizer = OptimizerConfig::from_env(o.optimizer);  // the driver's --pipelined
  return o;
}

// Kills this process `delay` from now.
void arm(double delay) {
  std::thread([delay] {
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    ::kill(::getpid(), SIGKILL);
  }).detach();
}

void backward(ShardedOptimizer& opt, const std::vector<ParamId>& ids, std::uint64_t k) {
  opt.begin_backward();
  for (ParamId id : ids) {
    const auto p = opt.param16(id);
    std::vector<std::uint16_t> g(p.size());
    const float s = static_cast<float>(opt.loss_scale());
    for (std::size_t i = 0; i < g.size(); ++i)
      g[i] = float_to_bf16(
          s * (bf16_to_float(p[i]) * 0.05f +
               1e-3f * static_cast<float>(static_cast<int>((i * 7 + k * 13) % 23) - 11)));
    opt.add_grad(id, g.data(), Dtype::bf16);
  }
  opt.end_backward();
}

int child(const std::string& dir, const std::string& phase, int kill_step, double fraction,
          const std::string& out) {
  TieredOptimizer t(options(dir));
  GroupConfig d = GroupConfig::defaults(OptimizerKind::adamw);
  d.lr = 1e-2;
  const int g0 = t.add_group(d, "decay");
  d.weight_decay = 0;
  const int g1 = t.add_group(d, "no_decay");
  const std::vector<ParamId> ids = {t.add_param(g0, {"w", {257, 383}, Dtype::bf16, true}),
                                    t.add_param(g1, {"b", {40961}, Dtype::bf16, true})};
  t.finalize();
  ShardedOptimizer& opt = t.optimizer();
  if (!t.resumed())
    opt.initialize([](ParamId id, std::uint64_t off, float* o, std::uint64_t n) {
      for (std::uint64_t i = 0; i < n; ++i)
        o[i] = 0.02f * static_cast<float>((id * 131 + off + i) % 97) - 0.9f;
    });
  double took[3] = {0.01, 0.01, 0.01};  // each phase's duration in the previous step
  for (std::uint64_t k = opt.step_count() + 1; k <= kSteps; k = opt.step_count() + 1) {
    auto phase_at = [&](int p) {
      if (static_cast<int>(k) == kill_step && phase == kPhases[p]) arm(fraction * took[p]);
      return Clock::now();
    };
    opt.set_lr(0, 1e-2 / static_cast<double>(k));
    auto t0 = phase_at(0);
    backward(opt, ids, k);
    auto t1 = phase_at(1);
    opt.step();
    auto t2 = phase_at(2);
    if (k % 3 == 0) opt.save(dir + "/ckpt");
    const auto t3 = Clock::now();
    took[0] = std::chrono::duration<double>(t1 - t0).count();
    took[1] = std::chrono::duration<double>(t2 - t1).count();
    if (k % 3 == 0) took[2] = std::chrono::duration<double>(t3 - t2).count();
  }
  std::ofstream f(out, std::ios::binary | std::ios::trunc);
  for (ParamId id : ids)
    for (BlockClass c : {BlockClass::master, BlockClass::exp_avg, BlockClass::exp_avg_sq}) {
      const auto v = opt.gather(id, c);
      f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
    }
  const double scale = opt.loss_scale();
  f.write(reinterpret_cast<const char*>(&scale), sizeof scale);
  return f.good() ? 0 : 3;
}

// Runs a child; returns its wait status.
int run_child(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ) != 0) {
    std::perror("posix_spawn");
    std::exit(2);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

int driver(int trials, unsigned seed, const std::string& work) {
  std::filesystem::remove_all(work);
  std::filesystem::create_directories(work + "/ref");
  const std::string self = "crash_resume";
  if (run_child({self, "child", work + "/ref", "none", "0", "0", work + "/ref.bin"}) != 0) {
    std::cerr << "the reference run failed\n";
    return 1;
  }
  const std::string ref = slurp(work + "/ref.bin");
  std::mt19937 rng(seed);
  int killed[3] = {}, resumes = 0;
  for (int trial = 0; trial < trials; ++trial) {
    const int phase = static_cast<int>(rng() % 3);
    const int step = phase == 2 ? 3 * static_cast<int>(1 + rng() % 2)
                                : static_cast<int>(1 + rng() % (kSteps - 1));
    const double fraction = std::uniform_real_distribution<double>(0.0, 1.1)(rng);
    const std::string dir = work + "/t" + std::to_string(trial), out = dir + ".bin";
    std::filesystem::create_directories(dir);
    const std::string what = std::string(kPhases[phase]) + " of step " + std::to_string(step) +
                             " at " + std::to_string(fraction);
    int st = run_child(
        {self, "child", dir, kPhases[phase], std::to_string(step), std::to_string(fraction), out});
    if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
      ++killed[phase];
      st = run_child({self, "child", dir, "none", "0", "0", out});  // resume and finish
      ++resumes;
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      std::cerr << "trial " << trial << " (" << what << "): a child failed, status " << st << "\n";
      return 1;
    }
    if (slurp(out) != ref) {
      std::cerr << "trial " << trial << " (" << what << "): state differs from the reference\n";
      return 1;
    }
    std::filesystem::remove_all(dir);
  }
  std::cout << trials << " trials: killed during ingest " << killed[0] << ", step " << killed[1]
            << ", save " << killed[2] << "; " << resumes
            << " resumed runs bit-identical to the uninterrupted one\n";
  if (resumes < trials * 3 / 4) {
    std::cerr << "too few kills landed (" << resumes << " of " << trials << ")\n";
    return 1;
  }
  std::filesystem::remove_all(work);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"crash_resume: training processes killed at seeded moments, each resumed"};
  int trials = 50;
  unsigned seed = 1;
  std::string work = "crash_resume_work";
  bool pipelined = false;
  app.add_option("--trials", trials, "Killed-and-resumed runs")->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "Seed of the kill moments");
  app.add_option("--work", work, "Scratch directory (emptied first)");
  app.add_flag("--pipelined", pipelined,
               "The children leave each step's commit running (pipelined_commit)");
  // One trial's training process, started by the driver.
  auto* ch = app.add_subcommand("child", "(internal) one training process");
  std::string dir, phase, out;
  int kill_step = 0;
  double fraction = 0;
  ch->add_option("dir", dir)->required();
  ch->add_option("phase", phase)->required();
  ch->add_option("kill_step", kill_step)->required();
  ch->add_option("fraction", fraction)->required();
  ch->add_option("out", out)->required();
  CLI11_PARSE(app, argc, argv);
  try {
    if (ch->parsed()) return child(dir, phase, kill_step, fraction, out);
    if (pipelined) ::setenv("TIERSWAP_PIPELINED_COMMIT", "1", 1);  // the children read it
    return driver(trials, seed, work);
  } catch (const std::exception& e) {
    std::cerr << "crash_resume: " << e.what() << "\n";
    return 1;
  }
}
