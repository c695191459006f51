// Placement: the shipped hardware profiles, the cost model's plans on them (GH200 keeps the tail
// on the GPU and the rest on the Grace CPU without NVMe; the PCIe workstation with a model 10x its
// host memory streams from NVMe and never steps host-resident state on the GPU over PCIe; every
// plan within its budgets; predicted times monotone in model size), plan files, bad input, and
// the probe of this machine.
#include <unistd.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.hpp"
#include "tierswap/device.hpp"
#include "tierswap/placement.hpp"

using namespace tierswap;

namespace {

constexpr int kGpu = static_cast<int>(Tier::device), kHost = static_cast<int>(Tier::host),
              kNvme = static_cast<int>(Tier::nvme);

Plan plan_for(std::string_view profile, std::uint64_t params, int gpus = 0, double backward = -1) {
  PlanOptions o;
  o.params = params;
  o.gpus = gpus;
  o.backward_s = backward;
  return make_plan(HardwareProfile::load(profile), o);
}

void expect_within_budgets(const Plan& p) {
  for (int t = 0; t < kTierCount; ++t)
    EXPECT_LE(p.bytes[t], p.budget[t]) << p.profile << " " << p.params << " tier " << t;
  std::uint64_t total = 0, by_tier[kTierCount] = {};
  for (const auto& s : p.subgroups) {
    total += s.numel;
    by_tier[static_cast<int>(s.state_tier)] += s.numel;
    // Consistency of each decision.
    if (s.state_tier == Tier::device) EXPECT_EQ(s.step_device, StepDevice::gpu);
    if (s.state_tier == Tier::nvme) EXPECT_EQ(s.step_device, StepDevice::cpu);
    if (s.step_device == StepDevice::cpu) EXPECT_NE(s.grad_tier, Tier::device);
    EXPECT_LE(s.ready_s, s.done_s + 1e-12);
  }
  const std::uint64_t ranks = std::max(1, p.gpus);  // 0: a CPU-only plan, one process
  EXPECT_EQ(total, (p.params + ranks - 1) / ranks);
  // The state bytes of the plan's tiers account for each sub-group's state (12 B/param, AdamW).
  EXPECT_GE(p.bytes[kGpu], 12 * by_tier[kGpu]);
  EXPECT_GE(p.bytes[kNvme], 2 * 12 * by_tier[kNvme]);  // two shadow slots
  EXPECT_GE(p.bytes[kHost], 12 * by_tier[kHost]);
}

// The workstation's profile without its GPU (what `tierswap probe` reports on a CPU-only host).
HardwareProfile cpu_only_profile() {
  auto j = nlohmann::json::parse(HardwareProfile::load("pcie4-workstation").to_json());
  j["name"] = "cpu-only";
  j["gpus"] = nlohmann::json::array();
  return HardwareProfile::from_json(j.dump(), "cpu-only");
}

}  // namespace

