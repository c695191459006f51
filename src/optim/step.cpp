// ShardedOptimizer's step: the fused kernels on one sub-group (CPU or GPU), the pipeline over
// sub-groups with the GPU lane beside the CPU's, and step() itself (validation, verdict, commit).
#include <fmt/format.h>

#include <tuple>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "src/optim/optimizer_impl.hpp"
#include "tierswap/cuda_kernels.hpp"
#include "tierswap/detail/clock.hpp"
#include "tierswap/device.hpp"
#include "tierswap/error.hpp"
#include "tierswap/log.hpp"
#include "tierswap/thread_pool.hpp"
#include "tierswap/units.hpp"

namespace tierswap {
namespace {

using detail::Clock;
using detail::seconds_since;

// The optimizer-kind dispatch for both processors: `on` is a CpuKernelContext (the CPU kernels)
// or a stream (void*: the CUDA launchers); the kernels' signatures differ only in it.
template <class On>
void run_kernel(const GroupConfig& gc, std::uint64_t t, void* const* ptr, Dtype moments,
                const GradView& grad, const Param16View& out, std::uint64_t n, On on) {
  constexpr bool cpu = std::is_same_v<On, CpuKernelContext>;
  auto* p = static_cast<float*>(ptr[kMaster]);
  switch (gc.kind) {
    case OptimizerKind::adamw:
    case OptimizerKind::adam: {
      AdamState a;
      a.param = p;
      a.exp_avg = ptr[kExpAvg];
      a.exp_avg_sq = ptr[kExpAvgSq];
      a.max_exp_avg_sq = ptr[kMaxExpAvgSq];
      a.moment_dtype = moments;
      const auto step = static_cast<std::int64_t>(t);
      if constexpr (cpu)
        adam_step(adam_config(gc), step, a, grad, out, n, on);
      else
        cuda::adam_step(adam_config(gc), step, a, grad, out, n, on);
      break;
    }
    case OptimizerKind::lion:
      if constexpr (cpu)
        lion_step(lion_config(gc), p, ptr[kExpAvg], moments, grad, out, n, on);
      else
        cuda::lion_step(lion_config(gc), p, ptr[kExpAvg], moments, grad, out, n, on);
      break;
    case OptimizerKind::sgd: {
      auto* buf = static_cast<float*>(ptr[kMomentum]);
      if constexpr (cpu)
        sgd_step(sgd_config(gc), t == 1, p, buf, grad, out, n, on);
      else
        cuda::sgd_step(sgd_config(gc), t == 1, p, buf, grad, out, n, on);
      break;
    }
  }
}

// The GPU's part of a split step (concurrent_gpu_step): the sub-groups the GPU steps, in order,
// on a thread of their own while step()'s thread steps the CPU's part. Finished sub-groups go
// back to step()'s thread (take), which does their bookkeeping. The lane stops at its first
// failure (finish() rethrows it); the destructor stops it after the sub-group in progress and
// joins, so nothing runs on the lane once an error unwinds step().
class GpuLane {
 public:
  GpuLane(std::vector<std::size_t> ks, std::function<void(std::size_t)> step)
      : ks_(std::move(ks)), step_(std::move(step)), thread_([this] { run(); }) {}
  ~GpuLane() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }
  GpuLane(const GpuLane&) = delete;
  GpuLane& operator=(const GpuLane&) = delete;

  /// The sub-groups finished since the last call, in order. `wait`: blocks until there is one
  /// or the lane has ended (then none means it is over).
  std::vector<std::size_t> take(bool wait) {
    std::unique_lock lk(mu_);
    if (wait) cv_.wait(lk, [&] { return !done_.empty() || ended_; });
    return std::exchange(done_, {});
  }
  bool failed() {
    std::lock_guard lk(mu_);
    return err_ != nullptr;
  }
  /// Joins the lane and rethrows its failure; else returns the time from its start to the end
  /// of its last sub-group.
  double finish() {
    thread_.join();
    if (err_) std::rethrow_exception(err_);
    return seconds_;
  }

