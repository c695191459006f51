// Parameter groups added between steps (torch's add_param_group, as in progressive unfreezing):
// the new group is laid out, placed and initialized alone, after the others, and committed with
// them; nothing of the other groups changes. Its step count starts at zero (OptGroup::step_base).
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "src/optim/optimizer_impl.hpp"
#include "tierswap/error.hpp"
#include "tierswap/log.hpp"
#include "tierswap/units.hpp"

namespace tierswap {

std::vector<ParamId> ShardedOptimizer::add_group_between_steps(const GroupConfig& cfg,
                                                               std::string name,
                                                               std::span<const ParamSpec> params,
                                                               const ParamInit& init) {
  impl_->settle_commit();
  Impl& m = *impl_;
  constexpr const char* what = "add_group_between_steps";
  m.require_state(what);
  if (m.in_backward || m.spec_pending())
    throw std::logic_error(
        fmt::format("{}: between steps only (not during a backward, nor with "
                    "speculative results waiting for step())",
                    what));
  if (!init) throw std::invalid_argument(fmt::format("{}: no initializer", what));
  const Impl::Added before = m.mark_added();
  std::vector<ParamId> ids;
  bool writing = false;
  const std::exception_ptr failed = thrown_by([&] {
    cfg.validate();
    OptGroup g;
    g.cfg = cfg;
    g.name = name.empty() ? fmt::format("group{}", m.groups.size()) : std::move(name);
    g.step_base = m.step_count;
    m.groups.push_back(std::move(g));
    const int gi = static_cast<int>(m.groups.size() - 1);
    for (const ParamSpec& p : params) ids.push_back(m.register_param(gi, p));
    writing = true;
    m.add_group_local(before, init);
  });
  agree_on_failure(
      m.comm, failed,
      [&] {
        if (writing && m.tiers.config().shadow_slots) m.tiers.discard();
        m.take_back(before);
      },
      fmt::format("{}: another rank could not add the group (its error says why); nothing "
                  "changed",
                  what));
  m.commit_replaced_state("add_group_between_steps()", Impl::Param16::gather);
  return ids;
}

std::uint64_t ShardedOptimizer::group_step_count(int group) const {
  const Impl& m = *impl_;
  if (group < 0 || group >= static_cast<int>(m.groups.size()))
    throw std::invalid_argument(fmt::format("group_step_count: no group {}", group));
  return m.step_count - m.groups[group].step_base;
}

ShardedOptimizer::Impl::Added ShardedOptimizer::Impl::mark_added() const {
  return {groups.size(), params.size(), subs.size(), chunks, depth};
}

void ShardedOptimizer::Impl::take_back(const Added& a) noexcept {
  for (std::size_t i = a.params; i < params.size(); ++i) param_names.erase(params[i].spec.name);
  params.resize(a.params);
  for (std::size_t gi = a.groups; gi < groups.size(); ++gi) p16out.forget_group(groups[gi]);
  groups.erase(groups.begin() + static_cast<std::ptrdiff_t>(a.groups), groups.end());
  subs.erase(subs.begin() + static_cast<std::ptrdiff_t>(a.subs), subs.end());
  books.resize(a.subs);
  spec.per_sub.resize(a.subs);
  chunks = a.chunks;
  depth = a.depth;
}

void ShardedOptimizer::Impl::add_group_local(const Added& a, const ParamInit& init) {
  adding_group = true;
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{adding_group};
  layout_group(groups.back());
  place_added(a.subs);
  const auto [state, all_grads] = state_and_grad_bytes();
  const std::uint64_t grads = pinned_grad_bytes(all_grads);
  TierBytes mem{};
  check_memory_only_budgets(grads, &mem);
  const bool any_streaming =
      std::any_of(subs.begin(), subs.end(), [](const OptSub& s) { return s.streaming; });
  fit_prefetch_depth(grads, largest_state_bytes(), any_streaming);
  check_swap_room(a.subs);
  try {
    create_state_blocks(a.subs);
  } catch (const std::system_error& e) {  // room enough, but not in one piece
    if (e.code().value() != ENOSPC) throw;
    throw no_swap_room(a.subs, e.what());
  }
  keep_params_records();
  p16out.register_group(groups.back());
  write_initial_state(init, a.subs);
}

// The swap bytes of sub-groups [from, end): state (memory-only state has none) and gradients, in
// each generation slot.
std::uint64_t ShardedOptimizer::Impl::swap_bytes_of(std::size_t from) const {
  std::uint64_t n = 0;
  for (std::size_t k = from; k < subs.size(); ++k)
    n += (subs[k].memory_only ? 0 : state_block_bytes(subs[k])) + grad_block_bytes(subs[k]);
  return n * (tiers.config().shadow_slots ? 2 : 1);
}

std::invalid_argument ShardedOptimizer::Impl::no_swap_room(std::size_t from,
                                                           const std::string& why) const {
  return std::invalid_argument(fmt::format(
      "add_group_between_steps: the swap space has no room for the new group's state and "
      "gradients ({}: {}); it was sized for the parameters given at construction: give it room "
      "for the groups added later (swap_capacity; TieredOptions::swap_capacity in C++)",
      format_bytes(swap_bytes_of(from)), why));
}

// Before any block is made: a group that cannot fit leaves no block behind.
void ShardedOptimizer::Impl::check_swap_room(std::size_t from) const {
  const ExtentStats x = tiers.swap_extents();
  if (swap_bytes_of(from) > x.free)
    throw no_swap_room(
        from, fmt::format("{} of {} free", format_bytes(x.free), format_bytes(x.capacity)));
}

// The rule finalize() applies without a plan, over the whole state with the new group's: the
// other groups keep where they are.
void ShardedOptimizer::Impl::place_added(std::size_t from) {
  const auto [state, all_grads] = state_and_grad_bytes();
  const bool streaming = default_streaming(state, pinned_grad_bytes(all_grads));
  if (plan)
    log(LogLevel::info,
        fmt::format("add_group_between_steps: the plan places the groups it was made for; group "
                    "'{}' goes to {} (state_tier)",
                    groups.back().name, streaming ? "NVMe" : "host memory"));
  for (std::size_t k = from; k < subs.size(); ++k) {
    OptSub& s = subs[k];
    s.streaming = streaming;
    s.memory_only = !cfg.persist_resident_state && !s.streaming;
  }
}

}  // namespace tierswap
