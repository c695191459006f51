// ShardedOptimizer's 16-bit parameters: param16(), the trainer's callback as each parameter's new
// values are final (on_param16_ready), the bound device copies, recomputation from the masters.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

#include "src/optim/optimizer_impl.hpp"
#include "tierswap/cuda_runtime.hpp"
#include "tierswap/device.hpp"
#include "tierswap/error.hpp"
#include "tierswap/log.hpp"
#include "tierswap/thread_pool.hpp"
#include "tierswap/units.hpp"

namespace tierswap {
void ShardedOptimizer::Impl::promote_memory_only_gpu(const OptSub& s, BlockId b) {
  if (!s.memory_only || !s.on_gpu) return;
  BlockView v = tiers.acquire(b, Tier::device);
  tiers.release(v, false);
}

std::exception_ptr ShardedOptimizer::Impl::refresh_sub16_retrying(const OptSub& s) {
  for (int attempt = 1;; ++attempt) {
    try {
      refresh_sub16(s);
      return nullptr;
    } catch (...) {
      if (attempt == kRestoreAttempts) return std::current_exception();
    }
  }
}

std::exception_ptr ShardedOptimizer::Impl::refresh_own_param16_retrying() {
  std::exception_ptr last;
  for (const auto& s : subs)
    if (std::exception_ptr e = refresh_sub16_retrying(s)) last = e;
  return last;
}

void ShardedOptimizer::Impl::mark_param16_stale(std::exception_ptr why) {
  log(LogLevel::error,
      fmt::format("step {}: the 16-bit parameters could not be restored from the committed "
                  "master weights ({}); the next begin_backward() or step() restores them",
                  step_count + 1, what_of(why)));
  p16_stale = std::move(why);
}

void ShardedOptimizer::Impl::restore_param16() {
  std::exception_ptr failed = refresh_own_param16_retrying();
  gather_param16();
  if (failed) return mark_param16_stale(std::move(failed));
  p16out.all();  // the values the trainer was given are undone
}

void ShardedOptimizer::Impl::require_current_param16(const char* what) {
  if (!p16_stale) return;
  // Several ranks: the other ranks' copies of this rank's values are stale too, and restoring
  // them is a collective the other ranks (whose rollback succeeded) would not join.
  if (world > 1)
    throw std::runtime_error(fmt::format(
        "{}: rank {}'s 16-bit parameters are stale after a failed step's rollback ({}); with {} "
        "ranks they cannot be restored by one alone: restart the job and resume from the swap "
        "directory",
        what, rank, what_of(p16_stale), world));
  if (std::exception_ptr again = refresh_own_param16_retrying()) std::rethrow_exception(again);
  gather_param16();
  p16out.all();
  p16out.sync();
  const std::exception_ptr why = std::exchange(p16_stale, nullptr);
  const std::string msg = fmt::format(
      "{}: the 16-bit parameters were stale after a failed step's rollback ({}) and are restored "
      "now: run the forward pass again",
      what, what_of(why));
  try {
    std::rethrow_exception(why);
  } catch (const std::system_error& e) {
    throw std::system_error(e.code(), msg);
  } catch (...) {
    throw std::runtime_error(msg);
  }
}

void ShardedOptimizer::Impl::refresh_sub16(const OptSub& s) {
  OptGroup& g = groups[s.group];
  {
    BlockView m = tiers.acquire(s.state[kMaster], Tier::host);
    cast(m.data(), Dtype::f32, g.p16.data() + s.begin, g.dtype16, s.numel, ctx());
  }
  if (s.streaming) tiers.write_back(s.state[kMaster]);  // the first copy to go
}

void ShardedOptimizer::on_param16_ready(Param16Ready fn) {
  impl_->p16out.on_ready(std::move(fn));
}

void ShardedOptimizer::bind_param16_device(ParamId id, void* d_param16) {
  impl_->settle_commit();
  Impl& m = *impl_;
  m.require_finalized("bind_param16_device");
  if (id >= m.params.size())
    throw std::invalid_argument(fmt::format("bind_param16_device: no parameter {}", id));
  const OptParam& p = m.params[id];
  if (!p.spec.requires_grad)
    throw std::invalid_argument(fmt::format(
        "bind_param16_device: parameter '{}' is frozen (its 16-bit values are the trainer's)",
        p.spec.name));
  if (d_param16 != nullptr && !m.device_ptrs && !m.gpu_simulated)
    throw std::runtime_error(
        fmt::format("bind_param16_device '{}': no usable GPU ({}) and no simulated device tier",
                    p.spec.name, device_info().reason));
  m.p16out.bind(id, d_param16);
}

std::span<const std::uint16_t> ShardedOptimizer::param16(ParamId id) const {
  const Impl& m = *impl_;
  m.require_finalized("param16");
  if (id >= m.params.size())
    throw std::invalid_argument(fmt::format("param16: no parameter {}", id));
  const OptParam& p = m.params[id];
  if (!p.spec.requires_grad)
    throw std::invalid_argument(fmt::format(
        "param16: parameter '{}' is frozen: tierswap keeps no 16-bit copy of it", p.spec.name));
  if (m.p16_stale)
    throw std::runtime_error(
        fmt::format("param16 '{}': stale since a failed step's rollback could not restore it ({}); "
                    "begin_backward() or step() restores it",
                    p.spec.name, what_of(m.p16_stale)));
  return {m.groups[p.group].p16.data() + p.offset, p.numel};
}

}  // namespace tierswap