 private:
  void run() {
    const auto t0 = Clock::now();
    for (std::size_t k : ks_) {
      {
        std::lock_guard lk(mu_);
        if (stop_ || err_) break;
      }
      std::exception_ptr err;
      try {
        step_(k);
      } catch (...) {
        err = std::current_exception();
      }
      std::lock_guard lk(mu_);
      if (err)
        err_ = err;
      else
        done_.push_back(k);
      cv_.notify_all();
    }
    std::lock_guard lk(mu_);
    seconds_ = seconds_since(t0);
    ended_ = true;
    cv_.notify_all();
  }

  const std::vector<std::size_t> ks_;
  const std::function<void(std::size_t)> step_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::size_t> done_;
  std::exception_ptr err_;
  bool stop_ = false, ended_ = false;
  double seconds_ = 0;
  std::thread thread_;  // last: starts once everything above is constructed
};

}  // namespace

void ShardedOptimizer::Impl::gpu_step(OptSub& s, const GroupConfig& gc, const GradView& grad,
                                      void* const* ptr, std::uint64_t t, std::uint16_t* p16,
                                      bool speculative) {
  const OptGroup& g = groups[s.group];
  const std::size_t bytes16 = s.numel * sizeof(std::uint16_t);
  auto* const d16 = static_cast<std::uint16_t*>(gpu_p16.reserve(bytes16));
  const std::size_t es = dtype_size(grad.dtype);
  for (const auto& [b, e] : active_runs(s)) {  // the output of a run left alone stays as it is
    void* sp[kStateSlots];
    offset_slots(ptr, b, sp);
    const GradView gv{static_cast<const std::byte*>(grad.data) + b * es, grad.dtype,
                      grad.multiplier};
    run_kernel(gc, t, sp, moment_dtype(), gv, Param16View{d16 + b, g.dtype16}, e - b,
               static_cast<void*>(nullptr));
    cuda::copy_to_host(p16 + b, d16 + b, (e - b) * sizeof(std::uint16_t), nullptr);
  }
  // The final output (not a speculative one) at world size 1: bound device copies take it from
  // the kernel's output, device to device (at world size > 1 they follow the all-gather).
  if (world == 1 && !speculative)
    p16out.from_device(s, d16, any_left_alone ? &left_alone : nullptr);
  cuda::synchronize(nullptr);
}

void ShardedOptimizer::Impl::step_sub(OptSub& s, const GroupConfig& gc, float multiplier,
                                      std::uint64_t t, std::uint16_t* p16, bool* wrote16,
                                      bool speculative) {
  const OptGroup& g = groups[s.group];
  t -= g.step_base;  // the group's own step number (a group added between steps starts at 1)
  // Where the state is read and written: host memory, or GPU memory for GPU-resident state. A GPU
  // step of host-resident state (a plan's choice on a coherent link) works on it in place.
  const Tier tier = s.on_gpu ? Tier::device : Tier::host;
  {
    BlockView st[kStateSlots];
    void* ptr[kStateSlots] = {};
    for (int slot = 0; slot < kStateSlots; ++slot) {
      if (s.state[slot] == kNoBlock) continue;
      st[slot] = tiers.acquire(s.state[slot], tier, Access::write);
      ptr[slot] = st[slot].data();
    }
    if (wrote16) *wrote16 = true;
    // A simulated GPU is a processor of its own: one thread, not the CPU's workers (the same
    // bits for any thread count), so a split step's two parts do not share them.
    CpuKernelContext kc = ctx();
    if (s.step_gpu) kc.pool = nullptr;
    if (book(s).all_lent()) {  // the step reads the caller's memory (lend_grad)
      step_lent(s, gc, ptr, multiplier, t, p16, kc);
    } else {
      const BlockView gv = tiers.acquire(s.grad, grad_tier_of(s));
      const GradView gview{gv.data(), acc_dtype(g), multiplier};
      if (s.step_gpu && !gpu_simulated)
        gpu_step(s, gc, gview, ptr, t, p16, speculative);
      else
        step_runs(s, gc, ptr, gview, t, p16, kc);
    }
    for (auto& h : st)
      if (h) h.mark_dirty();
  }
  if (s.streaming)
    for (BlockId b : s.state)
      if (b != kNoBlock) tiers.write_back(b);
}

