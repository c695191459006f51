// `tierswap plan`: the placement the cost model chooses for a model on a hardware profile.
// `tierswap probe`: this machine as a hardware profile (JSON).
#include <fmt/format.h>

#include <fstream>
#include <memory>

#include "tierswap/placement.hpp"
#include "tierswap/units.hpp"
#include "tools/commands.hpp"

namespace tierswap::cli {
namespace {

struct PlanArgs {
  std::string params;
  std::string profile;
  int gpus = 0;
  std::string sub_group;
  std::string optimizer = "adamw";
  double backward_s = -1;
  std::uint64_t tokens = 16384;
  std::string gpu_reserve;
  bool no_overlap = false;
  bool persist = false;
  bool ascending = false;
  bool json = false;
  std::string out;
};

std::string where(const PlanSubgroup& s) {
  const char* state = s.state_tier == Tier::device ? "gpu"
                      : s.state_tier == Tier::host ? "host"
                                                   : "nvme";
  return fmt::format("state {:4} step {} cast {} grad {}", state,
                     s.step_device == StepDevice::gpu ? "gpu" : "cpu",
                     s.cast_on == StepDevice::gpu ? "gpu" : "cpu",
                     s.grad_tier == Tier::device ? "gpu"
                     : s.grad_tier == Tier::host ? "host"
                                                 : "nvme");
}

PlanOptions plan_options(const PlanArgs& a) {
  PlanOptions o;
  o.params = parse_param_count(a.params, "--params");
  o.gpus = a.gpus;
  if (!a.sub_group.empty()) o.subgroup_size = parse_param_count(a.sub_group, "--sub-group");
  o.optimizer = parse_optimizer_kind(a.optimizer);
  o.backward_s = a.backward_s;
  o.tokens_per_gpu = a.tokens;
  o.overlap = !a.no_overlap;
  o.persist_resident_state = a.persist;
  o.alternate_step_order = !a.ascending;
  if (!a.gpu_reserve.empty()) o.gpu_reserve_bytes = parse_size(a.gpu_reserve, "--gpu-reserve");
  return o;
}

// The header and the bytes per tier.
void print_plan_tiers(const PlanArgs& a, const HardwareProfile& hw, const Plan& p) {
  const int dv = static_cast<int>(Tier::device), hs = static_cast<int>(Tier::host),
            nv = static_cast<int>(Tier::nvme);
  if (p.gpus == 0)
    fmt::print("plan for {} parameters ({}) on '{}' ({}): no GPU, one process, CPU step\n",
               p.params, a.optimizer, hw.name, hw.description);
  else
    fmt::print("plan for {} parameters ({}) on '{}' ({}), {} GPU rank(s), {} per rank\n", p.params,
               a.optimizer, hw.name, hw.description, p.gpus, (p.params + p.gpus - 1) / p.gpus);
  fmt::print("per rank: {} sub-groups of {} parameters\n", p.subgroups.size(), p.subgroup_numel);
  fmt::print("  {:5} {:>12} {:>12}\n", "tier", "bytes", "budget");
  for (auto [name, t] : {std::pair{"gpu", dv}, {"host", hs}, {"nvme", nv}})
    fmt::print("  {:5} {:>12} {:>12}\n", name, format_bytes(p.bytes[t]), format_bytes(p.budget[t]));
}

// Runs of sub-groups with identical decisions, a line each.
void print_plan_subgroups(const Plan& p) {
  fmt::print("sub-groups (id 0 = the model's first parameters, final last in the backward):\n");
  for (std::size_t i = 0; i < p.subgroups.size();) {
    std::size_t j = i;
    std::uint64_t n = 0;
    while (j < p.subgroups.size() && where(p.subgroups[j]) == where(p.subgroups[i]))
      n += p.subgroups[j++].numel;
    fmt::print("  {:>5}..{:<5} {:>14} params: {}\n", i, j - 1, n, where(p.subgroups[i]));
    i = j;
  }
}

// Bytes per step, the resident state's fate and the predicted times.
void print_plan_step(const PlanArgs& a, const Plan& p) {
  fmt::print(
      "bytes per step per rank: link h2d {}, d2h {}; NVMe read {}, write {}; host memory {}\n",
      format_bytes(p.links.h2d), format_bytes(p.links.d2h), format_bytes(p.links.nvme_read),
      format_bytes(p.links.nvme_write), format_bytes(p.links.host_memory));
  std::size_t spec = 0;
  for (const auto& s : p.subgroups) spec += s.speculative;
  fmt::print(
      "resident state: {}; {} of {} sub-groups step during the backward{}\n",
      a.persist ? "persisted (written to NVMe every step)" : "memory-only (never written to NVMe)",
      spec, p.subgroups.size(),
      !a.persist && p.overlap && spec < p.subgroups.size()
          ? " (the other resident ones have no room for an undo copy and step after the "
            "verdict)"
          : "");
  fmt::print(
      "predicted step {:.3f} s alone; backward {:.3f} s; step time left after the backward "
      "{:.3f} s{}\n",
      p.predicted_step_s, p.backward_s, p.exposed_step_s,
      p.overlap ? " (overlapped)" : " (no overlap)");
}

void run_plan(const PlanArgs& a) {
  const HardwareProfile hw = HardwareProfile::load(a.profile);
  const Plan p = make_plan(hw, plan_options(a));
  const std::string text = p.to_json();
  if (!a.out.empty()) {
    std::ofstream f(a.out);
    if (!(f << text << '\n'))
      throw std::runtime_error(fmt::format("--out {}: cannot write the plan", a.out));
  }
  if (a.json) {
    fmt::print("{}\n", text);
    return;
  }
  print_plan_tiers(a, hw, p);
  print_plan_subgroups(p);
  print_plan_step(a, p);
}

}  // namespace

void add_plan(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  auto* c = app.add_subcommand(
      "plan", "Where each sub-group's optimizer state lives and steps, from a cost model");
  c->add_option("--params", a->params, kParamsHelp)->required();
  c->add_option("--profile", a->profile,
                "Hardware profile: gh200, h100-pcie-8x, pcie4-workstation, or a JSON file "
                "(tierswap probe writes one)")
      ->required();
  c->add_option("--gpus", a->gpus, "GPU ranks on the node (default: all of the profile's)");
  c->add_option("--sub-group", a->sub_group,
                "Parameters per sub-group (decimal suffixes, as --params; default 8388608)");
  c->add_option("--optimizer", a->optimizer, "adamw | adam | lion | sgd");
  c->add_option("--backward-s", a->backward_s,
                "Length of the backward in seconds (default: estimated from the GPU's bf16 "
                "throughput and --tokens)");
  c->add_option("--tokens", a->tokens, "Tokens per GPU per step (backward estimate)");
  c->add_option("--gpu-reserve", a->gpu_reserve,
                "GPU memory kept for weights and activations (default: 2 B/param + 20%)");
  c->add_flag("--no-overlap", a->no_overlap, "Plan for the ordinary (not overlapped) step");
  c->add_flag("--persist-resident-state", a->persist,
              "Plan for persist_resident_state=true (resident state also written to NVMe every "
              "step); default: memory-only resident state");
  c->add_flag("--ascending", a->ascending,
              "Plan for alternate_step_order=false (every step in ascending order); default: "
              "without overlap, a step reads no streamed state the host still holds from the "
              "step before");
  c->add_option("--out", a->out, "Also write the plan (JSON) to this file")->check(kOutputFile);
  c->add_flag("--json", a->json, "Print JSON on stdout instead of text");
  c->callback([a] { run_plan(*a); });
}

void add_probe(CLI::App& app) {
  struct Args {
    std::string dir, out, io = "256MiB";
    bool topology_only = false;
    unsigned threads = 0;
  };
  auto a = std::make_shared<Args>();
  auto* c = app.add_subcommand("probe", "Measure this machine and print it as a hardware profile");
  c->add_option("--nvme-dir", a->dir, "Measure NVMe I/O in this directory (default: skip)")
      ->check(CLI::ExistingDirectory);
  c->add_option("--io-bytes", a->io, "Bytes written and read for the NVMe figures");
  c->add_option("--threads", a->threads, "CPU kernel threads (default: all cores)");
  c->add_flag("--topology-only", a->topology_only, "No measurements (bandwidths left 0)");
  c->add_option("--out", a->out, "Write the profile here instead of stdout")->check(kOutputFile);
  c->callback([a] {
    ProbeOptions o;
    o.nvme_dir = a->dir;
    o.io_bytes = parse_size(a->io, "--io-bytes");
    o.threads = a->threads;
    o.measure = !a->topology_only;
    const std::string text = probe_hardware(o).to_json();
    if (a->out.empty()) {
      fmt::print("{}\n", text);
    } else {
      std::ofstream f(a->out);
      if (!(f << text << '\n'))
        throw std::runtime_error(fmt::format("--out {}: cannot write the profile", a->out));
    }
  });
}

}  // namespace tierswap::cli