TEST(Placement, ShippedProfilesParseAndDescribeTheirMachines) {
  const auto names = builtin_profiles();
  ASSERT_EQ(names, (std::vector<std::string>{"gh200", "h100-pcie-8x", "pcie4-workstation"}));
  const HardwareProfile gh = HardwareProfile::load("gh200");
  ASSERT_EQ(gh.gpus.size(), 1u);
  EXPECT_EQ(gh.gpus[0].link, HostLink::nvlink_c2c);
  EXPECT_EQ(gh.gpus[0].memory_bytes, 96'000'000'000u);
  EXPECT_EQ(gh.host_memory_bytes, 480'000'000'000u);
  EXPECT_GT(gh.gpus[0].host_read_gbps, 0);
  const HardwareProfile srv = HardwareProfile::load("h100-pcie-8x");
  EXPECT_EQ(srv.gpus.size(), 8u);
  EXPECT_GE(srv.nvme.size(), 2u);
  EXPECT_EQ(srv.numa.size(), 2u);
  for (const auto& g : srv.gpus) {
    EXPECT_EQ(g.link, HostLink::pcie);
    EXPECT_EQ(g.pcie_gen, 5);
    EXPECT_EQ(g.host_read_gbps, 0);
  }
  const HardwareProfile ws = HardwareProfile::load("pcie4-workstation");
  EXPECT_EQ(ws.gpus.size(), 1u);
  EXPECT_EQ(ws.nvme.size(), 1u);
  EXPECT_EQ(ws.gpus[0].pcie_gen, 4);
  // Round trip through to_json (comments dropped, values kept).
  for (const auto& n : names) {
    const HardwareProfile a = HardwareProfile::load(n);
    const HardwareProfile b = HardwareProfile::from_json(a.to_json());
    EXPECT_EQ(a.to_json(), b.to_json()) << n;
  }
}

TEST(Placement, Gh200KeepsTheTailOnTheGpuAndTheRestOnGraceWithoutNvme) {
  // With the backward estimated for 16K tokens per GPU, and a 2 s one. (With little or no backward
  // to hide behind, the model moves most of the step to the GPU over NVLink-C2C instead: it moves
  // 24 B/param through LPDDR5X where the CPU step moves 28; checked below.)
  // (Plans are for memory-only resident state, PlanOptions' default. With a short backward, 0.5
  // s, most of that state cannot get an undo copy, steps after the verdict wherever it lives, and
  // the model steps it over the link rather than keep a GPU tail: only budgets and the absence of
  // NVMe are checked there.)
  for (const double backward : {-1.0, 2.0, 0.5, 0.0}) {
    SCOPED_TRACE(backward);
    const bool hides = backward < 0 || backward >= 2.0;
    const Plan p = plan_for("gh200", parse_param_count("20B"), 0, backward);
    expect_within_budgets(p);
    EXPECT_EQ(p.bytes[kNvme], 0u);
    EXPECT_EQ(p.links.nvme_read + p.links.nvme_write, 0u);
    if (backward == 0.5) continue;
    // The tail of the backward (the lowest ids, final last): state and step on the GPU.
    ASSERT_FALSE(p.subgroups.empty());
    EXPECT_EQ(p.subgroups.front().state_tier, Tier::device);
    EXPECT_EQ(p.subgroups.front().step_device, StepDevice::gpu);
    std::size_t gpu = 0, cpu = 0;
    for (const auto& s : p.subgroups) {
      EXPECT_NE(s.state_tier, Tier::nvme);
      if (s.state_tier == Tier::device) {
        ++gpu;
        EXPECT_EQ(cpu, 0u) << "GPU-resident sub-groups form the tail";
      }
      if (s.step_device == StepDevice::cpu) ++cpu;
    }
    EXPECT_GT(gpu, 0u);
    EXPECT_EQ(p.subgroups.back().state_tier, Tier::host);
    if (!hides) continue;
    // The head (final first during the backward) runs on the Grace CPU, hidden by the backward.
    EXPECT_EQ(p.subgroups.back().step_device, StepDevice::cpu);
    EXPECT_GT(cpu, p.subgroups.size() / 2);
    EXPECT_LT(p.exposed_step_s, p.predicted_step_s);
  }
  // Without a backward to hide behind, more of the step moves to the GPU than with one.
  auto on_gpu = [](const Plan& p) {
    std::size_t n = 0;
    for (const auto& s : p.subgroups) n += s.step_device == StepDevice::gpu;
    return n;
  };
  EXPECT_GE(on_gpu(plan_for("gh200", 20'000'000'000, 0, 0.0)),
            on_gpu(plan_for("gh200", 20'000'000'000, 0, 10.0)));
}

// The two modes of resident state the optimizer has (OptimizerConfig::persist_resident_state),
// as the model accounts for them on GH200 (20B parameters, a 2 s backward).
TEST(Placement, PlansFollowTheOptimizersResidentStateMode) {
  const HardwareProfile hw = HardwareProfile::load("gh200");
  PlanOptions o;
  o.params = parse_param_count("20B");
  o.backward_s = 2.0;
  // Memory-only: no NVMe; with overlap, the resident sub-groups that step during the backward
  // are those with undo copies, the ones final first (highest ids) of each tier.
  const Plan mem = make_plan(hw, o);
  ASSERT_TRUE(mem.persist_resident_state.has_value());
  EXPECT_FALSE(*mem.persist_resident_state);
  EXPECT_EQ(mem.links.nvme_write, 0u);
  bool seen_late[2] = {};
  std::size_t speculative = 0;
  for (auto it = mem.subgroups.rbegin(); it != mem.subgroups.rend(); ++it) {
    const int t = it->state_tier == Tier::device ? 1 : 0;
    if (it->speculative) {
      ++speculative;
      EXPECT_FALSE(seen_late[t]) << "sub-group " << it->id << " speculates after a later one";
    } else {
      seen_late[t] = true;
    }
  }
  EXPECT_GT(speculative, 0u);
  EXPECT_LT(speculative, mem.subgroups.size()) << "host memory holds undo copies for all";
  // Without overlap nothing speculates.
  PlanOptions plain = o;
  plain.overlap = false;
  for (const auto& s : make_plan(hw, plain).subgroups) EXPECT_FALSE(s.speculative) << s.id;
  // Persisted: every sub-group speculates; resident state is written to NVMe at every step (12
  // B/param for AdamW, GPU state down the link first) and takes two slots there.
  PlanOptions po = o;
  po.persist_resident_state = true;
  const Plan per = make_plan(hw, po);
  expect_within_budgets(per);
  EXPECT_TRUE(*per.persist_resident_state);
  std::uint64_t gpu_state = 0;
  for (const auto& s : per.subgroups) {
    EXPECT_TRUE(s.speculative) << s.id;
    if (s.state_tier == Tier::device) gpu_state += 12 * s.numel;
  }
  EXPECT_EQ(per.links.nvme_write, 12 * o.params);
  EXPECT_EQ(per.bytes[kNvme], 2 * 12 * o.params);
  EXPECT_GE(per.links.d2h, gpu_state);
  // 240 GB written per step is slower than the memory-only step on this machine.
  EXPECT_GT(per.predicted_step_s, mem.predicted_step_s);
  // The mode and the flags read back from the plan file.
  const Plan back = Plan::from_json(per.to_json());
  ASSERT_TRUE(back.persist_resident_state.has_value());
  EXPECT_TRUE(*back.persist_resident_state);
  const Plan back2 = Plan::from_json(mem.to_json());
  for (std::size_t i = 0; i < mem.subgroups.size(); ++i)
    ASSERT_EQ(back2.subgroups[i].speculative, mem.subgroups[i].speculative) << i;
}

TEST(Placement, PcieWorkstationStreamsTenTimesItsMemoryFromNvmeAndNeverStepsOverPcie) {
  const HardwareProfile ws = HardwareProfile::load("pcie4-workstation");
  // A model whose AdamW state (12 B/param) is 10x host memory.
  const std::uint64_t params = 10 * ws.host_memory_bytes / 12;
  const Plan p = plan_for("pcie4-workstation", params);
  expect_within_budgets(p);
  EXPECT_GT(p.bytes[kNvme], 10 * ws.host_memory_bytes);
  std::size_t nvme = 0;
  for (const auto& s : p.subgroups) {
    EXPECT_FALSE(s.state_tier == Tier::host && s.step_device == StepDevice::gpu)
        << "sub-group " << s.id << " steps host memory on the GPU over PCIe";
    nvme += s.state_tier == Tier::nvme;
  }
  EXPECT_GT(nvme, p.subgroups.size() / 2);
  EXPECT_GT(p.links.nvme_read, 0u);
  EXPECT_GT(p.predicted_step_s, 0);
}

// A machine without a GPU (what `tierswap probe` reports here): one process, every sub-group
// stepped by the CPU, nothing over a link; host memory first, NVMe for the rest; --gpus > 1
// refused.
TEST(Placement, ProfilesWithoutAGpuPlanACpuStepOnHostAndNvme) {
  const HardwareProfile hw = cpu_only_profile();
  PlanOptions o;
  o.backward_s = 10;
  std::uint64_t host_only_params = 0;
  for (const std::uint64_t params : {1'000'000'000ull, 100'000'000'000ull}) {
    o.params = params;
    const Plan p = make_plan(hw, o);
    expect_within_budgets(p);
    EXPECT_EQ(p.gpus, 0);
    EXPECT_EQ(p.links.h2d, 0u);
    EXPECT_EQ(p.links.d2h, 0u);
    EXPECT_EQ(p.bytes[kGpu], 0u);
    std::size_t nvme = 0;
    for (const auto& s : p.subgroups) {
      EXPECT_EQ(s.step_device, StepDevice::cpu) << s.id;
      EXPECT_NE(s.state_tier, Tier::device) << s.id;
      nvme += s.state_tier == Tier::nvme;
    }
    if (params == 1'000'000'000ull) {
      EXPECT_EQ(nvme, 0u) << "1B parameters (12 GB of state) fit 128 GiB of host memory";
      host_only_params = params;
    } else {
      EXPECT_GT(nvme, 0u) << "100B parameters (1.2 TB of state) do not";
      EXPECT_GT(p.links.nvme_read, 0u);
    }
    // The plan file says "gpus": 0 and reads back.
    EXPECT_EQ(Plan::from_json(p.to_json()).gpus, 0);
  }
  EXPECT_GT(host_only_params, 0u);
  o.gpus = 2;
  try {
    make_plan(hw, o);
    ADD_FAILURE() << "--gpus 2 accepted on a profile without a GPU";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("no GPU"), std::string::npos) << e.what();
  }
}

// The ordinary step in alternating order (the optimizer's default) begins with the streamed
// sub-groups the step before ended with: the plan reads none of the state that the host memory
// beside its other bytes still holds (whole sub-groups, as many as fit), and predicts a shorter
// step. Ascending order, or the overlapped step (speculation in the backward's order, the same
// every step), reads all of it. The placement itself does not change.
TEST(Placement, WithoutOverlapTheAlternatingStepReadsOnlyTheStreamedStateTheHostDoesNotHold) {
  const HardwareProfile hw = cpu_only_profile();
  PlanOptions o;
  o.params = 100'000'000'001ull;  // a ragged last sub-group (the first one streamed)
  o.overlap = false;
  const Plan alt = make_plan(hw, o);
  o.alternate_step_order = false;
  const Plan asc = make_plan(hw, o);
  ASSERT_EQ(alt.subgroups.size(), asc.subgroups.size());
  EXPECT_TRUE(Plan::from_json(alt.to_json()).alternate_step_order.value_or(false));
  EXPECT_FALSE(Plan::from_json(asc.to_json()).alternate_step_order.value_or(true));
  std::uint64_t streamed = 0;             // state and spilled gradients, read back per step
  std::vector<std::uint64_t> nvme_numel;  // highest id first
  for (std::size_t i = alt.subgroups.size(); i-- > 0;) {
    const auto& s = alt.subgroups[i];
    ASSERT_EQ(s.state_tier, asc.subgroups[i].state_tier) << s.id;
    ASSERT_EQ(s.grad_tier, asc.subgroups[i].grad_tier) << s.id;
    if (s.state_tier != Tier::nvme) continue;
    streamed += (12 + (s.grad_tier == Tier::nvme ? 2 : 0)) * s.numel;
    nvme_numel.push_back(s.numel);
  }
  ASSERT_GT(nvme_numel.size(), 8u);
  EXPECT_EQ(asc.links.nvme_read, streamed) << "ascending: every streamed byte read every step";
  EXPECT_EQ(alt.links.nvme_write, asc.links.nvme_write);
  EXPECT_EQ(alt.bytes[kHost], asc.bytes[kHost]);
  // What the host holds beside the plan's other bytes: its staging (the sub-group stepped, one
  // written behind, prefetch_depth read ahead) and what the plan leaves free.
  const std::uint64_t staging = (o.prefetch_depth + 2) * 12 * alt.subgroup_numel;
  std::uint64_t left = alt.budget[kHost] - (alt.bytes[kHost] - staging), kept = 0;
  std::size_t whole = 0;
  for (; whole < nvme_numel.size() && 12 * nvme_numel[whole] <= left; ++whole) {
    left -= 12 * nvme_numel[whole];
    kept += 12 * nvme_numel[whole];
  }
  EXPECT_GE(whole, o.prefetch_depth + 2);
  EXPECT_EQ(alt.links.nvme_read, streamed - kept);
  EXPECT_LT(alt.predicted_step_s, asc.predicted_step_s);
  // Overlapped: the same bytes in both orders.
  o.overlap = true;
  const Plan ov_asc = make_plan(hw, o);
  o.alternate_step_order = true;
  const Plan ov_alt = make_plan(hw, o);
  EXPECT_EQ(ov_alt.links.nvme_read, ov_asc.links.nvme_read);
  EXPECT_DOUBLE_EQ(ov_alt.predicted_step_s, ov_asc.predicted_step_s);
}

TEST(Placement, EveryPlanRespectsItsBudgetsAndTimeGrowsWithModelSize) {
  for (const auto& name : builtin_profiles()) {
    const HardwareProfile hw = HardwareProfile::load(name);
    for (const int gpus : {1, static_cast<int>(hw.gpus.size())}) {
      for (const bool persist : {false, true}) {  // both resident-state modes
        double last = 0;
        for (const double billions : {0.1, 1.0, 3.0, 7.0, 13.0, 20.0, 34.0, 70.0, 120.0, 175.0}) {
          SCOPED_TRACE(fmt::format("{} gpus={} persist={} {}B", name, gpus, persist, billions));
          PlanOptions o;
          o.params = static_cast<std::uint64_t>(billions * 1e9);
          o.gpus = gpus;
          o.persist_resident_state = persist;
          Plan p;
          try {
            p = make_plan(hw, o);
          } catch (const std::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find("do not fit"), std::string::npos) << e.what();
            break;  // larger models do not fit either
          }
          expect_within_budgets(p);
          EXPECT_GT(p.predicted_step_s, last);
          last = p.predicted_step_s;
          EXPECT_GE(p.exposed_step_s, 0);
          if (!p.overlap) EXPECT_EQ(p.exposed_step_s, p.predicted_step_s);
        }
      }
    }
  }
}

TEST(Placement, PlanFilesRoundTripAndBadOnesAreRefused) {
  const Plan p = plan_for("gh200", 2'000'000'000);
  const Plan q = Plan::from_json(p.to_json());
  ASSERT_EQ(p.subgroups.size(), q.subgroups.size());
  for (std::size_t i = 0; i < p.subgroups.size(); ++i) {
    EXPECT_EQ(p.subgroups[i].numel, q.subgroups[i].numel);
    EXPECT_EQ(p.subgroups[i].state_tier, q.subgroups[i].state_tier);
    EXPECT_EQ(p.subgroups[i].step_device, q.subgroups[i].step_device);
  }
  // The issue's schema keys.
  const auto j = nlohmann::json::parse(p.to_json());
  for (const char* k : {"profile", "params", "predicted_step_s", "bytes", "subgroups"})
    EXPECT_TRUE(j.contains(k)) << k;
  for (const char* k : {"gpu", "host", "nvme"}) EXPECT_TRUE(j["bytes"].contains(k)) << k;
  for (const char* k : {"id", "numel", "state_tier", "step_device", "cast_on"})
    EXPECT_TRUE(j["subgroups"][0].contains(k)) << k;
  // at_fraction: the first element maps to sub-group 0, the last to the last.
  EXPECT_EQ(q.at_fraction(0.0).id, 0u);
  EXPECT_EQ(q.at_fraction(0.999999).id, q.subgroups.back().id);
  // Edited plans with mistakes.
  const std::string head = R"({"format": "tierswap.plan", "version": 1, "subgroups": [)";
  for (const std::string bad :
       {std::string("{"), std::string(R"({"format": "x", "version": 1, "subgroups": []})"),
        std::string(R"({"format": "tierswap.plan", "version": 2, "subgroups": [{}]})"), head + "]}",
        head + R"({"numel": 0, "state_tier": "host", "step_device": "cpu"}]})",
        head + R"({"numel": 5, "state_tier": "disk", "step_device": "cpu"}]})",
        head + R"({"numel": 5, "state_tier": "nvme", "step_device": "gpu"}]})",
        head + R"({"numel": 5, "state_tier": "gpu", "step_device": "cpu"}]})",
        head + R"({"numel": 5, "state_tier": "host"}]})",
        head + R"({"numel": 5, "state_tier": "host", "step_device": "cpu", "speculative": 1}]})",
        std::string(R"({"format": "tierswap.plan", "version": 1, "persist_resident_state": "yes",
            "subgroups": [{"numel": 5, "state_tier": "host", "step_device": "cpu"}]})"),
        std::string(R"({"format": "tierswap.plan", "version": 1, "alternate_step_order": 1,
            "subgroups": [{"numel": 5, "state_tier": "host", "step_device": "cpu"}]})"),
        // Optional keys of the wrong type are refused by name, not by the JSON library.
        std::string(R"({"format": 7, "version": 1, "subgroups": [{}]})"),
        std::string(R"({"format": "tierswap.plan", "version": 1, "overlap": "yes",
            "subgroups": [{"numel": 5, "state_tier": "host", "step_device": "cpu"}]})"),
        std::string(R"({"format": "tierswap.plan", "version": 1, "profile": 5,
            "subgroups": [{"numel": 5, "state_tier": "host", "step_device": "cpu"}]})"),
        std::string(R"({"format": "tierswap.plan", "version": 1, "predicted_step_s": "x",
            "subgroups": [{"numel": 5, "state_tier": "host", "step_device": "cpu"}]})"),
        std::string(R"({"format": "tierswap.plan", "version": 1, "gpus": 1.5,
            "subgroups": [{"numel": 5, "state_tier": "host", "step_device": "cpu"}]})"),
        head + R"({"numel": 5, "state_tier": "host", "step_device": "cpu", "cast_on": 3}]})",
        head + R"({"numel": 5, "state_tier": "host", "step_device": "cpu", "grad_tier": []}]})"}) {
    try {
      Plan::from_json(bad, "edited.json");
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("edited.json"), std::string::npos) << e.what();
    }
  }
  // A plan file without the mode (written before it was recorded) reads as "unknown".
  const Plan unsaid =
      Plan::from_json(head + R"({"numel": 5, "state_tier": "host", "step_device": "cpu"}]})");
  EXPECT_FALSE(unsaid.persist_resident_state.has_value());
  EXPECT_FALSE(unsaid.alternate_step_order.has_value());
  EXPECT_THROW(Plan::load("/nonexistent/plan.json"), std::invalid_argument);
}

