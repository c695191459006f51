// ShardedOptimizer::lend_grad: gradients the step reads where the trainer left them (no copy
// into the gradient blocks), with the statistics taken from that memory, and the ways a lent
// gradient ends up in its block after all (a copy into the same sub-group, a part left unlent
// at step time, a step that throws before it stepped).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <vector>

#include "src/optim/optimizer_impl.hpp"
#include "tierswap/kernels.hpp"
#include "tierswap/log.hpp"

namespace tierswap {

bool ShardedOptimizer::Impl::may_lend(const OptSub& s, Dtype dtype) const {
  // One rank, no speculative step reading the gradient during the backward, the last backward
  // of the step (the memory outlives no other), no conversion, the CPU's kernel in host memory,
  // and nothing in the block yet (a lent slice is never added to: it is copied in first).
  return world == 1 && !cfg.overlap && final_backward && dtype == acc_dtype(groups[s.group]) &&
         !s.step_gpu && !s.grad_gpu && !s.on_gpu && book(s).zero;
}

void ShardedOptimizer::Impl::materialize_lent(OptSub& s) {
  SubGrad& gb = book(s);
  if (gb.lent.empty()) return;
  const Dtype dt = acc_dtype(groups[s.group]);
  const std::size_t es = dtype_size(dt);
  const Access access = gb.all_lent() ? Access::overwrite : Access::write;  // else zeros around
  BlockView v = tiers.acquire(s.grad, Tier::host, access);
  for (const SubGrad::Lent& l : gb.lent)
    cast(l.data, dt, v.data() + (l.b - s.begin) * es, dt, l.e - l.b, ctx());
  v.mark_dirty();
  gb.lent.clear();
  gb.zero = false;  // its statistics, if taken, hold: the same values
}

void ShardedOptimizer::Impl::materialize_all_lent() noexcept {
  for (auto& s : subs) {
    if (book(s).lent.empty()) continue;
    try {
      materialize_lent(s);
    } catch (const std::exception& e) {
      log(LogLevel::error,
          fmt::format("sub-group {} of group {}: its lent gradient could not be copied in ({}); "
                      "it is dropped: redo the backward",
                      s.index, s.group, e.what()));
      book(s).lent.clear();
      drop_grad(s);
    }
  }
}

// Chunk c covers [c * kGradStatsChunk, ...) of the sub-group. A run of chunks inside one slice
// is summed where it lies (a chunk's sum depends on its values only); a chunk that spans
// slices is gathered into `tmp` first.
void ShardedOptimizer::Impl::lent_chunk_sums(const OptSub& s, double* out) {
  SubGrad& gb = book(s);
  const Dtype dt = acc_dtype(groups[s.group]);
  const std::size_t es = dtype_size(dt);
  const std::uint64_t chunks = (s.numel + kGradStatsChunk - 1) / kGradStatsChunk;
  std::vector<std::byte> tmp;
  std::size_t li = 0;  // the slice holding chunk c's first value
  for (std::uint64_t c = 0; c < chunks;) {
    const std::uint64_t cb = s.begin + c * kGradStatsChunk;
    while (gb.lent[li].e <= cb) ++li;
    const SubGrad::Lent& l = gb.lent[li];
    const std::uint64_t whole = (std::min(l.e, s.begin + s.numel) - cb) / kGradStatsChunk;
    const std::uint64_t ce = std::min(s.begin + s.numel, cb + kGradStatsChunk);
    if (whole > 0 || ce <= l.e) {  // whole chunks here, or the last (ragged) one
      const std::uint64_t n = whole > 0 ? whole * kGradStatsChunk : ce - cb;
      grad_chunk_sums(l.data + (cb - l.b) * es, dt, n, out + c, ctx());
      c += whole > 0 ? whole : 1;
      continue;
    }
    tmp.resize((ce - cb) * es);
    for (std::size_t j = li; j < gb.lent.size() && gb.lent[j].b < ce; ++j) {
      const std::uint64_t b = std::max(gb.lent[j].b, cb), e = std::min(gb.lent[j].e, ce);
      std::memcpy(tmp.data() + (b - cb) * es, gb.lent[j].data + (b - gb.lent[j].b) * es,
                  (e - b) * es);
    }
    grad_chunk_sums(tmp.data(), dt, ce - cb, out + c, ctx());
    ++c;
  }
}

void ShardedOptimizer::lend_grad(ParamId id, const void* grad, Dtype dtype) {
  impl_->settle_commit();
  Impl& m = *impl_;
  const OptParam& p = m.grad_param("lend_grad", id, grad);
  if (m.world > 1) {  // the local buffer and its reduction: nothing to lend to
    add_grad(id, grad, dtype);
    return;
  }
  m.taking_grads("lend_grad", [&] {
    for (OptSub& s : m.subs_holding(p)) m.lend_slice(s, p, id, grad, dtype);
  });
}

void ShardedOptimizer::Impl::lend_slice(OptSub& s, const OptParam& p, ParamId id, const void* grad,
                                        Dtype dtype) {
  SubGrad& gb = book(s);
  const auto [b, e] = slice(p, s);
  if (b >= e) return;
  const std::size_t at = s.slice_of(id);
  if (!may_lend(s, dtype) || gb.written[at]) {
    add_slice(s, id, b, e, grad, dtype);  // copies in what s lent first
    return;
  }
  const auto* src = static_cast<const std::byte*>(grad) + (b - p.offset) * dtype_size(dtype);
  const auto pos =
      std::lower_bound(gb.lent.begin(), gb.lent.end(), b,
                       [](const SubGrad::Lent& l, std::uint64_t x) { return l.b < x; });
  gb.lent.insert(pos, SubGrad::Lent{b, e, src});
  gb.written[at] = 1;
  gb.sums.clear();
  if (++gb.seen == s.pids.size() && gb.all_lent()) {
    gb.sums.assign((s.numel + kGradStatsChunk - 1) / kGradStatsChunk, 0.0);
    lent_chunk_sums(s, gb.sums.data());
  }
}

}  // namespace tierswap
