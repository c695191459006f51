// Records of the optimizer's state: the layout as JSON (checkpoint manifests and the commit record
// of every generation share it) and the checks of a stored layout against this optimizer's.
#include <fmt/format.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "src/optim/optimizer_impl.hpp"
#include "tierswap/detail/json.hpp"

namespace tierswap {
namespace {

constexpr std::uint32_t kRecordVersion = 1;

nlohmann::json group_json(const GroupConfig& c) {
  return {{"kind", std::string(to_string(c.kind))},
          {"lr", c.lr},
          {"beta1", c.beta1},
          {"beta2", c.beta2},
          {"eps", c.eps},
          {"weight_decay", c.weight_decay},
          {"amsgrad", c.amsgrad},
          {"maximize", c.maximize},
          {"momentum", c.momentum},
          {"dampening", c.dampening},
          {"nesterov", c.nesterov}};
}

GroupConfig group_from_json(const nlohmann::json& j) {
  GroupConfig c;
  c.kind = parse_optimizer_kind(j.at("kind").get<std::string>());
  c.lr = j.at("lr").get<double>();
  c.beta1 = j.at("beta1").get<double>();
  c.beta2 = j.at("beta2").get<double>();
  c.eps = j.at("eps").get<double>();
  c.weight_decay = j.at("weight_decay").get<double>();
  c.amsgrad = j.at("amsgrad").get<bool>();
  c.maximize = j.at("maximize").get<bool>();
  c.momentum = j.at("momentum").get<double>();
  c.dampening = j.at("dampening").get<double>();
  c.nesterov = j.at("nesterov").get<bool>();
  c.validate();  // stored values are untrusted input
  return c;
}

nlohmann::json param_json(const ParamSpec& s) {
  return {{"name", s.name},
          {"shape", s.shape},
          {"dtype", std::string(to_string(s.dtype))},
          {"requires_grad", s.requires_grad}};
}

}  // namespace

std::string slot_name(int slot) {
  return std::string(to_string(state_class(slot)));
}

namespace {

nlohmann::json params_json(const std::vector<OptParam>& params, const OptGroup& g) {
  nlohmann::json ps = nlohmann::json::array();
  for (ParamId pid : g.params) ps.push_back(param_json(params[pid].spec));
  return ps;
}

// A group's entry in groups_json() but its parameters.
nlohmann::json group_entry(const OptGroup& g) {
  nlohmann::json slots = nlohmann::json::array();
  for (int slot = 0; slot < kStateSlots; ++slot)
    if (g.has_slot(slot)) slots.push_back(slot_name(slot));
  return {{"name", g.name}, {"config", group_json(g.cfg)}, {"numel", g.numel},
          {"part", g.part}, {"step_base", g.step_base},    {"slots", std::move(slots)}};
}

}  // namespace

void ShardedOptimizer::Impl::keep_params_records() {
  for (auto& g : groups) g.params_record = params_json(params, g).dump();
}

nlohmann::json ShardedOptimizer::Impl::groups_json() const {
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& g : this->groups) {
    nlohmann::json e = group_entry(g);
    e["params"] = params_json(params, g);
    groups.push_back(std::move(e));
  }
  return groups;
}

std::string ShardedOptimizer::Impl::groups_record() const {
  std::string text = "[";
  for (const auto& g : this->groups) {
    if (text.size() > 1) text += ',';
    text += group_entry(g).dump();
    text.pop_back();  // the entry's closing brace: its parameters go in before it
    text += R"(,"params":)";
    text += finalized ? g.params_record : params_json(params, g).dump();
    text += '}';
  }
  text += ']';
  return text;
}

