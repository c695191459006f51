// `tierswap bench resume`: how long a restarted trainer takes to get its optimizer state back,
// from the swap directory (TieredOptions::resume: reopen, verify every block's checksum, recompute
// the 16-bit parameters) against a save() checkpoint written and load()ed into a fresh swap
// space (what a trainer without resume does). Both sides move the same state on the same disk;
// runs alternate and medians are reported.
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tierswap/tiered_optimizer.hpp"
#include "tierswap/units.hpp"
#include "tools/commands.hpp"
#include "tools/temp_dir.hpp"
#include "tools/timing.hpp"

namespace tierswap::cli {
namespace {

struct ResumeOptions {
  std::string dir;
  std::string params = "256M";
  std::string host_budget = "2GiB";
  int runs = 3;
  bool json = false;
};

TieredOptions resume_options(const std::filesystem::path& dir, std::uint64_t budget) {
  TieredOptions o;
  o.swap_dirs = {dir};
  o.host_budget = budget;
  o.communicator = "single";
  o.tiers.telemetry = false;
  o.tiers.device_mode = DeviceTierMode::off;
  o.optimizer.state_tier = OptimizerConfig::StateTier::nvme;
  o.keep_swap_files = true;
  o.resume = true;
  return o;
}

std::unique_ptr<TieredOptimizer> open_model(const std::filesystem::path& dir, std::uint64_t budget,
                                            std::uint64_t n) {
  auto t = std::make_unique<TieredOptimizer>(resume_options(dir, budget));
  const int g = t->add_group(GroupConfig::defaults(OptimizerKind::adamw), "all");
  const std::uint64_t rows = n / 4096;  // parameters of 4096 x 4096 at most, the last ragged
  for (std::uint64_t r = 0, i = 0; r < rows; r += 4096, ++i)
    t->add_param(g, {fmt::format("w{}", i),
                     {static_cast<std::int64_t>(std::min<std::uint64_t>(4096, rows - r)), 4096},
                     Dtype::bf16});
  t->finalize();
  return t;
}

// The run that "crashes": initialized, one step committed, then left (its swap files kept).
void run_that_crashes(const std::filesystem::path& dir, std::uint64_t budget, std::uint64_t n) {
  auto t = open_model(dir, budget, n);
  ShardedOptimizer& opt = t->optimizer();
  opt.initialize([](ParamId, std::uint64_t off, float* out, std::uint64_t k) {
    for (std::uint64_t i = 0; i < k; ++i) out[i] = 1e-3f * static_cast<float>((off + i) % 977);
  });
  opt.begin_backward();
  for (ParamId id = 0; id < opt.param_count(); ++id) {
    std::vector<std::uint16_t> g(opt.param(id).numel(), float_to_bf16(1e-3f));
    opt.add_grad(id, g.data(), Dtype::bf16);
  }
  opt.end_backward();
  opt.step();
}

void run_resume_bench(const ResumeOptions& o) {
  const std::uint64_t n = parse_param_count(o.params, "--params") / 4096 * 4096;
  const std::uint64_t budget = parse_size(o.host_budget, "--host-budget");
  if (n < 4096) throw std::invalid_argument("--params: at least 4K");
  if (o.runs < 1) throw std::invalid_argument("--runs: at least 1");
  std::unique_ptr<TempDir> temp;
  const auto root = dir_or_temp(o.dir, "tierswap-bench-resume", temp);
  if (!o.dir.empty()) make_new_or_empty(root, "--dir");
  const auto run = root / "run", fresh = root / "fresh", ckpt = root / "ckpt";
  for (const auto& d : {run, fresh}) std::filesystem::create_directories(d);
  run_that_crashes(run, budget, n);
  std::vector<double> resume_s, save_s, load_s, ratio;
  for (int r = 0; r < o.runs; ++r) {
    auto t0 = Clock::now();
    auto t = open_model(run, budget, n);  // resume from the swap directory
    resume_s.push_back(since(t0));
    if (!t->resumed()) throw std::runtime_error("bench resume: the run did not resume");
    t0 = Clock::now();
    t->optimizer().save(ckpt);
    save_s.push_back(since(t0));
    t.reset();
    t0 = Clock::now();
    auto f = open_model(fresh, budget, n);  // a fresh space, then load()
    f->optimizer().load(ckpt);
    load_s.push_back(since(t0));
    f.reset();
    std::filesystem::remove_all(fresh);
    std::filesystem::create_directories(fresh);
    ratio.push_back((save_s.back() + load_s.back()) / resume_s.back());
  }
  const double rs = median(resume_s), ss = median(save_s), ls = median(load_s);
  const std::uint64_t state = n * 12;
  if (o.json) {
    fmt::print("{}\n", nlohmann::json{{"params", n},
                                      {"state_bytes", state},
                                      {"runs", o.runs},
                                      {"resume_s", rs},
                                      {"save_s", ss},
                                      {"load_s", ls},
                                      {"median_run_save_load_over_resume", median(ratio)}}
                           .dump(2));
    return;
  }
  fmt::print(
      "tierswap bench resume: {} params, {} of AdamW state on NVMe, {} runs (medians)\n"
      "resume from the swap directory {:.2f} s; save() {:.2f} s + load() into a fresh space "
      "{:.2f} s = {:.2f} s; per run, save + load took {:.2f}x the resume\n",
      n, format_bytes(state), o.runs, rs, ss, ls, ss + ls, median(ratio));
}

}  // namespace

void add_bench_resume(CLI::App& bench) {
  auto o = std::make_shared<ResumeOptions>();
  auto* b = bench.add_subcommand(
      "resume",
      "Getting the state back after a restart: resume from the swap directory vs "
      "save() + load()");
  b->add_option("--dir", o->dir, "A new or empty directory (default: a temporary one)");
  b->add_option("--params", o->params, kParamsHelp);
  b->add_option("--host-budget", o->host_budget, "Pinned host bytes");
  b->add_option("--runs", o->runs, "Repetitions, alternating (medians reported)");
  b->add_flag("--json", o->json, "Print JSON on stdout instead of text");
  b->callback([o] { run_resume_bench(*o); });
}

}  // namespace tierswap::cli