// The kernel is elementwise: run by run it computes what it computes on the whole block.
void ShardedOptimizer::Impl::step_runs(const OptSub& s, const GroupConfig& gc, void* const* ptr,
                                       const GradView& grad, std::uint64_t t, std::uint16_t* p16,
                                       const CpuKernelContext& kc) {
  const Dtype dt16 = groups[s.group].dtype16;
  const std::size_t es = dtype_size(grad.dtype);
  for (const auto& [b, e] : active_runs(s)) {
    void* sp[kStateSlots];
    offset_slots(ptr, b, sp);
    const GradView gv{static_cast<const std::byte*>(grad.data) + b * es, grad.dtype,
                      grad.multiplier};
    run_kernel(gc, t, sp, moment_dtype(), gv, Param16View{p16 + b, dt16}, e - b, kc);
  }
}

void ShardedOptimizer::Impl::step_lent(const OptSub& s, const GroupConfig& gc, void* const* ptr,
                                       float multiplier, std::uint64_t t, std::uint16_t* p16,
                                       const CpuKernelContext& kc) {
  const Dtype dt = acc_dtype(groups[s.group]);
  const Dtype dt16 = groups[s.group].dtype16;
  for (const SubGrad::Lent& l : book(s).lent) {  // none left alone: leave_alone() copied those in
    const std::uint64_t at = l.b - s.begin;
    void* sp[kStateSlots];
    offset_slots(ptr, at, sp);
    run_kernel(gc, t, sp, moment_dtype(), GradView{l.data, dt, multiplier},
               Param16View{p16 + at, dt16}, l.e - l.b, kc);
  }
}

void ShardedOptimizer::Impl::offset_slots(void* const* ptr, std::uint64_t at, void** out) const {
  for (int slot = 0; slot < kStateSlots; ++slot)
    out[slot] = ptr[slot] == nullptr
                    ? nullptr
                    : static_cast<std::byte*>(ptr[slot]) + at * dtype_size(slot_dtype(slot));
}

ShardedOptimizer::Impl::Runs ShardedOptimizer::Impl::active_runs(const OptSub& s) const {
  if (!any_left_alone) return {{0, s.numel}};
  Runs runs;
  for (ParamId id : s.pids) {
    if (left_alone[id]) continue;
    const auto [b, e] = slice(params[id], s);
    if (!runs.empty() && runs.back().second == b - s.begin)
      runs.back().second = e - s.begin;
    else
      runs.emplace_back(b - s.begin, e - s.begin);
  }
  return runs;
}

void ShardedOptimizer::leave_alone(std::span<const ParamId> ids) {
  impl_->settle_commit();
  Impl& m = *impl_;
  m.require_finalized("leave_alone");
  if (m.in_backward) throw std::logic_error("leave_alone: end_backward() first");
  for (ParamId id : ids) {
    if (id >= m.params.size())
      throw std::invalid_argument(fmt::format("leave_alone: no parameter {}", id));
    if (!m.params[id].spec.requires_grad)
      throw std::invalid_argument(fmt::format(
          "leave_alone: parameter '{}' is frozen: no step changes it", m.params[id].spec.name));
  }
  m.left_alone.assign(m.params.size(), 0);
  for (ParamId id : ids) m.left_alone[id] = 1;
  m.any_left_alone = !ids.empty();
  // A lent gradient of a parameter left alone: its sub-group steps by runs, from its block.
  for (auto& s : m.subs)
    if (std::any_of(s.pids.begin(), s.pids.end(), [&](ParamId id) { return m.left_alone[id]; }))
      m.materialize_lent(s);
}

void ShardedOptimizer::Impl::clear_left_alone() noexcept {
  any_left_alone = false;
  std::fill(left_alone.begin(), left_alone.end(), 0);
}

