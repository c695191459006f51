// Whole-parameter state in and out of the sharded layout: shard() reads this rank's part of a
// parameter's master weights or a moment, gather() all-gathers the whole of it on every rank,
// import_state() writes whole tensors back (each rank its part) and commits. This is how a
// torch.optim state dict leaves and enters the tiers (src/python/) and how a trainer reads a whole
// fp32 parameter at any world size.
#include <fmt/format.h>

#include <cstring>
#include <set>
#include <stdexcept>

#include "src/optim/optimizer_impl.hpp"
#include "tierswap/error.hpp"

namespace tierswap {
namespace {

const OptParam& trainable(const std::vector<OptParam>& params, const char* what, ParamId id) {
  if (id >= params.size())
    throw std::invalid_argument(fmt::format("{}: no parameter {}", what, id));
  const OptParam& p = params[id];
  if (!p.spec.requires_grad)
    throw std::invalid_argument(fmt::format(
        "{}: parameter '{}' is frozen: tierswap keeps no state for it", what, p.spec.name));
  return p;
}

int checked_slot(const std::vector<OptGroup>& groups, const char* what, const OptParam& p,
                 BlockClass cls) {
  const OptGroup& g = groups[p.group];
  const int slot = g.slot_for(cls);
  if (slot < 0)
    throw std::invalid_argument(fmt::format("{}: parameter '{}': group '{}' ({}) keeps no {} state",
                                            what, p.spec.name, g.name, to_string(g.cfg.kind),
                                            to_string(cls)));
  return slot;
}

}  // namespace

std::vector<std::pair<std::uint64_t, std::vector<float>>> ShardedOptimizer::shard(ParamId id,
                                                                                  BlockClass cls) {
  impl_->settle_commit();
  Impl& m = *impl_;
  m.require_state("shard");
  if (id >= m.params.size()) throw std::invalid_argument(fmt::format("shard: no parameter {}", id));
  const OptParam& p = m.params[id];
  std::vector<std::pair<std::uint64_t, std::vector<float>>> out;
  if (!p.spec.requires_grad) return out;
  const int slot = checked_slot(m.groups, "shard", p, cls);
  const Dtype dt = m.slot_dtype(slot);
  for (const OptSub& s : m.subs_holding(p)) {
    const auto [b, e] = slice(p, s);
    if (b >= e) continue;
    BlockView v = m.tiers.acquire(s.state[slot], Tier::host);
    std::vector<float> vals(e - b);
    cast(v.data() + (b - s.begin) * dtype_size(dt), dt, vals.data(), Dtype::f32, e - b);
    if (!out.empty() && out.back().first + out.back().second.size() == b - p.offset)
      out.back().second.insert(out.back().second.end(), vals.begin(), vals.end());
    else
      out.emplace_back(b - p.offset, std::move(vals));
  }
  return out;
}

std::vector<float> ShardedOptimizer::gather(ParamId id, BlockClass cls) {
  impl_->settle_commit();
  Impl& m = *impl_;
  m.require_state("gather");
  if (m.spec_pending())  // (every rank's: the same calls in the same order)
    throw std::logic_error(
        "gather: speculative steps of an overlapped backward wait for step(); read the state "
        "after it");
  const OptParam& p = trainable(m.params, "gather", id);
  checked_slot(m.groups, "gather", p, cls);
  std::vector<float> out(p.numel, 0.0f);
  const std::exception_ptr failed = thrown_by([&] {
    for (auto& [off, vals] : shard(id, cls)) std::copy(vals.begin(), vals.end(), out.begin() + off);
  });
  agree_on_failure(
      m.comm, failed, {},
      fmt::format("gather '{}': another rank could not read its part (its error says why)",
                  p.spec.name));
  if (m.world == 1) return out;
  const OptGroup& g = m.groups[p.group];
  std::vector<std::size_t> counts(m.world, 0), displs(m.world, 0);
  for (int r = 0; r < m.world; ++r) {
    const auto [rb, re] = m.rank_range(g, r);
    const std::uint64_t b = std::max(p.offset, rb), e = std::min(p.offset + p.numel, re);
    if (b >= e) continue;
    if (e - b >= (std::uint64_t{1} << 31))
      throw std::invalid_argument(
          fmt::format("gather: parameter '{}': a rank's piece of {} elements is over 2^31",
                      p.spec.name, e - b));
    counts[r] = e - b;
    displs[r] = b - p.offset;
  }
  m.comm.all_gather_v(out.data(), counts, displs, Dtype::f32);
  return out;
}

void ShardedOptimizer::Impl::check_import(std::span<const StateTensor> tensors) const {
  std::set<std::pair<ParamId, BlockClass>> seen;
  for (const auto& t : tensors) {
    const OptParam& p = trainable(params, "import_state", t.param);
    checked_slot(groups, "import_state", p, t.cls);
    if (t.values.size() != p.numel)
      throw std::invalid_argument(
          fmt::format("import_state: parameter '{}' {}: {} values for {} "
                      "elements",
                      p.spec.name, to_string(t.cls), t.values.size(), p.numel));
    if (!seen.emplace(t.param, t.cls).second)
      throw std::invalid_argument(fmt::format("import_state: parameter '{}' {} given twice",
                                              p.spec.name, to_string(t.cls)));
  }
}

bool ShardedOptimizer::Impl::write_imported(std::span<const StateTensor> tensors) {
  bool master = false;
  for (const auto& t : tensors) {
    const OptParam& p = params[t.param];
    const int slot = checked_slot(groups, "import_state", p, t.cls);
    const Dtype dt = slot_dtype(slot);
    master |= slot == kMaster;
    for (const OptSub& s : subs_holding(p)) {
      const auto [b, e] = slice(p, s);
      if (b >= e) continue;
      const Access access =
          b == s.begin && e == s.begin + s.numel ? Access::overwrite : Access::write;
      BlockView v = tiers.acquire(s.state[slot], Tier::host, access);
      try {
        cast(t.values.data() + (b - p.offset), Dtype::f32,
             v.data() + (b - s.begin) * dtype_size(dt), dt, e - b);
      } catch (...) {
        tiers.release(v, false);
        throw;
      }
      tiers.release(v, true);
      if (s.streaming) tiers.write_back(s.state[slot]);
      promote_memory_only_gpu(s, s.state[slot]);
    }
  }
  return master;
}

void ShardedOptimizer::import_state(std::span<const StateTensor> tensors,
                                    std::optional<std::uint64_t> step,
                                    std::span<const std::uint64_t> group_steps) {
  impl_->settle_commit();
  Impl& m = *impl_;
  m.require_finalized("import_state");
  if (m.in_backward || m.spec_pending())
    throw std::logic_error(
        "import_state: between steps only (not during a backward, nor with speculative results "
        "waiting for step())");
  if (!group_steps.empty() && (!step || group_steps.size() != m.groups.size()))
    throw std::invalid_argument(
        fmt::format("import_state: {} group step counts for {} groups{}", group_steps.size(),
                    m.groups.size(), step ? "" : ", without the step count they count back from"));
  for (std::size_t gi = 0; gi < group_steps.size(); ++gi)
    if (group_steps[gi] > *step)
      throw std::invalid_argument(fmt::format("import_state: group {} at step {}, after step {}",
                                              gi, group_steps[gi], *step));
  bool master = false, writing = false;
  const std::exception_ptr failed = thrown_by([&] {
    m.check_import(tensors);
    writing = true;
    master = m.write_imported(tensors);
  });
  agree_on_failure(
      m.comm, failed,
      [&] {
        if (writing && m.tiers.config().shadow_slots) m.tiers.discard();
      },
      "import_state: another rank could not check or write its part (its error says why); the "
      "state is unchanged");
  master = m.comm.all_reduce_or(master);
  if (step) m.step_count = *step;
  for (std::size_t gi = 0; step && gi < m.groups.size(); ++gi)
    m.groups[gi].step_base = group_steps.empty() ? 0 : *step - group_steps[gi];
  m.commit_replaced_state("import_state()", master ? Impl::Param16::refresh : Impl::Param16::keep);
}

}  // namespace tierswap