std::vector<GroupConfig> ShardedOptimizer::Impl::check_groups(
    const nlohmann::json& stored, const Bad& bad, std::vector<std::uint64_t>* part,
    std::vector<std::uint64_t>* step_base) const {
  if (!stored.is_array()) throw bad("malformed: \"groups\" is not a list");
  if (stored.size() != groups.size())
    throw bad(
        fmt::format("{} parameter groups, this optimizer has {}", stored.size(), groups.size()));
  std::vector<GroupConfig> cfgs;
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    const OptGroup& g = groups[gi];
    const auto& jg = stored[gi];
    GroupConfig c = group_from_json(jg.at("config"));
    if (!same_state_layout(c, g.cfg))
      throw bad(fmt::format("group {} is {}{}, this optimizer's is {}{}", gi, to_string(c.kind),
                            c.amsgrad ? " (amsgrad)" : "", to_string(g.cfg.kind),
                            g.cfg.amsgrad ? " (amsgrad)" : ""));
    cfgs.push_back(c);
    const auto& ps = jg.at("params");
    if (ps.size() != g.params.size())
      throw bad(fmt::format("group {} has {} parameters, this optimizer's has {}", gi, ps.size(),
                            g.params.size()));
    for (std::size_t i = 0; i < ps.size(); ++i) {
      const ParamSpec& s = params[g.params[i]].spec;
      if (ps[i] != param_json(s))
        throw bad(fmt::format("group {} parameter {} is {}, this optimizer's is {}", gi, i,
                              ps[i].dump(), param_json(s).dump()));
    }
    if (detail::json_int<std::uint64_t>(jg.at("numel")) != g.numel)
      throw bad(fmt::format("group {}: {} elements, expected {}", gi,
                            detail::json_int<std::uint64_t>(jg.at("numel")), g.numel));
    const auto p = detail::json_int<std::uint64_t>(jg.at("part"));
    if (p == 0 && g.numel > 0) throw bad(fmt::format("group {}: partition size 0", gi));
    part->push_back(p);
    // Records written before groups could be added between steps have none: every group 0.
    if (step_base)
      step_base->push_back(
          jg.contains("step_base") ? detail::json_int<std::uint64_t>(jg.at("step_base")) : 0);
  }
  return cfgs;
}

void ShardedOptimizer::Impl::set_step_bases(const std::vector<std::uint64_t>& bases,
                                            std::uint64_t step, const Bad& bad) {
  for (std::size_t gi = 0; gi < bases.size(); ++gi)
    if (bases[gi] > step)
      throw bad(fmt::format("group {} was added at step {}, after step {}", gi, bases[gi], step));
  for (std::size_t gi = 0; gi < bases.size(); ++gi) groups[gi].step_base = bases[gi];
}

std::string ShardedOptimizer::Impl::commit_record() const {
  nlohmann::json j = {{"format", "tierswap-optimizer-record"},
                      {"version", kRecordVersion},
                      {"tierswap", TIERSWAP_VERSION_STRING},
                      {"world_size", world},
                      {"rank", rank},
                      {"subgroup_size", sub_size},
                      {"moment_dtype", std::string(to_string(moment_dtype()))},
                      {"accumulate_fp32", cfg.accumulate_fp32},
                      {"step", step_count},
                      {"loss_scale", scale},
                      {"growth_tracker", growth_tracker}};
  j["memory_only_state"] = std::ranges::any_of(subs, &OptSub::memory_only);
  std::string text = j.dump();
  text.pop_back();  // the closing brace: the groups go in before it
  text.append(R"(,"groups":)").append(groups_record());
  text += '}';
  return text;
}

std::uint64_t ShardedOptimizer::Impl::commit() {
  tiers.set_commit_record(commit_record());
  memory_only_on_record = false;  // until this commit lands (a failed one may have half-written)
  const std::uint64_t g = tiers.commit();
  memory_only_on_record = std::ranges::any_of(subs, &OptSub::memory_only);
  return g;
}

bool ShardedOptimizer::Impl::commit_adds_nothing() const {
  if (world != 1 || cfg.overlap || !memory_only_on_record || !unusable.empty() || subs.empty())
    return false;
  return std::ranges::all_of(subs, &OptSub::memory_only);
}

}  // namespace tierswap