template <class Step, class After>
void ShardedOptimizer::Impl::run_steps(const std::vector<std::size_t>& ks, Step&& step,
                                       After&& after, bool* wrote16, StepResult& r) {
  auto on_gpu = [&](std::size_t k) { return subs[k].step_gpu; };
  const auto n_gpu = static_cast<std::size_t>(std::count_if(ks.begin(), ks.end(), on_gpu));
  r.gpu_subgroups += static_cast<std::uint32_t>(n_gpu);
  // A split (both kinds): the GPU's on the lane, the rest here; else all here, in order.
  const bool split = cfg.concurrent_gpu_step && n_gpu > 0 && n_gpu < ks.size();
  std::vector<std::size_t> lane_ks, here;
  for (std::size_t k : ks) (split && on_gpu(k) ? lane_ks : here).push_back(k);
  std::optional<GpuLane> lane;
  if (split) {
    if (wrote16 != nullptr) *wrote16 = true;  // the lane's writes are not tracked one by one
    lane.emplace(std::move(lane_ks), [&](std::size_t k) { step(k, nullptr); });
  }
  auto prefetch = [&](std::size_t i) {  // streamed state, read ahead of its step
    if (i < here.size()) prefetch_state(subs[here[i]]);
  };
  for (std::size_t i = 0; i < std::min<std::size_t>(here.size(), depth + 1); ++i) prefetch(i);
  auto drain = [&](bool wait) {
    const auto ks_done = lane->take(wait);
    for (std::size_t k : ks_done) after(k);
    return !ks_done.empty();
  };
  for (std::size_t i = 0; i < here.size(); ++i) {
    prefetch(i + depth + 1);
    const std::size_t k = here[i];
    const auto t0 = Clock::now();
    step(k, wrote16);
    if (on_gpu(k)) r.gpu_seconds += seconds_since(t0);
    after(k);
    if (lane) {
      drain(false);
      if (lane->failed()) break;  // finish() below rethrows it
    }
  }
  if (!lane) return;
  while (drain(true)) {
  }
  r.gpu_seconds += lane->finish();
}

// ---- step(), in the order it runs --------------------------------------------------------------
ShardedOptimizer::Impl::Speculation ShardedOptimizer::Impl::drain_speculation() {
  Speculation sp;
  if (!cfg.overlap) return sp;
  spec_drain();
  std::lock_guard lk(spec.mu);
  sp.error = spec.error;
  for (const auto& s : subs) sp.any |= spec_of(s).state == SubSpec::State::stepped;
  sp.keep = sp.any && !spec.invalid && !spec.error;
  return sp;
}

void ShardedOptimizer::Impl::drop_all_grads() {
  for (auto& s : subs) drop_grad(s);
}

// Chunk sums of the 16-bit gradient, gathered so every rank adds the same numbers in the same
// order (the norm is the same for every world size and thread count): the sum of squares, and
// whether any is non-finite.
void ShardedOptimizer::Impl::local_grad_stats(std::vector<double>& chunk) {
  for (auto& s : subs) {
    const OptGroup& g = groups[s.group];
    double* out = chunk.data() + g.chunk_base + s.begin / kGradStatsChunk;
    if (!book(s).sums.empty()) {  // taken at ingest
      std::copy(book(s).sums.begin(), book(s).sums.end(), out);
      continue;
    }
    const Tier tier = grad_tier_of(s);
    BlockView v = tiers.acquire(s.grad, tier);
    chunk_sums(s, v, tier, out);
  }
}

ShardedOptimizer::Impl::GradStats ShardedOptimizer::Impl::global_grad_stats(
    std::exception_ptr* failed) {
  std::vector<double> chunk(chunks + 1, 0.0);  // the last: how many ranks failed
  if (!*failed) *failed = thrown_by([&] { local_grad_stats(chunk); });
  chunk[chunks] = *failed ? 1 : 0;
  if (world > 1) comm.all_reduce_sum(chunk.data(), chunk.size());
  GradStats st;
  st.failed_anywhere = chunk[chunks] > 0;
  for (std::size_t i = 0; i < chunks; ++i) {
    st.sum_sq += chunk[i];
    st.nonfinite |= !std::isfinite(chunk[i]);
  }
  return st;
}

std::vector<GroupConfig> ShardedOptimizer::Impl::group_configs() const {
  std::vector<GroupConfig> cfgs;
  for (const auto& g : groups) cfgs.push_back(g.cfg);
  return cfgs;
}

