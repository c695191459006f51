// The node service's shared-memory budget (budget.hpp).
#include "src/service/budget.hpp"

#include <algorithm>

#include "tierswap/units.hpp"

#include <fmt/format.h>

namespace tierswap::service {

MemoryBudget::Limits MemoryBudget::limits_for(const ServiceConfig& cfg, std::uint64_t ram) {
  ram = ram / 4096 * 4096;
  Limits l;
  l.budget = cfg.host_budget;
  l.quota = cfg.client_quota ? cfg.client_quota : cfg.host_budget;
  l.pageable_budget = cfg.pageable_budget ? cfg.pageable_budget
                                          : std::max(ram / 2 / 4096 * 4096, cfg.pageable_quota);
  l.pageable_quota =
      cfg.pageable_quota ? cfg.pageable_quota : std::min(ram / 4 / 4096 * 4096, l.pageable_budget);
  return l;
}

int MemoryBudget::grant(const std::string& key, std::uint64_t memory, std::uint64_t pageable,
                        std::string* why) {
  std::lock_guard lk(mu_);
  const Limits& l = limits_;
  if (memory > l.quota || granted_.memory + memory > l.budget) {
    *why = fmt::format(
        "client {} asks {} of shared memory: the per-client quota is {}, and {} of "
        "the node's {} is free",
        key, format_bytes(memory), format_bytes(l.quota), format_bytes(l.budget - granted_.memory),
        format_bytes(l.budget));
    return EINVAL;
  }
  if (granted_.pageable + pageable > l.pageable_budget) {
    *why = fmt::format(
        "client {} asks {} of pageable shared memory: {} of the node's pageable budget of {} is "
        "free (tierswap serve --pageable-budget)",
        key, format_bytes(pageable), format_bytes(l.pageable_budget - granted_.pageable),
        format_bytes(l.pageable_budget));
    return EINVAL;
  }
  granted_.memory += memory;
  granted_.pageable += pageable;
  return 0;
}

void MemoryBudget::give_back(std::uint64_t memory, std::uint64_t pageable) noexcept {
  std::lock_guard lk(mu_);
  granted_.memory -= memory;
  granted_.pageable -= pageable;
}

MemoryBudget::Granted MemoryBudget::granted() const {
  std::lock_guard lk(mu_);
  return granted_;
}

}  // namespace tierswap::service
