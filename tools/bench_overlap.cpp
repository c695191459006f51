// `tierswap bench step`'s loop modes: a simulated training loop around ShardedOptimizer, one step
// at a time. --overlap: the overlapped step against the ordinary one after the same backward.
// --trainer-seconds: the exposed step beside a trainer's forward and backward.
#include <fmt/format.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>
#include <tuple>

#include "tierswap/units.hpp"
#include "tools/bench_step.hpp"
#include "tools/timing.hpp"

namespace tierswap::cli {
namespace {

// The simulated backward of `ms` milliseconds from now: parameter i's gradient arrives at
// (i + 1) / P of its length (later if a hand-over blocks). Its seconds.
double simulated_backward(const LoopBench& b, double ms) {
  const auto t0 = Clock::now();
  const auto len = std::chrono::duration<double, std::milli>(ms);
  b.opt.begin_backward();
  for (std::size_t i = 0; i < b.ids.size(); ++i) {
    std::this_thread::sleep_until(
        t0 + std::chrono::duration_cast<Clock::duration>(len * static_cast<double>(i + 1) /
                                                         static_cast<double>(b.ids.size())));
    b.opt.add_grad(b.ids[i], b.grad.data(), Dtype::bf16);
  }
  b.opt.end_backward();
  return since(t0);
}

// `bench step --overlap`: one backward (simulated) + step at a time, overlapped or not.
struct OverlapCycles {
  const LoopBench& b;
  const StepOptions& o = b.o;
  TierManager& tiers = b.tiers;
  ShardedOptimizer& opt = b.opt;

  double backward() { return simulated_backward(b, o.backward_ms); }
  // One backward + step: its backward's length, the step's result and the NVMe bytes written
  // over both (the overlapped mode writes during the backward).
  std::tuple<double, StepResult, std::uint64_t> cycle(bool overlap) {
    opt.set_overlap(overlap);
    const std::uint64_t w0 = tiers.counters().bytes_in[static_cast<int>(Tier::nvme)];
    const double b = backward();
    const StepResult r = opt.step();
    return {b, r, tiers.counters().bytes_in[static_cast<int>(Tier::nvme)] - w0};
  }
  // One run: an ordinary and an overlapped cycle.
  struct Run {
    double ordinary_s = 0, backward_s = 0, overlapped_s = 0;
    std::uint32_t kept = 0;  // sub-groups stepped during the backward
    std::uint64_t nvme_written = 0;
    double hidden() const { return 1.0 - overlapped_s / ordinary_s; }
    nlohmann::json to_json() const {
      return {{"backward_s", backward_s},          {"ordinary_step_s", ordinary_s},
              {"overlapped_step_s", overlapped_s}, {"overlapped_subgroups", kept},
              {"nvme_write_bytes", nvme_written},  {"hidden_fraction", hidden()}};
    }
  };
  // Run r: the two cycles, in turn first.
  Run run(int r) {
    Run out;
    for (int k = 0; k < 2; ++k) {
      const bool overlap = (r + k) % 2 == 1;
      const auto [b, res, written] = cycle(overlap);
      if (res.redone || res.skipped)
        throw std::runtime_error("bench step --overlap: a step was redone or skipped");
      if (!overlap) {
        out.ordinary_s = res.seconds;
        continue;
      }
      out.backward_s = b;
      out.overlapped_s = res.seconds;
      out.kept = res.overlapped_subgroups;
      out.nvme_written = written;
    }
    return out;
  }
};

}  // namespace

void run_overlap_bench(const LoopBench& b) {
  const StepOptions& o = b.o;
  const ShardedOptimizer& opt = b.opt;
  const std::uint64_t n = b.params;
  if (!(o.backward_ms >= 0)) throw std::invalid_argument("--backward-ms: must be >= 0");
  OverlapCycles c{b};
  if (!o.json)
    fmt::print(
        "tierswap bench step --overlap: {} params ({}), sub-group {} params ({} sub-groups), "
        "simulated backward {:.0f} ms, host budget {}, state on {}{}{}\n",
        n, o.optimizer, opt.config().subgroup_size, opt.subgroup_count(), o.backward_ms,
        o.host_budget, o.state,
        o.state == "host" ? (o.memory_only ? " (memory-only)" : " (persisted to NVMe each step)")
                          : "",
        o.param16_in_place ? ", speculative 16-bit output in place" : "");
  c.cycle(false);  // warm-up: every block has data on NVMe
  c.cycle(true);
  std::vector<OverlapCycles::Run> runs;
  auto med = [&](auto field) {
    std::vector<double> v;
    for (const auto& r : runs) v.push_back(field(r));
    return median(v);
  };
  for (int r = 0; r < o.runs; ++r) {
    runs.push_back(c.run(r));
    const auto& x = runs.back();
    if (!o.json)
      fmt::print(
          "run {}: ordinary step {:.3f} s; overlapped: backward {:.3f} s, then step {:.3f} s "
          "({} of {} sub-groups stepped during the backward, {} written to NVMe): {:.0f}% of "
          "the step hidden\n",
          r + 1, x.ordinary_s, x.backward_s, x.overlapped_s, x.kept, opt.subgroup_count(),
          format_bytes(x.nvme_written), 100 * x.hidden());
  }
  const double ord = med([](const auto& x) { return x.ordinary_s; });
  const double ovl = med([](const auto& x) { return x.overlapped_s; });
  const double hidden = med([](const auto& x) { return x.hidden(); });
  if (!o.json) {
    fmt::print(
        "median: ordinary step {:.3f} s, overlapped step after the backward {:.3f} s: {:.0f}% of "
        "the step hidden behind a {:.0f} ms backward (median of per-run ratios)\n",
        ord, ovl, 100 * hidden, o.backward_ms);
    return;
  }
  nlohmann::json js = nlohmann::json::array();
  for (const auto& x : runs) js.push_back(x.to_json());
  const nlohmann::json j{{"params", n},
                         {"optimizer", o.optimizer},
                         {"sub_group", opt.config().subgroup_size},
                         {"subgroups", opt.subgroup_count()},
                         {"backward_ms", o.backward_ms},
                         {"state", o.state},
                         {"memory_only", o.memory_only},
                         {"param16_in_place", o.param16_in_place},
                         {"runs", js},
                         {"backward_s", med([](const auto& x) { return x.backward_s; })},
                         {"ordinary_step_s", ord},
                         {"overlapped_step_s", ovl},
                         {"hidden_fraction", hidden}};
  fmt::print("{}\n", j.dump(2));
}

namespace {

// `bench step --trainer-seconds S`: training steps as a trainer whose forward and backward take
// S seconds in all (a GPU's, say) sees them. The forward (S/3) is a wait, during which the step
// before's durable commit lands; the backward (2S/3) hands the gradients over evenly and the
// sub-groups whose gradients are final step meanwhile; then step(). What the trainer waits for
// beyond S is the step's exposed time.
struct TrainerCycles {
  const LoopBench& b;