// The sub-groups still to step (all of them, except those kept from the overlapped backward).
// Memory-only sub-groups (`late`) step after the commit, from gradients pinned before it (except
// those kept from the overlapped backward: their undo copies restore them on failure). Step t
// (counted from 1) takes them in descending order when t is even (alternate_step_order): it
// begins with the sub-groups step t - 1 ended with, whose state the budget may still hold.
void ShardedOptimizer::Impl::partition_todo_late(bool keep, std::uint64_t t,
                                                 std::vector<std::size_t>* todo,
                                                 std::vector<std::size_t>* late) const {
  for (std::size_t k = 0; k < subs.size(); ++k)
    if (!keep || spec_of(subs[k]).state != SubSpec::State::stepped)
      (subs[k].memory_only ? *late : *todo).push_back(k);
  if (cfg.alternate_step_order && t % 2 == 0) std::reverse(todo->begin(), todo->end());
}

// The speculative results kept: their 16-bit parameters are final now.
void ShardedOptimizer::Impl::keep_speculative_param16(StepResult& r, bool* p16_changed) {
  for (auto& s : subs) {
    if (spec_of(s).state != SubSpec::State::stepped) continue;
    OptGroup& g = groups[s.group];
    std::uint16_t* dst = g.p16.data() + s.begin;
    const std::uint16_t* src = spec_of(s).out16.data();
    if (cfg.overlap_param16_in_place) {
      // already there: the speculative step wrote param16() itself
    } else if (pool != nullptr && pool->size() > 1 && s.numel >= (1u << 20)) {
      pool->parallel_for(s.numel, 2048, [&](std::size_t b, std::size_t e) {
        std::memcpy(dst + b, src + b, (e - b) * sizeof(std::uint16_t));
      });
    } else {
      std::copy(spec_of(s).out16.begin(), spec_of(s).out16.end(), dst);
    }
    *p16_changed = true;
    ++r.overlapped_subgroups;
    p16out.done(s);
  }
}

// The pipeline: prefetch ahead, step, write behind (the GPU's sub-groups meanwhile, on their
// lane), then the commit. `late`'s gradients are read (if spilled) and pinned before the commit,
// so nothing after it does I/O. An error rolls the generation back, drops the gradients and
// gives the trainer back the 16-bit values it was handed, then rethrows.
void ShardedOptimizer::Impl::run_pipeline_and_commit(const StepPlan& sp, bool keep,
                                                     std::vector<BlockView>* late_grads,
                                                     StepResult& r,
                                                     std::pair<double, std::uint32_t> scaler) {
  bool p16_changed = false;    // param16 no longer matches the committed master weights
  bool agreed = false;         // whether every rank knows if any rank's pipeline failed
  bool all_roll_back = false;  // it did, or a rank's commit failed: every rank rolls back
  bool committed = false;      // this rank's commit happened (to be undone if another's did not)
  try {
    p16out.begin();
    if (keep) keep_speculative_param16(r, &p16_changed);
    run_steps(
        sp.todo,
        [&](std::size_t k, bool* wrote16) {
          OptSub& s = subs[k];
          OptGroup& g = groups[s.group];
          step_sub(s, g.cfg, sp.multiplier, sp.t, g.p16.data() + s.begin, wrote16);
        },
        [&](std::size_t k) {
          drop_grad(subs[k]);
          p16out.done(subs[k]);
        },
        &p16_changed, r);
    late_grads->resize(subs.size());
    for (std::size_t k : sp.late)  // where the step reads it (a lent one: the caller's memory)
      if (!book(subs[k]).all_lent())
        (*late_grads)[k] = tiers.acquire(subs[k].grad, grad_tier_of(subs[k]));
    if (commit_adds_nothing()) {  // memory-only state: nothing to write
      step_count = sp.t;
      return;
    }
    if (may_pipeline_commit(sp)) {  // the trainer goes on; the next call settles it
      step_count = sp.t;
      start_pipelined_commit(sp, scaler, r);
      return;
    }
    const auto c0 = Clock::now();
    tiers.flush();  // the generation's data written (the commit's own flush then finds none)
    agreed = true;
    if ((all_roll_back = any_rank_failed(false)))
      throw std::runtime_error(fmt::format(
          "step {}: another rank's step failed (its error says why); rolled back here too", sp.t));
    step_count = sp.t;
    commit_agreed(sp.t, &committed, &all_roll_back);
    r.commit_seconds = seconds_since(c0);
  } catch (...) {
    late_grads->clear();
    step_count = sp.t - 1;
    if (!agreed) all_roll_back = any_rank_failed(true);
    if (all_roll_back) {
      undo_commit_agreed(sp.t, committed);
      p16_changed = any_rank_failed(p16_changed);
    }
    roll_back_failed_step(p16_changed);
    if (all_roll_back) agree_on_stale_param16();
    if (!unusable.empty())
      throw std::runtime_error(fmt::format("{} (the first error here: {})", unusable,
                                           what_of(std::current_exception())));
    throw;
  }
}

