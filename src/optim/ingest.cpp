// ShardedOptimizer gradient ingest: backward passes, gradients from host or device memory into the
// sub-groups' 16-bit gradient blocks (or the local buffer and its reduce-scatter at world size >
// 1), the statistics taken as each gradient becomes final, and the one way a gradient is dropped.
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
#include "tierswap/cuda_kernels.hpp"
#include "tierswap/device.hpp"
#include "tierswap/error.hpp"
#include "tierswap/log.hpp"
#include "tierswap/thread_pool.hpp"
#include "tierswap/units.hpp"

namespace tierswap {

bool ShardedOptimizer::Impl::take_grad_stats(OptSub& s, const BlockView& grad, Tier tier) {
  SubGrad& gb = book(s);
  if (!final_backward) return false;
  gb.sums.assign((s.numel + kGradStatsChunk - 1) / kGradStatsChunk, 0.0);
  chunk_sums(s, grad, tier, gb.sums.data());
  return std::all_of(gb.sums.begin(), gb.sums.end(), [](double v) { return std::isfinite(v); });
}

void ShardedOptimizer::Impl::chunk_sums(const OptSub& s, const BlockView& grad, Tier tier,
                                        double* out) {
  const Dtype dt = acc_dtype(groups[s.group]);
  if (tier != Tier::device || gpu_simulated) {
    grad_chunk_sums(grad.data(), dt, s.numel, out, ctx());
    return;
  }
  const std::size_t bytes = (s.numel + kGradStatsChunk - 1) / kGradStatsChunk * sizeof(double);
  auto* d = static_cast<double*>(gpu_sums.reserve(bytes));
  cuda::grad_chunk_sums(grad.data(), dt, s.numel, d, nullptr);
  cuda::copy_to_host(out, d, bytes, nullptr);
  cuda::synchronize(nullptr);
}

template <class Add>
void ShardedOptimizer::Impl::ingest(OptSub& s, Tier tier, Access access, Add&& add, bool whole) {
  SubGrad& gb = book(s);
  spec_touch(s);
  bool last = false, final = false;
  {
    BlockView v = tiers.acquire(s.grad, tier, access);
    add(v.data());
    v.mark_dirty();
    gb.zero = false;
    gb.sums.clear();
    last = whole || ++gb.seen == s.pids.size();
    if (last) final = take_grad_stats(s, v, tier);
  }
  if (last) after_ingest(s, final);
}

void ShardedOptimizer::Impl::drop_grad(OptSub& s) {
  SubGrad& gb = book(s);
  tiers.trim(s.grad);
  gb.lent.clear();
  gb.sums.clear();
  std::fill(gb.written.begin(), gb.written.end(), 0);
  gb.zero = true;
}

const OptParam& ShardedOptimizer::Impl::grad_param(const char* what, ParamId id,
                                                   const void* grad) const {
  require_finalized(what);
  if (!in_backward) throw std::logic_error(fmt::format("{}: call begin_backward() first", what));
  if (id >= params.size())
    throw std::invalid_argument(fmt::format("{}: no parameter {}", what, id));
  const OptParam& p = params[id];
  if (!p.spec.requires_grad)
    throw std::invalid_argument(
        fmt::format("{}: parameter '{}' is frozen (requires_grad=false)", what, p.spec.name));
  if (grad == nullptr)
    throw std::invalid_argument(fmt::format("{} '{}': null gradient", what, p.spec.name));
  return p;
}

void ShardedOptimizer::Impl::after_ingest(OptSub& s, bool final) {
  // Memory-only state without an undo copy steps after the verdict.
  if (final && cfg.overlap && (!s.memory_only || s.undo)) {
    std::unique_lock lk(spec.mu);
    if (!spec.invalid && !spec.error) {
      if (!cfg.overlap_param16_in_place) spec_of(s).out16.resize(s.numel);
      spec_of(s).state = SubSpec::State::queued;
      spec.queue.push_back(static_cast<std::size_t>(&s - subs.data()));
      spec.order.push_back(spec.queue.back());
      const bool soon = spec.queue.size() <= depth + 1;
      lk.unlock();
      spec.cv.notify_one();
      if (soon) prefetch_state(s);  // read while the queue ahead of it is stepped
      return;  // the speculative step spills the gradient when grad_tier is nvme
    }
  }
  if (cfg.grad_tier == Tier::nvme && !s.grad_gpu) tiers.evict(s.grad, Tier::host);
}

// Reduce-scatters group g's local gradient, slot by slot, into this rank's gradient blocks.
void ShardedOptimizer::Impl::reduce_local(OptGroup& g) {
  // Collective: a rank that has no gradient for the group (None in torch: zeros) takes part
  // with zeros, for the ranks with one reduce theirs.
  if (!comm.all_reduce_or(g.local_dirty)) return;
  const Dtype dt = acc_dtype(g);
  const std::size_t es = dtype_size(dt);
  std::vector<std::size_t> counts(world);
  std::vector<std::byte> send, recv;
  std::exception_ptr failed;  // this rank's ingest (reading a spilled gradient, say)
  for (std::uint64_t k = 0; k < g.subs_per_part; ++k) {
    std::size_t total = 0;
    for (int r = 0; r < world; ++r) total += counts[r] = piece(g, r, k).second;
    if (total == 0) continue;
    send.resize(total * es);
    std::size_t off = 0;
    for (int r = 0; r < world; ++r) {
      const auto [b, n] = piece(g, r, k);
      std::memcpy(send.data() + off * es, g.local_grad.data() + b * es, n * es);
      off += n;
    }
    recv.resize(std::max<std::size_t>(1, counts[rank]) * es);
    comm.reduce_scatter(send.data(), recv.data(), counts, dt);
    if (counts[rank] == 0 || failed) continue;  // a failed rank still takes part in the rest
    OptSub& s = subs[g.first_sub + k];
    // The first reduction since the drop lands on zeros: taken as it is. The reduction holds
    // every parameter's share of the sub-group at once.
    const bool fresh = book(s).zero;
    failed = thrown_by([&] {
      ingest(
          s, Tier::host, fresh ? Access::overwrite : Access::write,
          [&](std::byte* v) {
            if (fresh)
              std::memcpy(v, recv.data(), s.numel * es);
            else
              accumulate(v, dt, recv.data(), dt, s.numel, ctx());
          },
          true);
    });
  }
  std::memset(g.local_grad.data(), 0, g.local_grad.size());
  g.local_dirty = false;
  agree_on_failure(
      comm, failed, [&] { drop_grads_now(); },
      fmt::format("reducing the gradients of group '{}': another rank could not take its part "
                  "(its error says why); every rank's gradients are dropped",
                  g.name));
}

void ShardedOptimizer::begin_backward(bool final) {
  impl_->settle_commit();
  Impl& m = *impl_;
  m.require_state("begin_backward");
  if (m.in_backward) throw std::logic_error("begin_backward: the previous backward has not ended");
  m.require_current_param16("begin_backward");
  m.in_backward = true;
  m.final_backward = final;
  m.clear_left_alone();
  for (auto& b : m.books) b.seen = 0;
  if (!m.cfg.overlap || !final) return;
  // What a speculative step uses; if results from an earlier final backward are pending, they
  // stay valid only while all of it is unchanged.
  std::vector<GroupConfig> cfgs = m.group_configs();
  const auto mult = static_cast<float>(1.0 / m.scale);
  const std::uint64_t t = m.step_count + 1;
  if (m.spec_pending()) {
    if (cfgs != m.spec.cfgs || mult != m.spec.mult || t != m.spec.t) {
      std::lock_guard lk(m.spec.mu);
      m.spec.invalid = true;
    }
    return;
  }
  m.spec.cfgs = std::move(cfgs);
  m.spec.mult = mult;
  m.spec.t = t;
  m.spec.order.clear();  // (no worker runs: nothing is pending)
  m.spec.start([&m] { m.spec_loop(); });
}

void ShardedOptimizer::Impl::add_slice(OptSub& s, ParamId id, std::uint64_t b, std::uint64_t e,
                                       const void* grad, Dtype dtype) {
  materialize_lent(s);
  const OptParam& p = params[id];
  const Dtype acc = acc_dtype(groups[s.group]);
  const std::size_t in_es = dtype_size(dtype), acc_es = dtype_size(acc);
  // A slice's first gradient since the drop lands on zeros: copied (cast), not added; over the
  // whole block, without zero-filling it first.
  char& written = book(s).written[s.slice_of(id)];
  const bool whole = b == s.begin && e == s.begin + s.numel;
  const Access access = !written && whole ? Access::overwrite : Access::write;
  // Host memory goes to the gradient's host copy (the tier manager moves it up for a GPU step).
  ingest(s, Tier::host, access, [&](std::byte* v) {
    std::byte* dst = v + (b - s.begin) * acc_es;
    const auto* src = static_cast<const std::byte*>(grad) + (b - p.offset) * in_es;
    if (written)
      accumulate(dst, acc, src, dtype, e - b, ctx());
    else
      cast(src, dtype, dst, acc, e - b, ctx());
  });
  written = 1;
}

void ShardedOptimizer::add_grad(ParamId id, const void* grad, Dtype dtype) {
  impl_->settle_commit();
  Impl& m = *impl_;
  const OptParam& p = m.grad_param("add_grad", id, grad);
  OptGroup& g = m.groups[p.group];
  if (m.world > 1) {
    const Dtype acc = m.acc_dtype(g);
    accumulate(g.local_grad.data() + p.offset * dtype_size(acc), acc, grad, dtype, p.numel,
               m.ctx());
    g.local_dirty = true;
    return;
  }
  m.taking_grads("add_grad", [&] {
    for (OptSub& s : m.subs_holding(p)) {
      const auto [b, e] = slice(p, s);
      if (b < e) m.add_slice(s, id, b, e, grad, dtype);
    }
  });
}

void ShardedOptimizer::Impl::abandon_backward() noexcept {
  in_backward = false;
  try {
    if (cfg.overlap) spec_drain();  // the worker is done with what it took
    roll_back_failed_step(false);   // speculative steps discarded, gradients dropped
    clear_local_grads();
  } catch (const std::exception& e) {
    log(LogLevel::error, fmt::format("abandoning the backward failed too: {}", e.what()));
  }
}

void ShardedOptimizer::Impl::rethrow_abandoned(const char* what, const std::exception& e) {
  constexpr std::string_view kAbandoned =
      "; the backward is abandoned (every gradient since the last step dropped, speculative "
      "steps discarded): begin the step's backward again";
  if (const auto* se = dynamic_cast<const std::system_error*>(&e)) {
    std::string msg = se->what();  // std::system_error appends the code's message again
    const std::string tail = ": " + se->code().message();
    if (msg.ends_with(tail)) msg.resize(msg.size() - tail.size());
    throw std::system_error(se->code(), fmt::format("{}: {}{}", what, msg, kAbandoned));
  }
  throw std::runtime_error(fmt::format("{}: {}{}", what, e.what(), kAbandoned));
}

bool ShardedOptimizer::in_backward() const noexcept {
  return impl_->in_backward;
}

void ShardedOptimizer::add_grad_device(ParamId id, const void* d_grad, Dtype dtype,
                                       std::span<void* const> events) {
  impl_->settle_commit();
  Impl& m = *impl_;
  const OptParam& p = m.grad_param("add_grad_device", id, d_grad);
  const bool gpu = m.device_ptrs;
  if (!gpu && !m.gpu_simulated)
    throw std::runtime_error(fmt::format(
        "add_grad_device '{}': no usable GPU ({}); add_grad takes gradients in host memory",
        p.spec.name, device_info().reason));
  if (!gpu && !events.empty())
    throw std::invalid_argument(fmt::format(
        "add_grad_device '{}': {} event(s) given but the device tier is simulated (d_grad is "
        "host memory standing in for the GPU's, and there are no events)",
        p.spec.name, events.size()));
  for (void* e : events) {
    if (e == nullptr)
      throw std::invalid_argument(fmt::format("add_grad_device '{}': a null event", p.spec.name));
    cuda::stream_wait_event(nullptr, e);  // every producing stream, without blocking the host
  }
  const auto* src = static_cast<const std::byte*>(d_grad);
  const std::size_t in_es = dtype_size(dtype);
  // A slice of device memory in host memory (a real GPU): copied into page-locked staging.
  auto to_host = [&](std::uint64_t off, std::uint64_t n) -> const std::byte* {
    if (!gpu) return src + off * in_es;  // the simulated device's memory is host memory
    std::byte* dst = m.grad_staging.reserve(n * in_es);
    cuda::copy_to_host(dst, src + off * in_es, n * in_es, nullptr);
    cuda::synchronize(nullptr);
    return dst;
  };
  if (m.world > 1) {  // the reduction runs in host memory
    add_grad(id, to_host(0, p.numel), dtype);
    return;
  }
  m.taking_grads("add_grad_device", [&] {
    for (OptSub& s : m.subs_holding(p)) m.add_device_slice(s, p, id, src, dtype, to_host);
  });
}

template <class ToHost>
void ShardedOptimizer::Impl::add_device_slice(OptSub& s, const OptParam& p, ParamId id,
                                              const std::byte* src, Dtype dtype, ToHost& to_host) {
  const auto range = slice(p, s);  // not a structured binding: lambdas capture it
  const std::uint64_t b = range.first, e = range.second;
  if (b >= e) return;
  const Dtype acc = acc_dtype(groups[p.group]);
  const std::size_t at = (b - s.begin) * dtype_size(acc), in_es = dtype_size(dtype);
  materialize_lent(s);  // (never lent: a sub-group the GPU steps) added to in the block
  const Tier tier = s.grad_gpu ? Tier::device : Tier::host;  // where it accumulates
  if (tier == Tier::device && device_ptrs && !gpu_simulated) {
    // A sub-group the GPU steps: its gradient is accumulated where it is stepped (never
    // down to the host and back up).
    ingest(s, Tier::device, Access::write, [&](std::byte* v) {
      cuda::accumulate(v + at, acc, src + (b - p.offset) * in_es, dtype, e - b, nullptr);
      cuda::synchronize(nullptr);  // before the view goes: the tier manager may copy it
    });
  } else {
    const std::byte* host = to_host(b - p.offset, e - b);
    ingest(s, tier, Access::write,
           [&](std::byte* v) { accumulate(v + at, acc, host, dtype, e - b, ctx()); });
  }
  book(s).written[s.slice_of(id)] = 1;  // added to: a later add_grad must add, not copy
}

void ShardedOptimizer::add_grad_bucket(ParamId first, std::size_t count, const void* grad,
                                       Dtype dtype) {
  impl_->settle_commit();
  Impl& m = *impl_;
  if (first + count > m.params.size() || count == 0)
    throw std::invalid_argument(
        fmt::format("add_grad_bucket: parameters {}..{} do not exist", first, first + count));
  const int group = m.params[first].group;
  for (std::size_t i = 0; i < count; ++i) {  // all checked before any is added
    const OptParam& p = m.params[first + i];
    if (p.group != group || !p.spec.requires_grad)
      throw std::invalid_argument(fmt::format(
          "add_grad_bucket: parameter '{}' is {} (a bucket holds trainable parameters of one "
          "group)",
          p.spec.name, p.spec.requires_grad ? "in another group" : "frozen"));
  }
  std::uint64_t off = 0;
  for (std::size_t i = 0; i < count; ++i) {
    add_grad(first + static_cast<ParamId>(i),
             static_cast<const std::byte*>(grad) + off * dtype_size(dtype), dtype);
    off += m.params[first + i].numel;
  }
}

void ShardedOptimizer::end_backward() {
  Impl& m = *impl_;
  if (!m.in_backward) throw std::logic_error("end_backward: no backward in progress");
  m.in_backward = false;
  if (m.world > 1 && (!m.cfg.coalesce || m.final_backward))
    for (auto& g : m.groups) m.reduce_local(g);
}

void ShardedOptimizer::drop_grads() {
  impl_->settle_commit();
  Impl& m = *impl_;
  m.require_finalized("drop_grads");
  if (m.in_backward) throw std::logic_error("drop_grads: end_backward() first");
  m.clear_left_alone();
  m.drop_grads_now();
}

void ShardedOptimizer::Impl::drop_grads_now() {
  if (cfg.overlap) {
    spec_drain();
    if (spec_pending()) spec_discard();  // the committed state, bit for bit
  }
  clear_local_grads();
  drop_all_grads();
}

void ShardedOptimizer::Impl::clear_local_grads() noexcept {
  for (auto& g : groups) {
    std::fill(g.local_grad.begin(), g.local_grad.end(), std::byte{0});
    g.local_dirty = false;
  }
}

bool ShardedOptimizer::gradient_final(std::size_t k) const {
  if (k >= impl_->subs.size())
    throw std::invalid_argument(fmt::format("gradient_final: no sub-group {}", k));
  return !impl_->books[k].sums.empty();  // taken when its final gradient was complete
}

}  // namespace tierswap