  struct Step {
    double exposed_s = 0;   // the cycle's wall time less S
    double settle_s = 0;    // begin_backward(): the previous commit still landing
    double backward_s = 0;  // the backward, its hand-overs included (2S/3 when none blocks)
    double step_s = 0;      // step()
    std::uint32_t overlapped = 0;
    nlohmann::json to_json() const {
      return {{"exposed_s", exposed_s},
              {"commit_settle_s", settle_s},
              {"backward_s", backward_s},
              {"step_s", step_s},
              {"overlapped_subgroups", overlapped}};
    }
  };

  Step step() {
    const double S = b.o.trainer_seconds;
    const auto t0 = Clock::now();
    std::this_thread::sleep_until(
        t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(S / 3)));
    Step out;
    const auto f = Clock::now();
    b.tiers.wait_commit();  // (what begin_backward() would wait for)
    out.settle_s = since(f);
    out.backward_s = simulated_backward(b, S * 2000 / 3);
    const StepResult r = b.opt.step();
    if (r.redone || r.skipped)
      throw std::runtime_error("bench step --trainer-seconds: a step was redone or skipped");
    out.step_s = r.seconds;
    out.overlapped = r.overlapped_subgroups;
    out.exposed_s = std::max(0.0, since(t0) - S);
    return out;
  }
};

}  // namespace

void run_trainer_bench(const LoopBench& b) {
  const StepOptions& o = b.o;
  if (!(o.trainer_seconds > 0)) throw std::invalid_argument("--trainer-seconds: must be > 0");
  TrainerCycles c{b};
  if (!o.json)
    fmt::print(
        "tierswap bench step --trainer-seconds {}: {} params ({}), sub-group {} params ({} "
        "sub-groups), host budget {}, state on {}, commits durable and pipelined, step "
        "overlapped with the backward\n",
        o.trainer_seconds, b.params, o.optimizer, b.opt.config().subgroup_size,
        b.opt.subgroup_count(), o.host_budget, o.state);
  for (int w = 0; w < 2; ++w) c.step();  // warm-up: every block has data on NVMe
  std::vector<TrainerCycles::Step> steps;
  for (int r = 0; r < o.runs; ++r) {
    steps.push_back(c.step());
    const auto& x = steps.back();
    if (!o.json)
      fmt::print(
          "step {}: exposed {:.1f} ms (waited {:.1f} ms for the last commit, backward {:.1f} ms, "
          "step() {:.1f} ms, {} of {} sub-groups stepped during the backward)\n",
          r + 1, 1e3 * x.exposed_s, 1e3 * x.settle_s, 1e3 * x.backward_s, 1e3 * x.step_s,
          x.overlapped, b.opt.subgroup_count());
  }
  std::vector<double> exposed;
  for (const auto& x : steps) exposed.push_back(x.exposed_s);
  const double e = median(exposed);
  const double speed = o.trainer_seconds / (o.trainer_seconds + e);
  if (!o.json) {
    fmt::print(
        "median exposed step {:.1f} ms: the trainer runs at {:.3f}x its speed without a step "
        "(a forward and backward of {} s)\n",
        1e3 * e, speed, o.trainer_seconds);
    return;
  }
  nlohmann::json js = nlohmann::json::array();
  for (const auto& x : steps) js.push_back(x.to_json());
  const nlohmann::json j{{"params", b.params},
                         {"optimizer", o.optimizer},
                         {"sub_group", b.opt.config().subgroup_size},
                         {"subgroups", b.opt.subgroup_count()},
                         {"trainer_seconds", o.trainer_seconds},
                         {"host_budget", o.host_budget},
                         {"state", o.state},
                         {"steps", js},
                         {"exposed_s", e},
                         {"speed_fraction", speed}};
  fmt::print("{}\n", j.dump(2));
}

}  // namespace tierswap::cli
