// The pipelined commit: step t's commit (its writes, the sync, the manifest) left running on the
// tier manager's thread while the trainer computes step t + 1's forward; the next call that
// touches the state settles it, and rolls step t back if it failed.
#include <system_error>
#include <tuple>

#include "src/optim/optimizer_impl.hpp"
#include "tierswap/detail/clock.hpp"
#include "tierswap/error.hpp"
#include "tierswap/log.hpp"

#include <fmt/format.h>

namespace tierswap {

using detail::Clock;
using detail::seconds_since;

bool ShardedOptimizer::Impl::may_pipeline_commit(const StepPlan& sp) const {
  if (!cfg.pipelined_commit || world != 1 || !sp.late.empty() || !unusable.empty() ||
      !tiers.config().shadow_slots)
    return false;
  for (const auto& s : subs)  // its step could not be undone if the commit failed
    if (s.memory_only) return false;
  return true;
}

void CommitPipeline::start(std::uint64_t t, const std::string& record,
                           std::pair<double, std::uint32_t> scaler) {
  tiers_.set_commit_record(record);
  const std::uint64_t generation = tiers_.committed_generation() + 1;
  tiers_.commit_async();
  pending_ = Pending{t, generation, scaler};
}

std::optional<CommitPipeline::Failed> CommitPipeline::settle() {
  if (!pending_) return std::nullopt;
  const Pending pc = *pending_;
  pending_.reset();
  const auto t0 = Clock::now();
  std::optional<Failed> failed;
  try {
    tiers_.wait_commit();
  } catch (...) {
    failed = Failed{pc, std::current_exception()};
  }
  wait_ = seconds_since(t0);
  return failed;
}

void CommitPipeline::finish() noexcept {
  if (!pending_) return;
  try {
    tiers_.wait_commit();
  } catch (const std::exception& e) {
    log(LogLevel::error,
        fmt::format("step {}'s commit failed as the optimizer closed: {}; its swap directory holds "
                    "step {}",
                    pending_->t, e.what(), pending_->t - 1));
  }
  pending_.reset();
}

void ShardedOptimizer::Impl::start_pipelined_commit(const StepPlan& sp,
                                                    std::pair<double, std::uint32_t> scaler,
                                                    StepResult& r) {
  commits.start(sp.t, commit_record(), scaler);
  r.commit_seconds = 0;
}

void ShardedOptimizer::Impl::settle_commit() {
  if (!commits.pending()) return;  // every hand-over call passes here: no more than a test
  const std::optional<CommitPipeline::Failed> f = commits.settle();
  if (!f) return;
  const CommitPipeline::Pending& pc = f->step;
  const std::exception_ptr failed = f->error;
  const std::string why = fmt::format(
      "step {}'s commit, left running while the trainer went on (pipelined_commit), failed: {}; "
      "the state, the 16-bit parameters and the loss scaler are back at step {}",
      pc.t, what_of(failed), pc.t - 1);
  log(LogLevel::error, why);
  step_count = pc.t - 1;
  std::tie(scale, growth_tracker) = pc.scaler;
  roll_back_failed_step(true);
  try {
    std::rethrow_exception(failed);
  } catch (const std::system_error& e) {
    throw std::system_error(e.code(), why);
  } catch (const std::exception&) {
    throw std::runtime_error(why);
  }
}

}  // namespace tierswap