// The ranks commit one after another; one whose sync or manifest write fails would leave the
// others a step ahead. So they agree once more: if any rank's commit failed, every rank throws
// (*all_roll_back set) and the ones that committed (*committed) undo it (undo_commit_agreed).
void ShardedOptimizer::Impl::commit_agreed(std::uint64_t t, bool* committed, bool* all_roll_back) {
  const std::exception_ptr failed = thrown_by([&] {
    commit();
    *committed = true;
  });
  if (!(*all_roll_back = any_rank_failed(failed != nullptr))) return;
  if (failed) std::rethrow_exception(failed);
  throw std::runtime_error(fmt::format(
      "step {}: another rank's commit failed (its error says why); rolled back here too", t));
}

// A rank that committed step t while another's commit failed returns to step t - 1 (its data
// is intact in the other slots: nothing was written since). Should that fail too, the ranks
// hold different steps: every rank learns it, and every call after this one refuses until the
// job restarts and resume() steps the ranks ahead back.
void ShardedOptimizer::Impl::undo_commit_agreed(std::uint64_t t, bool committed) {
  std::string err;
  if (committed) try {
      if (!tiers.roll_back_generation()) err = "no earlier generation to return to";
    } catch (const std::exception& e) {
      err = e.what();
    }
  if (!err.empty())
    log(LogLevel::error,
        fmt::format("step {}: rank {} could not undo its commit: {}", t, rank, err));
  if (!any_rank_failed(!err.empty())) return;
  unusable = fmt::format(
      "step {} was committed on some ranks and not on others, and the ranks ahead could not step "
      "back{}{}: {}",
      t, err.empty() ? "" : " (here: ", err.empty() ? "" : err + ")",
      tiers.config().shadow_slots
          ? "restart the job and resume() from the swap directory (it steps the ranks ahead back)"
          : "in place (no shadow slots) no rank can step back: restart from a save() checkpoint");
}

// A rank whose pipeline, write-back or commit failed would otherwise roll back while the others
// commit: the ranks' states a step apart. Every rank that agreed on a failure rolls back its
// 16-bit parameters if any rank's changed, for restore_param16()'s gather is a collective.
bool ShardedOptimizer::Impl::any_rank_failed(bool failed) {
  if (world == 1) return failed;
  try {
    return comm.all_reduce_or(failed);
  } catch (const std::exception& e) {
    log(LogLevel::error, fmt::format("step: the ranks could not agree on the step ({})", e.what()));
    return true;
  }
}

// Several ranks: one whose 16-bit parameters could not be restored after a rollback makes every
// rank's stale, so that every rank's next begin_backward() or step() throws (restart and resume)
// rather than that rank alone, with the others waiting for it in a collective.
void ShardedOptimizer::Impl::agree_on_stale_param16() {
  if (world == 1 || !any_rank_failed(p16_stale != nullptr) || p16_stale) return;
  p16_stale = std::make_exception_ptr(
      std::runtime_error("another rank's 16-bit parameters could not be restored"));
}

