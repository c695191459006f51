// The pipelined commit (OptimizerConfig::pipelined_commit): step t's commit (its writes, the
// sync, the manifest) left running on the tier manager's thread while the trainer computes step
// t + 1's forward. This part owns the commit in flight, what its failure rolls back to and how
// long the last wait took; the optimizer decides when one may start and does the rollback.
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <utility>

#include "tierswap/tier_manager.hpp"

namespace tierswap {

class CommitPipeline {
 public:
  struct Pending {
    std::uint64_t t = 0;                      // the step
    std::uint64_t generation = 0;             // the generation it makes
    std::pair<double, std::uint32_t> scaler;  // the loss scaler before it
  };
  struct Failed {
    Pending step;
    std::exception_ptr error;
  };

  explicit CommitPipeline(TierManager& tiers) noexcept : tiers_(tiers) {}
  CommitPipeline(const CommitPipeline&) = delete;
  CommitPipeline& operator=(const CommitPipeline&) = delete;

  /// Starts step t's commit, with `record` as its commit record, on the tier manager's thread.
  void start(std::uint64_t t, const std::string& record, std::pair<double, std::uint32_t> scaler);
  const std::optional<Pending>& pending() const noexcept { return pending_; }
  /// Waits for the commit in flight (none: returns at once); its failure, if it failed.
  std::optional<Failed> settle();
  /// Seconds the last settle() waited, once (then 0).
  double take_wait_seconds() noexcept { return std::exchange(wait_, 0.0); }
  /// The optimizer closing: a commit in flight lands first; its failure is logged.
  void finish() noexcept;

 private:
  TierManager& tiers_;
  std::optional<Pending> pending_;
  double wait_ = 0;
};

}  // namespace tierswap