TEST(Placement, BadProfilesAndOptionsGiveClearErrors) {
  const std::string good = HardwareProfile::load("pcie4-workstation").to_json();
  auto with = [&](const std::string& key, const nlohmann::json& v) {
    auto j = nlohmann::json::parse(good);
    j[key] = v;
    return j.dump();
  };
  auto gpu_with = [&](const std::string& key, const nlohmann::json& v) {
    auto j = nlohmann::json::parse(good);
    j["gpus"][0][key] = v;
    return j.dump();
  };
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"not json", "not valid JSON"},
      {with("colour", "blue"), "colour"},
      {with("cpu_adam_gbps", -3), "cpu_adam_gbps"},
      {with("host_memory_bytes", "lots"), "host_memory_bytes"},
      {gpu_with("link", "usb"), "link"},
      {gpu_with("h2d_gbps", 0), "h2d_gbps"},
      {gpu_with("host_read_gbps", 5), "host_read_gbps"},  // write left at 0
      {gpu_with("speed", 1), "gpus[0].speed"},
  };
  for (const auto& [text, needle] : bad) {
    try {
      HardwareProfile::from_json(text, "mine.json");
      ADD_FAILURE() << "accepted: " << text.substr(0, 80);
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(HardwareProfile::load("no-such-profile"), std::invalid_argument);
  // A profile file; a directory is named as such, with the shipped profiles.
  test::TempDir d;
  try {
    HardwareProfile::load(d.path().string());
    ADD_FAILURE() << "a directory was taken for a profile";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("not a shipped profile (gh200"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("cannot read it (Is a directory)"), std::string::npos)
        << e.what();
  }
  const auto f = d.path() / "p.json";
  std::ofstream(f) << "// a comment\n" << good;
  EXPECT_EQ(HardwareProfile::load(f.string()).name, "pcie4-workstation");
  // Options.
  EXPECT_EQ(parse_param_count("20B"), 20'000'000'000u);
  EXPECT_EQ(parse_param_count("1.5T"), 1'500'000'000'000u);
  EXPECT_EQ(parse_param_count("350M"), 350'000'000u);
  EXPECT_EQ(parse_param_count("12345"), 12345u);
  for (const char* b : {"", "B", "-5B", "20X", "20BB", "abc"})
    EXPECT_THROW(parse_param_count(b), std::invalid_argument) << b;
  EXPECT_THROW(plan_for("gh200", 0), std::invalid_argument);
  EXPECT_THROW(plan_for("gh200", 1'000'000'000, 2), std::invalid_argument);  // one GPU
  try {
    plan_for("pcie4-workstation", parse_param_count("2T"));
    ADD_FAILURE() << "2T parameters fit a workstation";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("do not fit"), std::string::npos) << e.what();
  }
}

TEST(Placement, ProbeDescribesThisMachine) {
  ProbeOptions o;
  o.measure = false;
  const HardwareProfile p = probe_hardware(o);
  EXPECT_GT(p.cpu_cores, 0);
  // At least the kernel's total (hwloc's nodes can add up to less in a VM).
  EXPECT_GE(p.host_memory_bytes, static_cast<std::uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                                     static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)));
  EXPECT_FALSE(p.numa.empty());
  EXPECT_EQ(p.gpus.size(),
            device_info().available ? static_cast<std::size_t>(device_info().device_count) : 0u);
  // Measured, with a small NVMe figure in a scratch directory (removed afterwards).
  test::TempDir d;
  o.measure = true;
  o.nvme_dir = d.path();
  o.io_bytes = 32ull << 20;
  o.kernel_params = 1u << 20;
  o.threads = 1;
  const HardwareProfile m = probe_hardware(o);
  EXPECT_TRUE(m.measured);
  EXPECT_GT(m.host_memory_gbps, 0);
  EXPECT_GT(m.cpu_adam_gbps, 0);
  ASSERT_EQ(m.nvme.size(), 1u);
  EXPECT_GT(m.nvme[0].read_gbps, 0);
  EXPECT_GT(m.nvme[0].write_gbps, 0);
  EXPECT_TRUE(std::filesystem::is_empty(d.path()));
  EXPECT_NE(m.description.find("probed"), std::string::npos) << m.description;
  // The probed profile plans (a CPU-only one too), within its budgets, and reads back.
  PlanOptions po;
  po.params = 100'000'000;
  po.backward_s = 1;
  const Plan pl = make_plan(HardwareProfile::from_json(m.to_json()), po);
  expect_within_budgets(pl);
  EXPECT_EQ(pl.gpus, static_cast<int>(m.gpus.size()));
}