// Each part of the rollback runs even if one before it failed; the 16-bit parameters are
// restored last (restore_param16 leaves them stale if a read fails again and again).
void ShardedOptimizer::Impl::roll_back_failed_step(bool p16_changed) {
  const auto guarded = [this](const char* part, auto&& fn) {
    try {
      fn();
      return true;
    } catch (const std::exception& e) {
      log(LogLevel::error,
          fmt::format("step {}: rolling back ({}) failed too: {}", step_count + 1, part, e.what()));
      return false;
    }
  };
  // A discard that fails part-way may leave in-place speculative values in param16.
  if (!guarded("discarding the speculative steps", [&] { spec_discard(); })) p16_changed = true;
  guarded("dropping the gradients", [&] { drop_all_grads(); });
  if (p16_changed) guarded("restoring the 16-bit parameters", [&] { restore_param16(); });
  guarded("waiting for the device copies", [&] { p16out.sync(); });
}

// The memory-only state: the committed generation is the new step for everything else, and this
// part cannot fail (resident state, pinned gradients, the CPU kernel).
void ShardedOptimizer::Impl::step_memory_only_after_commit(const StepPlan& sp,
                                                           std::vector<BlockView>* late_grads,
                                                           StepResult& r) {
  run_steps(
      sp.late,
      [&](std::size_t k, bool*) {
        OptSub& s = subs[k];
        OptGroup& g = groups[s.group];
        try {
          step_sub(s, g.cfg, sp.multiplier, sp.t, g.p16.data() + s.begin);
        } catch (const std::exception& e) {
          log(LogLevel::error,
              fmt::format("step {}: memory-only sub-group {} of group {} failed after the commit "
                          "({}): the in-memory state is now inconsistent; load a checkpoint",
                          sp.t, s.index, s.group, e.what()));
          throw;
        }
      },
      [&](std::size_t k) {
        (*late_grads)[k] = BlockView{};
        drop_grad(subs[k]);
        p16out.done(subs[k]);
      },
      nullptr, r);
}

// Drops the gradients and fills in what the step moved and took.
void ShardedOptimizer::Impl::finish_result(StepResult& r, const TierCounters& c0,
                                           std::chrono::steady_clock::time_point t0) {
  drop_all_grads();
  const TierCounters c1 = tiers.counters();
  for (int t = 0; t < kTierCount; ++t) {
    r.bytes_in[t] = c1.bytes_in[t] - c0.bytes_in[t];
    r.bytes_out[t] = c1.bytes_out[t] - c0.bytes_out[t];
  }
  r.io_wait_seconds = c1.stall_seconds - c0.stall_seconds;
  r.step = step_count;
  r.next_loss_scale = scale;
  const auto& pending = commits.pending();
  r.generation = pending ? pending->generation : tiers.committed_generation();
  r.commit_pending = pending.has_value();
  r.seconds = seconds_since(t0);
  step_metrics.record(r);
}

StepResult ShardedOptimizer::step(double clip_factor) {
  if (!(clip_factor > 0 && clip_factor <= 1))
    throw std::invalid_argument(
        fmt::format("step: clip factor {} is not in (0, 1] (max_norm / (norm + 1e-6), at most 1)",
                    clip_factor));
  if (impl_->cfg.max_grad_norm > 0)
    throw std::invalid_argument(fmt::format(
        "step: a clip factor was given and max_grad_norm is {}: the gradients would be clipped "
        "twice (set max_grad_norm to 0 to clip by the caller's norm)",
        impl_->cfg.max_grad_norm));
  return impl_->run_step(clip_factor);
}

StepResult ShardedOptimizer::step() {
  return impl_->run_step(std::nullopt);
}

// A step that throws leaves no gradient in the caller's memory: it was dropped (a failure
// mid-step) or is copied in now (one before the pipeline), for the next step to take.
StepResult ShardedOptimizer::Impl::run_step(std::optional<double> given_clip) {
  try {
    StepResult r = step_once(given_clip);
    clear_left_alone();
    return r;
  } catch (...) {
    clear_left_alone();
    materialize_all_lent();
    throw;
  }
}

std::uint32_t ShardedOptimizer::Impl::settle_lent() {
  std::uint32_t lent = 0;
  for (auto& s : subs) {
    if (!book(s).lent.empty() && !book(s).all_lent()) materialize_lent(s);
    lent += book(s).all_lent();
  }
  return lent;
}

