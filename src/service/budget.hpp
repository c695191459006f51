// The node service's shared-memory budget: the locked memory granted to clients against the
// node's budget and the per-client quota, and the pageable (unlocked) memory beside it against
// its own budget and quota. A grant is checked and taken in one call under the budget's own
// lock; the offer, the status and the metrics read it without the server's.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "tierswap/service.hpp"

namespace tierswap::service {

class MemoryBudget {
 public:
  struct Limits {
    std::uint64_t budget = 0, quota = 0;                    // locked: the node's, per client
    std::uint64_t pageable_budget = 0, pageable_quota = 0;  // pageable: the node's, per client
  };
  /// cfg's limits; unset, the client quota is the whole budget, the pageable budget half of the
  /// machine's memory `ram` (at least the pageable quota) and the pageable quota a quarter (at
  /// most the pageable budget).
  static Limits limits_for(const ServiceConfig& cfg, std::uint64_t ram);
  explicit MemoryBudget(Limits l) noexcept : limits_(l) {}

  const Limits& limits() const noexcept { return limits_; }
  /// Takes `memory` locked and `pageable` unlocked bytes for client `key` when they fit its
  /// quotas and what is left of the node's budgets (0); else EINVAL, and *why names the limit.
  int grant(const std::string& key, std::uint64_t memory, std::uint64_t pageable, std::string* why);
  /// Gives back what a grant took (a detach, an attach that failed after its grant).
  void give_back(std::uint64_t memory, std::uint64_t pageable) noexcept;
  struct Granted {
    std::uint64_t memory = 0, pageable = 0;
  };
  Granted granted() const;

 private:
  const Limits limits_;
  mutable std::mutex mu_;
  Granted granted_;  // guarded by mu_
};

}  // namespace tierswap::service
