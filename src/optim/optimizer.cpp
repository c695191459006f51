// ShardedOptimizer's façade: building (groups, parameters, finalize, initialize), hyper-parameters
// and the read-only accessors. The work is in layout.cpp, ingest.cpp, step.cpp, speculation.cpp,
// param16.cpp and checkpoint.cpp / state_io.cpp, over the Impl of optimizer_impl.hpp.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <utility>

#include "src/optim/optimizer_impl.hpp"
#include "tierswap/cuda_runtime.hpp"
#include "tierswap/device.hpp"
#include "tierswap/error.hpp"
#include "tierswap/log.hpp"
#include "tierswap/thread_pool.hpp"
#include "tierswap/units.hpp"

namespace tierswap {

std::uint64_t ParamSpec::numel() const {
  if (shape.empty()) return 1;  // a scalar
  std::uint64_t n = 1;
  for (auto d : shape) {
    if (d <= 0)
      throw std::invalid_argument(fmt::format("parameter '{}': dimension {} must be > 0", name, d));
    n *= static_cast<std::uint64_t>(d);
  }
  return n;
}

// ---- ShardedOptimizer --------------------------------------------------------------------------
ShardedOptimizer::ShardedOptimizer(TierManager& tiers, Communicator& comm, OptimizerConfig cfg,
                                   ThreadPool* pool)
    : impl_(std::make_unique<Impl>(tiers, comm, std::move(cfg), pool)) {}

// A commit left running lands before the tier manager can go (its failure is logged: the swap
// directory then holds the step before it).
ShardedOptimizer::~ShardedOptimizer() {
  if (impl_) impl_->commits.finish();
}

int ShardedOptimizer::add_group(const GroupConfig& cfg, std::string name) {
  Impl& m = *impl_;
  if (m.finalized) throw std::logic_error("add_group: the optimizer is finalized");
  cfg.validate();
  OptGroup g;
  g.cfg = cfg;
  g.name = name.empty() ? fmt::format("group{}", m.groups.size()) : std::move(name);
  m.groups.push_back(std::move(g));
  return static_cast<int>(m.groups.size() - 1);
}

ParamId ShardedOptimizer::add_param(int group, const ParamSpec& spec) {
  Impl& m = *impl_;
  if (m.finalized) throw std::logic_error("add_param: the optimizer is finalized");
  return m.register_param(group, spec);
}

ParamId ShardedOptimizer::Impl::register_param(int group, const ParamSpec& spec) {
  Impl& m = *this;
  if (group < 0 || group >= static_cast<int>(m.groups.size()))
    throw std::invalid_argument(fmt::format("add_param '{}': no group {}", spec.name, group));
  if (spec.name.empty()) throw std::invalid_argument("add_param: empty parameter name");
  if (spec.dtype == Dtype::f32)
    throw std::invalid_argument(fmt::format(
        "add_param '{}': dtype must be bf16 or f16 (the model's 16-bit copy)", spec.name));
  if (m.param_names.contains(spec.name))
    throw std::invalid_argument(
        fmt::format("add_param '{}': a parameter of that name exists", spec.name));
  OptGroup& g = m.groups[group];
  if (spec.requires_grad) {
    if (g.has_dtype && g.dtype16 != spec.dtype)
      throw std::invalid_argument(fmt::format(
          "add_param '{}': dtype {} but group '{}' holds {} parameters (one dtype per group)",
          spec.name, to_string(spec.dtype), g.name, to_string(g.dtype16)));
    g.dtype16 = spec.dtype;
    g.has_dtype = true;
  }
  OptParam p;
  p.spec = spec;
  p.group = group;
  p.numel = spec.numel();
  m.params.push_back(std::move(p));
  m.param_names.insert(spec.name);
  const auto id = static_cast<ParamId>(m.params.size() - 1);
  g.params.push_back(id);
  return id;
}

// Collective: the ranks agree, so that one whose budget or layout is refused does not leave the
// others waiting in the collective that follows (initialize(), load(), resume()'s).
void ShardedOptimizer::finalize() {
  Impl& m = *impl_;
  if (m.finalized) throw std::logic_error("finalize: already finalized");
  agree_on_failure(
      m.comm, thrown_by([&] { m.finalize_local(); }), [&] { m.finalized = false; },
      "finalize: another rank's finalize failed (its error says why)");
}

void ShardedOptimizer::Impl::finalize_local() {
  if (cfg.overlap && !tiers.config().shadow_slots)
    throw std::invalid_argument(
        "overlap: the overlapped step needs shadow slots to discard a speculative step "
        "(TierConfig::shadow_slots is off)");
  const int node = tiers.config().numa_node;
  if (node >= 0 && (!pool || pool->numa_node() != node))
    log(LogLevel::warn,
        fmt::format("finalize: the host slabs are bound to NUMA node {} but the step's workers are "
                    "not (pass a ThreadPool(threads, {}) to the optimizer)",
                    node, node));
  layout();
  if (adopt_blocks) check_record_layout();
  create_blocks();
  keep_params_records();
  for (auto& g : groups) p16out.register_group(g);
  finalized = true;
}

void ShardedOptimizer::set_plan(const Plan& plan) {
  impl_->settle_commit();
  Impl& m = *impl_;
  if (m.finalized) throw std::logic_error("set_plan: the optimizer is finalized");
  if (plan.subgroups.empty()) throw std::invalid_argument("set_plan: the plan has no sub-groups");
  m.plan = plan;
}

bool ShardedOptimizer::gradient_on_device(std::size_t k) const {
  const Impl& m = *impl_;
  m.require_finalized("gradient_on_device");
  if (k >= m.subs.size())
    throw std::invalid_argument(fmt::format("gradient_on_device: no sub-group {}", k));
  return m.subs[k].grad_gpu;
}

ShardedOptimizer::Placement ShardedOptimizer::placement(std::size_t k) const {
  const Impl& m = *impl_;
  m.require_finalized("placement");
  if (k >= m.subs.size()) throw std::invalid_argument(fmt::format("placement: no sub-group {}", k));
  const OptSub& s = m.subs[k];
  return {s.on_gpu ? Tier::device : s.streaming ? Tier::nvme : Tier::host, s.step_gpu};
}

bool ShardedOptimizer::finalized() const noexcept {
  return impl_->finalized;
}

void ShardedOptimizer::initialize(const ParamInit& init) {
  impl_->settle_commit();
  Impl& m = *impl_;
  m.require_finalized("initialize");
  if (!init) throw std::invalid_argument("initialize: no initializer");
  agree_on_failure(
      m.comm, thrown_by([&] { m.write_initial_state(init); }),
      [&] {
        if (m.tiers.config().shadow_slots) m.tiers.discard();
      },
      "initialize: another rank could not write its initial state (its error says why)");
  m.drop_all_grads();
  m.step_count = 0;
  m.scale = m.cfg.loss_scaler.mode != LossScaling::none ? m.cfg.loss_scaler.init_scale : 1.0;
  m.growth_tracker = 0;
  m.commit_replaced_state("initialize()", Impl::Param16::gather);
}

void ShardedOptimizer::Impl::write_initial_state(const ParamInit& init, std::size_t from) {
  const bool in_place = !tiers.config().shadow_slots;
  for (std::size_t k = from; k < subs.size(); ++k) {
    OptSub& s = subs[k];
    OptGroup& g = groups[s.group];
    {
      BlockView v = tiers.acquire(s.state[kMaster], Tier::host, Access::overwrite);
      auto* out = reinterpret_cast<float*>(v.data());
      for (ParamId id : g.params) {
        const OptParam& p = params[id];
        if (!p.spec.requires_grad) continue;
        const auto [b, e] = slice(p, s);
        if (b < e) init(id, b - p.offset, out + (b - s.begin), e - b);
      }
      cast(out, Dtype::f32, g.p16.data() + s.begin, g.dtype16, s.numel, ctx());
      v.mark_dirty();
    }
    if (s.streaming) tiers.write_back(s.state[kMaster]);
    promote_memory_only_gpu(s, s.state[kMaster]);
    for (int slot = kExpAvg; slot < kStateSlots; ++slot) {
      if (s.state[slot] == kNoBlock) continue;
      if (!in_place) {
        tiers.trim(s.state[slot]);  // zeros, without writing them
        continue;
      }
      {
        BlockView v = tiers.acquire(s.state[slot], Tier::host, Access::overwrite);
        std::memset(v.data(), 0, v.bytes());
        v.mark_dirty();
      }
      promote_memory_only_gpu(s, s.state[slot]);
    }
  }
}

int ShardedOptimizer::group_count() const {
  return static_cast<int>(impl_->groups.size());
}

const GroupConfig& ShardedOptimizer::group_config(int group) const {
  if (group < 0 || group >= group_count())
    throw std::invalid_argument(fmt::format("group {}: no such group", group));
  return impl_->groups[group].cfg;
}

void ShardedOptimizer::set_group_config(int group, const GroupConfig& cfg) {
  Impl& m = *impl_;
  if (group < 0 || group >= group_count())
    throw std::invalid_argument(fmt::format("group {}: no such group", group));
  cfg.validate();
  OptGroup& g = m.groups[group];
  if (m.finalized && !same_state_layout(cfg, g.cfg))
    throw std::invalid_argument(fmt::format(
        "group '{}': kind, amsgrad and SGD momentum (on/off) are fixed at finalize()", g.name));
  g.cfg = cfg;
}

void ShardedOptimizer::set_lr(int group, double lr) {
  GroupConfig c = group_config(group);
  c.lr = lr;
  set_group_config(group, c);
}

double ShardedOptimizer::loss_scale() const {
  return impl_->scale;
}

std::uint64_t ShardedOptimizer::step_count() const {
  return impl_->step_count;
}

const ParamSpec& ShardedOptimizer::param(ParamId id) const {
  if (id >= impl_->params.size()) throw std::invalid_argument(fmt::format("no parameter {}", id));
  return impl_->params[id].spec;
}

std::size_t ShardedOptimizer::param_count() const {
  return impl_->params.size();
}

std::size_t ShardedOptimizer::subgroup_count() const {
  return impl_->subs.size();
}

SubgroupInfo ShardedOptimizer::subgroup(std::size_t k) const {
  if (k >= impl_->subs.size()) throw std::invalid_argument(fmt::format("no sub-group {}", k));
  const OptSub& s = impl_->subs[k];
  return {s.group, s.index, s.begin, s.numel};
}

std::pair<std::uint64_t, std::uint64_t> ShardedOptimizer::partition(int group, int rank) const {
  const Impl& m = *impl_;
  m.require_finalized("partition");
  if (group < 0 || group >= group_count() || rank < 0 || rank >= m.world)
    throw std::invalid_argument(fmt::format("partition({}, {}): out of range", group, rank));
  return m.rank_range(m.groups[group], rank);
}

void ShardedOptimizer::Impl::commit_replaced_state(const std::string& what, Param16 p16,
                                                   const std::function<void()>& more) {
  const std::exception_ptr failed = thrown_by([&] {
    commit();
    if (more) more();
    if (p16 == Param16::refresh)
      for (const auto& s : subs) refresh_sub16(s);
  });
  agree_on_failure(
      comm, failed,
      [&] {
        unusable = fmt::format(
            "{} failed on a rank after the new state was written{}{}: the ranks' states may "
            "differ, and until initialize() or load() succeeds on every rank the optimizer "
            "refuses to step or save",
            what, failed ? " (here: " : "", failed ? what_of(failed) + ")" : "");
      },
      fmt::format("{}: another rank failed committing its new state (its error says why)", what));
  unusable.clear();
  if (p16 == Param16::keep) return;
  gather_param16();
  p16out.refill();
}

std::uint64_t ShardedOptimizer::state_bytes() const {
  return impl_->state_bytes();
}

std::uint64_t ShardedOptimizer::Impl::state_bytes() const {
  std::uint64_t n = 0;
  for (const auto& s : subs)
    for (int slot = 0; slot < kStateSlots; ++slot)
      if (s.state[slot] != kNoBlock) n += s.numel * dtype_size(slot_dtype(slot));
  return n;
}

const OptimizerConfig& ShardedOptimizer::config() const noexcept {
  return impl_->cfg;
}

}  // namespace tierswap