double ShardedOptimizer::Impl::clip_factor_for(std::optional<double> given_clip,
                                               double grad_norm) const {
  if (given_clip) return *given_clip;
  if (cfg.max_grad_norm <= 0) return 1;
  return std::min(1.0, cfg.max_grad_norm / (grad_norm + 1e-6));
}

void ShardedOptimizer::Impl::skip_step(bool spec_any) {
  if (spec_any) spec_discard();  // the committed generation is bit for bit intact
  if (cfg.loss_scaler.mode != LossScaling::dynamic) return;
  scale *= cfg.loss_scaler.backoff_factor;
  growth_tracker = 0;
}

void ShardedOptimizer::Impl::commit_step(const StepPlan& sp, bool keep,
                                         std::vector<BlockView>* late_grads, StepResult& r) {
  const auto& ls = cfg.loss_scaler;
  const std::pair scaler_before{scale, growth_tracker};
  if (ls.mode == LossScaling::dynamic && ++growth_tracker >= ls.growth_interval) {
    scale *= ls.growth_factor;
    growth_tracker = 0;
  }
  try {
    run_pipeline_and_commit(sp, keep, late_grads, r, scaler_before);
  } catch (...) {
    std::tie(scale, growth_tracker) = scaler_before;
    throw;
  }
}

StepResult ShardedOptimizer::Impl::step_once(std::optional<double> given_clip) {
  settle_commit();
  require_state("step");
  if (in_backward) throw std::logic_error("step: end_backward() first");
  require_current_param16("step");
  StepResult r;
  r.commit_wait_seconds = commits.take_wait_seconds();
  r.lent_subgroups = settle_lent();
  const auto t0 = Clock::now();
  const TierCounters c0 = tiers.counters();
  if (world > 1)
    for (auto& g : groups) reduce_local(g);  // whatever was not reduced yet

  // Overlapped mode: the speculative steps finish first (they overlap the statistics below). A
  // failed step leaves the state as it was before the backward and drops the gradients.
  Speculation left = drain_speculation();
  std::exception_ptr failed = left.error;
  const auto [sum_sq, nonfinite, failed_anywhere] = global_grad_stats(&failed);
  if (failed_anywhere) {  // nothing has stepped on any rank
    if (left.error) roll_back_failed_step(false);
    agree_on_stale_param16();
    if (left.error) std::rethrow_exception(left.error);
    if (failed) std::rethrow_exception(failed);
    throw std::runtime_error(fmt::format(
        "step {}: another rank's step failed (its error says why); nothing stepped here either",
        step_count + 1));
  }

  // The verdict: skip (non-finite), clip, keep or redo the speculative results.
  r.loss_scale = scale;
  const double inv = 1.0 / scale;
  r.grad_norm = std::sqrt(sum_sq) * inv;
  if (nonfinite) {
    r.skipped = true;
    skip_step(left.any);
    finish_result(r, c0, t0);
    return r;
  }
  r.clip_factor = clip_factor_for(given_clip, r.grad_norm);
  Impl::StepPlan sp;
  sp.multiplier = static_cast<float>(inv * r.clip_factor);
  sp.t = step_count + 1;
  if (left.keep)  // speculation stepped parameters now left alone whole: redone
    left.keep = sp.multiplier == spec.mult && sp.t == spec.t && group_configs() == spec.cfgs &&
                !any_left_alone;
  if (left.any && !left.keep) {  // clipping (or a change) discovered late: discard and redo
    spec_discard();
    r.redone = true;
  }
  partition_todo_late(left.keep, sp.t, &sp.todo, &sp.late);

  std::vector<BlockView> late_grads;  // a view destroyed unreleased is released clean
  commit_step(sp, left.keep, &late_grads, r);
  step_memory_only_after_commit(sp, &late_grads, r);
  if (left.keep) spec_reset();
  gather_param16();
  finish_result(r, c0, t0);
  if (world > 1) p16out.all();  // the step is complete: an exception here leaves it done
  p16out.sync();
  read_ahead_next();
  return r;
}

}  // namespace tierswap
