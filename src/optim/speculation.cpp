// ShardedOptimizer's overlapped step: the background thread that steps sub-groups speculatively as
// their gradients become final, the undo copies of memory-only state, and discarding speculation.
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
#include "tierswap/log.hpp"
#include "tierswap/thread_pool.hpp"
#include "tierswap/units.hpp"

namespace tierswap {

// The speculative thread goes first: it may still write the page-locked 16-bit parameters.
ShardedOptimizer::Impl::~Impl() {
  spec.stop();  // then p16out, destroyed before the groups, unregisters their 16-bit values
}

void ShardedOptimizer::Impl::spec_loop() {
  std::unique_lock lk(spec.mu);
  for (;;) {
    spec.cv.wait(lk, [&] { return spec.stopping || !spec.queue.empty(); });
    if (spec.stopping) return;
    const std::size_t k = spec.queue.front();
    spec.queue.pop_front();
    spec.busy = true;
    const bool skip = spec.error != nullptr || spec.invalid;
    // Read ahead for the sub-groups queued behind this one.
    std::vector<std::size_t> next(
        spec.queue.begin(), spec.queue.begin() + std::min<std::size_t>(spec.queue.size(), depth));
    lk.unlock();
    std::exception_ptr err;
    OptSub& s = subs[k];
    if (!skip) {
      try {
        for (std::size_t j : next) prefetch_state(subs[j]);
        if (s.undo) undo_save(s);
        step_sub(s, spec.cfgs[s.group], spec.mult, spec.t, spec_out16(s), nullptr, true);
        if (cfg.grad_tier == Tier::nvme && !s.grad_gpu) tiers.evict(s.grad, Tier::host);
      } catch (...) {
        err = std::current_exception();
      }
    }
    lk.lock();
    spec_of(s).state = skip || err ? SubSpec::State::none : SubSpec::State::stepped;
    if (err && !spec.error) spec.error = err;
    spec.busy = false;
    if (spec.queue.empty()) spec.idle_cv.notify_all();
  }
}

void ShardedOptimizer::Impl::spec_drain() {
  std::unique_lock lk(spec.mu);
  spec.idle_cv.wait(lk, [&] { return spec.queue.empty() && !spec.busy; });
}

void ShardedOptimizer::Impl::spec_touch(OptSub& s) {
  if (!cfg.overlap) return;
  {
    std::lock_guard lk(spec.mu);
    if (spec_of(s).state == SubSpec::State::none) return;
  }
  spec_drain();  // the worker must be done with its gradient before it changes
  std::lock_guard lk(spec.mu);
  spec.invalid = true;
}

bool ShardedOptimizer::Impl::spec_pending() {
  std::lock_guard lk(spec.mu);
  return std::any_of(spec.per_sub.begin(), spec.per_sub.end(),
                     [](const SubSpec& s) { return s.state != SubSpec::State::none; });
}

// Copies block `from` into block `to` (same size) in the sub-group's memory tier: host memory,
// or GPU memory (a device-to-device copy; host memory standing in on a simulated device tier).
void ShardedOptimizer::Impl::undo_copy(const OptSub& s, BlockId from, BlockId to) {
  const Tier tier = s.on_gpu ? Tier::device : Tier::host;
  BlockView src = tiers.acquire(from, tier);
  BlockView dst = tiers.acquire(to, tier, Access::write);
  if (tier == Tier::device && !gpu_simulated) {
    cuda::copy_on_device(dst.data(), src.data(), src.bytes(), nullptr);
    cuda::synchronize(nullptr);
  } else {
    std::memcpy(dst.data(), src.data(), src.bytes());
  }
  dst.mark_dirty();
}

void ShardedOptimizer::Impl::undo_save(OptSub& s) {
  for (int slot = 0; slot < kStateSlots; ++slot)
    if (s.state[slot] != kNoBlock) undo_copy(s, s.state[slot], s.undo_block[slot]);
  spec_of(s).undo_saved = true;
}

void ShardedOptimizer::Impl::undo_restore() {
  for (auto& s : subs) {
    if (!spec_of(s).undo_saved) continue;
    for (int slot = 0; slot < kStateSlots; ++slot)
      if (s.state[slot] != kNoBlock) undo_copy(s, s.undo_block[slot], s.state[slot]);
    spec_of(s).undo_saved = false;
  }
}

std::uint16_t* ShardedOptimizer::Impl::spec_out16(OptSub& s) {
  return cfg.overlap_param16_in_place ? groups[s.group].p16.data() + s.begin
                                      : spec_of(s).out16.data();
}

void ShardedOptimizer::Impl::spec_discard() {
  undo_restore();
  tiers.discard();
  if (cfg.overlap_param16_in_place) {
    std::vector<const OptSub*> stepped;
    {
      std::lock_guard lk(spec.mu);
      for (const auto& s : subs)
        if (spec_of(s).state == SubSpec::State::stepped) stepped.push_back(&s);
    }
    spec_reset();
    std::exception_ptr failed;  // (the values are the trainer's: left stale, not thrown)
    for (const OptSub* s : stepped)
      if (std::exception_ptr e = refresh_sub16_retrying(*s)) failed = e;
    if (failed) mark_param16_stale(std::move(failed));
    return;
  }
  spec_reset();
}

void ShardedOptimizer::Impl::spec_reset() {
  std::lock_guard lk(spec.mu);
  for (auto& s : subs) {
    spec_of(s).state = SubSpec::State::none;
    spec_of(s).undo_saved = false;  // restored (undo_restore) or kept: either way no longer needed
  }
  spec.invalid = false;
  spec.error = nullptr;
}

void ShardedOptimizer::set_overlap(bool on) {
  impl_->settle_commit();
  Impl& m = *impl_;
  if (m.in_backward || m.spec_pending())
    throw std::logic_error(
        "set_overlap: between steps only (a backward or its speculative steps are pending)");
  if (on && !m.tiers.config().shadow_slots)
    throw std::logic_error(
        "set_overlap: the overlapped step needs shadow slots (TierConfig::shadow_slots is off)");
  m.cfg.overlap = on;
}

void ShardedOptimizer::Impl::read_ahead_next() {
  if (!cfg.overlap) return;
  std::lock_guard lk(spec.mu);  // (the worker is idle: step() drained it)
  const std::size_t n = std::min<std::size_t>(spec.order.size(), depth + 1);
  for (std::size_t i = 0; i < n; ++i) prefetch_state(subs[spec.order[i]]);
}

bool ShardedOptimizer::overlap() const noexcept {
  return impl_->cfg.overlap;
}

bool ShardedOptimizer::speculation_pending() {
  return impl_->spec_pending();
}

}  // namespace tierswap
